package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/proclog"
)

// KeeperEnv, set to "1" in its environment, makes the init's executable a
// keeper (initproc.Main(KeeperEnv, RunKeeper)); KeeperOOMEnv says it got
// its sandbox's OOM-kill counter as KeeperOOMFD.
const (
	KeeperEnv    = "SANDBOX_SIDECAR_KEEPER"
	KeeperOOMEnv = "SANDBOX_SIDECAR_KEEPER_OOM"
	// KeeperName is a keeper's process name, as ps shows it.
	KeeperName = "sandbox-keeper"
	// KeeperFailpointEnv arms, for tests only, the keeper's one failpoint:
	// "exited" stops every keeper (SIGSTOP to itself, named
	// KeeperFailpointName) between its process's end and its exit record,
	// until something on the host sends it SIGCONT. The daemon passes it on
	// from its own environment (docs/operations.md, "Testing hooks").
	KeeperFailpointEnv  = "SANDBOX_SIDECAR_KEEPER_FAILPOINT"
	KeeperFailpointName = "keeper-fp-exit"
)

// A keeper's descriptors, as its init starts it. 0 is the process's
// stdin; 1 and 2 are init's (a keeper writes only diagnostics to 2).
const (
	KeeperSockFD   = 3 // its end of a seqpacket pair with init
	KeeperStdoutFD = 4 // the stdout log (proclog), made by the daemon
	KeeperStderrFD = 5 // the stderr log
	KeeperExitFD   = 6 // the empty exit file
	KeeperReqFD    = 7 // the Request, in a memfd
	KeeperOOMFD    = 8 // the sandbox's OOM-kill counter, when KeeperOOMEnv is set
)

// Messages between a keeper and its init: four little-endian uint32s,
// a kind and three values.
const (
	keeperMsgSize = 16
	// keeper → init
	msgStarted = 1 // A: the process's pid
	msgEnded   = 2 // A: how it ended (proclog.End*), B: its code
	// init → keeper
	msgSignal = 3 // A: the signal to send to the process's group
)

type keeperMsg struct{ kind, a, b, c uint32 }

func (m keeperMsg) encode() []byte {
	b := make([]byte, keeperMsgSize)
	binary.LittleEndian.PutUint32(b, m.kind)
	binary.LittleEndian.PutUint32(b[4:], m.a)
	binary.LittleEndian.PutUint32(b[8:], m.b)
	binary.LittleEndian.PutUint32(b[12:], m.c)
	return b
}

func decodeKeeperMsg(b []byte) (keeperMsg, bool) {
	if len(b) != keeperMsgSize {
		return keeperMsg{}, false
	}
	return keeperMsg{binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint32(b[8:]), binary.LittleEndian.Uint32(b[12:])}, true
}

// keeper is one keeper's state.
type keeper struct {
	req     Request
	sock    int
	pid     int // the process (its group's id too: it runs in a session of its own)
	pidfd   int
	timer   int
	timed   uint32
	out     [2]*stream // stdout, stderr
	oom     int        // the OOM counter's fd, or -1
	oomAt   uint64     // its count when the process started
	started time.Time
	buf     []byte
}

// stream is one of the process's output pipes and the log it goes to.
type stream struct {
	pipe int // -1 once it reached EOF
	log  *proclog.Writer
}

// RunKeeper is a keeper's main: it runs its one process to its end and
// returns the status the keeper exits with.
func RunKeeper() int {
	_ = os.WriteFile("/proc/self/comm", []byte(KeeperName), 0)
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "sandbox keeper: "+format+"\n", args...)
		return 2
	}
	// Nothing of the sandbox may read its memory, descriptors (its logs
	// are files of the host) or trace it.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fail("cannot make itself non-dumpable: %v", err)
	}
	// Every descendant of its process is re-parented here, never to init.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fail("cannot become a subreaper: %v", err)
	}
	raw, err := readAll(KeeperReqFD, MaxRequestSize)
	_ = unix.Close(KeeperReqFD)
	if err != nil {
		return fail("cannot read its request: %v", err)
	}
	req, err := DecodeRequest(raw)
	if err != nil {
		return fail("%v", err)
	}
	k := &keeper{req: req, sock: KeeperSockFD, pid: -1, pidfd: -1, oom: -1, buf: make([]byte, 64<<10)}
	if os.Getenv(KeeperOOMEnv) == "1" {
		k.oom = KeeperOOMFD
	}
	for i, fd := range []int{KeeperStdoutFD, KeeperStderrFD} {
		w, err := proclog.OpenWriter(os.NewFile(uintptr(fd), "log"))
		if err != nil {
			return fail("log %d: %v", fd, err)
		}
		k.out[i] = &stream{pipe: -1, log: w}
	}
	exitFile := os.NewFile(KeeperExitFD, "exit")
	if k.timer, err = unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC|unix.TFD_NONBLOCK); err != nil {
		return fail("timerfd: %v", err)
	}
	x := k.run()
	x.StdoutBytes, x.StderrBytes = k.out[0].log.Written(), k.out[1].log.Written()
	failpointExited(os.Getenv(KeeperFailpointEnv))
	if err := proclog.WriteExit(exitFile, x); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox keeper: process %s: cannot write its exit record: %v\n", req.ID, err)
	}
	k.send(keeperMsg{kind: msgEnded, a: x.How, b: x.Code})
	return 0
}

func (k *keeper) send(m keeperMsg) {
	_ = unix.Sendmsg(k.sock, m.encode(), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
}

// run spawns the process and serves it to its end; the exit record's
// streams' counts are the caller's to fill.
func (k *keeper) run() proclog.Exit {
	k.started = time.Now()
	x := proclog.Exit{StartedNS: k.started.UnixNano()}
	ended := func(how, code uint32) proclog.Exit {
		x.How, x.Code, x.EndedNS = how, code, time.Now().UnixNano()
		return x
	}
	// What a shell says, as for a command: 127 (not there), 126 (cannot
	// run), written to its stderr, and the process has ended at once.
	notRunnable := func(what string, err error) proclog.Exit {
		_, _ = k.out[1].log.Write([]byte(fmt.Sprintf("sandbox: cannot run %s: %v\n", truncate(what, 256), err)))
		k.send(keeperMsg{kind: msgStarted})
		return ended(proclog.EndExited, uint32(initproc.NotRunnableStatus(err)))
	}
	var fi unix.Stat_t
	if err := unix.Stat(k.req.Cwd, &fi); err != nil {
		return notRunnable("in "+k.req.Cwd, err)
	} else if fi.Mode&unix.S_IFMT != unix.S_IFDIR {
		return notRunnable("in "+k.req.Cwd, unix.ENOTDIR)
	}
	prog, err := initproc.LookPath(k.req.Argv[0], k.req.Env)
	if err != nil {
		return notRunnable(k.req.Argv[0], err)
	}
	var pipes [2][2]int
	for i := range pipes {
		if err := unix.Pipe2(pipes[i][:], unix.O_CLOEXEC); err != nil {
			return notRunnable(k.req.Argv[0], err)
		}
		k.out[i].pipe = pipes[i][0]
		_ = unix.SetNonblock(pipes[i][0], true)
	}
	attr := initproc.SpawnAttr{Dir: k.req.Cwd, Env: k.req.Env, Stdio: [3]int{0, pipes[0][1], pipes[1][1]}, PidFD: &k.pidfd}
	if k.req.UID != 0 {
		attr.Cred = &initproc.Cred{UID: k.req.UID, GID: k.req.GID}
	}
	k.oomAt = readOOMKills(k.oom)
	pid, err := initproc.Spawn(prog, k.req.Argv, attr)
	_ = unix.Close(pipes[0][1])
	_ = unix.Close(pipes[1][1])
	_ = unix.Close(0)
	if err != nil {
		return notRunnable(k.req.Argv[0], err)
	}
	k.pid = pid
	k.send(keeperMsg{kind: msgStarted, a: uint32(pid)})
	if k.req.Timeout > 0 {
		k.arm(k.req.Timeout)
	}
	ws := k.serve()
	// The process's group, and everything it left (re-parented here),
	// ends with it, as a command's leftovers end with the command.
	k.killTree()
	k.reap()
	k.drain(time.Now().Add(time.Second))
	switch {
	case ws.Exited():
		x = ended(proclog.EndExited, uint32(ws.ExitStatus()))
	case ws.Signaled() && ws.CoreDump():
		x = ended(proclog.EndDumped, uint32(ws.Signal()))
	default:
		x = ended(proclog.EndKilled, uint32(ws.Signal()))
	}
	x.Timed = k.timed
	x.OOM = ws.Signaled() && ws.Signal() == unix.SIGKILL && k.timed != proclog.TimedKill && readOOMKills(k.oom) > k.oomAt
	return x
}

// serve copies the process's output into its logs, keeps its budget and
// passes on signals until the process exits, and returns its status.
func (k *keeper) serve() unix.WaitStatus {
	for {
		fds := make([]unix.PollFd, 0, 5)
		for _, s := range k.out {
			if s.pipe >= 0 {
				fds = append(fds, unix.PollFd{Fd: int32(s.pipe), Events: unix.POLLIN})
			}
		}
		fds = append(fds, unix.PollFd{Fd: int32(k.sock), Events: unix.POLLIN}, unix.PollFd{Fd: int32(k.timer), Events: unix.POLLIN})
		timeout := -1
		if k.pidfd >= 0 {
			fds = append(fds, unix.PollFd{Fd: int32(k.pidfd), Events: unix.POLLIN})
		} else {
			timeout = 50 // no pidfd (gVisor): the reap below polls
		}
		if _, err := unix.Poll(fds, timeout); err != nil && !errors.Is(err, unix.EINTR) {
			fmt.Fprintf(os.Stderr, "sandbox keeper: poll: %v\n", err)
			time.Sleep(10 * time.Millisecond)
		}
		for _, p := range fds {
			switch {
			case p.Revents == 0:
			case int(p.Fd) == k.sock:
				k.receive(p.Revents)
			case int(p.Fd) == k.timer:
				k.budgetSpent()
			case int(p.Fd) == k.pidfd:
			default:
				for _, s := range k.out {
					if int(p.Fd) == s.pipe {
						k.copy(s)
					}
				}
			}
		}
		if ws, done := k.reap(); done {
			return ws
		}
	}
}

// reap collects every exited child; done once the process itself has.
func (k *keeper) reap() (unix.WaitStatus, bool) {
	var mine unix.WaitStatus
	done := false
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG|unix.WALL, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return mine, done
		}
		if pid == k.pid {
			mine, done = ws, true
		}
	}
}

// copy moves what the pipe holds into its log.
func (k *keeper) copy(s *stream) {
	for range 16 { // at most 1 MiB a turn, so the other stream gets its turn
		n, err := unix.Read(s.pipe, k.buf)
		if n > 0 {
			_, _ = s.log.Write(k.buf[:n])
		}
		switch {
		case n > 0 && n < len(k.buf):
			return
		case n > 0:
			continue
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
			return
		}
		_ = unix.Close(s.pipe) // EOF, or an error no read will mend
		s.pipe = -1
		return
	}
}

// drain reads what the pipes still hold, until both reach EOF (every
// writer is dead by now) or the deadline.
func (k *keeper) drain(deadline time.Time) {
	for {
		var fds []unix.PollFd
		for _, s := range k.out {
			if s.pipe >= 0 {
				fds = append(fds, unix.PollFd{Fd: int32(s.pipe), Events: unix.POLLIN})
			}
		}
		left := time.Until(deadline)
		if len(fds) == 0 || left <= 0 {
			return
		}
		if _, err := unix.Poll(fds, int(left/time.Millisecond)+1); err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
		for _, s := range k.out {
			if s.pipe >= 0 {
				k.copy(s)
			}
		}
	}
}

// receive takes one message from init: a signal for the process.
func (k *keeper) receive(revents int16) {
	var b [keeperMsgSize + 1]byte
	n, _, err := unix.Recvfrom(k.sock, b[:], unix.MSG_DONTWAIT)
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
		return
	}
	if err != nil || n == 0 {
		// Init is gone: the sandbox is ending, and the kernel ends this
		// keeper with it. Until then nothing more comes.
		k.sock = -1
		return
	}
	m, ok := decodeKeeperMsg(b[:n])
	if !ok || m.kind != msgSignal || m.a == 0 || m.a > 64 {
		return
	}
	sig := unix.Signal(m.a)
	_ = unix.Kill(-k.pid, sig)
	if sig == unix.SIGTERM || sig == unix.SIGHUP || sig == unix.SIGINT {
		_ = unix.Kill(-k.pid, unix.SIGCONT) // a stopped group gets it too
	}
}

// budgetSpent acts on the budget's timer: SIGTERM to the process's group
// at the budget, SIGKILL to all it is once the grace is spent too.
func (k *keeper) budgetSpent() {
	var exp [8]byte
	if n, err := unix.Read(k.timer, exp[:]); n != len(exp) || err != nil {
		return
	}
	switch k.timed {
	case proclog.TimedNo:
		k.timed = proclog.TimedTerm
		_ = unix.Kill(-k.pid, unix.SIGTERM)
		_ = unix.Kill(-k.pid, unix.SIGCONT)
		if k.req.KillGrace > 0 {
			k.arm(k.req.KillGrace)
			return
		}
		fallthrough
	case proclog.TimedTerm:
		k.timed = proclog.TimedKill
		k.killTree()
	}
}

func (k *keeper) arm(d time.Duration) {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	_ = unix.TimerfdSettime(k.timer, 0, &spec, nil)
}

// killTree sends SIGKILL to the process's group and to every other
// descendant of the keeper, until none is left alive: a child killed has
// its own children re-parented to the keeper, which the next pass finds.
// The zombies are left to serve's reap (the process's status among them).
func (k *keeper) killTree() {
	if k.pid > 0 {
		_ = unix.Kill(-k.pid, unix.SIGKILL)
	}
	self := os.Getpid()
	for range maxKillPasses {
		kids := liveChildrenOf(self)
		if len(kids) == 0 {
			return
		}
		for _, pid := range kids {
			_ = unix.Kill(-pid, unix.SIGKILL)
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		awaitDeath(kids)
	}
}

// maxKillPasses bounds the passes a kill of a process tree takes: each
// kills every process that is a direct child now, and a chain of n
// processes takes n passes. A tree still there after that many is one
// that forks faster than it is killed; what is left is killed with the
// sandbox.
const maxKillPasses = 1000

// liveChildrenOf lists the processes whose parent is pid and which have
// not exited (zombies left out), from /proc.
func liveChildrenOf(pid int) []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	var out []int
	for _, name := range names {
		p, err := strconv.Atoi(name)
		if err != nil || p == pid {
			continue
		}
		if ppid, state, ok := statOf(p); ok && ppid == pid && state != 'Z' && state != 'X' {
			out = append(out, p)
		}
	}
	return out
}

// awaitDeath waits, a millisecond at a time and 2 s at most, until every
// pid is a zombie or gone: killed processes take a moment to exit.
func awaitDeath(pids []int) {
	for range 2000 {
		alive := false
		for _, p := range pids {
			if _, state, ok := statOf(p); ok && state != 'Z' && state != 'X' {
				alive = true
				break
			}
		}
		if !alive {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// statOf reads pid's parent and state from /proc/PID/stat.
func statOf(pid int) (ppid int, state byte, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[0][0], err == nil
}

// failpointExited stops the keeper, when spec arms it ("exited"), in the
// moment its process has ended and its record is not yet written.
func failpointExited(spec string) {
	if spec != "exited" {
		return
	}
	setName(KeeperFailpointName) // (non-dumpable: /proc/self/comm is no longer its to write)
	_ = unix.Kill(os.Getpid(), unix.SIGSTOP)
	setName(KeeperName)
}

// setName sets the calling thread's name (the process's, from its main
// thread), as ps shows it.
func setName(name string) {
	b := append([]byte(name), 0)
	_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&b[0])), 0, 0, 0)
}

// readOOMKills reads the oom_kill count of a cgroup's memory.events (v2)
// or memory.oom_control (v1) held open at fd; 0 without one.
func readOOMKills(fd int) uint64 {
	if fd < 0 {
		return 0
	}
	var b [512]byte
	n, err := unix.Pread(fd, b[:], 0)
	if err != nil || n <= 0 {
		return 0
	}
	for _, line := range strings.Split(string(b[:n]), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			c, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return c
		}
	}
	return 0
}

// readAll reads fd (a regular file) from its start, at most limit bytes.
func readAll(fd, limit int) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size < 0 || st.Size > int64(limit) {
		return nil, fmt.Errorf("the request is not a regular file within %d bytes", limit)
	}
	buf := make([]byte, st.Size)
	for off := 0; off < len(buf); {
		n, err := unix.Pread(fd, buf[off:], int64(off))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, errors.New("the request ended early")
		}
		off += n
	}
	return buf, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
