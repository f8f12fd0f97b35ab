package lifecycle

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

func TestDestroyRetriedWithBackoff(t *testing.T) {
	var fb *faultyBackend
	e := newEnv(t, withJournal(), withWrapper(func(b backend.Backend) backend.Backend {
		fb = &faultyBackend{Backend: b}
		return fb
	}))
	ctx := context.Background()
	s := e.create(alice, CreateRequest{Owner: "dag/run"})
	other := e.create(alice, CreateRequest{Owner: "dag/run"})

	fb.destroyFailures.Store(2)
	err := e.m.Destroy(ctx, alice, s.ID)
	require.ErrorIs(t, err, errInjected)
	assert.Equal(t, int32(1), fb.destroyCalls.Load())

	// The record stays, marked, journaled as destroying.
	st := e.m.Stats()
	assert.Equal(t, 1, st.PendingDestroy)
	assert.Equal(t, 2, st.Sandboxes)
	d, ok := e.m.Describe(s.ID)
	require.True(t, ok)
	assert.Equal(t, StateDestroying, d.State)
	assert.Equal(t, StateDestroying, e.journaled()[s.ID].State)
	assert.True(t, e.workspaceExists(s.ID))
	// It cannot be used any more, and a second destroy is quiet.
	_, err = e.m.Exec(ctx, alice, s.ID, backend.ExecRequest{Command: "true", Timeout: time.Second})
	require.ErrorIs(t, err, backend.ErrNotFound)
	require.NoError(t, e.m.Destroy(ctx, alice, s.ID))
	assert.Equal(t, int32(1), fb.destroyCalls.Load(), "a pending destroy is the reaper's to retry")
	// It still counts against the quotas and is listed as destroying.
	list := e.m.List(alice, "")
	require.Len(t, list, 2)

	// Before retryAt (now + retryBase) the reaper leaves it alone.
	assert.Zero(t, e.m.Reap())
	e.clock.Advance(retryBase - time.Second)
	assert.Zero(t, e.m.Reap())
	assert.Equal(t, int32(1), fb.destroyCalls.Load())

	// At retryAt it retries; it fails again, and the wait doubles.
	e.clock.Advance(time.Second)
	assert.Zero(t, e.m.Reap(), "the retry failed")
	assert.Equal(t, int32(2), fb.destroyCalls.Load())
	assert.Equal(t, 1, e.m.Stats().PendingDestroy)

	e.clock.Advance(2*retryBase - time.Second)
	assert.Zero(t, e.m.Reap())
	assert.Equal(t, int32(2), fb.destroyCalls.Load(), "the second wait is longer")

	e.clock.Advance(time.Second)
	assert.Equal(t, 1, e.m.Reap())
	assert.Equal(t, int32(3), fb.destroyCalls.Load())
	st = e.m.Stats()
	assert.Zero(t, st.PendingDestroy)
	assert.Equal(t, 1, st.Sandboxes)
	_, ok = e.m.Describe(s.ID)
	assert.False(t, ok, "forgotten once destroyed")
	assert.False(t, e.dirExists(s.ID))
	assert.NotContains(t, e.journaled(), s.ID)
	assert.Equal(t, []string{other.ID}, e.listed())

	// Nothing more to do.
	e.clock.Advance(retryMax)
	assert.Zero(t, e.m.Reap())
	assert.Equal(t, int32(3), fb.destroyCalls.Load())
}

func TestReapedDestroyFailureIsRetried(t *testing.T) {
	var fb *faultyBackend
	e := newEnv(t, withWrapper(func(b backend.Backend) backend.Backend {
		fb = &faultyBackend{Backend: b}
		return fb
	}))
	s := e.create(alice, CreateRequest{TTL: time.Minute})
	fb.destroyFailures.Store(1)
	e.clock.Advance(time.Minute)
	assert.Zero(t, e.m.Reap(), "the expiry destroy failed")
	assert.Equal(t, 1, e.m.Stats().PendingDestroy)
	e.clock.Advance(retryBase)
	assert.Equal(t, 1, e.m.Reap())
	assert.False(t, e.dirExists(s.ID))
	assert.Equal(t, Stats{}, e.m.Stats())
}

func TestDestroyRunReportsFailure(t *testing.T) {
	var fb *faultyBackend
	e := newEnv(t, withWrapper(func(b backend.Backend) backend.Backend {
		fb = &faultyBackend{Backend: b}
		return fb
	}))
	ctx := context.Background()
	e.create(alice, CreateRequest{Owner: "dag/run"})
	e.create(alice, CreateRequest{Owner: "dag/run"})
	fb.destroyFailures.Store(1)
	ids, err := e.m.DestroyRun(ctx, alice, "dag/run")
	require.ErrorIs(t, err, errInjected)
	assert.Len(t, ids, 1, "the one destroyed is reported")
	assert.Equal(t, 1, e.m.Stats().PendingDestroy)
	e.clock.Advance(retryBase)
	assert.Equal(t, 1, e.m.Reap())
	assert.Empty(t, e.listed())
}
