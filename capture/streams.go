package capture

import (
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Streams are the three standard streams of one process that the caller
// starts some other way than Run: open them, hand ChildFiles to whatever
// starts the process, Start, and Finish once the process has exited. Output
// is kept exactly as Run keeps it (the tail of each stream, within its
// limit, drained concurrently), stdin is fed in the background, and Finish
// never waits for EOF longer than it is told: a process that left a
// grandchild holding the pipes cannot hold the caller.
//
// Streams know nothing of the process: its budget, its signals and its exit
// are the caller's.
type Streams struct {
	p              *pipes
	stdout, stderr *Buffer
	stdin          []byte
	output         OutputFunc
	drained        <-chan struct{} // nil until Start: after a Hot that saw the end, nothing drains
}

// SetOutput makes every chunk of output also go to out as it is read (see
// Options.Output). Call it before Start.
func (s *Streams) SetOutput(out OutputFunc) { s.output = out }

// NewStreams opens the pipes: stdin is a pipe fed with stdin, or /dev/null
// when stdin is empty; stdout and stderr each keep the last maxOutputBytes
// (zero means DefaultMaxOutputBytes, negative keeps nothing). The caller
// must call Close, or Start and then Finish.
func NewStreams(stdin []byte, maxOutputBytes int) (*Streams, error) {
	p, err := openPipes(len(stdin) > 0)
	if err != nil {
		return nil, err
	}
	if maxOutputBytes == 0 {
		maxOutputBytes = DefaultMaxOutputBytes
	}
	return &Streams{p: p, stdout: NewTail(maxOutputBytes), stderr: NewTail(maxOutputBytes), stdin: stdin}, nil
}

// ChildFDs returns the process's ends: its stdin, stdout and stderr, as
// descriptors to hand on (over a socket, to a fork). They are close-on-exec,
// blocking (as a process expects of its standard streams) and stay open
// until Start or Close; an empty stdin is a /dev/null shared by every
// Streams, which Start and Close leave open.
func (s *Streams) ChildFDs() [3]int {
	return [3]int{s.p.childIn, s.p.childOut, s.p.childErr}
}

// ChildFiles is ChildFDs as files (for exec.Cmd), made on the first call.
// Streams still own them: Start or Close closes them.
func (s *Streams) ChildFiles() [3]*os.File {
	p := s.p
	if p.childFiles == nil {
		if p.sharedNull {
			// A file of the shared descriptor would close it when
			// collected: the caller gets a copy of its own.
			if fd, err := unix.FcntlInt(uintptr(p.childIn), unix.F_DUPFD_CLOEXEC, 0); err == nil {
				p.childIn, p.sharedNull = fd, false
			}
		}
		p.childFiles = []*os.File{os.NewFile(uintptr(p.childIn), "|0"), os.NewFile(uintptr(p.childOut), "|1"), os.NewFile(uintptr(p.childErr), "|1")}
	}
	return [3]*os.File{p.childFiles[0], p.childFiles[1], p.childFiles[2]}
}

// Start closes the caller's copies of the child ends (the process, or
// whoever passed them on, holds its own by now), puts the daemon's ends in
// the runtime's poller, starts draining stdout and stderr and starts feeding
// stdin. It must be called once, before Finish.
func (s *Streams) Start() {
	s.p.closeChildEnds()
	s.p.register()
	s.drained = s.p.startDrains(s.stdout, s.stderr, s.output)
	s.p.feedStdin(s.stdin)
}

// Finish waits at most drainGrace (DefaultDrainGrace if zero or less) for
// both output streams to reach EOF, then has the drains keep what the pipes
// already hold and stop, closes every pipe, which also stops a stdin feeder
// the process never read from, and returns what was kept. Only the output fields of the Result are set.
// Called without Start (and without a Hot that saw the end), it waits for
// nothing: it closes every pipe and returns what was kept.
func (s *Streams) Finish(drainGrace time.Duration) Result {
	if s.drained == nil {
		// Hot saw both pipes end, or nothing was started: no drain to
		// wait for (what the pipes hold unread is not kept).
		s.p.closeAll()
		return s.result()
	}
	if drainGrace <= 0 {
		drainGrace = DefaultDrainGrace
	}
	t := time.NewTimer(drainGrace)
	select {
	case <-s.drained:
	case <-t.C:
		// The grace is over: the drains keep what the pipes already hold,
		// then stop. (A process stopped past the grace, SIGSTOP or a
		// starved host, finds the whole output still queued; closing the
		// pipes now would drop it.)
		s.p.stopDrains()
	}
	t.Stop()
	<-s.drained
	s.p.closeParentEnds()
	return s.result()
}

func (s *Streams) result() Result {
	return Result{
		Stdout: s.stdout.Bytes(), StdoutTruncated: s.stdout.Truncated(), StdoutTotal: s.stdout.Total(),
		Stderr: s.stderr.Bytes(), StderrTruncated: s.stderr.Truncated(), StderrTotal: s.stderr.Total(),
	}
}

// Close closes every pipe that is still open. It is safe to call at any
// time and more than once; after Start, call Finish rather than Close to
// get the output.
func (s *Streams) Close() { s.p.closeAll() }

// Hot waits up to wait, in this goroutine and outside the runtime's
// poller, for a short process to end: it reads both output pipes into
// their buffers (and Output) and hands every message that arrives on the
// caller's status descriptor (non-blocking, a datagram or seqpacket
// socket) to onStatus, until onStatus says the last one came and both
// pipes reached EOF. It then returns true, and Finish returns the output
// without draining anything. Otherwise (the time is up, the status socket
// reached EOF or failed, or stdin has data to feed) it returns false
// having lost nothing: the caller calls Start and goes on as if Hot had
// not run, its buffers and onStatus's state already holding what came.
// It must be called at most once, before Start.
//
// w, when w.FD is not negative, is one more descriptor Hot polls: once it
// is readable or hung up, Hot calls w.Ready (once) and stops watching it.
// The daemon watches the connection a request came on this way while the
// request runs on the connection's reader goroutine (internal/handoff).
//
// Why: a command that ends within microseconds of starting (most of an
// agent's) otherwise costs the daemon the registration of three
// descriptors in the poller, two drain goroutines and a poller wake-up
// for every event (docs/benchmarks-history.md, "A command in a bwrap
// sandbox"). The price is one thread blocked in ppoll for at most wait,
// and a cancellation noticed only after it.
func (s *Streams) Hot(status int, wait time.Duration, w Watch, onStatus func(msg []byte) (last bool)) bool {
	p := s.p
	if s.drained != nil || len(s.stdin) > 0 || p.rawStdout < 0 || p.rawStderr < 0 {
		return false
	}
	p.closeChildEnds()
	bp := drainBufs.Get().(*[]byte)
	defer drainBufs.Put(bp)
	buf := *bp
	var msg [hotMsgMax]byte
	fds := []unix.PollFd{{Fd: int32(status), Events: unix.POLLIN}, {Fd: int32(p.rawStdout), Events: unix.POLLIN}, {Fd: int32(p.rawStderr), Events: unix.POLLIN},
		{Fd: -1}}
	if w.FD >= 0 {
		fds[3] = unix.PollFd{Fd: int32(w.FD), Events: unix.POLLIN | unix.POLLRDHUP}
	}
	outs := [2]struct {
		b      *Buffer
		stream Stream
	}{{s.stdout, Stdout}, {s.stderr, Stderr}}
	last, eof := false, [2]bool{}
	deadline := time.Now().Add(wait)
	for !last || !eof[0] || !eof[1] {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		ts := unix.NsecToTimespec(int64(left))
		if _, err := unix.Ppoll(fds, &ts, nil); err != nil && !errors.Is(err, unix.EINTR) {
			return false
		}
		if fds[3].Revents != 0 {
			fds[3].Fd = -1
			w.Ready()
		}
		if fds[0].Revents != 0 {
			n, err := unix.Read(status, msg[:])
			switch {
			case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
			case err != nil || n == 0:
				return false // the status socket's end is the caller's to judge
			default:
				if onStatus(msg[:n]) {
					last = true
					fds[0].Fd = -1 // ppoll ignores it from now on
				}
			}
		}
		for i := range outs {
			pf := &fds[i+1]
			if pf.Revents == 0 {
				continue
			}
			n, err := unix.Read(int(pf.Fd), buf)
			switch {
			case n > 0:
				if s.output != nil {
					s.output(outs[i].stream, buf[:n])
				}
				_, _ = outs[i].b.Write(buf[:n])
			case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
			default: // EOF, or an error a drain would stop at too
				eof[i] = true
				pf.Fd = -1
			}
		}
	}
	return true
}

// Watch is a descriptor Hot watches besides the command's (see Hot).
type Watch struct {
	FD    int    // -1: none
	Ready func() // called once, when FD is readable or hung up
}

// NoWatch is a Watch of nothing.
var NoWatch = Watch{FD: -1}

// hotMsgMax bounds one status message Hot reads: a longer one is cut
// short, which the caller's decoding refuses as it would a wrong one.
const hotMsgMax = 256
