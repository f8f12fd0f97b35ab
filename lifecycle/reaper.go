package lifecycle

// The reaper: why a sandbox must go now (reapReason, a pure function), and
// the round that destroys them.

import (
	"time"
)

// Disconnected notes that a connection ended: its connection-bound
// sandboxes start their grace period.
func (m *Manager) Disconnected(connID uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.cfg.Now()
	for _, r := range m.boxes {
		if r.ConnBound && r.ConnID == connID && r.disconnectedAt.IsZero() {
			r.disconnectedAt = now
		}
	}
}

// reapReason says why a sandbox must go now, or "" if it may stay. It is a
// pure function of the record and the clock so it can be table-tested.
func reapReason(s Sandbox, disconnectedAt time.Time, running int, now time.Time, connGrace, idle time.Duration) string {
	switch {
	case s.State == StatePooled && !now.Before(s.ExpiresAt):
		return "pool member expired"
	case s.State == StateQuarantined && !now.Before(s.ExpiresAt):
		return "expired while quarantined"
	case s.State != StateReady:
		return ""
	case !now.Before(s.ExpiresAt):
		return "expired"
	case s.ConnBound && !disconnectedAt.IsZero() && now.Sub(disconnectedAt) >= connGrace:
		return "connection closed"
	case idle > 0 && running == 0 && !s.Paused && now.Sub(s.LastUsed) >= idle:
		// A paused sandbox waits on purpose (MaxPaused bounds it).
		return "idle"
	}
	return ""
}

// Reap destroys every sandbox whose time is up and retries failed
// destroys whose backoff has passed. It returns how many it destroyed.
func (m *Manager) Reap() int {
	now := m.cfg.Now()
	type victim struct {
		r      *record
		reason string
	}
	var victims []victim
	m.mu.Lock()
	for _, r := range m.boxes {
		switch {
		case r.State == StateDestroying && r.destroyFails > 0 && !now.Before(r.retryAt):
			if m.claimForDestroy(r) {
				victims = append(victims, victim{r, "retrying failed destroy"})
			}
		default:
			why := reapReason(r.Sandbox, r.disconnectedAt, r.running, now, m.cfg.ConnGrace, m.cfg.IdleTimeout)
			if why == "" {
				why = pausedTooLong(r.Sandbox, now, m.cfg.MaxPaused)
			}
			if why != "" && m.claimForDestroy(r) {
				victims = append(victims, victim{r, why})
			}
		}
	}
	m.mu.Unlock()
	n := 0
	for _, v := range victims {
		log := m.log.With("sandbox", v.r.ID, "owner", v.r.Owner, "holder", v.r.Holder, "uid", v.r.UID)
		if m.destroyNow(v.r, v.reason, log) == nil {
			n++
		}
	}
	return n
}
