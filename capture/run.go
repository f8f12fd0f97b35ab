// Package capture runs one untrusted process to completion and keeps a
// bounded window of its output.
//
// It owns the process it starts, that process's group, the pipes to it and
// the timers around it: a budget that ends in SIGTERM to the group, SIGKILL
// after a grace, SIGKILL at once when the caller's context ends, and bounded
// waits for the pipes after the process has exited (a backgrounded grandchild
// may hold them open forever). Output is drained concurrently into Buffers
// that never grow past their limit, whatever the process writes.
//
// It never interprets output, never retries, and never signals anything once
// the main process has exited: processes the command left behind (detached
// grandchildren, anything that changed its process group) are the caller's
// to contain, for example with a PID namespace. It depends on nothing else in
// this project.
//
// Streams offers the same bounded capture for a process that something else
// starts (a process inside a sandbox, started by that sandbox's init from
// pipe ends handed to it over a Unix socket): the caller then owns the
// process and its timers, capture only the pipes.
package capture

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults for the zero fields of Options.
const (
	// DefaultKillGrace is how long a process has between SIGTERM and SIGKILL.
	DefaultKillGrace = 2 * time.Second
	// DefaultDrainGrace is how long Run keeps reading the pipes after the
	// main process has exited.
	DefaultDrainGrace = 250 * time.Millisecond
	// DefaultMaxOutputBytes is how much of each stream is kept.
	DefaultMaxOutputBytes = 1 << 20
)

// reapWait bounds how long Run waits for a process to disappear after it
// was sent SIGKILL. Only a process stuck in the kernel (uninterruptible I/O)
// takes longer; Run then returns without it and reaps it in the background.
// A variable so tests can shorten it.
var reapWait = 5 * time.Second

// drainChunk is the read size of each pipe drain loop.
const drainChunk = 32 << 10

// Options bound one Run. The zero value is usable: no budget of its own (the
// context still applies), default graces, DefaultMaxOutputBytes per stream,
// empty stdin.
type Options struct {
	// Timeout is the budget. When it elapses the process group gets
	// SIGTERM. Zero or less means no budget beyond ctx.
	Timeout time.Duration
	// KillGrace is how long after SIGTERM the group gets SIGKILL
	// (default DefaultKillGrace).
	KillGrace time.Duration
	// DrainGrace is how long, after the main process exits, Run waits for
	// the pipes to reach EOF before it stops reading
	// (default DefaultDrainGrace).
	DrainGrace time.Duration
	// MaxOutputBytes is how much of each of stdout and stderr is kept; the
	// tail is kept. Zero means DefaultMaxOutputBytes; negative keeps nothing.
	MaxOutputBytes int
	// Stdin is fed to the process; nil means an empty stdin.
	Stdin []byte
	// Output, when set, also gets every chunk of stdout and stderr as it is
	// read, before it reaches the kept window. It is called from the drain
	// goroutines and must not block: a slow consumer must drop, not stall
	// the command (see Window).
	Output OutputFunc
	// Started, when set, is called once the process has started and
	// before anything is written to it. An error kills the process group
	// and Run returns that error (e.g. a sandbox that could not be placed
	// in its cgroup must not run).
	Started func() error
}

func (o Options) withDefaults() Options {
	if o.KillGrace <= 0 {
		o.KillGrace = DefaultKillGrace
	}
	if o.DrainGrace <= 0 {
		o.DrainGrace = DefaultDrainGrace
	}
	if o.MaxOutputBytes == 0 {
		o.MaxOutputBytes = DefaultMaxOutputBytes
	}
	return o
}

// Result is what a process did and what of its output was kept.
type Result struct {
	// ExitCode is the exit status, 128+signal when the process was killed
	// by a signal, or -1 when it could not be reaped within a bounded wait
	// after SIGKILL (it is then reaped in the background).
	ExitCode int
	// Signal is the signal that killed the process, or 0.
	Signal syscall.Signal

	Stdout, Stderr                   []byte
	StdoutTruncated, StderrTruncated bool
	StdoutTotal, StderrTotal         int64

	// TimedOut means the budget elapsed while the process was running and
	// Run sent SIGTERM to its group (and to the process itself).
	TimedOut bool
	// Killed means the process outlived KillGrace after SIGTERM and Run
	// escalated to SIGKILL.
	Killed bool
	// Duration is the process's lifetime, from start to exit.
	Duration time.Duration
}

// Run starts cmd, feeds it opts.Stdin, keeps the tail of its output and
// returns when it has exited and its pipes are drained or abandoned.
//
// Run owns cmd's Stdin, Stdout and Stderr, and sets Setpgid and Pdeathsig
// (SIGKILL) on cmd.SysProcAttr, keeping the caller's other fields such as
// Credential; Setsid, Setctty and Foreground are cleared because they conflict
// with a process group of its own. Pdeathsig fires when the OS thread that
// created the child exits, so the child is started and waited for on a
// goroutine locked to its thread for the child's whole life.
//
// The child inherits its three streams and cmd.ExtraFiles, nothing else: Run
// marks every other descriptor of the daemon close-on-exec first (see
// CloseInheritedOnExec), a process-wide change that only affects children.
//
// When ctx ends, the group gets SIGKILL at once and Run returns the partial
// Result with an error wrapping ctx.Err(). Otherwise an error is returned only
// when the process could not be started; a non-zero exit, a signal or a
// timeout is reported in the Result.
func Run(ctx context.Context, cmd *exec.Cmd, opts Options) (Result, error) {
	opts = opts.withDefaults()
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("capture: %s was not started because its context had ended: %w", cmd.Path, err)
	}

	s, err := NewStreams(opts.Stdin, opts.MaxOutputBytes)
	if err != nil {
		return Result{}, fmt.Errorf("capture: cannot create pipes for %s (is the daemon out of file descriptors?): %w", cmd.Path, err)
	}
	defer s.Close()
	s.SetOutput(opts.Output)
	files := s.ChildFiles()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = files[0], files[1], files[2]
	prepareSysProcAttr(cmd)
	if err := CloseInheritedOnExec(); err != nil {
		return Result{}, fmt.Errorf("capture: not starting %s: cannot keep the daemon's other file descriptors from leaking into it: %w", cmd.Path, err)
	}

	c := &child{cmd: cmd, started: make(chan error, 1), reaped: make(chan struct{})}
	go c.run()
	if err := <-c.started; err != nil {
		return Result{}, fmt.Errorf("capture: cannot start %s; check that it exists and is executable: %w", cmd.Path, err)
	}
	var hookErr error
	if opts.Started != nil {
		if hookErr = opts.Started(); hookErr != nil {
			// supervise kills the group at once for an ended context.
			killed, cancel := context.WithCancel(ctx)
			cancel()
			ctx = killed
		}
	}
	s.Start()

	res, ctxErr := c.supervise(ctx, opts)

	// The main process is gone (or abandoned): give the pipes a bounded
	// time to reach EOF.
	out := s.Finish(opts.DrainGrace)
	res.Stdout, res.StdoutTruncated, res.StdoutTotal = out.Stdout, out.StdoutTruncated, out.StdoutTotal
	res.Stderr, res.StderrTruncated, res.StderrTotal = out.Stderr, out.StderrTruncated, out.StderrTotal
	if hookErr != nil {
		return res, fmt.Errorf("capture: %s was killed as it started: %w", cmd.Path, hookErr)
	}
	if ctxErr != nil {
		return res, fmt.Errorf("capture: %s was killed because its context ended: %w", cmd.Path, ctxErr)
	}
	return res, nil
}

func prepareSysProcAttr(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	a := cmd.SysProcAttr
	a.Setpgid, a.Pgid = true, 0
	a.Setsid, a.Setctty, a.Foreground = false, false, false
	a.Pdeathsig = syscall.SIGKILL
}

// CloseInheritedOnExec marks every descriptor from 3 up close-on-exec.
// Descriptors Go opens already are; this catches the ones the daemon itself
// inherited without the flag (from a shell, a supervisor, a test harness),
// which os/exec would otherwise pass to every child and so into every
// sandbox. It changes no descriptor the daemon uses, only what a child
// inherits; cmd.ExtraFiles are still passed, since they are dup'ed into place
// in the child. Run calls it before every start; a caller that starts
// processes itself calls it first too.
func CloseInheritedOnExec() error {
	err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) {
		return err
	}
	// Kernels before 5.11: walk the descriptor table instead.
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, name := range names {
		fd, convErr := strconv.Atoi(name)
		if convErr != nil || fd < 3 || fd == int(d.Fd()) {
			continue
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && !errors.Is(err, unix.EBADF) {
			return err
		}
	}
	return nil
}

// child is the started process and the goroutine that owns its thread.
type child struct {
	cmd     *exec.Cmd
	started chan error
	pgid    int // set before started is sent

	mu     sync.Mutex
	exited bool // the process has exited (it may still be a zombie)
	exitAt time.Time
	begun  time.Time

	reaped chan struct{} // closed once cmd.Wait has returned
}

// run starts the process and waits for it on a locked OS thread, so that
// the thread Pdeathsig is tied to lives exactly as long as the child.
func (c *child) run() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c.begun = time.Now()
	if err := c.cmd.Start(); err != nil {
		c.started <- err
		return
	}
	c.pgid = c.cmd.Process.Pid
	c.started <- nil

	// Observe the exit without reaping, so the pid (and so the group id)
	// cannot be reused while signalGroup might still use it.
	waitExitNoReap(c.pgid)
	c.mu.Lock()
	c.exited, c.exitAt = true, time.Now()
	c.mu.Unlock()

	_ = c.cmd.Wait() // the status is read from ProcessState
	close(c.reaped)
}

// waitExitNoReap blocks until pid has exited, leaving it a zombie.
func waitExitNoReap(pid int) {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// signalGroup sends sig to the child's process group, and to the child
// itself in case it moved to another group (setpgid), unless the child has
// already exited; it reports whether it sent it. Until the child is reaped
// its pid, and so the group id, cannot be reused, so neither kill can hit an
// unrelated process.
func (c *child) signalGroup(sig syscall.Signal) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.exited {
		return false
	}
	_ = syscall.Kill(-c.pgid, sig)
	_ = syscall.Kill(c.pgid, sig)
	return true
}

// supervise waits for the child, enforcing the budget and ctx. It returns
// with the exit status filled in, or ExitCode -1 if the child could not be
// reaped in time after SIGKILL; ctxErr is set when ctx ended first.
func (c *child) supervise(ctx context.Context, opts Options) (res Result, ctxErr error) {
	var budget, escalate, giveUp <-chan time.Time
	if opts.Timeout > 0 {
		t := time.NewTimer(opts.Timeout)
		defer t.Stop()
		budget = t.C
	}
	done := ctx.Done()
	var giveUpTimer *time.Timer
	defer func() {
		if giveUpTimer != nil {
			giveUpTimer.Stop()
		}
	}()
	startGiveUp := func() {
		if giveUpTimer == nil {
			giveUpTimer = time.NewTimer(reapWait)
			giveUp = giveUpTimer.C
		}
	}
	for {
		select {
		case <-c.reaped:
			c.fillStatus(&res)
			return res, ctxErr
		case <-budget:
			budget = nil
			if c.signalGroup(syscall.SIGTERM) {
				res.TimedOut = true
				t := time.NewTimer(opts.KillGrace)
				defer t.Stop()
				escalate = t.C
			}
		case <-escalate:
			escalate = nil
			if c.signalGroup(syscall.SIGKILL) {
				res.Killed = true
				startGiveUp()
			}
		case <-done:
			done, escalate = nil, nil
			ctxErr = ctx.Err()
			c.signalGroup(syscall.SIGKILL)
			startGiveUp()
		case <-giveUp:
			// The child ignores SIGKILL (stuck in the kernel). Leave it to
			// the waiting goroutine; report what we know.
			c.mu.Lock()
			res.Duration = time.Since(c.begun)
			c.mu.Unlock()
			res.ExitCode = -1
			return res, ctxErr
		}
	}
}

func (c *child) fillStatus(res *Result) {
	c.mu.Lock()
	res.Duration = c.exitAt.Sub(c.begun)
	c.mu.Unlock()
	st := c.cmd.ProcessState
	if st == nil {
		res.ExitCode = -1
		return
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		res.Signal = ws.Signal()
		res.ExitCode = 128 + int(res.Signal)
		return
	}
	res.ExitCode = st.ExitCode()
}

// pipes are the three streams between Run and the child. The parent's read
// ends are non-blocking (in Go's poller), so closing them unblocks a reader.
// Until register they are bare descriptors, out of the poller, so that
// opening the streams costs the command's hand-over as few system calls as
// it can: the poller's registration comes after it. The child ends stay
// bare descriptors (the caller hands them on by number) unless ChildFiles
// asks for files; an empty stdin is the process-wide /dev/null, never
// closed.
type pipes struct {
	childIn, childOut, childErr     int        // -1 once closed (childIn: never closed when sharedNull)
	childFiles                      []*os.File // made by ChildFiles; they own the child ends then
	sharedNull                      bool       // childIn is devNullFD's
	rawStdinW, rawStdout, rawStderr int        // parent ends before register; -1 none
	stdinW, stdoutR, stderrR        *os.File   // parent ends once registered; stdinW nil for empty stdin

	closeChildOnce, closeParentOnce sync.Once
	stdinClosed                     sync.Once
}

func openPipes(withStdin bool) (_ *pipes, err error) {
	p := &pipes{childIn: -1, childOut: -1, childErr: -1, rawStdinW: -1, rawStdout: -1, rawStderr: -1}
	defer func() {
		if err != nil {
			p.closeAll()
		}
	}()
	if withStdin {
		if p.rawStdinW, p.childIn, err = pipe(false); err != nil {
			return nil, err
		}
	} else if p.childIn, err = devNullFD(); err != nil {
		return nil, err
	} else {
		p.sharedNull = true
	}
	if p.rawStdout, p.childOut, err = pipe(true); err != nil {
		return nil, err
	}
	if p.rawStderr, p.childErr, err = pipe(true); err != nil {
		return nil, err
	}
	return p, nil
}

// register puts the parent ends in the runtime's poller, as files. Called
// once, from Start, after the child ends were handed on.
func (p *pipes) register() {
	wrap := func(fd *int, name string) *os.File {
		if *fd < 0 {
			return nil
		}
		// NewFile puts a non-blocking descriptor in the poller.
		f := os.NewFile(uintptr(*fd), name)
		*fd = -1
		return f
	}
	p.stdinW = wrap(&p.rawStdinW, "|1")
	p.stdoutR = wrap(&p.rawStdout, "|0")
	p.stderrR = wrap(&p.rawStderr, "|0")
}

// pipe returns a close-on-exec pipe as two bare descriptors: the parent end
// (the read end when parentReads, else the write end) non-blocking, the
// child end blocking, as a process expects of its standard streams. Neither
// is in the poller yet: os.Pipe would put both ends in it at once, and the
// child end's registration and removal cost every command four epoll_ctl
// calls for an end the daemon never reads or writes.
func pipe(parentReads bool) (parent, child int, err error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return -1, -1, os.NewSyscallError("pipe2", err)
	}
	pfd, cfd := fds[0], fds[1]
	if !parentReads {
		pfd, cfd = cfd, pfd
	}
	// A pipe's only status flag is the one set here (the access mode is
	// ignored by F_SETFL): one call, not SetNonblock's read and write.
	if _, err := unix.FcntlInt(uintptr(pfd), unix.F_SETFL, unix.O_NONBLOCK); err != nil {
		unix.Close(pfd)
		unix.Close(cfd)
		return -1, -1, os.NewSyscallError("fcntl", err)
	}
	return pfd, cfd, nil
}

// devNull is /dev/null opened once for every command's empty stdin: read
// only, close-on-exec, blocking, out of the poller, never closed.
var devNull struct {
	sync.Mutex
	fd int // 0: not open yet (0 is never ours: it is the daemon's stdin)
}

// devNullFD returns devNull's descriptor, opening it on first use; a
// failure is retried on the next call.
func devNullFD() (int, error) {
	devNull.Lock()
	defer devNull.Unlock()
	for devNull.fd <= 0 {
		fd, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return -1, &os.PathError{Op: "open", Path: os.DevNull, Err: err}
		}
		devNull.fd = fd
	}
	return devNull.fd, nil
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		if f != nil {
			_ = f.Close()
		}
	}
}

func closeFDs(fds ...*int) {
	for _, fd := range fds {
		if *fd >= 0 {
			_ = unix.Close(*fd)
			*fd = -1
		}
	}
}

func (p *pipes) closeChildEnds() {
	p.closeChildOnce.Do(func() {
		if p.childFiles != nil {
			if p.sharedNull {
				p.childFiles[0] = nil // devNull's: not ours to close
			}
			closeAll(p.childFiles...)
			p.childIn, p.childOut, p.childErr = -1, -1, -1
			return
		}
		if p.sharedNull {
			p.childIn = -1
		}
		closeFDs(&p.childIn, &p.childOut, &p.childErr)
	})
}

func (p *pipes) closeStdin() {
	p.stdinClosed.Do(func() {
		closeAll(p.stdinW)
		closeFDs(&p.rawStdinW)
	})
}

func (p *pipes) closeParentEnds() {
	p.closeStdin()
	p.closeParentOnce.Do(func() {
		closeAll(p.stdoutR, p.stderrR)
		closeFDs(&p.rawStdout, &p.rawStderr)
	})
}

func (p *pipes) closeAll() {
	p.closeChildEnds()
	p.closeParentEnds()
}

// startDrains copies both output pipes into their buffers concurrently; the
// returned channel is closed when both have stopped.
// The drain that stops last closes it: no third goroutine waits for them.
func (p *pipes) startDrains(stdout, stderr *Buffer, out OutputFunc) <-chan struct{} {
	done := make(chan struct{})
	var left atomic.Int32
	left.Store(2)
	stop := func() {
		if left.Add(-1) == 0 {
			close(done)
		}
	}
	go func() { defer stop(); drain(p.stdoutR, stdout, out, Stdout) }()
	go func() { defer stop(); drain(p.stderrR, stderr, out, Stderr) }()
	return done
}

// drainBufs recycles the drain loops' read buffers: two per command would
// otherwise be allocated (and zeroed) for every command the daemon runs.
var drainBufs = sync.Pool{New: func() any { b := make([]byte, drainChunk); return &b }}

// drainStarting, when set (tests only), is called by each drain before its
// first read, so a test can hold the drains back past the grace.
var drainStarting func()

// maxSweepReads bounds the reads of what a pipe holds once its drain was
// told to stop (a writer that never stops cannot keep it going).
const maxSweepReads = 64

func drain(r *os.File, w *Buffer, out OutputFunc, stream Stream) {
	bp := drainBufs.Get().(*[]byte)
	defer drainBufs.Put(bp)
	buf := *bp
	if drainStarting != nil {
		drainStarting()
	}
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if out != nil {
				out(stream, buf[:n])
			}
			_, _ = w.Write(buf[:n])
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			sweep(r, w, buf, out, stream)
			return
		}
		if err != nil {
			return
		}
	}
}

// sweep reads what r already holds, without waiting (the parent ends are
// non-blocking), at most maxSweepReads times.
func sweep(r *os.File, w *Buffer, buf []byte, out OutputFunc, stream Stream) {
	rc, err := r.SyscallConn()
	if err != nil {
		return
	}
	for range maxSweepReads {
		n := 0
		var rerr error
		if rc.Control(func(fd uintptr) {
			n, rerr = unix.Read(int(fd), buf)
			for errors.Is(rerr, unix.EINTR) {
				n, rerr = unix.Read(int(fd), buf)
			}
		}) != nil || rerr != nil || n <= 0 {
			return
		}
		if out != nil {
			out(stream, buf[:n])
		}
		_, _ = w.Write(buf[:n])
	}
}

// stopDrains makes both drains keep what their pipes hold and stop.
func (p *pipes) stopDrains() {
	now := time.Now()
	for _, f := range []*os.File{p.stdoutR, p.stderrR} {
		if f.SetReadDeadline(now) != nil {
			// No deadline on this descriptor: closing it is the only
			// way left to stop its drain.
			_ = f.Close()
		}
	}
}

// feedStdin writes data to the child's stdin in the background and closes
// it. A child that never reads leaves the writer blocked until Run closes
// the pipe on the way out.
func (p *pipes) feedStdin(data []byte) {
	if p.stdinW == nil {
		return
	}
	go func() {
		_, _ = io.Copy(p.stdinW, bytes.NewReader(data))
		p.closeStdin()
	}()
}
