package gvinit

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
)

// A sandbox at its memory limit (gvwire's reclaim): init kills the guest's
// largest process, as the kernel's OOM killer would, and counts the kill
// where the keepers of durable processes look for OOM kills (the counter
// bwrap's keepers get from the sandbox's cgroup), so that a durable
// process it took is reported oom_killed.

// oomCounter is init's count of the kills it made for memory: a memfd
// holding "oom_kill N", the form of a cgroup's memory.oom_control line,
// which each keeper gets a descriptor of (agent.Files.OOM).
type oomCounter struct {
	mu sync.Mutex
	fd int // -1 when none could be made: keepers then get none
	n  uint64
}

func newOOMCounter() *oomCounter {
	c := &oomCounter{fd: -1}
	if fd, err := memfdWith("sandbox-oom-kills", c.text()); err == nil {
		c.fd = fd
	}
	return c
}

// text is the counter's contents, of a fixed width so that a rewrite
// leaves nothing of the last one.
func (c *oomCounter) text() []byte { return fmt.Appendf(nil, "oom_kill %20d\n", c.n) }

// add counts one kill.
func (c *oomCounter) add() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if c.fd >= 0 {
		_, _ = unix.Pwrite(c.fd, c.text(), 0)
	}
}

// dup is a descriptor of the counter for a keeper, -1 without one.
func (c *oomCounter) dup() int {
	if c.fd < 0 {
		return -1
	}
	fd, err := unix.FcntlInt(uintptr(c.fd), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return -1
	}
	return fd
}

// reclaim answers a reclaim frame: it kills the guest's process with the
// largest resident set (the sentry's own accounting of it, /proc/PID/statm)
// and says which, or ESRCH when the guest runs none.
func (st *initState) reclaim(p []byte) {
	if len(p) != 4 {
		return
	}
	a := gvwire.ProcAnswer{Seq: binary.LittleEndian.Uint32(p)}
	pid, rss, name := largestGuestProcess()
	switch {
	case pid == 0:
		a.Errno = uint32(unix.ESRCH)
	default:
		if err := unix.Kill(pid, unix.SIGKILL); err != nil {
			a.Errno = errnoOf(err)
			break
		}
		st.oom.add()
		a.Value = uint32(pid)
		a.Body = []byte(truncate(fmt.Sprintf("%s, %d MiB resident", name, rss>>20), gvwire.MaxReclaimBody-8))
	}
	st.answer(a)
}

// largestGuestProcess finds the process of the guest uid with the largest
// resident set: its pid, its size in bytes and its name; pid 0 when none
// runs. Init, the keepers and the opener run as root and are never
// chosen.
func largestGuestProcess() (pid int, rss int64, name string) {
	d, err := os.Open("/proc")
	if err != nil {
		return 0, 0, ""
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	page := int64(os.Getpagesize())
	for _, n := range names {
		p, err := strconv.Atoi(n)
		if err != nil || p <= 1 {
			continue
		}
		var fi unix.Stat_t
		if unix.Stat("/proc/"+n, &fi) != nil || fi.Uid != guestUID {
			continue
		}
		b, err := os.ReadFile("/proc/" + n + "/statm")
		if err != nil {
			continue
		}
		f := bytes.Fields(b)
		if len(f) < 2 {
			continue
		}
		pages, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err != nil || pages*page <= rss {
			continue
		}
		comm, _ := os.ReadFile("/proc/" + n + "/comm")
		pid, rss, name = p, pages*page, string(bytes.TrimSpace(comm))
	}
	return pid, rss, name
}
