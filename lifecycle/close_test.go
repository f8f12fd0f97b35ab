package lifecycle

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

func TestCloseWithJournalKeepsExpiring(t *testing.T) {
	e := newEnv(t, withJournal())
	ctx := context.Background()
	cb := e.create(alice, CreateRequest{})
	owned := e.create(alice, CreateRequest{Owner: "dag/run"})
	ttl := e.create(bob, CreateRequest{TTL: time.Hour})
	e.m.Start()

	require.NoError(t, e.m.Close(ctx))
	assert.False(t, e.dirExists(cb.ID), "a connection-bound sandbox dies with the daemon")
	assert.Equal(t, sorted(owned.ID, ttl.ID), e.listed(), "expiring sandboxes stay for the next start")
	j := e.journaled()
	assert.ElementsMatch(t, []string{owned.ID, ttl.ID}, mapKeys(j))
	for _, id := range []string{owned.ID, ttl.ID} {
		assert.Equal(t, StateReady, j[id].State)
	}
	require.NoError(t, e.m.Close(ctx), "Close is idempotent")

	// The next start adopts them.
	e2 := e.restart(nil)
	rep, err := e2.m.Recover(ctx, false)
	require.NoError(t, err)
	assert.Equal(t, 2, rep.Adopted)
	e2.exec(alice, owned.ID, "true")
}

func TestCloseWithoutJournalDestroysAll(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.create(alice, CreateRequest{})
	e.create(alice, CreateRequest{Owner: "dag/run"})
	e.create(bob, CreateRequest{TTL: time.Hour})
	require.Len(t, e.listed(), 3)

	require.NoError(t, e.m.Close(ctx))
	assert.Empty(t, e.listed(), "without a journal nothing could re-adopt them")
	assert.Equal(t, Stats{}, e.m.Stats())
}

// TestOperationsAfterClose: Close "refuses new work"; every operation
// after it answers ErrShuttingDown (the protocol's shutting_down) rather
// than acting on a sandbox the next start is meant to re-adopt.
func TestOperationsAfterClose(t *testing.T) {
	ctx := context.Background()
	ops := map[string]func(m *Manager, id string) error{
		"Create": func(m *Manager, id string) error {
			_, err := m.Create(ctx, alice, CreateRequest{})
			return err
		},
		"Exec": func(m *Manager, id string) error {
			_, err := m.Exec(ctx, alice, id, backend.ExecRequest{Command: "true", Timeout: time.Second})
			return err
		},
		"ReadFile": func(m *Manager, id string) error {
			_, err := m.ReadFile(ctx, alice, id, "x", 10)
			return err
		},
		"WriteFile": func(m *Manager, id string) error { return m.WriteFile(ctx, alice, id, "x", []byte("x"), 0o644) },
		"ListDirectory": func(m *Manager, id string) error {
			_, err := m.ListDirectory(ctx, alice, id, "/workspace", 10)
			return err
		},
		"Attach": func(m *Manager, id string) error {
			_, err := m.Attach(ctx, alice, id, "dag/run", "task-1")
			return err
		},
		"Release": func(m *Manager, id string) error {
			_, err := m.Release(ctx, alice, id, "task-1")
			return err
		},
		"Renew": func(m *Manager, id string) error {
			_, err := m.Renew(ctx, alice, id, 2*time.Hour)
			return err
		},
		"ReadTags": func(m *Manager, id string) error {
			_, err := m.ReadTags(ctx, alice, id)
			return err
		},
		"WriteTags": func(m *Manager, id string) error {
			_, err := m.WriteTags(ctx, alice, id, map[string]string{"k": "v"})
			return err
		},
		"DestroyRun": func(m *Manager, id string) error {
			_, err := m.DestroyRun(ctx, alice, "dag/run")
			return err
		},
		"Destroy": func(m *Manager, id string) error { return m.Destroy(ctx, alice, id) },
	}
	for name, op := range ops {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, withJournal())
			s := e.create(alice, CreateRequest{Owner: "dag/run"})
			_, err := e.m.Attach(ctx, alice, s.ID, "dag/run", "task-1")
			require.NoError(t, err)
			require.NoError(t, e.m.Close(ctx))
			state := func() string {
				d, ok := e.m.Describe(s.ID)
				jr, jok := e.journaled()[s.ID]
				return fmt.Sprintf("in memory %v (holder %q, expires %v, tags %v); journaled %v (holder %q, tags %v); on disk %v",
					ok, d.Holder, d.ExpiresAt, d.Tags, jok, jr.Holder, jr.Tags, e.workspaceExists(s.ID))
			}
			before := state()

			err = op(e.m, s.ID)
			assert.ErrorIs(t, err, ErrShuttingDown)
			assert.Equal(t, before, state(), "nothing may change after Close")
		})
	}
}

func TestCloseWaitsForCreateInFlight(t *testing.T) {
	entered := make(chan struct{})
	proceed := make(chan struct{})
	var once bool
	e := newEnv(t, withJournal(), withConfig(func(c *Config) {
		c.Failpoint = func(name string) {
			if name == FailCreateJournaled && !once {
				once = true
				close(entered)
				<-proceed
			}
		}
	}))
	ctx := context.Background()

	created := make(chan error, 1)
	go func() {
		_, err := e.m.Create(ctx, alice, CreateRequest{Owner: "dag/run"})
		created <- err
	}()
	<-entered
	assert.Equal(t, 1, e.m.Stats().Creating)

	closed := make(chan error, 1)
	go func() { closed <- e.m.Close(ctx) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a create was in flight")
	case <-time.After(200 * time.Millisecond):
	}
	close(proceed)

	require.ErrorIs(t, <-created, ErrShuttingDown, "a create that finishes during shutdown is undone")
	require.NoError(t, <-closed)
	assert.Empty(t, e.listed())
	assert.Empty(t, e.journaled())
}

func TestCloseBoundedByContext(t *testing.T) {
	proceed := make(chan struct{})
	entered := make(chan struct{})
	var once bool
	e := newEnv(t, withConfig(func(c *Config) {
		c.Failpoint = func(name string) {
			if name == FailCreateJournaled && !once {
				once = true
				close(entered)
				<-proceed
			}
		}
	}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = e.m.Create(context.Background(), alice, CreateRequest{})
	}()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_ = e.m.Close(ctx)
	assert.Less(t, time.Since(start), 5*time.Second, "Close must give up waiting when its context ends")
	close(proceed)
	<-done
	assert.Empty(t, e.listed())
}

// A create of an expiring sandbox returns once its "ready" record is
// durable; a connection-bound one (which recovery destroys whatever its
// record says) is journaled as creating only, until a change of it
// journals it whole; recovery destroys such a record, and says why.
func TestCreateJournalsConnectionBoundAsCreatingOnly(t *testing.T) {
	e := newEnv(t, withJournal())
	ctx := context.Background()
	owned := e.create(alice, CreateRequest{Owner: "dag/run"})
	assert.Equal(t, StateReady, e.journaled()[owned.ID].State, "durable when Create returned")

	cb := e.create(alice, CreateRequest{})
	assert.Equal(t, StateCreating, e.journaled()[cb.ID].State, "a connection-bound sandbox's ready is not journaled")
	e.exec(alice, cb.ID, "true")
	assert.Equal(t, StateCreating, e.journaled()[cb.ID].State)
	tagged := e.create(alice, CreateRequest{})
	_, err := e.m.WriteTags(ctx, alice, tagged.ID, map[string]string{"team": "data"})
	require.NoError(t, err)
	assert.Equal(t, StateReady, e.journaled()[tagged.ID].State, "a change of it journals it whole")
	attached := e.create(bob, CreateRequest{})
	_, err = e.m.WriteTags(ctx, bob, attached.ID, map[string]string{TagOwner: "dag/run"})
	require.NoError(t, err)
	if j := e.journaled()[attached.ID]; assert.Equal(t, StateReady, j.State) {
		assert.False(t, j.ConnBound, "owned now: it outlives the daemon")
	}

	// The daemon dies; recovery destroys the connection-bound ones.
	e2 := e.restart(nil)
	rep, err := e2.m.Recover(ctx, false)
	require.NoError(t, err)
	assert.Equal(t, 2, rep.Adopted, "the two owned ones")
	assert.Equal(t, 2, rep.Destroyed, "the two connection-bound ones")
	for _, a := range rep.Actions {
		if a.Sandbox == cb.ID {
			assert.Equal(t, "destroy", a.Do)
			assert.Contains(t, a.Reason, "connection-bound")
		}
	}
	assert.ElementsMatch(t, []string{owned.ID, attached.ID}, e2.listed())
}
