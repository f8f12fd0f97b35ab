package agent

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/proclog"
)

// Contexts against a zygote the test plays over its socket (no python):
// what the agent does with what a zygote and a context say, including
// what a hostile one says, decided deterministically.

// fakeZygote is the zygote's end of a Contexts' socket, and the contexts
// it "forked": each a real process of the test's (a sleep, which the
// agent may kill) and the context's end of its socket.
type fakeZygote struct {
	t    *testing.T
	c    *Contexts
	sock int
}

type fakeContext struct {
	pid, sock int
}

// recorder is a cell's Reply.
type recorder struct {
	started bool
	ended   *CellEnd
	failed  string
}

func (r *recorder) Started()        { r.started = true }
func (r *recorder) Ended(e CellEnd) { r.ended = &e }
func (r *recorder) Failed(errno unix.Errno, reason string) {
	r.failed = errno.Error() + ": " + reason
}

func newFakeZygote(t *testing.T, ready bool) *fakeZygote {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fds[1]) })
	c := &Contexts{}
	c.z = &zygote{pid: -1, sock: fds[0], ready: ready}
	return &fakeZygote{t: t, c: c, sock: fds[1]}
}

// cellFiles are four descriptors on /dev/null, for a cell to own.
func cellFiles(t *testing.T) CellFiles {
	fd := func() int {
		n, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
		require.NoError(t, err)
		return n
	}
	return CellFiles{fd(), fd(), fd(), fd()}
}

// pump runs the agent's side (as init's loop does) until done says so.
func (z *fakeZygote) pump(what string, done func() bool) {
	z.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			z.t.Fatalf("%s: not within 10s", what)
		}
		fds := z.c.PollFDs(nil)
		if _, err := unix.Poll(fds, 20); err != nil && err != unix.EINTR {
			z.t.Fatal(err)
		}
		for _, p := range fds {
			if p.Revents != 0 {
				z.c.Handle(int(p.Fd))
			}
		}
	}
}

// read reads one message the agent sent the zygote.
func (z *fakeZygote) read() string {
	z.t.Helper()
	buf := make([]byte, 4096)
	fds := []unix.PollFd{{Fd: int32(z.sock), Events: unix.POLLIN}}
	if n, err := unix.Poll(fds, 10_000); err != nil || n == 0 {
		z.t.Fatalf("the agent told the zygote nothing within 10s (%v)", err)
	}
	require.NoError(z.t, unix.SetNonblock(z.sock, false))
	n, _, err := unix.Recvfrom(z.sock, buf, 0)
	require.NoError(z.t, err)
	return string(buf[:n])
}

// nothingSaid checks that the agent sent the zygote nothing more.
func (z *fakeZygote) nothingSaid() {
	z.t.Helper()
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(z.sock, buf, unix.MSG_DONTWAIT)
	if err != unix.EAGAIN {
		z.t.Fatalf("the agent told the zygote %q (%v), want nothing", buf[:max(n, 0)], err)
	}
}

// fork answers the agent's "fork NAME" as pyrt.py does.
func (z *fakeZygote) fork(name string) *fakeContext {
	z.t.Helper()
	require.Equal(z.t, "fork "+name, z.read()) // Run asked at once
	sleep := exec.Command("sleep", "60")
	sleep.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(z.t, sleep.Start())
	z.t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	require.NoError(z.t, err)
	require.NoError(z.t, unix.Sendmsg(z.sock, []byte("forked "+name+" "+strconv.Itoa(sleep.Process.Pid)), unix.UnixRights(fds[0]), nil, 0))
	unix.Close(fds[0])
	z.t.Cleanup(func() { unix.Close(fds[1]) })
	return &fakeContext{pid: sleep.Process.Pid, sock: fds[1]}
}

// takeCell receives a cell's "run" and its descriptors, as a context.
func (x *fakeContext) takeCell(t *testing.T) {
	t.Helper()
	buf, oob := make([]byte, 64), make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := unix.Recvmsg(x.sock, buf, oob, 0)
	require.NoError(t, err)
	require.Equal(t, "run", string(buf[:n]))
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	require.NoError(t, err)
	fds, err := unix.ParseUnixRights(&msgs[0])
	require.NoError(t, err)
	require.Len(t, fds, 4)
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func (x *fakeContext) say(t *testing.T, msg string) {
	t.Helper()
	_, err := unix.Write(x.sock, []byte(msg))
	require.NoError(t, err)
}

// A context whose socket closes mid-cell (the kernel killed it) is lost
// only once the zygote says how it died, so that an OOM kill is told as
// one (its SIGKILL), however the two messages are ordered.
func TestContextLostMidCellWaitsForHowItDied(t *testing.T) {
	z := newFakeZygote(t, true)
	r := &recorder{}
	z.c.Run("a", cellFiles(t), time.Minute, time.Second, r)
	x := z.fork("a")
	z.pump("the cell's start", func() bool { return r.started })
	x.takeCell(t)
	require.NoError(t, unix.Shutdown(x.sock, unix.SHUT_RDWR)) // the context died: its socket closes first
	deadline := time.Now().Add(300 * time.Millisecond)
	z.pump("a while", func() bool { return time.Now().After(deadline) })
	require.Nil(t, r.ended, "the cell ended before the zygote said how its context died")
	_, err := unix.Write(z.sock, []byte("died "+strconv.Itoa(x.pid)+" 9")) // killed by SIGKILL
	require.NoError(t, err)
	z.pump("the cell's end", func() bool { return r.ended != nil })
	assert.Equal(t, CellEnd{Lost: true, How: proclog.EndKilled, Code: 9, Count: 1}, *r.ended)
	assert.Empty(t, z.c.List())
}

// Without the zygote's word the cell is lost all the same, after a
// bounded wait.
func TestContextLostMidCellWithoutAWordFromTheZygote(t *testing.T) {
	z := newFakeZygote(t, true)
	r := &recorder{}
	z.c.Run("a", cellFiles(t), time.Minute, time.Second, r)
	x := z.fork("a")
	z.pump("the cell's start", func() bool { return r.started })
	x.takeCell(t)
	require.NoError(t, unix.Shutdown(x.sock, unix.SHUT_RDWR))
	start := time.Now()
	z.pump("the cell's end", func() bool { return r.ended != nil })
	assert.GreaterOrEqual(t, time.Since(start), exitReportGrace-100*time.Millisecond)
	assert.Equal(t, CellEnd{Lost: true, How: proclog.EndLost, Count: 1}, *r.ended)
}

// A context answers only for the cell it runs: a "done" for another
// (a cell that wrote on its own control socket) or for none loses it, and
// the next cell of that name gets a new fork.
func TestContextAnswersOnlyForItsCell(t *testing.T) {
	z := newFakeZygote(t, true)
	r := &recorder{}
	z.c.Run("a", cellFiles(t), time.Minute, time.Second, r)
	x := z.fork("a")
	z.pump("the cell's start", func() bool { return r.started })
	x.takeCell(t)
	x.say(t, "done 1")
	z.pump("the first cell's end", func() bool { return r.ended != nil })
	assert.Equal(t, CellEnd{Count: 1}, *r.ended)
	assert.Equal(t, []ContextInfo{{Name: "a", Count: 1}}, z.c.List())
	// The first cell of a context ended: the zygote is told to fork the
	// next spare now (pyrt.py holds it back during that cell).
	assert.Equal(t, "spare", z.read())

	r = &recorder{}
	z.c.Run("a", cellFiles(t), time.Minute, time.Second, r)
	z.pump("the second cell's start", func() bool { return r.started })
	x.takeCell(t)
	x.say(t, "done 99")
	z.pump("the forged end", func() bool { return r.ended != nil })
	assert.Equal(t, CellEnd{Lost: true, How: proclog.EndLost, Count: 2}, *r.ended)
	assert.Empty(t, z.c.List())
	z.nothingSaid() // no spare after a cell but a first

	// A "done" with no cell running: lost as well.
	r = &recorder{}
	z.c.Run("b", cellFiles(t), time.Minute, time.Second, r)
	y := z.fork("b")
	z.pump("b's cell's start", func() bool { return r.started })
	y.takeCell(t)
	y.say(t, "done 1")
	z.pump("b's cell's end", func() bool { return r.ended != nil })
	assert.Equal(t, "spare", z.read())
	y.say(t, "done 2")
	z.pump("b lost", func() bool { return len(z.c.List()) == 0 })

	r = &recorder{}
	z.c.Run("a", cellFiles(t), time.Minute, time.Second, r)
	z.fork("a") // a fresh context
}

// A zygote may name only a pid that can be its fork, for a context the
// agent asked for: anything else is refused, and what it sent closed.
func TestForkedAnswersAreChecked(t *testing.T) {
	z := newFakeZygote(t, true)
	r := &recorder{}
	z.c.Run("a", cellFiles(t), time.Minute, time.Second, r)
	require.Equal(t, "fork a", z.read())
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(fds[1])
	// A process of the test's, which a fork of a context nobody asked
	// for must not make the agent kill. (Pids the agent must never take,
	// 1 and its own, are not tried here: a regression would kill them.)
	bystander := exec.Command("sleep", "60")
	require.NoError(t, bystander.Start())
	defer func() { _ = bystander.Process.Kill(); _ = bystander.Wait() }()
	for _, bad := range []string{"forked a 0", "forked a -5", "forked a x", "forked nope " + strconv.Itoa(bystander.Process.Pid), "forked"} {
		require.NoError(t, unix.Sendmsg(z.sock, []byte(bad), unix.UnixRights(fds[0]), nil, 0))
	}
	unix.Close(fds[0])
	// Every copy of the socket the agent received is closed: its peer
	// cannot send any more.
	z.pump("the answers read", func() bool {
		return unix.Sendto(fds[1], []byte("x"), unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT, nil) != nil
	})
	assert.False(t, r.started)
	assert.NoError(t, bystander.Process.Signal(syscall.Signal(0)), "the bystander was killed")
	assert.Equal(t, []ContextInfo{{Name: "a"}}, z.c.List(), "the context still waits for its fork")
}

// Prestart's caller hears once the zygote is ready, or that it ended.
func TestPrestartWaitsForTheZygote(t *testing.T) {
	z := newFakeZygote(t, false)
	var got []string
	note := func(err error) {
		if err == nil {
			got = append(got, "ready")
		} else {
			got = append(got, err.Error())
		}
	}
	z.c.Prestart(nil, "", note)
	assert.Empty(t, got)
	_, err := unix.Write(z.sock, []byte("ready 3.11.2"))
	require.NoError(t, err)
	z.pump("ready", func() bool { return len(got) == 1 })
	z.c.Prestart(nil, "", note)
	assert.Equal(t, []string{"ready", "ready"}, got)

	z = newFakeZygote(t, false)
	got = nil
	z.c.Prestart(nil, "", note)
	require.NoError(t, unix.Shutdown(z.sock, unix.SHUT_RDWR))
	z.pump("gone", func() bool { return len(got) == 1 })
	assert.True(t, strings.Contains(got[0], "zygote"), got[0])
}

// A restarted context is kept: listed, idle, at count 0; its process is
// killed and a cell it ran ends lost; its next cell gets a new fork and
// is its first. The other contexts are untouched.
func TestRestartKeepsTheContextFresh(t *testing.T) {
	z := newFakeZygote(t, true)
	assert.False(t, z.c.Restart("a"), "the restart of no context")
	// start runs a cell in name's context, forked for it when x is nil.
	start := func(name string, x *fakeContext) (*recorder, *fakeContext) {
		t.Helper()
		r := &recorder{}
		z.c.Run(name, cellFiles(t), time.Minute, time.Second, r)
		if x == nil {
			x = z.fork(name)
		}
		z.pump(name+"'s cell's start", func() bool { return r.started })
		x.takeCell(t)
		return r, x
	}
	end := func(r *recorder, x *fakeContext, count int) {
		t.Helper()
		x.say(t, "done "+strconv.Itoa(count))
		z.pump("the cell's end", func() bool { return r.ended != nil })
		require.Equal(t, CellEnd{Count: count}, *r.ended)
		if count == 1 {
			require.Equal(t, "spare", z.read(), "a context's first cell ended: the zygote forks the next spare")
		}
	}
	r, b := start("b", nil)
	end(r, b, 1)
	r, a := start("a", nil)
	end(r, a, 1)
	running, _ := start("a", a) // its second cell, running at the restart
	assert.Equal(t, []ContextInfo{{Name: "a", Running: true, Count: 1}, {Name: "b", Count: 1}}, sortedInfo(z.c.List()))

	require.True(t, z.c.Restart("a"))
	require.NotNil(t, running.ended, "the restarted context's cell did not end")
	assert.True(t, running.ended.Lost)
	assert.Equal(t, []ContextInfo{{Name: "a"}, {Name: "b", Count: 1}}, sortedInfo(z.c.List()))
	deadline := time.Now().Add(10 * time.Second)
	for !processEnded(a.pid) {
		require.True(t, time.Now().Before(deadline), "the restarted context's process %d was not killed", a.pid)
		time.Sleep(10 * time.Millisecond)
	}
	// The zygote's word of the old process's death changes nothing.
	_, err := unix.Write(z.sock, []byte("died "+strconv.Itoa(a.pid)+" 9"))
	require.NoError(t, err)
	deadline = time.Now().Add(200 * time.Millisecond)
	z.pump("a while", func() bool { return time.Now().After(deadline) })
	assert.Equal(t, []ContextInfo{{Name: "a"}, {Name: "b", Count: 1}}, sortedInfo(z.c.List()))

	// Its next cell is a new fork's first.
	r, fresh := start("a", nil)
	assert.Equal(t, []ContextInfo{{Name: "a", Running: true}, {Name: "b", Count: 1}}, sortedInfo(z.c.List()))
	end(r, fresh, 1)
	assert.Equal(t, []ContextInfo{{Name: "a", Count: 1}, {Name: "b", Count: 1}}, sortedInfo(z.c.List()))
}

func sortedInfo(list []ContextInfo) []ContextInfo {
	slices.SortFunc(list, func(a, b ContextInfo) int { return strings.Compare(a.Name, b.Name) })
	return list
}

// processEnded reports whether pid is gone or a zombie (killed, not yet
// reaped).
func processEnded(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(f) > 0 && f[0] == "Z"
}
