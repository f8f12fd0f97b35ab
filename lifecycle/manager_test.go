package lifecycle

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

func TestNewNeedsBackend(t *testing.T) {
	_, err := New(Config{})
	require.Error(t, err)
}

func TestNewAppliesDefaults(t *testing.T) {
	e := newEnv(t)
	c := e.m.Config()
	assert.Equal(t, DefaultConnGrace, c.ConnGrace)
	assert.Equal(t, DefaultMaxLifetime, c.MaxLifetime)
	assert.Equal(t, DefaultTTL, c.DefaultTTL)
	assert.Equal(t, DefaultMaxPerHost, c.MaxPerHost)
	assert.Equal(t, DefaultMaxPerUID, c.MaxPerUID)
	assert.Equal(t, DefaultMaxPerOwner, c.MaxPerOwner)
	assert.Equal(t, DefaultMaxCmdsPerHost, c.MaxCmdsPerHost)
	assert.Same(t, e.base, e.m.Backend())

	// DefaultTTL never exceeds MaxLifetime.
	m, err := New(Config{Backend: e.base, MaxLifetime: time.Minute, DefaultTTL: time.Hour})
	require.NoError(t, err)
	assert.Equal(t, time.Minute, m.Config().DefaultTTL)
}

func TestCreateKinds(t *testing.T) {
	e := newEnv(t, withConfig(func(c *Config) {
		c.MaxLifetime = 6 * time.Hour
		c.DefaultTTL = 2 * time.Hour
	}))
	now := e.clock.Now()

	t.Run("connection-bound", func(t *testing.T) {
		s := e.create(alice, CreateRequest{Labels: map[string]string{"dag_id": "d"}})
		assert.True(t, s.ConnBound)
		assert.Equal(t, alice.ConnID, s.ConnID)
		assert.Equal(t, now.Add(6*time.Hour), s.ExpiresAt, "a connection-bound sandbox still has the hard cap")
		assert.Equal(t, now, s.CreatedAt)
		assert.Equal(t, alice.UID, s.UID)
		assert.Equal(t, e.workdir(s.ID), s.Workdir, "as the backend reported it")
		assert.Equal(t, e.network(), s.Network)
		assert.Equal(t, `{"allow_egress_to":[],"allow_egress_to_cidrs":[],"block_network":true}`, s.NetSpec)
		assert.Equal(t, map[string]string{"dag_id": "d"}, s.Labels)
		assert.Regexp(t, `^sc-[0-9a-f]{16}$`, s.ID)
		assert.True(t, e.workspaceExists(s.ID))
	})
	t.Run("owner without ttl gets DefaultTTL", func(t *testing.T) {
		s := e.create(alice, CreateRequest{Owner: "dag/run1"})
		assert.False(t, s.ConnBound)
		assert.Equal(t, "dag/run1", s.Owner)
		assert.Equal(t, now.Add(2*time.Hour), s.ExpiresAt)
	})
	t.Run("ttl without owner", func(t *testing.T) {
		s := e.create(alice, CreateRequest{TTL: 10 * time.Minute})
		assert.False(t, s.ConnBound)
		assert.Equal(t, now.Add(10*time.Minute), s.ExpiresAt)
	})
	t.Run("owner and ttl", func(t *testing.T) {
		s := e.create(alice, CreateRequest{Owner: "dag/run1", TTL: 3 * time.Hour})
		assert.False(t, s.ConnBound)
		assert.Equal(t, now.Add(3*time.Hour), s.ExpiresAt)
	})
	t.Run("ttl capped by MaxLifetime", func(t *testing.T) {
		s := e.create(alice, CreateRequest{TTL: 100 * time.Hour})
		assert.Equal(t, now.Add(6*time.Hour), s.ExpiresAt)
	})
	t.Run("negative ttl", func(t *testing.T) {
		_, err := e.m.Create(context.Background(), alice, CreateRequest{TTL: -time.Second})
		require.ErrorIs(t, err, ErrInvalid)
	})
	t.Run("bad owner", func(t *testing.T) {
		_, err := e.m.Create(context.Background(), alice, CreateRequest{Owner: "bad\xff"})
		require.ErrorIs(t, err, ErrInvalid)
		_, err = e.m.Create(context.Background(), alice, CreateRequest{Owner: string(make([]byte, MaxOwnerLen+1))})
		require.ErrorIs(t, err, ErrInvalid)
	})
	t.Run("bad labels", func(t *testing.T) {
		many := map[string]string{}
		for i := range MaxLabels + 1 {
			many[string(rune('a'+i))] = "v"
		}
		for _, labels := range []map[string]string{
			many,
			{"": "v"},
			{string(make([]byte, MaxLabelKey+1)): "v"},
			{"k": string(make([]byte, MaxLabelVal+1))},
			{"k": "nul\x00"},
		} {
			_, err := e.m.Create(context.Background(), alice, CreateRequest{Labels: labels})
			require.ErrorIs(t, err, ErrInvalid)
		}
	})
	t.Run("unenforceable spec leaves nothing", func(t *testing.T) {
		before := e.listed()
		nBefore := len(e.m.List(admin, ""))
		_, err := e.m.Create(context.Background(), alice, CreateRequest{Spec: backend.Spec{AllowEgressTo: []string{"example.com"}}})
		require.ErrorIs(t, err, backend.ErrSpecUnenforceable)
		assert.Equal(t, before, e.listed())
		assert.Len(t, e.m.List(admin, ""), nBefore)
	})
	t.Run("caller's context cancelled: nothing is left", func(t *testing.T) {
		before := e.listed()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := e.m.Create(ctx, alice, CreateRequest{})
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, before, e.listed())
	})
}

func TestQuotas(t *testing.T) {
	type step struct {
		c     Caller
		owner string
	}
	tests := []struct {
		name   string
		cfg    func(*Config)
		fill   []step
		refuse step
		scope  string
		limit  int
	}{
		{
			name: "uid", cfg: func(c *Config) { c.MaxPerUID = 2 },
			fill:   []step{{alice, ""}, {alice, "r1"}, {bob, ""}},
			refuse: step{alice, "r2"}, scope: "uid", limit: 2,
		},
		{
			name: "owner", cfg: func(c *Config) { c.MaxPerOwner = 2 },
			// Owners are scoped inside a uid: bob's sandboxes of a run
			// of the same name spend none of alice's quota (#13).
			fill:   []step{{alice, "dag/run"}, {bob, "dag/run"}, {bob, "dag/run"}, {alice, "dag/other"}, {alice, ""}, {alice, "dag/run"}},
			refuse: step{alice, "dag/run"}, scope: "owner", limit: 2,
		},
		{
			name: "host", cfg: func(c *Config) { c.MaxPerHost = 3 },
			fill:   []step{{alice, ""}, {bob, "x"}, {admin, ""}},
			refuse: step{Caller{UID: 2000}, ""}, scope: "host", limit: 3,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, withJournal(), withConfig(tt.cfg))
			var made []Sandbox
			for _, s := range tt.fill {
				made = append(made, e.create(s.c, CreateRequest{Owner: s.owner}))
			}
			before := e.listed()
			require.Len(t, before, len(tt.fill))

			_, err := e.m.Create(context.Background(), tt.refuse.c, CreateRequest{Owner: tt.refuse.owner})
			var qe *QuotaError
			require.ErrorAs(t, err, &qe)
			assert.Equal(t, tt.scope, qe.Scope)
			assert.Equal(t, tt.limit, qe.Limit)
			assert.Contains(t, qe.Error(), tt.scope)

			// Nothing half-made, anywhere.
			assert.Equal(t, before, e.listed())
			assert.Len(t, e.m.List(admin, ""), len(tt.fill))
			assert.Len(t, e.journaled(), len(tt.fill))
			assert.Equal(t, Stats{Sandboxes: len(tt.fill)}, e.m.Stats())

			// Destroying one frees its place.
			victim := made[0]
			for _, s := range made {
				if s.UID == tt.refuse.c.UID || (tt.refuse.owner != "" && s.Owner == tt.refuse.owner) {
					victim = s
					break
				}
			}
			require.NoError(t, e.m.Destroy(context.Background(), admin, victim.ID))
			e.create(tt.refuse.c, CreateRequest{Owner: tt.refuse.owner})
		})
	}
}

func TestConnBoundDestroyedAfterGrace(t *testing.T) {
	e := newEnv(t, withJournal(), withConfig(func(c *Config) { c.ConnGrace = 10 * time.Second }))
	c := Caller{UID: 1000, ConnID: 7}
	s := e.create(c, CreateRequest{})
	kept := e.create(Caller{UID: 1000, ConnID: 8}, CreateRequest{})
	expiring := e.create(c, CreateRequest{Owner: "dag/run"})
	require.True(t, e.workspaceExists(s.ID))

	assert.Zero(t, e.m.Reap(), "nothing is due yet")
	e.m.Disconnected(7)
	e.clock.Advance(9 * time.Second)
	assert.Zero(t, e.m.Reap(), "still within the grace period")
	_, ok := e.m.Describe(s.ID)
	require.True(t, ok)

	e.clock.Advance(time.Second)
	assert.Equal(t, 1, e.m.Reap())
	_, ok = e.m.Describe(s.ID)
	assert.False(t, ok)
	assert.False(t, e.dirExists(s.ID), "the sandbox's directory must be gone")
	assert.NotContains(t, e.journaled(), s.ID)
	assert.ElementsMatch(t, []string{kept.ID, expiring.ID}, e.listed(), "another connection's and an expiring sandbox stay")

	_, err := e.m.ReadTags(context.Background(), c, s.ID)
	require.ErrorIs(t, err, backend.ErrNotFound)
}

func TestConnBoundReclaimedWithinGrace(t *testing.T) {
	e := newEnv(t, withConfig(func(c *Config) { c.ConnGrace = 10 * time.Second }))
	first := Caller{UID: 1000, ConnID: 21}
	second := Caller{UID: 1000, ConnID: 22}
	s := e.create(first, CreateRequest{})

	e.m.Disconnected(21)
	e.clock.Advance(5 * time.Second)
	res := e.exec(second, s.ID, "echo hi")
	assert.Equal(t, "hi\n", string(res.Stdout))
	d, _ := e.m.Describe(s.ID)
	assert.Equal(t, uint64(22), d.ConnID, "the new connection owns it now")

	e.clock.Advance(time.Hour)
	assert.Zero(t, e.m.Reap(), "a reclaimed sandbox lives on with its new connection")
	e.m.Disconnected(21)
	assert.Zero(t, e.m.Reap(), "the old connection's end no longer matters")

	e.m.Disconnected(22)
	e.clock.Advance(9 * time.Second)
	assert.Zero(t, e.m.Reap())
	e.clock.Advance(time.Second)
	assert.Equal(t, 1, e.m.Reap())
	assert.False(t, e.dirExists(s.ID))
}

// TestConnBoundNotReclaimableAfterGrace: once the grace has run out the
// sandbox is due for destruction (docs/protocol.md: "destroyed when the
// connection that created it has been closed for the daemon's grace
// period"); a request arriving before the reaper's next round must not
// resurrect it, just as an expired sandbox is not found before the reaper
// gets to it.
func TestConnBoundNotReclaimableAfterGrace(t *testing.T) {
	e := newEnv(t, withConfig(func(c *Config) { c.ConnGrace = 10 * time.Second }))
	s := e.create(Caller{UID: 1000, ConnID: 31}, CreateRequest{})
	e.m.Disconnected(31)
	e.clock.Advance(11 * time.Second)

	_, err := e.m.ReadTags(context.Background(), Caller{UID: 1000, ConnID: 32}, s.ID)
	assert.ErrorIs(t, err, backend.ErrNotFound, "a claim after the grace period must not revive the sandbox")
	assert.Equal(t, 1, e.m.Reap(), "the reaper must still destroy it")
	assert.False(t, e.dirExists(s.ID))
}

func TestExpiry(t *testing.T) {
	e := newEnv(t, withJournal())
	s := e.create(alice, CreateRequest{TTL: time.Minute})
	other := e.create(alice, CreateRequest{TTL: time.Hour})

	e.clock.Advance(59 * time.Second)
	assert.Zero(t, e.m.Reap())
	e.exec(alice, s.ID, "true")

	e.clock.Advance(time.Second)
	_, err := e.m.Exec(context.Background(), alice, s.ID, backend.ExecRequest{Command: "true", Timeout: time.Second})
	require.ErrorIs(t, err, backend.ErrNotFound, "an expired sandbox is not found even before the reaper runs")
	assert.Contains(t, err.Error(), "expired")

	assert.Equal(t, 1, e.m.Reap())
	assert.False(t, e.dirExists(s.ID))
	assert.NotContains(t, e.journaled(), s.ID)
	assert.Equal(t, []string{other.ID}, e.listed())
}

func TestIdle(t *testing.T) {
	e := newEnv(t, withConfig(func(c *Config) { c.IdleTimeout = 5 * time.Minute }))
	s := e.create(alice, CreateRequest{Owner: "dag/run", TTL: 10 * time.Hour})

	e.clock.Advance(5*time.Minute - time.Second)
	assert.Zero(t, e.m.Reap())
	e.exec(alice, s.ID, "true") // resets the idle clock
	e.clock.Advance(5*time.Minute - time.Second)
	assert.Zero(t, e.m.Reap())
	e.clock.Advance(time.Second)
	assert.Equal(t, 1, e.m.Reap())
	assert.False(t, e.dirExists(s.ID))
}

func TestIdleNotWhileRunning(t *testing.T) {
	e := newEnv(t, withConfig(func(c *Config) { c.IdleTimeout = 5 * time.Minute }))
	s := e.create(alice, CreateRequest{Owner: "dag/run", TTL: 10 * time.Hour})

	done := make(chan backend.ExecResult, 1)
	go func() {
		res, err := e.m.Exec(context.Background(), alice, s.ID, backend.ExecRequest{Command: "sleep 1.5", Timeout: 30 * time.Second})
		assert.NoError(t, err)
		done <- res
	}()
	require.Eventually(t, func() bool { return e.m.Stats().Commands == 1 }, 10*time.Second, 5*time.Millisecond)
	e.clock.Advance(time.Hour)
	assert.Zero(t, e.m.Reap(), "a sandbox running a command is not idle")
	res := <-done
	assert.False(t, res.SandboxTerminated)
	assert.Zero(t, res.ExitCode)

	assert.Zero(t, e.m.Reap(), "the idle clock restarts when the command ends")
	e.clock.Advance(5 * time.Minute)
	assert.Equal(t, 1, e.m.Reap())
}

func TestIdleDisabled(t *testing.T) {
	for _, idle := range []time.Duration{-1, 0} {
		e := newEnv(t, withConfig(func(c *Config) { c.IdleTimeout = idle }))
		s := e.create(alice, CreateRequest{TTL: 24 * time.Hour})
		e.clock.Advance(24*time.Hour - time.Second)
		assert.Zero(t, e.m.Reap(), "IdleTimeout %v", idle)
		_, ok := e.m.Describe(s.ID)
		assert.True(t, ok)
	}
}

func TestRenew(t *testing.T) {
	e := newEnv(t, withJournal(), withConfig(func(c *Config) { c.MaxLifetime = 2 * time.Hour }))
	created := e.clock.Now()
	s := e.create(alice, CreateRequest{TTL: 30 * time.Minute})
	cb := e.create(alice, CreateRequest{})
	ctx := context.Background()

	e.clock.Advance(10 * time.Minute)
	r, err := e.m.Renew(ctx, alice, s.ID, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, created.Add(70*time.Minute), r.ExpiresAt)
	assert.Equal(t, created.Add(70*time.Minute), e.journaled()[s.ID].ExpiresAt, "a renewal is journaled")

	r, err = e.m.Renew(ctx, alice, s.ID, 5*time.Hour)
	require.NoError(t, err)
	assert.Equal(t, created.Add(2*time.Hour), r.ExpiresAt, "capped at created+MaxLifetime")

	_, err = e.m.Renew(ctx, alice, cb.ID, time.Hour)
	require.ErrorIs(t, err, ErrInvalid, "a connection-bound sandbox cannot be renewed")
	d, _ := e.m.Describe(cb.ID)
	assert.True(t, d.ConnBound)

	for _, ttl := range []time.Duration{0, -time.Second} {
		_, err = e.m.Renew(ctx, alice, s.ID, ttl)
		require.ErrorIs(t, err, ErrInvalid)
	}
	_, err = e.m.Renew(ctx, bob, s.ID, time.Hour)
	require.ErrorIs(t, err, backend.ErrNotFound)
	_, err = e.m.Renew(ctx, alice, "sc-nonexistent", time.Hour)
	require.ErrorIs(t, err, backend.ErrNotFound)

	// The renewed expiry is what the reaper enforces.
	e.clock.Advance(2*time.Hour - 10*time.Minute - time.Second)
	assert.Zero(t, e.m.Reap())
	e.clock.Advance(time.Second)
	assert.Equal(t, 2, e.m.Reap(), "both reach the hard cap")
}

func TestDestroyRun(t *testing.T) {
	e := newEnv(t, withJournal())
	ctx := context.Background()
	a1 := e.create(alice, CreateRequest{Owner: "dag/run1"})
	a2 := e.create(alice, CreateRequest{Owner: "dag/run1", TTL: time.Minute})
	a3 := e.create(alice, CreateRequest{Owner: "dag/run2"})
	a4 := e.create(alice, CreateRequest{})
	b1 := e.create(bob, CreateRequest{Owner: "dag/run1"})

	_, err := e.m.DestroyRun(ctx, alice, "")
	require.ErrorIs(t, err, ErrInvalid)

	ids, err := e.m.DestroyRun(ctx, alice, "dag/run1")
	require.NoError(t, err)
	want := []string{a1.ID, a2.ID}
	if want[0] > want[1] {
		want[0], want[1] = want[1], want[0]
	}
	assert.Equal(t, want, ids, "only the owner's own-uid sandboxes, sorted")
	assert.ElementsMatch(t, []string{a3.ID, a4.ID, b1.ID}, e.listed())
	assert.ElementsMatch(t, []string{a3.ID, a4.ID, b1.ID}, mapKeys(e.journaled()))

	ids, err = e.m.DestroyRun(ctx, alice, "dag/run1")
	require.NoError(t, err)
	assert.Empty(t, ids, "nothing left of it for alice")

	ids, err = e.m.DestroyRun(ctx, admin, "dag/run1")
	require.NoError(t, err)
	assert.Equal(t, []string{b1.ID}, ids, "an admin destroys every uid's")
	assert.ElementsMatch(t, []string{a3.ID, a4.ID}, e.listed())
}

func mapKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestOtherUIDCannotSee(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.create(alice, CreateRequest{Owner: "dag/run"})
	require.NoError(t, e.m.WriteFile(ctx, alice, s.ID, "secret.txt", []byte("alice's"), 0o644))
	bobSandbox := e.create(bob, CreateRequest{})

	_, err := e.m.Exec(ctx, bob, s.ID, backend.ExecRequest{Command: "true", Timeout: time.Second})
	require.ErrorIs(t, err, backend.ErrNotFound)
	_, err = e.m.ReadFile(ctx, bob, s.ID, "secret.txt", 1024)
	require.ErrorIs(t, err, backend.ErrNotFound)
	err = e.m.WriteFile(ctx, bob, s.ID, "x", []byte("x"), 0o644)
	require.ErrorIs(t, err, backend.ErrNotFound)
	_, err = e.m.ListDirectory(ctx, bob, s.ID, "/workspace", 10)
	require.ErrorIs(t, err, backend.ErrNotFound)
	_, err = e.m.ReadTags(ctx, bob, s.ID)
	require.ErrorIs(t, err, backend.ErrNotFound)
	_, err = e.m.WriteTags(ctx, bob, s.ID, map[string]string{"k": "v"})
	require.ErrorIs(t, err, backend.ErrNotFound)
	_, err = e.m.Attach(ctx, bob, s.ID, "dag/run", "bob-task")
	require.ErrorIs(t, err, backend.ErrNotFound)
	released, err := e.m.Release(ctx, bob, s.ID, "anyone")
	require.NoError(t, err)
	assert.False(t, released)

	// The same answer as for a sandbox that never existed.
	_, errNever := e.m.ReadFile(ctx, bob, "sc-0000000000000000", "secret.txt", 1024)
	require.ErrorIs(t, errNever, backend.ErrNotFound)

	// Destroy is a silent no-op.
	require.NoError(t, e.m.Destroy(ctx, bob, s.ID))
	assert.True(t, e.workspaceExists(s.ID))
	data, err := e.m.ReadFile(ctx, alice, s.ID, "secret.txt", 1024)
	require.NoError(t, err)
	assert.Equal(t, "alice's", string(data))

	// Each sees only their own.
	assert.Equal(t, []string{s.ID}, sandboxIDs(e.m.List(alice, "")))
	assert.Equal(t, []string{bobSandbox.ID}, sandboxIDs(e.m.List(bob, "")))
	assert.Empty(t, e.m.List(bob, "dag/run"))

	// An admin sees all, filters by owner, may destroy, but may not run
	// commands in another uid's sandbox.
	assert.ElementsMatch(t, []string{s.ID, bobSandbox.ID}, sandboxIDs(e.m.List(admin, "")))
	assert.Equal(t, []string{s.ID}, sandboxIDs(e.m.List(admin, "dag/run")))
	_, err = e.m.Exec(ctx, admin, s.ID, backend.ExecRequest{Command: "true", Timeout: time.Second})
	require.ErrorIs(t, err, backend.ErrNotFound)
	require.NoError(t, e.m.Destroy(ctx, admin, s.ID))
	assert.False(t, e.dirExists(s.ID))
	assert.Equal(t, []string{bobSandbox.ID}, e.listed())
	require.NoError(t, e.m.Destroy(ctx, admin, s.ID), "destroy is idempotent")
}

func TestListOrderAndSnapshot(t *testing.T) {
	e := newEnv(t)
	var ids []string
	for i := range 3 {
		s := e.create(alice, CreateRequest{Labels: map[string]string{"i": string(rune('0' + i))}})
		ids = append(ids, s.ID)
		e.clock.Advance(time.Second)
	}
	list := e.m.List(alice, "")
	assert.Equal(t, ids, sandboxIDs(list), "oldest first")

	// Snapshots are copies.
	list[0].Labels["i"] = "changed"
	d, _ := e.m.Describe(ids[0])
	assert.Equal(t, "0", d.Labels["i"])
}

func TestDestroy(t *testing.T) {
	e := newEnv(t, withJournal())
	ctx := context.Background()
	s := e.create(alice, CreateRequest{Owner: "dag/run"})
	require.Contains(t, e.journaled(), s.ID)
	require.NoError(t, e.m.Destroy(ctx, alice, s.ID))
	assert.False(t, e.dirExists(s.ID))
	assert.Empty(t, e.journaled())
	assert.Empty(t, e.m.List(admin, ""))
	require.NoError(t, e.m.Destroy(ctx, alice, s.ID), "idempotent")
	require.NoError(t, e.m.Destroy(ctx, alice, "not even an id"))
	assert.Equal(t, Stats{}, e.m.Stats())
}

func TestCreateFailureHalfWayLeavesNothing(t *testing.T) {
	var fb *faultyBackend
	e := newEnv(t, withJournal(), withConfig(func(c *Config) { c.MaxPerHost = 1 }),
		withWrapper(func(b backend.Backend) backend.Backend { fb = &faultyBackend{Backend: b}; return fb }))
	ctx := context.Background()

	for _, mode := range []string{"after", "before"} {
		fb.createAfter.Store(mode == "after")
		fb.createBefore.Store(mode == "before")
		_, err := e.m.Create(ctx, alice, CreateRequest{Owner: "dag/run"})
		require.ErrorIs(t, err, errInjected, mode)
		assert.Empty(t, e.listed(), "%s: the half-made sandbox must be removed", mode)
		assert.Empty(t, e.journaled(), mode)
		assert.Empty(t, e.m.List(admin, ""), mode)
		assert.Equal(t, Stats{}, e.m.Stats(), mode)
	}
	fb.createAfter.Store(false)
	fb.createBefore.Store(false)
	// The quota slot was given back.
	e.create(alice, CreateRequest{Owner: "dag/run"})
}

func TestErrorsRead(t *testing.T) {
	assert.Contains(t, (&QuotaError{Scope: "commands_per_host", Limit: 3}).Error(), "3 commands")
	assert.Contains(t, (&QuotaError{Scope: "uid", Limit: 3}).Error(), "per uid")
	assert.Contains(t, (&OwnerMismatchError{Sandbox: "sc-1", Owner: "a", Want: "b"}).Error(), `"a"`)
	assert.Contains(t, (&HeldByOtherError{Sandbox: "sc-1", Holder: "h"}).Error(), `"h"`)
	assert.True(t, errors.Is(notFound("x"), backend.ErrNotFound))
}
