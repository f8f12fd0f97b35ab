package disk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// Formatting a filesystem is most of what a capped disk costs at create:
// mkfs.ext4 is a process to start, and it fsyncs the image before it
// exits (14-26 ms on a 1 GiB image here: docs/performance.md, "bwrap: a
// cold create's first result"). Sandboxes with the same cap get the same
// empty filesystem, so Templates formats each shape once per daemon and
// gives every new sandbox a copy: a reflink
// where the host's filesystem has them (xfs, btrfs), otherwise a copy of
// the template's data only. mkfs leaves the image sparse (it punches the
// whole file, which reads back as zeros, and marks the inode tables zeroed
// instead of writing them), so that is well under a MiB for a 1 GiB cap.
//
// What a copy shares with its template and its siblings is the ext4 UUID
// and directory-hash seed: neither reaches a guest (it sees files, never
// its device), and nothing mounts a sandbox disk by UUID. A copy is not
// fsynced, as nothing a guest writes to it is: a sandbox's disk is scratch
// (it has no journal either), and one a host crash left unreadable fails
// to mount on recovery, which reports the sandbox damaged, never silently
// empty.
//
// The templates live in one directory that New empties: a daemon never
// trusts a template an earlier one left (it may be half written, or of an
// mkfs since upgraded). Their number is bounded (a request may lower its
// cap, so shapes vary): past maxTemplates, the least recently used one not
// being copied is dropped, and when every one is in use the new shape is
// formatted directly.

// maxTemplates bounds how many shapes keep a template.
const maxTemplates = 4

// Templates makes capped images from formatted templates.
type Templates struct {
	dir string

	mu    sync.Mutex
	shape map[shape]*template // guarded by mu
	tick  uint64              // guarded by mu: a clock for least-recent use
}

type template struct {
	path  string
	ready chan struct{} // closed once formatting ended, err set
	err   error
	users int    // guarded by Templates.mu: copies being made from it
	used  uint64 // guarded by Templates.mu: tick of its last use
}

// NewTemplates keeps templates in dir, which it creates (mode 0700) or
// empties.
func NewTemplates(dir string) (*Templates, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("disk: clear the template directory %s: %w", dir, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("disk: create the template directory %s: %w", dir, err)
	}
	return &Templates{dir: dir, shape: map[shape]*template{}}, nil
}

// shape is what makes two images' empty filesystems the same.
type shape struct {
	size, inodes int64
	uid, gid     int
	mkfs         string
}

func shapeOf(o Options) shape {
	return shape{size: o.Size, inodes: o.Inodes, uid: o.UID, gid: o.GID, mkfs: o.MkfsPath}
}

// Create makes the image at path (which must not exist) as Create does,
// from the template of o's shape, which it formats first when there is
// none yet. Callers of one shape wait for the one formatting; o.Formatting
// is called for the template's mkfs. A failure removes the file. A nil
// Templates formats every image itself.
func (t *Templates) Create(ctx context.Context, path string, o Options) error {
	if t == nil || o.Size < MinSize || o.Inodes < 0 {
		return Create(ctx, path, o) // its error
	}
	tp, err := t.acquire(ctx, o)
	if err != nil {
		return err
	}
	if tp == nil {
		return Create(ctx, path, o)
	}
	defer t.release(tp)
	return clone(tp.path, path, o.Size, o.Preallocate)
}

// acquire returns the formatted template of o's shape, counted as in use,
// or nil when the caller should format its own image: no room for another
// template, or the one it waited for failed.
func (t *Templates) acquire(ctx context.Context, o Options) (*template, error) {
	key := shapeOf(o)
	t.mu.Lock()
	tp, ok := t.shape[key]
	if !ok {
		if len(t.shape) >= maxTemplates && !t.evictLocked() {
			t.mu.Unlock()
			return nil, nil
		}
		tp = &template{path: filepath.Join(t.dir, fmt.Sprintf("ext4-%d.img", t.tick)), ready: make(chan struct{})}
		t.shape[key] = tp
		tp.users++
		t.tick++
		t.mu.Unlock()
		// Formatted under its own name; o's Preallocate is for the copies.
		fo := o
		fo.Preallocate = false
		tp.err = Create(ctx, tp.path, fo)
		close(tp.ready)
		if tp.err != nil {
			t.mu.Lock()
			delete(t.shape, key) // the next caller tries again
			tp.users--
			t.mu.Unlock()
			return nil, tp.err
		}
		t.mu.Lock()
		tp.used = t.tick
		t.mu.Unlock()
		return tp, nil
	}
	tp.users++
	t.tick++
	tp.used = t.tick
	t.mu.Unlock()
	select {
	case <-tp.ready:
	case <-ctx.Done():
		t.release(tp)
		return nil, fmt.Errorf("disk: waiting for the template of a %d-byte image: %w", o.Size, ctx.Err())
	}
	if tp.err != nil {
		// Formatted under another caller's deadline, which may have been
		// what failed it: this one formats its own.
		t.release(tp)
		return nil, nil
	}
	return tp, nil
}

func (t *Templates) release(tp *template) {
	t.mu.Lock()
	tp.users--
	t.mu.Unlock()
}

// evictLocked drops the least recently used template nobody is copying,
// reporting whether it found one.
func (t *Templates) evictLocked() bool {
	var (
		oldKey shape
		old    *template
	)
	for k, tp := range t.shape {
		if tp.users == 0 && (old == nil || tp.used < old.used) {
			oldKey, old = k, tp
		}
	}
	if old == nil {
		return false
	}
	delete(t.shape, oldKey)
	_ = os.Remove(old.path)
	return true
}

// clone makes dst (which must not exist) a copy of the image src of size
// bytes: a reflink when the filesystem can, otherwise src's data ranges
// copied into a sparse (or, with preallocate, fully allocated) file. A
// failure removes dst.
func clone(src, dst string, size int64, preallocate bool) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("disk: open template %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("disk: create image %s: %w", dst, err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("disk: write image %s: %w", dst, cerr)
		}
		if err != nil {
			_ = os.Remove(dst)
		}
	}()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		if preallocate {
			// Reserves the holes; the shared extents stay shared until
			// written, which the host then has to find room for: a
			// filesystem with reflinks cannot promise more.
			if err := unix.Fallocate(int(out.Fd()), 0, 0, size); err != nil {
				return fmt.Errorf("disk: size image %s to %d bytes: %w; is the host's disk full?", dst, size, err)
			}
		}
		return nil
	}
	if preallocate {
		err = unix.Fallocate(int(out.Fd()), 0, 0, size)
	} else {
		err = out.Truncate(size)
	}
	if err != nil {
		return fmt.Errorf("disk: size image %s to %d bytes: %w; is the host's disk full?", dst, size, err)
	}
	return copyData(in, out, size)
}

// copyData copies every data range of in (below size) to the same offset
// of out, skipping holes, which out already reads as zeros.
func copyData(in, out *os.File, size int64) error {
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // no data past off
		}
		if err != nil {
			return fmt.Errorf("disk: read template %s: %w", in.Name(), err)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("disk: read template %s: %w", in.Name(), err)
		}
		hole = min(hole, size)
		if err := copyRange(in, out, data, hole-data); err != nil {
			return fmt.Errorf("disk: copy template %s to %s: %w", in.Name(), out.Name(), err)
		}
		off = hole
	}
	return nil
}

// copyRange copies n bytes at off from in to out, in the kernel when it
// can.
func copyRange(in, out *os.File, off, n int64) error {
	for n > 0 {
		roff, woff := off, off
		c, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(min(n, 1<<30)), 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
				return copyRangeByHand(in, out, off, n)
			}
			return err
		}
		if c == 0 {
			return io.ErrUnexpectedEOF
		}
		off += int64(c)
		n -= int64(c)
	}
	return nil
}

func copyRangeByHand(in, out *os.File, off, n int64) error {
	_, err := io.Copy(io.NewOffsetWriter(out, off), io.NewSectionReader(in, off, n))
	return err
}
