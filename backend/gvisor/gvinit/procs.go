package gvinit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
)

// Durable processes (backend/agent): each runs under a keeper, a child of
// init started from init's executable, which runs as root as init does,
// spawns the process as the guest, copies its output into the logs the
// daemon made and writes its exit record. The logs are host files of the
// sandbox's procs/ directory, bound at gvwire.GuestProcs (root's alone):
// init opens them there and hands them to the keeper, since no descriptor
// of the host can reach the sentry once it runs. Init keeps the keepers in
// an agent.Table, polls their sockets in a goroutine of its own while any
// runs (the agent loop), and spares them and everything under them when it
// cleans up after a command (killForeground): a keeper is its process's
// subreaper, so nothing of a durable process is ever init's child.

// keeperPollMillis bounds the agent loop's wait: it also reaps then, should a
// SIGCHLD have been taken by a wait that did not reap (none does).
const keeperPollMillis = 1000

// reaper reaps init's children whenever one ends, for as long as init
// runs: keepers (agent.Table.Reaped), the command (its wait, which may
// take the SIGCHLD itself), and leftovers.
func (st *initState) reaper() {
	for range st.chld {
		st.reap()
	}
}

// reap reaps every child that has ended and reports whether init has none
// left at all.
func (st *initState) reap() (none bool) {
	st.pmu.Lock()
	defer st.pmu.Unlock()
	return st.reapLocked()
}

func (st *initState) reapLocked() (none bool) {
	reaped := false
	defer func() {
		if reaped {
			// Whoever waits for children to go (endForeground) looks again.
			close(st.reaped)
			st.reaped = make(chan struct{})
		}
	}()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG|unix.WALL, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil: // ECHILD
			return true
		case pid == 0:
			return false
		}
		reaped = true
		if st.procs.Reaped(pid) || st.code.Reaped(pid) {
			continue
		}
		if fg := st.fg; fg != nil && fg.pid == pid {
			fg.status = ws
			st.fg = nil
			close(fg.done)
		}
	}
}

// killForeground sends SIGKILL to every process of the sandbox but init,
// the keepers and their processes, and the contexts' zygote and what it
// forked: a command's, its leftovers, the opener. Without keepers or a
// zygote that is one kill(-1); with them, every direct child of init but
// those, pass after pass (agent.Table).
func (st *initState) killForeground() {
	st.pmu.Lock()
	defer st.pmu.Unlock()
	st.killForegroundLocked()
}

func (st *initState) killForegroundLocked() {
	if !st.procs.Busy() {
		_ = unix.Kill(-1, unix.SIGKILL)
		return
	}
	st.procs.KillForeground(os.Getpid())
}

// endForeground kills what a command left and waits until it is gone:
// without keepers (or the zygote), until init has no child left; with
// them, KillForeground waits for each killed process to die.
func (st *initState) endForeground() {
	st.killForeground()
	for {
		st.pmu.Lock()
		none := st.reapLocked()
		keepers := st.procs.Busy()
		if !none && keepers {
			// A process started meanwhile, or it ran all along: what
			// is left but the keepers is killed and waited for.
			st.killForegroundLocked()
			st.reapLocked()
		}
		reaped := st.reaped
		st.pmu.Unlock()
		if none || keepers {
			return
		}
		// The next SIGCHLD, or the reaper having taken it and reaped.
		select {
		case <-st.chld:
		case <-reaped:
		case <-time.After(time.Second):
		}
	}
}

// answer sends the daemon a proc answer.
func (st *initState) answer(a gvwire.ProcAnswer) {
	_ = st.send(gvwire.KindProcAnswer, a.Encode())
}

// errnoOf is err's errno, EINVAL when it has none.
func errnoOf(err error) uint32 {
	if errno, ok := errors.AsType[unix.Errno](err); ok {
		return uint32(errno)
	}
	return uint32(unix.EINVAL)
}

// procStart starts the durable process a proc start frame asks for, and
// answers once its keeper says it started (or could not start it).
func (st *initState) procStart(p []byte) {
	ps, err := gvwire.DecodeProcStart(p)
	if err != nil {
		st.answer(gvwire.ProcAnswer{Seq: ps.Seq, Errno: uint32(unix.EINVAL)})
		return
	}
	failed := func(what string, err error) {
		fmt.Fprintf(os.Stderr, "sandbox init: a process's start: %s: %v\n", what, err)
		st.answer(gvwire.ProcAnswer{Seq: ps.Seq, Errno: errnoOf(err)})
	}
	req, err := agent.DecodeRequest(ps.Request)
	switch {
	case err != nil:
		failed("its request", unix.EINVAL)
		return
	case req.UID == 0:
		// The daemon always asks for the guest: a process never runs as
		// init's root.
		failed("its request", unix.EPERM)
		return
	}
	files, err := procFiles(req.ID, ps.Request, ps.Stdin)
	if err != nil {
		failed("its files", err)
		return
	}
	files.OOM = st.oom.dup()
	seq := ps.Seq
	st.pmu.Lock()
	err = st.procs.Start(req.ID, files, func(pid int) {
		// Called under pmu (a keeper's message, or its reap): the answer
		// goes from a goroutine of its own, so a daemon slow to read
		// never holds up the reaping.
		go st.answer(gvwire.ProcAnswer{Seq: seq, Value: uint32(pid)})
	})
	if err == nil {
		st.startAgentLoopLocked()
	}
	st.pmu.Unlock()
	if err != nil {
		if errors.Is(err, agent.ErrTooMany) {
			err = unix.EAGAIN
		}
		failed("process "+req.ID, err)
		return
	}
	st.wakeAgentLoop()
}

// procFiles opens what a keeper gets for process id: its logs and exit
// file, which the daemon made in the procs directory, its request and its
// stdin (a memfd each; stdin /dev/null when empty).
func procFiles(id string, request, stdin []byte) (agent.Files, error) {
	f := agent.Files{Stdin: -1, Stdout: -1, Stderr: -1, Exit: -1, Request: -1, OOM: -1}
	dir := gvwire.GuestProcs + "/" + id + "/"
	var err error
	for _, x := range []struct {
		name string
		fd   *int
	}{{"stdout", &f.Stdout}, {"stderr", &f.Stderr}, {"exit", &f.Exit}} {
		if *x.fd, err = unix.Open(dir+x.name, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
			*x.fd = -1
			f.Close()
			return agent.Files{}, err
		}
	}
	if f.Request, err = memfdWith("sandbox-proc-request", request); err != nil {
		f.Request = -1
		f.Close()
		return agent.Files{}, err
	}
	if len(stdin) == 0 {
		f.Stdin, err = unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	} else {
		f.Stdin, err = memfdWith("sandbox-proc-stdin", stdin)
	}
	if err != nil {
		f.Stdin = -1
		f.Close()
		return agent.Files{}, err
	}
	return f, nil
}

// memfdWith is a memfd holding data, its offset at 0.
func memfdWith(name string, data []byte) (int, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return -1, err
	}
	for off := 0; off < len(data); {
		n, err := unix.Pwrite(fd, data[off:], int64(off))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			_ = unix.Close(fd)
			return -1, err
		}
		off += n
	}
	return fd, nil
}

// procRequest answers a proc signal or a proc list.
func (st *initState) procRequest(kind byte, p []byte) {
	if kind == gvwire.KindProcList {
		if len(p) != 4 {
			return
		}
		a := gvwire.ProcAnswer{Seq: binary.LittleEndian.Uint32(p)}
		st.pmu.Lock()
		a.Body = []byte(strings.Join(st.procs.Running(), "\n"))
		st.pmu.Unlock()
		st.answer(a)
		return
	}
	s, err := gvwire.DecodeProcSignal(p)
	if err != nil {
		st.answer(gvwire.ProcAnswer{Seq: s.Seq, Errno: uint32(unix.EINVAL)})
		return
	}
	st.pmu.Lock()
	err = st.procs.Signal(s.ID, unix.Signal(s.Signal))
	st.pmu.Unlock()
	a := gvwire.ProcAnswer{Seq: s.Seq}
	if err != nil {
		a.Errno = uint32(unix.ESRCH)
	}
	st.answer(a)
}

// startAgentLoopLocked starts the agent loop if it does not run (under
// pmu).
func (st *initState) startAgentLoopLocked() {
	if !st.agentLoop {
		st.agentLoop = true
		go st.runAgentLoop()
	}
}

// wakeAgentLoop has the agent loop poll again, with what was added.
func (st *initState) wakeAgentLoop() { _, _ = unix.Write(st.wake[1], []byte{0}) }

// runAgentLoop reads what the keepers say (their process started, or
// ended) and serves the code contexts (their zygote's and their sockets,
// their cells' budgets), for as long as a keeper or the zygote runs: their
// descriptors and the wake-up pipe in one poll, and a reap after each.
func (st *initState) runAgentLoop() {
	var drain [64]byte
	for {
		st.pmu.Lock()
		if st.procs.Len() == 0 && st.code.Zygote() == 0 {
			st.agentLoop = false
			st.pmu.Unlock()
			return
		}
		fds := st.procs.PollFDs([]unix.PollFd{{Fd: int32(st.wake[0]), Events: unix.POLLIN}})
		fds = st.code.PollFDs(fds)
		st.pmu.Unlock()
		if _, err := unix.Poll(fds, keeperPollMillis); err != nil && !errors.Is(err, unix.EINTR) {
			time.Sleep(10 * time.Millisecond)
		}
		if fds[0].Revents != 0 {
			_, _ = unix.Read(st.wake[0], drain[:])
		}
		st.pmu.Lock()
		for _, p := range fds[1:] {
			if p.Revents != 0 && !st.procs.Handle(int(p.Fd)) {
				st.code.Handle(int(p.Fd))
			}
		}
		st.reapLocked()
		st.pmu.Unlock()
	}
}
