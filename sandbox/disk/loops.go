package disk

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Named bounds of the loop-device scans.
const (
	// maxLoopDevices bounds the loop devices looked at.
	maxLoopDevices = 4096
	// maxProcs bounds the processes whose mounts ReleaseStale reads.
	maxProcs = 1 << 16
	// unmountTimeout bounds one unmount in another mount namespace.
	unmountTimeout = 10 * time.Second
)

// Host paths, replaced by tests.
var (
	sysBlock = "/sys/block"
	procDir  = "/proc"
)

// Loop is a loop device with an image attached.
type Loop struct {
	Name         string // "loop3"
	Major, Minor uint32
}

// Path is the device's node, /dev/loopN.
func (l Loop) Path() string { return "/dev/" + l.Name }

func loopPaths(ls []Loop) string {
	names := make([]string, len(ls))
	for i, l := range ls {
		names[i] = l.Path()
	}
	return strings.Join(names, ", ")
}

// Attached returns the loop devices the image at path is attached to,
// wherever it was attached from: each device's backing file is matched by
// device and inode (LOOP_GET_STATUS64), which no rename, bind mount or
// mount namespace changes.
func Attached(path string) ([]Loop, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("disk: open image %s: %w", path, err)
	}
	defer f.Close()
	return attachedFile(f)
}

func attachedFile(img *os.File) ([]Loop, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(img.Fd()), &st); err != nil {
		return nil, fmt.Errorf("disk: stat image %s: %w", img.Name(), err)
	}
	entries, err := os.ReadDir(sysBlock)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot list loop devices (%s): %v", ErrUnavailable, sysBlock, err)
	}
	var out []Loop
	seen := 0
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		if seen++; seen > maxLoopDevices {
			return nil, fmt.Errorf("%w: more than %d loop devices to check", ErrUnavailable, maxLoopDevices)
		}
		if _, err := os.Stat(filepath.Join(sysBlock, e.Name(), "loop")); err != nil {
			continue // nothing attached
		}
		l, dev, ino, err := loopStatus(e.Name())
		if err != nil {
			// Detached since the listing, or its node is missing: then
			// its backing file's path is what the kernel says.
			if backingPathIs(e.Name(), img.Name()) {
				out = append(out, l)
			}
			continue
		}
		if dev == st.Dev && ino == st.Ino {
			out = append(out, l)
		}
	}
	return out, nil
}

// loopStatus reads what loop device name is attached to.
func loopStatus(name string) (Loop, uint64, uint64, error) {
	l := Loop{Name: name}
	if b, err := os.ReadFile(filepath.Join(sysBlock, name, "dev")); err == nil {
		if maj, min, ok := strings.Cut(strings.TrimSpace(string(b)), ":"); ok {
			m1, _ := strconv.ParseUint(maj, 10, 32)
			m2, _ := strconv.ParseUint(min, 10, 32)
			l.Major, l.Minor = uint32(m1), uint32(m2)
		}
	}
	f, err := os.OpenFile(l.Path(), os.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return l, 0, 0, err
	}
	defer f.Close()
	info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
	if err != nil {
		return l, 0, 0, err
	}
	return l, info.Device, info.Inode, nil
}

func backingPathIs(name, path string) bool {
	b, err := os.ReadFile(filepath.Join(sysBlock, name, "loop", "backing_file"))
	if err != nil {
		return false
	}
	abs, err := filepath.Abs(path)
	return err == nil && strings.TrimSpace(string(b)) == abs
}

// holder is a mount of a loop device in some process's mount namespace.
type holder struct {
	pid        int
	ns         string // the namespace's identity, from /proc/PID/ns/mnt
	mountPoint string
}

// foreignHolders returns one mount of each loop device in ls per mount
// namespace other than this process's, read from /proc/*/mountinfo.
func foreignHolders(ls []Loop) ([]holder, error) {
	own, err := os.Readlink(filepath.Join(procDir, "self", "ns", "mnt"))
	if err != nil {
		return nil, fmt.Errorf("disk: read this process's mount namespace: %w", err)
	}
	want := map[string]bool{}
	for _, l := range ls {
		want[fmt.Sprintf("%d:%d", l.Major, l.Minor)] = true
	}
	entries, err := os.ReadDir(procDir)
	if err != nil {
		return nil, fmt.Errorf("disk: list processes: %w", err)
	}
	seenNS := map[string]bool{own: true}
	var out []holder
	for i, e := range entries {
		if i >= maxProcs {
			break
		}
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ns, err := os.Readlink(filepath.Join(procDir, e.Name(), "ns", "mnt"))
		if err != nil || seenNS[ns] {
			continue
		}
		seenNS[ns] = true
		f, err := os.Open(filepath.Join(procDir, e.Name(), "mountinfo"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 64<<10)
		for sc.Scan() {
			// ID PARENT MAJ:MIN ROOT MOUNTPOINT ...
			fields := strings.Fields(sc.Text())
			if len(fields) > 4 && want[fields[2]] {
				out = append(out, holder{pid: pid, ns: ns, mountPoint: unescapeMountinfo(fields[4])})
			}
		}
		f.Close()
	}
	return out, nil
}

// unheldWait bounds how long Mount waits for the kernel to free a loop
// device that no process mounts any more. A daemon killed with -9 takes its
// sandboxes' inits with it, and the kernel tears their mount namespaces
// down, and frees the disks' loop devices, a moment after the last of them
// exits: a restart that adopts a sandbox at once can see its image still
// attached with nobody holding it.
var unheldWait = 2 * time.Second

// awaitUnheld returns the loop devices of img still attached once no
// process's mount namespace mounts any of them and the kernel has had
// unheldWait to free them; with a live holder (a process that outlived a
// dead daemon), at once.
func awaitUnheld(img *os.File, ls []Loop) ([]Loop, error) {
	deadline := time.Now().Add(unheldWait)
	for len(ls) > 0 {
		hs, err := foreignHolders(ls)
		if err != nil || len(hs) > 0 || time.Now().After(deadline) {
			return ls, err
		}
		time.Sleep(20 * time.Millisecond)
		if ls, err = attachedFile(img); err != nil {
			return ls, err
		}
	}
	return ls, nil
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ReleaseStale detaches the image at path from the mount namespaces of
// other processes that still mount it: the namespace of a daemon killed
// with -9 outlives it while any of its processes lives. Each such mount is
// unmounted lazily inside that namespace (nsenter, umount -l), so the
// kernel frees the loop device once no file on it is open. It refuses an
// image mounted in this process's own namespace (a live daemon's), and
// returns the loop devices still attached afterwards.
func ReleaseStale(ctx context.Context, path, mountedOn string) ([]Loop, error) {
	if mounted, err := Mounted(mountedOn); err != nil || mounted {
		if err == nil {
			err = fmt.Errorf("disk: %s is mounted in this process's namespace, on %s; unmount it first", path, mountedOn)
		}
		return nil, err
	}
	ls, err := Attached(path)
	if err != nil || len(ls) == 0 {
		return ls, err
	}
	hs, err := foreignHolders(ls)
	if err != nil {
		return ls, err
	}
	var errs []error
	for _, h := range hs {
		uctx, cancel := context.WithTimeout(ctx, unmountTimeout)
		out, err := exec.CommandContext(uctx, "nsenter", "--mount="+filepath.Join(procDir, strconv.Itoa(h.pid), "ns", "mnt"),
			"--", "umount", "-l", h.mountPoint).CombinedOutput()
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("disk: unmount %s in the mount namespace of pid %d: %v: %s", h.mountPoint, h.pid, err, strings.TrimSpace(string(out))))
		}
	}
	// The kernel frees an unmounted, unopened loop device at once.
	deadline := time.Now().Add(2 * time.Second)
	for {
		ls, err = Attached(path)
		if err != nil || len(ls) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return ls, errors.Join(append(errs, err)...)
}

// Damage says what is wrong with the filesystem mounted on dir, or ""
// when nothing is: ext4 counts its errors (and, mounted errors=remount-ro,
// goes read-only at the first).
func Damage(dir string) string {
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		return fmt.Sprintf("its disk cannot be read (%v)", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err == nil {
		name := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
		if target, err := os.Readlink(filepath.Join("/sys/dev/block", name)); err == nil {
			b, err := os.ReadFile(filepath.Join("/sys/fs/ext4", filepath.Base(target), "errors_count"))
			if n, _ := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
				return fmt.Sprintf("its disk has %d filesystem errors (the kernel's log says which)", n)
			}
		}
	}
	if sfs.Flags&unix.ST_RDONLY != 0 {
		return "its disk went read-only (the kernel remounts it so after a filesystem error)"
	}
	return ""
}
