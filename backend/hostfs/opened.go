package hostfs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// The operations on a file already open: the backend (or a sandbox's init,
// inside the sandbox, as the guest) opened it, non-blocking, and this
// package only reads it. Nothing here resolves a path, so a descriptor
// that came from inside a sandbox is read as what it is, never as a name.

// deviceChunk is how much ReadOpened reads from a device at a time.
const deviceChunk = 64 << 10

// ReadOpened returns the contents of f, opened non-blocking from path p
// (which names it in errors), bounded by maxBytes: a regular file's size is
// checked before reading and never more than maxBytes+1 bytes are read, so
// a file growing meanwhile, or a /proc file whose size says 0, still
// returns *backend.FileTooLargeError. A character device (/dev/zero,
// /dev/null) is read up to maxBytes+1 bytes or until it has nothing more
// at once, so an endless one is file-too-large, never an endless read. A
// directory is ErrIsDirectory; FIFOs, sockets and block devices are
// refused (ErrBadPath).
func ReadOpened(f *os.File, p string, maxBytes int64) ([]byte, error) {
	if maxBytes < 0 {
		return nil, fmt.Errorf("%w: maxBytes %d is negative", backend.ErrInvalidArgument, maxBytes)
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, Error(p, err)
	}
	m := fi.Mode()
	switch {
	case fi.IsDir():
		return nil, Error(p, syscall.EISDIR)
	case m&fs.ModeCharDevice != 0:
		return readDevice(f, p, maxBytes)
	case !m.IsRegular():
		return nil, notRegular(p, m, "read_file reads regular files and character devices")
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
		return nil, Error(p, err)
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

// readDevice reads the character device f up to maxBytes+1 bytes, stopping
// at end of file or as soon as a read would block (the descriptor is
// non-blocking): a terminal with nothing typed gives what it has, not a
// wait. The reads are raw system calls, so the runtime's poller never
// parks on the device.
func readDevice(f *os.File, p string, maxBytes int64) ([]byte, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, Error(p, err)
	}
	var out []byte
	var readErr error
	cerr := rc.Control(func(fd uintptr) {
		// The descriptor may have come from inside a sandbox, whose
		// processes share its file description: make sure of O_NONBLOCK,
		// and read only what poll says is there, so no read waits.
		if err := unix.SetNonblock(int(fd), true); err != nil {
			readErr = err
			return
		}
		for int64(len(out)) <= maxBytes {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if n, err := unix.Poll(pfd, 0); errors.Is(err, unix.EINTR) {
				continue
			} else if err != nil || n == 0 || pfd[0].Revents&unix.POLLIN == 0 {
				return
			}
			want := int(min(int64(deviceChunk), maxBytes+1-int64(len(out))))
			out = slices.Grow(out, want)
			n, err := unix.Read(int(fd), out[len(out):len(out)+want])
			switch {
			case errors.Is(err, unix.EINTR):
				continue
			case errors.Is(err, unix.EAGAIN):
				return
			case err != nil:
				readErr = err
				return
			case n == 0:
				return
			}
			out = out[:len(out)+n]
		}
	})
	if cerr != nil {
		return nil, Error(p, cerr)
	}
	if readErr != nil {
		return nil, Error(p, readErr)
	}
	if int64(len(out)) > maxBytes {
		return nil, &backend.FileTooLargeError{Path: p, Size: int64(len(out)), MaxBytes: maxBytes}
	}
	return out, nil
}

// ReadRangeOpened returns at most length bytes of the regular file f
// (opened from p) from offset, and its size (backend.RangedFiles). Ranged
// reads are for regular files only: a device has no size to move in
// pieces.
func ReadRangeOpened(f *os.File, p string, offset, length int64) ([]byte, int64, error) {
	if offset < 0 || length < 0 {
		return nil, 0, fmt.Errorf("%w: offset %d and length %d must not be negative", backend.ErrInvalidArgument, offset, length)
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, Error(p, err)
	}
	if err := checkRegular(p, fi); err != nil {
		return nil, 0, err
	}
	return readRange(f, p, fi.Size(), offset, length)
}

func readRange(f *os.File, p string, size, offset, length int64) ([]byte, int64, error) {
	buf := make([]byte, max(0, min(length, size-offset)))
	got, err := f.ReadAt(buf, offset)
	if err != nil && err != io.EOF {
		return nil, 0, Error(p, err)
	}
	// A file cut short meanwhile gives what is still there; the caller
	// sees fewer bytes than the size it was told and can tell.
	return buf[:got], size, nil
}

// checkRegular refuses what is not a regular file, in the words the
// ranged operations use.
func checkRegular(p string, fi os.FileInfo) error {
	switch {
	case fi.IsDir():
		return Error(p, syscall.EISDIR)
	case !fi.Mode().IsRegular():
		return notRegular(p, fi.Mode(), "only regular files can be moved in pieces")
	}
	return nil
}

func notRegular(p string, m fs.FileMode, what string) error {
	return fmt.Errorf("%w: %s is a %s, not a regular file; %s, use run_command for others", backend.ErrBadPath, backend.ShortName(p), fileKind(m), what)
}

// ListOpened lists the directory d (opened from p), sorted by name. IsDir
// comes from the entry's own type, so a symlink to a directory is reported
// as not a directory. More than maxEntries entries returns
// ErrTooManyEntries without reading the rest.
func ListOpened(d *os.File, p string, maxEntries int) ([]backend.DirEntry, error) {
	if maxEntries <= 0 {
		return nil, fmt.Errorf("%w: maxEntries must be positive, got %d", backend.ErrInvalidArgument, maxEntries)
	}
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
			return nil, Error(p, err)
		}
	}
	slices.SortFunc(out, func(a, b backend.DirEntry) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// GuestError maps the errno of opening p inside a sandbox, as its guest,
// to the backend's sentinels. A guest path has no escape: whatever it
// resolves to is the sandbox's own, so only what the guest's kernel said
// is reported.
func GuestError(p string, errno syscall.Errno) error {
	name := backend.ShortName(p)
	switch errno {
	case syscall.EACCES, syscall.EPERM:
		return fmt.Errorf("%w: permission denied on %s: the sandbox's user may not open it (as with cat in the sandbox); if the guest made it, fix its mode with run_command (chmod)", backend.ErrBadPath, name)
	case syscall.ENOENT:
		return fmt.Errorf("%w: %s does not exist in the sandbox; list its directory to see what is there", backend.ErrPathNotFound, name)
	}
	return Error(p, errno)
}
