package lifecycle

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// newPoolEnv starts a manager with a warm pool of size n and waits for it
// to fill.
func newPoolEnv(t *testing.T, n int, tweak func(*Config), opts ...envOpt) *testEnv {
	t.Helper()
	opts = append(opts, withConfig(func(c *Config) {
		c.PoolSize = n
		c.ReapInterval = 50 * time.Millisecond
		c.MaxPerUID = 1
		if tweak != nil {
			tweak(c)
		}
	}))
	e := newEnv(t, opts...)
	e.m.Start()
	waitPool(t, e, n)
	return e
}

func waitPool(t *testing.T, e *testEnv, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return e.m.Stats().Pooled == n }, 20*time.Second, 10*time.Millisecond, "the pool fills to %d", n)
}

func TestPoolServesCreatesAndRefills(t *testing.T) {
	e := newPoolEnv(t, 2, nil)
	pooled := map[string]bool{}
	for _, s := range e.m.List(admin, "") {
		assert.Equal(t, StatePooled, s.State)
		pooled[s.ID] = true
	}
	assert.Empty(t, e.m.List(alice, ""), "pool members are not the caller's")

	// A create with env is served from the pool; the env reaches commands.
	s := e.create(alice, CreateRequest{Spec: backend.Spec{Env: map[string]string{"GREETING": "hi", "OVERRIDE": "spec"}}, Labels: map[string]string{"task_id": "t"}})
	assert.True(t, pooled[s.ID], "the sandbox came from the pool")
	assert.Equal(t, StateReady, s.State)
	assert.True(t, s.ConnBound)
	res, err := e.m.Exec(context.Background(), alice, s.ID, backend.ExecRequest{Command: `echo "$GREETING $OVERRIDE"`, Env: map[string]string{"OVERRIDE": "request"}, Timeout: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, "hi request\n", string(res.Stdout))

	// The claimed sandbox counts for alice (MaxPerUID=1), the pool does not.
	_, err = e.m.Create(context.Background(), alice, CreateRequest{})
	var q *QuotaError
	require.ErrorAs(t, err, &q)
	assert.Equal(t, "uid", q.Scope)

	waitPool(t, e, 2)
}

func TestPoolBypassedForSpecsItCannotServe(t *testing.T) {
	e := newPoolEnv(t, 1, nil)
	_, err := e.m.Create(context.Background(), alice, CreateRequest{Spec: backend.Spec{AllowEgressToCIDRs: []string{"10.0.0.0/8"}}})
	assert.ErrorIs(t, err, backend.ErrSpecUnenforceable, "the backend, not the pool, judges the spec")
	assert.Equal(t, 1, e.m.Stats().Pooled, "the pool member was not spent")
	_, err = e.m.Create(context.Background(), alice, CreateRequest{Spec: backend.Spec{Env: map[string]string{"A=B": "x"}}})
	assert.ErrorIs(t, err, backend.ErrInvalidArgument)
	assert.Equal(t, 1, e.m.Stats().Pooled)
}

func TestPoolNeverHandsOneSandboxToTwoCreates(t *testing.T) {
	e := newPoolEnv(t, 5, func(c *Config) { c.MaxPerUID = 100 })
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := Caller{UID: 2000, PID: int32(i), ConnID: uint64(100 + i)}
			s, err := e.m.Create(context.Background(), c, CreateRequest{TTL: time.Hour})
			if assert.NoError(t, err) {
				mu.Lock()
				seen[s.ID]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	assert.Len(t, seen, 20)
	for id, n := range seen {
		assert.Equal(t, 1, n, id)
	}
}

func TestPoolMembersAreJournaledAndReadopted(t *testing.T) {
	e := newPoolEnv(t, 2, nil, withJournal())
	ids := map[string]bool{}
	for _, s := range e.m.List(admin, "") {
		ids[s.ID] = true
	}
	// The journal write follows the in-memory state by a moment.
	require.Eventually(t, func() bool {
		j := e.journaled()
		for id := range ids {
			if j[id].State != StatePooled {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "every pool member journaled as pooled")
	// A new manager on the same journal (a restart) re-adopts them.
	m2, err := New(Config{Backend: e.be, Journal: e.journal, Now: e.clock.Now, PoolSize: 2})
	require.NoError(t, err)
	rep, err := m2.Recover(context.Background(), false)
	require.NoError(t, err)
	assert.Equal(t, 2, rep.Adopted)
	assert.Equal(t, 2, m2.Stats().Pooled)

	// Expired members are destroyed by recovery.
	e.clock.Advance(DefaultMaxLifetime + time.Minute)
	m3, err := New(Config{Backend: e.be, Journal: e.journal, Now: e.clock.Now})
	require.NoError(t, err)
	rep, err = m3.Recover(context.Background(), false)
	require.NoError(t, err)
	assert.Equal(t, 0, rep.Adopted)
	assert.Equal(t, 2, rep.Destroyed)
	for id := range ids {
		assert.False(t, e.dirExists(id))
	}
}

// TestPoolOwnerQuotaIsPerUID: a create served from the pool counts the
// owner quota per (uid, owner) like any create: bob's sandboxes of a run
// named like alice's spend none of hers (#13).
func TestPoolOwnerQuotaIsPerUID(t *testing.T) {
	e := newPoolEnv(t, 1, func(c *Config) { c.MaxPerUID = 4; c.MaxPerOwner = 1 })
	e.create(bob, CreateRequest{Owner: "dag/run"})
	waitPool(t, e, 1)
	var member string
	for _, s := range e.m.List(admin, "") {
		if s.State == StatePooled {
			member = s.ID
		}
	}
	s := e.create(alice, CreateRequest{Owner: "dag/run"})
	assert.Equal(t, member, s.ID, "served from the pool")
	waitPool(t, e, 1)
	_, err := e.m.Create(context.Background(), alice, CreateRequest{Owner: "dag/run"})
	var q *QuotaError
	require.ErrorAs(t, err, &q, "alice's own quota still holds")
	assert.Equal(t, "owner", q.Scope)
}

// warmingBackend records the backend.Warmer calls the manager makes,
// failing the first fail of them, and forwards the others to the backend
// it wraps when that one warms too.
type warmingBackend struct {
	backend.Backend
	mu     sync.Mutex
	warmed []string
	fail   int
}

func (w *warmingBackend) Warm(ctx context.Context, id string) error {
	w.mu.Lock()
	w.warmed = append(w.warmed, id)
	failing := w.fail > 0
	w.fail--
	w.mu.Unlock()
	if failing {
		return fmt.Errorf("%w: warming failed (test)", backend.ErrUnavailable)
	}
	if inner, ok := w.Backend.(backend.Warmer); ok {
		return inner.Warm(ctx, id)
	}
	return nil
}

func (w *warmingBackend) calls() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.warmed)
}

// Every pool member is warmed before it can be claimed; one that cannot be
// warmed is destroyed and replaced, never handed out.
func TestPoolWarmsEveryMember(t *testing.T) {
	var wb *warmingBackend
	e := newPoolEnv(t, 2, nil, withWrapper(func(b backend.Backend) backend.Backend {
		wb = &warmingBackend{Backend: b, fail: 2}
		return wb
	}))
	calls := wb.calls()
	require.GreaterOrEqual(t, len(calls), 4, "two failed warms, then two members")
	failed := calls[:2]
	for _, s := range e.m.List(admin, "") {
		assert.Contains(t, calls[2:], s.ID, "pool member %s was warmed", s.ID)
		assert.NotContains(t, failed, s.ID)
	}
	left, err := e.base.List(context.Background())
	require.NoError(t, err)
	for _, id := range failed {
		assert.NotContains(t, left, id, "a member that could not be warmed is destroyed")
	}
	s := e.create(alice, CreateRequest{})
	assert.Contains(t, calls, s.ID, "the claimed sandbox was warmed")
}

// poolJournaled waits until every pool member of e is journaled as pooled
// (the journal write follows the in-memory state by a moment) and returns
// their ids.
func poolJournaled(t *testing.T, e *testEnv) []string {
	t.Helper()
	var ids []string
	for _, s := range e.m.List(admin, "") {
		if s.State == StatePooled {
			ids = append(ids, s.ID)
		}
	}
	require.Eventually(t, func() bool {
		j := e.journaled()
		for _, id := range ids {
			if j[id].State != StatePooled {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "every pool member journaled as pooled")
	return ids
}

// After a restart the pool members recovery re-adopted are warmed by the
// pool filler (their inits died with the previous daemon), before it makes
// new ones; one that cannot be warmed is destroyed and replaced, never
// handed out cold.
func TestPoolWarmsReadoptedMembers(t *testing.T) {
	e := newPoolEnv(t, 3, nil, withJournal())
	members := poolJournaled(t, e)
	require.Len(t, members, 3)
	closeCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, e.m.Close(closeCtx), "pool members outlive a daemon with a journal")

	var wb *warmingBackend
	e2 := e.restart(func(c *Config) {
		wb = &warmingBackend{Backend: c.Backend, fail: 1}
		c.Backend = wb
		c.PoolSize = 3
		c.ReapInterval = 50 * time.Millisecond
	})
	rep, err := e2.m.Recover(context.Background(), false)
	require.NoError(t, err)
	require.Equal(t, 3, rep.Adopted)
	assert.Empty(t, wb.calls(), "recovery itself warms nothing: the pool filler does, after it")
	e2.m.Start()
	// The first warm fails: that member goes, and a new (warmed) one
	// takes its place.
	require.Eventually(t, func() bool {
		calls := wb.calls()
		return len(calls) >= 4 && e2.m.Stats().Pooled == 3
	}, 20*time.Second, 10*time.Millisecond, "three re-adopted members warmed (one failing), one replacement made and warmed")
	calls := wb.calls()
	failed := calls[0]
	assert.ElementsMatch(t, members, calls[:3], "every re-adopted member is warmed before a new one is made")
	assert.NotContains(t, e2.listed(), failed, "a member that could not be warmed is destroyed")
	for _, s := range e2.m.List(admin, "") {
		assert.Contains(t, calls, s.ID, "pool member %s was warmed", s.ID)
		assert.NotEqual(t, failed, s.ID)
	}
	// Nothing is warmed twice.
	seen := map[string]int{}
	for _, id := range wb.calls() {
		seen[id]++
	}
	for id, n := range seen {
		assert.Equal(t, 1, n, "warmed %d times: %s", n, id)
	}
}

// A claim takes a warm member before a cold one (recovery re-adopted it,
// the filler has not warmed it yet), even an older one.
func TestPoolClaimPrefersWarmMembers(t *testing.T) {
	e := newEnv(t, withConfig(func(c *Config) { c.PoolSize = 2 }))
	older := e.create(admin, CreateRequest{TTL: time.Hour})
	newer := e.create(admin, CreateRequest{TTL: time.Hour})
	e.m.mu.Lock()
	for _, s := range []Sandbox{older, newer} {
		r := e.m.boxes[s.ID]
		r.State, r.Pooled, r.UID, r.Owner = StatePooled, true, 0, ""
	}
	e.m.boxes[older.ID].CreatedAt = clockStart.Add(-time.Hour)
	e.m.boxes[newer.ID].warm = true
	e.m.mu.Unlock()
	s := e.create(alice, CreateRequest{})
	assert.Equal(t, newer.ID, s.ID, "the warm member, though the newer")
	s = e.create(bob, CreateRequest{})
	assert.Equal(t, older.ID, s.ID, "then the cold one")
}

// sandboxInit returns the host pid of bwrap sandbox id's init, 0 if it has
// none: the process bwrap started with the init flag and the sandbox's
// marker (SANDBOX_SIDECAR_SANDBOX, which ends in the sandbox's id; how
// the backend finds its processes on the host).
func sandboxInit(id string) int {
	matches, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		vars := strings.Split(string(b), "\x00")
		isInit := slices.Contains(vars, "SANDBOX_SIDECAR_INIT=1")
		ours := slices.ContainsFunc(vars, func(v string) bool {
			return strings.HasPrefix(v, "SANDBOX_SIDECAR_SANDBOX=") && strings.HasSuffix(v, "-"+id)
		})
		if isInit && ours {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(m)))
			return pid
		}
	}
	return 0
}

// A daemon restarted with a warm pool on bwrap: the members' inits outlive
// the daemon that made them, and the next one re-attaches to them, so a
// claimed member's first command runs in the init that was already
// running, as a member made by this daemon does.
func TestBwrapPoolMembersReadoptedAreWarm(t *testing.T) {
	e := newPoolEnv(t, 2, nil, withBwrap(), withJournal())
	members := poolJournaled(t, e)
	require.Len(t, members, 2)
	inits := map[string]int{}
	for _, id := range members {
		inits[id] = sandboxInit(id)
		require.NotZero(t, inits[id], "a member this daemon made is warm")
	}
	// The daemon stops: its manager keeps the pool (journaled), and the
	// members' inits go on.
	closeCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, e.m.Close(closeCtx))
	require.NoError(t, e.bw.Close())
	for _, id := range members {
		assert.Equal(t, inits[id], sandboxInit(id), "the init of %s outlived its daemon", id)
	}

	e2 := e.restart(func(c *Config) {
		c.PoolSize = 2
		c.ReapInterval = 50 * time.Millisecond
		c.RecoverWithin = time.Millisecond // adopt in the background too
	})
	rep, err := e2.m.Recover(context.Background(), false)
	require.NoError(t, err)
	require.Equal(t, 2, rep.Adopted+rep.Pending)
	e2.m.Start()
	assert.Eventually(t, func() bool { return e2.m.Stats().Pooled == 2 }, 20*time.Second, 10*time.Millisecond, "the re-adopted members are the pool: none made anew")

	s := e2.create(alice, CreateRequest{})
	require.Contains(t, members, s.ID, "served from the re-adopted pool")
	res := e2.exec(alice, s.ID, "cat /proc/1/comm")
	assert.Equal(t, "sandbox-init\n", string(res.Stdout))
	assert.Equal(t, inits[s.ID], sandboxInit(s.ID), "the first command ran in the init that outlived the previous daemon")
}

func TestRefillDelay(t *testing.T) {
	const quiet, maxDelay = 50 * time.Millisecond, time.Second
	now := clockStart
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	for _, c := range []struct {
		name        string
		claimed     time.Time
		lastCommand time.Time
		empty       bool
		want        time.Duration
	}{
		{"no claim yet", time.Time{}, ago(time.Millisecond), false, 0},
		{"a claim just now, no command since", now, ago(time.Hour), false, quiet},
		{"a claim just now, its pool empty", now, ago(time.Hour), true, 0},
		{"a command just ended after the claim", ago(10 * time.Millisecond), now, false, quiet},
		{"quiet for 20ms after a command", ago(100 * time.Millisecond), ago(20 * time.Millisecond), false, 30 * time.Millisecond},
		{"quiet long enough", ago(100 * time.Millisecond), ago(60 * time.Millisecond), false, 0},
		{"a command before the claim counts from the claim", ago(10 * time.Millisecond), ago(30 * time.Millisecond), false, 40 * time.Millisecond},
		{"never quiet: the bound", ago(990 * time.Millisecond), now, false, 10 * time.Millisecond},
		{"past the bound", ago(2 * time.Second), now, false, 0},
		{"a claim long past", ago(time.Hour), ago(time.Hour), false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, refillDelay(now, c.claimed, c.lastCommand, c.empty, quiet, maxDelay))
		})
	}
}

// After a claim the pool's refill waits while the host runs commands (the
// claimed sandbox's first ones, here) and comes once it is quiet.
func TestPoolRefillWaitsForAQuietHost(t *testing.T) {
	const quiet = 700 * time.Millisecond
	e := newPoolEnv(t, 2, func(c *Config) {
		c.PoolRefillQuiet, c.PoolRefillMaxDelay = quiet, time.Hour
	})
	s := e.create(alice, CreateRequest{})
	require.Equal(t, 1, e.m.Stats().Pooled)
	// Commands back to back for twice the quiet time: no refill meanwhile
	// (it would fail only if two commands were a whole quiet time apart).
	for start := time.Now(); time.Since(start) < 2*quiet; {
		_, err := e.m.Exec(context.Background(), alice, s.ID, backend.ExecRequest{Argv: []string{"true"}, Timeout: time.Minute})
		require.NoError(t, err)
		st := e.m.Stats()
		require.Equal(t, 1, st.Pooled+st.Creating, "no refill while commands run")
	}
	ended := time.Now()
	waitPool(t, e, 2)
	assert.GreaterOrEqual(t, time.Since(ended), quiet, "the refill waited for a quiet host")
}

// A claim that empties its image's pool has it refilled at once: the next
// create would be a cold one. One that leaves a member waits, at most
// PoolRefillMaxDelay.
func TestPoolRefillOfAnEmptyPoolIsAtOnce(t *testing.T) {
	e := newPoolEnv(t, 2, func(c *Config) {
		c.PoolRefillQuiet, c.PoolRefillMaxDelay = time.Hour, time.Hour
	})
	e.create(alice, CreateRequest{})
	assert.Never(t, func() bool { st := e.m.Stats(); return st.Pooled+st.Creating > 1 }, 300*time.Millisecond, 10*time.Millisecond,
		"a claim that leaves a member waits for a quiet host")
	e.create(bob, CreateRequest{})
	waitPool(t, e, 2)

	e = newPoolEnv(t, 2, func(c *Config) {
		c.PoolRefillQuiet, c.PoolRefillMaxDelay = time.Hour, 200*time.Millisecond
	})
	e.create(alice, CreateRequest{})
	waitPool(t, e, 2) // within PoolRefillMaxDelay, though never quiet enough
}
