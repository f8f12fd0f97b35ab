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

// recordingObserver writes down what the manager tells it, one line per
// event, durations left out.
type recordingObserver struct {
	mu     sync.Mutex
	events []string
}

func (o *recordingObserver) add(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, fmt.Sprintf(format, args...))
}

func (o *recordingObserver) take() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	ev := o.events
	o.events = nil
	return ev
}

func (o *recordingObserver) Created(source string, took time.Duration) {
	o.add("created %s positive=%v", source, took > 0)
}
func (o *recordingObserver) CreateFailed(reason string)  { o.add("create failed %s", reason) }
func (o *recordingObserver) PoolClaim(hit bool)          { o.add("pool hit=%v", hit) }
func (o *recordingObserver) Destroyed(reason string)     { o.add("destroyed %s", reason) }
func (o *recordingObserver) DestroyFailed(reason string) { o.add("destroy failed %s", reason) }
func (o *recordingObserver) CommandDone(outcome string, took time.Duration, first bool, source string, oomKills uint64) {
	o.add("command %s first=%v source=%s oom=%d", outcome, first, source, oomKills)
}
func (o *recordingObserver) ProcessStarted() { o.add("process started") }

func TestObserverSeesCreatesCommandsAndDestroys(t *testing.T) {
	obs := &recordingObserver{}
	var fb *faultyBackend
	e := newEnv(t, withConfig(func(c *Config) { c.Observer = obs }),
		withWrapper(func(b backend.Backend) backend.Backend { fb = &faultyBackend{Backend: b}; return fb }))
	ctx := context.Background()

	s := e.create(alice, CreateRequest{})
	e.exec(alice, s.ID, "true")
	e.exec(alice, s.ID, "exit 3")
	res, err := e.m.Exec(ctx, alice, s.ID, backend.ExecRequest{Command: "sleep 10", Timeout: 100 * time.Millisecond})
	require.NoError(t, err)
	require.True(t, res.TimedOut)
	require.NoError(t, e.m.Destroy(ctx, alice, s.ID))
	assert.Equal(t, []string{
		"created cold positive=true",
		"command exited first=true source=cold oom=0",
		"command exited first=false source=cold oom=0",
		"command timed_out first=false source=cold oom=0",
		"destroyed client request",
	}, obs.take())

	// A backend that fails to create: a failure, and the cleanup's destroy.
	fb.createAfter.Store(true)
	_, err = e.m.Create(ctx, alice, CreateRequest{})
	require.Error(t, err)
	fb.createAfter.Store(false)
	assert.Equal(t, []string{"create failed backend", "destroyed create failed"}, obs.take())

	// A destroy the backend fails, then the reaper's retry.
	s = e.create(alice, CreateRequest{})
	fb.destroyFailures.Store(1)
	require.Error(t, e.m.Destroy(ctx, alice, s.ID))
	e.clock.Advance(time.Hour)
	e.m.Reap()
	assert.Equal(t, []string{"created cold positive=true", "destroy failed client request", "destroyed retrying failed destroy"}, obs.take())

	// A spec the backend refuses is the client's failure, not the backend's.
	_, err = e.m.Create(ctx, alice, CreateRequest{Spec: backend.Spec{Env: map[string]string{"BAD=": "x"}}})
	require.Error(t, err)
	assert.Equal(t, []string{"create failed refused_spec", "destroyed create failed"}, obs.take())

	// A quota refusal is no failed create: the observer hears nothing.
	e.m.cfg.MaxPerHost = 0
	_, err = e.m.Create(ctx, alice, CreateRequest{})
	var q *QuotaError
	require.ErrorAs(t, err, &q)
	assert.Empty(t, obs.take())
}

func TestObserverSeesThePool(t *testing.T) {
	obs := &recordingObserver{}
	e := newPoolEnv(t, 1, func(c *Config) { c.Observer = obs; c.MaxPerUID = 4 })
	obs.take() // the pool's own fill makes no events but its members' creates
	s := e.create(alice, CreateRequest{})
	e.exec(alice, s.ID, "true")
	// A plain create right after: the pool may not be refilled yet, so it is
	// a hit or a miss, never silence.
	s2 := e.create(alice, CreateRequest{})
	// A create the pool cannot serve (limits of its own) is neither a hit
	// nor a miss; this host cannot enforce them, so it fails.
	_, err := e.m.Create(context.Background(), alice, CreateRequest{Spec: backend.Spec{Resources: backend.Resources{PIDs: 64}}})
	require.Error(t, err)
	ev := obs.take()
	require.GreaterOrEqual(t, len(ev), 5, "%q", ev)
	assert.Equal(t, []string{"pool hit=true", "created pool positive=true", "command exited first=true source=pool oom=0"}, ev[:3])
	assert.Contains(t, []string{"pool hit=true|created pool positive=true", "pool hit=false|created cold positive=true"}, ev[3]+"|"+ev[4])
	assert.Equal(t, []string{"create failed refused_spec", "destroyed create failed"}, ev[5:])
	for _, id := range []string{s.ID, s2.ID} {
		require.NoError(t, e.m.Destroy(context.Background(), alice, id))
	}
}
