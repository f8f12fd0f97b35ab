package lifecycle

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// warmWatch tells when each Warm of the backend it wraps has returned.
type warmWatch struct {
	backend.Backend
	done chan warmDone
}

type warmDone struct {
	id  string
	err error
}

func (w *warmWatch) StartsLazily() {}

func (w *warmWatch) Warm(ctx context.Context, id string) error {
	err := w.Backend.(backend.Warmer).Warm(ctx, id)
	w.done <- warmDone{id, err}
	return err
}

// watchWarms wraps the env's backend in a warmWatch.
func watchWarms(w **warmWatch) envOpt {
	return withWrapper(func(b backend.Backend) backend.Backend {
		*w = &warmWatch{Backend: b, done: make(chan warmDone, 8)}
		return *w
	})
}

func (w *warmWatch) next(t *testing.T) warmDone {
	t.Helper()
	select {
	case d := <-w.done:
		return d
	case <-time.After(20 * time.Second):
		t.Fatal("the background start never returned")
		return warmDone{}
	}
}

// holdWarm holds the background start of a cold create's sandbox at
// FailWarmSoon, before it calls the backend, until release is closed; a
// test that fails before it closes it has it closed at its end, so the
// held start does not hold the env's Close.
func holdWarm(t *testing.T, reached chan<- struct{}, release chan struct{}) envOpt {
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	var once sync.Once
	return withConfig(func(c *Config) {
		c.Failpoint = func(name string) {
			if name == FailWarmSoon {
				once.Do(func() { close(reached) })
				<-release
			}
		}
	})
}

func awaitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s never came", what)
	}
}

// A cold create starts its sandbox's init in the background: it runs
// before any command, and the first command runs in it.
func TestBwrapColdCreateStartsItsInitBeforeTheFirstCommand(t *testing.T) {
	var w *warmWatch
	e := newEnv(t, withBwrap(), watchWarms(&w))
	s := e.create(alice, CreateRequest{TTL: time.Hour})
	d := w.next(t)
	require.NoError(t, d.err)
	require.Equal(t, s.ID, d.id)
	before := sandboxInit(s.ID)
	require.NotZero(t, before, "the init runs with no command yet")
	res := e.exec(alice, s.ID, "cat /proc/1/comm")
	assert.Equal(t, "sandbox-init\n", string(res.Stdout))
	assert.Equal(t, before, sandboxInit(s.ID), "the first command ran in the init the create started")
}

// The first command can come before the background start has called the
// backend (forced: the start is held until the command is done). The
// command starts the init itself; the start, let go, finds it running and
// starts no other.
func TestBwrapFirstCommandBeforeTheBackgroundStart(t *testing.T) {
	var w *warmWatch
	reached, release := make(chan struct{}), make(chan struct{})
	e := newEnv(t, withBwrap(), watchWarms(&w), holdWarm(t, reached, release))
	s := e.create(alice, CreateRequest{TTL: time.Hour})
	awaitClosed(t, reached, "the background start of the new sandbox")
	require.Zero(t, sandboxInit(s.ID), "held: nothing started yet")
	e.exec(alice, s.ID, "true")
	first := sandboxInit(s.ID)
	require.NotZero(t, first)
	close(release)
	require.NoError(t, w.next(t).err)
	assert.Equal(t, first, sandboxInit(s.ID), "the background start left the running init alone")
	res := e.exec(alice, s.ID, "cat /proc/1/comm")
	assert.Equal(t, "sandbox-init\n", string(res.Stdout))
	assert.Equal(t, first, sandboxInit(s.ID))
}

// A sandbox destroyed before its background start calls the backend
// (forced) gets no init: the start finds it gone, and nothing is left.
func TestBwrapDestroyBeforeTheBackgroundStart(t *testing.T) {
	var w *warmWatch
	reached, release := make(chan struct{}), make(chan struct{})
	e := newEnv(t, withBwrap(), watchWarms(&w), holdWarm(t, reached, release))
	s := e.create(alice, CreateRequest{TTL: time.Hour})
	awaitClosed(t, reached, "the background start of the new sandbox")
	require.NoError(t, e.m.Destroy(context.Background(), alice, s.ID))
	close(release)
	d := w.next(t)
	assert.ErrorIs(t, d.err, backend.ErrNotFound, "the start finds the sandbox gone")
	assert.Zero(t, sandboxInit(s.ID), "no init of a destroyed sandbox")
	assert.NotContains(t, e.listed(), s.ID)
}

// lazyWarming is a warmingBackend that starts lazily, as bwrap does.
type lazyWarming struct{ *warmingBackend }

func (lazyWarming) StartsLazily() {}

// A background start that fails costs the sandbox nothing: it stays, and
// its first command starts the init (or says what is wrong).
func TestBwrapFailedBackgroundStartLeavesTheSandbox(t *testing.T) {
	var wb *warmingBackend
	e := newEnv(t, withBwrap(), withWrapper(func(b backend.Backend) backend.Backend {
		wb = &warmingBackend{Backend: b, fail: 1}
		return lazyWarming{wb}
	}))
	s := e.create(alice, CreateRequest{TTL: time.Hour})
	require.Eventually(t, func() bool { return len(wb.calls()) == 1 }, 10*time.Second, 5*time.Millisecond)
	assert.Zero(t, sandboxInit(s.ID), "the start failed")
	assert.Contains(t, e.listed(), s.ID, "the sandbox stays")
	res := e.exec(alice, s.ID, "cat /proc/1/comm")
	assert.Equal(t, "sandbox-init\n", string(res.Stdout))
}

// Close waits for a background start in progress, as for a create.
func TestBwrapCloseWaitsForABackgroundStart(t *testing.T) {
	var w *warmWatch
	reached, release := make(chan struct{}), make(chan struct{})
	e := newEnv(t, withBwrap(), watchWarms(&w), holdWarm(t, reached, release))
	e.create(alice, CreateRequest{TTL: time.Hour})
	awaitClosed(t, reached, "the background start of the new sandbox")
	closed := make(chan error, 1)
	go func() { closed <- e.m.Close(context.Background()) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a background start was held")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	w.next(t)
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("Close never returned")
	}
}
