package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// Adopting after a restart, and the quarantine of what could not be
// adopted. A sandbox the backend cannot adopt is kept, never destroyed for
// it (its data is what the quarantine protects): it serves nothing, is
// listed as quarantined, and is adopted again in the background, with
// backoff, until it works or DefaultQuarantineRetryFor has passed, when it
// is reported failed (health) and left for its owner or an operator.
const (
	// DefaultQuarantineRetryFor bounds the background retries of one
	// quarantined sandbox.
	DefaultQuarantineRetryFor = 10 * time.Minute
	// adoptTimeout bounds one Adopt call.
	adoptTimeout = 30 * time.Second
	// quarantineRetryBase and quarantineRetryMax bound the backoff between
	// adopts of a quarantined sandbox.
	quarantineRetryBase = time.Second
	quarantineRetryMax  = 30 * time.Second
)

// journaled is the state a record is journaled with: a quarantine is this
// process's verdict, and the next start adopts the sandbox afresh.
func journaled(s State) State {
	if s == StateQuarantined {
		return StateReady
	}
	return s
}

// quarantined is the answer to any use of a quarantined sandbox.
func quarantined(r *record) error {
	if r.QuarantineGaveUp {
		return fmt.Errorf("%w: sandbox %q is quarantined and the daemon gave up adopting it (%s); an operator should look (docs/operations.md, Quarantine), or destroy it", backend.ErrUnavailable, r.ID, r.Quarantine)
	}
	return fmt.Errorf("%w: sandbox %q is quarantined since the daemon restarted (%s); the daemon retries adopting it, so retry later", backend.ErrUnavailable, r.ID, r.Quarantine)
}

// adoptOutcome is what one Adopt call means for a kept sandbox.
type adoptOutcome int

const (
	adoptOK adoptOutcome = iota
	adoptGone
	adoptQuarantine
)

// adoptDecision classifies Adopt's error: gone (destroy the record) only
// when the backend says so; any other failure quarantines.
func adoptDecision(err error) adoptOutcome {
	switch {
	case err == nil:
		return adoptOK
	case errors.Is(err, backend.ErrNotFound):
		return adoptGone
	}
	return adoptQuarantine
}

// adopt asks the backend to adopt id, bounded, then counts the durable
// processes a previous daemon left running in it.
func (m *Manager) adopt(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), adoptTimeout)
	defer cancel()
	if err := m.be.Adopt(ctx, id); err != nil {
		return err
	}
	m.countAdoptedProcesses(ctx, id)
	return nil
}

// quarantineBackoff is the wait before adopt attempt n+1.
func quarantineBackoff(n int) time.Duration {
	d := quarantineRetryBase
	for i := 1; i < n && d < quarantineRetryMax; i++ {
		d *= 2
	}
	return min(d, quarantineRetryMax)
}

// retryQuarantined adopts quarantined sandboxes again, until Close.
func (m *Manager) retryQuarantined() {
	t := time.NewTicker(min(m.cfg.ReapInterval, quarantineRetryBase))
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.RetryQuarantined()
		}
	}
}

// RetryQuarantined tries once more to adopt every quarantined sandbox whose
// backoff has passed, and reports how many are adopted now.
func (m *Manager) RetryQuarantined() int {
	now := m.cfg.Now()
	var due []*record
	m.mu.Lock()
	for _, r := range m.boxes {
		if r.State == StateQuarantined && !r.QuarantineGaveUp && !now.Before(r.adoptRetryAt) {
			r.adoptRetryAt = now.Add(adoptTimeout + quarantineRetryMax) // claimed
			due = append(due, r)
		}
	}
	m.mu.Unlock()
	adopted := 0
	for _, r := range due {
		err := m.adoptRecord(r)
		log := m.log.With("sandbox", r.ID, "owner", r.Owner, "uid", r.UID)
		m.mu.Lock()
		if r.State != StateQuarantined || m.boxes[r.ID] != r {
			m.mu.Unlock() // destroyed meanwhile
			continue
		}
		switch adoptDecision(err) {
		case adoptOK:
			r.State, r.Quarantine, r.LastUsed = StateReady, "", m.cfg.Now()
			m.mu.Unlock()
			adopted++
			log.Info("quarantined sandbox adopted", "attempts", r.adoptTries+1, "quarantined_for", m.cfg.Now().Sub(r.quarantinedAt).Round(time.Millisecond))
		case adoptGone:
			claimed := m.claimForDestroy(r)
			m.mu.Unlock()
			if claimed {
				_ = m.destroyNow(r, "gone from the backend while quarantined", log)
			}
		default:
			r.adoptTries++
			r.Quarantine = err.Error()
			if m.cfg.Now().Sub(r.quarantinedAt) >= m.cfg.QuarantineRetryFor {
				r.QuarantineGaveUp = true
				m.mu.Unlock()
				log.Error("gave up adopting a quarantined sandbox; it stays quarantined, with its data, for its owner or an operator", "attempts", r.adoptTries, "error", err)
				continue
			}
			r.adoptRetryAt = m.cfg.Now().Add(quarantineBackoff(r.adoptTries))
			m.mu.Unlock()
			log.Debug("quarantined sandbox still cannot be adopted", "attempt", r.adoptTries, "error", err)
		}
	}
	return adopted
}

// quarantine marks r quarantined for err (m.mu held).
func (m *Manager) quarantine(r *record, err error) {
	r.State = StateQuarantined
	r.Quarantine = err.Error()
	r.quarantinedAt = m.cfg.Now()
	r.adoptTries = 1
	r.adoptRetryAt = r.quarantinedAt.Add(quarantineBackoff(1))
}
