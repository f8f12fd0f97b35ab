package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// TestAuditBudgetBucket drives the token bucket with a clock of its own.
func TestAuditBudgetBucket(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	b := newAuditBudget(3, 2) // 3 at once, then 2 a second
	for i := range 3 {
		if !b.take(t0) {
			t.Fatalf("take %d of the burst refused", i+1)
		}
	}
	if b.take(t0) {
		t.Fatal("a 4th line at once was let through")
	}
	if got := b.refillIn(); got != 500*time.Millisecond {
		t.Errorf("refillIn = %v; want 500ms (a line's worth at 2 a second)", got)
	}
	if b.take(t0.Add(499 * time.Millisecond)) {
		t.Error("let through 499ms later")
	}
	if !b.take(t0.Add(500 * time.Millisecond)) {
		t.Error("refused 500ms later")
	}
	if b.take(t0.Add(500 * time.Millisecond)) {
		t.Error("two lines for one refill")
	}
	// A clock that steps back refills nothing.
	if b.take(t0) {
		t.Error("let through after the clock stepped back")
	}
	// A long quiet refills to the burst, no more.
	later := t0.Add(time.Hour)
	for i := range 3 {
		if !b.take(later) {
			t.Fatalf("after an hour, take %d refused", i+1)
		}
	}
	if b.take(later) {
		t.Error("an hour's quiet gave more than the burst")
	}
	// Suppressed lines: the first of a run says so, drain tells them once.
	if !b.suppress(later, true) || b.suppress(later, false) || b.suppress(later.Add(time.Second), true) {
		t.Error("suppress: only the first of a run is first")
	}
	p, ok := b.drain()
	if !ok || p.lines != 3 || p.refusals != 2 || !p.since.Equal(later) {
		t.Errorf("drain = %+v, %v; want 3 lines, 2 refusals, since the first", p, ok)
	}
	if _, ok := b.drain(); ok {
		t.Error("drained twice")
	}
	if !b.suppress(later, false) {
		t.Error("after a drain, a new run begins")
	}
}

// fakeClock is a session's audit clock, moved by hand, and the summaries
// it was asked to schedule (run by hand).
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []time.Duration
	funcs  []func()
}

func (c *fakeClock) install(e *Egress) {
	e.now = func() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
	e.afterFunc = func(d time.Duration, f func()) *time.Timer {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.timers, c.funcs = append(c.timers, d), append(c.funcs, f)
		return nil
	}
}

func (c *fakeClock) advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// TestAuditBudgetSession floods a session's audit with refusals on a
// clock that does not move: auditBurst lines are written, the rest
// counted; every refusal is counted whatever was written; a relayed
// connection's line is written all the same; the summary comes once, when
// the budget refills, saying how many; after a refill one more line goes
// through.
func TestAuditBudgetSession(t *testing.T) {
	var mu sync.Mutex
	var lines []Event
	s := bareSession(t, Config{Audit: func(ev Event) { mu.Lock(); lines = append(lines, ev); mu.Unlock() }})
	clock := &fakeClock{now: time.Unix(1_000_000, 0)}
	clock.install(s.e)
	written := func(proto string) (n int) {
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range lines {
			if proto == "" || ev.Proto == proto {
				n++
			}
		}
		return n
	}
	const flood = auditBurst + 50
	refused := Event{Proto: "tcp", Reason: "not in an allowed CIDR, nor handed out for an allowed name"}
	for range flood {
		s.audit(refused)
	}
	s.audit(Event{Proto: "tcp", Allowed: true, Reason: "allowed CIDR"})
	s.audit(Event{Proto: "dns", Transport: "udp", QType: "A", RCode: "NXDOMAIN"}) // suppressed too
	if n := written("tcp"); n != auditBurst+1 {
		t.Errorf("%d tcp lines written; want the burst (%d) and the relayed one", n, auditBurst)
	}
	want := Stats{Refused: flood, AuditSuppressed: flood - auditBurst + 1}
	if got := s.Stats(); got != want {
		t.Errorf("session stats %+v; want %+v", got, want)
	}
	if got := s.e.Stats(); got != want {
		t.Errorf("egress stats %+v; want %+v", got, want)
	}
	if len(clock.timers) != 1 || clock.timers[0] != time.Second/auditRate {
		t.Fatalf("summaries scheduled: %v; want one, a line's worth (%v) later", clock.timers, time.Second/auditRate)
	}
	if written("suppressed") != 0 {
		t.Fatal("a summary before the budget refilled")
	}
	clock.advance(clock.timers[0])
	clock.funcs[0]()
	clock.funcs[0]() // a second call (Close after the timer) tells nothing more
	mu.Lock()
	var sums []Event
	for _, ev := range lines {
		if ev.Proto == "suppressed" {
			sums = append(sums, ev)
		}
	}
	mu.Unlock()
	if len(sums) != 1 || sums[0].Suppressed != flood-auditBurst+1 || sums[0].Duration != time.Second/auditRate ||
		sums[0].Sandbox != "sb-test" || !strings.HasPrefix(sums[0].Reason, "51 audit lines of this sandbox not written (50 of them refusals, all enforced): past its budget of 200 lines at once and 20 a second") {
		t.Fatalf("summaries: %+v; want one of %d lines", sums, flood-auditBurst+1)
	}
	// The refilled line's worth is spent on the next line, with no summary
	// (told already); the one after is suppressed and schedules another.
	before := written("")
	s.audit(refused)
	s.audit(refused)
	if n := written(""); n != before+1 {
		t.Errorf("%d lines after a refill; want 1", n-before)
	}
	if len(clock.timers) != 2 {
		t.Errorf("%d summaries scheduled; want a second for the new run", len(clock.timers))
	}
	// The session's close tells what is left.
	s.tellSuppressed()
	if n := written("suppressed"); n != 2 {
		t.Errorf("%d summaries after the close; want 2", n)
	}
}

// TestAuditBudgetEnforcesEveryRefusal floods the netstack with more
// refused connections than the audit budget writes, on an audit clock
// that does not move: every one is reset (the guest sees each refused)
// and none dialled, auditBurst are written, the rest counted, and the
// session's close writes the summary that tells them.
func TestAuditBudgetEnforcesEveryRefusal(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_000_000, 0)}
	h := newHarness(t, harnessOpts{names: []string{"allowed.test"}, clock: clock})
	const flood = auditBurst + 60
	out, err := h.run("/usr/bin/python3", "-c", `
import socket, sys
refused = other = 0
for i in range(int(sys.argv[1])):
    s = socket.socket(); s.settimeout(10)
    try:
        s.connect(("192.0.2.1", 80)); other += 1
    except ConnectionRefusedError:
        refused += 1
    except OSError:
        other += 1
    s.close()
print(refused, other)
`, fmt.Sprint(flood))
	if err != nil {
		t.Fatalf("%v %q", err, out)
	}
	var refused, other int
	if _, err := fmt.Sscan(out, &refused, &other); err != nil || refused != flood || other != 0 {
		t.Fatalf("guest: %q; want all %d refused", out, flood)
	}
	if n := h.dials.Load(); n != 0 {
		t.Errorf("%d dials; want none", n)
	}
	to := func(ev Event) bool { return ev.Proto == "tcp" && ev.Addr == netip.MustParseAddr("192.0.2.1") }
	st := h.sess.Stats()
	if n := len(h.eventsFor(to)); n != auditBurst || st.Refused != flood || st.AuditSuppressed != flood-auditBurst {
		t.Errorf("%d lines written, stats %+v; want %d written, %d refused, %d suppressed", n, st, auditBurst, flood, flood-auditBurst)
	}
	if len(clock.timers) != 1 {
		t.Errorf("%d summaries scheduled; want 1", len(clock.timers))
	}
	if err := h.sess.Close(); err != nil {
		t.Fatal(err)
	}
	sums := h.eventsFor(func(ev Event) bool { return ev.Proto == "suppressed" })
	if len(sums) != 1 || sums[0].Suppressed != flood-auditBurst || sums[0].Sandbox != "sb-test" ||
		!strings.HasPrefix(sums[0].Reason, fmt.Sprintf("%d audit lines of this sandbox not written (%d of them refusals", flood-auditBurst, flood-auditBurst)) {
		t.Errorf("summaries at close: %+v; want one of %d lines", sums, flood-auditBurst)
	}
}

// TestDNSDroppedInFlightAudited holds maxDNSInFlight lookups in flight
// (a lookup that waits for the test), then sends one more query over UDP:
// it is dropped unanswered, as before, but now counted and audited with
// its question; once the lookups end, the client's retry is answered.
func TestDNSDroppedInFlightAudited(t *testing.T) {
	var entered atomic.Int64
	release := make(chan struct{})
	h := newHarness(t, harnessOpts{names: []string{"*.slow.test"}, lookup: func(ctx context.Context, network, name string) ([]netip.Addr, error) {
		entered.Add(1)
		<-release // not ctx: the test holds it, whatever the lookup limit
		return []netip.Addr{lo1}, nil
	}})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	var conn net.Conn
	if err := h.ns.Do(func() error {
		var err error
		conn, err = net.Dial("udp", netip.AddrPortFrom(ResolverAddr4, 53).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for i := range maxDNSInFlight {
		if _, err := conn.Write(query(t, uint16(i+1), fmt.Sprintf("n%d.slow.test", i), dnsmessage.TypeA, 0)); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); entered.Load() < maxDNSInFlight; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d lookups in flight; want %d", entered.Load(), maxDNSInFlight)
		}
	}
	extra := query(t, 100, "extra.slow.test", dnsmessage.TypeAAAA, 0)
	if _, err := conn.Write(extra); err != nil {
		t.Fatal(err)
	}
	dropped := func(ev Event) bool { return ev.Proto == "dns" && strings.HasPrefix(ev.Reason, "dropped unanswered") }
	evs := h.awaitEvents(dropped, 1)
	if len(evs) != 1 {
		t.Fatalf("%d lines of a dropped query; want 1", len(evs))
	}
	ev := evs[0]
	want := fmt.Sprintf("dropped unanswered: %d lookups of this sandbox in flight already (the client retries)", maxDNSInFlight)
	if ev.Name != "extra.slow.test" || ev.QType != "AAAA" || ev.RCode != "" || ev.Transport != "udp" || ev.Addr != ResolverAddr4 || ev.Port != 53 || ev.Allowed || ev.Reason != want {
		t.Errorf("the dropped query's line: %+v; want extra.slow.test AAAA over UDP to %s:53, no rcode, %q", ev, ResolverAddr4, want)
	}
	if got := h.sess.Stats().DNSDropped; got != 1 {
		t.Errorf("session DNSDropped = %d; want 1", got)
	}
	if got := h.e.Stats().DNSDropped; got != 1 {
		t.Errorf("egress DNSDropped = %d; want 1", got)
	}
	if entered.Load() != maxDNSInFlight {
		t.Errorf("%d lookups; the dropped query must not have been looked up", entered.Load())
	}
	// The lookups end: their 16 answers come, and the retry is answered.
	free()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4096)
	for i := range maxDNSInFlight {
		if _, err := conn.Read(buf); err != nil {
			t.Fatalf("answer %d: %v", i+1, err)
		}
	}
	if _, err := conn.Write(extra); err != nil {
		t.Fatal(err)
	}
	n, err := conn.Read(buf)
	var m dnsmessage.Message
	if err != nil || m.Unpack(buf[:n]) != nil || m.ID != 100 {
		t.Fatalf("the retry: %v, %+v", err, m.Header)
	}
}
