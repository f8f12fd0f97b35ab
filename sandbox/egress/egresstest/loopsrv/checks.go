package loopsrv

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The checks below are the same on every egress path (the netstack's own
// namespace, a bwrap sandbox, a gVisor sandbox): each test wires them to
// its sandbox and its egress.Egress's records with a few functions, since
// this package may not import the egress path.

// Guest runs argv in the sandbox under test, whose /etc/resolv.conf names
// the egress resolver, and returns its output (stdout, and stderr where
// the runner merges them) and whether it exited 0.
type Guest func(argv ...string) (string, error)

// Storm is what ThousandConnections needs of the egress path under test:
// a sandbox whose policy allows AllowedName (mapped to 127.0.0.1), on an
// egress path whose max_conns is Bound.
type Storm struct {
	Guest Guest
	Bound int
	// Conns is the sandbox's connections and flows as its session counts
	// them now.
	Conns func() int
	// BoundRefusals is the number of audit events so far that refuse a
	// connection for the bound ("more than Bound connections at once"),
	// plus the session's lines its audit budget suppressed (counted, not
	// written: in the storm, all of them such refusals).
	BoundRefusals func() int
}

// AllowedName is the name the checks' policies must allow; the egress
// path under test maps it to 127.0.0.1 (egresstest.Allowed).
const AllowedName = "allowed.test"

// StormConns is how many connections ThousandConnections opens at once.
const StormConns = 1000

// stormDrain bounds the wait for the connections and goroutines of the
// storm to be gone once the server lets go.
const stormDrain = 30 * time.Second

// pyStorm resolves argv[1], then opens 1,000 non-blocking connections to
// it at port argv[2] at once, waits (at most 30 s) for each to be
// established or refused, and prints "ok refused other pending". The open
// files limit is raised to its hard limit, which must hold them.
const pyStorm = `
import errno, resource, socket, sys, time
n = 1000
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if hard != resource.RLIM_INFINITY and hard < n + 64:
    print("RLIMIT_NOFILE hard limit", hard, "is under", n + 64); sys.exit(6)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 4096, hard))
addr = socket.getaddrinfo(sys.argv[1], int(sys.argv[2]), socket.AF_INET, socket.SOCK_STREAM)[0][4]
socks, ok, refused, other = [], 0, 0, 0
for i in range(n):
    s = socket.socket(); s.setblocking(False)
    s.connect_ex(addr)
    socks.append(s)
deadline = time.time() + 30
pending = set(socks)
while pending and time.time() < deadline:
    time.sleep(0.2)
    for s in list(pending):
        e = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if e == 0:
            try:
                s.getpeername(); ok += 1; pending.discard(s)
            except OSError:
                pass
        else:
            if e == errno.ECONNREFUSED or e == errno.ECONNRESET: refused += 1
            else: other += 1
            pending.discard(s)
print(ok, refused, other, len(pending))
`

// ThousandConnections: 1,000 connections at once from one sandbox to an
// allowed name, on a loopback server that holds each open, are bounded:
// at most Bound are established (and reach the server), every other one
// is refused (a reset, audited as over the bound), none is left pending;
// once the server lets go the session counts none, the daemon's
// goroutines are back where they were, and a new connection works.
func ThousandConnections(t *testing.T, s Storm) {
	t.Helper()
	hold, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	release := make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	var accepted atomic.Int64
	go func() {
		for {
			c, err := hold.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() { <-release; c.Close() }()
		}
	}()
	_, port, _ := net.SplitHostPort(hold.Addr().String())
	srv := Start(t)
	goroutines := runtime.NumGoroutine()

	out, err := s.Guest("/usr/bin/python3", "-c", pyStorm, AllowedName, port)
	if err != nil {
		t.Fatalf("the storm: %v %q", err, out)
	}
	var ok, refused, other, pending int
	if _, err := fmt.Sscan(out, &ok, &refused, &other, &pending); err != nil {
		t.Fatalf("the storm's output %q: %v", out, err)
	}
	t.Logf("%d connections: %d established, %d refused, %d other errors, %d still pending; %d accepted by the server, %d refusals for the bound audited (written, or counted past the audit budget)",
		StormConns, ok, refused, other, pending, accepted.Load(), s.BoundRefusals())
	if ok == 0 || ok > s.Bound || ok+refused != StormConns {
		t.Errorf("not bounded: %d established, %d refused, %d other errors, %d pending; want 1 to %d established, the rest refused", ok, refused, other, pending, s.Bound)
	}
	if a := accepted.Load(); a > int64(s.Bound) {
		t.Errorf("%d connections reached the server, more than the bound %d", a, s.Bound)
	}
	// Every refusal but the few the guest's retries may add is one for
	// the bound, audited before the guest saw its reset.
	if n := s.BoundRefusals(); n < refused || n < StormConns/2 {
		t.Errorf("%d refusals for the bound audited, %d connections refused", n, refused)
	}

	close(release)
	released = true
	// The daemon is unhurt: the connections drain, nothing of them stays
	// behind, and a new one works.
	deadline := time.Now().Add(stormDrain)
	for s.Conns() != 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := s.Conns(); n != 0 {
		t.Fatalf("%d connections still counted %v after the server let go", n, stormDrain)
	}
	for time.Now().Before(deadline) && runtime.NumGoroutine() > goroutines+16 {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > goroutines+16 {
		t.Errorf("%d goroutines after the storm, %d before", n, goroutines)
	}
	if out, err := s.Guest("/usr/bin/python3", "-c", PyRaw, AllowedName, srv.RawPort); err != nil || out != "echo ping raw\n" {
		t.Errorf("a connection after the storm: %v %q", err, out)
	}
}

// RebindName is the name whose resolution RebindLookup moves.
const RebindName = "rebind.test"

// RebindLookup is an egress Config.Lookup (the host's resolver, never
// asked in tests) for a name that moves: the first IPv4 lookup of
// RebindName answers 127.0.0.1, every later one the metadata address and a
// private one. Every other lookup answers nothing.
func RebindLookup() func(ctx context.Context, network, name string) ([]netip.Addr, error) {
	var n atomic.Int64
	return func(_ context.Context, network, name string) ([]netip.Addr, error) {
		if name != RebindName || network != "ip4" {
			return nil, nil
		}
		if n.Add(1) == 1 {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		}
		return []netip.Addr{netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("10.0.0.5")}, nil
	}
}

// DNSLine is what Rebinding reads of a DNS audit event: the addresses
// handed out, and those withheld with their reasons (egress.Withheld's
// String).
type DNSLine struct {
	Answers, Withheld []string
}

// NewDNSLine is the DNSLine of an event's Answers and Withheld.
func NewDNSLine[A, W fmt.Stringer](answers []A, withheld []W) DNSLine {
	l := DNSLine{Answers: []string{}, Withheld: []string{}}
	for _, a := range answers {
		l.Answers = append(l.Answers, a.String())
	}
	for _, w := range withheld {
		l.Withheld = append(l.Withheld, w.String())
	}
	return l
}

// Rebind is what Rebinding needs of the egress path under test: a sandbox
// whose policy allows RebindName, on an egress path whose Lookup is
// RebindLookup and which permits loopback but no other private range.
type Rebind struct {
	Guest Guest
	// Dials are the daemon's dials so far.
	Dials func() []string
	// Lines are the audit events of the DNS answers for RebindName so far.
	Lines func() []DNSLine
}

// pyResolve resolves argv[1] (IPv4) once per remaining argument, printing
// each answer's addresses or its gaierror's number on a line.
const pyResolve = `
import socket, sys
for _ in sys.argv[2:]:
    try:
        print(" ".join(sorted({a[4][0] for a in socket.getaddrinfo(sys.argv[1], 80, socket.AF_INET, socket.SOCK_STREAM)})))
    except socket.gaierror as e:
        print("GAIERROR", e.errno)
`

// pyConnect connects to argv[1] at port argv[2] and prints "connected" or
// the error's name.
const pyConnect = `
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10).close(); print("connected")
except OSError as e:
    print(type(e).__name__)
`

// Rebinding: an allowed name whose resolution moves to forbidden addresses
// (the metadata endpoint, a private range) between two lookups hands out
// its first, permitted answer and then nothing: the second answer is empty
// (the name has no address for the sandbox), both forbidden addresses are
// withheld and audited with the reason, and the metadata address, dialled
// directly, is refused; the daemon dials nothing at all.
func Rebinding(t *testing.T, r Rebind) {
	t.Helper()
	out, err := r.Guest("/usr/bin/python3", "-c", pyResolve, RebindName, "first", "second")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if err != nil || len(lines) != 2 || lines[0] != "100.127.0.1" || !strings.HasPrefix(lines[1], "GAIERROR ") {
		t.Fatalf("two lookups of %s: %v %q; want 100.127.0.1, then no address", RebindName, err, out)
	}
	if out, _ := r.Guest("/usr/bin/python3", "-c", pyConnect, "169.254.169.254", "80"); strings.TrimSpace(out) != "ConnectionRefusedError" {
		t.Errorf("the metadata address, dialled after the name moved there: %q, want refused", out)
	}
	if d := r.Dials(); len(d) != 0 {
		t.Errorf("the daemon dialled %v", d)
	}
	var first, second bool
	var got []DNSLine
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got = r.Lines()
		first, second = false, false
		for _, l := range got {
			switch {
			case fmt.Sprint(l.Answers) == "[100.127.0.1]" && len(l.Withheld) == 0:
				first = true
			case len(l.Answers) == 0 && len(l.Withheld) == 2 &&
				strings.HasPrefix(l.Withheld[0], "169.254.169.254 (") && strings.Contains(l.Withheld[0], "link-local") && strings.Contains(l.Withheld[0], "never reachable") &&
				strings.HasPrefix(l.Withheld[1], "10.0.0.5 (") && strings.Contains(l.Withheld[1], "private") && strings.Contains(l.Withheld[1], "does not permit"):
				second = true
			}
		}
		if first && second || time.Now().After(deadline) {
			break
		}
	}
	if !first || !second {
		t.Errorf("the DNS audit of %s: %+v; want one answer of 100.127.0.1, and one of nothing with both forbidden addresses withheld", RebindName, got)
	}
}
