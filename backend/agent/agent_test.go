package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/proclog"
)

// The test binary is a keeper too, as the init's is.
func TestMain(m *testing.M) {
	initproc.Main(KeeperEnv, RunKeeper)
	os.Exit(m.Run())
}

// proc is one process of a test: its files on the host and the table
// that runs it.
type proc struct {
	t                 *testing.T
	tab               *Table
	id                string
	stdout, stderr, x *os.File
	startedPid        int
	startedCalled     bool
}

const testCap = 8192

func startProc(t *testing.T, tab *Table, req Request) *proc {
	t.Helper()
	dir := t.TempDir()
	open := func(name string) *os.File {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE, 0o600)
		require.NoError(t, err)
		t.Cleanup(func() { f.Close() })
		return f
	}
	p := &proc{t: t, tab: tab, id: req.ID, stdout: open("stdout"), stderr: open("stderr"), x: open("exit")}
	require.NoError(t, proclog.Create(p.stdout, testCap))
	require.NoError(t, proclog.Create(p.stderr, testCap))
	reqFD, err := unix.MemfdCreate("req", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	_, err = unix.Write(reqFD, req.Encode())
	require.NoError(t, err)
	dup := func(f *os.File) int {
		fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 3)
		require.NoError(t, err)
		return fd
	}
	null, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	files := Files{Stdin: null, Stdout: dup(p.stdout), Stderr: dup(p.stderr), Exit: dup(p.x), Request: reqFD, OOM: -1}
	require.NoError(t, tab.Start(req.ID, files, func(pid int) { p.startedPid, p.startedCalled = pid, true }))
	return p
}

// serve runs the table's side until cond holds or the deadline: it polls
// the keepers' sockets and reaps the keepers that end.
func serve(t *testing.T, tab *Table, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out")
		fds := tab.PollFDs(nil)
		if len(fds) > 0 {
			_, _ = unix.Poll(fds, 20)
			for _, p := range fds {
				if p.Revents != 0 {
					tab.Handle(int(p.Fd))
				}
			}
		} else {
			time.Sleep(5 * time.Millisecond)
		}
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err != nil || pid <= 0 {
				break
			}
			tab.Reaped(pid)
		}
	}
}

func (p *proc) exit() proclog.Exit {
	x, err := proclog.ReadExit(p.x)
	require.NoError(p.t, err)
	return x
}

func (p *proc) ended() bool {
	_, err := proclog.ReadExit(p.x)
	return err == nil && !p.tab.IsKeeperOf(p.id)
}

func (p *proc) read(f *os.File) string {
	r, err := proclog.ReadAt(f, 0, 1<<20)
	require.NoError(p.t, err)
	return string(r.Data)
}

func shell(id, script string) Request {
	return Request{ID: id, Argv: []string{"/bin/sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"}, Cwd: "/", KillGrace: time.Second}
}

func TestKeeperRunsAProcessToItsEndAndRecordsIt(t *testing.T) {
	tab := &Table{Exe: os.Args[0], Stderr: 2}
	p := startProc(t, tab, shell("p-1", "echo out; echo err >&2; exit 3"))
	serve(t, tab, 10*time.Second, p.ended)
	assert.True(t, p.startedCalled)
	assert.Positive(t, p.startedPid)
	x := p.exit()
	assert.Equal(t, "exited", x.Reason())
	assert.Equal(t, 3, x.ExitCode())
	assert.Equal(t, "out\n", p.read(p.stdout))
	assert.Equal(t, "err\n", p.read(p.stderr))
	assert.EqualValues(t, 4, x.StdoutBytes)
	assert.LessOrEqual(t, x.StartedNS, x.EndedNS)
}

func TestKeeperKeepsTheLastBytesOfALargeOutput(t *testing.T) {
	tab := &Table{Exe: os.Args[0], Stderr: 2}
	p := startProc(t, tab, shell("p-2", "head -c 1000000 /dev/zero | tr '\\0' 'a'; printf END"))
	serve(t, tab, 20*time.Second, p.ended)
	x := p.exit()
	assert.EqualValues(t, 1000003, x.StdoutBytes)
	r, err := proclog.ReadAt(p.stdout, 0, 1<<20)
	require.NoError(t, err)
	assert.EqualValues(t, 1000003-testCap, r.Offset)
	assert.Len(t, r.Data, testCap)
	assert.True(t, strings.HasSuffix(string(r.Data), "aaaEND"))
}

func TestKeeperSignalsItsProcessGroup(t *testing.T) {
	tab := &Table{Exe: os.Args[0], Stderr: 2}
	p := startProc(t, tab, shell("p-3", "sleep 100 & wait"))
	serve(t, tab, 10*time.Second, func() bool { return p.startedCalled })
	require.NoError(t, tab.Signal("p-3", unix.SIGTERM))
	serve(t, tab, 10*time.Second, p.ended)
	x := p.exit()
	assert.Equal(t, "killed", x.Reason())
	assert.Equal(t, 143, x.ExitCode())
	assert.ErrorIs(t, tab.Signal("p-3", unix.SIGTERM), ErrUnknown)
}

func TestKeeperKeepsTheBudget(t *testing.T) {
	tab := &Table{Exe: os.Args[0], Stderr: 2}
	req := shell("p-4", "trap '' TERM; sleep 100")
	req.Timeout, req.KillGrace = 100*time.Millisecond, 100*time.Millisecond
	p := startProc(t, tab, req)
	serve(t, tab, 10*time.Second, p.ended)
	x := p.exit()
	assert.Equal(t, "timed_out", x.Reason())
	assert.EqualValues(t, proclog.TimedKill, x.Timed)
}

// A process's leftovers, a setsid'd one that left its group included,
// end with it: they were re-parented to the keeper, not to init.
func TestKeeperEndsWhatItsProcessLeft(t *testing.T) {
	tab := &Table{Exe: os.Args[0], Stderr: 2}
	marker := filepath.Join(t.TempDir(), "pid")
	p := startProc(t, tab, shell("p-5", "setsid sh -c 'echo $$ > "+marker+"; exec sleep 100' & sleep 0.3"))
	serve(t, tab, 10*time.Second, p.ended)
	b, err := os.ReadFile(marker)
	require.NoError(t, err)
	pid := strings.TrimSpace(string(b))
	_, err = os.Stat("/proc/" + pid)
	if err == nil {
		st, _ := os.ReadFile("/proc/" + pid + "/stat")
		assert.Contains(t, string(st), ") Z", "only a zombie may be left of it")
	}
}

func TestKeeperThatDiesLeavesALostRecord(t *testing.T) {
	tab := &Table{Exe: os.Args[0], Stderr: 2}
	p := startProc(t, tab, shell("p-6", "sleep 100"))
	serve(t, tab, 10*time.Second, func() bool { return p.startedCalled })
	var keeper int
	for pid, e := range tab.byPid {
		if e.id == "p-6" {
			keeper = pid
		}
	}
	require.NoError(t, unix.Kill(keeper, unix.SIGKILL))
	serve(t, tab, 10*time.Second, func() bool { return !tab.IsKeeperOf("p-6") })
	x := p.exit()
	assert.EqualValues(t, proclog.EndLost, x.How)
	assert.Equal(t, "killed", x.Reason())
}

func TestNotRunnableEndsAtOnceAsAShellSays(t *testing.T) {
	tab := &Table{Exe: os.Args[0], Stderr: 2}
	p := startProc(t, tab, Request{ID: "p-7", Argv: []string{"no-such-program"}, Env: []string{"PATH=/bin"}, Cwd: "/"})
	serve(t, tab, 10*time.Second, p.ended)
	assert.Equal(t, 127, p.exit().ExitCode())
	assert.Contains(t, p.read(p.stderr), "cannot run no-such-program")
	assert.Zero(t, p.startedPid)
}

// Without a table entry for them, init's direct children are its
// commands' leftovers: KillForeground ends them, and spares the keepers
// and their processes.
func TestKillForegroundSparesKeepers(t *testing.T) {
	tab := &Table{Exe: os.Args[0], Stderr: 2}
	p := startProc(t, tab, shell("p-8", "sleep 100"))
	serve(t, tab, 10*time.Second, func() bool { return p.startedCalled })
	fg, err := os.StartProcess("/bin/sleep", []string{"sleep", "100"}, &os.ProcAttr{})
	require.NoError(t, err)
	tab.KillForeground(os.Getpid())
	st, err := fg.Wait()
	require.NoError(t, err)
	assert.False(t, st.Exited(), "the foreground process was killed")
	require.True(t, tab.IsKeeperOf("p-8"), "the keeper lives")
	_, state, ok := statOf(p.startedPid)
	require.True(t, ok)
	assert.NotEqual(t, byte('Z'), state, "and its process")
	require.NoError(t, tab.Signal("p-8", unix.SIGKILL))
	serve(t, tab, 10*time.Second, p.ended)
}

func TestRequestDecodeRefusesWhatDoesNotHold(t *testing.T) {
	good := shell("p-9", "true")
	r, err := DecodeRequest(good.Encode())
	require.NoError(t, err)
	assert.Equal(t, good, r)
	for _, bad := range []Request{{ID: "P_9", Argv: []string{"x"}, Cwd: "/"}, {ID: "p", Cwd: "/"}, {ID: "p", Argv: []string{"x"}, Cwd: "rel"}} {
		_, err := DecodeRequest(bad.Encode())
		assert.ErrorIs(t, err, ErrBadRequest, "%+v", bad)
	}
	_, err = DecodeRequest(append(good.Encode(), 0))
	assert.ErrorIs(t, err, ErrBadRequest, "trailing bytes")
}

func FuzzDecodeRequest(f *testing.F) {
	f.Add(shell("p-1", "echo hi").Encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRequest(b)
		if err != nil {
			return
		}
		if _, err := DecodeRequest(r.Encode()); err != nil {
			t.Fatalf("re-encoded request refused: %v", err)
		}
	})
}
