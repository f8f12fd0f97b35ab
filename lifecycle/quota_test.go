package lifecycle

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// blockingDestroy holds every Destroy of the real backend it wraps until
// released: a sandbox mid-teardown for as long as a test needs.
type blockingDestroy struct {
	backend.Backend
	entered chan string
	release chan struct{}
	once    sync.Once
}

// unblock lets every held and later Destroy through.
func (b *blockingDestroy) unblock() { b.once.Do(func() { close(b.release) }) }

func newBlockingDestroy() *blockingDestroy {
	return &blockingDestroy{entered: make(chan string, 8), release: make(chan struct{})}
}

func (b *blockingDestroy) Destroy(ctx context.Context, id string) error {
	b.entered <- id
	<-b.release
	return b.Backend.Destroy(ctx, id)
}

func (b *blockingDestroy) wrap(be backend.Backend) backend.Backend { b.Backend = be; return b }

// tearingDown starts the destroy of id (as the reaper, a command that
// ended its sandbox or another request of its user would) and returns
// once the backend is at work on it; the destroy's result comes on the
// channel after b is released.
func (b *blockingDestroy) tearingDown(t *testing.T, e *testEnv, id string) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- e.m.Destroy(context.Background(), admin, id) }()
	// Before the env's cleanup (registered earlier, so run later) closes
	// the manager, which waits for the destroy.
	t.Cleanup(b.unblock)
	select {
	case got := <-b.entered:
		require.Equal(t, id, got)
	case <-time.After(10 * time.Second):
		t.Fatal("the destroy never reached the backend")
	}
	return done
}

// A sandbox being destroyed is gone for its user: a destroy of it returns
// at once, and it counts against no quota of its uid or its run, so the
// user's next create (cold, from the pool, or an owner given later) is not
// refused for it. The host's max_sandboxes still counts it until the
// backend has removed it, since it still holds the host's resources, and
// the refusal says so.
func TestDestroyingSandboxesCountAgainstTheHostOnly(t *testing.T) {
	ctx := context.Background()
	t.Run("create", func(t *testing.T) {
		bd := newBlockingDestroy()
		e := newEnv(t, withJournal(), withWrapper(bd.wrap), withConfig(func(c *Config) {
			c.MaxPerUID, c.MaxPerOwner, c.MaxPerHost = 1, 1, 2
		}))
		s1 := e.create(alice, CreateRequest{Owner: "dag/run"})
		done := bd.tearingDown(t, e, s1.ID)
		require.NoError(t, e.m.Destroy(ctx, alice, s1.ID), "its user's destroy returns: it is being destroyed")

		e.create(alice, CreateRequest{Owner: "dag/run"})

		_, err := e.m.Create(ctx, bob, CreateRequest{})
		var qe *QuotaError
		require.ErrorAs(t, err, &qe, "the host is full: one sandbox and one being torn down")
		assert.Equal(t, "host", qe.Scope)
		assert.Equal(t, 2, qe.Limit)
		assert.Equal(t, 1, qe.Destroying)
		assert.Contains(t, qe.Error(), "1 of them are still being destroyed")

		bd.unblock()
		require.NoError(t, <-done)
		e.create(bob, CreateRequest{})
	})
	t.Run("pool", func(t *testing.T) {
		bd := newBlockingDestroy()
		e := newPoolEnv(t, 1, func(c *Config) { c.MaxPerOwner = 1 }, withWrapper(bd.wrap)) // MaxPerUID 1
		s1 := e.create(alice, CreateRequest{Owner: "dag/run"})
		waitPool(t, e, 1)
		done := bd.tearingDown(t, e, s1.ID)

		s2 := e.create(alice, CreateRequest{Owner: "dag/run"})
		assert.NotEqual(t, s1.ID, s2.ID)
		bd.unblock()
		require.NoError(t, <-done)
	})
	t.Run("owner given later", func(t *testing.T) {
		bd := newBlockingDestroy()
		e := newEnv(t, withJournal(), withWrapper(bd.wrap), withConfig(func(c *Config) { c.MaxPerOwner = 1 }))
		s1 := e.create(alice, CreateRequest{Owner: "dag/run"})
		done := bd.tearingDown(t, e, s1.ID)

		s2 := e.create(alice, CreateRequest{}) // connection-bound, no owner yet
		_, err := e.m.WriteTags(ctx, alice, s2.ID, map[string]string{TagOwner: "dag/run"})
		require.NoError(t, err)
		bd.unblock()
		require.NoError(t, <-done)
	})
}
