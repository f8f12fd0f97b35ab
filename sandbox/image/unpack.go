package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// Bounds on one entry's names (PATH_MAX and NAME_MAX).
const (
	maxPathLen      = 4096
	maxComponentLen = 255
)

// Whiteout names (OCI image spec, layer.md).
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
)

// unpacker applies layers, in order, to one root directory. Every write
// goes through an os.Root opened on that directory: a path, a symlink
// followed on the way, or a hard link's target cannot leave it.
type unpacker struct {
	root *os.Root
	lim  Limits
	log  hclog.Logger
	buf  []byte

	bytes, files int64 // summed over layers, against lim

	skipped      int64
	skippedNames []string

	// seen holds (hashes of) the paths the current layer wrote and their
	// ancestors: a whiteout hides only what lower layers wrote. A 64-bit
	// keyed hash keeps the set to ~16 bytes a path, bounded by MaxFiles; a
	// collision (odds 2^-64 per pair, the seed is random) would only keep a
	// lower-layer file that should have been hidden, inside the root.
	seed maphash.Seed
	seen map[uint64]struct{}

	// lastDir is the last parent directory known to exist (most entries
	// share their predecessor's), reset whenever anything is removed.
	lastDir string
}

func newUnpacker(dir string, lim Limits, log hclog.Logger) (*unpacker, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	return &unpacker{root: root, lim: lim, log: log, buf: make([]byte, 128<<10), seed: maphash.MakeSeed()}, nil
}

func (u *unpacker) close() { u.root.Close() }

// refusal is why an entry is refused; tooLarge marks a limit.
type refusal struct {
	msg      string
	tooLarge bool
}

func (r *refusal) Error() string { return r.msg }

func refuse(format string, args ...any) error {
	return &refusal{msg: fmt.Sprintf(format, args...)}
}

// layer applies one uncompressed layer tar.
func (u *unpacker) layer(r io.Reader, label string) error {
	u.seen = make(map[uint64]struct{})
	u.lastDir = ""
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return badf("%s: malformed tar: %v", label, err)
		}
		if err := u.entry(tr, hdr); err != nil {
			return entryError(label, hdr.Name, err)
		}
	}
}

// entryError names the layer and entry in an error and classifies it.
func entryError(label, name string, err error) error {
	var r *refusal
	switch {
	case errors.As(err, &r) && r.tooLarge:
		return fmt.Errorf("%w: %s entry %q: %s", ErrTooLarge, label, name, r.msg)
	case errors.As(err, &r):
		return fmt.Errorf("%w: %s entry %q: %s", ErrBadImage, label, name, r.msg)
	case isResourceErr(err):
		return fmt.Errorf("image store: %s entry %q: %w", label, name, err)
	case strings.Contains(err.Error(), "escapes from parent"):
		// os.Root's refusal: a symlink (or "..") on the way leads out.
		return fmt.Errorf("%w: %s entry %q: its path leads out of the image root through a symlink (%v)", ErrBadImage, label, name, err)
	}
	// Anything else the file system refused is the entry's fault too
	// (a parent that is a file, a name too long, a symlink loop...).
	return fmt.Errorf("%w: %s entry %q: %v", ErrBadImage, label, name, err)
}

// cleanName turns an entry name into a path relative to the root ("" for
// the root itself), refusing absolute paths and ".." components.
func cleanName(n string) (string, error) {
	switch {
	case n == "":
		return "", refuse("empty name")
	case strings.IndexByte(n, 0) >= 0:
		return "", refuse("NUL in name")
	case len(n) > maxPathLen:
		return "", refuse("name of %d bytes, at most %d", len(n), maxPathLen)
	case strings.HasPrefix(n, "/"):
		return "", refuse("absolute path")
	}
	for _, c := range strings.Split(n, "/") {
		if c == ".." {
			return "", refuse(`".." in path`)
		}
		if len(c) > maxComponentLen {
			return "", refuse("path component of %d bytes, at most %d", len(c), maxComponentLen)
		}
	}
	c := path.Clean(n)
	if c == "." {
		return "", nil
	}
	return c, nil
}

// Modes as unpacked. Owners are not kept (the files belong to the daemon;
// a host uid of the image's choosing would be a real host user), and a
// sandbox runs as a uid that is neither the image's root nor its users, so
// the image's owner/group/other split means nothing there: every file is
// readable and every directory traversable by all (an image made to run
// as root, with its app in /root, works), and a mode keeps only whether a
// file is executable. No setuid, setgid or sticky bit, no write bit on a
// file; directories are 0755 (the owner, the daemon, must be able to
// remove the root; the sandbox sees the root read-only).
func fileMode(m int64) fs.FileMode {
	if m&0o111 != 0 {
		return 0o555
	}
	return 0o444
}

func dirMode(int64) fs.FileMode { return 0o755 }

func (u *unpacker) entry(tr *tar.Reader, hdr *tar.Header) error {
	u.files++
	if u.files > u.lim.MaxFiles {
		return &refusal{msg: fmt.Sprintf("over %d entries (max_files)", u.lim.MaxFiles), tooLarge: true}
	}
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if name == "" {
		return nil // the root itself keeps 0755
	}
	dir, base := path.Dir(name), path.Base(name)
	if base == opaqueMarker {
		return u.opaque(dir)
	}
	if w, ok := strings.CutPrefix(base, whiteoutPrefix); ok {
		if w == "" || w == "." {
			return refuse("whiteout of nothing")
		}
		return u.whiteout(path.Join(dir, w))
	}
	switch hdr.Typeflag {
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		// Neutralised: a sandbox gets its own /dev, and a device node in a
		// shared root is a hole. Rootfs tars of debootstrap trees have some.
		u.skipped++
		if len(u.skippedNames) < 5 {
			u.skippedNames = append(u.skippedNames, name)
		}
		return nil
	case tar.TypeDir, tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse, tar.TypeSymlink, tar.TypeLink:
	default:
		return refuse("unsupported entry type %q", hdr.Typeflag)
	}
	if err := u.ensureDir(dir); err != nil {
		return err
	}
	u.mark(name)
	switch hdr.Typeflag {
	case tar.TypeDir:
		return u.mkdir(name, hdr)
	case tar.TypeSymlink:
		return u.symlink(name, hdr.Linkname)
	case tar.TypeLink:
		return u.hardlink(name, hdr.Linkname)
	}
	return u.file(tr, name, hdr)
}

func (u *unpacker) hash(p string) uint64 { return maphash.String(u.seed, p) }

// mark records p and its ancestors as written by this layer.
func (u *unpacker) mark(p string) {
	for p != "." {
		h := u.hash(p)
		if _, ok := u.seen[h]; ok {
			return // its ancestors are marked already
		}
		u.seen[h] = struct{}{}
		p = path.Dir(p)
	}
}

func (u *unpacker) isSeen(p string) bool {
	_, ok := u.seen[u.hash(p)]
	return ok
}

// ensureDir makes sure dir exists as a directory (or an in-root symlink to
// one), creating missing ones 0755.
func (u *unpacker) ensureDir(dir string) error {
	if dir == "." || dir == u.lastDir {
		return nil
	}
	fi, err := u.root.Lstat(dir)
	switch {
	case err == nil && fi.IsDir():
	case err == nil && fi.Mode()&fs.ModeSymlink != 0:
		st, err := u.root.Stat(dir)
		if err != nil {
			return err
		}
		if !st.IsDir() {
			return refuse("parent %q is a symlink to a non-directory", dir)
		}
	case err == nil:
		return refuse("parent %q is not a directory", dir)
	case errors.Is(err, fs.ErrNotExist):
		if err := u.ensureDir(path.Dir(dir)); err != nil {
			return err
		}
		if err := u.root.Mkdir(dir, 0o755); err != nil {
			return err
		}
		// The umask may have taken bits away.
		if err := u.root.Chmod(dir, 0o755); err != nil {
			return err
		}
	default:
		return err
	}
	u.lastDir = dir
	return nil
}

// replace removes whatever is at name, so that the new entry is created
// afresh (never written through an older hard link or symlink).
func (u *unpacker) replace(name string) error {
	fi, err := u.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	u.lastDir = ""
	if fi.IsDir() {
		return u.root.RemoveAll(name)
	}
	return u.root.Remove(name)
}

func (u *unpacker) mkdir(name string, hdr *tar.Header) error {
	mode := dirMode(hdr.Mode)
	fi, err := u.root.Lstat(name)
	switch {
	case err == nil && fi.IsDir():
		// A directory again (a lower layer's, or this layer's parent made
		// on the way): it keeps its content and takes this mode.
	case err == nil:
		if err := u.replace(name); err != nil {
			return err
		}
		fallthrough
	case errors.Is(err, fs.ErrNotExist):
		if err := u.root.Mkdir(name, mode); err != nil {
			return err
		}
	default:
		return err
	}
	return u.root.Chmod(name, mode)
}

func (u *unpacker) file(tr *tar.Reader, name string, hdr *tar.Header) error {
	if hdr.Size < 0 {
		return refuse("negative size")
	}
	if hdr.Size > u.lim.MaxBytes-u.bytes {
		return &refusal{msg: fmt.Sprintf("%d bytes would take the image over %d bytes (max_bytes)", hdr.Size, u.lim.MaxBytes), tooLarge: true}
	}
	if err := u.replace(name); err != nil {
		return err
	}
	// O_EXCL: never through a symlink or an existing file.
	f, err := u.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	n, err := io.CopyBuffer(onlyWriter{f}, tr, u.buf)
	u.bytes += n
	if err == nil {
		err = f.Chmod(fileMode(hdr.Mode))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// Modification times matter (Python checks a .pyc against its source).
	if !hdr.ModTime.IsZero() {
		if err := u.root.Chtimes(name, hdr.ModTime, hdr.ModTime); err != nil {
			return err
		}
	}
	return nil
}

// onlyWriter hides *os.File's ReadFrom so that CopyBuffer uses our buffer.
type onlyWriter struct{ w io.Writer }

func (o onlyWriter) Write(p []byte) (int, error) { return o.w.Write(p) }

func (u *unpacker) symlink(name, target string) error {
	switch {
	case target == "":
		return refuse("symlink to nothing")
	case strings.IndexByte(target, 0) >= 0:
		return refuse("NUL in symlink target")
	case len(target) >= maxPathLen:
		return refuse("symlink target of %d bytes, at most %d", len(target), maxPathLen-1)
	}
	// The target is data: it may point anywhere, but the unpacker never
	// follows it out of the root, and a sandbox resolves it in its own view.
	if err := u.replace(name); err != nil {
		return err
	}
	return u.root.Symlink(target, name)
}

func (u *unpacker) hardlink(name, linkname string) error {
	target, err := cleanName(linkname)
	if err != nil {
		return refuse("hard link target %q: %v", linkname, err)
	}
	if target == "" || target == name {
		return refuse("hard link to itself or the root")
	}
	fi, err := u.root.Lstat(target)
	if errors.Is(err, fs.ErrNotExist) {
		return refuse("hard link to %q, which is not unpacked before it", linkname)
	}
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return refuse("hard link to %q, which is a %s, not a regular file", linkname, typeName(fi.Mode()))
	}
	if err := u.replace(name); err != nil {
		return err
	}
	return u.root.Link(target, name)
}

func typeName(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	}
	return "special file"
}

// whiteout removes target as lower layers left it; an entry of this same
// layer is not hidden (OCI: whiteouts apply to lower layers only).
func (u *unpacker) whiteout(target string) error {
	if u.isSeen(target) {
		return nil
	}
	if _, err := u.root.Lstat(target); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	u.lastDir = ""
	return u.root.RemoveAll(target)
}

// opaque removes everything under dir that lower layers wrote, keeping
// what this layer wrote (before or after the marker).
func (u *unpacker) opaque(dir string) error {
	if dir != "." {
		fi, err := u.root.Lstat(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			// Never through a symlink: the marker hides a directory's
			// content, and a layer replacing a symlink by a directory
			// writes the directory first.
			return refuse("opaque whiteout in %q, which is a %s, not a directory", dir, typeName(fi.Mode()))
		}
	}
	u.lastDir = ""
	stack := []string{dir}
	for len(stack) > 0 {
		d := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		f, err := u.root.Open(d)
		if err != nil {
			return err
		}
		for {
			ents, err := f.ReadDir(256)
			for _, e := range ents {
				p := path.Join(d, e.Name())
				if u.isSeen(p) {
					if e.IsDir() {
						stack = append(stack, p)
					}
					continue
				}
				if rerr := u.root.RemoveAll(p); rerr != nil {
					f.Close()
					return rerr
				}
			}
			if err == io.EOF || (err == nil && len(ents) == 0) {
				break
			}
			if err != nil {
				f.Close()
				return err
			}
		}
		f.Close()
	}
	return nil
}
