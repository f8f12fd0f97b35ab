package procstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/proclog"
)

// The test binary is a keeper too, as the sandbox's init is.
func TestMain(m *testing.M) {
	initproc.Main(agent.KeeperEnv, agent.RunKeeper)
	os.Exit(m.Run())
}

// hostAgent is an agent.Table run by this test process, as a sandbox's
// init runs it: its keepers run on the host, and a goroutine plays init's
// loop (their sockets, their ends).
type hostAgent struct {
	mu  sync.Mutex
	tab *agent.Table
}

func newHostAgent(t *testing.T) *hostAgent {
	a := &hostAgent{tab: &agent.Table{Exe: os.Args[0], Stderr: 2}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			a.mu.Lock()
			fds := a.tab.PollFDs(nil)
			a.mu.Unlock()
			if len(fds) > 0 {
				_, _ = unix.Poll(fds, 10)
			} else {
				time.Sleep(10 * time.Millisecond)
			}
			a.mu.Lock()
			for _, p := range fds {
				if p.Revents != 0 {
					a.tab.Handle(int(p.Fd))
				}
			}
			for {
				var ws unix.WaitStatus
				pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
				if err != nil || pid <= 0 {
					break
				}
				a.tab.Reaped(pid)
			}
			a.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return a
}

func (a *hostAgent) StartKeeper(ctx context.Context, req agent.Request, f Files) (int, error) {
	dup := func(x *os.File) int {
		if x == nil {
			return -1
		}
		fd, err := unix.FcntlInt(x.Fd(), unix.F_DUPFD_CLOEXEC, 3)
		if err != nil {
			return -1
		}
		return fd
	}
	reqFD, err := unix.MemfdCreate("req", unix.MFD_CLOEXEC)
	if err != nil {
		return 0, err
	}
	if _, err := unix.Write(reqFD, req.Encode()); err != nil {
		return 0, err
	}
	started := make(chan int, 1)
	a.mu.Lock()
	err = a.tab.Start(req.ID, agent.Files{Stdin: dup(f.Stdin), Stdout: dup(f.Stdout), Stderr: dup(f.Stderr), Exit: dup(f.Exit), Request: reqFD, OOM: dup(f.OOM)},
		func(pid int) { started <- pid })
	a.mu.Unlock()
	if err != nil {
		return 0, err
	}
	select {
	case pid := <-started:
		return pid, nil
	case <-time.After(10 * time.Second):
		return 0, errors.New("the keeper did not say it started")
	}
}

func (a *hostAgent) SignalKeeper(ctx context.Context, proc string, sig syscall.Signal) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.tab.Signal(proc, sig); err != nil {
		return backend.ErrProcessEnded
	}
	return nil
}

func (a *hostAgent) AgentAlive() bool { return true }

func spec(script string) StartSpec {
	return StartSpec{Command: script, Request: agent.Request{Argv: []string{"/bin/sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"}, Cwd: "/"}}
}

// A process that writes and ends between a read's look at its state and
// its read of the log (forced: the read is held there until the process
// has ended) is reported running with the bytes it wrote, and the next
// read finds its end: a follower never stops short of its last bytes.
func TestReadNeverReportsAnEndBeforeTheLastBytes(t *testing.T) {
	a := newHostAgent(t)
	s := New(filepath.Join(t.TempDir(), "procs"), Limits{}, &Watcher{})
	p, err := s.Start(context.Background(), a, spec("sleep 1; echo last; exit 3"))
	require.NoError(t, err)
	s.afterState = func() {
		s.afterState = nil
		// Held here until the process (which waits 1 s) has written
		// and ended.
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := readExit(filepath.Join(s.Dir(), p.ID, exitFile)); err == nil {
				return
			}
			require.True(t, time.Now().Before(deadline), "the process ended")
			time.Sleep(5 * time.Millisecond)
		}
	}
	first, err := s.Read(context.Background(), a, p.ID, false, 0, 100, 0)
	require.NoError(t, err)
	// What a follower relies on: a read that says the process ended has
	// read up to the end of its stream.
	if !first.Process.Running {
		assert.Equal(t, first.Process.StdoutBytes, first.NextOffset, "an end reported before the last bytes")
	}
	assert.True(t, first.Process.Running, "its state was looked at while it ran")
	assert.Equal(t, "last\n", string(first.Data), "the bytes it wrote before it ended")
	end, err := s.Read(context.Background(), a, p.ID, false, first.NextOffset, 100, 5*time.Second)
	require.NoError(t, err)
	assert.False(t, end.Process.Running)
	assert.Equal(t, 3, end.Process.ExitCode)
	assert.Equal(t, "last\n", string(first.Data)+string(end.Data), "every byte, in order")
}

// Starts past MaxRunning are refused, ended records past MaxEnded are
// dropped oldest first, and a name starts once.
func TestStoreBounds(t *testing.T) {
	a := newHostAgent(t)
	s := New(filepath.Join(t.TempDir(), "procs"), Limits{MaxRunning: 2, MaxEnded: 2, LogBytes: 4096}, &Watcher{})
	ctx := context.Background()
	var sleepers []string
	for range 2 {
		p, err := s.Start(ctx, a, spec("sleep 60"))
		require.NoError(t, err)
		sleepers = append(sleepers, p.ID)
	}
	_, err := s.Start(ctx, a, spec("true"))
	var q *backend.ProcessQuotaError
	require.ErrorAs(t, err, &q)
	assert.Equal(t, 2, q.Limit)
	for _, id := range sleepers {
		require.NoError(t, s.Signal(ctx, a, id, syscall.SIGKILL))
		_, err := s.Wait(ctx, a, id, 10*time.Second)
		require.NoError(t, err)
	}
	named := spec("true")
	named.Name = "once"
	first, err := s.Start(ctx, a, named)
	require.NoError(t, err)
	again, err := s.Start(ctx, a, named)
	require.NoError(t, err)
	assert.True(t, again.Existing)
	assert.Equal(t, first.ID, again.ID)
	_, err = s.Wait(ctx, a, first.ID, 10*time.Second)
	require.NoError(t, err)
	list, err := s.List(true)
	require.NoError(t, err)
	assert.LessOrEqual(t, len(list), 2)
	_, err = s.Info(sleepers[0], true)
	assert.ErrorIs(t, err, backend.ErrProcessNotFound, "the oldest ended record was dropped")
}

// A process without an exit record ends when the agent says it never got
// it (Unstarted: killed, no end time) or the agent is gone for good
// (AgentReplaced: sandbox_terminated), and reads so while the next agent
// runs; one that the agent runs, or that had ended, keeps its own state.
func TestRecordsWithoutAnAgentsKeeperEnd(t *testing.T) {
	s := New(filepath.Join(t.TempDir(), "procs"), Limits{}, nil)
	if n, err := s.Unstarted(nil); n != 0 || err != nil {
		t.Fatalf("Unstarted before any process: %d, %v", n, err)
	}
	mk := func(id string) Files {
		require.NoError(t, os.MkdirAll(s.dir, 0o700))
		f, err := s.create(meta{ID: id, Command: "sleep 600", StartedNS: time.Now().UnixNano()})
		require.NoError(t, err)
		t.Cleanup(f.Close)
		return f
	}
	mk("p-000000000001")
	ended := mk("p-000000000002")
	mk("p-000000000003")
	mk("p-000000000004")
	require.NoError(t, proclog.WriteExit(ended.Exit, proclog.Exit{How: proclog.EndExited, Code: 3, EndedNS: time.Now().UnixNano()}))

	// The agent runs p-3 and p-4: only p-1 never got a keeper.
	n, err := s.Unstarted([]string{"p-000000000003", "p-000000000004"})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	p, err := s.Info("p-000000000001", true)
	require.NoError(t, err)
	assert.False(t, p.Running)
	assert.Equal(t, "killed", p.Reason)
	assert.Equal(t, 137, p.ExitCode)
	assert.True(t, p.EndedAt.IsZero(), "when it ended is not known")
	p, err = s.Info("p-000000000003", true)
	require.NoError(t, err)
	assert.True(t, p.Running, "a process the agent runs")

	// Then the agent is gone: what had no end ends with it.
	require.NoError(t, s.AgentReplaced())
	p, err = s.Info("p-000000000004", true)
	require.NoError(t, err)
	assert.Equal(t, "sandbox_terminated", p.Reason, "while a next agent runs too")
	assert.Equal(t, 137, p.ExitCode)
	p, err = s.Info("p-000000000002", true)
	require.NoError(t, err)
	assert.Equal(t, "exited", p.Reason)
	assert.Equal(t, 3, p.ExitCode)
	p, err = s.Info("p-000000000001", true)
	require.NoError(t, err)
	assert.Equal(t, "killed", p.Reason, "an end said once stays")
}

// goneClient is an agent whose caller goes away just after the agent
// took a start (the keeper runs): like the backends' agents, it then
// answers with the caller's cancellation, unless the store kept that
// from reaching it.
type goneClient struct {
	*hostAgent
	cancel context.CancelFunc
}

func (a goneClient) StartKeeper(ctx context.Context, req agent.Request, f Files) (int, error) {
	pid, err := a.hostAgent.StartKeeper(ctx, req, f)
	a.cancel()
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	return pid, err
}

// A start whose client goes away once the agent has it is kept: the
// process runs, so its record stays, listed and readable (removed, the
// keeper would run unseen, and on gVisor the next checkpoint could not be
// restored: its sentry holds the removed directory).
func TestStartKeptWhenTheClientGoesAwayAfterTheAgentTookIt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	a := goneClient{hostAgent: newHostAgent(t), cancel: cancel}
	s := New(filepath.Join(t.TempDir(), "procs"), Limits{}, &Watcher{})
	p, err := s.Start(ctx, a, spec("echo started; sleep 600"))
	require.NoError(t, err, "the start reached the agent")
	require.Error(t, ctx.Err(), "the client went away during the start")
	list, err := s.List(true)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, p.ID, list[0].ID)
	assert.True(t, list[0].Running)
	require.NoError(t, s.Signal(context.Background(), a, p.ID, syscall.SIGKILL))
	w, err := s.Wait(context.Background(), a, p.ID, 30*time.Second)
	require.NoError(t, err)
	assert.False(t, w.Running)
}
