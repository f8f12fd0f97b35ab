package image

// Snapshots: a sandbox's files made an image of the store, and any image
// written out as one tar layer (for a push).
//
// A snapshot's root is its base image's root, hard-linked file by file
// (the store's files never change, so the two images share their bytes
// and neither can see the other's later removal), with the sandbox's own
// directories copied in under their guest names: rootfs/workspace and
// rootfs/tmp. A sandbox of the host's root has no base in the store: its
// snapshot holds only those two directories, and its record says
// Base "host" (a sandbox made from it runs on the host's root). Every
// sandbox made from an image starts with the image's workspace and tmp
// as its own /workspace and /tmp (the backends copy them; see
// backend.Spec.Seed), whatever the image came from: a pulled snapshot
// works the same way.

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/fscopy"
)

// SourceSnapshot is the Source of an image made from a sandbox's files.
const SourceSnapshot = "snapshot"

// BaseHost is the Base of an image that holds only a sandbox's own files,
// over the host's root: the snapshot of a sandbox on the built-in image.
const BaseHost = HostName

// The directories of a root that are a sandbox's own: a sandbox made
// from the image starts with copies of them.
const (
	WorkspaceDir = "workspace"
	TmpDir       = "tmp"
)

// Labels of an image config that carry what the store knows of a
// snapshot (Export's caller writes them; an import reads them back).
const (
	LabelBase       = "org.sandbox-sidecar.base"
	LabelSandbox    = "org.sandbox-sidecar.snapshot.sandbox"
	LabelBaseImage  = "org.sandbox-sidecar.snapshot.base-image"
	LabelBaseDigest = "org.sandbox-sidecar.snapshot.base-digest"
	LabelTaken      = "org.sandbox-sidecar.snapshot.taken"
)

// ErrNoSpace: the store's filesystem is full (or its quota spent); nothing
// was kept of the image. Freeing space and retrying helps.
var ErrNoSpace = errors.New("no space left for the image")

// Origin says where a snapshot came from.
type Origin struct {
	// Sandbox is the sandbox whose files it holds.
	Sandbox string `json:"sandbox"`
	// BaseImage and BaseDigest are the image that sandbox ran on
	// (HostName for the built-in, with no digest).
	BaseImage  string `json:"base_image"`
	BaseDigest string `json:"base_digest,omitempty"`
	// Taken is when the snapshot was taken.
	Taken time.Time `json:"taken"`
	// UID is the uid of the client that took it: only it (and the
	// daemon's admins) may run sandboxes on it or remove it.
	UID *uint32 `json:"uid,omitempty"`
}

// SnapshotSource is what Snapshot copies.
type SnapshotSource struct {
	// BaseDigest is the store image the sandbox runs on; "" for the
	// host's root.
	BaseDigest string
	// Dirs are the sandbox's own directories on the host, by their place
	// in the image (WorkspaceDir, TmpDir). They are hostile: the guest
	// wrote them, and may still be writing.
	Dirs map[string]string
	// ReadAs, when set, wraps every read of Dirs (fscopy.Options.ReadAs).
	ReadAs func(fn func() error) error
	// Origin is recorded with the image (Taken: now, when zero).
	Origin Origin
	// Memory, when set, is a directory of the sandbox's processes and
	// their memory (a gVisor checkpoint) the image keeps beside its root
	// (Info.Memory). Its content is the guest's memory: copied with the
	// same care and caps, and kept where no sandbox reaches. Of a sandbox
	// on a store image, the checkpoint's processes saw the base's files
	// at the paths the snapshot's root (the base's, hard-linked) holds
	// them too, so the snapshot needs nothing of the base once taken.
	Memory string
}

// MemoryDir is the name, in an image's directory, of a memory snapshot's
// memory (beside rootfs).
const MemoryDir = "memory"

// FailSnapshotCopied is the point (SetFailpoint) where a snapshot's files
// are all copied into its work directory and nothing is synced or placed.
const FailSnapshotCopied = "image-snapshot-copied"

// SetFailpoint arms the store's failpoints (the daemon's, from
// internal/failpoint): "image-" and each durable step of an import or a
// snapshot (FailSnapshotCopied, "image-unpacked", "image-placed").
func (s *Store) SetFailpoint(f func(string)) { s.failpoint = f }

// maxSnapshots is how many snapshots run at once: each holds a work
// directory that may grow to max_bytes.
const maxSnapshots = 2

// Snapshot makes a new image name of a sandbox's files: its base image's
// root (hard links), and Dirs copied under their names, bounded by the
// store's Limits (the base's bytes and entries count). The copy treats
// Dirs as hostile (package fscopy: nothing followed, special files
// skipped) and gives every file the store's modes. A failure, a
// cancellation or a crash leaves nothing but debris in tmp/ (removed now,
// or by the next Open). A name already bound is ErrExists: a snapshot is
// always new content.
func (s *Store) Snapshot(ctx context.Context, name string, src SnapshotSource) (Info, error) {
	if err := CheckName(name); err != nil {
		return Info{}, err
	}
	select {
	case s.snapSem <- struct{}{}:
	case <-ctx.Done():
		return Info{}, fmt.Errorf("image store: waiting for other snapshots: %w", ctx.Err())
	}
	defer func() { <-s.snapSem }()
	s.mu.RLock()
	if n, ok := s.names[name]; ok {
		s.mu.RUnlock()
		return Info{}, fmt.Errorf("%w: %q is %s already; choose another name, or remove it first (image rm %s)", ErrExists, name, n.Digest, name)
	}
	var base imageRecord
	if src.BaseDigest != "" {
		var ok bool
		if base, ok = s.images[src.BaseDigest]; !ok {
			s.mu.RUnlock()
			return Info{}, fmt.Errorf("%w: the sandbox's image %s is no longer in the store", ErrNotFound, src.BaseDigest)
		}
	}
	s.mu.RUnlock()
	w, err := s.newWork("snap-")
	if err != nil {
		return Info{}, fmt.Errorf("image store: %w", noSpace(err))
	}
	defer w.close()
	start := time.Now()
	info, st, err := s.snapshot(ctx, w, name, src, base)
	if err != nil {
		s.log.Warn("snapshot failed", "name", name, "sandbox", src.Origin.Sandbox, "error", err, "duration", time.Since(start))
		return Info{}, err
	}
	s.log.Info("snapshot taken", "name", name, "digest", info.Digest, "sandbox", src.Origin.Sandbox, "base", src.Origin.BaseImage,
		"bytes", info.Bytes, "files", info.Files, "cloned", st.Cloned, "copied", st.Copied, "linked", st.Linked,
		"skipped", st.Skipped, "duration", time.Since(start))
	return info, nil
}

func (s *Store) snapshot(ctx context.Context, w *work, name string, src SnapshotSource, base imageRecord) (Info, fscopy.Stats, error) {
	var st fscopy.Stats
	o := src.Origin
	if o.Taken.IsZero() {
		o.Taken = time.Now().UTC()
	}
	rec := imageRecord{Origin: &o}
	// A sandbox of a snapshot of the host's root runs on the host's root
	// too: its snapshot is of the same kind.
	onHost := src.BaseDigest == "" || base.Base == BaseHost
	if onHost {
		rec.Base = BaseHost
	} else {
		rec.Env, rec.Entrypoint, rec.Cmd = slices.Clone(base.Env), slices.Clone(base.Entrypoint), slices.Clone(base.Cmd)
		rec.WorkingDir, rec.User = base.WorkingDir, base.User
	}
	// The digest names this snapshot (its origin, and a nonce: two
	// snapshots of the same files are two images), not its content.
	var nonce [16]byte
	rand.Read(nonce[:])
	id, _ := json.Marshal(struct {
		Origin Origin `json:"origin"`
		Name   string `json:"name"`
		Nonce  string `json:"nonce"`
	}{o, name, hex.EncodeToString(nonce[:])})
	sum := sha256.Sum256(id)
	rec.Digest = "sha256:" + hex.EncodeToString(sum[:])

	imgDir := filepath.Join(w.dir, "image")
	rootPath := filepath.Join(imgDir, "rootfs")
	for _, d := range []string{imgDir, rootPath} {
		if err := os.Mkdir(d, modeTraverse); err != nil {
			return Info{}, st, fmt.Errorf("image store: %w", noSpace(err))
		}
	}
	if err := os.Chmod(rootPath, modeRoot); err != nil {
		return Info{}, st, fmt.Errorf("image store: %w", err)
	}
	lim := fscopy.Limits{MaxBytes: s.lim.MaxBytes, MaxFiles: s.lim.MaxFiles}
	if !onHost {
		h, _ := digestHex(src.BaseDigest)
		// The base is the store's own: linked, never copied, and the
		// sandbox's own directories come from the sandbox.
		err := fscopy.Copy(ctx, filepath.Join(s.imageDir(h), "rootfs"), rootPath, fscopy.Options{
			Limits: lim, Stats: &st, UID: -1, GID: -1, Link: true, Skip: []string{WorkspaceDir, TmpDir},
		})
		if err != nil {
			return Info{}, st, s.snapshotErr("its base image", err)
		}
	}
	dirs := make([]string, 0, len(src.Dirs))
	for d := range src.Dirs {
		if d != WorkspaceDir && d != TmpDir {
			return Info{}, st, fmt.Errorf("image store: a snapshot holds %q and %q, not %q", WorkspaceDir, TmpDir, d)
		}
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	for _, d := range dirs {
		into := filepath.Join(rootPath, d)
		if err := os.Mkdir(into, modeRoot); err != nil {
			return Info{}, st, fmt.Errorf("image store: %w", noSpace(err))
		}
		if err := os.Chmod(into, modeRoot); err != nil {
			return Info{}, st, fmt.Errorf("image store: %w", err)
		}
		st.Files++
		err := fscopy.Copy(ctx, src.Dirs[d], into, fscopy.Options{
			Limits: lim, Stats: &st, UID: -1, GID: -1, ReadAs: src.ReadAs,
			FileMode: func(m fs.FileMode) fs.FileMode { return fileMode(int64(m.Perm())) },
			DirMode:  func(fs.FileMode) fs.FileMode { return modeRoot },
		})
		if err != nil {
			return Info{}, st, s.snapshotErr("/"+d, err)
		}
	}
	if src.Memory != "" {
		into := filepath.Join(imgDir, MemoryDir)
		if err := os.Mkdir(into, modePrivate); err != nil {
			return Info{}, st, fmt.Errorf("image store: %w", noSpace(err))
		}
		err := fscopy.Copy(ctx, src.Memory, into, fscopy.Options{
			Limits: lim, Stats: &st, UID: -1, GID: -1,
			FileMode: func(fs.FileMode) fs.FileMode { return 0o600 },
			DirMode:  func(fs.FileMode) fs.FileMode { return modePrivate },
		})
		if err != nil {
			return Info{}, st, s.snapshotErr("its memory", err)
		}
		rec.Memory = true
	}
	if st.Skipped > 0 {
		s.log.Warn("snapshot: FIFOs, sockets and device nodes skipped (an image holds files, directories and symlinks)",
			"name", name, "count", st.Skipped, "first", strings.Join(st.SkippedNames, ", "))
	}
	rec.Bytes, rec.Files = st.Bytes, st.Files
	s.at("snapshot-copied")
	info, err := s.commit(w, name, SourceSnapshot, rec, true)
	if err != nil {
		return Info{}, st, noSpace(err)
	}
	return info, st, nil
}

// snapshotErr gives a copy's error the store's sentinels.
func (s *Store) snapshotErr(what string, err error) error {
	switch {
	case errors.Is(err, fscopy.ErrTooLarge):
		return fmt.Errorf("%w: the snapshot (%s): %v (the store's max_bytes %d and max_files %d count the base image too)", ErrTooLarge, what, err, s.lim.MaxBytes, s.lim.MaxFiles)
	case errors.Is(err, fscopy.ErrBadEntry):
		return fmt.Errorf("%w: %s cannot be kept in an image: %v", ErrBadImage, what, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("image store: snapshot cancelled: %w", err)
	}
	return fmt.Errorf("image store: copying %s: %w", what, noSpace(err))
}

// noSpace makes a full filesystem's error ErrNoSpace, keeping the errno.
func noSpace(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w on the store's filesystem (%w); free space there (image rm, gc) and retry", ErrNoSpace, err)
	}
	return err
}

// Export writes image name's root as one uncompressed tar layer: entries
// in name order, owned by root, with the store's modes and the files'
// times; a hard link within the root is a hard link entry. It returns the
// image's Info (what an image config needs besides the layer).
func (s *Store) Export(ctx context.Context, name string, w io.Writer) (Info, error) {
	info, err := s.Get(name)
	if err != nil {
		return Info{}, err
	}
	tw := tar.NewWriter(w)
	seen := map[uint64]string{}
	buf := make([]byte, 128<<10)
	root := info.Root
	err = walkSorted(root, func(rel string, fi fs.FileInfo) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr := &tar.Header{Name: rel, ModTime: fi.ModTime(), Mode: int64(fi.Mode().Perm()), Format: tar.FormatPAX}
		p := filepath.Join(root, rel)
		switch {
		case fi.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		case fi.Mode().IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
				if first, ok := seen[st.Ino]; ok {
					hdr.Typeflag, hdr.Size, hdr.Linkname = tar.TypeLink, 0, first
				} else {
					seen[st.Ino] = rel
				}
			}
		default:
			return nil // the store holds no other kind
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg || hdr.Size == 0 {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		n, err := io.CopyBuffer(tw, io.LimitReader(f, hdr.Size), buf)
		if err == nil && n != hdr.Size {
			err = fmt.Errorf("%s changed size while exported", rel)
		}
		return err
	})
	if err != nil {
		return Info{}, fmt.Errorf("image store: export %s: %w", name, err)
	}
	if err := tw.Close(); err != nil {
		return Info{}, fmt.Errorf("image store: export %s: %w", name, err)
	}
	return info, nil
}

// walkSorted calls fn for every entry under root (not root itself),
// parents before children, siblings by name, never following a symlink.
func walkSorted(root string, fn func(rel string, fi fs.FileInfo) error) error {
	var walk func(rel string) error
	walk = func(rel string) error {
		ents, err := os.ReadDir(filepath.Join(root, rel))
		if err != nil {
			return err
		}
		sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
		for _, e := range ents {
			r := filepath.ToSlash(filepath.Join(rel, e.Name()))
			fi, err := os.Lstat(filepath.Join(root, r))
			if err != nil {
				return err
			}
			if err := fn(r, fi); err != nil {
				return err
			}
			if fi.IsDir() {
				if err := walk(r); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(".")
}
