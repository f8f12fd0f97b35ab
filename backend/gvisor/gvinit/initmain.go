// Package gvinit is what runs inside a gVisor sandbox: its init (the
// container's process, which runs each command the daemon sends on its
// stdin and streams the output back) and its opener (which opens paths as
// the guest for the daemon's file operations). The init's binary
// (cmd/sandbox-sidecar-init) links it, and the daemon's through
// gvisor.InitMain; it imports nothing of the daemon's side (backend/gvisor),
// only the wire both speak (gvwire), initproc and backend/hostfs' bounded
// reads.
package gvinit

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc"
)

// initDrainWait bounds how long init waits for a command's output pipes
// to reach EOF once every process of the command is dead.
const initDrainWait = 2 * time.Second

// IsInit reports whether this process is a gVisor sandbox's init: the
// container's process, with gvwire.InitEnv set.
func IsInit() bool { return initproc.Is(gvwire.InitEnv) }

// Main runs a sandbox's init, or its opener (opener.go), and never returns
// when this process is one; otherwise it returns at once. The init's
// binary (cmd/sandbox-sidecar-init) calls it first thing, and so does the
// daemon's, through gvisor.InitMain, for when it runs its own executable
// as init. The opener is init's executable again, run by init; so is the
// warm-up command of a pool member whose root has no `true`
// (initproc.WarmMain), which exits 0 at once.
func Main() {
	initproc.WarmMain()
	initproc.Main(openerEnv, runOpener)
	initproc.Main(agent.KeeperEnv, agent.RunKeeper)
	initproc.Main(gvwire.InitEnv, runInit)
}

// What the guest runs as, and where the init's executable is bound.
const (
	guestUID  = gvwire.GuestUID
	guestGID  = gvwire.GuestGID
	guestInit = gvwire.GuestInit
)

// What a hostile guest can do to init, and why it does not help it: init
// is pid 1 of the sandbox and runs as root inside it, the guest's commands
// as uid 1000 without capabilities, so they can neither signal nor trace it
// (and init drops the signals a pid 1 may receive from inside); it makes
// itself non-dumpable, so /proc/1/fd, environ and mem are closed to them;
// the daemon's streams are its stdin and stdout, which no command inherits
// (each gets pipes of its own). Everything a command started is killed when
// it ends, so no guest process lives between commands but the durable
// processes (procs.go), each under a keeper that runs as root too. Init
// still checks every frame and bounds what it reads. It keeps each
// command's budget itself (a timer: SIGTERM to the command's process group,
// then SIGKILL to every process of the command) and execs the command
// directly.

// initState is init's whole state.
type initState struct {
	out   *bufio.Writer // to the daemon
	outMu sync.Mutex
	// gen (under outMu) counts the daemons that attached: a cell's frames
	// go only to the daemon that asked for it (sendAs).
	gen     uint64
	mu      sync.Mutex
	running bool
	// killAsked: the daemon asked to kill the running command. A kill
	// can arrive before run has forked the command (a client gone right
	// after its request); run then kills it as soon as it exists.
	killAsked bool
	files     fileOps
	// chld gets a SIGCHLD whenever a child of init ends (buffered: one
	// pending is enough, reap polls with WNOHANG). The reaper goroutine
	// and a running command's wait both take from it.
	chld chan os.Signal
	// stdout is the daemon's stream, which out writes to.
	stdout *os.File

	// pmu guards the keepers' table, the foreground command's pid and
	// every wait4: whoever reaps a child hands it to its owner (reap), so
	// a keeper or the command is never reaped unseen, and neither is
	// started while a reap could miss it.
	pmu   sync.Mutex
	procs agent.Table
	code  agent.Contexts // the code contexts and their zygote (code.go)
	oom   *oomCounter    // the kills init made for memory (memory.go)
	fg    *foreground    // the command running, nil between commands
	// reaped is closed, and replaced, each time a reap reaped a child.
	reaped chan struct{}
	// agentLoop runs (procs.go) while keepers or the contexts' zygote
	// do; wake interrupts its poll when one is added.
	agentLoop bool
	wake      [2]int
}

// foreground is the running command as the reaper sees it.
type foreground struct {
	pid    int
	status unix.WaitStatus
	done   chan struct{} // closed once it is reaped (status set)
}

func runInit() int {
	// Named, non-dumpable, pid 1, signals shielded (initproc.Become).
	if err := initproc.Become("the sandbox"); err != nil {
		return initFail("%v", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return initFail("chdir /: %v", err)
	}
	// The daemon's pipes through the runtime's poller, and children
	// awaited through SIGCHLD: no goroutine of init sits in a blocking
	// system call while it waits, so the Go runtime's monitor thread goes
	// to sleep instead of polling every 20 µs, each poll a system call the
	// sentry serves (docs/performance.md, "gVisor: where a command's time goes").
	// The daemon's pipe is written through a descriptor of its own above
	// 2: a write to fd 1 or 2 that fails with EPIPE ends a Go program that
	// has not asked for SIGPIPE (os/signal), which init does not shield
	// (initproc.ShieldedSignals); through another descriptor it is the
	// error it should be.
	outFD, err := unix.FcntlInt(1, unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return initFail("cannot take the daemon's pipe off fd 1: %v", err)
	}
	stdin, stdout := pollable(0, "daemon-in"), pollable(outFD, "daemon-out")
	st := &initState{out: bufio.NewWriterSize(stdout, gvwire.MaxChunk+gvwire.FrameHeaderSize), stdout: stdout, files: fileOps{sock: -1}, chld: make(chan os.Signal, 1), reaped: make(chan struct{}),
		procs: agent.Table{Exe: guestInit, Stderr: 2, Failpoint: os.Getenv(agent.KeeperFailpointEnv)}, oom: newOOMCounter()}
	if err := unix.Pipe2(st.wake[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return initFail("cannot make the keepers' wake-up pipe: %v", err)
	}
	signal.Notify(st.chld, unix.SIGCHLD)
	go st.reaper()
	if err := st.send(gvwire.KindReady, gvwire.U32s(gvwire.Protocol)); err != nil {
		return initFail("cannot tell the daemon it is ready: %v", err)
	}
	in := bufio.NewReader(stdin)
	const allowed = 1<<gvwire.KindRun | 1<<gvwire.KindKill | 1<<gvwire.KindLstat | 1<<gvwire.KindFileOp |
		1<<gvwire.KindProcStart | 1<<gvwire.KindProcSignal | 1<<gvwire.KindProcList | 1<<gvwire.KindAttach |
		1<<gvwire.KindCode | 1<<gvwire.KindContextList | 1<<gvwire.KindContextDelete | 1<<gvwire.KindCodeWarm | 1<<gvwire.KindContextRestart | 1<<gvwire.KindReclaim
	for {
		kind, payload, err := gvwire.ReadFrame(in, allowed)
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			// The daemon went away (its end of the stream closed: it
			// died, or stopped and left the sandbox to the next one).
			// Its command goes; the durable processes, and init, stay
			// for the next daemon, which attaches.
			st.daemonGone()
			awaitDaemon(in, stdin)
			continue
		}
		if err != nil {
			// The daemon broke the protocol: nothing here can be trusted
			// to it any more.
			_ = unix.Kill(-1, unix.SIGKILL)
			return initFail("reading the daemon's requests: %v", err)
		}
		switch kind {
		case gvwire.KindAttach:
			st.attached(payload)
		case gvwire.KindProcStart:
			st.procStart(payload)
		case gvwire.KindProcSignal, gvwire.KindProcList:
			st.procRequest(kind, payload)
		case gvwire.KindCode:
			st.runCell(payload)
		case gvwire.KindCodeWarm:
			st.warmCode(payload)
		case gvwire.KindContextList, gvwire.KindContextDelete, gvwire.KindContextRestart:
			st.contextRequest(kind, payload)
		case gvwire.KindReclaim:
			go st.reclaim(payload)
		case gvwire.KindKill:
			st.mu.Lock()
			if st.running {
				st.killAsked = true
				st.killForeground()
			}
			st.mu.Unlock()
		case gvwire.KindLstat:
			st.lstat(string(payload))
		case gvwire.KindFileOp:
			req, err := gvwire.DecodeFileRequest(payload)
			if err != nil {
				if len(payload) >= 4 {
					_ = st.send(gvwire.KindFileDone, gvwire.FileDone{Seq: binary.LittleEndian.Uint32(payload), Code: gvwire.FileInvalid, Text: err.Error()}.Encode())
				}
				continue
			}
			go st.fileOp(req)
		case gvwire.KindRun:
			req, err := gvwire.DecodeRunRequest(payload)
			if err != nil {
				st.failed(fmt.Sprintf("init refused a request: %v", err))
				continue
			}
			st.mu.Lock()
			busy := st.running
			st.running = !busy
			if !busy {
				st.killAsked = false
			}
			st.mu.Unlock()
			if busy {
				st.failed("init is already running a command")
				continue
			}
			go st.run(req)
		}
	}
}

func initFail(format string, args ...any) int { return initproc.Fail(format, args...) }

// send writes one frame to the daemon.
func (st *initState) send(kind byte, payload []byte) error {
	st.outMu.Lock()
	defer st.outMu.Unlock()
	if err := gvwire.WriteFrame(st.out, kind, payload); err != nil {
		return err
	}
	return st.out.Flush()
}

// sendAs writes one frame to the daemon if it is still the one of
// attach generation gen (generation); a later one never gets it.
func (st *initState) sendAs(gen uint64, kind byte, payload []byte) error {
	st.outMu.Lock()
	defer st.outMu.Unlock()
	if gen != st.gen {
		return errDaemonGone
	}
	if err := gvwire.WriteFrame(st.out, kind, payload); err != nil {
		return err
	}
	return st.out.Flush()
}

// errDaemonGone: the daemon a frame was for is no longer attached.
var errDaemonGone = errors.New("the daemon that asked is gone")

// generation is the attach generation of the daemon now attached.
func (st *initState) generation() uint64 {
	st.outMu.Lock()
	defer st.outMu.Unlock()
	return st.gen
}

func (st *initState) failed(reason string) {
	if len(reason) > gvwire.MaxReasonBytes {
		reason = reason[:gvwire.MaxReasonBytes]
	}
	_ = st.send(gvwire.KindFailed, []byte(reason))
}

// lstat answers what the guest's kernel has at path: gVisor keeps FIFOs
// and sockets made inside the sandbox in its own memory, so the host's view
// of the workspace lacks them. The answer is the file type bits and 0, or
// 0 and the errno.
func (st *initState) lstat(path string) {
	var fi unix.Stat_t
	var typ, errno uint32
	if err := unix.Lstat(path, &fi); err != nil {
		e, _ := errors.AsType[unix.Errno](err)
		errno = uint32(e)
		if errno == 0 {
			errno = uint32(unix.EIO)
		}
	} else {
		typ = fi.Mode & unix.S_IFMT
	}
	_ = st.send(gvwire.KindLstated, gvwire.U32s(typ, errno))
}

// awaitDaemonPoll is how often init looks for the next daemon while none
// is attached: a FIFO without a writer reads EOF at once, whoever polls
// it, so it is read again after a pause.
const awaitDaemonPoll = 100 * time.Millisecond

// daemonGone ends the command of the daemon that went, if one runs:
// nobody collects its output.
func (st *initState) daemonGone() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.running {
		st.killAsked = true
		st.killForeground()
	}
}

// awaitDaemon drops what in holds of a frame the daemon that went did not
// finish, and waits until another writes to the stream.
func awaitDaemon(in *bufio.Reader, stream *os.File) {
	in.Reset(stream)
	for {
		time.Sleep(awaitDaemonPoll)
		if _, err := in.Peek(1); err == nil {
			return
		}
	}
}

// attached answers a daemon's attach frame: its stream is new, and so is
// the writer of init's (what failed to reach the previous daemon is
// dropped).
func (st *initState) attached(nonce []byte) {
	st.outMu.Lock()
	st.out.Reset(st.stdout)
	st.gen++
	st.outMu.Unlock()
	_ = st.send(gvwire.KindAttached, gvwire.Attached(nonce))
}

// run starts one command with pipes of its own, forwards its output, waits
// for it (reaping every orphan meanwhile), kills whatever it left and
// reports how it ended once all of its output has been sent.
func (st *initState) run(req gvwire.RunRequest) {
	// Init takes the next command as soon as it has answered this one,
	// so it is idle again before its last frame.
	idle := func() {
		st.mu.Lock()
		st.running = false
		st.mu.Unlock()
	}
	fail := func(format string, args ...any) {
		idle()
		st.failed(fmt.Sprintf("sandbox: "+format+"\n", args...))
	}
	if fi, err := os.Stat(req.Cwd); err != nil || !fi.IsDir() {
		if err == nil {
			err = unix.ENOTDIR
		}
		fail("cannot change directory to %s: %v", req.Cwd, err)
		return
	}
	prog, err := initproc.LookPath(req.Argv[0], req.Env)
	if err != nil {
		// As a shell reports it: 127 for a command that is not there,
		// 126 for one that cannot be run.
		code := uint32(initproc.NotRunnableStatus(err))
		idle()
		_ = st.send(gvwire.KindStderr, fmt.Appendf(nil, "sandbox: %s: %v\n", truncate(req.Argv[0], 256), err))
		_ = st.send(gvwire.KindExited, gvwire.U32s(gvwire.EndExited, code, gvwire.TimedNo))
		return
	}
	// The command's ends are plain descriptors (close-on-exec: the child
	// gets them as 0-2 only); init's are non-blocking, in the poller.
	var child [3]int
	var stdin, out [3]*os.File // stdin[0], out[1], out[2] are init's
	for i := range child {
		p, c, err := childPipe(i != 0, i == 0 && len(req.Stdin) == 0)
		if err != nil {
			for j := range i {
				_ = unix.Close(child[j])
			}
			stdin[0].Close()
			out[1].Close()
			fail("cannot create pipes: %v", err)
			return
		}
		child[i] = c
		if i == 0 {
			stdin[0] = p
		} else {
			out[i] = p
		}
	}
	// Spawn, not syscall.ForkExec: its child makes no signal-handler
	// resets, ~60 system calls into the sentry per command. Under pmu, so
	// that the reaper knows the command's pid before it can reap it.
	st.pmu.Lock()
	pid, err := initproc.Spawn(prog, req.Argv, initproc.SpawnAttr{
		Dir: req.Cwd, Env: req.Env, Stdio: child,
		Cred: &initproc.Cred{UID: guestUID, GID: guestGID},
	})
	fg := &foreground{pid: pid, done: make(chan struct{})}
	if err == nil {
		st.fg = fg
	}
	st.pmu.Unlock()
	for _, c := range child {
		_ = unix.Close(c)
	}
	if err == nil {
		st.mu.Lock()
		killed := st.killAsked
		st.mu.Unlock()
		if killed { // asked before the command existed
			st.killForeground()
		}
	}
	if err != nil {
		stdin[0].Close()
		out[1].Close()
		out[2].Close()
		// The child changes directory after it became the guest uid, so
		// a directory the guest may not enter fails here as it should;
		// so does a program it may not run.
		code := uint32(initproc.NotRunnableStatus(err))
		idle()
		_ = st.send(gvwire.KindStderr, fmt.Appendf(nil, "sandbox: cannot run %s in %s: %v\n", truncate(req.Argv[0], 256), req.Cwd, err))
		_ = st.send(gvwire.KindExited, gvwire.U32s(gvwire.EndExited, code, gvwire.TimedNo))
		return
	}
	// The budget, as GNU timeout keeps it: SIGTERM to the command's
	// process group at the budget, SIGKILL to every process of the
	// command once the grace is spent too.
	var timedMu sync.Mutex
	timed, reaped := uint32(gvwire.TimedNo), false
	term := time.AfterFunc(req.Timeout, func() {
		timedMu.Lock()
		defer timedMu.Unlock()
		if !reaped {
			timed = gvwire.TimedTerm
			_ = unix.Kill(-pid, unix.SIGTERM)
		}
	})
	kill := time.AfterFunc(req.Timeout+req.KillAfter, func() {
		timedMu.Lock()
		defer timedMu.Unlock()
		if !reaped {
			timed = gvwire.TimedKill
			st.killForeground()
		}
	})

	if len(req.Stdin) == 0 {
		stdin[0].Close()
	} else {
		go func() {
			_, _ = stdin[0].Write(req.Stdin)
			stdin[0].Close()
		}()
	}
	var drained sync.WaitGroup
	for i, kind := range []byte{gvwire.KindStdout, gvwire.KindStderr} {
		drained.Add(1)
		go func() {
			defer drained.Done()
			defer out[i+1].Close()
			buf := make([]byte, gvwire.MaxChunk)
			for {
				n, err := out[i+1].Read(buf)
				if n > 0 {
					_ = st.send(kind, buf[:n])
				}
				if err != nil {
					return
				}
			}
		}()
	}

	outputClosed := make(chan struct{})
	go func() { drained.Wait(); close(outputClosed) }()

	// Reap until the command itself exits. When its output closes it has
	// most likely exited: look then, not only at SIGCHLD, whose way to
	// this goroutine (the signal, the runtime's signal goroutine, the
	// channel) is three wake-ups of init's threads, each one a round trip
	// through the sentry. The reaper goroutine may take the SIGCHLD
	// instead: it reaps the command as this would, and closes fg.done.
	hint := (<-chan struct{})(outputClosed)
	for waiting := true; waiting; {
		select {
		case <-fg.done:
			waiting = false
		case <-st.chld:
			st.reap()
		case <-hint:
			hint = nil // once
			st.reap()
		}
	}
	status := fg.status
	timedMu.Lock()
	reaped = true
	timedMu.Unlock()
	term.Stop()
	kill.Stop()
	// A command's processes end with it: background jobs, setsid and
	// double-fork escapees alike, and the opener; the durable processes
	// do not. No file op may start another opener meanwhile, or this
	// would wait for it.
	st.files.mu.Lock()
	st.endForeground()
	st.dropOpener()
	st.files.mu.Unlock()
	select {
	case <-outputClosed:
	case <-time.After(initDrainWait):
	}
	how, value := uint32(gvwire.EndExited), uint32(status.ExitStatus())
	if status.Signaled() {
		how, value = gvwire.EndKilled, uint32(status.Signal())
	}
	idle()
	_ = st.send(gvwire.KindExited, gvwire.U32s(how, value, timed))
}

// childPipe makes a pipe for a command's stdin (parentReads false) or
// output: the command's end a blocking close-on-exec descriptor, init's
// end a non-blocking file in the runtime's poller, or none for an empty
// stdin (closed at once: the command reads EOF). Each system call here is
// a round trip into the sentry, so it makes no more than it must: the
// pipe blocking, then init's end alone non-blocking.
func childPipe(parentReads, empty bool) (*os.File, int, error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return nil, -1, err
	}
	parent, child := fds[1], fds[0]
	if parentReads {
		parent, child = fds[0], fds[1]
	}
	if empty {
		_ = unix.Close(parent)
		return nil, child, nil
	}
	// F_SETFL sets every status flag: a new pipe has none but its access
	// mode, which F_SETFL leaves alone.
	if _, err := unix.FcntlInt(uintptr(parent), unix.F_SETFL, unix.O_NONBLOCK); err != nil {
		_ = unix.Close(fds[0])
		_ = unix.Close(fds[1])
		return nil, -1, err
	}
	return os.NewFile(uintptr(parent), "pipe"), child, nil
}

// pollable returns descriptor fd (the daemon's pipes: init's 0, and its
// 1 moved above 2) as a non-blocking file in the runtime's poller, or as it
// is when epoll refuses it: a non-blocking file the poller does not hold
// would fail its reads with EAGAIN. It is the one *os.File init makes for
// fd, kept for init's life: a second one, dropped, would close fd when
// collected.
func pollable(fd int, name string) *os.File {
	if ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC); err == nil {
		err = unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT, Fd: int32(fd)})
		_ = unix.Close(ep)
		if err == nil {
			_ = unix.SetNonblock(fd, true)
		}
	}
	return os.NewFile(uintptr(fd), name)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
