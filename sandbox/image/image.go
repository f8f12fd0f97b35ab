// Package image is the daemon's image store: it imports container images
// (an OCI layout or archive, a `docker save` archive, a plain rootfs tar, or
// a v1.Image the caller pulled from a registry), verifies every digest,
// unpacks each image once into a read-only root directory and binds
// operator-chosen names to those roots. Every sandbox of an image shares its
// one root; nothing is copied per sandbox.
//
// The package owns the store directory and nothing else: it never starts a
// sandbox, never mounts anything and never decides whether an image is in
// use (Remove's callers check that). It imports nothing of the project.
//
// # Layout
//
//	<dir>/images/<hex>/image.json   what the image is (config, sizes), written before the rename
//	<dir>/images/<hex>/rootfs/      the unpacked root, read-only to sandboxes
//	<dir>/names/<name>.json         a name bound to a digest, written last
//	<dir>/tmp/<id>/                 an import or a removal in progress; debris after a crash
//
// <hex> is the hex of the image's digest (see Info.Digest). An image
// directory appears under images/ only by one rename of a complete, synced
// directory, and a name only by one rename of a synced record, so after a
// crash at any point the store holds either the whole image or debris in
// tmp/ (or an image no name refers to), which Open and GC remove.
//
// # Hostile images
//
// An image is input from outside. Entries are written only through an
// os.Root opened on the new root, so no entry, symlink or hard link can
// reach outside it; on top of that, entries with absolute paths or ".."
// components, hard links to anything but a regular file already unpacked,
// and unknown entry types are refused (ErrBadImage, naming the entry);
// device nodes and FIFOs are skipped; the image's file owners, setuid,
// setgid and sticky bits, write bits, file capabilities and other extended
// attributes are dropped (directories become 0755, files 0444 or 0555). Sizes are capped while streaming
// (ErrTooLarge). Every blob's digest is checked (ErrBadImage).
package image

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// HostName is the name of the built-in image (the host's own /usr), which
// the callers provide; the store refuses it as a name.
const HostName = "host"

// Sources of an image (Info.Source).
const (
	// SourceOCILayout is an OCI image layout streamed as a tar, which is
	// also exactly what an "OCI archive" (podman save --format oci-archive,
	// skopeo copy oci-archive:, docker save since 25) is: the two cannot be
	// told apart, so both report this source.
	SourceOCILayout = "oci-layout"
	// SourceDockerArchive is the legacy `docker save` format (manifest.json).
	SourceDockerArchive = "docker-archive"
	// SourceRootfsTar is a plain tar (optionally gzip or zstd) of a root
	// filesystem.
	SourceRootfsTar = "rootfs-tar"
	// SourceRegistry is an image the caller pulled and handed to ImportImage.
	SourceRegistry = "registry"
)

// Stable errors; callers map them to wire codes with errors.Is. Each
// returned error wraps one of them and adds a sentence for people.
var (
	// ErrNotFound: no image has that name. The message lists the names.
	ErrNotFound = errors.New("image not found")
	// ErrBadName: the name breaks the naming rules or is reserved.
	ErrBadName = errors.New("bad image name")
	// ErrBadImage: the input is malformed or hostile: not an archive the
	// store knows, a digest that does not match, an entry refused (the
	// message names the entry and why).
	ErrBadImage = errors.New("bad image")
	// ErrTooLarge: the input or the unpacked image exceeds Limits.
	ErrTooLarge = errors.New("image too large")
	// ErrExists: the name is already bound to a different image. Names are
	// never re-pointed silently, because sandboxes may be running on the old
	// root: import under a new name (and move users over), or remove the old
	// name first. Importing the same image again under the same name is not
	// an error (the existing Info is returned).
	ErrExists = errors.New("image name already in use")
)

// Default limits (Limits fields left zero).
const (
	// DefaultMaxBytes caps the bytes of regular files an import writes,
	// summed over all layers (8 GiB).
	DefaultMaxBytes = 8 << 30
	// DefaultMaxFiles caps the tar entries an import processes, summed
	// over all layers (1,000,000).
	DefaultMaxFiles = 1_000_000
)

// Internal bounds that are not worth a setting.
const (
	// maxNameLen bounds an image name.
	maxNameLen = 64
	// maxMetaBytes caps small JSON documents: index.json, manifests,
	// configs, manifest.json, the store's own records.
	maxMetaBytes = 4 << 20
	// maxLayers caps the layers of one image.
	maxLayers = 512
	// maxArchiveEntries caps the entries of an OCI or docker archive (blobs
	// and metadata; a rootfs tar is bounded by MaxFiles instead).
	maxArchiveEntries = 100_000
	// archiveSlackPerFile is the tar overhead allowed per entry when
	// capping a spooled archive (header and padding).
	archiveSlackPerFile = 1024
)

// Limits bound one import. Zero fields mean the package defaults.
type Limits struct {
	// MaxBytes caps the bytes of regular files written by one import,
	// summed over its layers (a file overwritten by a later layer counts
	// twice). An archive handed to ImportArchive may be at most MaxBytes
	// plus 1 KiB per MaxFiles (tar headers and padding) plus 16 MiB, after
	// decompression.
	MaxBytes int64
	// MaxFiles caps the tar entries one import processes, summed over its
	// layers (whiteouts and skipped entries count).
	MaxFiles int64
}

func (l Limits) withDefaults() Limits {
	if l.MaxBytes == 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxFiles == 0 {
		l.MaxFiles = DefaultMaxFiles
	}
	return l
}

// archiveCap is the most bytes a spooled (decompressed) archive may have.
func (l Limits) archiveCap() int64 {
	return l.MaxBytes + l.MaxFiles*archiveSlackPerFile + 16<<20
}

// Info describes one named image.
type Info struct {
	// Name is the operator's name for the image.
	Name string
	// Digest identifies the content and is what names share a root by:
	// for an image (OCI, docker, registry) the digest of its config blob,
	// i.e. the image ID, which covers every layer through the config's
	// diff_ids, so the same image reached through different formats or
	// manifests shares one root; for a rootfs tar the digest of the
	// uncompressed tar stream. Always "sha256:<hex>".
	Digest string
	// Root is the absolute path of the unpacked root directory. It must be
	// mounted read-only; it is shared by every sandbox of the image.
	Root string
	// Env, Entrypoint, Cmd, WorkingDir and User come from the image config.
	// A rootfs tar has no config: its Env is DefaultPath alone.
	Env        []string
	Entrypoint []string
	Cmd        []string
	WorkingDir string
	User       string
	// Bytes and Files measure the root as unpacked (regular-file bytes,
	// each inode once; every entry including directories and symlinks).
	Bytes int64
	Files int64
	// Created is when this name was bound (import time).
	Created time.Time
	// Source says how the name was imported (the Source* constants).
	Source string
	// Base is BaseHost for an image that holds only a sandbox's own
	// files (workspace, tmp) over the host's root; "" for an image whose
	// root is all of it.
	Base string
	// Origin says where a snapshot came from (nil for other images).
	Origin *Origin
	// Memory is the directory of a memory snapshot's processes (a
	// backend's checkpoint, as SnapshotSource.Memory handed it over):
	// the daemon's alone (0700), beside Root, never exported; "" for
	// every other image.
	Memory string
}

// DefaultPath is the Env of an image that brings none (a rootfs tar).
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Store is an image store in one directory. It is safe for concurrent use.
// One process at a time may use a directory: the daemon's lock on its state
// directory guarantees that, and Open relies on it (it removes whatever an
// earlier process left in tmp/).
type Store struct {
	dir string // absolute
	lim Limits
	log hclog.Logger

	// importSem lets one import run at a time: an import holds up to two
	// copies of an image on disk (the spooled archive, the new root) and
	// its per-layer bookkeeping in memory, and imports are rare.
	importSem chan struct{}

	mu     sync.RWMutex
	names  map[string]nameRecord  // by name
	images map[string]imageRecord // by digest
	busy   map[string]bool        // tmp/ entries in use (not debris)

	// hook, when set (tests), is called at each durable step of an
	// import ("spooled", "prechecked", "layer", "unpacked", "placed"); a test stops the
	// process there to see what a crash at that step leaves.
	hook func(stage string)
	// failpoint, when set (SetFailpoint), is called at the same steps as
	// hook, named "image-" and the step.
	failpoint func(name string)

	// snapSem bounds the snapshots running at once (maxSnapshots).
	snapSem chan struct{}
}

func (s *Store) at(stage string) {
	if s.hook != nil {
		s.hook(stage)
	}
	if s.failpoint != nil {
		s.failpoint("image-" + stage)
	}
}

const recordVersion = 1

// nameRecord is names/<name>.json.
type nameRecord struct {
	Version int       `json:"version"`
	Name    string    `json:"name"`
	Digest  string    `json:"digest"`
	Source  string    `json:"source"`
	Created time.Time `json:"created"`
}

// imageRecord is images/<hex>/image.json.
type imageRecord struct {
	Version    int       `json:"version"`
	Digest     string    `json:"digest"`
	Env        []string  `json:"env,omitempty"`
	Entrypoint []string  `json:"entrypoint,omitempty"`
	Cmd        []string  `json:"cmd,omitempty"`
	WorkingDir string    `json:"working_dir,omitempty"`
	User       string    `json:"user,omitempty"`
	Bytes      int64     `json:"bytes"`
	Files      int64     `json:"files"`
	Unpacked   time.Time `json:"unpacked"`
	// Base and Origin: see Info.
	Base   string  `json:"base,omitempty"`
	Origin *Origin `json:"origin,omitempty"`
	// Memory: a snapshot that took its sandbox's memory (Info.Memory).
	// Only Snapshot sets it: an import never carries memory.
	Memory bool `json:"memory,omitempty"`
}

// Directory modes. The store's top directory and images/ are 0711 so that
// a sandbox running as another uid can traverse to a root it was given
// (but not list the store); names/ and tmp/ are the daemon's alone.
const (
	modeTraverse = 0o711
	modePrivate  = 0o700
	modeRoot     = 0o755
)

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

// CheckName reports whether name may name an imported image: 1 to 64
// characters of lower-case letters, digits, '.', '_' and '-', starting with
// a letter or digit, and not HostName. Errors wrap ErrBadName.
func CheckName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrBadName)
	case len(name) > maxNameLen:
		return fmt.Errorf("%w: %d characters, at most %d", ErrBadName, len(name), maxNameLen)
	case !nameRE.MatchString(name):
		return fmt.Errorf("%w: %q: use lower-case letters, digits, '.', '_' and '-', starting with a letter or digit", ErrBadName, name)
	case name == HostName:
		return fmt.Errorf("%w: %q is the built-in image", ErrBadName, name)
	}
	return nil
}

var hexRE = regexp.MustCompile(`^[a-f0-9]{64}$`)

// digestHex returns the hex of a "sha256:<hex>" digest.
func digestHex(d string) (string, bool) {
	h, ok := strings.CutPrefix(d, "sha256:")
	return h, ok && hexRE.MatchString(h)
}

// Open opens (creating if needed) the store in dir, which should lie under
// the daemon's state directory. It removes what an earlier process left
// half-done: everything in tmp/, records that do not parse, names whose
// image is missing, and images no name refers to.
func Open(dir string, lim Limits, log hclog.Logger) (*Store, error) {
	if lim.MaxBytes < 0 || lim.MaxFiles < 0 {
		return nil, fmt.Errorf("image store: negative limits (max_bytes %d, max_files %d)", lim.MaxBytes, lim.MaxFiles)
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	s := &Store{
		dir:       abs,
		lim:       lim.withDefaults(),
		log:       log,
		importSem: make(chan struct{}, 1),
		snapSem:   make(chan struct{}, maxSnapshots),
		names:     map[string]nameRecord{},
		images:    map[string]imageRecord{},
		busy:      map[string]bool{},
	}
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{
		{s.dir, modeTraverse},
		{s.imagesDir(), modeTraverse},
		{s.namesDir(), modePrivate},
		{s.tmpDir(), modePrivate},
	} {
		if err := os.MkdirAll(d.path, d.mode); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
		// MkdirAll leaves an existing directory's mode alone.
		if err := os.Chmod(d.path, d.mode); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
	}
	if err := s.load(); err != nil {
		return nil, err
	}
	removed, err := s.GC()
	if err != nil {
		return nil, err
	}
	s.log.Info("image store opened", "dir", s.dir, "images", len(s.names), "roots", len(s.images),
		"debris_removed", removed, "max_bytes", s.lim.MaxBytes, "max_files", s.lim.MaxFiles)
	return s, nil
}

func (s *Store) imagesDir() string          { return filepath.Join(s.dir, "images") }
func (s *Store) namesDir() string           { return filepath.Join(s.dir, "names") }
func (s *Store) tmpDir() string             { return filepath.Join(s.dir, "tmp") }
func (s *Store) imageDir(hex string) string { return filepath.Join(s.imagesDir(), hex) }
func (s *Store) rootDir(digest string) string {
	h, _ := digestHex(digest)
	return filepath.Join(s.imageDir(h), "rootfs")
}

// load reads the records. What does not parse or does not fit is left out
// of the maps, so that GC removes it; a record of a newer version stops
// Open instead (it is not ours to delete).
func (s *Store) load() error {
	ents, err := os.ReadDir(s.imagesDir())
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	for _, e := range ents {
		hex := e.Name()
		var rec imageRecord
		err := readRecord(filepath.Join(s.imageDir(hex), "image.json"), &rec)
		if err == nil && rec.Version > recordVersion {
			return fmt.Errorf("image store: %s was written by a newer version (record version %d)", s.imageDir(hex), rec.Version)
		}
		if err == nil {
			if h, ok := digestHex(rec.Digest); !ok || h != hex {
				err = fmt.Errorf("digest %q does not match the directory", rec.Digest)
			}
		}
		if err == nil {
			var fi os.FileInfo
			if fi, err = os.Lstat(filepath.Join(s.imageDir(hex), "rootfs")); err == nil && !fi.IsDir() {
				err = errors.New("rootfs is not a directory")
			}
		}
		if err == nil && rec.Memory {
			// Only a snapshot holds memory, in a directory of the
			// daemon's alone.
			fi, lerr := os.Lstat(filepath.Join(s.imageDir(hex), MemoryDir))
			if lerr != nil || !fi.IsDir() || fi.Mode().Perm() != modePrivate || rec.Origin == nil {
				err = fmt.Errorf("its memory is not a private directory of a snapshot (%v)", lerr)
			}
		}
		if err != nil {
			s.log.Warn("image store: dropping a broken image directory", "dir", s.imageDir(hex), "error", err)
			continue
		}
		s.images[rec.Digest] = rec
	}
	ents, err = os.ReadDir(s.namesDir())
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	for _, e := range ents {
		n, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || CheckName(n) != nil {
			continue // temp files of a crashed write: GC removes them
		}
		var rec nameRecord
		err := readRecord(filepath.Join(s.namesDir(), e.Name()), &rec)
		if err == nil && rec.Version > recordVersion {
			return fmt.Errorf("image store: %s was written by a newer version (record version %d)", e.Name(), rec.Version)
		}
		if err == nil && rec.Name != n {
			err = fmt.Errorf("record names %q", rec.Name)
		}
		if err == nil {
			if _, ok := s.images[rec.Digest]; !ok {
				err = fmt.Errorf("its image %s is missing", rec.Digest)
			}
		}
		if err != nil {
			s.log.Warn("image store: dropping a broken name record", "name", n, "error", err)
			continue
		}
		s.names[n] = rec
	}
	return nil
}

func readRecord(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxMetaBytes+1))
	if err != nil {
		return err
	}
	if len(data) > maxMetaBytes {
		return fmt.Errorf("%s: over %d bytes", path, maxMetaBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	return dec.Decode(v)
}

// writeFileAtomic writes data to dir/name through a synced temp file and a
// rename, then syncs dir: the file is either the old one or the new one.
func writeFileAtomic(dir, name string, data []byte) error {
	f, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Chmod(0o600); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	ok = true
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (s *Store) info(n nameRecord) Info {
	im := s.images[n.Digest]
	return Info{
		Name:       n.Name,
		Digest:     n.Digest,
		Root:       s.rootDir(n.Digest),
		Env:        slices.Clone(im.Env),
		Entrypoint: slices.Clone(im.Entrypoint),
		Cmd:        slices.Clone(im.Cmd),
		WorkingDir: im.WorkingDir,
		User:       im.User,
		Bytes:      im.Bytes,
		Files:      im.Files,
		Created:    n.Created,
		Source:     n.Source,
		Base:       im.Base,
		Origin:     cloneOrigin(im.Origin),
		Memory:     s.memoryDir(n.Digest, im.Memory),
	}
}

// memoryDir is the memory directory of the image of digest, beside its
// root (never in it: an export is the root), when it has one.
func (s *Store) memoryDir(digest string, has bool) string {
	if !has {
		return ""
	}
	h, _ := digestHex(digest)
	return filepath.Join(s.imageDir(h), MemoryDir)
}

func cloneOrigin(o *Origin) *Origin {
	if o == nil {
		return nil
	}
	c := *o
	if o.UID != nil {
		uid := *o.UID
		c.UID = &uid
	}
	return &c
}

// Get returns the image bound to name. An unknown name is ErrNotFound, with
// the imported names in the message.
func (s *Store) Get(name string) (Info, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n, ok := s.names[name]
	if !ok {
		return Info{}, s.notFound(name)
	}
	return s.info(n), nil
}

// notFound builds the ErrNotFound error; s.mu is held.
func (s *Store) notFound(name string) error {
	names := make([]string, 0, len(s.names))
	for n := range s.names {
		names = append(names, n)
	}
	sort.Strings(names)
	const show = 20
	list := "none"
	if len(names) > 0 {
		if len(names) > show {
			list = strings.Join(names[:show], ", ") + fmt.Sprintf(" and %d more", len(names)-show)
		} else {
			list = strings.Join(names, ", ")
		}
	}
	return fmt.Errorf("%w: %q (imported images: %s; built in: %s)", ErrNotFound, name, list, HostName)
}

// List returns every named image, sorted by name.
func (s *Store) List() []Info {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Info, 0, len(s.names))
	for _, n := range s.names {
		out = append(out, s.info(n))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Remove unbinds name and, when no other name shares its digest, deletes
// the image's root. Whether a sandbox still uses the image is the caller's
// to check first: a root removed under a running sandbox vanishes from it.
func (s *Store) Remove(name string) error {
	s.mu.Lock()
	n, ok := s.names[name]
	if !ok {
		err := s.notFound(name)
		s.mu.Unlock()
		return err
	}
	// The name goes first, durably: a crash after this leaves an image no
	// name refers to, which GC removes.
	if err := os.Remove(filepath.Join(s.namesDir(), name+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.mu.Unlock()
		return fmt.Errorf("image store: remove %q: %w", name, err)
	}
	delete(s.names, name)
	err := syncDir(s.namesDir())
	var trash string
	if !s.referenced(n.Digest) {
		trash, err = s.detachImage(n.Digest, err)
	}
	s.mu.Unlock()
	if trash != "" {
		s.deleteTrash(trash)
	}
	s.log.Info("image removed", "name", name, "digest", n.Digest, "root_removed", trash != "")
	if err != nil {
		return fmt.Errorf("image store: remove %q: %w", name, err)
	}
	return nil
}

// referenced reports whether any name is bound to digest; s.mu is held.
func (s *Store) referenced(digest string) bool {
	for _, n := range s.names {
		if n.Digest == digest {
			return true
		}
	}
	return false
}

// detachImage moves an image directory into tmp/ (one atomic rename, so a
// crash mid-delete leaves only debris) and forgets it; the caller deletes
// the returned path after releasing s.mu. s.mu is held.
func (s *Store) detachImage(digest string, prev error) (string, error) {
	hex, _ := digestHex(digest)
	trash, err := os.MkdirTemp(s.tmpDir(), "rm-")
	if err != nil {
		return "", errors.Join(prev, err)
	}
	s.busy[filepath.Base(trash)] = true
	if err := os.Rename(s.imageDir(hex), filepath.Join(trash, hex)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return trash, errors.Join(prev, err)
	}
	delete(s.images, digest)
	return trash, errors.Join(prev, syncDir(s.imagesDir()))
}

func (s *Store) deleteTrash(trash string) {
	if err := os.RemoveAll(trash); err != nil {
		s.log.Warn("image store: cannot delete a removed image (GC retries)", "dir", trash, "error", err)
	}
	s.mu.Lock()
	delete(s.busy, filepath.Base(trash))
	s.mu.Unlock()
}

// GC removes debris (tmp/ entries of no import in progress, stray files)
// and images no name refers to. It returns how many it removed.
func (s *Store) GC() (int, error) {
	var errs []error
	removed := 0
	s.mu.Lock()
	var trash []string
	// Images without a name: an import that crashed between placing the
	// image and binding its name, or a removal that crashed midway.
	ents, err := os.ReadDir(s.imagesDir())
	errs = append(errs, err)
	for _, e := range ents {
		digest := "sha256:" + e.Name()
		if _, known := s.images[digest]; known && s.referenced(digest) {
			continue
		}
		t, err := os.MkdirTemp(s.tmpDir(), "rm-")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.busy[filepath.Base(t)] = true
		if err := os.Rename(filepath.Join(s.imagesDir(), e.Name()), filepath.Join(t, "image")); err != nil {
			errs = append(errs, err)
		}
		delete(s.images, digest)
		trash = append(trash, t)
		removed++
	}
	if len(trash) > 0 {
		errs = append(errs, syncDir(s.imagesDir()))
	}
	// Stray files in names/: temp files of a record write that crashed,
	// or records load dropped.
	ents, err = os.ReadDir(s.namesDir())
	errs = append(errs, err)
	for _, e := range ents {
		n, ok := strings.CutSuffix(e.Name(), ".json")
		if ok {
			if _, known := s.names[n]; known {
				continue
			}
		}
		errs = append(errs, os.RemoveAll(filepath.Join(s.namesDir(), e.Name())))
		removed++
	}
	// tmp/: everything no import or removal is using.
	ents, err = os.ReadDir(s.tmpDir())
	errs = append(errs, err)
	var debris []string
	for _, e := range ents {
		if s.busy[e.Name()] {
			continue
		}
		debris = append(debris, filepath.Join(s.tmpDir(), e.Name()))
	}
	s.mu.Unlock()
	for _, t := range trash {
		s.deleteTrash(t)
	}
	for _, d := range debris {
		errs = append(errs, os.RemoveAll(d))
		removed++
	}
	if removed > 0 {
		s.log.Info("image store: removed debris", "count", removed)
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("image store gc: %w", err)
	}
	return removed, nil
}
