package bwrap

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc"
)

// initEnv is set (to "1") in the environment bwrap gives a sandbox's init,
// and nowhere else: it is how the daemon's binary, re-executed inside the
// sandbox, knows it is init.
const initEnv = "SANDBOX_SIDECAR_INIT"

// initThreads is how many OS threads init starts before any command, so
// that its runtime finds an idle one whenever it needs one later, when the
// sandbox's processes and threads are capped (reservedThreads).
const initThreads = 8

// reservedThreads is how many threads sb's init reserves: initThreads when
// its own cgroup caps its processes and threads (pids.max), which a fork
// bomb fills; none when nothing of the sandbox's own does. Then no pid
// runs out before the host's (or an enclosing unit's TasksMax, shared with
// the daemon and every other sandbox), which a reserve of this init's
// would not make safe, and every pid of the namespace still dies with the
// command (init's kill at its budget, or the kernel's with init).
func (sb *sandbox) reservedThreads() int {
	if sb.cg != nil && sb.limits.PIDs > 0 {
		return initThreads
	}
	return 0
}

// initReapInterval is how often init reaps leftovers while any remain.
const initReapInterval = 1000 // milliseconds

// initHotWait is how long after a command ends init waits for the next one
// without telling the Go runtime it blocks (rawPoll): a command that comes
// within it waits that way too, for as long again.
const initHotWait = 50 * time.Millisecond

// IsInit reports whether this process is a sandbox's init: the daemon's own
// binary, started by this package inside a sandbox's namespaces.
func IsInit() bool { return initproc.Is(initEnv) }

// InitMain runs a sandbox's init and never returns when IsInit is true;
// otherwise it returns at once and does nothing. The daemon's main function
// calls it first thing, before flags or logging, and so does every test
// binary that creates sandboxes (in TestMain): the init of a sandbox is the
// daemon's own executable, run again inside the sandbox.
// The sandbox's opener (opener.go) is the same binary again, run by init.
func InitMain() {
	initproc.Main(openerEnv, runOpener)
	initproc.Main(initEnv, runInit)
}

// What a hostile guest can do to init, and why it does not help it:
//
//   - See it: init is pid 1 of the sandbox's PID namespace, so ps shows it.
//   - Signal it: the kernel delivers a signal sent from inside the namespace
//     to its pid 1 only if pid 1 handles it, and never SIGKILL or SIGSTOP.
//     Init routes every catchable signal to a channel it never reads
//     (Notify, not SIG_IGN, which its commands would inherit), so none of
//     them stops or kills it.
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
//     the group cannot leave its runtime without one (reservedThreads).
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
	ctrlHup  bool      // the control socket hung up while a command ran
	rbuf     []byte    // receives control messages: a header and an inline request
	hotUntil time.Time // the end of initHotWait after the last command
	hot      bool      // the message being received came during it
}

// initCommand is the command init is running.
type initCommand struct {
	pid       int
	pidfd     int // readable once it exits; -1 if the kernel gave none
	status    int // the command's status socket
	killed    bool
	killAfter time.Duration // SIGTERM to SIGKILL once the budget is spent
	timed     uint32        // timedNo, timedTerm or timedKill: what the timer has done
	hotUntil  time.Time     // it came within initHotWait of the last one: waits use rawPoll until then
}

func runInit() int {
	// Named, non-dumpable, pid 1, signals shielded (initproc.Become).
	if err := initproc.Become("the sandbox's PID namespace"); err != nil {
		return initFail("%v", err)
	}
	// Requests can be megabytes; keep the heap small between them.
	debug.SetGCPercent(25)
	// Threads first: a command may take every pid of the sandbox's group
	// (a fork bomb), and a Go runtime that cannot start a thread when it
	// needs one dies ("failed to create new OS thread"). The daemon says
	// how many (none without a pids limit: reservedThreads).
	initproc.ReserveThreads(decodeInitThreads(os.Getenv(initThreadsEnv)))

	if err := checkControlSocket(initControlFD); err != nil {
		return initFail("fd %d is not the control socket: %v", initControlFD, err)
	}
	// The sandbox's rlimits, before any command: every command inherits
	// them. (Lowering a limit needs no privilege.)
	if err := applyOwnRlimits(os.Getenv(initRlimitsEnv)); err != nil {
		return initFail("cannot set the sandbox's rlimits: %v", err)
	}
	if err := closeInheritedFDs(); err != nil {
		return initFail("cannot close inherited descriptors: %v", err)
	}
	if _, err := unix.FcntlInt(initControlFD, unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		return initFail("cannot mark the control socket close-on-exec: %v", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return initFail("chdir /: %v", err)
	}
	timer, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC|unix.TFD_NONBLOCK)
	if err != nil {
		return initFail("cannot make the timer that keeps commands' budgets: %v", err)
	}
	st := &initState{ctrl: initControlFD, timer: timer, opener: openerChild{pid: -1, sock: -1}}
	if err := unix.Sendmsg(st.ctrl, initMsg{kind: msgReady}.encode(), nil, nil, unix.MSG_NOSIGNAL); err != nil {
		return initFail("cannot tell the daemon it is ready: %v", err)
	}
	for {
		if st.cmd == nil {
			if done := st.idle(); done {
				return 0
			}
		} else {
			st.busy()
		}
	}
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
		if err != nil || fd <= initControlFD || fd == dirFD {
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
	if st.ctrlHup {
		return true
	}
	timeout := -1
	if st.children {
		timeout = initReapInterval
	}
	fds := []unix.PollFd{{Fd: int32(st.ctrl), Events: unix.POLLIN}}
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
	st.reap()
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
	if c.timed != timedKill {
		fds = append(fds, unix.PollFd{Fd: int32(st.timer), Events: unix.POLLIN})
	}
	timeout := initReapInterval
	if c.pidfd < 0 {
		timeout = 20
	}
	poll := unix.Poll
	if left := time.Until(c.hotUntil); left > 0 {
		// Only a command's first initHotWait: a long one then waits the
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
		case int(p.Fd) == st.ctrl:
			// The daemon gone mid-command (a hang-up) is left to idle,
			// which exits once the command is over.
			if p.Revents&unix.POLLIN == 0 || st.receive() {
				st.ctrlHup = true
			}
		case int(p.Fd) == c.status:
			// The daemon shut down its side: the command's budget is spent
			// or its request is gone. Whatever arrived, the answer is the
			// same.
			var buf [initMsgSize]byte
			_, _, _ = unix.Recvfrom(c.status, buf[:], unix.MSG_DONTWAIT)
			killAllButInit()
			c.killed = true
		case int(p.Fd) == st.timer && !exited && !c.killed:
			// (A command that exited as its budget ran out ended in
			// time: the reap below reports it as it is. One the daemon
			// had killed is not a timeout of init's.)
			st.budgetSpent(c)
		}
	}
	st.reap()
}

// rawPoll is poll(2) without telling the Go runtime that a system call
// blocks. Init's one goroutine keeps its P while it waits, so the runtime's
// monitor thread (sysmon) finds nothing to take back or hand off and backs
// off to sleeping 10ms at a time. With unix.Poll, every wait hands the P
// off (waking a spinning thread) and lets sysmon sleep, and the first
// system call after it wakes sysmon again to run every 20µs for a
// millisecond: per command, a dozen or more wake-ups on the cores the
// command itself needs. rawPoll is used only while commands come back to
// back, and for such a command's first initHotWait: a goroutine that keeps
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
	case timedNo:
		c.timed = timedTerm
		_ = unix.Kill(-c.pid, unix.SIGTERM)
		_ = unix.Kill(-c.pid, unix.SIGCONT)
		if c.killAfter > 0 {
			st.arm(c.killAfter)
			return
		}
		fallthrough
	case timedTerm:
		c.timed = timedKill
		killAllButInit()
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
		if st.cmd != nil && pid == st.cmd.pid {
			st.finish(ws)
		}
	}
}

// finish reports the command's end, after killing everything it left.
func (st *initState) finish(ws unix.WaitStatus) {
	c := st.cmd
	st.cmd = nil
	st.hotUntil = time.Now().Add(initHotWait)
	st.arm(0)
	// A command's processes end with it: background jobs, setsid and
	// double-fork escapees alike. Only init and its children were in the
	// namespace before it started.
	killAllButInit()
	st.children = true
	st.dropOpener() // killed too: the next open starts another
	m := initMsg{kind: msgExited, c: c.timed}
	switch {
	case ws.Exited():
		m.a, m.b = endExited, uint32(ws.ExitStatus())
	case ws.Signaled() && ws.CoreDump():
		m.a, m.b = endDumped, uint32(ws.Signal())
	default:
		m.a, m.b = endKilled, uint32(ws.Signal())
	}
	_ = unix.Sendmsg(c.status, m.encode(), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
	_ = unix.Close(c.status)
	if c.pidfd >= 0 {
		_ = unix.Close(c.pidfd)
	}
}

// killAllButInit sends SIGKILL to every process of the namespace but init
// itself. The kernel makes this race-free against fork: a process that is
// forking when the signal arrives either has its child in the list already
// or abandons the fork.
func killAllButInit() { _ = unix.Kill(-1, unix.SIGKILL) }

// receive reads one message from the control socket and starts the command
// it asks for. It reports true when the daemon has gone.
func (st *initState) receive() bool {
	if st.rbuf == nil {
		st.rbuf = make([]byte, initMsgSize+maxInlineRequest)
	}
	buf := st.rbuf
	oob := make([]byte, unix.CmsgSpace(4*(initRunFDs+3)))
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
	fds := receivedFDs(oob[:oobn])
	taken := make([]bool, len(fds))
	defer func() {
		for i, fd := range fds {
			if !taken[i] {
				_ = unix.Close(fd)
			}
		}
	}()
	var m initMsg
	var payload []byte
	if n < initMsgSize {
		err = fmt.Errorf("%w: %d bytes, want at least %d", errBadMessage, n, initMsgSize)
	} else {
		m, err = decodeInitMsg(buf[:initMsgSize])
		payload = buf[initMsgSize:n]
	}
	wantFDs := initRunFDs
	if m.a != 0 {
		wantFDs = initInlineFDs
	}
	switch {
	case err != nil:
	case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0:
		err = fmt.Errorf("%w: truncated", errBadMessage)
	case m.kind == msgOpen && len(fds) == 1 && len(payload) == 0:
		taken[0] = true
		st.forwardOpen(fds[0])
		return false
	case m.kind != msgRun:
		err = fmt.Errorf("%w: kind %d on the control socket", errBadMessage, m.kind)
	case int64(m.a) != int64(len(payload)):
		err = fmt.Errorf("%w: a request of %d bytes said %d", errBadMessage, len(payload), m.a)
	case len(fds) != wantFDs:
		err = fmt.Errorf("%w: %d descriptors, want %d", errBadMessage, len(fds), wantFDs)
	case st.cmd != nil:
		err = fmt.Errorf("%w: a command while another runs", errBadMessage)
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
	var req runRequest
	var size int64
	if m.a != 0 {
		// The strings decoded are copies: rbuf is the next message's.
		req, err = decodeRunRequest(payload)
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

// receivedFDs returns every descriptor in SCM_RIGHTS messages of oob.
func receivedFDs(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if got, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds
}

func checkStatusSocket(fd int) error {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil || typ != unix.SOCK_SEQPACKET {
		return fmt.Errorf("%w: the status descriptor is not a seqpacket socket", errBadMessage)
	}
	return nil
}

// readRequest reads the request memfd, refusing anything but a regular
// file within maxRequestBytes.
func readRequest(fd int) (runRequest, int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return runRequest{}, 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size < 0 || st.Size > maxRequestBytes {
		return runRequest{}, 0, fmt.Errorf("%w: the request is not a regular file within %d bytes", errBadMessage, maxRequestBytes)
	}
	buf := make([]byte, st.Size)
	for off := 0; off < len(buf); {
		n, err := unix.Pread(fd, buf[off:], int64(off))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return runRequest{}, 0, err
		}
		if n == 0 {
			return runRequest{}, 0, fmt.Errorf("%w: the request ended early", errBadMessage)
		}
		off += n
	}
	req, err := decodeRunRequest(buf)
	return req, st.Size, err
}

// start runs the request with stdio as its streams, in a session of its
// own, under its budget, and tells the daemon it started (or why it could
// not). It takes ownership of status.
func (st *initState) start(req runRequest, status int, stdio []int) {
	fail := func(err error, format string, args ...any) {
		msg := fmt.Sprintf("sandbox: "+format+"\n", args...)
		_, _ = unix.Write(stdio[2], []byte(msg))
		errno, _ := errors.AsType[unix.Errno](err)
		_ = unix.Sendmsg(status, initMsg{kind: msgFailed, a: uint32(errno)}.encode(), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
		_ = unix.Close(status)
	}
	// Not there, or not runnable: the status a shell gives (127, 126),
	// as GNU timeout did in front of it.
	notRunnable := func(err error) {
		msg := fmt.Sprintf("sandbox: cannot run %s: %v\n", truncate(req.argv[0], 256), err)
		_, _ = unix.Write(stdio[2], []byte(msg))
		m := initMsg{kind: msgExited, a: endExited, b: uint32(initproc.NotRunnableStatus(err))}
		_ = unix.Sendmsg(status, m.encode(), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
		_ = unix.Close(status)
	}
	var fi unix.Stat_t
	if err := unix.Stat(req.cwd, &fi); err != nil {
		fail(err, "cannot change directory to %s: %v", req.cwd, err)
		return
	} else if fi.Mode&unix.S_IFMT != unix.S_IFDIR {
		fail(unix.ENOTDIR, "cannot change directory to %s: not a directory", req.cwd)
		return
	} else if err := unix.Access(req.cwd, unix.X_OK); err != nil {
		// Checked here so that the fork's own errors below are the
		// program's alone.
		fail(err, "cannot change directory to %s: %v", req.cwd, err)
		return
	}
	prog, err := initproc.LookPath(req.argv[0], req.env)
	if err != nil {
		notRunnable(err)
		return
	}
	pidfd := -1
	// Spawn, not syscall.ForkExec: its child makes only the calls the
	// command needs, not the Go runtime's ~60 signal-handler resets and
	// its error pipe, all of them between the fork and the exec, which
	// init waits for (docs/benchmarks.md, "the command path, second cut").
	pid, err := initproc.Spawn(prog, req.argv, initproc.SpawnAttr{
		Dir: req.cwd, Env: req.env, Stdio: [3]int{stdio[0], stdio[1], stdio[2]}, PidFD: &pidfd,
	})
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.ENOEXEC) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENOTDIR) {
		notRunnable(err)
		return
	}
	if err != nil {
		fail(err, "cannot start the command in %s: %v", req.cwd, err)
		return
	}
	// The budget runs from the fork, as GNU timeout's did from its own.
	st.arm(req.timeout)
	st.children = true
	st.cmd = &initCommand{pid: pid, pidfd: pidfd, status: status, killAfter: req.killAfter}
	if st.hot {
		st.cmd.hotUntil = time.Now().Add(initHotWait)
	}
	_ = unix.Sendmsg(status, initMsg{kind: msgStarted, a: uint32(pid)}.encode(), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
