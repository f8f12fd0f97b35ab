package lifecycle

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostback"
)

// restart simulates a daemon killed without Close and started again: the
// old manager is abandoned, its journal file closed (the kernel would),
// and a new backend, journal and manager are opened on the same state
// directory and clock.
func (e *testEnv) restart(cfg func(*Config)) *testEnv {
	e.t.Helper()
	require.NoError(e.t, e.journal.Close())
	j, moved, err := OpenJournal(e.stateDir)
	require.NoError(e.t, err)
	require.Empty(e.t, moved)
	e.t.Cleanup(func() { _ = j.Close() })
	bw := e.newBase()
	c := Config{Backend: bw, Journal: j, Now: e.clock.Now}
	if cfg != nil {
		cfg(&c)
	}
	m, err := New(c)
	require.NoError(e.t, err)
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = m.Close(ctx)
	})
	n := &testEnv{t: e.t, m: m, base: bw, be: bw, clock: e.clock, stateDir: e.stateDir, bwrapDir: e.bwrapDir, journal: j, bwrapCfg: e.bwrapCfg}
	n.bw, _ = bw.(*bwrap.Backend)
	n.host, _ = bw.(*hostback.Backend)
	return n
}

func actionsByDo(rep RecoveryReport) map[string][]string {
	out := map[string][]string{}
	for _, a := range rep.Actions {
		out[a.Do] = append(out[a.Do], a.Sandbox)
	}
	for _, ids := range out {
		sort.Strings(ids)
	}
	return out
}

func sorted(ids ...string) []string {
	out := append([]string(nil), ids...)
	sort.Strings(out)
	return out
}

func TestRecoverAfterCrash(t *testing.T) {
	fp := &failpoints{}
	e := newEnv(t, withJournal(), withConfig(func(c *Config) { c.Failpoint = fp.hook }))
	ctx := context.Background()

	connBound := e.create(alice, CreateRequest{})
	kept := e.create(alice, CreateRequest{Owner: "dag/run", TTL: time.Hour, Labels: map[string]string{"task_id": "t1"}})
	_, err := e.m.Attach(ctx, alice, kept.ID, "dag/run", "task-1")
	require.NoError(t, err)
	_, err = e.m.WriteTags(ctx, alice, kept.ID, map[string]string{"team": "data"})
	require.NoError(t, err)
	require.NoError(t, e.m.WriteFile(ctx, alice, kept.ID, "notes.txt", []byte("survives"), 0o644))
	keptBob := e.create(bob, CreateRequest{TTL: 2 * time.Hour})
	expiring := e.create(alice, CreateRequest{TTL: 10 * time.Minute})

	// One stopped half-way through create (the backend made it).
	before := e.journaled()
	fp.arm(FailCreateBackend)
	crashAt(t, FailCreateBackend, func() { _, _ = e.m.Create(ctx, alice, CreateRequest{Owner: "dag/run"}) })
	fp.disarm()
	var halfMade string
	for id, r := range e.journaled() {
		if _, ok := before[id]; !ok {
			halfMade = id
			assert.Equal(t, StateCreating, r.State)
		}
	}
	require.NotEmpty(t, halfMade)

	// One the journal never knew (a sandbox of this backend made by hand,
	// or left over from a lost journal).
	_, err = e.base.Create(ctx, "sc-orphan0000000000", backend.Spec{})
	require.NoError(t, err)
	orphan := "sc-orphan0000000000"

	all := sorted(connBound.ID, kept.ID, keptBob.ID, expiring.ID, halfMade, orphan)
	require.Equal(t, all, e.listed())

	// The daemon dies; 20 minutes later it starts again.
	e.clock.Advance(20 * time.Minute)
	e2 := e.restart(nil)

	// A dry run reports and changes nothing.
	rep, err := e2.m.Recover(ctx, true)
	require.NoError(t, err)
	assert.Equal(t, 2, rep.Adopted)
	assert.Equal(t, 3, rep.Destroyed)
	assert.Equal(t, 1, rep.Swept)
	assert.Zero(t, rep.Failed)
	byDo := actionsByDo(rep)
	assert.Equal(t, sorted(kept.ID, keptBob.ID), byDo["adopt"])
	assert.Equal(t, sorted(connBound.ID, expiring.ID, halfMade), byDo["destroy"])
	assert.Equal(t, []string{orphan}, byDo["sweep"])
	assert.Equal(t, all, e2.listed(), "a dry run destroys nothing")
	assert.Len(t, e2.journaled(), 5, "a dry run deletes no record")
	assert.Empty(t, e2.m.List(admin, ""), "a dry run adopts nothing")
	assert.Equal(t, RecoveryReport{}, e2.m.Stats().Recovery)

	rep, err = e2.m.Recover(ctx, false)
	require.NoError(t, err)
	assert.Equal(t, 2, rep.Adopted)
	assert.Equal(t, 3, rep.Destroyed)
	assert.Equal(t, 1, rep.Swept)
	assert.Zero(t, rep.Failed)
	assert.Empty(t, rep.MovedAside)
	reasons := map[string]string{}
	for _, a := range rep.Actions {
		reasons[a.Sandbox] = a.Reason
	}
	assert.Contains(t, reasons[connBound.ID], "connection-bound")
	assert.Contains(t, reasons[expiring.ID], "expired")
	assert.Contains(t, reasons[halfMade], "during create")

	assert.Equal(t, sorted(kept.ID, keptBob.ID), e2.listed())
	for _, id := range []string{connBound.ID, expiring.ID, halfMade, orphan} {
		assert.False(t, e2.dirExists(id), "%s must be gone", id)
	}
	assert.ElementsMatch(t, []string{kept.ID, keptBob.ID}, mapKeys(e2.journaled()))
	st := e2.m.Stats()
	assert.Equal(t, 2, st.Sandboxes)
	assert.Equal(t, 2, st.Recovery.Adopted)
	assert.Equal(t, 3, st.Recovery.Destroyed)
	assert.Equal(t, 1, st.Recovery.Swept)

	// The adopted sandbox is whole and usable.
	d, ok := e2.m.Describe(kept.ID)
	require.True(t, ok)
	assert.Equal(t, StateReady, d.State)
	assert.Equal(t, "dag/run", d.Owner)
	assert.Equal(t, "task-1", d.Holder)
	assert.Equal(t, map[string]string{"task_id": "t1"}, d.Labels)
	assert.Equal(t, map[string]string{"team": "data"}, d.Tags)
	assert.Equal(t, kept.ExpiresAt.Unix(), d.ExpiresAt.Unix())
	assert.Equal(t, e.workdir(kept.ID), d.Workdir)
	assert.Equal(t, alice.UID, d.UID)
	assert.Equal(t, e.clock.Now(), d.LastUsed, "the idle clock restarts")
	res := e2.exec(alice, kept.ID, "cat notes.txt")
	assert.Equal(t, "survives", string(res.Stdout))
	_, err = e2.m.Exec(ctx, bob, kept.ID, backend.ExecRequest{Command: "true", Timeout: time.Second})
	require.ErrorIs(t, err, backend.ErrNotFound, "ownership survives the restart")
	_, err = e2.m.Attach(ctx, alice, kept.ID, "dag/run", "task-2")
	var hb *HeldByOtherError
	require.ErrorAs(t, err, &hb, "the hold survives the restart")
	e2.exec(bob, keptBob.ID, "true")

	// The adopted sandboxes still expire.
	e.clock.Advance(40 * time.Minute)
	assert.Equal(t, 1, e2.m.Reap())
	assert.Equal(t, []string{keptBob.ID}, e2.listed())
}

func TestRecoverAdoptedGoneFromBackend(t *testing.T) {
	e := newEnv(t, withJournal())
	ctx := context.Background()
	s := e.create(alice, CreateRequest{Owner: "dag/run"})
	// The sandbox vanished while the daemon was down.
	require.NoError(t, e.base.Destroy(ctx, s.ID))

	e2 := e.restart(nil)
	rep, err := e2.m.Recover(ctx, false)
	require.NoError(t, err)
	assert.Zero(t, rep.Adopted)
	assert.Equal(t, 1, rep.Destroyed)
	assert.Contains(t, rep.Actions[0].Reason, "no longer has it")
	assert.Empty(t, e2.journaled())
	assert.Empty(t, e2.m.List(admin, ""))
}

func TestRecoverWithoutJournalSweepsEverything(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a := e.create(alice, CreateRequest{Owner: "dag/run"})
	b := e.create(alice, CreateRequest{})

	m2, err := New(Config{Backend: e.newBase(), Now: e.clock.Now})
	require.NoError(t, err)
	rep, err := m2.Recover(ctx, true)
	require.NoError(t, err)
	assert.Equal(t, 2, rep.Swept)
	assert.Equal(t, sorted(a.ID, b.ID), e.listed())

	rep, err = m2.Recover(ctx, false)
	require.NoError(t, err)
	assert.Equal(t, 2, rep.Swept)
	assert.Zero(t, rep.Adopted+rep.Destroyed+rep.Failed)
	assert.Empty(t, e.listed())
}

func TestRecoverMovedAsideIsReported(t *testing.T) {
	e := newEnv(t, withJournal())
	e.m.NoteJournalMovedAside("/state/journal.db.corrupt-x")
	rep, err := e.m.Recover(context.Background(), false)
	require.NoError(t, err)
	assert.Equal(t, "/state/journal.db.corrupt-x", rep.MovedAside)
	assert.Equal(t, "/state/journal.db.corrupt-x", e.m.Stats().Recovery.MovedAside)
}

// TestCrashAtFailpoints stops create and destroy at each failpoint, checks
// what the journal and the backend hold at that moment, and that recovery
// on a fresh manager cleans it up.
func TestCrashAtFailpoints(t *testing.T) {
	tests := []struct {
		point     string
		destroy   bool  // crash during a destroy (else during a create)
		wantState State // the journal record's state at the crash
		inBackend bool  // whether the backend has the sandbox at the crash
	}{
		{FailCreateJournaled, false, StateCreating, false},
		{FailCreateBackend, false, StateCreating, true},
		{FailDestroyJournal, true, StateDestroying, true},
		{FailDestroyBackend, true, StateDestroying, false},
	}
	for _, tt := range tests {
		t.Run(tt.point, func(t *testing.T) {
			fp := &failpoints{}
			e := newEnv(t, withJournal(), withConfig(func(c *Config) { c.Failpoint = fp.hook }))
			ctx := context.Background()
			bystander := e.create(alice, CreateRequest{Owner: "dag/bystander"})

			var id string
			if tt.destroy {
				id = e.create(alice, CreateRequest{Owner: "dag/run"}).ID
				fp.arm(tt.point)
				crashAt(t, tt.point, func() { _ = e.m.Destroy(ctx, alice, id) })
				fp.disarm()
			} else {
				fp.arm(tt.point)
				crashAt(t, tt.point, func() { _, _ = e.m.Create(ctx, alice, CreateRequest{Owner: "dag/run"}) })
				fp.disarm()
				for rid := range e.journaled() {
					if rid != bystander.ID {
						id = rid
					}
				}
			}
			require.NotEmpty(t, id, "the journal must name the sandbox at the crash")
			jr, ok := e.journaled()[id]
			require.True(t, ok)
			assert.Equal(t, tt.wantState, jr.State)
			assert.Equal(t, tt.inBackend, e.dirExists(id), "backend has the sandbox")

			e2 := e.restart(nil)
			rep, err := e2.m.Recover(ctx, false)
			require.NoError(t, err)
			assert.Equal(t, 1, rep.Adopted, "the bystander")
			assert.Equal(t, 1, rep.Destroyed)
			assert.Zero(t, rep.Swept)
			assert.Zero(t, rep.Failed)
			assert.False(t, e2.dirExists(id))
			assert.Equal(t, []string{bystander.ID}, e2.listed())
			assert.Equal(t, []string{bystander.ID}, mapKeys(e2.journaled()))
			e2.exec(alice, bystander.ID, "true")
		})
	}
}

func TestRecoverDestroyFailureIsRetried(t *testing.T) {
	e := newEnv(t, withJournal())
	ctx := context.Background()
	cb := e.create(alice, CreateRequest{})

	require.NoError(t, e.journal.Close())
	j, _, err := OpenJournal(e.stateDir)
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	fb := &faultyBackend{Backend: e.newBase()}
	fb.destroyFailures.Store(1)
	m2, err := New(Config{Backend: fb, Journal: j, Now: e.clock.Now})
	require.NoError(t, err)

	rep, err := m2.Recover(ctx, false)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Failed)
	assert.Zero(t, rep.Destroyed)
	assert.Equal(t, 1, m2.Stats().PendingDestroy)
	assert.Equal(t, StateDestroying, journalMap(t, j)[cb.ID].State)

	e.clock.Advance(retryBase)
	assert.Equal(t, 1, m2.Reap())
	assert.Zero(t, m2.Stats().PendingDestroy)
	assert.Empty(t, journalMap(t, j))
	assert.False(t, e.dirExists(cb.ID))
}

func TestRecoverBackendListFails(t *testing.T) {
	e := newEnv(t, withJournal())
	ctx := context.Background()
	kept := e.create(alice, CreateRequest{Owner: "dag/run"})
	_, err := e.base.Create(ctx, "sc-orphan1111111111", backend.Spec{})
	require.NoError(t, err)

	require.NoError(t, e.journal.Close())
	j, _, err := OpenJournal(e.stateDir)
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	fb := &faultyBackend{Backend: e.newBase()}
	fb.listFails.Store(true)
	m2, err := New(Config{Backend: fb, Journal: j, Now: e.clock.Now})
	require.NoError(t, err)

	rep, err := m2.Recover(ctx, false)
	require.ErrorIs(t, err, errInjected)
	assert.Equal(t, 1, rep.Adopted, "valid records are adopted unverified")
	assert.Zero(t, rep.Swept, "no sweep without a listing")
	assert.True(t, e.dirExists("sc-orphan1111111111"))
	_, ok := m2.Describe(kept.ID)
	assert.True(t, ok)
}
