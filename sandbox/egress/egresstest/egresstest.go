// Package egresstest is what the backends' egress tests share: an
// egress.Egress whose resolver maps the test names to the host's loopback
// (which it permits as a private destination) and never asks the host's
// resolver, that dials nothing but loopback, and that records every dial
// and audit event; and loopback servers for the sandboxes to reach. No
// traffic leaves the machine.
package egresstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress/egresstest/loopsrv"
)

// The test names and the addresses a sandbox is handed for them (the
// egress path's stand-ins for 127.0.0.1 and 127.0.0.2).
const (
	Allowed          = "allowed.test" // 127.0.0.1
	Other            = "other.test"   // 127.0.0.2
	AllowedGuestAddr = "100.127.0.1"
	OtherGuestAddr   = "100.127.0.2"
)

// AwaitTimeout bounds Log.Await.
const AwaitTimeout = 10 * time.Second

// Missing says what this host lacks to make a sandbox's namespace and TUN
// device ("": nothing).
func Missing() string {
	if os.Geteuid() != 0 {
		return "egress needs root (network namespaces, TUN)"
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return fmt.Sprintf("egress needs /dev/net/tun: %v", err)
	}
	return ""
}

// Log records what an Egress made by New did.
type Log struct {
	mu     sync.Mutex
	dials  []string
	events []egress.Event
}

// New is the tests' Egress; any dial but loopback fails t. Each tweak
// changes its Config before it is made (a Lookup for names the hosts
// table lacks, MaxConns); the dialler and the audit stay the Log's.
func New(t testing.TB, tweak ...func(*egress.Config)) (*egress.Egress, *Log) {
	t.Helper()
	l := &Log{}
	cfg := egress.Config{
		Hosts: map[string][]netip.Addr{
			Allowed: {netip.MustParseAddr("127.0.0.1")},
			Other:   {netip.MustParseAddr("127.0.0.2")},
		},
		PrivateAllowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Lookup: func(context.Context, string, string) ([]netip.Addr, error) {
			return nil, errors.New("test: the host's resolver is never asked")
		},
	}
	for _, f := range tweak {
		f(&cfg)
	}
	cfg.Dial = dial(t, l)
	cfg.Audit = func(ev egress.Event) {
		l.mu.Lock()
		l.events = append(l.events, ev)
		l.mu.Unlock()
	}
	e, err := egress.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e, l
}

// dial records each dial in l and dials loopback only.
func dial(t testing.TB, l *Log) func(ctx context.Context, network, address string) (net.Conn, error) {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		l.mu.Lock()
		l.dials = append(l.dials, network+" "+address)
		l.mu.Unlock()
		if ap, err := netip.ParseAddrPort(address); err != nil || !ap.Addr().IsLoopback() {
			t.Errorf("the daemon was asked to dial %s %s, which is not loopback", network, address)
			return nil, errors.New("test: loopback only")
		}
		return (&net.Dialer{}).DialContext(ctx, network, address)
	}
}

// Dials are the dials so far ("tcp 127.0.0.1:PORT").
func (l *Log) Dials() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.dials...)
}

// Events are the audit events so far that pred accepts.
func (l *Log) Events(pred func(egress.Event) bool) []egress.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []egress.Event
	for _, ev := range l.events {
		if pred(ev) {
			out = append(out, ev)
		}
	}
	return out
}

// Await is Events once at least n match, or after AwaitTimeout: a
// connection's event is written when its relay ends, which can be a moment
// after the guest's program has exited.
func (l *Log) Await(pred func(egress.Event) bool, n int) []egress.Event {
	deadline := time.Now().Add(AwaitTimeout)
	for {
		evs := l.Events(pred)
		if len(evs) >= n || time.Now().After(deadline) {
			return evs
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// DNSLines are the audit events of the DNS answers for name so far, as
// loopsrv's checks read them.
func (l *Log) DNSLines(name string) []loopsrv.DNSLine {
	var out []loopsrv.DNSLine
	for _, ev := range l.Events(func(ev egress.Event) bool { return ev.Proto == "dns" && ev.Name == name && ev.RCode != "" }) {
		out = append(out, loopsrv.NewDNSLine(ev.Answers, ev.Withheld))
	}
	return out
}

// Servers are loopsrv's loopback servers for the sandboxes to reach.
type Servers = loopsrv.Servers

// StartServers starts them (loopsrv.Start).
func StartServers(t testing.TB) *Servers { return loopsrv.Start(t) }
