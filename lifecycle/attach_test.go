package lifecycle

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

func TestAttachRelease(t *testing.T) {
	e := newEnv(t, withJournal())
	ctx := context.Background()
	s := e.create(alice, CreateRequest{Owner: "dag/run"})

	t.Run("owner mismatch", func(t *testing.T) {
		_, err := e.m.Attach(ctx, alice, s.ID, "dag/other", "task-a")
		var om *OwnerMismatchError
		require.ErrorAs(t, err, &om)
		assert.Equal(t, "dag/run", om.Owner)
		assert.Equal(t, "dag/other", om.Want)
		assert.Equal(t, s.ID, om.Sandbox)
		d, _ := e.m.Describe(s.ID)
		assert.Empty(t, d.Holder)
	})
	t.Run("invalid arguments", func(t *testing.T) {
		for _, args := range [][2]string{{"", "h"}, {"dag/run", ""}, {"dag/run", "bad\xff"}, {"dag/run", strings.Repeat("h", MaxHolderLen+1)}} {
			_, err := e.m.Attach(ctx, alice, s.ID, args[0], args[1])
			require.ErrorIs(t, err, ErrInvalid, "%q", args)
		}
	})
	t.Run("attach, re-attach, refuse another", func(t *testing.T) {
		got, err := e.m.Attach(ctx, alice, s.ID, "dag/run", "task-a")
		require.NoError(t, err)
		assert.Equal(t, "task-a", got.Holder)
		assert.Equal(t, "task-a", e.journaled()[s.ID].Holder, "the hold is journaled")

		got, err = e.m.Attach(ctx, alice, s.ID, "dag/run", "task-a")
		require.NoError(t, err, "the same holder may attach again (a task retry)")
		assert.Equal(t, "task-a", got.Holder)

		_, err = e.m.Attach(ctx, alice, s.ID, "dag/run", "task-b")
		var hb *HeldByOtherError
		require.ErrorAs(t, err, &hb)
		assert.Equal(t, "task-a", hb.Holder)
		assert.Equal(t, s.ID, hb.Sandbox)
	})
	t.Run("release by the wrong holder is a no-op", func(t *testing.T) {
		ok, err := e.m.Release(ctx, alice, s.ID, "task-b")
		require.NoError(t, err)
		assert.False(t, ok)
		ok, err = e.m.Release(ctx, alice, s.ID, "")
		require.NoError(t, err)
		assert.False(t, ok)
		d, _ := e.m.Describe(s.ID)
		assert.Equal(t, "task-a", d.Holder)
	})
	t.Run("release is idempotent and never destroys", func(t *testing.T) {
		ok, err := e.m.Release(ctx, alice, s.ID, "task-a")
		require.NoError(t, err)
		assert.True(t, ok)
		assert.Empty(t, e.journaled()[s.ID].Holder, "the release is journaled")
		ok, err = e.m.Release(ctx, alice, s.ID, "task-a")
		require.NoError(t, err)
		assert.False(t, ok)
		d, present := e.m.Describe(s.ID)
		require.True(t, present)
		assert.Equal(t, StateReady, d.State)
		assert.True(t, e.workspaceExists(s.ID))
		e.exec(alice, s.ID, "true")

		// Now another holder may attach.
		got, err := e.m.Attach(ctx, alice, s.ID, "dag/run", "task-b")
		require.NoError(t, err)
		assert.Equal(t, "task-b", got.Holder)
	})
	t.Run("gone sandbox", func(t *testing.T) {
		ok, err := e.m.Release(ctx, alice, "sc-0000000000000000", "task-a")
		require.NoError(t, err)
		assert.False(t, ok)
		_, err = e.m.Attach(ctx, alice, "sc-0000000000000000", "dag/run", "task-a")
		require.ErrorIs(t, err, backend.ErrNotFound)
	})
	t.Run("connection-bound sandbox has no owner", func(t *testing.T) {
		cb := e.create(alice, CreateRequest{})
		_, err := e.m.Attach(ctx, alice, cb.ID, "dag/run", "task-a")
		var om *OwnerMismatchError
		require.ErrorAs(t, err, &om)
		assert.Empty(t, om.Owner)
	})
}

func TestAttachConcurrentExactlyOneWins(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.create(alice, CreateRequest{Owner: "dag/run"})
	for i := range 200 {
		holders := [2]string{fmt.Sprintf("a-%d", i), fmt.Sprintf("b-%d", i)}
		var errs [2]error
		var wg sync.WaitGroup
		start := make(chan struct{})
		for k := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[k] = e.m.Attach(ctx, alice, s.ID, "dag/run", holders[k])
			}()
		}
		close(start)
		wg.Wait()

		winners := 0
		winner := ""
		for k := range 2 {
			if errs[k] == nil {
				winners++
				winner = holders[k]
			}
		}
		require.Equal(t, 1, winners, "round %d: exactly one attach must win (errors %v)", i, errs)
		for k := range 2 {
			if errs[k] != nil {
				var hb *HeldByOtherError
				require.ErrorAs(t, errs[k], &hb, "round %d", i)
				require.Equal(t, winner, hb.Holder, "round %d", i)
			}
		}
		tags, err := e.m.ReadTags(ctx, alice, s.ID)
		require.NoError(t, err)
		require.Equal(t, winner, tags[TagHolder])
		ok, err := e.m.Release(ctx, alice, s.ID, winner)
		require.NoError(t, err)
		require.True(t, ok)
	}
}

func TestReadTags(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.create(alice, CreateRequest{Owner: "dag/run", TTL: time.Hour})
	tags, err := e.m.ReadTags(ctx, alice, s.ID)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{
		TagOwner:     "dag/run",
		TagHolder:    "",
		TagExpiresAt: strconv.FormatInt(e.clock.Now().Add(time.Hour).Unix(), 10),
		TagNetwork:   `{"allow_egress_to":[],"allow_egress_to_cidrs":[],"block_network":true}`,
		TagWorkdir:   e.workdir(s.ID),
	}, tags)
}

func TestWriteTagsReadOnly(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.create(alice, CreateRequest{Owner: "dag/run"})
	before, err := e.m.ReadTags(ctx, alice, s.ID)
	require.NoError(t, err)

	for _, tag := range []string{TagWorkdir, TagNetwork} {
		_, err := e.m.WriteTags(ctx, alice, s.ID, map[string]string{tag: "something else"})
		require.ErrorIs(t, err, ErrInvalid, tag)
		assert.Contains(t, err.Error(), "read-only")
	}
	after, err := e.m.ReadTags(ctx, alice, s.ID)
	require.NoError(t, err)
	assert.Equal(t, before, after)

	// Writing back the same values is accepted and changes nothing.
	got, err := e.m.WriteTags(ctx, alice, s.ID, map[string]string{TagWorkdir: before[TagWorkdir], TagNetwork: before[TagNetwork]})
	require.NoError(t, err)
	assert.Equal(t, before, got)
	// So is writing back everything read_tags returned.
	got, err = e.m.WriteTags(ctx, alice, s.ID, before)
	require.NoError(t, err)
	assert.Equal(t, before, got)
}

func TestWriteTagsOwner(t *testing.T) {
	e := newEnv(t, withJournal(), withConfig(func(c *Config) {
		c.DefaultTTL = time.Hour
		c.MaxLifetime = 3 * time.Hour
	}))
	ctx := context.Background()
	cb := e.create(alice, CreateRequest{})
	require.True(t, cb.ConnBound)
	_, err := e.m.Renew(ctx, alice, cb.ID, time.Minute)
	require.ErrorIs(t, err, ErrInvalid)

	e.clock.Advance(10 * time.Minute)
	tags, err := e.m.WriteTags(ctx, alice, cb.ID, map[string]string{TagOwner: "dag/run"})
	require.NoError(t, err)
	assert.Equal(t, "dag/run", tags[TagOwner])
	d, _ := e.m.Describe(cb.ID)
	assert.False(t, d.ConnBound, "an owned sandbox expires instead of dying with its connection")
	assert.Equal(t, e.clock.Now().Add(time.Hour), d.ExpiresAt, "it gets DefaultTTL from now")
	jr := e.journaled()[cb.ID]
	assert.False(t, jr.ConnBound)
	assert.Equal(t, "dag/run", jr.Owner)

	// It no longer dies with its connection, and can now be renewed.
	e.m.Disconnected(alice.ConnID)
	e.clock.Advance(time.Minute)
	assert.Zero(t, e.m.Reap())
	_, err = e.m.Renew(ctx, alice, cb.ID, 2*time.Hour)
	require.NoError(t, err)

	// The same owner again is fine; another is refused.
	_, err = e.m.WriteTags(ctx, alice, cb.ID, map[string]string{TagOwner: "dag/run"})
	require.NoError(t, err)
	_, err = e.m.WriteTags(ctx, alice, cb.ID, map[string]string{TagOwner: "dag/other"})
	var om *OwnerMismatchError
	require.ErrorAs(t, err, &om)
	assert.Equal(t, "dag/run", om.Owner)
	_, err = e.m.WriteTags(ctx, alice, cb.ID, map[string]string{TagOwner: ""})
	require.ErrorAs(t, err, &om, "an owner cannot be removed")

	// An invalid owner is refused.
	cb2 := e.create(alice, CreateRequest{})
	_, err = e.m.WriteTags(ctx, alice, cb2.ID, map[string]string{TagOwner: strings.Repeat("o", MaxOwnerLen+1)})
	require.ErrorIs(t, err, ErrInvalid)

	// Owner and holder in one write: owner is applied first.
	tags, err = e.m.WriteTags(ctx, alice, cb2.ID, map[string]string{TagHolder: "task-1", TagOwner: "dag/run2"})
	require.NoError(t, err)
	assert.Equal(t, "dag/run2", tags[TagOwner])
	assert.Equal(t, "task-1", tags[TagHolder])
}

// TestWriteTagsOwnerRespectsOwnerQuota: giving a sandbox an owner through
// write_tags must not take that owner past MaxPerOwner, which create
// enforces.
func TestWriteTagsOwnerRespectsOwnerQuota(t *testing.T) {
	e := newEnv(t, withConfig(func(c *Config) { c.MaxPerOwner = 1 }))
	ctx := context.Background()
	e.create(alice, CreateRequest{Owner: "dag/run"})
	cb := e.create(alice, CreateRequest{})
	_, err := e.m.WriteTags(ctx, alice, cb.ID, map[string]string{TagOwner: "dag/run"})
	var qe *QuotaError
	require.ErrorAs(t, err, &qe, "the owner already has MaxPerOwner sandboxes")
	assert.Equal(t, "owner", qe.Scope)
	d, _ := e.m.Describe(cb.ID)
	assert.Empty(t, d.Owner)
	assert.True(t, d.ConnBound)
}

// TestWriteTagsOwnerQuotaIsPerUID: owners are scoped inside a uid, so
// bob's sandboxes of a run named like alice's do not count against
// alice's owner quota when she tags one of hers with it (#13, #14).
func TestWriteTagsOwnerQuotaIsPerUID(t *testing.T) {
	e := newEnv(t, withConfig(func(c *Config) { c.MaxPerOwner = 1 }))
	ctx := context.Background()
	e.create(bob, CreateRequest{Owner: "dag/run"})
	mine := e.create(alice, CreateRequest{})
	tags, err := e.m.WriteTags(ctx, alice, mine.ID, map[string]string{TagOwner: "dag/run"})
	require.NoError(t, err, "bob's sandbox must not spend alice's quota")
	assert.Equal(t, "dag/run", tags[TagOwner])

	// Alice's own quota still holds.
	another := e.create(alice, CreateRequest{})
	_, err = e.m.WriteTags(ctx, alice, another.ID, map[string]string{TagOwner: "dag/run"})
	var qe *QuotaError
	require.ErrorAs(t, err, &qe)
	assert.Equal(t, "owner", qe.Scope)
}

func TestWriteTagsHolder(t *testing.T) {
	e := newEnv(t, withJournal())
	ctx := context.Background()
	s := e.create(alice, CreateRequest{Owner: "dag/run"})

	tags, err := e.m.WriteTags(ctx, alice, s.ID, map[string]string{TagHolder: "task-1"})
	require.NoError(t, err)
	assert.Equal(t, "task-1", tags[TagHolder])
	assert.Equal(t, "task-1", e.journaled()[s.ID].Holder)

	_, err = e.m.WriteTags(ctx, alice, s.ID, map[string]string{TagHolder: "task-2"})
	var hb *HeldByOtherError
	require.ErrorAs(t, err, &hb)
	assert.Equal(t, "task-1", hb.Holder)
	_, err = e.m.Attach(ctx, alice, s.ID, "dag/run", "task-2")
	require.ErrorAs(t, err, &hb, "a hold taken through tags binds attach too")

	_, err = e.m.WriteTags(ctx, alice, s.ID, map[string]string{TagHolder: "task-1"})
	require.NoError(t, err, "the same holder again")

	tags, err = e.m.WriteTags(ctx, alice, s.ID, map[string]string{TagHolder: ""})
	require.NoError(t, err, `"" releases by force`)
	assert.Empty(t, tags[TagHolder])

	_, err = e.m.Attach(ctx, alice, s.ID, "dag/run", "task-2")
	require.NoError(t, err)
	_, err = e.m.WriteTags(ctx, alice, s.ID, map[string]string{TagHolder: "task-1"})
	require.ErrorAs(t, err, &hb, "a hold taken by attach binds tags too")
}

// TestWriteTagsHolderFollowsAttachLimits: a holder written as a tag is an
// attach, so it must obey attach's bound on a holder's length.
func TestWriteTagsHolderFollowsAttachLimits(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.create(alice, CreateRequest{Owner: "dag/run"})
	long := strings.Repeat("h", MaxHolderLen+1)
	_, err := e.m.Attach(ctx, alice, s.ID, "dag/run", long)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = e.m.WriteTags(ctx, alice, s.ID, map[string]string{TagHolder: long})
	require.ErrorIs(t, err, ErrInvalid, "write_tags accepted a holder attach refuses")
	d, _ := e.m.Describe(s.ID)
	assert.Empty(t, d.Holder)
}

func TestWriteTagsExpiresAt(t *testing.T) {
	e := newEnv(t, withJournal(), withConfig(func(c *Config) { c.MaxLifetime = 4 * time.Hour }))
	ctx := context.Background()
	created := e.clock.Now()
	s := e.create(alice, CreateRequest{Owner: "dag/run", TTL: time.Hour})

	at := created.Add(2 * time.Hour).Unix()
	tags, err := e.m.WriteTags(ctx, alice, s.ID, map[string]string{TagExpiresAt: strconv.FormatInt(at, 10)})
	require.NoError(t, err)
	assert.Equal(t, strconv.FormatInt(at, 10), tags[TagExpiresAt])
	d, _ := e.m.Describe(s.ID)
	assert.Equal(t, time.Unix(at, 0).UTC(), d.ExpiresAt.UTC())
	assert.Equal(t, at, e.journaled()[s.ID].ExpiresAt.Unix())

	tags, err = e.m.WriteTags(ctx, alice, s.ID, map[string]string{TagExpiresAt: strconv.FormatInt(created.Add(100*time.Hour).Unix(), 10)})
	require.NoError(t, err)
	assert.Equal(t, strconv.FormatInt(created.Add(4*time.Hour).Unix(), 10), tags[TagExpiresAt], "capped at created+MaxLifetime")

	for _, bad := range []string{"soon", "1.5", "", "99999999999999999999"} {
		_, err = e.m.WriteTags(ctx, alice, s.ID, map[string]string{TagExpiresAt: bad})
		require.ErrorIs(t, err, ErrInvalid, "%q", bad)
	}

	cb := e.create(alice, CreateRequest{})
	_, err = e.m.WriteTags(ctx, alice, cb.ID, map[string]string{TagExpiresAt: strconv.FormatInt(at, 10)})
	require.ErrorIs(t, err, ErrInvalid, "a connection-bound sandbox has no expiry to set")
}

func TestWriteTagsAtomic(t *testing.T) {
	e := newEnv(t, withJournal())
	ctx := context.Background()
	s := e.create(alice, CreateRequest{Owner: "dag/run"})
	cb := e.create(alice, CreateRequest{})
	before, err := e.m.ReadTags(ctx, alice, s.ID)
	require.NoError(t, err)
	jBefore := e.journaled()

	bad := []map[string]string{
		{"custom": "x", TagHolder: "task-1", TagWorkdir: "/elsewhere"},
		{"custom": "x", TagHolder: "task-1", TagExpiresAt: "not a number"},
		{"custom": "x", TagOwner: "dag/other"},
		{"custom": "x", TagHolder: "task-1", "": "empty key"},
	}
	for _, tags := range bad {
		_, err := e.m.WriteTags(ctx, alice, s.ID, tags)
		require.Error(t, err, "%v", tags)
		after, err := e.m.ReadTags(ctx, alice, s.ID)
		require.NoError(t, err)
		assert.Equal(t, before, after, "a refused write must change nothing: %v", tags)
	}

	// A conn-bound sandbox is not converted by a write that fails later.
	_, err = e.m.WriteTags(ctx, alice, cb.ID, map[string]string{TagOwner: "dag/run", TagExpiresAt: "never", "custom": "x"})
	require.ErrorIs(t, err, ErrInvalid)
	d, _ := e.m.Describe(cb.ID)
	assert.True(t, d.ConnBound)
	assert.Empty(t, d.Owner)
	assert.Empty(t, d.Tags)

	assert.Equal(t, jBefore, e.journaled(), "nothing was journaled")
}

func TestWriteTagsCustom(t *testing.T) {
	e := newEnv(t, withJournal())
	ctx := context.Background()
	s := e.create(alice, CreateRequest{Owner: "dag/run"})

	tags, err := e.m.WriteTags(ctx, alice, s.ID, map[string]string{"team": "data", "airflow_custom": "yes"})
	require.NoError(t, err)
	assert.Equal(t, "data", tags["team"])
	assert.Equal(t, "yes", tags["airflow_custom"])
	assert.Equal(t, "dag/run", tags[TagOwner], "the derived tags are still there")

	tags, err = e.m.WriteTags(ctx, alice, s.ID, map[string]string{"team": "ml"})
	require.NoError(t, err)
	assert.Equal(t, "ml", tags["team"], "overwritten")
	assert.Equal(t, "yes", tags["airflow_custom"], "others kept")

	read, err := e.m.ReadTags(ctx, alice, s.ID)
	require.NoError(t, err)
	assert.Equal(t, tags, read)
	assert.Equal(t, map[string]string{"team": "ml", "airflow_custom": "yes"}, e.journaled()[s.ID].Tags)
	d, _ := e.m.Describe(s.ID)
	assert.Equal(t, map[string]string{"team": "ml", "airflow_custom": "yes"}, d.Tags)
}

func TestWriteTagsLimits(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.create(alice, CreateRequest{Owner: "dag/run"})

	tooMany := map[string]string{}
	for i := range MaxTags + 1 {
		tooMany[fmt.Sprint("k", i)] = "v"
	}
	exactly := map[string]string{}
	for i := range MaxTags {
		exactly[fmt.Sprint("k", i)] = strings.Repeat("v", MaxTagVal)
	}
	for name, tags := range map[string]map[string]string{
		"too many":       tooMany,
		"empty key":      {"": "v"},
		"long key":       {strings.Repeat("k", MaxTagKey+1): "v"},
		"long value":     {"k": strings.Repeat("v", MaxTagVal+1)},
		"invalid UTF-8":  {"k": "\xff\xfe"},
		"NUL in key":     {"k\x00": "v"},
		"NUL in value":   {"k": "v\x00"},
		"invalid in key": {"\xc3": "v"},
	} {
		_, err := e.m.WriteTags(ctx, alice, s.ID, tags)
		require.ErrorIs(t, err, ErrInvalid, name)
	}
	d, _ := e.m.Describe(s.ID)
	assert.Empty(t, d.Tags)

	_, err := e.m.WriteTags(ctx, alice, s.ID, exactly)
	require.NoError(t, err, "exactly at the limits")
	_, err = e.m.WriteTags(ctx, alice, s.ID, map[string]string{strings.Repeat("k", MaxTagKey): ""})
	require.NoError(t, err, "a key of exactly MaxTagKey bytes")
}

// TestWriteTagsBoundsTotalStoredTags: the bound on tags is on what a
// sandbox carries, not only on one write; otherwise repeated writes grow a
// record (in memory and in the journal) without limit.
func TestWriteTagsBoundsTotalStoredTags(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.create(alice, CreateRequest{Owner: "dag/run"})
	var lastErr error
	for round := range 4 {
		batch := map[string]string{}
		for i := range MaxTags {
			batch[fmt.Sprintf("r%d-k%d", round, i)] = "v"
		}
		_, lastErr = e.m.WriteTags(ctx, alice, s.ID, batch)
	}
	d, _ := e.m.Describe(s.ID)
	assert.LessOrEqual(t, len(d.Tags), MaxTags, "a sandbox carries %d custom tags", len(d.Tags))
	assert.ErrorIs(t, lastErr, ErrInvalid, "writes past the bound must be refused")
}
