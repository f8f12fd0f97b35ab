// Package fscopy copies a directory tree of the host into another, treating
// the source as hostile: a sandbox's /workspace and /tmp, which its guest
// may change while the copy runs. It is what a snapshot (a sandbox's files
// into the image store), a fork (one sandbox's files into a new one) and a
// sandbox made from a snapshot (an image's files into its /workspace) are
// made of.
//
// # What it promises
//
//   - No path leaves either tree. Every name it handles is one component
//     read from a directory it holds open; directories are reached with
//     openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_XDEV) from the
//     tree's root, files opened with O_NOFOLLOW. A symlink is copied as a
//     symlink (its target is data, never followed), a hard link within the
//     source stays a hard link within the copy, and FIFOs, sockets and
//     devices are skipped (counted). A file that changes type under the
//     copy is skipped too.
//   - Bounded: Limits cap the regular-file bytes (apparent sizes, so a
//     sparse file of a terabyte counts as one) and the entries; past either
//     the copy stops with ErrTooLarge. Paths longer than PATH_MAX and
//     directories nested deeper than MaxDepth stop it with ErrBadEntry.
//     Memory is a batch of directory entries, one copy buffer, the stack of
//     directories still to copy and, for hard links and directory times,
//     an entry per linked file and per directory.
//   - Cheap where the filesystem lets it: a file is cloned (FICLONE: a
//     reflink, no data written) where the filesystem has them, else copied
//     in the kernel with copy_file_range, hole by hole (SEEK_DATA), so a
//     sparse file stays sparse; only when neither works does it go through
//     a buffer. Link mode hard-links every regular file instead (an
//     immutable tree, such as an image root, into another of the same
//     filesystem).
//
// What it never does: decide what to copy (the caller names the trees),
// clean up a half-made copy (the caller removes the destination it gave),
// or sync (the caller makes the result durable its own way).
package fscopy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Errors; callers check them with errors.Is. Errors of the host (ENOSPC,
// EIO, EACCES) come back wrapped as they are, so errors.Is finds them.
var (
	// ErrTooLarge: the tree holds more bytes or entries than Limits allow.
	ErrTooLarge = errors.New("tree too large")
	// ErrBadEntry: an entry cannot be copied faithfully (a path longer
	// than PATH_MAX, directories nested too deep, a symlink target too
	// long); the message names it.
	ErrBadEntry = errors.New("entry cannot be copied")
)

// Bounds that are not worth a setting.
const (
	// MaxDepth bounds how deep directories may nest.
	MaxDepth = 512
	// maxPath is PATH_MAX: a relative path within the tree.
	maxPath = 4096
	// batch is how many directory entries are read at a time.
	batch = 256
	// bufSize is the buffer of the last-resort copy.
	bufSize = 128 << 10
	// maxSkippedNames is how many skipped entries Stats names.
	maxSkippedNames = 5
)

// Limits bound one copy; zero fields mean no bound. Stats carried over
// from an earlier copy (Options.Stats) count against them too, so several
// trees copied into one image share one budget.
type Limits struct {
	MaxBytes int64
	MaxFiles int64
}

// Options say how to copy.
type Options struct {
	Limits Limits
	// Stats, when set, accumulates what the copy did (and holds what
	// earlier copies did, against Limits).
	Stats *Stats
	// FileMode and DirMode give the copy's permission bits from the
	// source's (nil: the source's permission bits, setuid and setgid
	// dropped; the sticky bit kept).
	FileMode func(fs.FileMode) fs.FileMode
	DirMode  func(fs.FileMode) fs.FileMode
	// UID and GID own everything the copy makes (-1: the caller's).
	UID, GID int
	// ReadAs, when set, wraps every access to the source that the kernel
	// checks permissions for (opening a directory or a file, looking at an
	// entry, reading a symlink): a daemon without CAP_DAC_READ_SEARCH
	// reads a sandbox's files with the sandbox's filesystem ids. WriteAs
	// wraps every change in the destination alike (a daemon without
	// CAP_CHOWN makes a sandbox's files as the sandbox).
	ReadAs, WriteAs func(fn func() error) error
	// Link hard-links regular files instead of copying them; a file that
	// cannot be linked (another filesystem, too many links) is copied.
	// Only for a source nobody changes (an image root): a link shares the
	// file.
	Link bool
	// Skip leaves out the entries of the source's top directory it names.
	Skip []string
}

// Stats say what a copy did.
type Stats struct {
	// Bytes and Files are what was copied (apparent sizes; every entry,
	// directories and symlinks included, but not the top directory).
	Bytes, Files int64
	// Cloned, Copied and Linked count regular files by how their data
	// came over (a reflink, a copy, a hard link).
	Cloned, Copied, Linked int64
	// Skipped counts FIFOs, sockets, devices and entries that changed
	// type under the copy; SkippedNames names the first few.
	Skipped      int64
	SkippedNames []string
}

func (o *Options) defaults() {
	if o.Stats == nil {
		o.Stats = &Stats{}
	}
	if o.FileMode == nil {
		o.FileMode = keepPerm
	}
	if o.DirMode == nil {
		o.DirMode = keepPerm
	}
	if o.ReadAs == nil {
		o.ReadAs = direct
	}
	if o.WriteAs == nil {
		o.WriteAs = direct
	}
}

func keepPerm(m fs.FileMode) fs.FileMode { return m & (fs.ModePerm | fs.ModeSticky) }

func direct(fn func() error) error { return fn() }

// resolve is how every directory of either tree is reached from its root.
const resolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// Copy copies the tree under src into dst, an existing directory (whose
// own mode and owner it leaves alone). A failure leaves dst as far as the
// copy got: the caller removes it.
func Copy(ctx context.Context, src, dst string, opt Options) error {
	opt.defaults()
	c := &copier{ctx: ctx, opt: opt, st: opt.Stats, links: map[fileID]string{}, canClone: true, canRange: true}
	var err error
	if err = opt.ReadAs(func() error {
		c.src, err = unix.Open(src, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return err
	}); err != nil {
		return fmt.Errorf("open %s: %w", src, err)
	}
	defer unix.Close(c.src)
	if err = opt.WriteAs(func() error {
		c.dst, err = unix.Open(dst, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return err
	}); err != nil {
		return fmt.Errorf("open %s: %w", dst, err)
	}
	defer unix.Close(c.dst)
	if err := c.run(); err != nil {
		return err
	}
	return c.setDirTimes()
}

// fileID is an inode of the source.
type fileID struct{ dev, ino uint64 }

type dirTime struct {
	rel   string
	times [2]unix.Timespec
}

type copier struct {
	ctx      context.Context
	opt      Options
	st       *Stats
	src, dst int // the trees' roots (O_PATH)
	// links maps a multiply-linked source inode to its first copy.
	links    map[fileID]string
	dirTimes []dirTime
	buf      []byte
	// canClone and canRange go false at the first refusal: a filesystem
	// that cannot clone one file cannot clone the next.
	canClone, canRange bool
}

type pending struct {
	rel   string
	depth int
}

func (c *copier) run() error {
	stack := []pending{{".", 0}}
	for len(stack) > 0 {
		d := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		subdirs, err := c.dir(d)
		if err != nil {
			return err
		}
		for i := len(subdirs) - 1; i >= 0; i-- {
			stack = append(stack, pending{subdirs[i], d.depth + 1})
		}
	}
	return nil
}

// openDir opens directory rel of the tree at root, never through a
// symlink or out of it.
func openDir(root int, rel string) (int, error) {
	return unix.Openat2(root, rel, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolve})
}

// dir copies the entries of directory d (which exists in the copy) and
// returns its subdirectories, made in the copy, to copy next.
func (c *copier) dir(d pending) (subdirs []string, err error) {
	var sfd, dfd int
	if err := c.opt.ReadAs(func() (err error) { sfd, err = openDir(c.src, d.rel); return err }); err != nil {
		if d.rel != "." && errors.Is(err, unix.ENOENT) {
			return nil, nil // removed under the copy: as if it had been empty
		}
		return nil, c.entryErr(d.rel, err)
	}
	sdir := os.NewFile(uintptr(sfd), d.rel)
	defer sdir.Close()
	if err := c.opt.WriteAs(func() (err error) { dfd, err = openDir(c.dst, d.rel); return err }); err != nil {
		return nil, c.entryErr(d.rel, err)
	}
	defer unix.Close(dfd)
	for {
		ents, rerr := sdir.ReadDir(batch)
		for _, e := range ents {
			if err := c.ctx.Err(); err != nil {
				return nil, err
			}
			name := e.Name()
			if d.rel == "." && contains(c.opt.Skip, name) {
				continue
			}
			rel := path.Join(d.rel, name)
			isDir, err := c.entry(sfd, dfd, name, rel, d.depth)
			if err != nil {
				return nil, err
			}
			if isDir {
				subdirs = append(subdirs, rel)
			}
		}
		if rerr == io.EOF || (rerr == nil && len(ents) == 0) {
			return subdirs, nil
		}
		if rerr != nil {
			return nil, c.entryErr(d.rel, rerr)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// entry copies one entry of a directory; it reports whether it made a
// directory whose content is still to copy.
func (c *copier) entry(sfd, dfd int, name, rel string, depth int) (bool, error) {
	if len(rel) > maxPath {
		return false, fmt.Errorf("%w: %s: a path of %d bytes, at most %d", ErrBadEntry, quote(rel), len(rel), maxPath)
	}
	var st unix.Stat_t
	if err := c.opt.ReadAs(func() error { return unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) }); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil // removed under the copy
		}
		return false, c.entryErr(rel, err)
	}
	mode := st.Mode & unix.S_IFMT
	switch mode {
	case unix.S_IFDIR, unix.S_IFREG, unix.S_IFLNK:
	default:
		c.skip(rel)
		return false, nil
	}
	c.st.Files++
	if max := c.opt.Limits.MaxFiles; max > 0 && c.st.Files > max {
		return false, fmt.Errorf("%w: more than %d entries", ErrTooLarge, max)
	}
	switch mode {
	case unix.S_IFDIR:
		if depth+1 > MaxDepth {
			return false, fmt.Errorf("%w: %s: directories nested more than %d deep", ErrBadEntry, quote(rel), MaxDepth)
		}
		perm := c.opt.DirMode(fs.FileMode(st.Mode & 0o7777))
		if err := c.opt.WriteAs(func() error {
			if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
				return err
			}
			if err := c.chown(dfd, name); err != nil {
				return err
			}
			return unix.Fchmodat(dfd, name, unixPerm(perm), 0)
		}); err != nil {
			return false, c.entryErr(rel, err)
		}
		c.dirTimes = append(c.dirTimes, dirTime{rel, [2]unix.Timespec{st.Atim, st.Mtim}})
		return true, nil
	case unix.S_IFLNK:
		return false, c.symlink(sfd, dfd, name, rel)
	}
	return false, c.file(sfd, dfd, name, rel, &st)
}

func (c *copier) skip(rel string) {
	c.st.Skipped++
	if len(c.st.SkippedNames) < maxSkippedNames {
		c.st.SkippedNames = append(c.st.SkippedNames, rel)
	}
}

func (c *copier) chown(dfd int, name string) error {
	if c.opt.UID < 0 && c.opt.GID < 0 {
		return nil
	}
	return unix.Fchownat(dfd, name, c.opt.UID, c.opt.GID, unix.AT_SYMLINK_NOFOLLOW)
}

// unixPerm is m's permission, setuid, setgid and sticky bits as the
// kernel spells them.
func unixPerm(m fs.FileMode) uint32 {
	p := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		p |= unix.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		p |= unix.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		p |= unix.S_ISVTX
	}
	return p
}

func (c *copier) symlink(sfd, dfd int, name, rel string) error {
	buf := make([]byte, maxPath)
	var n int
	if err := c.opt.ReadAs(func() (err error) { n, err = unix.Readlinkat(sfd, name, buf); return err }); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL) {
			c.skip(rel) // gone, or no longer a symlink
			c.st.Files--
			return nil
		}
		return c.entryErr(rel, err)
	}
	if n >= len(buf) {
		return fmt.Errorf("%w: %s: a symlink target of %d bytes or more", ErrBadEntry, quote(rel), len(buf))
	}
	target := string(buf[:n])
	if err := c.opt.WriteAs(func() error {
		if err := unix.Symlinkat(target, dfd, name); err != nil {
			return err
		}
		return c.chown(dfd, name)
	}); err != nil {
		return c.entryErr(rel, err)
	}
	return nil
}

func (c *copier) file(sfd, dfd int, name, rel string, lst *unix.Stat_t) error {
	if max := c.opt.Limits.MaxBytes; max > 0 && lst.Size > max-c.st.Bytes {
		return fmt.Errorf("%w: %s (%d bytes) takes the copy over %d bytes", ErrTooLarge, quote(rel), lst.Size, max)
	}
	id := fileID{uint64(lst.Dev), lst.Ino}
	if lst.Nlink > 1 {
		if first, ok := c.links[id]; ok {
			err := c.opt.WriteAs(func() error { return unix.Linkat(c.dst, first, dfd, name, 0) })
			if err == nil {
				c.st.Linked++
				return nil
			}
			// The copy's filesystem refused (too many links): a copy of
			// its own.
		}
	}
	if c.opt.Link {
		err := c.opt.WriteAs(func() error { return unix.Linkat(sfd, name, dfd, name, 0) })
		if err == nil {
			c.st.Linked++
			c.st.Bytes += lst.Size
			return nil
		}
		if !errors.Is(err, unix.EXDEV) && !errors.Is(err, unix.EMLINK) && !errors.Is(err, unix.EPERM) {
			return c.entryErr(rel, err)
		}
	}
	var fd int
	if err := c.opt.ReadAs(func() (err error) {
		fd, err = unix.Openat(sfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		return err
	}); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENXIO) {
			c.skip(rel) // gone, or no longer a regular file
			c.st.Files--
			return nil
		}
		return c.entryErr(rel, err)
	}
	in := os.NewFile(uintptr(fd), rel)
	defer in.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return c.entryErr(rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		c.skip(rel)
		c.st.Files--
		return nil
	}
	if max := c.opt.Limits.MaxBytes; max > 0 && st.Size > max-c.st.Bytes {
		return fmt.Errorf("%w: %s (%d bytes) takes the copy over %d bytes", ErrTooLarge, quote(rel), st.Size, max)
	}
	perm := c.opt.FileMode(fs.FileMode(st.Mode & 0o7777))
	var ofd int
	if err := c.opt.WriteAs(func() (err error) {
		ofd, err = unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		return err
	}); err != nil {
		return c.entryErr(rel, err)
	}
	out := os.NewFile(uintptr(ofd), rel)
	defer out.Close()
	cloned, err := c.data(out, in, st.Size)
	if err != nil {
		return c.entryErr(rel, err)
	}
	if cloned {
		c.st.Cloned++
	} else {
		c.st.Copied++
	}
	c.st.Bytes += st.Size
	// As the copy's owner: only it (or CAP_FOWNER) may set a mode and times.
	if err := c.opt.WriteAs(func() error {
		if c.opt.UID >= 0 || c.opt.GID >= 0 {
			if err := unix.Fchown(ofd, c.opt.UID, c.opt.GID); err != nil {
				return err
			}
		}
		if err := unix.Fchmod(ofd, unixPerm(perm)); err != nil {
			return err
		}
		// Modification times matter (Python checks a .pyc against its source).
		return unix.UtimesNanoAt(dfd, name, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
	}); err != nil {
		return c.entryErr(rel, err)
	}
	if st.Nlink > 1 {
		c.links[id] = rel
	}
	return out.Close()
}

// data copies size bytes of in to out, the cheapest way the filesystems
// allow; it reports whether out was cloned. A source that shrinks under
// the copy ends it early; one that grows is copied up to size.
func (c *copier) data(out, in *os.File, size int64) (cloned bool, err error) {
	if size == 0 {
		return false, nil
	}
	if c.canClone {
		err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
		if err == nil {
			return true, nil
		}
		if !cannot(err) {
			return false, err
		}
		c.canClone = false
	}
	if c.canRange {
		err := c.sparseRange(out, in, size)
		if err == nil {
			return false, nil
		}
		if !cannot(err) {
			return false, err
		}
		c.canRange = false
		if err := out.Truncate(0); err != nil {
			return false, err
		}
	}
	return false, c.buffered(out, in, size)
}

// cannot reports an error that says the call is not possible here (not a
// failure of the copy): another filesystem, an operation it lacks.
func cannot(err error) bool {
	for _, e := range []error{unix.EOPNOTSUPP, unix.ENOTTY, unix.EXDEV, unix.EINVAL, unix.ENOSYS, unix.EBADF} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// sparseRange copies the data segments of in (SEEK_DATA, SEEK_HOLE) at
// their offsets with copy_file_range and sizes out to size: the holes stay
// holes.
func (c *copier) sparseRange(out, in *os.File, size int64) error {
	ifd, ofd := int(in.Fd()), int(out.Fd())
	for off := int64(0); off < size; {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		start, err := unix.Seek(ifd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return err
		}
		if start >= size {
			break
		}
		end, err := unix.Seek(ifd, start, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		end = min(end, size)
		for roff, woff := start, start; roff < end; {
			n, err := unix.CopyFileRange(ifd, &roff, ofd, &woff, int(min(end-roff, 1<<30)), 0)
			if err != nil {
				return err
			}
			if n == 0 {
				return out.Truncate(size) // shrank under the copy
			}
		}
		off = end
	}
	return out.Truncate(size)
}

func (c *copier) buffered(out, in *os.File, size int64) error {
	if c.buf == nil {
		c.buf = make([]byte, bufSize)
	}
	_, err := io.CopyBuffer(onlyWriter{out}, io.NewSectionReader(in, 0, size), c.buf)
	return err
}

// onlyWriter hides *os.File's ReadFrom so that CopyBuffer uses the buffer.
type onlyWriter struct{ w io.Writer }

func (o onlyWriter) Write(p []byte) (int, error) { return o.w.Write(p) }

// setDirTimes gives the copied directories their source's times, deepest
// first (making an entry changes its directory's times).
func (c *copier) setDirTimes() error {
	for i := len(c.dirTimes) - 1; i >= 0; i-- {
		d := c.dirTimes[i]
		parent, base := path.Split(d.rel)
		err := c.opt.WriteAs(func() error {
			pfd, err := openDir(c.dst, strings.TrimSuffix(cmpDot(parent), "/"))
			if err != nil {
				return err
			}
			defer unix.Close(pfd)
			return unix.UtimesNanoAt(pfd, base, d.times[:], unix.AT_SYMLINK_NOFOLLOW)
		})
		if err != nil {
			return c.entryErr(d.rel, err)
		}
	}
	return nil
}

func cmpDot(p string) string {
	if p == "" {
		return "."
	}
	return p
}

// entryErr names the entry in err, keeping err's errno for errors.Is.
func (c *copier) entryErr(rel string, err error) error {
	if errors.Is(err, unix.ENAMETOOLONG) {
		return fmt.Errorf("%w: %s: %v", ErrBadEntry, quote(rel), err)
	}
	if errors.Is(err, unix.EXDEV) && strings.Contains(rel, "/") {
		// RESOLVE_NO_XDEV: a mount inside the tree.
		return fmt.Errorf("%w: %s is another filesystem mounted inside the tree", ErrBadEntry, quote(rel))
	}
	return fmt.Errorf("%s: %w", quote(rel), errnoOf(err))
}

// errnoOf is the errno in err, or err: a *PathError would name a host
// path.
func errnoOf(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return err
}

// quote quotes a name of the tree for a message: at most 128 bytes, valid
// UTF-8.
func quote(s string) string {
	const limit = 128
	if len(s) > limit {
		s = s[:limit] + "..."
	}
	return fmt.Sprintf("%q", strings.ToValidUTF8(s, "?"))
}
