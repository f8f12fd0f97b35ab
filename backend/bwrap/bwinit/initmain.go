// Package bwinit is what runs inside a bubblewrap sandbox: its init (pid 1
// of the sandbox's PID namespace, which runs each command the daemon sends
// on the control socket and keeps its budget) and its opener (which opens
// paths as the guest for the daemon's file operations). The init's binary
// (cmd/sandbox-sidecar-init) links it, and the daemon's through
// bwrap.InitMain; it imports nothing of the daemon's side (backend/bwrap),
// only the wire both speak (bwwire) and initproc.
package bwinit

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap/bwwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc"
)

// ReapInterval is how often init reaps leftovers while any remain.
const ReapInterval = 1000 // milliseconds

// HotWait is how long after a command ends init waits for the next one
// without telling the Go runtime it blocks (rawPoll): a command that comes
// within it waits that way too, for as long again.
const HotWait = 50 * time.Millisecond

// IsInit reports whether this process is a sandbox's init: started by
// the bubblewrap backend inside a sandbox's namespaces, with
// bwwire.InitEnv set.
func IsInit() bool { return initproc.Is(bwwire.InitEnv) }

// Main runs a sandbox's init, or its opener (opener.go), and never returns
// when this process is one; otherwise it returns at once and does nothing.
// The init's binary (cmd/sandbox-sidecar-init) calls it first thing, and so
// does the daemon's, through bwrap.InitMain, for when it runs its own
// executable as init. The opener is init's executable again, run by init;
// so is the warm-up command of a pool member whose root has no `true`
// (initproc.WarmMain), which exits 0 at once.
func Main() {
	initproc.WarmMain()
	initproc.Main(openerEnv, runOpener)
	initproc.Main(agent.KeeperEnv, agent.RunKeeper)
	initproc.Main(bwwire.InitEnv, runInit)
}

// What a hostile guest can do to init, and why it does not help it:
//
//   - See it: init is pid 1 of the sandbox's PID namespace, so ps shows it.
//   - Signal it: the kernel delivers a signal sent from inside the namespace
//     to its pid 1 only if pid 1 handles it, and never SIGKILL or SIGSTOP.
//     Go's runtime handles most signals and does nothing with them; init
//     routes the twelve that would end a Go program to a channel it never
//     reads (initproc.ShieldedSignals: Notify, not SIG_IGN, which its
//     commands would inherit), and leaves the job-control ones at their
//     default, which the kernel does not deliver to pid 1 from inside. So
//     none of them stops or kills it.
//   - Read or trace it: init makes itself non-dumpable first thing, so its
//     memory, descriptors, environment and ptrace need CAP_SYS_PTRACE in the
//     sandbox's user namespace, which no guest process has (bwrap drops all
//     capabilities and sets no_new_privs).
//   - Talk to it: the control socket is a socketpair whose only end inside
//     the sandbox is init's fd 3, close-on-exec, so no command inherits it
//     and /proc/1/fd is closed to the guest. Each command's status socket
//     is likewise init's alone.
//   - Starve it: a command may fork or allocate until the kernel refuses;
//     init then fails to start the next command and says so, or the OOM
//     killer picks it and the sandbox is reported terminated. Init starts
//     its threads before any command (initproc.ReserveThreads) when the
//     sandbox's cgroup caps its pids, so a command holding every pid of
//     the group cannot leave its runtime without one (backend/bwrap's reservedThreads).
//     Everything a command started is killed when it ends, so no guest
//     process lives between commands.
//
// Init still re-checks every message and descriptor it receives, bounds
// what it reads, and keeps every command's budget itself: a timerfd fires
// at the budget (SIGTERM and SIGCONT to the command's process group, as
// GNU timeout did) and again once the grace is spent too (SIGKILL to every
// process of the sandbox, so neither a process that ignores SIGTERM nor
// one that left the group survives). The command is exec'd directly: a
// command string is the sandbox's own /bin/sh -c, an argv its program.

// initState is init's whole state: the control socket, the timer that
// keeps a command's budget, and at most one running command.
type initState struct {
	ctrl     int
	timer    int // a timerfd (CLOCK_MONOTONIC), armed while a command runs
	cmd      *initCommand
	children bool // some child may still be unreaped
	opener   openerChild
	ctrlHup  bool           // the control socket hung up while a command ran
	rbuf     []byte         // receives control messages: a header and an inline request
	hotUntil time.Time      // the end of HotWait after the last command
	hot      bool           // the message being received came during it
	procs    agent.Table    // the keepers of durable processes
	code     agent.Contexts // the code contexts and their zygote
	// listen is the socket a restarted daemon connects to (bwwire.ListenFD),
	// -1 without one: init then exits when its daemon goes, as it did
	// before durable processes.
	listen int
}

// initCommand is the command init is running.
type initCommand struct {
	pid       int
	pidfd     int // readable once it exits; -1 if the kernel gave none
	status    int // the command's status socket
	killed    bool
	killAfter time.Duration // SIGTERM to SIGKILL once the budget is spent
	timed     uint32        // TimedNo, TimedTerm or TimedKill: what the timer has done
	hotUntil  time.Time     // it came within HotWait of the last one: waits use rawPoll until then
}

// init ties a sandbox's init to its bwrap: it ends with bwrap (which the
// daemon kills to stop it) and, as pid 1, takes the sandbox with it; bwrap
// itself does not end with the daemon, so the sandbox outlives a daemon
// that dies or restarts. Here, not in runInit: a parent-death signal is an
// attribute of the thread that sets it, and the kernel looks at the main
// thread's, which package initialisation alone is sure to run on (the
// runtime locks the main goroutine to it until main starts).
func init() {
	if IsInit() {
		tiedToBwrap = unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0)
	}
}

// tiedToBwrap is what init's parent-death signal's prctl returned.
var tiedToBwrap error

func runInit() int {
	if tiedToBwrap != nil {
		return initFail("cannot tie itself to its bwrap: %v", tiedToBwrap)
	}
	// Named, non-dumpable, pid 1, signals shielded (initproc.Become).
	if err := initproc.Become("the sandbox's PID namespace"); err != nil {
		return initFail("%v", err)
	}
	// Requests can be megabytes; keep the heap small between them.
	debug.SetGCPercent(25)
	// Threads first: a command may take every pid of the sandbox's group
	// (a fork bomb), and a Go runtime that cannot start a thread when it
	// needs one dies ("failed to create new OS thread"). The daemon says
	// how many (none without a pids limit: backend/bwrap's reservedThreads).
	initproc.ReserveThreads(bwwire.DecodeThreads(os.Getenv(bwwire.ThreadsEnv)))

	if err := checkControlSocket(bwwire.ControlFD); err != nil {
		return initFail("fd %d is not the control socket: %v", bwwire.ControlFD, err)
	}
	listen := listenerAt(bwwire.ListenFD)
	// The sandbox's rlimits, before any command: every command inherits
	// them. (Lowering a limit needs no privilege.)
	if err := applyOwnRlimits(os.Getenv(bwwire.RlimitsEnv)); err != nil {
		return initFail("cannot set the sandbox's rlimits: %v", err)
	}
	if err := closeInheritedFDs(); err != nil {
		return initFail("cannot close inherited descriptors: %v", err)
	}
	if _, err := unix.FcntlInt(bwwire.ControlFD, unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		return initFail("cannot mark the control socket close-on-exec: %v", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return initFail("chdir /: %v", err)
	}
	timer, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC|unix.TFD_NONBLOCK)
	if err != nil {
		return initFail("cannot make the timer that keeps commands' budgets: %v", err)
	}
	st := &initState{ctrl: bwwire.ControlFD, timer: timer, opener: openerChild{pid: -1, sock: -1},
		procs: agent.Table{Exe: "/proc/self/exe", Stderr: 2, Failpoint: os.Getenv(agent.KeeperFailpointEnv)}, listen: listen}
	if err := unix.Sendmsg(st.ctrl, bwwire.Msg{Kind: bwwire.MsgReady}.Encode(), nil, nil, unix.MSG_NOSIGNAL); err != nil {
		return initFail("cannot tell the daemon it is ready: %v", err)
	}
	for {
		if st.cmd == nil {
			if gone := st.idle(); gone {
				if st.listen < 0 {
					return 0
				}
				// Its daemon went (died, or stopped and left this
				// sandbox to the next one): init and everything it runs
				// go on, and the next daemon connects to the listener.
				st.daemonGone()
			}
		} else {
			st.busy()
		}
	}
}

// listenerAt makes fd, a seqpacket socket the daemon bound in the
// sandbox's directory, init's listening socket (close-on-exec), or returns
// -1 when it is not one. Init, not the daemon, calls listen(2): the kernel
// then gives a connecting daemon init's own pid and credentials as its
// peer's (SO_PEERCRED), which is how it knows what it reached.
func listenerAt(fd int) int {
	if err := checkControlSocket(fd); err != nil {
		return -1
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		return -1
	}
	if err := unix.Listen(fd, 4); err != nil {
		return -1
	}
	return fd
}

// daemonGone closes the control socket whose daemon went; until another
// connects, init serves its processes alone.
func (st *initState) daemonGone() {
	if st.ctrl >= 0 {
		_ = unix.Close(st.ctrl)
		st.ctrl = -1
	}
	st.ctrlHup = true
}

// reattach takes a new daemon's connection on the listener as the control
// socket and says it is ready again.
func (st *initState) reattach() {
	fd, _, err := unix.Accept4(st.listen, unix.SOCK_CLOEXEC)
	if err != nil {
		return
	}
	if st.ctrl >= 0 {
		// A new daemon: the previous one is gone (one daemon per state
		// directory holds its lock), whatever its socket still says.
		_ = unix.Close(st.ctrl)
	}
	st.ctrl, st.ctrlHup = fd, false
	_ = unix.Sendmsg(fd, bwwire.Msg{Kind: bwwire.MsgReady, A: 1}.Encode(), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
}

func initFail(format string, args ...any) int { return initproc.Fail(format, args...) }

func checkControlSocket(fd int) error {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return err
	}
	domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return err
	}
	if typ != unix.SOCK_SEQPACKET || domain != unix.AF_UNIX {
		return fmt.Errorf("socket type %d domain %d", typ, domain)
	}
	return nil
}

// closeInheritedFDs closes every descriptor above the control socket that
// init inherited (the executable bwrap ran, anything bwrap left open):
// those without close-on-exec. The Go runtime's own are close-on-exec.
func closeInheritedFDs() error {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	dirFD := int(d.Fd())
	if err != nil {
		d.Close()
		return err
	}
	for _, name := range names {
		fd, err := strconv.Atoi(name)
		if err != nil || fd <= bwwire.ControlFD || fd == dirFD || fd == bwwire.ListenFD {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err == nil && flags&unix.FD_CLOEXEC == 0 {
			_ = unix.Close(fd)
		}
	}
	return d.Close()
}

// idle waits for the next command. It reports true when the daemon has
// gone (its end of the control socket closed), so init should exit.
func (st *initState) idle() bool {
	if st.ctrlHup && st.ctrl >= 0 {
		return true
	}
	timeout := -1
	if st.children {
		timeout = ReapInterval
	}
	// The control socket first (fds[0]), or a placeholder poll skips
	// while no daemon is connected; then the listener, then the keepers.
	fds := []unix.PollFd{{Fd: int32(st.ctrl), Events: unix.POLLIN}, {Fd: int32(st.listen), Events: unix.POLLIN}}
	fds = st.code.PollFDs(st.procs.PollFDs(fds))
	poll := unix.Poll
	st.hot = false
	if left := time.Until(st.hotUntil); left > 0 {
		poll, st.hot = rawPoll, true
		if timeout < 0 || left < time.Duration(timeout)*time.Millisecond {
			timeout = int((left + time.Millisecond - 1) / time.Millisecond)
		}
	}
	if _, err := poll(fds, timeout); err != nil && !errors.Is(err, unix.EINTR) {
		fmt.Fprintf(os.Stderr, "sandbox init: poll: %v\n", err)
		return true
	}
	st.keepersSaid(fds[2:])
	st.reap()
	if fds[1].Revents != 0 {
		st.reattach()
		return false
	}
	switch ev := fds[0].Revents; {
	case ev&unix.POLLIN != 0:
		return st.receive()
	case ev&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0:
		fmt.Fprintf(os.Stderr, "sandbox init: the control socket hung up (%#x); exiting\n", ev)
		return true
	}
	return false
}

// busy waits for the running command to end, for its budget's timer or
// for the daemon to ask for it to be killed, reaping as it goes.
func (st *initState) busy() {
	c := st.cmd
	fds := make([]unix.PollFd, 0, 4)
	if c.pidfd >= 0 {
		fds = append(fds, unix.PollFd{Fd: int32(c.pidfd), Events: unix.POLLIN})
	}
	if !c.killed {
		fds = append(fds, unix.PollFd{Fd: int32(c.status), Events: unix.POLLIN})
	}
	if !st.ctrlHup {
		// File operations' open requests come while a command runs too.
		fds = append(fds, unix.PollFd{Fd: int32(st.ctrl), Events: unix.POLLIN})
	}
	if st.listen >= 0 {
		fds = append(fds, unix.PollFd{Fd: int32(st.listen), Events: unix.POLLIN})
	}
	if c.timed != bwwire.TimedKill {
		fds = append(fds, unix.PollFd{Fd: int32(st.timer), Events: unix.POLLIN})
	}
	fds = st.code.PollFDs(st.procs.PollFDs(fds))
	timeout := ReapInterval
	if c.pidfd < 0 {
		timeout = 20
	}
	poll := unix.Poll
	if left := time.Until(c.hotUntil); left > 0 {
		// Only a command's first HotWait: a long one then waits the
		// ordinary way, without the runtime's preemption signal.
		poll = rawPoll
		timeout = min(timeout, int((left+time.Millisecond-1)/time.Millisecond))
	}
	if _, err := poll(fds, timeout); err != nil && !errors.Is(err, unix.EINTR) {
		fmt.Fprintf(os.Stderr, "sandbox init: poll: %v\n", err)
	}
	exited := false
	for _, p := range fds {
		exited = exited || int(p.Fd) == c.pidfd && p.Revents != 0
	}
	for _, p := range fds {
		switch {
		case p.Revents == 0:
		case int(p.Fd) == st.ctrl && !st.ctrlHup:
			// The daemon gone mid-command (a hang-up) is left to idle,
			// once the command is over.
			if p.Revents&unix.POLLIN == 0 || st.receive() {
				st.ctrlHup = true
			}
		case int(p.Fd) == st.listen:
			st.reattach()
		case int(p.Fd) == c.status:
			// The daemon shut down its side: the command's budget is spent
			// or its request is gone. Whatever arrived, the answer is the
			// same.
			var buf [bwwire.MsgSize]byte
			_, _, _ = unix.Recvfrom(c.status, buf[:], unix.MSG_DONTWAIT)
			st.killAllButInit()
			c.killed = true
		case int(p.Fd) == st.timer && !exited && !c.killed:
			// (A command that exited as its budget ran out ended in
			// time: the reap below reports it as it is. One the daemon
			// had killed is not a timeout of init's.)
			st.budgetSpent(c)
		default:
			if !st.procs.Handle(int(p.Fd)) {
				st.code.Handle(int(p.Fd))
			}
		}
	}
	st.reap()
}

// keepersSaid reads what each keeper whose socket is ready said.
func (st *initState) keepersSaid(fds []unix.PollFd) {
	for _, p := range fds {
		if p.Revents != 0 && !st.procs.Handle(int(p.Fd)) {
			st.code.Handle(int(p.Fd))
		}
	}
}

// rawPoll is poll(2) without telling the Go runtime that a system call
// blocks. Init's one goroutine keeps its P while it waits, so the runtime's
// monitor thread (sysmon) finds nothing to take back or hand off and backs
// off to sleeping 10ms at a time. With unix.Poll, every wait hands the P
// off (waking a spinning thread) and lets sysmon sleep, and the first
// system call after it wakes sysmon again to run every 20µs for a
// millisecond: per command, a dozen or more wake-ups on the cores the
// command itself needs. rawPoll is used only while commands come back to
// back, and for such a command's first HotWait: a goroutine that keeps
// its P for 10ms gets the runtime's preemption signal (SIGURG), which ends
// the wait early (EINTR, and the caller's loop comes back), about a hundred
// times a second; an idle init, or one running a long command, must not pay
// that, so it waits with unix.Poll.
func rawPoll(fds []unix.PollFd, timeout int) (int, error) {
	var ts *unix.Timespec
	if timeout >= 0 {
		t := unix.NsecToTimespec(int64(timeout) * int64(time.Millisecond))
		ts = &t
	}
	n, _, errno := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), uintptr(len(fds)), uintptr(unsafe.Pointer(ts)), 0, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// budgetSpent acts on the budget's timer: at the budget, SIGTERM (and
// SIGCONT, so a stopped process gets it) to the command's process group
// and the timer set for the grace; once the grace is spent too, SIGKILL to
// every process of the sandbox.
func (st *initState) budgetSpent(c *initCommand) {
	var expirations [8]byte
	if n, err := unix.Read(st.timer, expirations[:]); n != len(expirations) || err != nil {
		return // not fired after all (EAGAIN)
	}
	switch c.timed {
	case bwwire.TimedNo:
		c.timed = bwwire.TimedTerm
		_ = unix.Kill(-c.pid, unix.SIGTERM)
		_ = unix.Kill(-c.pid, unix.SIGCONT)
		if c.killAfter > 0 {
			st.arm(c.killAfter)
			return
		}
		fallthrough
	case bwwire.TimedTerm:
		c.timed = bwwire.TimedKill
		st.killAllButInit()
	}
}

// arm sets the timer to fire once, d from now; 0 disarms it.
func (st *initState) arm(d time.Duration) {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	_ = unix.TimerfdSettime(st.timer, 0, &spec, nil)
}

// reap collects every exited child; the running command's status ends it.
func (st *initState) reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG|unix.WALL, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ECHILD):
			st.children = false
			return
		case err != nil:
			return
		case pid == 0:
			st.children = true
			return
		}
		if pid == st.opener.pid {
			st.dropOpener()
		}
		if st.procs.Reaped(pid) || st.code.Reaped(pid) {
			continue
		}
		if st.cmd != nil && pid == st.cmd.pid {
			st.finish(ws)
		}
	}
}

// finish reports the command's end, after killing everything it left.
func (st *initState) finish(ws unix.WaitStatus) {
	c := st.cmd
	st.cmd = nil
	st.hotUntil = time.Now().Add(HotWait)
	st.arm(0)
	// A command's processes end with it: background jobs, setsid and
	// double-fork escapees alike. Only init and its children were in the
	// namespace before it started. Reaping what else has ended says whether
	// any is left: with no child, init is the only process of its
	// namespace. Every other one descends from init (its pid 1; nothing
	// joins the namespace from outside, and an orphan is re-parented to
	// init, or to a subreaper that is itself a live descendant, before its
	// parent can be reaped), so none is left, nor anything to fork one.
	// Then the kill is skipped, as it is after most commands: kill(-1)
	// walks every process of the host (the kernel has no per-namespace
	// list), ~8 µs per command with a thousand host processes, under the
	// lock every fork on the host takes.
	// TestBwrapBackgroundProcessesEndWithTheirCommand checks the other case.
	st.children = true // unless reap sees ECHILD
	st.reap()          // st.cmd is nil: this does not come back here
	if st.children {
		st.killAllButInit()
	}
	st.dropOpener() // killed too: the next open starts another
	m := bwwire.Msg{Kind: bwwire.MsgExited, C: c.timed}
	switch {
	case ws.Exited():
		m.A, m.B = bwwire.EndExited, uint32(ws.ExitStatus())
	case ws.Signaled() && ws.CoreDump():
		m.A, m.B = bwwire.EndDumped, uint32(ws.Signal())
	default:
		m.A, m.B = bwwire.EndKilled, uint32(ws.Signal())
	}
	_ = unix.Sendmsg(c.status, m.Encode(), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
	_ = unix.Close(c.status)
	if c.pidfd >= 0 {
		_ = unix.Close(c.pidfd)
	}
}

// killAllButInit ends every process of the namespace but init itself and,
// when durable processes run, their keepers and everything under them.
// Without keepers it is one kill(-1), which the kernel makes race-free
// against fork: a process that is forking when the signal arrives either
// has its child in the list already or abandons the fork. With keepers it
// is agent.Table.KillForeground: every direct child of init but the
// keepers, pass after pass (a keeper's descendants are never init's).
func (st *initState) killAllButInit() {
	if !st.procs.Busy() {
		_ = unix.Kill(-1, unix.SIGKILL)
		return
	}
	st.procs.KillForeground(os.Getpid())
}

// receive reads one message from the control socket and starts the command
// it asks for. It reports true when the daemon has gone.
func (st *initState) receive() bool {
	if st.rbuf == nil {
		st.rbuf = make([]byte, bwwire.MsgSize+bwwire.MaxInlineRequest)
	}
	buf := st.rbuf
	oob := make([]byte, unix.CmsgSpace(4*(bwwire.RunFDs+3)))
	n, oobn, flags, _, err := unix.Recvmsg(st.ctrl, buf, oob, unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT)
	switch {
	case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
		return false
	case err != nil:
		fmt.Fprintf(os.Stderr, "sandbox init: read the control socket: %v\n", err)
		return true
	case n == 0 && oobn == 0:
		fmt.Fprintf(os.Stderr, "sandbox init: the daemon closed the control socket; exiting\n")
		return true
	}
	fds := bwwire.ReceivedFDs(oob[:oobn])
	taken := make([]bool, len(fds))
	defer func() {
		for i, fd := range fds {
			if !taken[i] {
				_ = unix.Close(fd)
			}
		}
	}()
	var m bwwire.Msg
	var payload []byte
	if n < bwwire.MsgSize {
		err = fmt.Errorf("%w: %d bytes, want at least %d", bwwire.ErrBadMessage, n, bwwire.MsgSize)
	} else {
		m, err = bwwire.DecodeMsg(buf[:bwwire.MsgSize])
		payload = buf[bwwire.MsgSize:n]
	}
	wantFDs := bwwire.RunFDs
	if m.A != 0 {
		wantFDs = bwwire.InlineFDs
	}
	switch {
	case err != nil:
	case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0:
		err = fmt.Errorf("%w: truncated", bwwire.ErrBadMessage)
	case m.Kind == bwwire.MsgOpen && len(fds) == 1 && len(payload) == 0:
		taken[0] = true
		st.forwardOpen(fds[0])
		return false
	case m.Kind == bwwire.MsgProcStart:
		for i := range taken {
			taken[i] = true
		}
		st.startProc(m, payload, fds)
		return false
	case (m.Kind == bwwire.MsgProcSignal || m.Kind == bwwire.MsgProcList) && len(fds) == 1:
		taken[0] = true // procRequest closes it
		st.procRequest(m, payload, fds[0])
		return false
	case m.Kind == bwwire.MsgCode:
		for i := range taken {
			taken[i] = true
		}
		st.runCell(m, payload, fds)
		return false
	case (m.Kind == bwwire.MsgContextList || m.Kind == bwwire.MsgContextDelete || m.Kind == bwwire.MsgContextRestart) && len(fds) == 1:
		taken[0] = true // contextRequest closes it
		st.contextRequest(m, payload, fds[0])
		return false
	case m.Kind == bwwire.MsgCodeWarm && len(fds) == 1:
		taken[0] = true // answered once the zygote is ready
		st.warmCode(m, payload, fds[0])
		return false
	case m.Kind != bwwire.MsgRun:
		err = fmt.Errorf("%w: kind %d on the control socket", bwwire.ErrBadMessage, m.Kind)
	case int64(m.A) != int64(len(payload)):
		err = fmt.Errorf("%w: a request of %d bytes said %d", bwwire.ErrBadMessage, len(payload), m.A)
	case len(fds) != wantFDs:
		err = fmt.Errorf("%w: %d descriptors, want %d", bwwire.ErrBadMessage, len(fds), wantFDs)
	case st.cmd != nil:
		err = fmt.Errorf("%w: a command while another runs", bwwire.ErrBadMessage)
	}
	if err != nil {
		// Dropping the descriptors closes the status socket, which the
		// daemon reads as a refusal.
		fmt.Fprintf(os.Stderr, "sandbox init: ignoring a message: %v\n", err)
		return false
	}
	status, stdio := fds[0], fds[len(fds)-3:]
	if err := checkStatusSocket(status); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox init: ignoring a request: %v\n", err)
		return false
	}
	var req bwwire.RunRequest
	var size int64
	if m.A != 0 {
		// The strings decoded are copies: rbuf is the next message's.
		req, err = bwwire.DecodeRunRequest(payload)
		size = int64(len(payload))
	} else {
		req, size, err = readRequest(fds[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandbox init: ignoring a request: %v\n", err)
		return false
	}
	taken[0] = true
	st.start(req, status, stdio)
	if size > largeRequestBytes {
		// Give the memory of a large request back now rather than keep
		// it for the life of the sandbox.
		debug.FreeOSMemory()
	}
	return false
}

// largeRequestBytes is the request size above which init returns memory
// to the system at once.
const largeRequestBytes = 256 << 10

func checkStatusSocket(fd int) error {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil || typ != unix.SOCK_SEQPACKET {
		return fmt.Errorf("%w: the status descriptor is not a seqpacket socket", bwwire.ErrBadMessage)
	}
	return nil
}

// readRequest reads the request memfd, refusing anything but a regular
// file within bwwire.MaxRequestBytes.
func readRequest(fd int) (bwwire.RunRequest, int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return bwwire.RunRequest{}, 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size < 0 || st.Size > bwwire.MaxRequestBytes {
		return bwwire.RunRequest{}, 0, fmt.Errorf("%w: the request is not a regular file within %d bytes", bwwire.ErrBadMessage, bwwire.MaxRequestBytes)
	}
	buf := make([]byte, st.Size)
	for off := 0; off < len(buf); {
		n, err := unix.Pread(fd, buf[off:], int64(off))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return bwwire.RunRequest{}, 0, err
		}
		if n == 0 {
			return bwwire.RunRequest{}, 0, fmt.Errorf("%w: the request ended early", bwwire.ErrBadMessage)
		}
		off += n
	}
	req, err := bwwire.DecodeRunRequest(buf)
	return req, st.Size, err
}

// start runs the request with stdio as its streams, in a session of its
// own, under its budget, and tells the daemon it started (or why it could
// not). It takes ownership of status.
func (st *initState) start(req bwwire.RunRequest, status int, stdio []int) {
	fail := func(err error, format string, args ...any) {
		msg := fmt.Sprintf("sandbox: "+format+"\n", args...)
		_, _ = unix.Write(stdio[2], []byte(msg))
		errno, _ := errors.AsType[unix.Errno](err)
		_ = unix.Sendmsg(status, bwwire.Msg{Kind: bwwire.MsgFailed, A: uint32(errno)}.Encode(), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
		_ = unix.Close(status)
	}
	// Not there, or not runnable: the status a shell gives (127, 126),
	// as GNU timeout did in front of it.
	notRunnable := func(err error) {
		msg := fmt.Sprintf("sandbox: cannot run %s: %v\n", truncate(req.Argv[0], 256), err)
		_, _ = unix.Write(stdio[2], []byte(msg))
		m := bwwire.Msg{Kind: bwwire.MsgExited, A: bwwire.EndExited, B: uint32(initproc.NotRunnableStatus(err))}
		_ = unix.Sendmsg(status, m.Encode(), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
		_ = unix.Close(status)
	}
	var fi unix.Stat_t
	if err := unix.Stat(req.Cwd, &fi); err != nil {
		fail(err, "cannot change directory to %s: %v", req.Cwd, err)
		return
	} else if fi.Mode&unix.S_IFMT != unix.S_IFDIR {
		fail(unix.ENOTDIR, "cannot change directory to %s: not a directory", req.Cwd)
		return
	} else if err := unix.Access(req.Cwd, unix.X_OK); err != nil {
		// Checked here so that the fork's own errors below are the
		// program's alone.
		fail(err, "cannot change directory to %s: %v", req.Cwd, err)
		return
	}
	prog, err := initproc.LookPath(req.Argv[0], req.Env)
	if err != nil {
		notRunnable(err)
		return
	}
	pidfd := -1
	// Spawn, not syscall.ForkExec: its child makes only the calls the
	// command needs, not the Go runtime's ~60 signal-handler resets and
	// its error pipe, all of them between the fork and the exec, which
	// init waits for (docs/benchmarks-history.md, "A command in a bwrap
	// sandbox").
	pid, err := initproc.Spawn(prog, req.Argv, initproc.SpawnAttr{
		Dir: req.Cwd, Env: req.Env, Stdio: [3]int{stdio[0], stdio[1], stdio[2]}, PidFD: &pidfd,
	})
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.ENOEXEC) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENOTDIR) {
		notRunnable(err)
		return
	}
	if err != nil {
		fail(err, "cannot start the command in %s: %v", req.Cwd, err)
		return
	}
	// The budget runs from the fork, as GNU timeout's did from its own.
	st.arm(req.Timeout)
	st.children = true
	st.cmd = &initCommand{pid: pid, pidfd: pidfd, status: status, killAfter: req.KillAfter}
	if st.hot {
		st.cmd.hotUntil = time.Now().Add(HotWait)
	}
	_ = unix.Sendmsg(status, bwwire.Msg{Kind: bwwire.MsgStarted, A: uint32(pid)}.Encode(), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// applyOwnRlimits sets the rlimits in bwwire.RlimitsEnv on the calling process.
//
// Without an open-files limit (open_files 0) it sets NOFILE's soft limit
// to its hard one: the Go runtime raised init's own soft limit to one
// below the hard at start, and initproc.Spawn, unlike the runtime's own
// fork, does not put the original back in the command; the command would
// inherit that odd figure. Soft = hard is what a sandbox gets with a
// limit, and what the gVisor backend's commands get without one.
func applyOwnRlimits(env string) error {
	rls, err := bwwire.DecodeRlimits(env)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(rls, func(r bwwire.Rlimit) bool { return r.Resource == unix.RLIMIT_NOFILE }) {
		var cur unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &cur); err != nil {
			return fmt.Errorf("getrlimit NOFILE: %w", err)
		}
		rls = append(rls, bwwire.Rlimit{Resource: unix.RLIMIT_NOFILE, Value: cur.Max})
	}
	for _, r := range rls {
		// A limit above the hard limit init was started with cannot be
		// raised without privilege: keep the (stricter) hard limit.
		var cur unix.Rlimit
		if err := unix.Getrlimit(r.Resource, &cur); err == nil && r.Value > cur.Max {
			r.Value = cur.Max
		}
		lim := unix.Rlimit{Cur: r.Value, Max: r.Value}
		if err := unix.Setrlimit(r.Resource, &lim); err != nil {
			return fmt.Errorf("setrlimit %d=%d: %w", r.Resource, r.Value, err)
		}
	}
	return nil
}
