// Package disk caps a sandbox's storage with a filesystem of its own: a
// sparse image file formatted ext4 and loop-mounted (nosuid, nodev) on the
// directory that becomes the guest's /workspace. A guest that fills it gets
// ENOSPC inside; the host's filesystem holds at most the image's size, and
// the image's inode count caps the number of files.
//
// The mount lives in the mount namespace of the process that mounts it. The
// daemon runs in a private one (PrivateMounts=yes, or its own re-exec), so
// the host never sees sandbox disks and they go when the daemon and every
// process of its namespace are gone; a restarted daemon mounts them again.
// Until every process of a dead daemon's namespace has exited, though, that
// namespace keeps its mounts, and so the images stay attached to their loop
// devices. Mounting such an image a second time, through a second loop
// device, would let two filesystems write one image and corrupt it: Mount
// refuses an image that is attached anywhere (ErrAttached), matching every
// loop device's backing file by device and inode, and ReleaseStale detaches
// a dead daemon's mounts of one.
//
// It needs root (loop devices and mount), mkfs.ext4 (e2fsprogs) and the
// loop driver. It owns only the images and mounts it is given; it never
// touches a loop device whose backing file is not one of them (each is
// attached with LO_FLAGS_AUTOCLEAR, so the kernel frees it when the
// filesystem is unmounted, even after the daemon died).
package disk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Named bounds.
const (
	// mkfsTimeout bounds formatting one image.
	mkfsTimeout = 30 * time.Second
	// attachTries bounds retries when another process takes the free loop
	// device between LOOP_CTL_GET_FREE and LOOP_CONFIGURE.
	attachTries = 8
	// MinSize is the smallest image accepted: ext4 needs room for its own
	// metadata.
	MinSize = 8 << 20
	// mkfsOutputBytes caps what is kept of mkfs's messages.
	mkfsOutputBytes = 4 << 10
)

// ErrUnavailable: this host cannot make capped filesystems (not root, no
// loop driver, no mkfs.ext4).
var ErrUnavailable = errors.New("disk caps unavailable")

// ErrAttached: the image is attached to a loop device already, by a mount
// this process cannot see (a dead daemon's namespace, kept alive by a
// process that outlived it). Mounting it again would corrupt it.
var ErrAttached = errors.New("disk image already attached to a loop device")

// loopName is the lo_file_name of every loop device Mount attaches, so an
// operator's losetup -l tells them apart; matching is by backing file.
const loopName = "sandbox-disk"

// Options for a new image.
type Options struct {
	// Size is the filesystem's size in bytes, at least MinSize.
	Size int64
	// Inodes caps the number of files and directories; 0 lets mkfs choose
	// (one per 16 KiB).
	Inodes int64
	// UID and GID own the filesystem's root directory (the guest's
	// workspace); -1 keeps root.
	UID, GID int
	// Preallocate reserves the whole size on the host now (fallocate), so
	// the host can never run out of room under a guest that has not filled
	// its cap yet. Without it the image is sparse: cheap, but the sum of all
	// caps may exceed what the host has.
	Preallocate bool
	// MkfsPath is mkfs.ext4; empty means looking it up on PATH and in
	// /usr/sbin and /sbin.
	MkfsPath string
	// Formatting, when set, is called with mkfs's pid while it runs (a
	// failpoint for the crash tests).
	Formatting func(pid int)
}

// Check reports whether this host can make capped filesystems.
func Check() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: loop-mounting needs root", ErrUnavailable)
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return fmt.Errorf("%w: no loop driver (/dev/loop-control: %v); modprobe loop", ErrUnavailable, err)
	}
	if _, err := findMkfs(""); err != nil {
		return err
	}
	return nil
}

func findMkfs(configured string) (string, error) {
	if configured != "" {
		return configured, nil
	}
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: mkfs.ext4 not found; apt-get install e2fsprogs", ErrUnavailable)
}

// Create makes the image file at path (which must not exist) and formats
// it. A failure removes the file.
func Create(ctx context.Context, path string, o Options) (err error) {
	if o.Size < MinSize {
		return fmt.Errorf("disk: size %d is below the %d-byte minimum", o.Size, MinSize)
	}
	if o.Inodes < 0 {
		return fmt.Errorf("disk: inodes %d is negative", o.Inodes)
	}
	mkfs, err := findMkfs(o.MkfsPath)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("disk: create image %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	if o.Preallocate {
		err = unix.Fallocate(int(f.Fd()), 0, 0, o.Size)
	} else {
		err = f.Truncate(o.Size)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("disk: size image %s to %d bytes: %w; is the host's disk full?", path, o.Size, err)
	}

	// No journal: a sandbox's files are scratch, and a journal would cost
	// a few MiB of every cap. No reserved blocks: the guest gets all of it.
	// A sparse image is discarded (on a regular file mkfs punches it,
	// which reads back as zeros, so it marks the inode tables zeroed
	// instead of writing them: the image stays sparse, and the kernel has
	// no tables to zero after the mount). A preallocated one must keep its
	// blocks, so its tables are written now, never lazily under a guest.
	ext := []string{"discard"}
	if o.Preallocate {
		ext = []string{"nodiscard", "lazy_itable_init=0", "lazy_journal_init=0"}
	}
	if o.UID >= 0 && o.GID >= 0 {
		ext = append(ext, fmt.Sprintf("root_owner=%d:%d", o.UID, o.GID))
	}
	args := []string{"-q", "-F", "-m", "0", "-O", "^has_journal", "-E", strings.Join(ext, ",")}
	if o.Inodes > 0 {
		args = append(args, "-N", strconv.FormatInt(o.Inodes, 10))
	}
	args = append(args, path)
	ctx, cancel := context.WithTimeout(ctx, mkfsTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, mkfs, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C"}
	// mkfs dies with the daemon: alive, it would keep a dead daemon's
	// mount namespace, and with it every sandbox disk, attached. (The
	// signal follows the forking thread; Go threads outlive goroutines
	// unless locked, which this one is not.)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out limitedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("disk: %s: %w", mkfs, err)
	}
	if o.Formatting != nil {
		o.Formatting(cmd.Process.Pid)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("disk: %s %s failed: %v: %s", mkfs, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// Mount attaches the image at path to a free loop device and mounts it on
// dir (which must exist) with nosuid and nodev. The loop device frees itself
// when the filesystem is unmounted.
func Mount(path, dir string) error {
	img, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("disk: open image %s: %w", path, err)
	}
	defer img.Close()
	held, err := attachedFile(img)
	if err != nil {
		return err
	}
	if len(held) > 0 {
		held, err = awaitUnheld(img, held)
		if err != nil {
			return err
		}
	}
	if len(held) > 0 {
		return fmt.Errorf("%w: %s is attached to %s, by a mount outside this process's mount namespace; it is not mounted again until that is gone", ErrAttached, path, loopPaths(held))
	}
	loop, dev, err := attach(img)
	if err != nil {
		return err
	}
	// Once mounted, the mount holds the device; closing our descriptor
	// lets AUTOCLEAR free it at unmount. If the mount fails, this close
	// frees it at once.
	defer loop.Close()
	if err := unix.Mount(dev, dir, "ext4", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOATIME, "errors=remount-ro"); err != nil {
		return fmt.Errorf("disk: mount %s (%s) on %s: %w", path, dev, dir, err)
	}
	return nil
}

// attach binds img to a free loop device with LOOP_CONFIGURE.
func attach(img *os.File) (*os.File, string, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", fmt.Errorf("%w: /dev/loop-control: %v", ErrUnavailable, err)
	}
	defer ctl.Close()
	var lastErr error
	for range attachTries {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, "", fmt.Errorf("%w: no free loop device: %v", ErrUnavailable, err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		loop, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, "", fmt.Errorf("%w: open %s: %v", ErrUnavailable, dev, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:], loopName)
		err = unix.IoctlLoopConfigure(int(loop.Fd()), &cfg)
		if err == nil {
			return loop, dev, nil
		}
		loop.Close()
		lastErr = err
		if !errors.Is(err, unix.EBUSY) {
			break
		}
	}
	return nil, "", fmt.Errorf("%w: attach a loop device: %v", ErrUnavailable, lastErr)
}

// Unmount unmounts dir. A directory with nothing mounted is success. When
// the filesystem is busy (a process still has a file open), it is detached
// lazily: it disappears from dir at once, and the kernel frees it (and its
// loop device) when the last file is closed.
func Unmount(dir string) error {
	mounted, err := Mounted(dir)
	if err != nil || !mounted {
		return err
	}
	err = unix.Unmount(dir, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(dir, unix.MNT_DETACH)
	}
	if err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("disk: unmount %s: %w", dir, err)
	}
	return nil
}

// Mounted reports whether a filesystem is mounted exactly on dir (in this
// process's mount namespace). A dir that does not exist is not mounted.
func Mounted(dir string) (bool, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false, err
	}
	real, err := filepath.EvalSymlinks(abs)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return mountinfo.Mounted(real)
}

// Usage is what a mounted cap holds.
type Usage struct {
	UsedBytes, TotalBytes   int64
	UsedInodes, TotalInodes int64
}

// UsageOf reads the usage of the filesystem mounted on dir.
func UsageOf(dir string) (Usage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return Usage{}, fmt.Errorf("disk: statfs %s: %w", dir, err)
	}
	bs := int64(st.Bsize)
	return Usage{
		UsedBytes:   int64(st.Blocks-st.Bfree) * bs,
		TotalBytes:  int64(st.Blocks) * bs,
		UsedInodes:  int64(st.Files - st.Ffree),
		TotalInodes: int64(st.Files),
	}, nil
}

// limitedBuffer keeps the first mkfsOutputBytes written to it.
type limitedBuffer struct{ b bytes.Buffer }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := mkfsOutputBytes - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string { return l.b.String() }

// MountAttached mounts at dir the loop device the image at path is already
// attached to, by a mount another mount namespace still holds (a live
// sandbox a daemon that died left): the kernel gives that device's mounted
// filesystem a second mount, never a second filesystem on the same image.
// It refuses an image attached to none or to more than one device.
func MountAttached(path, dir string) error {
	held, err := Attached(path)
	if err != nil {
		return err
	}
	if len(held) != 1 {
		return fmt.Errorf("disk: %s is attached to %d loop devices (%s), not one", path, len(held), loopPaths(held))
	}
	if err := unix.Mount(held[0].Path(), dir, "ext4", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOATIME, "errors=remount-ro"); err != nil {
		return fmt.Errorf("disk: mount %s (%s, attached) on %s: %w", path, held[0].Path(), dir, err)
	}
	return nil
}
