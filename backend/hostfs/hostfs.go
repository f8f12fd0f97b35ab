// Package hostfs is the file operations of a backend whose sandboxes' files
// are directories of the host: a read, a write and a listing confined to an
// os.Root (so neither '..' nor a symlink the guest planted leads out), with
// every error mapped to the backend's sentinels in words that name no host
// path. Which directory a guest path lands in is the backend's business; it
// hands this package the opened root and the path relative to it.
package hostfs

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"strings"
	"sync"
	"syscall"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// listBatch is how many directory entries List reads at a time, so a huge
// directory is refused after maxEntries+1 entries, not after all.
const listBatch = 256

// TempPrefix names Write's temporary files.
const TempPrefix = ".sidecar-write-"

// Owner is who a written file and the directories made for it belong to;
// a UID of -1 leaves them the daemon's.
type Owner struct{ UID, GID int }

// Read returns the file rel of root (p, the path the client gave, names
// it in errors), as ReadOpened reads it. FIFOs and sockets are refused
// without being opened for blocking I/O.
func Read(root *os.Root, rel, p string, maxBytes int64) ([]byte, error) {
	// O_NONBLOCK: opening a FIFO the guest planted must not wait for a writer.
	f, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, Error(p, err)
	}
	defer f.Close()
	return ReadOpened(f, p, maxBytes)
}

// Write writes data to rel of root, creating missing parent directories
// (0755). The data goes to a temporary file in the same directory that is
// then renamed over rel, so a symlink there is replaced, never written
// through, and a reader never sees half a file. mode 0 means 0644; only
// permission bits are used. The file and every directory created are
// given to owner.
func Write(root *os.Root, rel, p string, data []byte, mode os.FileMode, owner Owner) (err error) {
	if rel == "." {
		return Error(p, syscall.EISDIR)
	}
	if mode == 0 {
		mode = 0o644
	}
	mode &= fs.ModePerm

	dir := path.Dir(rel)
	if err := makeParents(root, dir, owner); err != nil {
		return Error(p, err)
	}
	tmp := path.Join(dir, fmt.Sprintf("%s%016x", TempPrefix, rand.Uint64()))
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return Error(p, err)
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
	if err == nil && owner.UID >= 0 {
		err = f.Chown(owner.UID, owner.GID)
	}
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return Error(p, err)
	}
	if err = root.Rename(tmp, rel); err != nil {
		if errors.Is(err, syscall.EEXIST) {
			// os renames refuse to replace a directory with EEXIST.
			err = syscall.EISDIR
		}
		return Error(p, err)
	}
	return nil
}

// makeParents creates each missing directory of dir (relative to root),
// giving the ones it creates to owner.
func makeParents(root *os.Root, dir string, owner Owner) error {
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
		case owner.UID >= 0:
			if err := root.Lchown(p, owner.UID, owner.GID); err != nil {
				return err
			}
		}
	}
	return nil
}

// List lists the directory rel of root, as ListOpened does.
func List(root *os.Root, rel, p string, maxEntries int) ([]backend.DirEntry, error) {
	d, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, Error(p, err)
	}
	defer d.Close()
	return ListOpened(d, p, maxEntries)
}

// Error maps an error from a file operation on guest path p to the
// backend's sentinels, in words that do not mention host paths.
func Error(p string, err error) error {
	name := backend.ShortName(p)
	switch {
	case isEscape(err):
		return fmt.Errorf("%w: %s leads outside /workspace and /tmp through a symlink or '..'; writes (and reads, on a backend without a view of its own) stay in them and follow only symlinks that stay inside (relative ones); use run_command for other paths", backend.ErrBadPath, name)
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
