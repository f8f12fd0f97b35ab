package lifecycle

// The records of sandboxes: their journal writes, their snapshots, and how
// an op finds the record it may act on.

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/internal/handoff"
)

// persist writes rec's current state to the journal. Writes of one record
// are ordered by rec.jmu and each takes its snapshot under that lock, so
// the last write always carries the newest state; a deleted record is
// never written again.
func (m *Manager) persist(rec *record) error {
	if m.journal == nil {
		return nil
	}
	rec.jmu.Lock()
	defer rec.jmu.Unlock()
	if rec.deleted {
		return nil
	}
	m.mu.Lock()
	jr := rec.journalRecord()
	m.mu.Unlock()
	return m.journal.Put(jr)
}

// unjournal deletes rec's journal record.
func (m *Manager) unjournal(rec *record) error {
	rec.jmu.Lock()
	defer rec.jmu.Unlock()
	rec.deleted = true
	if m.journal == nil {
		return nil
	}
	return m.journal.Delete(rec.ID)
}

// forget drops rec from memory and from the journal.
func (m *Manager) forget(rec *record) {
	m.mu.Lock()
	if m.boxes[rec.ID] == rec {
		delete(m.boxes, rec.ID)
		m.forgetProcesses(rec.ID)
	}
	m.mu.Unlock()
	if err := m.unjournal(rec); err != nil {
		m.log.Error("journal delete failed; the next start will destroy the sandbox again (harmless)", "sandbox", rec.ID, "error", err)
	}
}

func (r *record) snapshot() Sandbox {
	s := r.Sandbox
	s.Labels = cloneMap(r.Labels)
	s.Tags = cloneMap(r.Tags)
	s.Env = cloneMap(r.Env)
	return s
}

func (r *record) journalRecord() journalRecord {
	return journalRecord{
		ID: r.ID, UID: r.UID, Owner: r.Owner, Holder: r.Holder,
		Labels: cloneMap(r.Labels), Tags: cloneMap(r.Tags),
		Network: r.Network, NetSpec: r.NetSpec, Workdir: r.Workdir,
		State: journaled(r.State), ConnBound: r.ConnBound, Pooled: r.Pooled, Env: cloneMap(r.Env),
		Resources: journalResources(r.Resources), HostUID: r.HostUID,
		Image: r.Image, ImageDigest: r.ImageDigest,
		CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt, LastUsed: r.LastUsed,
		Paused: r.Paused, PausedAt: r.PausedAt, MemoryReleased: r.MemoryReleased,
	}
}

func fromJournal(jr journalRecord) *record {
	return newRecord(Sandbox{
		ID: jr.ID, UID: jr.UID, Owner: jr.Owner, Holder: jr.Holder,
		Labels: jr.Labels, Tags: jr.Tags, Network: jr.Network, NetSpec: jr.NetSpec,
		Workdir: jr.Workdir, State: jr.State, ConnBound: jr.ConnBound, Pooled: jr.Pooled, Env: jr.Env,
		Resources: backend.Resources(jr.Resources), HostUID: jr.HostUID,
		Image: cmpOr(jr.Image, backend.HostImage), ImageDigest: jr.ImageDigest,
		CreatedAt: jr.CreatedAt, ExpiresAt: jr.ExpiresAt, LastUsed: jr.LastUsed,
		Paused: jr.Paused, PausedAt: jr.PausedAt, MemoryReleased: jr.MemoryReleased,
	})
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// notFound is the one answer for "no such sandbox for you".
func notFound(id string) error {
	return fmt.Errorf("%w: no sandbox %q (destroyed, expired, or never created by this user); create a new one", backend.ErrNotFound, id)
}

// lookup finds a ready sandbox that c may use, and claims a
// connection-bound sandbox back for c's connection if its own connection
// is gone. Another uid's sandbox is not found, as if it did not exist.
// m.mu must be held.
func (m *Manager) lookup(c Caller, id string) (*record, error) {
	if m.closing {
		return nil, ErrShuttingDown
	}
	r, ok := m.boxes[id]
	if ok && r.State == StateQuarantined && r.UID == c.UID {
		return nil, quarantined(r)
	}
	if !ok || r.State != StateReady || r.UID != c.UID {
		return nil, notFound(id)
	}
	if !m.cfg.Now().Before(r.ExpiresAt) {
		return nil, fmt.Errorf("%w: sandbox %q expired at %s; create a new one", backend.ErrNotFound, id, r.ExpiresAt.Format(time.RFC3339))
	}
	if r.ConnBound && !r.disconnectedAt.IsZero() && m.cfg.Now().Sub(r.disconnectedAt) >= m.cfg.ConnGrace {
		// Its grace is over; the reaper just has not come round yet.
		return nil, notFound(id)
	}
	if r.ConnBound && !r.disconnectedAt.IsZero() && c.ConnID != 0 {
		r.ConnID = c.ConnID
		r.disconnectedAt = time.Time{}
		m.log.Info("connection-bound sandbox claimed by a new connection", "sandbox", id, "conn", c.ConnID)
	}
	return r, nil
}

// use marks the start of an operation on a sandbox; the returned func
// marks its end. A paused sandbox is resumed first, and no pause comes
// until the operation ended (awake). A request running on its connection's
// reader has the connection released (internal/handoff) before use waits
// for a recovery still adopting the sandbox, or for a resume.
func (m *Manager) use(ctx context.Context, c Caller, id string) (*record, func(), error) {
	r, done, err := m.enter(ctx, c, id)
	if err != nil {
		return nil, nil, err
	}
	leave, err := m.awake(ctx, r)
	if err != nil {
		done()
		return nil, nil, err
	}
	return r, func() { leave(); done() }, nil
}

// withEnv is env with the sandbox's own spec env under it: a sandbox
// claimed from the pool carries its spec's env to each command, process
// and cell, and the request's own env wins. m.mu is held.
func (r *record) withEnv(env map[string]string) map[string]string {
	if len(r.Env) == 0 {
		return env
	}
	merged := cloneMap(r.Env)
	for k, v := range env {
		merged[k] = v
	}
	return merged
}

// through calls fn with the backend's capability, got by capability (an
// ErrUnsupported when the backend has none), while c uses sandbox id:
// the one shape of every op that needs no more than that.
func through[B, T any](m *Manager, ctx context.Context, c Caller, id string, capability func() (B, error), fn func(B) (T, error)) (T, error) {
	var zero T
	b, err := capability()
	if err != nil {
		return zero, err
	}
	_, done, err := m.use(ctx, c, id)
	if err != nil {
		return zero, err
	}
	defer done()
	return fn(b)
}

// enter is use without the resume: the sandbox found, checked and counted
// as in use (for the idle clock) until the returned func is called.
func (m *Manager) enter(ctx context.Context, c Caller, id string) (*record, func(), error) {
	m.mu.Lock()
	if r := m.boxes[id]; r != nil && r.adopted != nil && r.UID == c.UID {
		// Kept by a recovery that is still adopting it: first that.
		m.mu.Unlock()
		handoff.Release(ctx)
		m.awaitAdopted(r)
		m.mu.Lock()
	}
	defer m.mu.Unlock()
	r, err := m.lookup(c, id)
	if err != nil {
		return nil, nil, err
	}
	r.running++
	r.LastUsed = m.cfg.Now()
	return r, func() {
		m.mu.Lock()
		r.running--
		r.LastUsed = m.cfg.Now()
		m.mu.Unlock()
	}, nil
}

// Describe returns a sandbox's record without any access check, for the
// audit trail.
func (m *Manager) Describe(id string) (Sandbox, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.boxes[id]
	if !ok {
		return Sandbox{}, false
	}
	return r.snapshot(), true
}

// List returns the sandboxes caller may see (an admin sees all), oldest
// first, optionally only those of one owner.
func (m *Manager) List(c Caller, owner string) []Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Sandbox, 0, len(m.boxes))
	for _, r := range m.boxes {
		if r.recovering {
			// Gone as far as clients know: recovery decided so before the
			// daemon served, and destroys it in the background.
			continue
		}
		if (c.Admin || (r.UID == c.UID && !r.Pooled)) && (owner == "" || r.Owner == owner) {
			out = append(out, r.snapshot())
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}
