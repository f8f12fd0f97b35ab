package bwrap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap/bwwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/registry"
	"github.com/sandbox-sidecar/sandbox-sidecar/capture"
	"github.com/sandbox-sidecar/sandbox-sidecar/internal/handoff"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

// Bounds on the daemon's waits for a sandbox's init. None of them is ever
// the only bound: each is cut short by the command's own deadline (its
// timeout + KillGrace + ExecGrace) and by its context.
const (
	// initStartTimeout bounds bwrap and init's set-up, up to its ready
	// message.
	initStartTimeout = 10 * time.Second
	// initAnswerTimeout bounds the wait for "started" after a command was
	// handed over. An init that does not answer is wedged (stopped, or
	// stuck on a process the kernel cannot kill) and the sandbox is
	// terminated.
	initAnswerTimeout = 10 * time.Second
	// initKillAnswer bounds the wait for "exited" once the daemon asked
	// init to kill a command.
	initKillAnswer = 2 * time.Second
	// initDeathWait is how long an EOF on a status socket may precede
	// the control socket's hang-up when init died.
	initDeathWait = 500 * time.Millisecond
	// initReapWait bounds the wait for a killed init's bwrap to be reaped.
	initReapWait = 5 * time.Second
	// initHangUpWait is how long a stopped init's control socket may take
	// to hang up before stopInit looks for what holds it (a parent-death
	// signal takes well under a millisecond).
	initHangUpWait = 20 * time.Millisecond
	// initStderrBytes caps what is read of init's stderr for a log line.
	initStderrBytes = 4 << 10
	// initDrainGrace is how long output is read after a command ended.
	// Init has killed everything the command left by then, so the pipes
	// reach EOF at once; the grace only covers a process the kernel is
	// slow to tear down.
	initDrainGrace = capture.DefaultDrainGrace
	// initWarmTimeout bounds Warm's warm-up command (warmInit), which
	// exits at once, from its hand-over to its end.
	initWarmTimeout = 10 * time.Second
	// execHotWait is how long the daemon waits for a command's end in
	// the goroutine that handed it over, outside the runtime's poller
	// (capture.Streams.Hot), before it waits the ordinary way.
	execHotWait = 5 * time.Millisecond
)

var (
	// errInitBusy: the init runs another command; Exec refuses this one
	// (the caller does not overlap commands in one sandbox).
	errInitBusy = errors.New("the sandbox's init is running another command")
	// errInitDied: the init died (or was killed) since the last command;
	// this Exec is the first to learn it and reports SandboxTerminated.
	errInitDied = errors.New("the sandbox's init died")
)

// initProc is a sandbox's running init, as the daemon holds it: the bwrap
// process (whose child it is), the daemon's end of the control socket, the
// memfd bwrap's and init's stderr go to and, once it has run a command in a
// sandbox with a cgroup, the cgroup's OOM-kill counter. That is all an idle
// sandbox costs the daemon: no goroutine, three or four descriptors and a
// few hundred bytes.
type initProc struct {
	cmd    *exec.Cmd
	ctrl   *os.File // blocking, out of the runtime's poller once init is ready (outOfPoller)
	stderr *os.File
	busy   bool // guarded by the sandbox's initMu
	// warm: a command, or Warm's warm-up (warmInit), has run through it;
	// guarded by the sandbox's initMu.
	warm   bool
	sendMu sync.Mutex

	waitOnce sync.Once
	reaping  atomic.Bool   // the reaping goroutine runs: bwrap's pid may be gone
	exited   chan struct{} // closed once cmd.Wait has returned

	egress *egressPath // network "allowlist": its namespace and netstack
	oom    *oomCounter // the sandbox's OOM-kill counter, held for every command
	dir    string      // the sandbox's directory, whose marker its processes carry

	// pidfd is init's own process, for an init a previous daemon started
	// and this one re-attached to (cmd is nil: its bwrap is not this
	// process's child); -1 otherwise.
	pidfd int
}

// waited returns a channel closed once init's bwrap has been reaped,
// starting the one goroutine that reaps it on first use (when init is
// being stopped, never while it serves).
func (ip *initProc) waited() <-chan struct{} {
	ip.waitOnce.Do(func() {
		ip.exited = make(chan struct{})
		ip.reaping.Store(true)
		go func() { _ = ip.cmd.Wait(); close(ip.exited) }()
	})
	return ip.exited
}

// spawner starts every init's bwrap from one goroutine locked to its OS
// thread for the life of the daemon: the parent-death signal of a child is
// tied to the thread that forked it, and this thread ends only with the
// process. So an init dies with the daemon, never with a Go thread.
var spawner struct {
	once sync.Once
	reqs chan spawnRequest
}

type spawnRequest struct {
	cmd   *exec.Cmd
	netns *os.File // nil: the daemon's; else bwrap starts in it
	done  chan error
}

// startIn starts cmd from the spawner's thread moved into netns, then moves
// the thread back home; if it cannot, *stuck refuses every later spawn.
func startIn(cmd *exec.Cmd, netns, home *os.File, stuck *error) error {
	if err := unix.Setns(int(netns.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter the sandbox's network namespace: %w", err)
	}
	err := cmd.Start()
	if serr := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); serr != nil {
		*stuck = fmt.Errorf("the daemon's spawning thread could not return to its network namespace (%v); restart the daemon", serr)
		if err == nil {
			_ = cmd.Process.Kill()
			err = *stuck
		}
	}
	return err
}

// spawnIn is spawn with bwrap started in network namespace netns (nil:
// the daemon's).
func spawnIn(cmd *exec.Cmd, netns *os.File) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread must outlive every init
			home, homeErr := os.Open("/proc/thread-self/ns/net")
			var stuck error // the thread could not return to the daemon's namespace
			for r := range spawner.reqs {
				switch {
				case stuck != nil:
					r.done <- stuck
				case r.netns == nil:
					r.done <- r.cmd.Start()
				case homeErr != nil:
					r.done <- homeErr
				default:
					r.done <- startIn(r.cmd, r.netns, home, &stuck)
				}
			}
		}()
	})
	r := spawnRequest{cmd: cmd, netns: netns, done: make(chan error, 1)}
	spawner.reqs <- r
	return <-r.done
}

// seqpacketPair returns a connected pair of SOCK_SEQPACKET sockets, both
// close-on-exec: the daemon's end non-blocking (so its reads and writes
// take deadlines), the other end blocking, for init.
func seqpacketPair(name string) (daemonEnd, initEnd *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), name), os.NewFile(uintptr(fds[1]), name+"-init"), nil
}

// startInit starts sb's init and waits for it to say it is ready, until
// deadline at most. On failure nothing of it is left running.
func (b *Backend) startInit(ctx context.Context, sb *sandbox, deadline time.Time) (_ *initProc, err error) {
	deadline = earliest(deadline, time.Now().Add(initStartTimeout))
	budget := time.Until(deadline)
	ctrl, ctrlInit, err := seqpacketPair("sandbox-control")
	if err != nil {
		return nil, fmt.Errorf("%w: start the init of sandbox %s: %v; the daemon may be out of file descriptors", backend.ErrUnavailable, sb.id, err)
	}
	defer ctrlInit.Close()
	stderr, err := memFile("sandbox-init-stderr", "")
	if err != nil {
		ctrl.Close()
		return nil, fmt.Errorf("%w: start the init of sandbox %s: %v", backend.ErrUnavailable, sb.id, err)
	}
	ip := &initProc{ctrl: ctrl, stderr: stderr, oom: &oomCounter{cg: sb.cg}, dir: sb.dir, pidfd: -1}
	listener, err := listenAgent(sb.dir)
	if err != nil {
		ctrl.Close()
		stderr.Close()
		return nil, fmt.Errorf("%w: start the init of sandbox %s: cannot make its socket for a restarted daemon: %v", backend.ErrUnavailable, sb.id, err)
	}
	defer listener.Close()
	// Closed after stopInit (defers run last-first): on v1 closing the
	// gate unreleased lets bwrap go on, so it must be dead by then.
	place := sb.placement()
	defer place.close()
	flagged := false // sb's start flag is written (startFlag)
	defer func() {
		gone := true
		if err != nil {
			gone = b.stopInit(ip)
		}
		if flagged && gone {
			clearStartFlag(sb.dir, b.log)
		}
	}()

	env := []string{"--setenv", markerEnv, marker(sb.dir), "--setenv", bwwire.InitEnv, "1", "--setenv", "GOMAXPROCS", "1",
		"--setenv", bwwire.RlimitsEnv, bwwire.EncodeRlimits(wireRlimits(b.cfg.Limits.Rlimits())),
		"--setenv", bwwire.ThreadsEnv, strconv.Itoa(sb.reservedThreads())}
	if fp := os.Getenv(agent.KeeperFailpointEnv); fp != "" {
		env = append(env, "--setenv", agent.KeeperFailpointEnv, fp) // tests only
	}
	const firstDataFD = bwwire.ListenFD + 1
	files, err := dataFiles(b.bwrapOptions(sb, env, "/", firstDataFD))
	if err != nil {
		return nil, fmt.Errorf("%w: prepare bwrap for sandbox %s: %v; the daemon may be out of memory or file descriptors", backend.ErrUnavailable, sb.id, err)
	}
	defer closeFiles(files)
	cmd := b.command(sb, []string{"--args", fmt.Sprint(firstDataFD), "--", fmt.Sprintf("/proc/self/fd/%d", bwwire.ExeFD)})
	cmd.Stderr = stderr
	cmd.ExtraFiles = append([]*os.File{ctrlInit, b.exe, listener}, files...) // fds 3, 4, 5, 6...
	// No parent-death signal: a sandbox's init outlives its daemon (a
	// crash, a restart, an upgrade), and its processes with it; the next
	// daemon re-attaches to it through the listener (adoptInit). A start
	// the daemon died during is killed by the next one (its start flag).
	cmd.SysProcAttr.Setpgid = true
	if err := place.prepare(cmd); err != nil {
		return nil, fmt.Errorf("%w: cannot place the init of sandbox %s in its cgroup: %v", backend.ErrUnavailable, sb.id, err)
	}
	if err := capture.CloseInheritedOnExec(); err != nil {
		return nil, fmt.Errorf("%w: not starting the init of sandbox %s: cannot keep the daemon's other file descriptors from leaking into it: %v", backend.ErrUnavailable, sb.id, err)
	}
	if sb.network == networkAllowlist {
		if ip.egress, err = b.startEgress(sb); err != nil {
			return nil, err
		}
	}
	// A new init: whatever an earlier one ran died with it.
	if err := b.store(sb).AgentReplaced(); err != nil {
		b.log.With("sandbox", sb.id).Warn("cannot record that the processes of the sandbox's previous init ended with it", "error", err)
	}
	if err := writeStartFlag(sb.dir); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("the init of sandbox %s was not started: %w", sb.id, ctx.Err())
		}
		return nil, fmt.Errorf("%w: not starting the init of sandbox %s: %v; check the state directory's disk", backend.ErrUnavailable, sb.id, err)
	}
	flagged = true
	if err := spawnIn(cmd, ip.egress.netns()); err != nil {
		return nil, fmt.Errorf("%w: bwrap could not be started for sandbox %s (%v); check that %s is installed and executable", backend.ErrUnavailable, sb.id, err, b.bwrap)
	}
	ip.cmd = cmd
	// Only bwrap and init hold the other end now: when they are gone, the
	// control socket hangs up.
	ctrlInit.Close()
	b.failpoint(FailInitSpawned)
	if err := ctx.Err(); err != nil {
		// Destroyed (or the backend closed) while bwrap started: its
		// first process is not let go into a sandbox that is going away.
		return nil, fmt.Errorf("the init of sandbox %s was not started: %w", sb.id, err)
	}
	if err := place.started(); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			// bwrap was gone before it could be placed: it failed at
			// once, and its stderr says why.
			b.reapInit(ip)
			if detail := ip.stderrTail(); detail != "" {
				return nil, fmt.Errorf("%w: bubblewrap could not start sandbox %s: %s; check that bubblewrap works for uid %s and that uid can reach the state directory and execute the init",
					backend.ErrUnavailable, sb.id, detail, b.runsAs())
			}
		}
		return nil, fmt.Errorf("%w: cannot place the init of sandbox %s in its cgroup (%v); it was not let run", backend.ErrUnavailable, sb.id, err)
	}

	buf := make([]byte, 2*bwwire.MsgSize)
	stop := context.AfterFunc(ctx, func() { _ = ctrl.SetReadDeadline(time.Now()) })
	defer stop()
	if err := ctrl.SetReadDeadline(deadline); err != nil {
		return nil, fmt.Errorf("%w: start the init of sandbox %s: %v", backend.ErrUnavailable, sb.id, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("the init of sandbox %s was not started: %w", sb.id, err)
	}
	n, err := ctrl.Read(buf)
	switch {
	case err == nil:
		if m, derr := bwwire.DecodeMsg(buf[:n]); derr != nil || m.Kind != bwwire.MsgReady {
			return nil, fmt.Errorf("%w: the init of sandbox %s said something unexpected (%v): the daemon and its init (%s, or the daemon's own binary) must be of one version; install them together and restart", backend.ErrUnavailable, sb.id, derr, initproc.BinaryName)
		}
	case ctx.Err() != nil:
		return nil, fmt.Errorf("the init of sandbox %s was not started: %w", sb.id, ctx.Err())
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, fmt.Errorf("%w: the init of sandbox %s did not start within %v; the host may be overloaded", backend.ErrUnavailable, sb.id, budget.Round(time.Millisecond))
	default:
		b.reapInit(ip)
		detail := ip.stderrTail()
		if detail == "" {
			detail = err.Error()
		}
		return nil, fmt.Errorf("%w: bubblewrap could not start sandbox %s: %s; check that bubblewrap works for uid %s, that unprivileged user namespaces are enabled, and that uid can execute the daemon's binary",
			backend.ErrUnavailable, sb.id, detail, b.runsAs())
	}
	unpolled, err := outOfPoller(ctrl)
	if err != nil {
		return nil, fmt.Errorf("%w: start the init of sandbox %s: %v", backend.ErrUnavailable, sb.id, err)
	}
	ip.ctrl = unpolled
	b.started.Store(sb.dir, ip)
	return ip, nil
}

// outOfPoller returns f's socket as a file out of the runtime's poller,
// and closes f; on an error f is left as it was. The daemon only sends on the control socket once init is
// ready (sendKind, without waiting unless init's queue is full) and polls
// it for a hang-up (alive); in the poller, every message init took off
// the socket would wake the poller's thread for nothing (edge-triggered
// EPOLLOUT), on the CPU init and its command run on.
func outOfPoller(f *os.File) (*os.File, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	dup := -1
	var dupErr error
	if err := rc.Control(func(fd uintptr) {
		dup, dupErr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, err
	}
	if dupErr != nil {
		return nil, os.NewSyscallError("fcntl", dupErr)
	}
	// Blocking again (the status flags are the socket's, shared with f):
	// os.NewFile leaves a blocking descriptor out of the poller, and
	// sendKind never blocks on it (MSG_DONTWAIT).
	if err := unix.SetNonblock(dup, false); err != nil {
		unix.Close(dup)
		return nil, os.NewSyscallError("fcntl", err)
	}
	_ = f.Close()
	return os.NewFile(uintptr(dup), f.Name()), nil
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// alive reports whether init still holds its end of the control socket:
// once it and its bwrap are gone, the socket hangs up.
func (ip *initProc) alive() bool { return !ip.waitDead(0) }

// waitDead waits up to limit for the control socket to hang up and
// reports whether it did. It waits in poll(2), so it returns as soon as
// init's last descriptor closes (a destroy used to sleep in 5 ms steps
// for it, most of a destroy's time).
func (ip *initProc) waitDead(limit time.Duration) bool {
	rc, err := ip.ctrl.SyscallConn()
	if err != nil {
		return true // closed: as alive says
	}
	deadline := time.Now().Add(limit)
	dead := false
	_ = rc.Control(func(fd uintptr) {
		for {
			left := max(time.Until(deadline), 0)
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
			n, err := unix.Poll(fds, int((left+time.Millisecond-1)/time.Millisecond))
			switch {
			case errors.Is(err, unix.EINTR): // the runtime's preemption signal: again, for what is left
			case err != nil:
				dead = true // as alive says of a socket poll cannot look at
				return
			case n == 0:
				return // still up at the deadline
			default:
				dead = fds[0].Revents&(unix.POLLHUP|unix.POLLRDHUP|unix.POLLERR|unix.POLLNVAL) != 0
				return
			}
		}
	})
	return dead
}

// send hands init one run message (with the request when inline is not
// nil) and its descriptors, waiting until deadline at most for room on the
// socket.
func (ip *initProc) send(inline []byte, fds []int, deadline time.Time, beforeWait func()) error {
	return ip.sendKind(bwwire.MsgRun, inline, fds, deadline, beforeWait)
}

// sendKind sends init one message of kind, its header's first value the
// length of payload and payload after it, with fds. A command's run and
// file operations' opens share the socket, one send at a time. Init takes
// every message at once, so a send waits (polling the socket, in slices
// that also see init's death: the socket then hangs up and the send
// fails) only while an init that stopped reading has a full queue.
// beforeWait, if set, runs before it waits: for another send, or for room.
func (ip *initProc) sendKind(kind uint32, payload []byte, fds []int, deadline time.Time, beforeWait func()) error {
	return ip.sendEncoded(append(bwwire.Msg{Kind: kind, A: uint32(len(payload))}.Encode(), payload...), fds, deadline, beforeWait)
}

// sendEncoded sends one message, a header and what follows it, with fds.
func (ip *initProc) sendEncoded(msg []byte, fds []int, deadline time.Time, beforeWait func()) error {
	if beforeWait == nil {
		beforeWait = func() {}
	}
	if !ip.sendMu.TryLock() {
		beforeWait()
		ip.sendMu.Lock()
	}
	defer ip.sendMu.Unlock()
	rc, err := ip.ctrl.SyscallConn()
	if err != nil {
		return err
	}
	var sendErr error
	err = rc.Control(func(fd uintptr) {
		for {
			sendErr = unix.Sendmsg(int(fd), msg, unix.UnixRights(fds...), nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
			if !errors.Is(sendErr, unix.EAGAIN) && !errors.Is(sendErr, unix.EINTR) {
				return
			}
			left := time.Until(deadline)
			if left <= 0 {
				sendErr = os.ErrDeadlineExceeded
				return
			}
			beforeWait()
			ts := unix.NsecToTimespec(int64(min(left, 20*time.Millisecond)))
			_, _ = unix.Ppoll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}, &ts, nil)
		}
	})
	if err != nil {
		return err
	}
	return sendErr
}

// stderrTail returns the last line or so of what bwrap and init wrote to
// stderr, for a log line or an error message.
func (ip *initProc) stderrTail() string {
	if ip.stderr == nil {
		return "" // re-attached: its stderr went to the daemon that started it
	}
	fi, err := ip.stderr.Stat()
	if err != nil || fi.Size() == 0 {
		return ""
	}
	off := max(fi.Size()-initStderrBytes, 0)
	buf := make([]byte, fi.Size()-off)
	n, _ := ip.stderr.ReadAt(buf, off)
	return string(bytes.TrimSpace(bytes.ToValidUTF8(buf[:n], []byte("?"))))
}

// stopInit kills init, reaps its bwrap within initReapWait and closes the
// daemon's descriptors. Killing bwrap's process group takes init with it
// (its parent-death signal), and with init, as pid 1, every process of the
// sandbox. Not always: the parent-death signal does not cover every moment
// of bwrap's first process's setup, and one killed in such a moment after
// it has left bwrap's process group (--new-session) outlives the kill,
// re-parented, still holding init's end of the control socket. So when the
// socket has not hung up within initHangUpWait, every process still
// carrying the sandbox's marker is killed (a scan of the host's processes,
// paid only then), and the wait goes on. It reports whether every process
// of the init is known to be gone.
func (b *Backend) stopInit(ip *initProc) (gone bool) {
	gone = true
	if ip.cmd != nil && ip.cmd.Process != nil {
		if !ip.reaping.Load() {
			// Unreaped, bwrap's pid (its group's id) cannot be anyone
			// else's yet. The group holds bwrap alone (init has a session
			// of its own) unless bwrap is not what it should be.
			_ = syscall.Kill(-ip.cmd.Process.Pid, syscall.SIGKILL)
		}
		_ = ip.cmd.Process.Kill() // through its pidfd: safe whatever happened
		b.reapInit(ip)
		// Init dies of its parent-death signal, a moment after bwrap.
		if !ip.waitDead(initHangUpWait) {
			if ip.dir != "" {
				if left := b.findMarked(ip.dir, false); len(left) > 0 {
					b.log.Warn("killed processes of a sandbox that outlived its init's bwrap", "dir", ip.dir, "count", killMarked(left))
				}
			}
			if !ip.waitDead(initReapWait) {
				gone = false
				b.log.Warn("a sandbox's init is still alive after its bwrap was killed", "bwrap_pid", ip.cmd.Process.Pid)
			}
		}
	}
	if ip.pidfd >= 0 {
		// Re-attached: init is not this process's child. Killed, it takes
		// its namespace with it, and its bwrap then ends too.
		_ = unix.PidfdSendSignal(ip.pidfd, unix.SIGKILL, nil, 0)
		if !ip.waitDead(initReapWait) {
			gone = false
			b.log.Warn("a re-attached sandbox init is still alive after SIGKILL", "dir", ip.dir)
		}
		_ = unix.Close(ip.pidfd)
		ip.pidfd = -1
	}
	ip.detach(b)
	return gone
}

// detach closes the daemon's hold on ip without stopping it: the init goes
// on, and a later daemon re-attaches to it.
func (ip *initProc) detach(b *Backend) {
	b.started.CompareAndDelete(ip.dir, ip)
	_ = ip.ctrl.Close()
	if ip.stderr != nil {
		_ = ip.stderr.Close()
	}
	if ip.pidfd >= 0 {
		_ = unix.Close(ip.pidfd)
		ip.pidfd = -1
	}
	ip.oom.close()
	ip.egress.close(b.log)
}

// reapInit waits (boundedly) for init's bwrap to exit and reports whether
// it did. One that takes longer is left to the reaping goroutine; only a
// process stuck in the kernel does.
func (b *Backend) reapInit(ip *initProc) bool {
	if ip.cmd == nil || ip.cmd.Process == nil {
		return true
	}
	t := time.NewTimer(initReapWait)
	defer t.Stop()
	select {
	case <-ip.waited():
		return true
	case <-t.C:
		b.log.Warn("the bwrap of a sandbox's init did not exit after SIGKILL; it is reaped in the background", "pid", ip.cmd.Process.Pid)
		return false
	}
}

// acquireInit returns sb's init for one command, starting it if this
// process has none yet (a new sandbox, or one re-adopted after a restart).
// It fails with errInitBusy when init runs another command, errInitDied the
// first time after init died, and an error wrapping ErrNotFound after that.
//
// A request running on its connection's reader (internal/handoff) has the
// connection released first when this has to wait: for the lock, or to
// start the init.
func (b *Backend) acquireInit(ctx context.Context, sb *sandbox, deadline time.Time) (*initProc, error) {
	sb.lockInit(ctx)
	defer sb.initMu.Unlock()
	if ip := sb.init; ip != nil && !ip.alive() {
		handoff.Release(ctx)
		var status any = "unknown"
		if b.reapInit(ip) && ip.cmd != nil {
			status = ip.cmd.ProcessState
		}
		b.log.With("sandbox", sb.id).Warn("the sandbox's init died; the sandbox is terminated", "bwrap", status, "stderr", ip.stderrTail())
		b.stopInit(ip)
		sb.init, sb.initGone = nil, true
	}
	switch {
	case sb.paused:
		return nil, sb.errPaused()
	case sb.initGone && !sb.goneReported:
		sb.goneReported = true
		return nil, errInitDied
	case sb.initGone:
		return nil, fmt.Errorf("%w: sandbox %q was terminated (its init process died); destroy it and create a new one", backend.ErrNotFound, sb.id)
	case sb.init == nil:
		handoff.Release(ctx)
		ip, err := b.startInit(ctx, sb, deadline)
		if err != nil {
			return nil, err
		}
		sb.init = ip
	case sb.init.busy:
		return nil, errInitBusy
	}
	sb.init.busy, sb.init.warm = true, true
	return sb.init, nil
}

// releaseInit makes ip available for the next command.
func (sb *sandbox) releaseInit(ctx context.Context, ip *initProc) {
	sb.lockInit(ctx)
	defer sb.initMu.Unlock()
	ip.busy = false
}

// lockInit takes sb.initMu, releasing ctx's connection first
// (internal/handoff) if the lock is held: a destroy stopping init, or
// another start, holds it for seconds.
func (sb *sandbox) lockInit(ctx context.Context) {
	if !sb.initMu.TryLock() {
		handoff.Release(ctx)
		sb.initMu.Lock()
	}
}

// terminate kills ip, if it is still sb's init, and marks the sandbox
// terminated; reported says the caller tells its client so.
func (b *Backend) terminate(sb *sandbox, ip *initProc, reported bool, why string) {
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	if sb.init != ip {
		return
	}
	b.log.With("sandbox", sb.id).Warn("sandbox terminated: "+why, "stderr", ip.stderrTail())
	b.stopInit(ip)
	sb.init, sb.initGone = nil, true
	sb.goneReported = sb.goneReported || reported
}

// detachInit lets go of sb's init without stopping it, at the daemon's
// shutdown: a ready init goes on, with its sandbox's processes, until the
// next daemon re-attaches to it (reattach.go) or destroys the sandbox. It
// reports whether one was left running. (A start under way was cancelled
// with the sandbox's operations, and stops what it made.)
func (b *Backend) detachInit(sb *sandbox) bool {
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	ip := sb.init
	if ip == nil {
		return false
	}
	sb.init = nil
	if !ip.alive() {
		b.stopInit(ip)
		return false
	}
	ip.detach(b)
	if ip.cmd != nil {
		// Its bwrap is this process's child until it exits: reaped then
		// by whoever inherits it.
		_ = ip.cmd.Process.Release()
	}
	return true
}

// killInit stops sb's init for good (Destroy, or a sandbox that vanished).
func (b *Backend) killInit(sb *sandbox) {
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	if sb.init != nil {
		b.stopInit(sb.init)
		sb.init = nil
	}
	sb.initGone, sb.goneReported = true, true
}

// initOutcome is what the conversation about one command established.
type initOutcome struct {
	exitCode   int
	exited     bool // init reported how the command ended
	timedOut   bool // init stopped the command at its budget
	outerFired bool // the daemon's own deadline passed and it had init kill the command
	terminated bool // init died or was killed: the sandbox is gone
	refused    bool // init closed the status socket without an answer, yet lives
	duration   time.Duration
}

// take applies one message of init's about the command to o, and says
// whether it decided the command's end: it exited, init could not start
// it, or init broke the protocol (then it cannot be trusted with more: the
// sandbox is terminated).
func (o *initOutcome) take(msg []byte, started *bool, start time.Time) (decided bool) {
	m, err := bwwire.DecodeMsg(msg)
	switch {
	case err == nil && m.Kind == bwwire.MsgStarted && !*started:
		*started = true
		return false
	case err == nil && m.Kind == bwwire.MsgExited:
		if code, timed, cerr := m.ExitCode(); cerr == nil {
			o.exitCode, o.timedOut, o.exited, o.duration = code, timed, true, time.Since(start)
			return true
		}
	case err == nil && m.Kind == bwwire.MsgFailed && !*started:
		// Init could not start it and wrote why to its stderr, as bwrap
		// did when it could not chdir.
		o.exitCode, o.exited, o.duration = 1, true, time.Since(start)
		return true
	}
	o.terminated = true
	return true
}

// execInit runs one command through sb's init: it hands init the request
// and the command's pipes, then reads the command's status socket until
// init says how it ended, enforcing the deadline, ctx and Destroy itself.
func (b *Backend) execInit(ctx, opCtx context.Context, sb *sandbox, ip *initProc, req backend.ExecRequest, argv, env []string, cwd string, applied time.Duration) (backend.ExecResult, error) {
	run := bwwire.RunRequest{Argv: argv, Env: env, Cwd: cwd, Timeout: applied, KillAfter: backend.GuestTimeout(b.cfg.KillGrace)}
	log := b.log.With("sandbox", sb.id)
	// The connection the request came on, when it runs on that
	// connection's reader (backend.InlineExecer): watched during the hot
	// wait, released before anything longer.
	conn := handoff.From(ctx)
	streams, err := capture.NewStreams(req.Stdin, req.MaxOutputBytes)
	if err != nil {
		return backend.ExecResult{}, fmt.Errorf("%w: cannot create pipes for a command in sandbox %s (is the daemon out of file descriptors?): %v", backend.ErrUnavailable, sb.id, err)
	}
	streams.SetOutput(backend.OutputFunc(req.Output))
	// Everything the hand-over needs is made first, with as few system
	// calls as it takes; what the daemon needs only afterwards (its ends
	// in the runtime's poller) is done once init has the command.
	encoded := run.Encode()
	inline := encoded
	var reqFile *os.File
	if len(encoded) > bwwire.MaxInlineRequest {
		inline = nil
		if reqFile, err = memFile("sandbox-request", string(encoded)); err != nil {
			streams.Close()
			return backend.ExecResult{}, fmt.Errorf("%w: prepare a command for sandbox %s: %v", backend.ErrUnavailable, sb.id, err)
		}
	}
	// The status socket: both ends non-blocking (init only ever sends and
	// receives on its end without waiting), out of the poller until sent.
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		streams.Close()
		closeFiles([]*os.File{reqFile})
		return backend.ExecResult{}, fmt.Errorf("%w: prepare a command for sandbox %s: socketpair: %v", backend.ErrUnavailable, sb.id, err)
	}
	statusFD, statusInit := pair[0], pair[1]

	if opCtx.Err() != nil {
		// Cancelled (or destroyed) before init got it: nothing ran.
		streams.Close()
		closeFiles([]*os.File{reqFile})
		unix.Close(statusFD)
		unix.Close(statusInit)
		if errors.Is(context.Cause(opCtx), errSandboxDestroyed) {
			return backend.ExecResult{ExitCode: backend.ExitKilled, SandboxTerminated: true, AppliedTimeout: applied}, nil
		}
		return backend.ExecResult{AppliedTimeout: applied}, fmt.Errorf("command in sandbox %s was not run because the request ended: %w", sb.id, opCtx.Err())
	}
	oom := ip.oom
	oomBefore := oom.read()
	start := time.Now()
	outer := start.Add(applied + b.cfg.KillGrace + b.cfg.ExecGrace)
	child := streams.ChildFDs()
	fds := make([]int, 0, bwwire.RunFDs)
	fds = append(fds, statusInit)
	if reqFile != nil {
		fds = append(fds, int(reqFile.Fd()))
	}
	fds = append(fds, child[0], child[1], child[2])
	b.failpoint(FailExecSending)
	sendErr := ip.send(inline, fds, earliest(outer, start.Add(initAnswerTimeout)), conn.Release)
	unix.Close(statusInit)
	closeFiles([]*os.File{reqFile})
	b.failpoint(FailExecHandedOver)

	var o initOutcome
	decided, started := false, false
	if sendErr != nil {
		// Dead, or not reading its socket: either way unusable.
		o.terminated, decided = true, true
		log.Warn("cannot hand the sandbox's init a command", "error", sendErr)
		unix.Close(statusFD)
	} else if streams.Hot(statusFD, execHotWait, watchConn(conn), func(msg []byte) bool {
		decided = o.take(msg, &started, start)
		return decided
	}) {
		unix.Close(statusFD)
	} else {
		conn.Release() // a command that outlasts the hot wait may run long
		streams.Start()
		// Non-blocking already: NewFile puts it in the poller.
		status := os.NewFile(uintptr(statusFD), "sandbox-status")
		defer status.Close()
		if !decided {
			o = b.converse(opCtx, ip, status, start, outer, started)
		}
	}
	if o.duration == 0 {
		o.duration = time.Since(start)
	}
	if o.terminated {
		conn.Release()
		b.terminate(sb, ip, true, "its init died or stopped answering")
	}
	out := streams.Finish(initDrainGrace)

	res := backend.ExecResult{
		ExitCode:        o.exitCode,
		Stdout:          out.Stdout,
		Stderr:          out.Stderr,
		StdoutTruncated: out.StdoutTruncated,
		StderrTruncated: out.StderrTruncated,
		AppliedTimeout:  applied,
		Duration:        o.duration,
	}
	destroyed := errors.Is(context.Cause(opCtx), errSandboxDestroyed)
	if (destroyed || o.terminated) && !o.exited {
		res.ExitCode = backend.ExitKilled
	}
	b.classify(&res, backend.Facts{ExitCode: o.exitCode, Elapsed: o.duration, Applied: applied,
		OuterFired: o.outerFired, GuestTimedOut: o.timedOut, Ended: o.exited, Terminated: destroyed || o.terminated}, oom, oomBefore)
	switch {
	case res.SandboxTerminated:
		log.Info("command ended with its sandbox", "destroyed", destroyed, "duration", o.duration, "oom_kills", res.OOMKills)
		return res, nil
	case ctx.Err() != nil:
		return res, fmt.Errorf("command in sandbox %s was killed because the request ended: %w", sb.id, ctx.Err())
	case o.refused:
		return res, fmt.Errorf("%w: the init of sandbox %s refused the command; the daemon's log has its reason", backend.ErrUnavailable, sb.id)
	}
	if o.outerFired {
		log.Warn("the command outlived its timeout and was killed", "timeout", applied, "duration", o.duration)
	}
	if res.OOMKills > 0 {
		log.Info("the sandbox reached its memory limit during the command", "oom_kills", res.OOMKills, "oom_killed", res.OOMKilled, "memory_bytes", sb.limits.MemoryBytes)
	}
	log.Debug("command finished", "exit_code", res.ExitCode, "timed_out", res.TimedOut,
		"duration", o.duration, "stdout_bytes", out.StdoutTotal, "stderr_bytes", out.StderrTotal)
	return res, nil
}

// watchConn is the hot wait's watch of conn (nil: none): readable or hung
// up, it is released.
func watchConn(conn *handoff.Conn) capture.Watch {
	if conn == nil {
		return capture.NoWatch
	}
	return capture.Watch{FD: conn.FD(), Ready: conn.Release}
}

// recvQueued reads one message already queued on status without waiting:
// unix.EAGAIN when there is none, 0 bytes at end of file.
func recvQueued(status *os.File, buf []byte) (int, error) {
	rc, err := status.SyscallConn()
	if err != nil {
		return 0, err
	}
	n, rerr := 0, error(nil)
	if err := rc.Control(func(fd uintptr) {
		n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
		for errors.Is(rerr, unix.EINTR) {
			n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
		}
	}); err != nil {
		return 0, err
	}
	return n, rerr
}

// converse reads the command's status socket until init reports its end,
// init dies, or a deadline makes the daemon give up on init. It is the
// only place the daemon waits on init during a command, and every wait in
// it has a deadline: the answer to the hand-over (initAnswerTimeout), the
// command's own (outer), and once the daemon asked for a kill,
// initKillAnswer.
func (b *Backend) converse(opCtx context.Context, ip *initProc, status *os.File, start, outer time.Time, started bool) initOutcome {
	var o initOutcome
	// The wake-up only interrupts a read so the loop sees the
	// cancellation; it may land at any moment, even after the loop has
	// handled the cancellation and set a later deadline. A read that ends
	// before the deadline the loop set is therefore never taken for init's
	// silence: only the loop's own deadlines judge init.
	wake := context.AfterFunc(opCtx, func() {
		b.failpoint(FailConverseWake)
		_ = status.SetReadDeadline(time.Now())
		b.failpoint(FailConverseWoken)
	})
	defer wake()
	var (
		cancelled bool
		armedHit  bool      // FailConverseKillArmed was reached
		killBy    time.Time // set once the daemon asked init to kill the command
		buf       = make([]byte, 2*bwwire.MsgSize)
	)
	askKill := func() {
		killBy = time.Now().Add(initKillAnswer)
		if rc, err := status.SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_WR) })
		}
	}
	for {
		if opCtx.Err() != nil && !cancelled {
			cancelled = true
			if errors.Is(context.Cause(opCtx), errSandboxDestroyed) {
				// Destroy kills init; wait (boundedly) to see it go.
				killBy = time.Now().Add(initKillAnswer)
			} else {
				askKill()
			}
		}
		deadline := outer
		if !started {
			deadline = earliest(deadline, start.Add(initAnswerTimeout))
		}
		if !killBy.IsZero() {
			deadline = killBy
		}
		_ = status.SetReadDeadline(deadline)
		if opCtx.Err() != nil && !cancelled {
			continue // cancelled between the check and the deadline: handle it first
		}
		if cancelled && !armedHit {
			armedHit = true
			b.failpoint(FailConverseKillArmed)
		}
		n, err := status.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// A deadline can pass while init's answer is already queued:
			// the daemon was stopped (SIGSTOP) or starved past it, and the
			// runtime then reports the deadline without reading. Read what
			// is there before judging init by its silence.
			if qn, qerr := recvQueued(status, buf); qerr == nil {
				n, err = qn, nil
				if qn == 0 {
					err = io.EOF
				}
			}
		}
		now := time.Now()
		switch {
		case err == nil:
			if o.take(buf[:n], &started, start) {
				return o
			}
		case errors.Is(err, os.ErrDeadlineExceeded):
			switch {
			case opCtx.Err() != nil && !cancelled:
				continue
			case now.Before(deadline):
				// Woken early by the cancellation's wake-up, after the
				// loop had already handled it: not a deadline of ours.
				continue
			case !killBy.IsZero() && !now.Before(killBy):
				// Asked to kill (or, under Destroy, killed), init said
				// nothing: it is wedged, or gone.
				o.terminated = true
				return o
			case !started:
				// Init never took the command (it answers within
				// microseconds when it is well): there is nothing to ask
				// it to kill.
				o.outerFired = !now.Before(outer)
				o.terminated = true
				return o
			case !now.Before(outer) && killBy.IsZero():
				o.outerFired = true
				askKill()
			}
		default:
			// EOF (or an error): init closed the socket without a word,
			// which it only does when it is dying or refuses a request.
			if cancelled && errors.Is(context.Cause(opCtx), errSandboxDestroyed) {
				o.terminated = true
				return o
			}
			if ip.waitDead(initDeathWait) {
				o.terminated = true
			} else {
				o.refused = true
			}
			return o
		}
	}
}

// startSoon begins the start of new sandbox sb's init in the background,
// for Create, so that the start overlaps the rest of the create (its
// settings' fsyncs, the lifecycle's journal and answer) and whatever the
// client does before its first command. It takes sb.initMu before it
// returns and holds it until the start has ended: a command or a Warm that
// comes meanwhile waits for this start instead of making another. The
// start is one of sb's operations, so a Destroy or Close cancels it and
// waits for it. A failed start is only logged: the sandbox stays, and its
// first command starts the init again and reports what is wrong. The
// returned stop, for a Create that fails after this, cancels the start,
// waits for it and kills what it started. At most cap(startSlots) such
// starts run at once; the others wait their turn holding nothing but the
// init lock (a destroy meanwhile cancels the wait).
func (b *Backend) startSoon(sb *sandbox) (stop func()) {
	opCtx, done, err := sb.begin(context.Background())
	if err != nil {
		return func() {}
	}
	sb.initMu.Lock()
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		defer b.failpoint(FailStartSoonEnded)
		defer done()
		defer sb.initMu.Unlock()
		slots := b.startSlots
		select {
		case slots <- struct{}{}:
		default:
			b.failpoint(FailStartSoonQueued)
			select {
			case slots <- struct{}{}:
			case <-opCtx.Done():
				b.failpoint(FailStartSoonCancelled)
				return
			}
		}
		defer func() { <-slots }()
		b.failpoint(FailStartSoon)
		if opCtx.Err() != nil {
			// Destroyed, or the backend closed, before it began: spawn
			// nothing only to kill it.
			b.failpoint(FailStartSoonCancelled)
			return
		}
		ip, err := b.startInit(opCtx, sb, time.Now().Add(initStartTimeout))
		switch {
		case err == nil:
			sb.init = ip
		case registry.Destroyed(opCtx):
		default:
			b.log.With("sandbox", sb.id).Warn("could not start the new sandbox's init ahead of its first command; its first command starts it", "error", err)
		}
	}()
	return func() {
		sb.ops.CancelAll()
		b.failpoint(FailStartStopping)
		<-ended
		b.killInit(sb)
	}
}

// Warm makes sandbox id ready for its first command to cost what any later
// one does: the warm pool's members are warmed before they can be claimed.
// It starts the sandbox's init, in its namespaces and cgroup, if this
// process has none for it yet (a new sandbox's is already starting,
// Create's startSoon: Warm waits for that start), and has it run one
// command before any client's (warmInit). It holds the init's lock
// throughout: an Exec that arrives meanwhile waits for it rather than
// starting another init, and is never refused as busy because of it. A
// sandbox whose init died is left for its next command to report as
// terminated; Warm says it is gone. An init that fails its warm-up is
// stopped, as one that failed to start: the next command or Warm starts
// another. Where the image's code contexts preload modules, Warm also
// starts the sandbox's code zygote and waits for its imports (warmCode),
// so that a pool member's first run_code costs a fork.
func (b *Backend) Warm(ctx context.Context, id string) error {
	sb, err := b.lookup(id)
	if err != nil {
		return err
	}
	opCtx, done, err := sb.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	switch {
	case sb.paused:
		return sb.errPaused()
	case sb.initGone, sb.init != nil && !sb.init.alive():
		return fmt.Errorf("%w: sandbox %q was terminated (its init process died); destroy it and create a new one", backend.ErrNotFound, id)
	case sb.init == nil:
		ip, err := b.startInit(opCtx, sb, time.Now().Add(initStartTimeout))
		if err != nil {
			if registry.Destroyed(opCtx) {
				return backend.NotFound(id)
			}
			return err
		}
		sb.init = ip
	}
	if sb.init.warm {
		return nil
	}
	if err := b.warmInit(opCtx, sb, sb.init); err != nil {
		b.stopInit(sb.init)
		sb.init = nil
		if registry.Destroyed(opCtx) {
			return backend.NotFound(id)
		}
		return err
	}
	b.warmCode(opCtx, sb, sb.init)
	sb.init.warm = true
	return nil
}

// warmInit has ip run a command before any client's, so that what a
// sandbox's first command pays once is paid while it waits in the pool:
// init's first receive, spawn and reap (a dozen page faults of its own),
// the sandbox's first fork and exec in its cgroups and namespaces, and the
// daemon's opening of the sandbox's OOM-kill counter. Without it a pool
// member's first command cost ~0.8 ms more CPU than the same command in a
// sandbox that had run one (docs/design.md, "A pool member is ready to
// run"). The command is `true` from the sandbox's PATH or, in a root
// without one, init's own executable, which exits at once
// (initproc.WarmEnv); its streams are /dev/null. The caller holds sb.initMu.
func (b *Backend) warmInit(ctx context.Context, sb *sandbox, ip *initProc) error {
	ip.oom.read() // opens the counter init keeps for every command
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("%w: warm the init of sandbox %s: %v", backend.ErrUnavailable, sb.id, err)
	}
	defer null.Close()
	for _, argv := range [][]string{{"true"}, {"/proc/self/exe"}} {
		spawned, err := b.warmRun(ctx, sb, ip, argv, int(null.Fd()))
		if err != nil || spawned {
			return err
		}
	}
	return nil
}

// warmRun has ip run argv with its streams on null, and reports whether
// init spawned it (it says "started"; a program not found ends without).
func (b *Backend) warmRun(ctx context.Context, sb *sandbox, ip *initProc, argv []string, null int) (spawned bool, err error) {
	failed := func(format string, args ...any) error {
		if ctx.Err() != nil {
			return fmt.Errorf("the init of sandbox %s was not warmed: %w", sb.id, ctx.Err())
		}
		return fmt.Errorf("%w: the init of sandbox %s failed its warm-up command: %s", backend.ErrUnavailable, sb.id, fmt.Sprintf(format, args...))
	}
	run := bwwire.RunRequest{Argv: argv, Env: []string{"PATH=" + guestPath, initproc.WarmEnv + "=1"}, Cwd: guestWorkspace, Timeout: initWarmTimeout}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return false, failed("socketpair: %v", err)
	}
	// Non-blocking: NewFile puts it in the runtime's poller, for deadlines.
	status := os.NewFile(uintptr(pair[0]), "sandbox-warm-status")
	defer status.Close()
	deadline := time.Now().Add(initWarmTimeout + initKillAnswer)
	err = ip.send(run.Encode(), []int{pair[1], null, null, null}, deadline, nil)
	unix.Close(pair[1])
	if err != nil {
		return false, failed("%v", err)
	}
	b.failpoint(FailWarmRunning)
	// The deadline first: the wake-up a cancellation sets must not be
	// overwritten by it.
	if err := status.SetReadDeadline(deadline); err != nil {
		return false, failed("%v", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = status.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, 2*bwwire.MsgSize)
	for {
		n, err := status.Read(buf)
		if err != nil {
			return spawned, failed("%v", err)
		}
		m, err := bwwire.DecodeMsg(buf[:n])
		switch {
		case err == nil && m.Kind == bwwire.MsgStarted && !spawned:
			spawned = true
		case err == nil && (m.Kind == bwwire.MsgExited || m.Kind == bwwire.MsgFailed && !spawned):
			return spawned, nil
		default:
			return spawned, failed("it answered %+v (%v)", m, err)
		}
	}
}

// wireRlimits is rls as bwwire carries them to init.
func wireRlimits(rls []limits.Rlimit) []bwwire.Rlimit {
	out := make([]bwwire.Rlimit, 0, len(rls))
	for _, r := range rls {
		out = append(out, bwwire.Rlimit{Resource: r.Resource, Value: r.Value})
	}
	return out
}
