package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// heldBackend is the real backend whose Adopt reports the sandbox's data
// held elsewhere while held is set, as bwrap does for a disk a dead
// daemon's namespace still has attached.
type heldBackend struct {
	backend.Backend
	held   atomic.Bool
	adopts atomic.Int32
}

func (h *heldBackend) Adopt(ctx context.Context, id string) error {
	h.adopts.Add(1)
	if h.held.Load() {
		return fmt.Errorf("%w: the disk of sandbox %s is still attached by a previous daemon's mount", backend.ErrHeldElsewhere, id)
	}
	return h.Backend.Adopt(ctx, id)
}

func TestBwrapQuarantineKeepsDataUntilAdopted(t *testing.T) {
	e := newEnv(t, withJournal())
	ctx := context.Background()
	kept := e.create(alice, CreateRequest{Owner: "dag/run", TTL: time.Hour})
	require.NoError(t, e.m.WriteFile(ctx, alice, kept.ID, "data.txt", []byte("precious"), 0o644))

	var hb *heldBackend
	e2 := e.restart(func(c *Config) {
		hb = &heldBackend{Backend: c.Backend}
		hb.held.Store(true)
		c.Backend = hb
	})
	rep, err := e2.m.Recover(ctx, false)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.AdoptFailed, "a failed adopt is counted on its own")
	assert.Zero(t, rep.Adopted)
	assert.Zero(t, rep.Destroyed, "and never destroys the sandbox")
	assert.Zero(t, rep.Failed)
	assert.Equal(t, []string{kept.ID}, actionsByDo(rep)["quarantine"])

	st := e2.m.Stats()
	require.Len(t, st.Quarantined, 1)
	assert.Contains(t, st.Quarantined[0].Quarantine, "still attached")
	assert.Equal(t, 1, st.Recovery.AdoptFailed)
	ls := e2.m.List(alice, "")
	require.Len(t, ls, 1)
	assert.Equal(t, StateQuarantined, ls[0].State, "listed as quarantined")

	_, err = e2.m.ReadFile(ctx, alice, kept.ID, "data.txt", 1<<20)
	require.Error(t, err)
	assert.True(t, errors.Is(err, backend.ErrUnavailable), "a quarantined sandbox is unavailable, not gone: %v", err)
	assert.Contains(t, err.Error(), "quarantined")
	_, err = e2.m.ReadFile(ctx, bob, kept.ID, "data.txt", 1<<20)
	assert.True(t, errors.Is(err, backend.ErrNotFound), "another uid does not learn it exists")

	// Neither the reaper nor the retries destroy it while it is held.
	e2.m.Reap()
	e.clock.Advance(5 * time.Second)
	assert.Zero(t, e2.m.RetryQuarantined())
	assert.True(t, e2.dirExists(kept.ID))
	assert.Equal(t, StateReady, e2.journaled()[kept.ID].State, "the journal keeps it ready: the next start adopts it afresh")

	// The old attachment goes: the next retry adopts it.
	hb.held.Store(false)
	e.clock.Advance(time.Minute)
	assert.Equal(t, 1, e2.m.RetryQuarantined())
	got, err := e2.m.ReadFile(ctx, alice, kept.ID, "data.txt", 1<<20)
	require.NoError(t, err)
	assert.Equal(t, "precious", string(got), "its data is intact")
	assert.Empty(t, e2.m.Stats().Quarantined)
}

func TestBwrapQuarantineGivesUpBoundedly(t *testing.T) {
	e := newEnv(t, withJournal())
	ctx := context.Background()
	kept := e.create(alice, CreateRequest{Owner: "dag/run", TTL: 24 * time.Hour})
	var hb *heldBackend
	e2 := e.restart(func(c *Config) {
		hb = &heldBackend{Backend: c.Backend}
		hb.held.Store(true)
		c.Backend = hb
		c.QuarantineRetryFor = time.Minute
	})
	_, err := e2.m.Recover(ctx, false)
	require.NoError(t, err)
	for range 20 {
		e.clock.Advance(10 * time.Second)
		e2.m.RetryQuarantined()
	}
	tries := hb.adopts.Load()
	assert.Less(t, tries, int32(20), "retries back off")
	st := e2.m.Stats()
	require.Len(t, st.Quarantined, 1)
	assert.True(t, st.Quarantined[0].QuarantineGaveUp, "reported failed after the bound")
	e.clock.Advance(time.Hour)
	e2.m.RetryQuarantined()
	assert.Equal(t, tries, hb.adopts.Load(), "and no longer retried")
	_, err = e2.m.ReadFile(ctx, alice, kept.ID, "x", 10)
	assert.Contains(t, err.Error(), "gave up")
	assert.True(t, e2.dirExists(kept.ID), "still kept for its owner or an operator")

	// Its owner may still destroy it.
	require.NoError(t, e2.m.Destroy(ctx, alice, kept.ID))
	assert.False(t, e2.dirExists(kept.ID))
	assert.Empty(t, e2.m.Stats().Quarantined)
}

func TestAdoptDecision(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want adoptOutcome
	}{
		{nil, adoptOK},
		{backend.NotFound("sc-1"), adoptGone},
		{fmt.Errorf("x: %w", backend.ErrHeldElsewhere), adoptQuarantine},
		{fmt.Errorf("x: %w", backend.ErrUnavailable), adoptQuarantine},
		{fmt.Errorf("x: %w", backend.ErrDamaged), adoptQuarantine},
		{context.DeadlineExceeded, adoptQuarantine},
	} {
		assert.Equal(t, tc.want, adoptDecision(tc.err), "%v", tc.err)
	}
}
