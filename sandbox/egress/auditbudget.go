package egress

import (
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// A sandbox's audit lines are bounded by a token bucket per session, so a
// sandbox that floods the resolver or refused destinations cannot flood
// the audit trail: auditBurst lines at once, then auditRate a second. A
// line past the budget is not written but counted (Stats.AuditSuppressed);
// when the budget has refilled (a line's worth, 1/auditRate later) one
// summary line says how many were suppressed, and the session's close
// writes one for any still untold. A summary costs no budget: under a
// steady flood a sandbox writes at most auditRate lines a second and as
// many summaries. Lines of relayed connections and flows (allowed, with
// their bytes) are never suppressed: each is a dial the policy allowed,
// at most max_conns at once, and the record of what left the host. The
// budget only decides what is written: every refusal is enforced, and
// counted, whatever it says.
const (
	auditBurst = 200 // lines
	auditRate  = 20  // lines a second, after the burst
)

// auditBudget is one session's token bucket (golang.org/x/time/rate, fed
// the caller's clock) and the lines it suppressed since the last summary.
// Its methods take the time; the caller holds the session's audit lock.
type auditBudget struct {
	burst, rate float64
	lim         *rate.Limiter
	last        time.Time // of the last take
	pending     suppression
}

// suppression is what a summary line tells.
type suppression struct {
	lines, refusals int64 // lines not written; how many of them refusals
	since           time.Time
}

func newAuditBudget(burst, r float64) auditBudget {
	return auditBudget{burst: burst, rate: r, lim: rate.NewLimiter(rate.Limit(r), int(burst))}
}

// take refills the bucket to now and spends one line's worth, or reports
// there is none.
func (b *auditBudget) take(now time.Time) bool {
	b.last = now
	return b.lim.AllowN(now, 1)
}

// suppress counts a line not written; first says it begins a new run of
// them (the caller arranges a summary once the budget refills).
func (b *auditBudget) suppress(now time.Time, refusal bool) (first bool) {
	if b.pending.lines == 0 {
		b.pending.since, first = now, true
	}
	b.pending.lines++
	if refusal {
		b.pending.refusals++
	}
	return first
}

// refillIn is how long until the bucket holds a line's worth again.
func (b *auditBudget) refillIn() time.Duration {
	tokens := b.lim.TokensAt(b.last)
	if tokens >= 1 {
		return 0
	}
	return time.Duration((1 - tokens) / b.rate * float64(time.Second))
}

// drain returns the suppressed lines not yet told, and forgets them.
func (b *auditBudget) drain() (suppression, bool) {
	p := b.pending
	b.pending = suppression{}
	return p, p.lines > 0
}

// summary is the audit line that tells of p, at now.
func (s *Session) summary(p suppression, now time.Time) Event {
	return Event{Proto: "suppressed", Suppressed: p.lines, Duration: now.Sub(p.since),
		Reason: fmt.Sprintf("%d audit lines of this sandbox not written (%d of them refusals, all enforced): past its budget of %d lines at once and %d a second",
			p.lines, p.refusals, int(s.budget.burst), int(s.budget.rate))}
}

// Stats counts what a session (Session.Stats) or every session of an
// Egress since it was made (Egress.Stats) refused, dropped and did not
// write, whether its audit line was written or not.
type Stats struct {
	// Refused: connections and UDP flows not relayed: refused by the
	// policy or a bound (TCP: reset; UDP: dropped), or their dial failed;
	// DNS-over-TCP connections refused or closed included.
	Refused uint64
	// DNSDropped: UDP DNS queries dropped unanswered, maxDNSInFlight
	// lookups of the sandbox being in flight (the client retries).
	DNSDropped uint64
	// AuditSuppressed: audit lines not written, past the session's audit
	// budget (auditBurst, auditRate).
	AuditSuppressed uint64
}

// counters are Stats as they are counted.
type counters struct {
	refused, dnsDropped, auditSuppressed atomic.Uint64
}

func (c *counters) stats() Stats {
	return Stats{Refused: c.refused.Load(), DNSDropped: c.dnsDropped.Load(), AuditSuppressed: c.auditSuppressed.Load()}
}

// Stats is what this session refused, dropped and did not write so far.
func (s *Session) Stats() Stats { return s.count.stats() }

// Stats is what every session of e refused, dropped and did not write
// since e was made.
func (e *Egress) Stats() Stats { return e.count.stats() }

// isRefusal says whether ev tells of a connection, flow or DNS-over-TCP
// connection that was refused.
func isRefusal(ev Event) bool {
	switch ev.Proto {
	case "tcp", "udp":
		return !ev.Allowed
	case "dns":
		return ev.Transport == "tcp" && ev.QType == "" && ev.RCode == ""
	}
	return false
}

// audit counts ev and writes it, within the session's audit budget.
func (s *Session) audit(ev Event) {
	ev.Sandbox, ev.Owner = s.sandbox, s.owner
	refusal := isRefusal(ev)
	if refusal {
		s.count.refused.Add(1)
		s.e.count.refused.Add(1)
	}
	if ev.Allowed && (ev.Proto == "tcp" || ev.Proto == "udp") {
		s.e.cfg.Audit(ev) // a relayed connection: never suppressed
		return
	}
	s.auditMu.Lock()
	defer s.auditMu.Unlock()
	now := s.e.now()
	if s.budget.take(now) {
		if p, ok := s.budget.drain(); ok {
			s.write(s.summary(p, now))
		}
		s.write(ev)
		return
	}
	s.count.auditSuppressed.Add(1)
	s.e.count.auditSuppressed.Add(1)
	if s.budget.suppress(now, refusal) {
		s.e.afterFunc(s.budget.refillIn(), s.tellSuppressed)
	}
}

// tellSuppressed writes the summary of the lines suppressed so far, if
// any: when the budget has refilled, and when the session closes.
func (s *Session) tellSuppressed() {
	s.auditMu.Lock()
	defer s.auditMu.Unlock()
	if p, ok := s.budget.drain(); ok {
		s.write(s.summary(p, s.e.now()))
	}
}

func (s *Session) write(ev Event) {
	ev.Sandbox, ev.Owner = s.sandbox, s.owner
	s.e.cfg.Audit(ev)
}
