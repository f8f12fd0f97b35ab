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

// A closed journal database stands for a journal that cannot be written
// (a full or failed disk): every Put then fails.

func TestCreateWithFailingJournalLeavesNothing(t *testing.T) {
	e := newEnv(t, withJournal())
	require.NoError(t, e.journal.Close())
	_, err := e.m.Create(context.Background(), alice, CreateRequest{Owner: "dag/run"})
	require.ErrorIs(t, err, ErrJournal)
	assert.Empty(t, e.listed(), "nothing may be created without a record")
	assert.Empty(t, e.m.List(admin, ""))
	assert.Equal(t, Stats{}, e.m.Stats())
}

// TestJournalFailureChangesNothing: ErrJournal means "the journal could
// not be written, so nothing was done" (errors.go); a change the daemon
// reports as failed must not be in effect in memory either.
func TestJournalFailureChangesNothing(t *testing.T) {
	ctx := context.Background()
	ops := map[string]func(m *Manager, id string) error{
		"Attach": func(m *Manager, id string) error {
			_, err := m.Attach(ctx, alice, id, "dag/run", "task-2")
			return err
		},
		"Release": func(m *Manager, id string) error {
			_, err := m.Release(ctx, alice, id, "task-1")
			return err
		},
		"Renew": func(m *Manager, id string) error {
			_, err := m.Renew(ctx, alice, id, 5*time.Hour)
			return err
		},
		"WriteTags": func(m *Manager, id string) error {
			_, err := m.WriteTags(ctx, alice, id, map[string]string{"k": "v", TagExpiresAt: fmt.Sprint(clockStart.Add(3 * time.Hour).Unix())})
			return err
		},
	}
	for name, op := range ops {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, withJournal())
			s := e.create(alice, CreateRequest{Owner: "dag/run", TTL: time.Hour})
			if name != "Attach" {
				_, err := e.m.Attach(ctx, alice, s.ID, "dag/run", "task-1")
				require.NoError(t, err)
			}
			before, _ := e.m.Describe(s.ID)
			require.NoError(t, e.journal.Close())

			err := op(e.m, s.ID)
			require.ErrorIs(t, err, ErrJournal)
			after, _ := e.m.Describe(s.ID)
			assert.Equal(t, before.Holder, after.Holder, "holder")
			assert.Equal(t, before.ExpiresAt, after.ExpiresAt, "expires_at")
			assert.Equal(t, before.Tags, after.Tags, "tags")
		})
	}
}

// TestNoJournalResurrection races journal writes of a sandbox (attach,
// tags, renew) against its destruction: once destroyed, its record must
// not come back, or the next start would act on a sandbox that is gone.
func TestNoJournalResurrection(t *testing.T) {
	e := newEnv(t, withJournal())
	ctx := context.Background()
	for i := range 30 {
		s := e.create(alice, CreateRequest{Owner: "dag/run", TTL: time.Hour})
		var wg sync.WaitGroup
		start := make(chan struct{})
		for k := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for n := range 10 {
					switch k {
					case 0:
						_, _ = e.m.WriteTags(ctx, alice, s.ID, map[string]string{"n": fmt.Sprint(n)})
					case 1:
						_, _ = e.m.Attach(ctx, alice, s.ID, "dag/run", "task")
						_, _ = e.m.Release(ctx, alice, s.ID, "task")
					case 2:
						_, _ = e.m.Renew(ctx, alice, s.ID, time.Hour)
					}
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			assert.NoError(t, e.m.Destroy(ctx, alice, s.ID))
		}()
		close(start)
		wg.Wait()
		require.NotContains(t, e.journaled(), s.ID, "round %d: a destroyed sandbox's record came back", i)
	}
	assert.Empty(t, e.listed())
}

// TestIdleClockCountsEveryRequest: docs/protocol.md says a sandbox "is
// destroyed after an idle period without requests". A task that attaches
// to a sandbox, or renews it, is using it: those requests must restart
// the idle clock as commands and file operations do.
func TestIdleClockCountsEveryRequest(t *testing.T) {
	ctx := context.Background()
	ops := map[string]func(m *Manager, id string) error{
		"Attach": func(m *Manager, id string) error {
			_, err := m.Attach(ctx, alice, id, "dag/run", "task-2")
			return err
		},
		"Renew": func(m *Manager, id string) error {
			_, err := m.Renew(ctx, alice, id, 5*time.Hour)
			return err
		},
		"WriteTags": func(m *Manager, id string) error {
			_, err := m.WriteTags(ctx, alice, id, map[string]string{"k": "v"})
			return err
		},
		"WriteFile (reference)": func(m *Manager, id string) error {
			return m.WriteFile(ctx, alice, id, "f", []byte("x"), 0o644)
		},
	}
	for name, op := range ops {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, withConfig(func(c *Config) { c.IdleTimeout = 30 * time.Minute }))
			s := e.create(alice, CreateRequest{Owner: "dag/run", TTL: 10 * time.Hour})
			e.clock.Advance(29 * time.Minute)
			require.NoError(t, op(e.m, s.ID))
			e.clock.Advance(2 * time.Minute)
			assert.Zero(t, e.m.Reap(), "the sandbox was used 2 minutes ago")
			assert.True(t, e.workspaceExists(s.ID))
		})
	}
}

func TestSweep(t *testing.T) {
	e := newEnv(t, withJournal())
	ctx := context.Background()
	known := e.create(alice, CreateRequest{})
	_, err := e.base.Create(ctx, "sc-stray0000000000", backend.Spec{})
	require.NoError(t, err)

	ids, err := e.m.Sweep(ctx, true)
	require.NoError(t, err)
	assert.Equal(t, []string{"sc-stray0000000000"}, ids)
	assert.True(t, e.dirExists("sc-stray0000000000"), "a dry run destroys nothing")

	ids, err = e.m.Sweep(ctx, false)
	require.NoError(t, err)
	assert.Equal(t, []string{"sc-stray0000000000"}, ids)
	assert.Equal(t, []string{known.ID}, e.listed())
	assert.Len(t, e.m.List(admin, ""), 1)
	assert.Equal(t, []string{known.ID}, mapKeys(e.journaled()))
}
