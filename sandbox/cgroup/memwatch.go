package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// MemoryWatch tells when a group's memory use reaches a level below its
// hard limit, so that its owner can free memory its own way before the
// kernel's OOM killer picks a process by itself. On v1 it is a threshold
// on memory.usage_in_bytes with an eventfd (cgroup.event_control), which
// fires at each crossing, up or down; on v2 the level is the group's
// memory.high (the kernel also reclaims and throttles the group's
// allocations above it) and the watch wakes at each change of
// memory.events. Both are pollable descriptors in the runtime's poller, so
// a watch holds no thread while it waits. A wake-up says only "look
// again": Usage says whether the group is over the level.
type MemoryWatch struct {
	f       *os.File // the eventfd (v1) or memory.events (v2)
	v2      bool
	usage   string // the control file of the group's memory use
	stat    string // the group's memory.stat
	control int    // v1: memory.usage_in_bytes held open while the threshold is registered
}

// WatchMemory registers level with the group's memory controller. The
// group must have a hard memory limit above level. Close the watch when
// done; removing the group ends it too.
func (c *Cgroup) WatchMemory(level int64) (*MemoryWatch, error) {
	if level <= 0 {
		return nil, fmt.Errorf("a memory watch needs a level above 0, not %d", level)
	}
	if c.version == V2 {
		if err := writeFile(filepath.Join(c.dir, "memory.high"), strconv.FormatInt(level, 10)); err != nil {
			return nil, fmt.Errorf("%w: cannot set memory.high of %s: %v", ErrUnavailable, c.dir, err)
		}
		p := filepath.Join(c.dir, "memory.events")
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: p, Err: err}
		}
		return &MemoryWatch{f: os.NewFile(uintptr(fd), p), v2: true, usage: filepath.Join(c.dir, "memory.current"), stat: filepath.Join(c.dir, "memory.stat"), control: -1}, nil
	}
	mem := c.dirs["memory"]
	usage := filepath.Join(mem, "memory.usage_in_bytes")
	ufd, err := openControl(usage)
	if err != nil {
		return nil, err
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = unix.Close(ufd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	reg := fmt.Sprintf("%d %d %d", efd, ufd, level)
	if err := writeFile(filepath.Join(mem, "cgroup.event_control"), reg); err != nil {
		_ = unix.Close(efd)
		_ = unix.Close(ufd)
		return nil, fmt.Errorf("%w: cannot register a memory threshold with %s: %v", ErrUnavailable, mem, err)
	}
	return &MemoryWatch{f: os.NewFile(uintptr(efd), "memory-threshold"), usage: usage, stat: filepath.Join(mem, "memory.stat"), control: ufd}, nil
}

// Wait returns nil when the watch fires, or ctx's error once ctx ends.
// Look at Usage then: a wake-up may be a crossing down, or a change of
// memory.events that is not the level's.
func (w *MemoryWatch) Wait(ctx context.Context) error {
	if err := w.f.SetReadDeadline(time.Time{}); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = w.f.SetReadDeadline(time.Now()) })
	defer stop()
	if !w.v2 {
		var b [8]byte
		_, err := w.f.Read(b[:])
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	// memory.events always reads: wait for the poller's readiness, which
	// kernfs raises (POLLPRI, POLLERR) at each change of the file.
	rc, err := w.f.SyscallConn()
	if err != nil {
		return err
	}
	first := true
	err = rc.Read(func(uintptr) bool {
		if first {
			first = false
			return false
		}
		return true
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// Usage is the group's memory use now, in bytes: what the watch's level
// is compared with, the page cache of the group's files included.
func (w *MemoryWatch) Usage() (int64, error) { return readInt(w.usage) }

// Held is the part of the group's memory use that the kernel cannot
// reclaim without swap: anonymous memory and shared memory (tmpfs,
// memfds), not the page cache of files, which the kernel drops or writes
// back at the hard limit. A group that writes files sits at its level on
// cache alone; only what it holds says it needs memory freed.
func (w *MemoryWatch) Held() (int64, error) {
	b, err := readBounded(w.stat)
	if err != nil {
		return 0, err
	}
	return heldOf(parseKeyed(b), w.v2)
}

// heldOf is Held's sum over memory.stat's keys: v2's anon and shmem;
// v1's hierarchical total_rss (anonymous and swap cache, no shmem) and
// total_shmem.
func heldOf(stat map[string]uint64, v2 bool) (int64, error) {
	keys := []string{"total_rss", "total_shmem"}
	if v2 {
		keys = []string{"anon", "shmem"}
	}
	var n uint64
	for _, k := range keys {
		v, ok := stat[k]
		if !ok {
			return 0, fmt.Errorf("memory.stat has no %s", k)
		}
		n += v
	}
	return int64(min(n, uint64(1<<62))), nil
}

// Close ends the watch (v1: the kernel drops the threshold with the
// eventfd). It leaves memory.high as it is on v2.
func (w *MemoryWatch) Close() error {
	err := w.f.Close()
	if w.control >= 0 {
		err = errors.Join(err, unix.Close(w.control))
	}
	return err
}

// SetMemoryMax sets the group's hard memory limit (v2 memory.max; v1
// memory.limit_in_bytes and, where swap is accounted, the memory+swap
// limit with it, which must never be below it).
func (c *Cgroup) SetMemoryMax(n int64) error {
	if n <= 0 {
		return fmt.Errorf("a memory limit must be above 0, not %d", n)
	}
	v := strconv.FormatInt(n, 10)
	if c.version == V2 {
		return writeFile(filepath.Join(c.dir, "memory.max"), v)
	}
	mem := filepath.Join(c.dirs["memory"], "memory.limit_in_bytes")
	memsw := filepath.Join(c.dirs["memory"], "memory.memsw.limit_in_bytes")
	cur, err := readInt(mem)
	if err != nil {
		return err
	}
	order := []string{mem, memsw}
	if n > cur {
		order = []string{memsw, mem}
	}
	for _, p := range order {
		if err := writeFile(p, v); err != nil && !(p == memsw && errors.Is(err, os.ErrNotExist)) {
			return fmt.Errorf("cannot set %s to %s: %w", p, v, err)
		}
	}
	return nil
}
