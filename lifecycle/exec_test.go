package lifecycle

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

func TestExecOneAtATimePerSandbox(t *testing.T) {
	e := newEnv(t)
	s := e.create(alice, CreateRequest{})
	// The first command runs until the test is done with it (cancelled),
	// and says when it holds the sandbox (a file in the workspace), so the
	// second is tried exactly while it runs, whatever the machine's load.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Exec(ctx, alice, s.ID, backend.ExecRequest{Command: "echo > held; sleep 60", Timeout: time.Minute})
		done <- err
	}()
	marker := e.workdir(s.ID) + "/held"
	require.Eventually(t, func() bool {
		_, err := e.m.ReadFile(context.Background(), alice, s.ID, marker, 16)
		return err == nil
	}, 30*time.Second, 10*time.Millisecond, "the first command never started")
	_, err := e.m.Exec(context.Background(), alice, s.ID, backend.ExecRequest{Command: "true", Timeout: time.Minute})
	var q *QuotaError
	require.ErrorAs(t, err, &q, "a second command while one runs is refused, not queued")
	assert.Equal(t, "commands_per_sandbox", q.Scope)
	assert.Equal(t, 1, q.Limit)
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the cancelled first command never returned")
	}
	_, err = e.m.Exec(context.Background(), alice, s.ID, backend.ExecRequest{Command: "true", Timeout: time.Minute})
	assert.NoError(t, err, "the sandbox takes commands again once the first ended")
}

// Commands in two sandboxes run at once: each says it runs (a file in
// its workspace) and then waits to be let go, which happens only once both
// run. Sequential commands would never both say so.
func TestExecParallelAcrossSandboxes(t *testing.T) {
	e := newEnv(t)
	ids := []string{e.create(alice, CreateRequest{}).ID, e.create(alice, CreateRequest{}).ID}
	errs := make(chan error, len(ids))
	for _, id := range ids {
		go func() {
			res, err := e.m.Exec(context.Background(), alice, id, backend.ExecRequest{
				Command: "echo > running; while [ ! -e go ]; do sleep 0.01; done; echo done", Timeout: time.Minute})
			if err == nil && string(res.Stdout) != "done\n" {
				err = fmt.Errorf("the command: %+v", res)
			}
			errs <- err
		}()
	}
	require.Eventually(t, func() bool {
		for _, id := range ids {
			if _, err := e.m.ReadFile(context.Background(), alice, id, e.workdir(id)+"/running", 16); err != nil {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond, "the commands in two sandboxes never ran at once")
	for _, id := range ids {
		require.NoError(t, e.m.WriteFile(context.Background(), alice, id, e.workdir(id)+"/go", nil, 0o644))
	}
	for range ids {
		select {
		case err := <-errs:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("the released commands did not end")
		}
	}
}

func TestExecTimeoutCutToRemainingLife(t *testing.T) {
	e := newEnv(t)
	s := e.create(alice, CreateRequest{TTL: 3 * time.Second})
	res, err := e.m.Exec(context.Background(), alice, s.ID, backend.ExecRequest{Command: "echo ok", Timeout: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, "ok\n", string(res.Stdout))
	assert.Equal(t, 3*time.Second, res.AppliedTimeout, "cut to what is left of the sandbox's life")

	e.clock.Advance(2500 * time.Millisecond)
	res, err = e.m.Exec(context.Background(), alice, s.ID, backend.ExecRequest{Command: "echo ok", Timeout: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, 500*time.Millisecond, res.AppliedTimeout)

	// A budget shorter than the life left is kept.
	res, err = e.m.Exec(context.Background(), alice, s.ID, backend.ExecRequest{Command: "true", Timeout: 200 * time.Millisecond})
	require.NoError(t, err)
	assert.Equal(t, 200*time.Millisecond, res.AppliedTimeout)

	// The cut budget is really enforced.
	res, err = e.m.Exec(context.Background(), alice, s.ID, backend.ExecRequest{Command: "sleep 20", Timeout: time.Minute})
	require.NoError(t, err)
	assert.True(t, res.TimedOut)
	assert.Less(t, res.Duration, 10*time.Second)
}

func TestExecDestroyedDuringCommand(t *testing.T) {
	e := newEnv(t)
	s := e.create(alice, CreateRequest{})
	// A distinctive command line, to find the process on the host.
	const secs = "37.123"
	type result struct {
		res backend.ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := e.m.Exec(context.Background(), alice, s.ID, backend.ExecRequest{Argv: []string{"sleep", secs}, Timeout: time.Minute})
		done <- result{res, err}
	}()
	require.Eventually(t, func() bool { return len(hostProcesses("sleep", secs)) > 0 }, 10*time.Second, 10*time.Millisecond,
		"the command never started")

	start := time.Now()
	require.NoError(t, e.m.Destroy(context.Background(), alice, s.ID))
	var r result
	select {
	case r = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the command outlived its sandbox")
	}
	require.NoError(t, r.err)
	assert.True(t, r.res.SandboxTerminated)
	assert.False(t, r.res.TimedOut)
	assert.Less(t, time.Since(start), 12*time.Second)
	assert.False(t, e.dirExists(s.ID))
	assert.Empty(t, hostProcesses("sleep", secs))
	_, ok := e.m.Describe(s.ID)
	assert.False(t, ok)
}

func TestExecReapedDuringCommand(t *testing.T) {
	e := newEnv(t)
	s := e.create(alice, CreateRequest{TTL: time.Hour})
	const secs = "38.456"
	done := make(chan backend.ExecResult, 1)
	go func() {
		res, err := e.m.Exec(context.Background(), alice, s.ID, backend.ExecRequest{Argv: []string{"sleep", secs}, Timeout: time.Minute})
		assert.NoError(t, err)
		done <- res
	}()
	require.Eventually(t, func() bool { return len(hostProcesses("sleep", secs)) > 0 }, 10*time.Second, 10*time.Millisecond)
	e.clock.Advance(time.Hour)
	assert.Equal(t, 1, e.m.Reap())
	select {
	case res := <-done:
		assert.True(t, res.SandboxTerminated)
	case <-time.After(15 * time.Second):
		t.Fatal("the command outlived its sandbox")
	}
}

func TestExecHostCommandQuota(t *testing.T) {
	e := newEnv(t, withConfig(func(c *Config) { c.MaxCmdsPerHost = 1 }))
	a := e.create(alice, CreateRequest{})
	// Another uid's command: alice's own limit (one, like the host's) is not
	// what refuses it.
	b := e.create(bob, CreateRequest{})
	const secs = "39.789"
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Exec(context.Background(), alice, a.ID, backend.ExecRequest{Argv: []string{"sleep", secs}, Timeout: time.Minute})
		done <- err
	}()
	require.Eventually(t, func() bool { return e.m.Stats().Commands == 1 }, 10*time.Second, 5*time.Millisecond)
	// Running, not only counted: a destroy before the backend has started
	// it would make it fail with not_found instead of ending it.
	require.Eventually(t, func() bool { return len(hostProcesses("sleep", secs)) > 0 }, 20*time.Second, 5*time.Millisecond)

	_, err := e.m.Exec(context.Background(), bob, b.ID, backend.ExecRequest{Command: "true", Timeout: time.Second})
	var qe *QuotaError
	require.ErrorAs(t, err, &qe)
	assert.Equal(t, "commands_per_host", qe.Scope)
	assert.Equal(t, 1, qe.Limit)

	require.NoError(t, e.m.Destroy(context.Background(), alice, a.ID))
	require.NoError(t, <-done)
	assert.Zero(t, e.m.Stats().Commands)
	e.exec(bob, b.ID, "true")
}

// TestExecUIDCommandQuota: one uid running commands in all its sandboxes
// reaches its own limit (commands_per_uid, three quarters of the host's by
// default) before the host's, so another uid can still run one (#13).
func TestExecUIDCommandQuota(t *testing.T) {
	e := newEnv(t, withConfig(func(c *Config) { c.MaxCmdsPerHost = 4 }))
	require.Equal(t, 3, e.m.Config().MaxCmdsPerUID)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var mine []Sandbox
	for range 4 {
		mine = append(mine, e.create(alice, CreateRequest{}))
	}
	for _, s := range mine[:3] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.m.Exec(ctx, alice, s.ID, backend.ExecRequest{Argv: []string{"sleep", "39.789"}, Timeout: time.Minute})
		}()
	}
	require.Eventually(t, func() bool { return e.m.Stats().Commands == 3 }, 20*time.Second, 5*time.Millisecond)

	_, err := e.m.Exec(context.Background(), alice, mine[3].ID, backend.ExecRequest{Command: "true", Timeout: time.Second})
	var qe *QuotaError
	require.ErrorAs(t, err, &qe)
	assert.Equal(t, "commands_per_uid", qe.Scope)
	assert.Equal(t, 3, qe.Limit)
	assert.Contains(t, qe.Error(), "3 commands of one uid")

	theirs := e.create(bob, CreateRequest{})
	res := e.exec(bob, theirs.ID, "echo mine")
	assert.Equal(t, "mine\n", string(res.Stdout), "another uid still gets a host slot")

	// Alice's slots come back when her commands end.
	cancel()
	wg.Wait()
	require.Eventually(t, func() bool { return e.m.Stats().Commands == 0 }, 20*time.Second, 5*time.Millisecond)
	e.exec(alice, mine[3].ID, "true")
}

func TestDefaultMaxCmdsPerUID(t *testing.T) {
	for host, want := range map[int]int{1: 1, 2: 1, 4: 3, 32: 24, 100: 75} {
		assert.Equal(t, want, DefaultMaxCmdsPerUID(host), "host limit %d", host)
	}
	// An explicit per-uid limit above the host's is cut to it.
	m, err := New(Config{Backend: &faultyBackend{}, MaxCmdsPerHost: 2, MaxCmdsPerUID: 5})
	require.NoError(t, err)
	assert.Equal(t, 2, m.Config().MaxCmdsPerUID)
}

func TestFileOpsThroughManager(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.create(alice, CreateRequest{})
	require.NoError(t, e.m.WriteFile(ctx, alice, s.ID, "dir/a.txt", []byte("hello"), 0o644))
	data, err := e.m.ReadFile(ctx, alice, s.ID, e.workdir(s.ID)+"/dir/a.txt", 100)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(data))
	entries, err := e.m.ListDirectory(ctx, alice, s.ID, "dir", 10)
	require.NoError(t, err)
	assert.Equal(t, []backend.DirEntry{{Name: "a.txt"}}, entries)
	res := e.exec(alice, s.ID, "cat dir/a.txt")
	assert.Equal(t, "hello", string(res.Stdout))

	// A file op counts as use for the idle clock.
	e.clock.Advance(time.Minute)
	_, err = e.m.ReadFile(ctx, alice, s.ID, "dir/a.txt", 100)
	require.NoError(t, err)
	d, _ := e.m.Describe(s.ID)
	assert.Equal(t, e.clock.Now(), d.LastUsed)
}
