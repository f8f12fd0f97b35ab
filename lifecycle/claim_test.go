package lifecycle

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// terminates is a script for the host test backend: the command
// "terminate" ends with its sandbox, as a backend that had to destroy the
// sandbox to stop a command reports it.
func terminates(ctx context.Context, id string, req backend.ExecRequest) (backend.ExecResult, error, bool) {
	if req.Command != "terminate" {
		return backend.ExecResult{}, nil, false
	}
	return backend.ExecResult{ExitCode: backend.ExitKilled, SandboxTerminated: true, AppliedTimeout: req.Timeout}, nil, true
}

// A command that ended with its sandbox makes the manager destroy it; the
// reaper running in that moment (the sandbox expired meanwhile) must not
// destroy it a second time. The failpoint runs the reaper exactly between
// Exec's decision and its destroy. Before claimForDestroy, Exec decided
// without claiming the record, so the reaper claimed it too and both asked
// the backend.
func TestExecTerminatedRacingTheReaperDestroysOnce(t *testing.T) {
	var e *testEnv
	reaped := -1
	e = newEnv(t, withHost(terminates), withConfig(func(c *Config) {
		c.Failpoint = func(name string) {
			if name == FailExecTerminated {
				e.clock.Advance(2 * time.Hour) // past the sandbox's life
				reaped = e.m.Reap()
			}
		}
	}))
	s := e.create(alice, CreateRequest{Owner: "dag/run", TTL: time.Hour})
	res, err := e.m.Exec(context.Background(), alice, s.ID, backend.ExecRequest{Command: "terminate", Timeout: time.Minute})
	require.NoError(t, err)
	assert.True(t, res.SandboxTerminated)
	assert.Equal(t, 0, reaped, "the reaper ran at the failpoint and found nothing of its own to destroy")
	assert.Equal(t, 1, e.host.Destroys(s.ID), "one destroy of the terminated sandbox, not one per path that wanted it gone")
	_, ok := e.m.Describe(s.ID)
	assert.False(t, ok, "the sandbox is gone")
}

// Every path into a destroy claims the record first, and only one claim
// wins: a client's destroy of a sandbox the reaper is destroying is a
// no-op, and a failed destroy hands the claim back for the reaper's retry.
func TestClaimForDestroy(t *testing.T) {
	e := newEnv(t, withHost(nil))
	s := e.create(alice, CreateRequest{Owner: "dag/run"})
	e.m.mu.Lock()
	r := e.m.boxes[s.ID]
	first, second := e.m.claimForDestroy(r), e.m.claimForDestroy(r)
	e.m.mu.Unlock()
	assert.True(t, first)
	assert.False(t, second, "a claimed record is nobody else's")
	assert.Equal(t, StateDestroying, r.State)
	require.NoError(t, e.m.Destroy(context.Background(), alice, s.ID), "destroying what is being destroyed is success")
	assert.Equal(t, 0, e.host.Destroys(s.ID), "and asks the backend nothing")
	_, err := e.m.DestroyRun(context.Background(), alice, "dag/run")
	require.NoError(t, err)
	assert.Equal(t, 0, e.host.Destroys(s.ID))
	require.NoError(t, e.m.destroyNow(r, "test", e.m.log))
	assert.Equal(t, 1, e.host.Destroys(s.ID))
}
