package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/cgroup"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

func TestPausedTooLong(t *testing.T) {
	now := clockStart
	paused := Sandbox{ID: "sc-1", State: StateReady, Paused: true, PausedAt: now.Add(-time.Hour), ExpiresAt: now.Add(time.Hour)}
	with := func(f func(*Sandbox)) Sandbox {
		s := paused
		f(&s)
		return s
	}
	tests := []struct {
		name string
		s    Sandbox
		max  time.Duration
		want bool
	}{
		{"no bound", paused, 0, false},
		{"within the bound", paused, 2 * time.Hour, false},
		{"exactly at the bound", paused, time.Hour, true},
		{"past the bound", paused, time.Minute, true},
		{"running", with(func(s *Sandbox) { s.Paused = false }), time.Minute, false},
		{"paused when unknown", with(func(s *Sandbox) { s.PausedAt = time.Time{} }), time.Minute, false},
		{"being destroyed", with(func(s *Sandbox) { s.State = StateDestroying }), time.Minute, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, pausedTooLong(tt.s, now, tt.max) != "")
		})
	}
	// A paused sandbox is never idle, however long ago it was used; it
	// still expires.
	old := with(func(s *Sandbox) { s.LastUsed = now.Add(-24 * time.Hour) })
	assert.Empty(t, reapReason(old, time.Time{}, 0, now, time.Second, time.Minute))
	assert.Equal(t, "idle", reapReason(with(func(s *Sandbox) { s.Paused = false; s.LastUsed = old.LastUsed }), time.Time{}, 0, now, time.Second, time.Minute))
	assert.Equal(t, "expired", reapReason(with(func(s *Sandbox) { s.ExpiresAt = now }), time.Time{}, 0, now, time.Second, time.Minute))
}

func TestPauseGate(t *testing.T) {
	var g pauseGate
	require.True(t, g.tryEnter())
	require.True(t, g.tryEnter())
	closed := make(chan error, 1)
	go func() { closed <- g.close(context.Background()) }()
	// The close waits for both operations inside; meanwhile no one enters.
	require.Eventually(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.closed
	}, 5*time.Second, time.Millisecond)
	require.False(t, g.tryEnter())
	entered := make(chan error, 1)
	go func() { entered <- g.enter(context.Background()) }()
	g.leave()
	select {
	case err := <-closed:
		t.Fatalf("the gate closed with an operation inside: %v", err)
	case <-entered:
		t.Fatal("an operation entered a closing gate")
	case <-time.After(50 * time.Millisecond):
	}
	g.leave()
	require.NoError(t, <-closed)
	select {
	case <-entered:
		t.Fatal("an operation entered a closed gate")
	case <-time.After(50 * time.Millisecond):
	}
	g.open()
	require.NoError(t, <-entered)
	g.leave()

	// A close given up (its context ended) opens the gate again.
	require.True(t, g.tryEnter())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, g.close(ctx), context.DeadlineExceeded)
	require.True(t, g.tryEnter(), "a close that gave up lets operations in")
	g.leave()
	g.leave()
}

// pauseCgroups is a cgroup manager for bwrap sandboxes that can be paused;
// it needs root. Made before the env, its cleanup runs after the env's:
// it kills (and so thaws) what a test left paused.
func pauseCgroups(t *testing.T) *cgroup.Manager {
	t.Helper()
	requireBwrap(t)
	if os.Geteuid() != 0 {
		skipOrFail(t, "pausing a sandbox freezes its cgroup, which needs root here")
	}
	m, err := cgroup.New(cgroup.Options{Base: fmt.Sprintf("sidecar-lifecycle-pause-%d-%d", os.Getpid(), time.Now().UnixNano()), UnderRoot: true})
	if err != nil {
		skipOrFail(t, "cgroups unavailable: %v", err)
	}
	if err := m.CanFreeze(); err != nil {
		skipOrFail(t, "this host's cgroups cannot freeze: %v", err)
	}
	t.Cleanup(func() {
		names, _ := m.List()
		for _, n := range names {
			_ = m.Remove(context.Background(), n)
		}
		_ = m.Release()
	})
	return m
}

// newPauseEnv is a journaled manager on bwrap sandboxes with cgroups.
func newPauseEnv(t *testing.T, opts ...envOpt) *testEnv {
	t.Helper()
	m := pauseCgroups(t)
	opts = append([]envOpt{withJournal(), withBwrapConfig(func(c *bwrap.Config) { c.Cgroups, c.Limits = m, limits.Defaults() })}, opts...)
	return newEnv(t, opts...)
}

// counter starts a durable process in id that writes 1, 2, 3, ... into
// count.txt every 10 ms, and waits for its first number.
func (e *testEnv) counter(id string) backend.ProcessInfo {
	e.t.Helper()
	p, err := e.m.StartProcess(context.Background(), alice, id, backend.ProcessRequest{Command: `i=0; while :; do i=$((i+1)); echo $i > count.tmp; mv count.tmp count.txt; sleep 0.01; done`})
	require.NoError(e.t, err)
	require.Eventually(e.t, func() bool { return e.count(id) > 0 }, 20*time.Second, 10*time.Millisecond)
	return p
}

// count reads id's count.txt from the host: reading it through the
// manager would resume the sandbox.
func (e *testEnv) count(id string) int {
	b, err := os.ReadFile(filepath.Join(e.bwrapDir, id, "work", "count.txt"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// stays requires id's counter to stand still for a while: it is paused.
func (e *testEnv) stays(id, what string) {
	e.t.Helper()
	at := e.count(id)
	time.Sleep(250 * time.Millisecond)
	require.Equal(e.t, at, e.count(id), "%s: a paused sandbox's process went on", what)
}

// goesOn requires id's counter to advance: it runs.
func (e *testEnv) goesOn(id, what string) {
	e.t.Helper()
	at := e.count(id)
	require.Eventually(e.t, func() bool { return e.count(id) > at }, 20*time.Second, 10*time.Millisecond, "%s: the counter stands still", what)
}

func (e *testEnv) pause(id string) Sandbox {
	e.t.Helper()
	s, err := e.m.Pause(context.Background(), alice, id)
	require.NoError(e.t, err)
	require.True(e.t, s.Paused)
	require.False(e.t, s.PausedAt.IsZero())
	require.True(e.t, e.journaled()[id].Paused, "a pause is journaled")
	e.stays(id, "paused")
	return s
}

func (e *testEnv) requireRunning(id, what string) {
	e.t.Helper()
	s, ok := e.m.Describe(id)
	require.True(e.t, ok)
	require.False(e.t, s.Paused, "%s: still paused", what)
	require.False(e.t, e.journaled()[id].Paused, "%s: the journal says paused", what)
	e.goesOn(id, what)
}

// Every use of a paused sandbox resumes it first and then succeeds: a
// command, a file read and write, a listing, a durable process's start,
// read, wait and signal, the list of its processes, a code cell, an
// attach. Listing, tags and renewals leave it paused.
func TestBwrapPauseEveryUseResumesFirst(t *testing.T) {
	e := newPauseEnv(t)
	ctx := context.Background()
	s := e.create(alice, CreateRequest{Owner: "dag/run", TTL: time.Hour})
	id := s.ID
	p := e.counter(id)

	uses := []struct {
		name string
		use  func() error
	}{
		{"run_command", func() error {
			res, err := e.m.Exec(ctx, alice, id, backend.ExecRequest{Command: "cat count.txt", Timeout: 30 * time.Second})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr)
			}
			return err
		}},
		{"read_file", func() error { _, err := e.m.ReadFile(ctx, alice, id, "count.txt", 64); return err }},
		{"write_file", func() error { return e.m.WriteFile(ctx, alice, id, "w.txt", []byte("w"), 0o644) }},
		{"list_directory", func() error { _, err := e.m.ListDirectory(ctx, alice, id, "/workspace", 100); return err }},
		{"start_command", func() error {
			_, err := e.m.StartProcess(ctx, alice, id, backend.ProcessRequest{Command: "true"})
			return err
		}},
		{"read_output", func() error { _, err := e.m.ReadOutput(ctx, alice, id, p.ID, false, 0, 64, 0); return err }},
		{"wait_process", func() error { _, err := e.m.WaitProcess(ctx, alice, id, p.ID, 0); return err }},
		{"list_processes", func() error { _, err := e.m.ListProcesses(ctx, alice, id); return err }},
		{"signal_process", func() error { return e.m.SignalProcess(ctx, alice, id, p.ID, syscall.SIGCONT) }},
		{"list_contexts", func() error { _, err := e.m.ListContexts(ctx, alice, id); return err }},
		{"attach", func() error { _, err := e.m.Attach(ctx, alice, id, "dag/run", "task-2"); return err }},
		{"resume", func() error { _, err := e.m.Resume(ctx, alice, id); return err }},
	}
	for _, u := range uses {
		e.pause(id)
		// What does not use the sandbox leaves it paused.
		listed := e.m.List(alice, "")
		require.Len(t, listed, 1)
		require.True(t, listed[0].Paused, "list shows it paused")
		require.Equal(t, 1, e.m.Stats().Paused)
		_, err := e.m.Renew(ctx, alice, id, time.Hour)
		require.NoError(t, err)
		_, err = e.m.WriteTags(ctx, alice, id, map[string]string{"k": u.name})
		require.NoError(t, err)
		e.stays(id, u.name+": after a listing, a renewal and tags")

		require.NoError(t, u.use(), u.name)
		e.requireRunning(id, u.name)
		require.Zero(t, e.m.Stats().Paused)
	}
	info, err := e.m.WaitProcess(ctx, alice, id, p.ID, 0)
	require.NoError(t, err)
	require.True(t, info.Running, "the durable process went on through every pause: %+v", info)

	// Pausing a paused sandbox, or resuming a running one, changes nothing.
	first := e.pause(id)
	again, err := e.m.Pause(ctx, alice, id)
	require.NoError(t, err)
	require.Equal(t, first.PausedAt, again.PausedAt)
	_, err = e.m.Resume(ctx, alice, id)
	require.NoError(t, err)
	_, err = e.m.Resume(ctx, alice, id)
	require.NoError(t, err)
	e.requireRunning(id, "after two resumes")

	// Another uid's sandbox is not found, paused or not.
	_, err = e.m.Pause(ctx, bob, id)
	require.ErrorIs(t, err, backend.ErrNotFound)
	_, err = e.m.Resume(ctx, bob, id)
	require.ErrorIs(t, err, backend.ErrNotFound)
}

// A pause never stops a command or a cell halfway: it is refused as busy
// while one runs, and a command that comes while a pause is under way
// waits for it, then resumes the sandbox.
func TestBwrapPauseRefusesARunningCommand(t *testing.T) {
	e := newPauseEnv(t)
	ctx := context.Background()
	id := e.create(alice, CreateRequest{Owner: "dag/run"}).ID
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Exec(ctx, alice, id, backend.ExecRequest{Command: "touch started; sleep 2", Timeout: time.Minute})
		done <- err
	}()
	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(e.bwrapDir, id, "work", "started"))
		return err == nil
	}, 20*time.Second, 5*time.Millisecond)
	_, err := e.m.Pause(ctx, alice, id)
	require.ErrorIs(t, err, backend.ErrBusy)
	s, _ := e.m.Describe(id)
	require.False(t, s.Paused, "a refused pause leaves the sandbox running")
	require.NoError(t, <-done)
	e.pause(id)
	res := e.exec(alice, id, "echo after")
	require.Equal(t, "after\n", string(res.Stdout))
	s, _ = e.m.Describe(id)
	require.False(t, s.Paused)
}

// A paused sandbox is never reaped as idle; it expires at its lease, and
// a daemon with MaxPaused destroys one paused longer.
func TestBwrapPausedSandboxLeaseAndMaxPaused(t *testing.T) {
	e := newPauseEnv(t, withConfig(func(c *Config) { c.IdleTimeout = time.Minute; c.MaxPaused = 10 * time.Minute }))
	ctx := context.Background()
	waiting := e.create(alice, CreateRequest{Owner: "dag/run", TTL: time.Hour}).ID
	short := e.create(alice, CreateRequest{Owner: "dag/run", TTL: 5 * time.Minute}).ID
	idle := e.create(alice, CreateRequest{Owner: "dag/run", TTL: time.Hour}).ID
	e.pause(waiting)
	e.pause(short)
	e.clock.Advance(2 * time.Minute)
	// The idle one goes; the paused ones wait (idle timeout 1 min).
	require.Equal(t, 1, e.m.Reap())
	_, ok := e.m.Describe(idle)
	require.False(t, ok, "a running idle sandbox is reaped")
	e.clock.Advance(4 * time.Minute)
	require.Equal(t, 1, e.m.Reap(), "a paused sandbox expires at its lease")
	_, ok = e.m.Describe(short)
	require.False(t, ok)
	_, ok = e.m.Describe(waiting)
	require.True(t, ok, "paused for 6 min, below max_paused")
	e.clock.Advance(5 * time.Minute)
	require.Equal(t, 1, e.m.Reap(), "paused longer than max_paused")
	_, ok = e.m.Describe(waiting)
	require.False(t, ok)
	require.Empty(t, e.listed(), "their sandboxes are gone, processes and all")
	_ = ctx
}

// A pause and a resume cut short by a crash at each failpoint leave the
// sandbox either as it was or as it was asked to be after the restart,
// as the kernel has it whatever the journal says, and never lost: its
// durable process goes on once it is resumed.
func TestBwrapPauseCrashAtFailpoints(t *testing.T) {
	tests := []struct {
		point      string
		resume     bool // crash during a resume (else during a pause)
		wantPaused bool // after the restart
	}{
		{FailPauseBegin, false, false},
		{FailPauseFrozen, false, true},
		{FailResumeBegin, true, true},
		{FailResumeThawed, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.point, func(t *testing.T) {
			fp := &failpoints{}
			e := newPauseEnv(t, withConfig(func(c *Config) { c.Failpoint = fp.hook }))
			ctx := context.Background()
			id := e.create(alice, CreateRequest{Owner: "dag/run"}).ID
			p := e.counter(id)
			if tt.resume {
				e.pause(id)
			}
			fp.arm(tt.point)
			crashAt(t, tt.point, func() {
				if tt.resume {
					_, _ = e.m.Resume(ctx, alice, id)
				} else {
					_, _ = e.m.Pause(ctx, alice, id)
				}
			})
			fp.disarm()

			e2 := e.restart(nil)
			rep, err := e2.m.Recover(ctx, false)
			require.NoError(t, err)
			require.Equal(t, 1, rep.Adopted)
			s, ok := e2.m.Describe(id)
			require.True(t, ok, "the sandbox is kept")
			require.Equal(t, tt.wantPaused, s.Paused, "paused after the restart")
			require.Equal(t, tt.wantPaused, e2.journaled()[id].Paused, "and journaled so")
			if tt.wantPaused {
				e2.stays(id, "paused after the restart")
			} else {
				e2.goesOn(id, "running after the restart")
			}
			// Used, it runs, with its process where it was.
			res := e2.exec(alice, id, "cat count.txt")
			require.Zero(t, res.ExitCode)
			e2.requireRunning(id, "after a command")
			info, err := e2.m.WaitProcess(ctx, alice, id, p.ID, 0)
			require.NoError(t, err)
			require.True(t, info.Running, "the durable process survived: %+v", info)
			require.NoError(t, e2.m.Destroy(ctx, alice, id))
			require.Empty(t, e2.listed())
		})
	}
}

// A paused sandbox survives a restart of the daemon paused, its
// processes with it, whether recovery adopts it before serving or in the
// background; destroying it while paused leaves nothing.
func TestBwrapPausedSandboxAcrossARestart(t *testing.T) {
	for _, lazy := range []bool{false, true} {
		t.Run(fmt.Sprintf("background=%v", lazy), func(t *testing.T) {
			e := newPauseEnv(t)
			ctx := context.Background()
			id := e.create(alice, CreateRequest{Owner: "dag/run"}).ID
			gone := e.create(alice, CreateRequest{Owner: "dag/run"}).ID
			e.counter(id)
			e.counter(gone)
			e.pause(id)
			e.pause(gone)
			e2 := e.restart(func(c *Config) {
				if lazy {
					c.RecoverWithin = time.Millisecond
				}
			})
			_, err := e2.m.Recover(ctx, false)
			require.NoError(t, err)
			for _, s := range e2.m.List(alice, "") {
				require.True(t, s.Paused, "listed paused after the restart: %s", s.ID)
			}
			e2.stays(id, "after the restart")
			require.NoError(t, e2.m.Destroy(ctx, alice, gone), "a paused sandbox is destroyed as it is")
			_, err = os.Stat(filepath.Join(e2.bwrapDir, gone))
			require.True(t, errors.Is(err, os.ErrNotExist))
			_, err = e2.m.Resume(ctx, alice, id)
			require.NoError(t, err)
			e2.requireRunning(id, "resumed after the restart")
			require.Equal(t, 0, e2.m.Stats().Paused)
		})
	}
}

// A snapshot and a fork of a paused sandbox copy its files as they are and
// leave it paused: they are not uses of its processes. (A daemon killed
// while its snapshot holds a sandbox is test/e2e's: a panic here would run
// the hold's release.)
func TestBwrapSnapshotAndForkLeaveAPausedSandboxPaused(t *testing.T) {
	e := newPauseEnv(t)
	ctx := context.Background()
	id := e.create(alice, CreateRequest{Owner: "dag/run"}).ID
	e.counter(id)
	e.pause(id)
	took := false
	_, err := e.m.Snapshot(ctx, alice, id, backend.SnapshotOptions{}, func(src SnapshotSource) (backend.Image, error) {
		took = true
		_, err := os.Stat(filepath.Join(src.Files.Workspace, "count.txt"))
		return backend.Image{Name: "snap"}, err
	})
	require.NoError(t, err)
	require.True(t, took)
	e.stays(id, "after a snapshot")
	fork, err := e.m.Fork(ctx, alice, id, ForkRequest{Count: 1})
	require.NoError(t, err)
	e.stays(id, "after a fork")
	s, _ := e.m.Describe(id)
	require.True(t, s.Paused, "a snapshot and a fork leave a paused sandbox paused")
	require.True(t, e.journaled()[id].Paused)
	data, err := e.m.ReadFile(ctx, alice, fork.Sandboxes[0].ID, "count.txt", 64)
	require.NoError(t, err)
	require.NotEmpty(t, data, "the fork has the paused sandbox's files")
}
