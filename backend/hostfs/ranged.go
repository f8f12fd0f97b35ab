package hostfs

import (
	"fmt"
	"os"
	"syscall"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// openRegular opens the regular file rel of root with flag (plus
// O_NONBLOCK and O_NOCTTY, so a planted FIFO or terminal never blocks the
// daemon). With noFollow a symlink at rel itself is refused: os.Root
// follows one at the last component (inside the root), a writer must not,
// so it looks first and checks after opening that the file is the one it
// looked at.
func openRegular(root *os.Root, rel, p string, flag int, noFollow bool) (*os.File, os.FileInfo, error) {
	var link os.FileInfo
	if noFollow {
		var err error
		if link, err = root.Lstat(rel); err != nil {
			return nil, nil, Error(p, err)
		}
		if link.Mode()&os.ModeSymlink != 0 {
			return nil, nil, fmt.Errorf("%w: %s is a symlink; write to the file it names, or replace it with write_file", backend.ErrBadPath, backend.ShortName(p))
		}
	}
	f, err := root.OpenFile(rel, flag|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, Error(p, err)
	}
	fi, err := f.Stat()
	switch {
	case err != nil:
		err = Error(p, err)
	case link != nil && !os.SameFile(link, fi):
		err = fmt.Errorf("%w: %s changed while it was opened (the guest replaced it); retry", backend.ErrBadPath, backend.ShortName(p))
	default:
		err = checkRegular(p, fi)
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// ReadRange returns at most length bytes of the regular file rel of root
// from offset, and the file's size when it was opened (backend.RangedFiles).
func ReadRange(root *os.Root, rel, p string, offset, length int64) ([]byte, int64, error) {
	if offset < 0 || length < 0 {
		return nil, 0, fmt.Errorf("%w: offset %d and length %d must not be negative", backend.ErrInvalidArgument, offset, length)
	}
	f, fi, err := openRegular(root, rel, p, os.O_RDONLY, false)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	return readRange(f, p, fi.Size(), offset, length)
}

// WriteAt writes data into the existing regular file rel of root at
// offset, or at its end when offset is negative; offset may not lie past
// the end. A symlink at rel is refused. It returns the file's size after
// (backend.RangedFiles).
func WriteAt(root *os.Root, rel, p string, data []byte, offset int64) (int64, error) {
	f, fi, err := openRegular(root, rel, p, os.O_WRONLY, true)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	size := fi.Size()
	if offset < 0 {
		offset = size
	}
	if offset > size {
		return 0, fmt.Errorf("%w: offset %d is past the end of %s (%d bytes); write from 0 up to its size", backend.ErrInvalidArgument, offset, backend.ShortName(p), size)
	}
	if _, err := f.WriteAt(data, offset); err != nil {
		return 0, Error(p, err)
	}
	return max(size, offset+int64(len(data))), nil
}
