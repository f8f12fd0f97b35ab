// File operations run on the host, confined with os.Root to the sandbox's
// work/ and tmp/ directories, which are bound into the guest with gVisor's
// shared file access (--file-access-mounts=shared): the guest sees a host
// write at once and the host a guest write, with no cache in between. This
// is the bubblewrap backend's code for the same job, with files owned by the
// guest uid; both move to one place with the shared backend skeleton.

package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// listBatch is how many directory entries ListDirectory reads at a time, so
// a huge directory is refused after maxEntries+1 entries, not after all.
const listBatch = 256

// writeTempPrefix names WriteFile's temporary files.
const writeTempPrefix = ".sidecar-write-"

// guestArea is one of the two host directories file operations may reach.
type guestArea struct {
	name string // workDirName or tmpDirName
	rel  string // path relative to it, "." for the directory itself
}

// resolveGuestPath maps a path as the guest sees it onto the sandbox's
// /workspace or /tmp. Relative paths start at /workspace. Anything else is
// refused; so are NUL bytes and the empty path. Symlinks are not resolved
// here: os.Root does that, confined to the area.
func resolveGuestPath(p string) (guestArea, error) {
	const confined = "file operations are confined to /workspace and /tmp (relative paths start at /workspace); use run_command to read other paths"
	switch {
	case p == "":
		return guestArea{}, fmt.Errorf("%w: the path is empty; %s", backend.ErrBadPath, confined)
	case strings.IndexByte(p, 0) >= 0:
		return guestArea{}, fmt.Errorf("%w: the path contains a NUL byte; %s", backend.ErrBadPath, confined)
	case len(p) > backend.MaxGuestPathLen:
		return guestArea{}, fmt.Errorf("%w: the path is %d bytes long, more than the %d allowed", backend.ErrBadPath, len(p), backend.MaxGuestPathLen)
	}
	clean := p
	if !path.IsAbs(clean) {
		clean = guestWorkspace + "/" + clean
	}
	clean = path.Clean(clean)
	for _, a := range []struct{ guest, name string }{{guestWorkspace, workDirName}, {guestTmp, tmpDirName}} {
		if clean == a.guest {
			return guestArea{name: a.name, rel: "."}, nil
		}
		if rel, ok := strings.CutPrefix(clean, a.guest+"/"); ok {
			return guestArea{name: a.name, rel: rel}, nil
		}
	}
	return guestArea{}, fmt.Errorf("%w: %s is outside the sandbox's files; %s", backend.ErrBadPath, backend.ShortName(p), confined)
}

// openArea resolves p and opens its area as an os.Root.
func openArea(sb *sandbox, p string) (*os.Root, string, error) {
	a, err := resolveGuestPath(p)
	if err != nil {
		return nil, "", err
	}
	root, err := os.OpenRoot(filepath.Join(sb.dir, a.name))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, "", backend.NotFound(sb.id)
		}
		return nil, "", fmt.Errorf("open the files of sandbox %s: %w", sb.id, err)
	}
	return root, a.rel, nil
}

// guestOnly tells, for a path the host's view of the sandbox's files
// lacks, whether the guest has something there all the same, and what: a
// FIFO or socket made inside gVisor exists only in the sentry's memory.
func (b *Backend) guestOnly(ctx context.Context, sb *sandbox, p string) (string, bool) {
	sb.initMu.Lock()
	c := sb.init
	sb.initMu.Unlock()
	if c == nil || !c.alive() {
		return "", false
	}
	guest := p
	if !path.IsAbs(guest) {
		guest = guestWorkspace + "/" + guest
	}
	typ, errno, err := c.guestLstat(ctx, path.Clean(guest))
	if err != nil || errno != 0 || typ == 0 {
		return "", false
	}
	return fileKind(unixTypeMode(typ)), true
}

// unixTypeMode turns S_IFMT bits into the fs.FileMode type fileKind reads.
func unixTypeMode(typ uint32) fs.FileMode {
	switch typ {
	case syscall.S_IFIFO:
		return fs.ModeNamedPipe
	case syscall.S_IFSOCK:
		return fs.ModeSocket
	case syscall.S_IFCHR:
		return fs.ModeDevice | fs.ModeCharDevice
	case syscall.S_IFBLK:
		return fs.ModeDevice
	case syscall.S_IFDIR:
		return fs.ModeDir
	case syscall.S_IFLNK:
		return fs.ModeSymlink
	}
	return fs.ModeIrregular
}

// fileOp registers a file operation on sandbox id, so Destroy waits for it.
func (b *Backend) fileOp(ctx context.Context, id string) (*sandbox, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	sb, err := b.lookup(id)
	if err != nil {
		return nil, nil, err
	}
	_, done, err := sb.begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	return sb, done, nil
}

// ReadFile returns the regular file at p. It checks the size of the opened
// file before reading and never reads more than maxBytes+1 bytes, so a file
// growing meanwhile still returns *backend.FileTooLargeError. FIFOs, sockets
// and devices are refused without being opened for blocking I/O.
func (b *Backend) ReadFile(ctx context.Context, id, p string, maxBytes int64) ([]byte, error) {
	if maxBytes < 0 {
		return nil, fmt.Errorf("%w: maxBytes %d is negative", backend.ErrInvalidArgument, maxBytes)
	}
	sb, done, err := b.fileOp(ctx, id)
	if err != nil {
		return nil, err
	}
	defer done()
	root, rel, err := openArea(sb, p)
	if err != nil {
		return nil, err
	}
	defer root.Close()

	// O_NONBLOCK: opening a FIFO the guest planted must not wait for a writer.
	f, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		err = fileError(p, err)
		if errors.Is(err, backend.ErrPathNotFound) {
			if kind, ok := b.guestOnly(ctx, sb, p); ok {
				return nil, fmt.Errorf("%w: %s is a %s that exists only inside the sandbox (gVisor keeps FIFOs and sockets in its own memory), not a regular file; use run_command for it", backend.ErrBadPath, backend.ShortName(p), kind)
			}
		}
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fileError(p, err)
	}
	switch {
	case fi.IsDir():
		return nil, fileError(p, syscall.EISDIR)
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("%w: %s is a %s, not a regular file; only regular files can be read this way, use run_command for others", backend.ErrBadPath, backend.ShortName(p), fileKind(fi.Mode()))
	case fi.Size() > maxBytes:
		return nil, &backend.FileTooLargeError{Path: p, Size: fi.Size(), MaxBytes: maxBytes}
	}
	limit := maxBytes
	if limit < math.MaxInt64 {
		limit++
	}
	var buf bytes.Buffer
	buf.Grow(int(min(fi.Size(), maxBytes) + 1))
	if _, err := buf.ReadFrom(io.LimitReader(f, limit)); err != nil {
		return nil, fileError(p, err)
	}
	if int64(buf.Len()) > maxBytes {
		size := int64(buf.Len())
		if now, err := f.Stat(); err == nil {
			size = max(size, now.Size())
		}
		return nil, &backend.FileTooLargeError{Path: p, Size: size, MaxBytes: maxBytes}
	}
	return buf.Bytes(), nil
}

// WriteFile writes data to p, creating missing parent directories (0755).
// The data goes to a temporary file in the same directory that is then
// renamed over p, so a symlink at p is replaced, never written through, and a
// reader never sees half a file. mode 0 means 0644; only permission bits are
// used. With a SandboxUID, the file and every directory created are owned by
// it so the guest can change them.
func (b *Backend) WriteFile(ctx context.Context, id, p string, data []byte, mode os.FileMode) (err error) {
	sb, done, err := b.fileOp(ctx, id)
	if err != nil {
		return err
	}
	defer done()
	root, rel, err := openArea(sb, p)
	if err != nil {
		return err
	}
	defer root.Close()
	if rel == "." {
		return fileError(p, syscall.EISDIR)
	}
	if mode == 0 {
		mode = 0o644
	}
	mode &= fs.ModePerm

	dir := path.Dir(rel)
	if err := b.makeParents(root, dir); err != nil {
		return fileError(p, err)
	}
	tmp := path.Join(dir, fmt.Sprintf("%s%016x", writeTempPrefix, rand.Uint64()))
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fileError(p, err)
	}
	defer func() {
		if err != nil {
			_ = root.Remove(tmp)
		}
	}()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode) // fchmod: exact mode, whatever the umask
	}
	if err == nil {
		err = f.Chown(guestUID, guestGID)
	}
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return fileError(p, err)
	}
	if err = root.Rename(tmp, rel); err != nil {
		if errors.Is(err, syscall.EEXIST) {
			// os renames refuse to replace a directory with EEXIST.
			err = syscall.EISDIR
		}
		return fileError(p, err)
	}
	return nil
}

// makeParents creates each missing directory of dir (relative to root),
// chowning the ones it creates to the sandbox uid.
func (b *Backend) makeParents(root *os.Root, dir string) error {
	if dir == "." {
		return nil
	}
	parts := strings.Split(dir, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		err := root.Mkdir(p, 0o755)
		switch {
		case errors.Is(err, fs.ErrExist):
			// A directory, or something the next step will trip over
			// (a file gives ENOTDIR, an outward symlink an escape error).
		case err != nil:
			return err
		default:
			if err := root.Lchown(p, guestUID, guestGID); err != nil {
				return err
			}
		}
	}
	return nil
}

// ListDirectory lists the directory at p, sorted by name. IsDir comes from
// the entry's own type, so a symlink to a directory is reported as not a
// directory (following it could leave the sandbox). More than maxEntries
// entries returns ErrTooManyEntries without reading the rest.
func (b *Backend) ListDirectory(ctx context.Context, id, p string, maxEntries int) ([]backend.DirEntry, error) {
	if maxEntries <= 0 {
		return nil, fmt.Errorf("%w: maxEntries must be positive, got %d", backend.ErrInvalidArgument, maxEntries)
	}
	sb, done, err := b.fileOp(ctx, id)
	if err != nil {
		return nil, err
	}
	defer done()
	root, rel, err := openArea(sb, p)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	d, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, fileError(p, err)
	}
	defer d.Close()

	var out []backend.DirEntry
	for {
		batch, err := d.ReadDir(listBatch)
		for _, e := range batch {
			out = append(out, backend.DirEntry{Name: e.Name(), IsDir: e.Type().IsDir()})
		}
		if len(out) > maxEntries {
			return nil, fmt.Errorf("%w: %s has more than %d entries; list a subdirectory, or use run_command with find or ls | head", backend.ErrTooManyEntries, backend.ShortName(p), maxEntries)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fileError(p, err)
		}
	}
	slices.SortFunc(out, func(a, b backend.DirEntry) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// fileError maps an error from a file operation on guest path p to the
// backend's sentinels, in words that do not mention host paths.
func fileError(p string, err error) error {
	name := backend.ShortName(p)
	switch {
	case isEscape(err):
		return fmt.Errorf("%w: %s leads outside the sandbox's /workspace or /tmp through a symlink or '..'; file operations are confined to those directories and follow only symlinks that stay inside (relative ones); use run_command to read other paths", backend.ErrBadPath, name)
	case errors.Is(err, syscall.ENAMETOOLONG):
		return fmt.Errorf("%w: a component of %s is longer than the 255 bytes a file name may have; use a shorter name", backend.ErrBadPath, name)
	case errors.Is(err, syscall.ELOOP):
		return fmt.Errorf("%w: %s goes through too many symlinks; use the real path", backend.ErrBadPath, name)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %s does not exist in the sandbox; list its directory to see what is there", backend.ErrPathNotFound, name)
	case errors.Is(err, syscall.EISDIR):
		return fmt.Errorf("%w: %s is a directory; give a file path, or list the directory", backend.ErrIsDirectory, name)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%w: a component of %s is not a directory", backend.ErrNotDirectory, name)
	case errors.Is(err, syscall.ENXIO):
		return fmt.Errorf("%w: %s is a socket or a FIFO; use run_command for it", backend.ErrBadPath, name)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%w: permission denied on %s (the guest may have changed its mode); fix it with run_command (chmod)", backend.ErrBadPath, name)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("no space left for %s; delete files in the sandbox and retry: %w", name, errnoOf(err))
	}
	return fmt.Errorf("file operation on %s failed: %w", name, errnoOf(err))
}

// errnoOf returns the errno inside err, or err: a *PathError would name the
// host path, which the guest has no business seeing.
func errnoOf(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// rootEscapeErr is the error os.Root gives for a path that leaves it. It is
// unexported by the os package, so it is taken from a call known to fail
// that way; the message comparison is the fallback if that ever changes.
var rootEscapeErr = sync.OnceValue(func() error {
	r, err := os.OpenRoot("/")
	if err != nil {
		return nil
	}
	defer r.Close()
	_, err = r.Open("..")
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return nil
})

func isEscape(err error) bool {
	if sentinel := rootEscapeErr(); sentinel != nil && errors.Is(err, sentinel) {
		return true
	}
	var pe *fs.PathError
	return errors.As(err, &pe) && pe.Err != nil && pe.Err.Error() == "path escapes from parent"
}

func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0, m&fs.ModeCharDevice != 0:
		return "device"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	}
	return "special file"
}
