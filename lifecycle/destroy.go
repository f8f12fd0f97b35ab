package lifecycle

// Destroying a sandbox: the one way into StateDestroying (claimForDestroy),
// the destroy itself and its retry backoff.

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Destroy destroys a sandbox. It is idempotent: a sandbox that does not
// exist (or belongs to another uid, for a non-admin) is success and
// reveals nothing. The backend work runs detached from ctx.
func (m *Manager) Destroy(ctx context.Context, c Caller, id string) error {
	m.mu.Lock()
	if m.closing {
		m.mu.Unlock()
		return ErrShuttingDown
	}
	r, ok := m.boxes[id]
	if !ok || (!c.Admin && (r.UID != c.UID || r.Pooled)) || (r.State != StateReady && r.State != StatePooled && r.State != StateQuarantined) || !m.claimForDestroy(r) {
		m.mu.Unlock()
		// A sandbox still being created is destroyed by its creator's
		// cleanup if needed; one already being destroyed needs nothing.
		return nil
	}
	m.mu.Unlock()
	log := m.log.With("sandbox", id, "peer_uid", c.UID, "peer_pid", c.PID, "owner", r.Owner, "holder", r.Holder)
	return m.destroyNow(r, "client request", log)
}

// claimForDestroy is the only way into StateDestroying: it makes rec's
// destroy the caller's and reports whether it did. Whoever wants a sandbox
// gone (a client, destroy_run, the reaper, shutdown, a command that ended
// with its sandbox, a failed create, recovery) claims it first, under m.mu,
// and only the one that got it calls destroyNow; the others leave it
// alone. A failed destroy gives the claim back, for the reaper's retry.
// m.mu must be held.
func (m *Manager) claimForDestroy(rec *record) bool {
	if rec.claimed {
		return false
	}
	rec.claimed = true
	rec.State = StateDestroying
	return true
}

// claimAndDestroy claims rec and, if that succeeded, destroys it; a
// sandbox someone else is already destroying is left to them.
func (m *Manager) claimAndDestroy(rec *record, reason string, log hclog.Logger) error {
	m.mu.Lock()
	claimed := m.claimForDestroy(rec)
	m.mu.Unlock()
	if !claimed {
		return nil
	}
	return m.destroyNow(rec, reason, log)
}

// destroyNow destroys rec, which the caller claimed (claimForDestroy):
// journal it as destroying, ask the backend (detached, bounded), then
// forget it. On failure the record stays, marked for the reaper to retry
// with backoff.
func (m *Manager) destroyNow(rec *record, reason string, log hclog.Logger) error {
	m.opsWG.Add(1)
	defer m.opsWG.Done()
	m.awaitAdopted(rec) // never Destroy while the backend adopts it
	if err := m.persist(rec); err != nil {
		log.Error("journal write failed; destroying anyway", "error", err)
	}
	m.failpoint(FailDestroyJournal)
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.DestroyTimeout)
	defer cancel()
	err := m.be.Destroy(ctx, rec.ID)
	m.failpoint(FailDestroyBackend)
	if err != nil {
		m.mu.Lock()
		rec.destroyFails++
		rec.claimed = false // the reaper's to retry
		rec.retryAt = m.cfg.Now().Add(backoff(rec.destroyFails))
		retry := rec.retryAt
		m.mu.Unlock()
		log.Error("backend failed to destroy sandbox; will retry", "reason", reason, "error", err, "attempt", rec.destroyFails, "retry_at", retry.Format(time.RFC3339))
		m.obs.DestroyFailed(reason)
		return err
	}
	m.forget(rec)
	log.Info("sandbox destroyed", "reason", reason)
	m.obs.Destroyed(reason)
	return nil
}

// backoff is the wait before destroy attempt n+1.
func backoff(n int) time.Duration {
	d := retryBase
	for i := 1; i < n && d < retryMax; i++ {
		d *= 2
	}
	return min(d, retryMax)
}
