package capture

import (
	"bytes"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestStreamsOfAProcessStartedElsewhere hands the child ends to a process
// that Run does not start, as a sandbox's init gets them over a socket.
func TestStreamsOfAProcessStartedElsewhere(t *testing.T) {
	requireTools(t, "/bin/sh", "cat", "head")
	in := bytes.Repeat([]byte("stdin line\n"), 20000) // more than a pipe holds
	s, err := NewStreams(in, 1000)
	if err != nil {
		t.Fatal(err)
	}
	files := s.ChildFiles()
	cmd := exec.Command("/bin/sh", "-c", "cat; head -c 5000 /dev/zero | tr '\\0' x; echo; echo end; echo to-stderr >&2")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = files[0], files[1], files[2]
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.Start()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	res := s.Finish(0)
	// The last 1000 bytes are 995 x's and "\nend\n": the partial line goes.
	if !res.StdoutTruncated || res.StdoutTotal != int64(len(in))+5000+1+4 || string(res.Stdout) != "end\n" {
		t.Errorf("stdout: %d bytes kept of %d, truncated %v, ends %q", len(res.Stdout), res.StdoutTotal, res.StdoutTruncated, res.Stdout[max(0, len(res.Stdout)-10):])
	}
	if string(res.Stderr) != "to-stderr\n" || res.StderrTruncated {
		t.Errorf("stderr %q truncated %v", res.Stderr, res.StderrTruncated)
	}
}

func TestStreamsFinishDoesNotWaitForAGrandchild(t *testing.T) {
	requireTools(t, "/bin/sh", "sleep")
	s, err := NewStreams(nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	files := s.ChildFiles()
	cmd := exec.Command("/bin/sh", "-c", "sleep 1007 & echo started")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = files[0], files[1], files[2]
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.Start()
	_ = cmd.Wait()
	start := time.Now()
	res := s.Finish(100 * time.Millisecond)
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Errorf("Finish took %v with a grandchild holding the pipes", elapsed)
	}
	if string(res.Stdout) != "started\n" {
		t.Errorf("stdout %q", res.Stdout)
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the grandchild, in the shell's group
}

func TestStreamsCloseWithoutStart(t *testing.T) {
	s, err := NewStreams([]byte("x"), 10)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.Close() // twice is fine
}

// Output already in the pipes when the drain grace runs out is kept: a
// daemon stopped (SIGSTOP, a starved host) between a command's exit and
// its drains finds its timer expired and the whole output still queued.
// The drains are held back past the grace to force that interleaving; a
// grandchild holds the pipes, so no EOF ends them first. A soak saw `echo`
// come back with empty stdout when Finish closed the pipes at once.
func TestStreamsKeepQueuedOutputWhenTheGraceRunsOut(t *testing.T) {
	requireTools(t, "/bin/sh", "sleep")
	release := make(chan struct{})
	drainStarting = func() { <-release }
	t.Cleanup(func() { drainStarting = nil })
	s, err := NewStreams(nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	files := s.ChildFiles()
	cmd := exec.Command("/bin/sh", "-c", "sleep 1009 & echo queued; echo err >&2")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = files[0], files[1], files[2]
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }()
	s.Start()
	_ = cmd.Wait()
	go func() { time.Sleep(200 * time.Millisecond); close(release) }() // well past the grace
	start := time.Now()
	res := s.Finish(10 * time.Millisecond)
	if string(res.Stdout) != "queued\n" || string(res.Stderr) != "err\n" {
		t.Errorf("stdout %q, stderr %q: queued output was dropped", res.Stdout, res.Stderr)
	}
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("Finish took %v", elapsed)
	}
}

// An empty stdin is one /dev/null shared by every Streams: neither Close,
// nor Start, nor a collected ChildFiles copy closes it.
func TestStreamsShareOneDevNull(t *testing.T) {
	a, err := NewStreams(nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	null := a.ChildFDs()[0]
	a.Close()
	b, err := NewStreams(nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.ChildFDs()[0]; got != null {
		t.Fatalf("stdin %d, then %d: want the same /dev/null", null, got)
	}
	files := b.ChildFiles() // a copy of its own: collecting it closes only the copy
	if int(files[0].Fd()) == null {
		t.Fatal("ChildFiles handed out the shared /dev/null itself")
	}
	b.Start()
	b.Finish(time.Millisecond)
	files = [3]*os.File{}
	runtime.GC()
	runtime.GC()
	var st, want unix.Stat_t
	if err := unix.Fstat(null, &st); err != nil {
		t.Fatalf("the shared /dev/null was closed: %v", err)
	}
	if err := unix.Stat(os.DevNull, &want); err != nil {
		t.Fatal(err)
	}
	if st.Rdev != want.Rdev || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Fatalf("descriptor %d is no longer /dev/null", null)
	}
	c, err := NewStreams([]byte("x"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if c.ChildFDs()[0] == null {
		t.Error("a non-empty stdin got /dev/null")
	}
	c.Close()
}

// hotStatus is a status socket pair as Hot is given one: the caller's end
// non-blocking, the other end for the test to speak as the process's
// supervisor.
func hotStatus(t *testing.T) (mine int, theirs *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.SetNonblock(fds[1], false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]) })
	theirs = os.NewFile(uintptr(fds[1]), "status-peer")
	t.Cleanup(func() { theirs.Close() })
	return fds[0], theirs
}

// startOn starts sh -c script on s's child ends.
func startOn(t *testing.T, s *Streams, script string) *exec.Cmd {
	t.Helper()
	files := s.ChildFiles()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = files[0], files[1], files[2]
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// A process that ends within Hot's wait: Hot reads its output and the
// supervisor's messages in the caller's goroutine, and Finish has nothing
// left to drain.
func TestStreamsHotSeesAShortProcessEnd(t *testing.T) {
	requireTools(t, "/bin/sh")
	s, err := NewStreams(nil, 4)
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	s.SetOutput(func(st Stream, p []byte) { seen = append(seen, st.String()+":"+string(p)) })
	mine, theirs := hotStatus(t)
	cmd := startOn(t, s, "printf 'out\\n'; printf 'to stderr\\n' >&2")
	go func() {
		_ = cmd.Wait()
		theirs.Write([]byte("started"))
		theirs.Write([]byte("exited"))
	}()
	var msgs []string
	if !s.Hot(mine, 10*time.Second, NoWatch, func(m []byte) bool { msgs = append(msgs, string(m)); return string(m) == "exited" }) {
		t.Fatal("Hot gave up on a process that ended")
	}
	if len(msgs) != 2 || msgs[0] != "started" || msgs[1] != "exited" {
		t.Errorf("messages %q", msgs)
	}
	start := time.Now()
	res := s.Finish(time.Minute)
	if time.Since(start) > time.Second {
		t.Errorf("Finish waited %v after Hot saw both pipes end", time.Since(start))
	}
	if string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" || !res.StderrTruncated || res.StderrTotal != 10 {
		t.Errorf("stdout %q stderr %q (truncated %v, total %d)", res.Stdout, res.Stderr, res.StderrTruncated, res.StderrTotal)
	}
	if got := strings.Join(seen, "|"); !strings.Contains(got, "stdout:out\n") || !strings.Contains(got, "stderr:to stderr\n") {
		t.Errorf("Output saw %q", got)
	}
}

// A watched descriptor that becomes readable (or hangs up) during Hot has
// Ready called once, and Hot goes on to the process's end as before: the
// daemon's hot wait releases a request's connection this way.
func TestStreamsHotWatchReady(t *testing.T) {
	requireTools(t, "/bin/sh")
	s, err := NewStreams(nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	mine, theirs := hotStatus(t)
	var watched [2]int
	if err := unix.Pipe2(watched[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(watched[0])
	cmd := startOn(t, s, "printf out")
	readies := 0
	go func() {
		_ = cmd.Wait()
		unix.Write(watched[1], []byte{1}) // the connection has a request: before the end
		unix.Close(watched[1])
		time.Sleep(20 * time.Millisecond)
		theirs.Write([]byte("exited"))
	}()
	if !s.Hot(mine, 10*time.Second, Watch{FD: watched[0], Ready: func() { readies++ }}, func(m []byte) bool { return string(m) == "exited" }) {
		t.Fatal("Hot gave up on a process that ended")
	}
	if readies != 1 {
		t.Errorf("Ready called %d times, want once", readies)
	}
	if res := s.Finish(time.Minute); string(res.Stdout) != "out" {
		t.Errorf("stdout %q", res.Stdout)
	}
}

// A process that outlives Hot's wait: Hot returns false, and Start and
// Finish get the rest, nothing lost of what Hot read or of the messages.
func TestStreamsHotGivesUpLosingNothing(t *testing.T) {
	requireTools(t, "/bin/sh", "sleep")
	s, err := NewStreams(nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	mine, theirs := hotStatus(t)
	cmd := startOn(t, s, "printf early; sleep 0.3; printf late")
	theirs.Write([]byte("started"))
	var msgs []string
	if s.Hot(mine, 50*time.Millisecond, NoWatch, func(m []byte) bool { msgs = append(msgs, string(m)); return false }) {
		t.Fatal("Hot saw the end of a process still running")
	}
	s.Start()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	res := s.Finish(0)
	if string(res.Stdout) != "earlylate" {
		t.Errorf("stdout %q", res.Stdout)
	}
	if len(msgs) != 1 || msgs[0] != "started" {
		t.Errorf("messages %q", msgs)
	}
}

// Hot leaves to its caller a status socket that ended (the supervisor
// died), and a process with stdin to feed.
func TestStreamsHotStepsAside(t *testing.T) {
	requireTools(t, "/bin/sh", "sleep")
	s, err := NewStreams(nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	mine, theirs := hotStatus(t)
	cmd := startOn(t, s, "sleep 0.2")
	theirs.Close()
	start := time.Now()
	if s.Hot(mine, 10*time.Second, NoWatch, func([]byte) bool { return true }) {
		t.Fatal("Hot decided on a status socket that hung up")
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("Hot waited %v on a hung-up status socket", time.Since(start))
	}
	s.Start()
	_ = cmd.Wait()
	s.Finish(0)

	in, err := NewStreams([]byte("data"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	mine2, _ := hotStatus(t)
	if in.Hot(mine2, time.Second, NoWatch, func([]byte) bool { return true }) {
		t.Fatal("Hot ran for a process with stdin to feed")
	}
}

// Streams never started (the process they were for was never given them)
// finish at once, their pipes closed.
func TestStreamsFinishWithoutStart(t *testing.T) {
	s, err := NewStreams(nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	fds := s.ChildFDs()
	start := time.Now()
	res := s.Finish(time.Minute)
	if time.Since(start) > time.Second || len(res.Stdout) != 0 {
		t.Errorf("Finish without Start took %v: %+v", time.Since(start), res)
	}
	if _, err := unix.FcntlInt(uintptr(fds[1]), unix.F_GETFD, 0); err == nil {
		t.Error("the child's stdout is still open")
	}
}
