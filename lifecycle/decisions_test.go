package lifecycle

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestRecoveryDecision(t *testing.T) {
	now := clockStart
	valid := journalRecord{ID: "sc-1", State: StateReady, Owner: "dag/run", CreatedAt: now.Add(-time.Hour), ExpiresAt: now.Add(time.Hour)}
	with := func(f func(*journalRecord)) journalRecord {
		r := valid
		f(&r)
		return r
	}
	tests := []struct {
		name      string
		rec       journalRecord
		alive     bool
		wantAdopt bool
		reason    string // a substring of the reason
	}{
		{"creating", with(func(r *journalRecord) { r.State = StateCreating }), true, false, "during create"},
		{"creating, gone from backend", with(func(r *journalRecord) { r.State = StateCreating }), false, false, "during create"},
		{"destroying", with(func(r *journalRecord) { r.State = StateDestroying }), true, false, "during destroy"},
		{"unknown state", with(func(r *journalRecord) { r.State = "paused" }), true, false, `unknown state "paused"`},
		{"empty state", with(func(r *journalRecord) { r.State = "" }), true, false, "unknown state"},
		{"connection-bound", with(func(r *journalRecord) { r.ConnBound = true; r.Owner = "" }), true, false, "connection-bound"},
		{"expired exactly now", with(func(r *journalRecord) { r.ExpiresAt = now }), true, false, "expired"},
		{"expired long ago", with(func(r *journalRecord) { r.ExpiresAt = now.Add(-time.Minute) }), true, false, "expired"},
		{"not alive", valid, false, false, "no longer has it"},
		{"adopt", valid, true, true, "lease valid"},
		{"adopt, a nanosecond left", with(func(r *journalRecord) { r.ExpiresAt = now.Add(time.Nanosecond) }), true, true, "lease valid"},
		// Earlier checks win: a half-made, expired, conn-bound record is
		// still reported as half-made.
		{"creating beats conn-bound and expired", with(func(r *journalRecord) {
			r.State = StateCreating
			r.ConnBound = true
			r.ExpiresAt = now.Add(-time.Hour)
		}), false, false, "during create"},
		{"conn-bound beats expired", with(func(r *journalRecord) { r.ConnBound = true; r.ExpiresAt = now.Add(-time.Hour) }), true, false, "connection-bound"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			adopt, reason := recoveryDecision(tt.rec, tt.alive, now)
			assert.Equal(t, tt.wantAdopt, adopt)
			assert.Contains(t, reason, tt.reason)
		})
	}
}

func TestSweepDecision(t *testing.T) {
	tests := []struct {
		known, sweep bool
	}{
		{known: true, sweep: false},
		{known: false, sweep: true},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.sweep, sweepDecision(tt.known), "known=%v", tt.known)
	}
}

func TestReapReason(t *testing.T) {
	now := clockStart
	const grace = 10 * time.Second
	const idle = 30 * time.Minute
	ready := Sandbox{ID: "sc-1", State: StateReady, CreatedAt: now.Add(-time.Hour), ExpiresAt: now.Add(time.Hour), LastUsed: now}
	connBound := ready
	connBound.ConnBound = true
	with := func(s Sandbox, f func(*Sandbox)) Sandbox {
		f(&s)
		return s
	}
	tests := []struct {
		name         string
		s            Sandbox
		disconnected time.Time
		running      int
		idle         time.Duration
		want         string
	}{
		{"fresh", ready, time.Time{}, 0, idle, ""},
		{"expired exactly now", with(ready, func(s *Sandbox) { s.ExpiresAt = now }), time.Time{}, 0, idle, "expired"},
		{"expired", with(ready, func(s *Sandbox) { s.ExpiresAt = now.Add(-time.Second) }), time.Time{}, 0, idle, "expired"},
		{"expired while running", with(ready, func(s *Sandbox) { s.ExpiresAt = now.Add(-time.Second) }), time.Time{}, 3, idle, "expired"},
		{"expired conn-bound past grace says expired", with(connBound, func(s *Sandbox) { s.ExpiresAt = now }), now.Add(-time.Hour), 0, idle, "expired"},
		{"conn-bound, connection alive", connBound, time.Time{}, 0, idle, ""},
		{"conn-bound, closed within grace", connBound, now.Add(-grace + time.Nanosecond), 0, idle, ""},
		{"conn-bound, closed just now", connBound, now, 0, idle, ""},
		{"conn-bound, grace just ended", connBound, now.Add(-grace), 0, idle, "connection closed"},
		{"conn-bound, closed long ago", connBound, now.Add(-time.Hour), 0, idle, "connection closed"},
		{"conn-bound, closed after grace, still running", connBound, now.Add(-time.Hour), 2, idle, "connection closed"},
		{"expiring ignores disconnection", ready, now.Add(-time.Hour), 0, idle, ""},
		{"idle", with(ready, func(s *Sandbox) { s.LastUsed = now.Add(-idle) }), time.Time{}, 0, idle, "idle"},
		{"almost idle", with(ready, func(s *Sandbox) { s.LastUsed = now.Add(-idle + time.Nanosecond) }), time.Time{}, 0, idle, ""},
		{"idle but running", with(ready, func(s *Sandbox) { s.LastUsed = now.Add(-2 * idle) }), time.Time{}, 1, idle, ""},
		{"idle disabled (negative)", with(ready, func(s *Sandbox) { s.LastUsed = now.Add(-100 * idle) }), time.Time{}, 0, -1, ""},
		{"idle disabled (zero)", with(ready, func(s *Sandbox) { s.LastUsed = now.Add(-100 * idle) }), time.Time{}, 0, 0, ""},
		{"conn-bound idle", with(connBound, func(s *Sandbox) { s.LastUsed = now.Add(-idle) }), time.Time{}, 0, idle, "idle"},
		{"creating is never reaped", with(ready, func(s *Sandbox) { s.State = StateCreating; s.ExpiresAt = now.Add(-time.Hour) }), time.Time{}, 0, idle, ""},
		{"destroying is never reaped", with(connBound, func(s *Sandbox) { s.State = StateDestroying; s.ExpiresAt = now.Add(-time.Hour) }), now.Add(-time.Hour), 0, idle, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, reapReason(tt.s, tt.disconnected, tt.running, now, grace, tt.idle))
		})
	}
}

func TestBackoff(t *testing.T) {
	assert.Equal(t, retryBase, backoff(0))
	assert.Equal(t, retryBase, backoff(1))
	assert.Equal(t, 2*retryBase, backoff(2))
	assert.Equal(t, 4*retryBase, backoff(3))
	prev := time.Duration(0)
	reachedCap := false
	for n := 0; n <= 200; n++ {
		d := backoff(n)
		assert.GreaterOrEqual(t, d, prev, "backoff(%d) is shorter than backoff(%d)", n, n-1)
		assert.LessOrEqual(t, d, retryMax, "backoff(%d)", n)
		assert.Positive(t, d)
		if d == retryMax {
			reachedCap = true
		}
		prev = d
	}
	assert.True(t, reachedCap, "backoff never reaches its cap")
	assert.Equal(t, retryMax, backoff(1<<30), "a huge attempt count must not overflow")
}
