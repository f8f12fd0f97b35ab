package egress

import (
	"fmt"
	"io"
	"net/netip"
	"strings"
	"testing"
)

// bareSession is a Session's bookkeeping without a netstack: enough for
// decide, handOut and audit.
func bareSession(t *testing.T, cfg Config, names ...string) *Session {
	t.Helper()
	if cfg.OwnAddrs == nil {
		cfg.OwnAddrs = func() []netip.Addr { return nil }
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParsePolicy(names, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &Session{e: e, sandbox: "sb-test", owner: "owner-test", policy: p, closing: make(chan struct{}),
		handed: map[netip.Addr]map[string]struct{}{}, open: map[io.Closer]struct{}{},
		budget: newAuditBudget(auditBurst, auditRate)}
}

// tenAddr is the i-th address of 10.0.0.0/8 (private_allowed in these tests).
func tenAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
}

// TestForgottenAddressSaysSo hands out more addresses than a session
// remembers: a connection to an evicted one is refused saying it was
// forgotten and to resolve the name again (it said only "not ... handed
// out for an allowed name"), one never handed out is refused as before,
// one handed out again is allowed again, and past maxForgotten evictions
// the refusal says the address may have been forgotten. Every table
// stays at its bound.
func TestForgottenAddressSaysSo(t *testing.T) {
	s := bareSession(t, Config{PrivateAllowed: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, "*.example.test")
	const name = "a.example.test"
	for i := range maxHandedOut {
		s.handOut(tenAddr(i), name)
	}
	if d := s.decide(tenAddr(0), 443); !d.allowed {
		t.Fatalf("the oldest of %d addresses: %+v; want allowed", maxHandedOut, d)
	}
	s.handOut(tenAddr(maxHandedOut), name) // evicts tenAddr(0)
	const plain = "not in an allowed CIDR, nor handed out for an allowed name"
	d := s.decide(tenAddr(0), 443)
	if d.allowed || !strings.Contains(d.reason, "forgotten since it was handed out") || !strings.HasSuffix(d.reason, "resolve the name again") || !strings.Contains(d.reason, fmt.Sprint(maxHandedOut)) {
		t.Errorf("an evicted address: %+v; want refused as forgotten, with what to do", d)
	}
	never := netip.MustParseAddr("10.200.0.1")
	if d := s.decide(never, 443); d.allowed || d.reason != plain {
		t.Errorf("an address never handed out: %+v; want %q", d, plain)
	}
	s.handOut(tenAddr(0), name) // resolved again (evicts tenAddr(1))
	if d := s.decide(tenAddr(0), 443); !d.allowed {
		t.Errorf("an evicted address handed out again: %+v; want allowed", d)
	}
	if d := s.decide(tenAddr(1), 443); d.allowed || !strings.Contains(d.reason, "forgotten since") {
		t.Errorf("the next evicted: %+v", d)
	}

	// More evictions than maxForgotten remembers.
	base := 1 << 20
	for i := range maxHandedOut + maxForgotten + 10 {
		s.handOut(tenAddr(base+i), name)
	}
	if d := s.decide(tenAddr(1), 443); d.allowed || !strings.Contains(d.reason, "as far as the daemon remembers") || !strings.Contains(d.reason, "resolve the name again") {
		t.Errorf("an address evicted longer ago than the ring holds: %+v; want 'may have been forgotten'", d)
	}
	if d := s.decide(never, 443); d.allowed || !strings.Contains(d.reason, "as far as the daemon remembers") {
		t.Errorf("never handed out, after many evictions: %+v; want 'may have been forgotten'", d)
	}
	if d := s.decide(tenAddr(base+maxForgotten+9), 443); d.allowed || !strings.Contains(d.reason, "forgotten since") {
		t.Errorf("the newest evicted: %+v; want refused as forgotten", d)
	}
	if d := s.decide(tenAddr(base+maxForgotten+10), 443); !d.allowed {
		t.Errorf("the oldest remembered: %+v; want allowed", d)
	}
	if len(s.handed) != maxHandedOut || len(s.order) != maxHandedOut || len(s.forgot.ring) != maxForgotten || len(s.forgot.at) != maxForgotten {
		t.Errorf("tables: %d handed, %d in order, %d in the ring, %d forgotten; want %d, %d, %d, %d",
			len(s.handed), len(s.order), len(s.forgot.ring), len(s.forgot.at), maxHandedOut, maxHandedOut, maxForgotten, maxForgotten)
	}
}

// TestNamesPerAddressBounded: an address keeps its first maxNamesPerAddr
// names.
func TestNamesPerAddressBounded(t *testing.T) {
	s := bareSession(t, Config{PrivateAllowed: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, "*.example.test")
	a := tenAddr(7)
	for i := range maxNamesPerAddr + 10 {
		s.handOut(a, fmt.Sprintf("n%d.example.test", i))
	}
	names, _, _ := s.handedNames(a)
	if len(names) != maxNamesPerAddr {
		t.Fatalf("%d names remembered; want %d", len(names), maxNamesPerAddr)
	}
	for _, n := range names {
		var i int
		if _, err := fmt.Sscanf(n, "n%d.example.test", &i); err != nil || i >= maxNamesPerAddr {
			t.Errorf("remembered %q; want only the first %d names", n, maxNamesPerAddr)
		}
	}
}
