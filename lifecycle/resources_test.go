package lifecycle

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// specRecorder wraps a real backend, remembers the spec of every
// Create, and refuses memory beyond what it pretends to allow, as a backend
// enforcing limits does. The real backend gets the spec without resources:
// these tests are about what the manager does with them, on any host.
type specRecorder struct {
	backend.Backend
	mu     sync.Mutex
	specs  map[string]backend.Spec
	maxMem int64
}

func (s *specRecorder) Create(ctx context.Context, id string, spec backend.Spec) (backend.Info, error) {
	if spec.Resources.MemoryBytes > s.maxMem {
		return backend.Info{}, fmt.Errorf("%w: memory_bytes %d is more than the %d this daemon allows", backend.ErrSpecUnenforceable, spec.Resources.MemoryBytes, s.maxMem)
	}
	s.mu.Lock()
	s.specs[id] = spec
	s.mu.Unlock()
	spec.Resources = backend.Resources{}
	return s.Backend.Create(ctx, id, spec)
}

func (s *specRecorder) spec(id string) (backend.Spec, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp, ok := s.specs[id]
	return sp, ok
}

func TestPoolNeverServesACreateAskingForResources(t *testing.T) {
	rec := &specRecorder{specs: map[string]backend.Spec{}, maxMem: 1 << 30}
	e := newPoolEnv(t, 1, func(c *Config) { c.MaxPerUID = 10 }, withWrapper(func(b backend.Backend) backend.Backend {
		rec.Backend = b
		return rec
	}))
	pooled := map[string]bool{}
	for _, s := range e.m.List(admin, "") {
		pooled[s.ID] = true
		sp, ok := rec.spec(s.ID)
		require.True(t, ok)
		assert.True(t, sp.Resources.IsZero(), "pool members are made with the daemon's defaults")
	}
	require.Len(t, pooled, 1)

	for _, res := range []backend.Resources{{MemoryBytes: 256 << 20}, {CPUs: 0.5}, {PIDs: 64}, {DiskBytes: 1 << 30}} {
		s := e.create(alice, CreateRequest{Spec: backend.Spec{Resources: res}})
		assert.False(t, pooled[s.ID], "a create asking for %+v is not served from the pool", res)
		sp, ok := rec.spec(s.ID)
		require.True(t, ok, "the backend made it")
		assert.Equal(t, res, sp.Resources, "the backend got the resources asked for")
		assert.Equal(t, res, s.Resources, "the record keeps what was asked")
		assert.Equal(t, 1, e.m.Stats().Pooled, "the pool member was not spent")
	}

	// The backend, not the pool, judges what it can enforce; a refusal
	// spends nothing and leaves nothing.
	before := len(e.listed())
	_, err := e.m.Create(context.Background(), alice, CreateRequest{Spec: backend.Spec{Resources: backend.Resources{MemoryBytes: 2 << 30}}})
	require.ErrorIs(t, err, backend.ErrSpecUnenforceable)
	assert.Equal(t, 1, e.m.Stats().Pooled)
	assert.Len(t, e.listed(), before)

	// Without resources the pool still serves.
	s := e.create(alice, CreateRequest{})
	assert.True(t, pooled[s.ID])
	assert.True(t, s.Resources.IsZero())
}

func TestResourcesAreJournaledAndReadopted(t *testing.T) {
	rec := &specRecorder{specs: map[string]backend.Spec{}, maxMem: 1 << 30}
	e := newEnv(t, withJournal(), withWrapper(func(b backend.Backend) backend.Backend {
		rec.Backend = b
		return rec
	}))
	res := backend.Resources{MemoryBytes: 128 << 20, CPUs: 1.5, PIDs: 100, DiskBytes: 1 << 30}
	withRes := e.create(alice, CreateRequest{Owner: "dag/run", Spec: backend.Spec{Resources: res}})
	plain := e.create(alice, CreateRequest{Owner: "dag/run"})

	j := e.journaled()
	assert.Equal(t, journalResources{MemoryBytes: 128 << 20, CPUs: 1.5, PIDs: 100, DiskBytes: 1 << 30}, j[withRes.ID].Resources)
	raw := map[string]json.RawMessage{}
	b, err := json.Marshal(j[plain.ID])
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &raw))
	assert.NotContains(t, raw, "resources", "a create without resources journals none")

	// A restart re-adopts both; list shows what was asked for.
	m2, err := New(Config{Backend: e.be, Journal: e.journal, Now: e.clock.Now})
	require.NoError(t, err)
	rep, err := m2.Recover(context.Background(), false)
	require.NoError(t, err)
	require.Equal(t, 2, rep.Adopted)
	got := map[string]backend.Resources{}
	for _, s := range m2.List(alice, "") {
		got[s.ID] = s.Resources
	}
	assert.Equal(t, map[string]backend.Resources{withRes.ID: res, plain.ID: {}}, got)
	// Owned sandboxes outlive their manager: the re-adopting one ends them
	// (on bwrap they would run on after the test).
	ids, err := m2.DestroyRun(context.Background(), alice, "dag/run")
	require.NoError(t, err)
	assert.Len(t, ids, 2)
}
