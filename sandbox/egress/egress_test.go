package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress/egresstest/loopsrv"
)

// needRoot skips without root, /dev/net/tun or bwrap; under CI=true it
// fails instead.
func needRoot(t *testing.T) {
	t.Helper()
	why := rootOK()
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true: %s", why)
	}
	t.Skip(why)
}

var loopbackOnly = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// rootOK says what is missing to make namespaces and TUN devices ("": nothing).
func rootOK() string {
	why := ""
	switch {
	case os.Geteuid() != 0:
		why = "needs root (network namespaces, TUN)"
	case func() bool { _, err := os.Stat("/dev/net/tun"); return err != nil }():
		why = "needs /dev/net/tun"
	case func() bool { _, err := exec.LookPath("bwrap"); return err != nil }():
		why = "needs bwrap"
	}
	return why
}

// harness is one sandbox-like network namespace behind a Session, with
// loopback servers for it to reach.
type harness struct {
	t       *testing.T
	ns      *Netns
	e       *Egress
	sess    *Session
	dir     string
	dials   atomic.Int64
	mu      sync.Mutex
	dialed  []string
	events  []Event
	httpURL string // http://allowed.test:PORT
	tlsPort string
	rawPort string
	port    string // the HTTP server's port
}

func (h *harness) audit(ev Event) {
	h.mu.Lock()
	h.events = append(h.events, ev)
	h.mu.Unlock()
}

func (h *harness) eventsFor(pred func(Event) bool) []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Event
	for _, ev := range h.events {
		if pred(ev) {
			out = append(out, ev)
		}
	}
	return out
}

// awaitEvents is eventsFor once at least n events match, or after 10s: a
// connection's event is written when its relay ends, which can be a moment
// after the guest's program has exited.
func (h *harness) awaitEvents(pred func(Event) bool, n int) []Event {
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs := h.eventsFor(pred)
		if len(evs) >= n || time.Now().After(deadline) {
			return evs
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type harnessOpts struct {
	names, cidrs []string
	hosts        map[string][]netip.Addr
	lookup       func(ctx context.Context, network, name string) ([]netip.Addr, error)
	maxConns     int
	clock        *fakeClock // the audit budget's, when set
}

var lo1 = netip.MustParseAddr("127.0.0.1")

func newHarness(t *testing.T, o harnessOpts) *harness {
	needRoot(t)
	h := &harness{t: t, dir: t.TempDir()}
	hosts := map[string][]netip.Addr{
		"allowed.test":     {lo1},
		"other.test":       {netip.MustParseAddr("127.0.0.2")},
		"api.wild.test":    {lo1},
		"wild.test":        {lo1},
		"metadata.test":    {netip.MustParseAddr("169.254.169.254")},
		"ten.test":         {netip.MustParseAddr("10.1.2.3")},
		"sixloopback.test": {netip.IPv6Loopback()},
	}
	for k, v := range o.hosts {
		hosts[k] = v
	}
	lookup := o.lookup
	if lookup == nil {
		lookup = func(context.Context, string, string) ([]netip.Addr, error) {
			return nil, errors.New("test: the host's resolver is never asked")
		}
	}
	var err error
	h.e, err = New(Config{
		Hosts:          hosts,
		PrivateAllowed: loopbackOnly,
		MaxConns:       o.maxConns,
		Lookup:         lookup,
		Audit:          h.audit,
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			h.dials.Add(1)
			h.mu.Lock()
			h.dialed = append(h.dialed, network+" "+address)
			h.mu.Unlock()
			ap, err := netip.ParseAddrPort(address)
			if err != nil || !ap.Addr().IsLoopback() {
				t.Errorf("the daemon was asked to dial %s %s, which is not loopback", network, address)
				return nil, errors.New("test: only loopback is ever dialled")
			}
			var d net.Dialer
			return d.DialContext(ctx, network, address)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if o.clock != nil {
		o.clock.install(h.e)
	}
	p, err := ParsePolicy(o.names, o.cidrs)
	if err != nil {
		t.Fatal(err)
	}
	h.ns, err = NewNetns()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.ns.NS.Close() })
	h.sess, err = h.e.Serve(h.ns.TUN, "sb-test", "owner-test", p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.sess.Close() })
	if err := os.WriteFile(filepath.Join(h.dir, "resolv.conf"), []byte(ResolvConf()), 0o644); err != nil {
		t.Fatal(err)
	}
	// Servers on the host's loopback.
	srv := loopsrv.Start(t)
	h.port, h.tlsPort, h.rawPort = srv.HTTPPort, srv.TLSPort, srv.RawPort
	h.httpURL = "http://allowed.test:" + h.port + "/"
	return h
}

// run runs argv in the namespace, with the egress resolver in
// /etc/resolv.conf and no proxy variables, and returns its output.
func (h *harness) run(argv ...string) (string, error) {
	h.t.Helper()
	var out []byte
	var runErr error
	err := h.ns.Do(func() error {
		args := append([]string{"--dev-bind", "/", "/", "--ro-bind", filepath.Join(h.dir, "resolv.conf"), "/etc/resolv.conf", "--"}, argv...)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bwrap", args...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8"}
		out, runErr = cmd.CombinedOutput()
		return nil
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return string(out), runErr
}

const pyFetch = `
import ssl, sys, urllib.request
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=20, context=ctx).read().decode())
except Exception as e:
    print("ERROR", type(e).__name__, e); sys.exit(3)
`

func TestAllowedNameHTTPHTTPSAndRaw(t *testing.T) {
	h := newHarness(t, harnessOpts{names: []string{"allowed.test"}})
	out, err := h.run("curl", "-sS", "--max-time", "20", h.httpURL)
	if err != nil || out != "hello allowed.test:"+h.port {
		t.Fatalf("curl http: %v %q", err, out)
	}
	out, err = h.run("curl", "-ksS", "--max-time", "20", "https://allowed.test:"+h.tlsPort+"/")
	if err != nil || out != "secure allowed.test:"+h.tlsPort+" allowed.test" {
		t.Fatalf("curl https: %v %q", err, out)
	}
	for _, u := range []string{h.httpURL, "https://allowed.test:" + h.tlsPort + "/"} {
		out, err = h.run("/usr/bin/python3", "-c", pyFetch, u)
		if err != nil || !strings.Contains(out, "allowed.test:") {
			t.Fatalf("python urllib %s: %v %q", u, err, out)
		}
	}
	out, err = h.run("/usr/bin/python3", "-c", loopsrv.PyRaw, "allowed.test", h.rawPort)
	if err != nil || out != "echo ping raw\n" {
		t.Fatalf("raw socket: %v %q", err, out)
	}
	// The audit trail has the connections, allowed, with bytes.
	evs := h.awaitEvents(func(ev Event) bool { return ev.Proto == "tcp" && ev.Allowed }, 5)
	if len(evs) < 5 {
		t.Fatalf("audit: %d allowed connections, want 5: %+v", len(evs), evs)
	}
	for _, ev := range evs {
		if ev.Sandbox != "sb-test" || ev.Owner != "owner-test" || ev.Name != "allowed.test" || ev.BytesIn == 0 || ev.BytesOut == 0 || ev.Addr != lo1 {
			t.Fatalf("audit event %+v", ev)
		}
	}
}

func TestSNIAndHostMustMatch(t *testing.T) {
	h := newHarness(t, harnessOpts{names: []string{"allowed.test"}, hosts: map[string][]netip.Addr{"other.test": {lo1}}})
	// allowed.test's address is handed out; asking it for other.test (a
	// shared address) is refused.
	if out, err := h.run("curl", "-sS", "--max-time", "20", h.httpURL); err != nil {
		t.Fatalf("curl: %v %q", err, out)
	}
	before := h.dials.Load()
	out, err := h.run("curl", "-ksS", "--max-time", "20", "--resolve", "other.test:"+h.tlsPort+":100.127.0.1", "https://other.test:"+h.tlsPort+"/")
	if err == nil {
		t.Fatalf("SNI other.test was let through: %q", out)
	}
	out, err = h.run("curl", "-sS", "--max-time", "20", "-H", "Host: other.test", h.httpURL)
	if err == nil {
		t.Fatalf("Host other.test was let through: %q", out)
	}
	if d := h.dials.Load() - before; d != 0 {
		t.Fatalf("%d dials for refused names", d)
	}
	if evs := h.eventsFor(func(ev Event) bool { return ev.Name == "other.test" && !ev.Allowed && ev.Proto == "tcp" }); len(evs) != 2 {
		t.Fatalf("audit of refused names: %+v", evs)
	}
}

// dnsQuery asks the egress resolver from inside the namespace.
func (h *harness) dnsQuery(name string, typ dnsmessage.Type) dnsmessage.Message {
	h.t.Helper()
	return h.dnsQueryTo(ResolverAddr4, name, typ)
}

// dnsQueryTo asks the egress resolver at resolver (ResolverAddr4 or
// ResolverAddr6) over UDP from inside the namespace.
func (h *harness) dnsQueryTo(resolver netip.Addr, name string, typ dnsmessage.Type) dnsmessage.Message {
	h.t.Helper()
	var conn *net.UDPConn
	if err := h.ns.Do(func() error {
		var err error
		conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(resolver, 53)))
		return err
	}); err != nil {
		h.t.Fatal(err)
	}
	defer conn.Close()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name + "."), Type: typ, Class: dnsmessage.ClassINET})
	q, _ := b.Finish()
	// As a resolver does, the query is sent again when no answer comes:
	// a datagram may be lost on a loaded host (the test then still sees
	// one answer, and one audit line, for the query that arrived).
	buf := make([]byte, 2048)
	var n int
	var err error
	for try := 1; ; try++ {
		conn.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := conn.Write(q); err != nil {
			h.t.Fatal(err)
		}
		if n, err = conn.Read(buf); err == nil {
			break
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || try == 4 {
			h.t.Fatal(err)
		}
	}
	var m dnsmessage.Message
	if err := m.Unpack(buf[:n]); err != nil {
		h.t.Fatal(err)
	}
	return m
}

func answers(m dnsmessage.Message) []netip.Addr {
	var out []netip.Addr
	for _, a := range m.Answers {
		switch r := a.Body.(type) {
		case *dnsmessage.AResource:
			out = append(out, netip.AddrFrom4(r.A))
		case *dnsmessage.AAAAResource:
			out = append(out, netip.AddrFrom16(r.AAAA))
		}
	}
	return out
}

func TestNameNotOnTheList(t *testing.T) {
	h := newHarness(t, harnessOpts{names: []string{"allowed.test", "*.wild.test"}})
	for _, typ := range []dnsmessage.Type{dnsmessage.TypeA, dnsmessage.TypeAAAA} {
		if m := h.dnsQuery("other.test", typ); m.RCode != dnsmessage.RCodeNameError || len(m.Answers) != 0 {
			t.Fatalf("other.test %v: %v %v", typ, m.RCode, m.Answers)
		}
		// *.wild.test is subdomains only.
		if m := h.dnsQuery("wild.test", typ); m.RCode != dnsmessage.RCodeNameError {
			t.Fatalf("wild.test %v: %v", typ, m.RCode)
		}
	}
	if m := h.dnsQuery("api.wild.test", dnsmessage.TypeA); m.RCode != dnsmessage.RCodeSuccess || fmt.Sprint(answers(m)) != "[100.127.0.1]" {
		t.Fatalf("api.wild.test: %v %v", m.RCode, answers(m))
	}
	if m := h.dnsQuery("allowed.test", dnsmessage.TypeAAAA); m.RCode != dnsmessage.RCodeSuccess || len(m.Answers) != 0 {
		t.Fatalf("allowed.test AAAA (it has none): %v %v", m.RCode, m.Answers)
	}
	out, err := h.run("/usr/bin/python3", "-c", loopsrv.PyRaw, "other.test", h.rawPort)
	if err == nil || !strings.Contains(out, "GAIERROR") {
		t.Fatalf("other.test resolved: %v %q", err, out)
	}
	// Its address, dialled directly: 127.0.0.2 stands in as 100.127.0.2,
	// never handed out: refused, no dial.
	out, err = h.run("curl", "-sS", "--max-time", "20", "http://100.127.0.2:"+h.port+"/")
	if err == nil {
		t.Fatalf("direct connect let through: %q", out)
	}
	if h.dials.Load() != 0 {
		t.Fatalf("dialled: %v", h.dialed)
	}
	if evs := h.eventsFor(func(ev Event) bool {
		return ev.Proto == "tcp" && !ev.Allowed && ev.Addr == netip.MustParseAddr("127.0.0.2")
	}); len(evs) != 1 || !strings.Contains(evs[0].Reason, "not in an allowed CIDR") {
		t.Fatalf("audit: %+v", evs)
	}
}

func TestCIDREntry(t *testing.T) {
	h := newHarness(t, harnessOpts{cidrs: []string{"127.0.0.1/32"}})
	out, err := h.run("curl", "-sS", "--max-time", "20", "http://100.127.0.1:"+h.port+"/")
	if err != nil || out != "hello 100.127.0.1:"+h.port {
		t.Fatalf("CIDR: %v %q", err, out)
	}
	// Outside it: refused.
	if out, err := h.run("curl", "-sS", "--max-time", "20", "http://100.127.0.2:"+h.port+"/"); err == nil {
		t.Fatalf("outside the CIDR: %q", out)
	}
	// No names: allowed.test does not resolve.
	if m := h.dnsQuery("allowed.test", dnsmessage.TypeA); m.RCode != dnsmessage.RCodeNameError {
		t.Fatalf("allowed.test without names: %v", m.RCode)
	}
}

// TestRebindingToForbiddenAddress: loopsrv.Rebinding, in a namespace of
// the test's own.
func TestRebindingToForbiddenAddress(t *testing.T) {
	h := newHarness(t, harnessOpts{names: []string{loopsrv.RebindName}, lookup: loopsrv.RebindLookup()})
	loopsrv.Rebinding(t, loopsrv.Rebind{
		Guest: h.run,
		Dials: func() []string { h.mu.Lock(); defer h.mu.Unlock(); return append([]string(nil), h.dialed...) },
		Lines: func() []loopsrv.DNSLine {
			return dnsLines(h.eventsFor(func(Event) bool { return true }), loopsrv.RebindName)
		},
	})
}

// dnsLines are the DNS answers for name among evs, as loopsrv's checks
// read them.
func dnsLines(evs []Event, name string) []loopsrv.DNSLine {
	var out []loopsrv.DNSLine
	for _, ev := range evs {
		if ev.Proto == "dns" && ev.Name == name && ev.RCode != "" {
			out = append(out, loopsrv.NewDNSLine(ev.Answers, ev.Withheld))
		}
	}
	return out
}

func TestMetadataAddressNeverDialled(t *testing.T) {
	// Even a CIDR entry naming it, and a name resolving to it, open nothing.
	h := newHarness(t, harnessOpts{names: []string{"metadata.test"}, cidrs: []string{"169.254.0.0/16", "fe80::/10"}})
	if m := h.dnsQuery("metadata.test", dnsmessage.TypeA); len(m.Answers) != 0 {
		t.Fatalf("metadata.test handed out %v", answers(m))
	}
	for _, u := range []string{"http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/"} {
		if out, err := h.run("curl", "-sS", "--max-time", "20", u); err == nil {
			t.Fatalf("%s reached: %q", u, out)
		}
	}
	if h.dials.Load() != 0 {
		t.Fatalf("dialled: %v", h.dialed)
	}
	evs := h.eventsFor(func(ev Event) bool { return ev.Proto == "tcp" })
	if len(evs) != 2 || evs[0].Allowed || !strings.Contains(evs[0].Reason, "never reachable") {
		t.Fatalf("audit: %+v", evs)
	}
	// And an operator cannot permit link-local.
	if _, err := New(Config{PrivateAllowed: []netip.Prefix{netip.MustParsePrefix("169.254.169.254/32")}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("operator permitted link-local: %v", err)
	}
}

func TestUDPOnlyToResolverOrCIDR(t *testing.T) {
	h := newHarness(t, harnessOpts{names: []string{"allowed.test"}})
	udp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(lo1, 0)))
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	port := udp.LocalAddr().(*net.UDPAddr).Port
	// allowed.test resolves (its address is handed out), but UDP to it is
	// not DNS and not to an allowed CIDR: dropped.
	const py = `
import socket, sys
a = socket.getaddrinfo("allowed.test", int(sys.argv[1]), socket.AF_INET, socket.SOCK_DGRAM)[0][4]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b"datagram", a); print("sent", a[0])
`
	out, err := h.run("/usr/bin/python3", "-c", py, fmt.Sprint(port))
	if err != nil || !strings.Contains(out, "sent 100.127.0.1") {
		t.Fatalf("send: %v %q", err, out)
	}
	udp.SetReadDeadline(time.Now().Add(time.Second))
	if n, _, err := udp.ReadFrom(make([]byte, 64)); err == nil {
		t.Fatalf("a datagram of %d bytes arrived", n)
	}
	if evs := h.awaitEvents(func(ev Event) bool { return ev.Proto == "udp" }, 1); len(evs) != 1 || evs[0].Allowed || evs[0].Port != uint16(port) {
		t.Fatalf("audit: %+v", evs)
	}

	// With a CIDR entry it goes through, both ways.
	h2 := newHarness(t, harnessOpts{cidrs: []string{"127.0.0.1/32"}})
	go func() {
		buf := make([]byte, 64)
		udp.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, from, err := udp.ReadFrom(buf)
		if err == nil {
			udp.WriteTo(append([]byte("back "), buf[:n]...), from)
		}
	}()
	const py2 = `
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(20)
s.sendto(b"datagram", ("100.127.0.1", int(sys.argv[1]))); print(s.recv(64).decode())
`
	out, err = h2.run("/usr/bin/python3", "-c", py2, fmt.Sprint(port))
	if err != nil || strings.TrimSpace(out) != "back datagram" {
		t.Fatalf("UDP to an allowed CIDR: %v %q", err, out)
	}
}

func TestICMPRefused(t *testing.T) {
	h := newHarness(t, harnessOpts{cidrs: []string{"127.0.0.1/32"}})
	if _, err := exec.LookPath("ping"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true: ping (iputils-ping, in scripts/test.sh's packages) is missing")
		}
		t.Skip("no ping")
	}
	// The namespace's only route is the TUN device: the echo request goes
	// to the netstack, which drops it.
	if out, err := h.run("ping", "-c", "1", "-W", "1", "100.127.0.1"); err == nil {
		t.Fatalf("ping answered: %q", out)
	}
}

// TestThousandConnectionsBounded: loopsrv.ThousandConnections, in a
// namespace of the test's own.
func TestThousandConnectionsBounded(t *testing.T) {
	const bound = 64
	h := newHarness(t, harnessOpts{names: []string{loopsrv.AllowedName}, maxConns: bound})
	loopsrv.ThousandConnections(t, loopsrv.Storm{
		Guest: h.run,
		Bound: bound,
		Conns: h.sess.Conns,
		BoundRefusals: func() int {
			return len(h.eventsFor(func(ev Event) bool {
				return strings.Contains(ev.Reason, fmt.Sprintf("more than %d connections", bound))
			})) + int(h.sess.Stats().AuditSuppressed) // the storm's lines past the audit budget
		},
	})
}

func TestIPv6AllowedNameAndCIDR(t *testing.T) {
	h := newHarness(t, harnessOpts{names: []string{"sixloopback.test"}})
	l, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "six ", r.Host) })}
	go srv.Serve(l)
	defer srv.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	if m := h.dnsQuery("sixloopback.test", dnsmessage.TypeAAAA); fmt.Sprint(answers(m)) != "[fd00:5b5b::7f00:1]" {
		t.Fatalf("AAAA: %v %v", m.RCode, answers(m))
	}
	out, err := h.run("curl", "-6", "-sS", "--max-time", "20", "http://sixloopback.test:"+port+"/")
	if err != nil || out != "six sixloopback.test:"+port {
		t.Fatalf("curl -6: %v %q", err, out)
	}
	if m := h.dnsQuery("other.test", dnsmessage.TypeAAAA); m.RCode != dnsmessage.RCodeNameError {
		t.Fatalf("other.test AAAA: %v", m.RCode)
	}
	h6 := newHarness(t, harnessOpts{cidrs: []string{"::1/128"}})
	out, err = h6.run("curl", "-sS", "--max-time", "20", "http://[fd00:5b5b::7f00:1]:"+port+"/")
	if err != nil || !strings.HasPrefix(out, "six ") {
		t.Fatalf("IPv6 CIDR: %v %q", err, out)
	}
}

// TestServerFirstProtocol: a client that sends nothing (SSH, SMTP: the
// server speaks first) to a name-allowed address goes through once the
// peek gives up waiting for a name. The netstack's read deadline has an
// error of its own, not os.ErrDeadlineExceeded; mistaking it for a failure
// reset every such connection.
func TestServerFirstProtocol(t *testing.T) {
	h := newHarness(t, harnessOpts{names: []string{"allowed.test"}})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprint(c, "220 greeting\n")
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	const py = `
import socket, sys
a = socket.getaddrinfo("allowed.test", int(sys.argv[1]), socket.AF_INET, socket.SOCK_STREAM)[0][4]
s = socket.create_connection(a, timeout=20)
print(s.makefile().readline(), end="")
`
	out, err := h.run("/usr/bin/python3", "-c", py, port)
	if err != nil || out != "220 greeting\n" {
		t.Fatalf("server-first: %v %q", err, out)
	}
	if evs := h.awaitEvents(func(ev Event) bool { return ev.Proto == "tcp" && ev.Allowed && ev.Name == "allowed.test" }, 1); len(evs) != 1 {
		t.Fatalf("audit: %+v", h.eventsFor(func(Event) bool { return true }))
	}
}

// TestCloseIsBounded: a session whose goroutines do not stop is left
// behind after closeWait, reported, rather than holding Close (and so a
// sandbox's destroy) forever.
func TestCloseIsBounded(t *testing.T) {
	needRoot(t)
	old := closeWait
	closeWait = 200 * time.Millisecond
	defer func() { closeWait = old }()
	e, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := NewNetns()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.NS.Close()
	s, err := e.Serve(ns.TUN, "stuck", "", Policy{})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	s.wg.Add(1) // a goroutine of the session that is stuck
	go func() { <-release; s.wg.Done() }()
	start := time.Now()
	err = s.Close()
	if err == nil || !strings.Contains(err.Error(), "did not stop") {
		t.Fatalf("Close: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close took %v", d)
	}
	if e.Sessions() != 0 {
		t.Fatal("the session is still counted")
	}
	close(release)
}
