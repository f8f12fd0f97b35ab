package agent

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/proclog"
)

// Table is init's record of its keepers: which process each runs, and the
// end of its socket init polls. Init calls its methods from its one loop;
// it is not safe for concurrent use.
type Table struct {
	byPid map[int]*entry
	spare map[int]bool // the agent's other processes (the code zygote), spared like keepers
	// Exe is the executable a keeper is started from (init's own,
	// "/proc/self/exe").
	Exe string
	// Stderr is the descriptor keepers write their diagnostics to.
	Stderr int
	// MaxRunning bounds the keepers at once (0: 64): the daemon bounds
	// what it asks, this bounds what init accepts.
	MaxRunning int
	// Failpoint, for tests only, is KeeperFailpointEnv's value for every
	// keeper ("": none).
	Failpoint string
}

// entry is one keeper.
type entry struct {
	id    string
	pid   int // the keeper's
	sock  int
	exit  *os.File // a copy of the exit file, to write a lost record
	proc  int      // the process's pid, once started (0 before)
	ended bool     // the keeper said the process ended
	// started is called once, when the keeper says the process started
	// (pid > 0) or could not (pid 0: it ended at once, its record says
	// how).
	started func(pid int)
}

// Files are the descriptors a start hands its keeper; Start takes
// ownership of every one, on success and failure alike.
type Files struct {
	Stdin, Stdout, Stderr, Exit, Request int
	// OOM is the sandbox's OOM-kill counter, or -1.
	OOM int
}

// Close closes every descriptor of f.
func (f Files) Close() {
	for _, fd := range []int{f.Stdin, f.Stdout, f.Stderr, f.Exit, f.Request, f.OOM} {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}

// ErrTooMany: the table holds MaxRunning keepers.
var ErrTooMany = errors.New("too many processes running in this sandbox")

// ErrGivenUp: the process's exit record is written already (a daemon
// gave its start up); it is not started.
var ErrGivenUp = errors.New("the process's start was given up: it has an end already")

// ErrUnknown: no running process of that id.
var ErrUnknown = errors.New("no such running process")

// Start starts a keeper for process id with files; started is called
// from Handle once it says the process started (or ended at once).
func (t *Table) Start(id string, files Files, started func(pid int)) error {
	defer files.Close()
	if t.byPid == nil {
		t.byPid = map[int]*entry{}
	}
	limit := t.MaxRunning
	if limit <= 0 {
		limit = 64
	}
	if len(t.byPid) >= limit {
		return ErrTooMany
	}
	if t.find(id) != nil {
		return fmt.Errorf("process %s runs already", id)
	}
	if n, _ := unix.Pread(files.Exit, make([]byte, 1), 0); n > 0 {
		// Its start arrives after a daemon gave it up (procstore's
		// Unstarted): it must not run under an end already said.
		return ErrGivenUp
	}
	exitCopy, err := unix.FcntlInt(uintptr(files.Exit), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return err
	}
	socks, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		_ = unix.Close(exitCopy)
		return err
	}
	defer unix.Close(socks[1])
	env := []string{KeeperEnv + "=1", "GOMAXPROCS=1"}
	if t.Failpoint != "" {
		env = append(env, KeeperFailpointEnv+"="+t.Failpoint)
	}
	oom := files.OOM
	if oom >= 0 {
		env = append(env, KeeperOOMEnv+"=1")
	} else {
		oom = files.Stdin // a placeholder for fd 8, which the keeper does not read
	}
	stderr := uintptr(t.Stderr)
	if t.Stderr < 0 {
		stderr = uintptr(files.Stdin)
	}
	exe := t.Exe
	if exe == "" {
		exe = "/proc/self/exe"
	}
	pid, err := syscall.ForkExec(exe, []string{KeeperName}, &syscall.ProcAttr{
		Dir: "/",
		Env: env,
		Files: []uintptr{uintptr(files.Stdin), stderr, stderr, uintptr(socks[1]),
			uintptr(files.Stdout), uintptr(files.Stderr), uintptr(files.Exit), uintptr(files.Request), uintptr(oom)},
		Sys: &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		_ = unix.Close(socks[0])
		_ = unix.Close(exitCopy)
		return fmt.Errorf("start its keeper: %w", err)
	}
	t.byPid[pid] = &entry{id: id, pid: pid, sock: socks[0], exit: os.NewFile(uintptr(exitCopy), "exit"), started: started}
	return nil
}

func (t *Table) find(id string) *entry {
	for _, e := range t.byPid {
		if e.id == id {
			return e
		}
	}
	return nil
}

// Spare marks pid (on) as a process of the agent's that a command's
// clean-up spares with everything under it, as it spares keepers: the code
// contexts' zygote. Off forgets it.
func (t *Table) Spare(pid int, on bool) {
	if t.spare == nil {
		t.spare = map[int]bool{}
	}
	if on {
		t.spare[pid] = true
	} else {
		delete(t.spare, pid)
	}
}

// Busy reports whether a command's clean-up must spare processes: keepers
// run, or another process of the agent's does.
func (t *Table) Busy() bool { return len(t.byPid) > 0 || len(t.spare) > 0 }

// IsKeeperOf reports whether process id's keeper runs.
func (t *Table) IsKeeperOf(id string) bool { return t.find(id) != nil }

// Len is how many keepers run.
func (t *Table) Len() int { return len(t.byPid) }

// IsKeeper reports whether pid is one of the table's keepers.
func (t *Table) IsKeeper(pid int) bool { _, ok := t.byPid[pid]; return ok }

// PollFDs appends the keepers' sockets to fds, for init's poll.
func (t *Table) PollFDs(fds []unix.PollFd) []unix.PollFd {
	for _, e := range t.byPid {
		if e.sock >= 0 {
			fds = append(fds, unix.PollFd{Fd: int32(e.sock), Events: unix.POLLIN})
		}
	}
	return fds
}

// Handle reads what the keeper whose socket is fd said; false when fd is
// no keeper's.
func (t *Table) Handle(fd int) bool {
	for _, e := range t.byPid {
		if e.sock != fd {
			continue
		}
		var b [keeperMsgSize + 1]byte
		n, _, err := unix.Recvfrom(fd, b[:], unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			return true
		}
		if err != nil || n == 0 {
			_ = unix.Close(e.sock) // it is going: Reaped says the rest
			e.sock = -1
			return true
		}
		m, ok := decodeKeeperMsg(b[:n])
		switch {
		case !ok:
		case m.kind == msgStarted:
			e.proc = int(m.a)
			if e.started != nil {
				e.started(int(m.a))
				e.started = nil
			}
		case m.kind == msgEnded:
			e.ended = true
		}
		return true
	}
	return false
}

// Signal asks the keeper of process id to send sig to its group.
func (t *Table) Signal(id string, sig unix.Signal) error {
	e := t.find(id)
	if e == nil || e.ended || e.sock < 0 {
		return ErrUnknown
	}
	return unix.Sendmsg(e.sock, keeperMsg{kind: msgSignal, a: uint32(sig)}.encode(), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
}

// Running lists the ids of the processes whose keepers run.
func (t *Table) Running() []string {
	out := make([]string, 0, len(t.byPid))
	for _, e := range t.byPid {
		if !e.ended {
			out = append(out, e.id)
		}
	}
	return out
}

// Reaped tells the table that init reaped pid; false when it was no
// keeper. A keeper that died before its exit record was written (killed
// by the guest, which shares its uid on bwrap) leaves its process
// without one: init writes a "lost" record in its place, and the process,
// now init's child, is ended with the next command's clean-up.
func (t *Table) Reaped(pid int) bool {
	e, ok := t.byPid[pid]
	if !ok {
		return false
	}
	delete(t.byPid, pid)
	if e.started != nil {
		e.started(0)
	}
	if _, err := proclog.ReadExit(e.exit); errors.Is(err, proclog.ErrNoExit) {
		if e.proc > 0 {
			_ = unix.Kill(-e.proc, unix.SIGKILL)
		}
		_ = proclog.WriteExit(e.exit, proclog.Exit{How: proclog.EndLost})
	}
	_ = e.exit.Close()
	if e.sock >= 0 {
		_ = unix.Close(e.sock)
	}
	return true
}

// KillForeground ends every process of init's namespace that is not
// init, a keeper or a keeper's descendant: a command's leftovers, when
// keepers run (without keepers, init's kill(-1) does it in one call). It
// kills every live direct child of init but the keepers (and their process
// groups), whose own children are then re-parented to init, and repeats
// until init has no other live child. A keeper's descendants are never
// init's children: the keeper is their subreaper. It reaps nothing: init's
// own reaping takes the zombies (its command's status among them).
func (t *Table) KillForeground(initPid int) {
	for range maxKillPasses {
		var others []int
		for _, c := range liveChildrenOf(initPid) {
			if !t.IsKeeper(c) && !t.spare[c] {
				others = append(others, c)
			}
		}
		if len(others) == 0 {
			return
		}
		for _, pid := range others {
			_ = unix.Kill(-pid, unix.SIGKILL)
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		awaitDeath(others)
	}
}
