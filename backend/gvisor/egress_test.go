package gvisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc/inittest"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress/egresstest"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress/egresstest/loopsrv"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

// The egress tests reach only servers on the host's loopback
// (egresstest.StartServers), through names the test's egress resolver maps
// to 127.0.0.1 and the loopback range it permits.

// egressBackend is a gvisor backend with egress on (egresstest.New): test
// names map to the host's loopback, which the operator permits; dials and
// audit events are recorded.
func egressBackend(t *testing.T, tweak ...func(*Config)) (*Backend, *egresstest.Log) {
	t.Helper()
	return egressBackendOf(t, nil, tweak...)
}

// egressBackendOf is egressBackend with egress's Config changed by
// egressTweak (nil: none) before it is made.
func egressBackendOf(t *testing.T, egressTweak func(*egress.Config), tweak ...func(*Config)) (*Backend, *egresstest.Log) {
	t.Helper()
	testRunsc(t)
	if why := egresstest.Missing(); why != "" {
		skipOrFail(t, "%s", why)
	}
	var ets []func(*egress.Config)
	if egressTweak != nil {
		ets = append(ets, egressTweak)
	}
	e, el := egresstest.New(t, ets...)
	return newTestBackend(t, append([]func(*Config){func(c *Config) { c.Egress = e }}, tweak...)...), el
}

// guestProgram is loopsrv's Guest for sandbox id: its stdout, and an
// error (with stderr) unless it exited 0.
func guestProgram(t *testing.T, b *Backend, id string) loopsrv.Guest {
	return func(argv ...string) (string, error) {
		res := guest(t, b, id, argv...)
		if res.ExitCode != 0 {
			return string(res.Stdout), fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr)
		}
		return string(res.Stdout), nil
	}
}

// withSession calls f with the egress session of sandbox id's gVisor
// sandbox, under the lock that keeps it from being closed meanwhile; f is
// not called when the sandbox has none.
func withSession(t *testing.T, b *Backend, id string, f func(*egress.Session)) {
	t.Helper()
	sb, err := b.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	if sb.init != nil && sb.init.egress != nil {
		f(sb.init.egress.Sess)
	}
}

// sessionConns is the connections the egress session of sandbox id's
// gVisor sandbox counts now (-1: it has none).
func sessionConns(t *testing.T, b *Backend, id string) int {
	n := -1
	withSession(t, b, id, func(s *egress.Session) { n = s.Conns() })
	return n
}

// sessionStats is what the egress session of sandbox id's gVisor sandbox
// counted so far (zero: it has none).
func sessionStats(t *testing.T, b *Backend, id string) (st egress.Stats) {
	withSession(t, b, id, func(s *egress.Session) { st = s.Stats() })
	return st
}

// TestGVisorThousandConnectionsBounded: loopsrv.ThousandConnections from a
// gVisor sandbox (its sentry's netstack in front of the daemon's), with
// max_conns 64 and the guest's open files limit raised to hold them.
func TestGVisorThousandConnectionsBounded(t *testing.T) {
	const bound = 64
	b, el := egressBackendOf(t, func(c *egress.Config) { c.MaxConns = bound }, func(c *Config) { c.Limits.OpenFiles = 4096 })
	const id = "egress-storm"
	if _, err := b.Create(context.Background(), id, backend.Spec{AllowEgressTo: []string{loopsrv.AllowedName}}); err != nil {
		t.Fatal(err)
	}
	loopsrv.ThousandConnections(t, loopsrv.Storm{
		Guest: guestProgram(t, b, id),
		Bound: bound,
		Conns: func() int { return sessionConns(t, b, id) },
		BoundRefusals: func() int {
			return len(el.Events(func(ev egress.Event) bool {
				return ev.Sandbox == id && strings.Contains(ev.Reason, fmt.Sprintf("more than %d connections", bound))
			})) + int(sessionStats(t, b, id).AuditSuppressed) // past the audit budget: counted, not written
		},
	})
}

// TestGVisorRebindingToForbiddenAddress: loopsrv.Rebinding from a gVisor
// sandbox.
func TestGVisorRebindingToForbiddenAddress(t *testing.T) {
	b, el := egressBackendOf(t, func(c *egress.Config) { c.Lookup = loopsrv.RebindLookup() })
	const id = "egress-rebind"
	if _, err := b.Create(context.Background(), id, backend.Spec{AllowEgressTo: []string{loopsrv.RebindName}}); err != nil {
		t.Fatal(err)
	}
	loopsrv.Rebinding(t, loopsrv.Rebind{
		Guest: guestProgram(t, b, id),
		Dials: el.Dials,
		Lines: func() []loopsrv.DNSLine { return el.DNSLines(loopsrv.RebindName) },
	})
}

// guest runs argv (or, with one element, a shell command) in sandbox id
// and returns its result; a failed or terminated run fails t.
func guest(t *testing.T, b *Backend, id string, argv ...string) backend.ExecResult {
	t.Helper()
	req := backend.ExecRequest{Argv: argv, Timeout: time.Minute}
	if len(argv) == 1 {
		req = backend.ExecRequest{Command: argv[0], Timeout: time.Minute}
	}
	res, err := b.Exec(context.Background(), id, req)
	if err != nil || res.SandboxTerminated {
		t.Fatalf("%q: %+v, %v", argv, res, err)
	}
	return res
}

// pyFetch fetches a URL with urllib (certificates unchecked: the test
// server's is for example.com), proxy variables unset.
const pyFetch = `
import os, ssl, sys, urllib.request
assert not [k for k in os.environ if "proxy" in k.lower()], os.environ
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
print(urllib.request.urlopen(sys.argv[1], timeout=20, context=ctx).read().decode(), end="")
`

// pyUDP sends one datagram to a name's address.
const pyUDP = `
import socket, sys
a = socket.getaddrinfo(sys.argv[1], int(sys.argv[2]), socket.AF_INET, socket.SOCK_DGRAM)[0][4]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b"datagram", a); print("sent", a[0])
`

// TestGVisorEgressAllowlist: a gVisor sandbox limited to one name reaches
// it over HTTP and HTTPS (SNI), with curl, Python's urllib and a raw
// socket; another name is NXDOMAIN, its address refused, and asked for by
// SNI on the allowed name's address refused too; the metadata
// address is refused; UDP to a port that is not DNS is dropped; the guest
// cannot change its routes; every connection has its audit line; the
// daemon dialled nothing but the allowed server.
func TestGVisorEgressAllowlist(t *testing.T) {
	b, el := egressBackend(t)
	srv := egresstest.StartServers(t)
	ctx := context.Background()
	const id = "egress-allow"
	info, err := b.Create(ctx, id, backend.Spec{AllowEgressTo: []string{egresstest.Allowed}})
	if err != nil || info.Network != "allowlist" {
		t.Fatalf("Create: %+v %v", info, err)
	}
	if got := string(guest(t, b, id, "cat", "/etc/resolv.conf").Stdout); got != egress.ResolvConf() {
		t.Fatalf("the guest's resolv.conf is %q, want the egress resolver's", got)
	}
	httpURL := "http://" + egresstest.Allowed + ":" + srv.HTTPPort + "/"
	httpsURL := "https://" + egresstest.Allowed + ":" + srv.TLSPort + "/"
	for _, c := range []struct {
		argv []string
		want string
	}{
		{[]string{"curl", "-sS", "--max-time", "20", httpURL}, "hello allowed.test:" + srv.HTTPPort},
		{[]string{"curl", "-ksS", "--max-time", "20", httpsURL}, "secure allowed.test:" + srv.TLSPort + " allowed.test"},
		{[]string{"python3", "-c", pyFetch, httpURL}, "hello allowed.test:" + srv.HTTPPort},
		{[]string{"python3", "-c", pyFetch, httpsURL}, "secure allowed.test:" + srv.TLSPort + " allowed.test"},
		{[]string{"python3", "-c", loopsrv.PyRaw, egresstest.Allowed, srv.RawPort}, "echo ping raw\n"},
	} {
		if res := guest(t, b, id, c.argv...); res.ExitCode != 0 || string(res.Stdout) != c.want {
			t.Errorf("%v: exit %d, %q (stderr %q), want %q", c.argv[:2], res.ExitCode, res.Stdout, res.Stderr, c.want)
		}
	}
	allowedConns := el.Await(func(ev egress.Event) bool { return ev.Proto == "tcp" && ev.Allowed }, 5)

	// Not on the list: NXDOMAIN (getent's exit 2), and its address,
	// dialled directly, refused.
	if res := guest(t, b, id, "getent", "ahosts", egresstest.Other); res.ExitCode != 2 {
		t.Errorf("getent ahosts other.test: exit %d %q, want 2 (not found)", res.ExitCode, res.Stdout)
	}
	if res := guest(t, b, id, "python3", "-c", loopsrv.PyRaw, egresstest.Other, srv.RawPort); res.ExitCode != 4 || !strings.Contains(string(res.Stdout), "GAIERROR") {
		t.Errorf("other.test resolved: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if res := guest(t, b, id, "curl", "-sS", "--max-time", "20", "http://"+egresstest.OtherGuestAddr+":"+srv.HTTPPort+"/"); res.ExitCode == 0 {
		t.Errorf("a direct connect to other.test's address got through: %q", res.Stdout)
	}
	// allowed.test's address, asked (by SNI) for another name: refused,
	// so one allowed name on a shared address does not open the others.
	if res := guest(t, b, id, "curl", "-ksS", "--max-time", "20", "--resolve", egresstest.Other+":"+srv.TLSPort+":"+egresstest.AllowedGuestAddr,
		"https://"+egresstest.Other+":"+srv.TLSPort+"/"); res.ExitCode == 0 {
		t.Errorf("SNI other.test on allowed.test's address got through: %q", res.Stdout)
	}
	// The metadata address: refused before any dial.
	if res := guest(t, b, id, "curl", "-sS", "--max-time", "10", "http://169.254.169.254/latest/meta-data/"); res.ExitCode == 0 {
		t.Errorf("the metadata address answered: %q", res.Stdout)
	}
	// UDP to the allowed name's address, but not DNS: dropped.
	if res := guest(t, b, id, "python3", "-c", pyUDP, egresstest.Allowed, srv.UDPPort); res.ExitCode != 0 || !strings.Contains(string(res.Stdout), "sent "+egresstest.AllowedGuestAddr) {
		t.Errorf("send a datagram: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	// The guest's routes are the sentry's, and it may not change them.
	if res := guest(t, b, id, "ip route del default 2>&1 || echo refused"); !strings.Contains(string(res.Stdout), "refused") {
		t.Errorf("the guest changed its routes: %q", res.Stdout)
	}

	refusedConns := el.Await(func(ev egress.Event) bool { return ev.Proto == "tcp" && !ev.Allowed }, 3)
	udp := el.Await(func(ev egress.Event) bool { return ev.Proto == "udp" }, 1)
	if len(allowedConns) != 5 {
		t.Errorf("audit: %d allowed connections, want 5: %+v", len(allowedConns), allowedConns)
	}
	for _, ev := range allowedConns {
		if ev.Sandbox != id || ev.Name != egresstest.Allowed || ev.Addr.String() != "127.0.0.1" || ev.BytesIn == 0 || ev.BytesOut == 0 {
			t.Errorf("audit of an allowed connection: %+v", ev)
		}
	}
	if len(refusedConns) != 3 || refusedConns[0].Addr.String() != "127.0.0.2" ||
		refusedConns[1].Name != egresstest.Other || refusedConns[1].Addr.String() != "127.0.0.1" ||
		refusedConns[2].Addr.String() != "169.254.169.254" || !strings.Contains(refusedConns[2].Reason, "never reachable") {
		t.Errorf("audit of the refused connections: %+v", refusedConns)
	}
	if len(udp) != 1 || udp[0].Allowed || udp[0].Port != port(t, srv.UDPPort) {
		t.Errorf("audit of the datagram: %+v", udp)
	}
	if n := srv.UDPReceived(); n != 0 {
		t.Errorf("%d datagrams reached the UDP server", n)
	}
	if nx := el.Events(func(ev egress.Event) bool { return ev.Proto == "dns" && ev.Name == egresstest.Other && !ev.Allowed }); len(nx) == 0 {
		t.Error("the NXDOMAIN for other.test is not audited")
	}
	for _, d := range el.Dials() {
		if !slices.Contains([]string{"tcp 127.0.0.1:" + srv.HTTPPort, "tcp 127.0.0.1:" + srv.TLSPort, "tcp 127.0.0.1:" + srv.RawPort}, d) {
			t.Errorf("the daemon dialled %s", d)
		}
	}
}

func port(t *testing.T, s string) uint16 {
	t.Helper()
	p, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	return uint16(p)
}

// TestGVisorEgressCIDRAndDestroy: a CIDR entry opens its addresses (TCP,
// and UDP both ways) and nothing else; Destroy ends the sandbox's session.
func TestGVisorEgressCIDRAndDestroy(t *testing.T) {
	b, _ := egressBackend(t)
	srv := egresstest.StartServers(t)
	ctx := context.Background()
	const id = "egress-cidr"
	if info, err := b.Create(ctx, id, backend.Spec{AllowEgressToCIDRs: []string{"127.0.0.1/32"}}); err != nil || info.Network != "allowlist" {
		t.Fatalf("Create: %+v %v", info, err)
	}
	if res := guest(t, b, id, "curl", "-sS", "--max-time", "20", "http://"+egresstest.AllowedGuestAddr+":"+srv.HTTPPort+"/"); string(res.Stdout) != "hello "+egresstest.AllowedGuestAddr+":"+srv.HTTPPort {
		t.Fatalf("in the CIDR: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if res := guest(t, b, id, "curl", "-sS", "--max-time", "20", "http://"+egresstest.OtherGuestAddr+":"+srv.HTTPPort+"/"); res.ExitCode == 0 {
		t.Fatalf("outside the CIDR: %q", res.Stdout)
	}
	// No names on the list: none resolves.
	if res := guest(t, b, id, "getent", "ahosts", egresstest.Allowed); res.ExitCode != 2 {
		t.Fatalf("allowed.test resolved without names on the list: exit %d %q", res.ExitCode, res.Stdout)
	}
	if n := b.cfg.Egress.Sessions(); n != 1 {
		t.Fatalf("%d egress sessions for one sandbox", n)
	}
	if err := b.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if n := b.cfg.Egress.Sessions(); n != 0 {
		t.Fatalf("%d egress sessions after Destroy", n)
	}
}

// TestGVisorNoListsNoNetwork: on a daemon with egress on, a sandbox
// without lists still has no network at all (runsc --network=none: lo
// alone) and no session.
func TestGVisorNoListsNoNetwork(t *testing.T) {
	b, el := egressBackend(t)
	srv := egresstest.StartServers(t)
	ctx := context.Background()
	const id = "no-lists"
	if info, err := b.Create(ctx, id, backend.Spec{}); err != nil || info.Network != "none" {
		t.Fatalf("Create: %+v %v", info, err)
	}
	if got := string(guest(t, b, id, `tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '`).Stdout); got != "lo\n" {
		t.Fatalf("a sandbox without lists sees interfaces %q", got)
	}
	if res := guest(t, b, id, "curl", "-sS", "--max-time", "5", "http://"+egresstest.AllowedGuestAddr+":"+srv.HTTPPort+"/"); res.ExitCode == 0 {
		t.Fatalf("reached %q", res.Stdout)
	}
	if got := string(guest(t, b, id, "cat", "/etc/resolv.conf").Stdout); got != "" {
		t.Fatalf("a sandbox without a network has a resolver: %q", got)
	}
	if n := b.cfg.Egress.Sessions(); n != 0 {
		t.Fatalf("%d egress sessions for a sandbox without lists", n)
	}
	if d := el.Dials(); len(d) != 0 {
		t.Fatalf("dialled %v", d)
	}
}

// TestGVisorEgressNotConfigured: without egress on the daemon, lists are
// refused (spec_unenforceable, saying how to turn it on), and so is
// block_network=false, which the gvisor backend never grants.
func TestGVisorEgressNotConfigured(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	_, err := b.Create(ctx, "lists", backend.Spec{AllowEgressTo: []string{"pypi.org"}})
	if !errors.Is(err, backend.ErrSpecUnenforceable) || !strings.Contains(err.Error(), "egress filtering is not enabled") {
		t.Fatalf("lists without egress: %v", err)
	}
	no := false
	if _, err := b.Create(ctx, "host-net", backend.Spec{BlockNetwork: &no}); !errors.Is(err, backend.ErrSpecUnenforceable) {
		t.Fatalf("block_network=false: %v", err)
	}
	if ids, _ := b.List(ctx); len(ids) != 0 {
		t.Fatalf("refused creates left %v", ids)
	}
	// A bad list is invalid_argument on a daemon with egress on.
	eb, _ := egressBackend(t)
	if _, err := eb.Create(ctx, "bad", backend.Spec{AllowEgressToCIDRs: []string{"not-a-cidr"}}); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Fatalf("a bad CIDR: %v", err)
	}
}

// TestGVisorEgressRestart simulates kill -9 of the daemon (the init's
// pipes and the egress path close without a destroy): the restarted
// daemon re-adopts the sandbox and its next command boots a gVisor sandbox
// in a new namespace, served by a new session under the same lists. A
// daemon started without egress refuses to adopt it.
func TestGVisorEgressRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gvisor")
	first, _ := egressBackend(t, func(c *Config) { c.Dir = dir })
	srv := egresstest.StartServers(t)
	ctx := context.Background()
	const id = "egress-survivor"
	if _, err := first.Create(ctx, id, backend.Spec{AllowEgressTo: []string{egresstest.Allowed}}); err != nil {
		t.Fatal(err)
	}
	url := "http://" + egresstest.Allowed + ":" + srv.HTTPPort + "/"
	want := "hello " + egresstest.Allowed + ":" + srv.HTTPPort
	if got := string(guest(t, first, id, "curl", "-sS", "--max-time", "20", url).Stdout); got != want {
		t.Fatalf("before the restart: %q", got)
	}
	sb, err := first.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	sb.initMu.Lock()
	sb.init.close()
	sb.init = nil
	sb.initMu.Unlock()
	if n := first.cfg.Egress.Sessions(); n != 0 {
		t.Fatalf("%d sessions of the dead daemon", n)
	}

	// Without egress the sandbox cannot be served: not adopted, and said so.
	plain := newTestBackend(t, func(c *Config) { c.Dir = dir })
	if err := plain.Adopt(ctx, id); err == nil || !strings.Contains(err.Error(), "cannot serve now") {
		t.Fatalf("Adopt without egress: %v", err)
	}

	second, el := egressBackend(t, func(c *Config) { c.Dir = dir })
	if err := second.Adopt(ctx, id); err != nil {
		t.Fatal(err)
	}
	res := guest(t, second, id, "curl -sS --max-time 20 "+url+"; curl -sS --max-time 20 http://"+egresstest.OtherGuestAddr+":"+srv.HTTPPort+"/ || echo refused")
	if got := string(res.Stdout); got != want+"refused\n" {
		t.Fatalf("after the restart: %q %q", got, res.Stderr)
	}
	if n := second.cfg.Egress.Sessions(); n != 1 {
		t.Fatalf("%d sessions after the restart", n)
	}
	if evs := el.Await(func(ev egress.Event) bool { return ev.Proto == "tcp" && ev.Sandbox == id }, 2); len(evs) != 2 {
		t.Fatalf("the new session's audit: %+v", evs)
	}
}

// TestGVisorEgressEndsWithTheSandbox: when an allow-listed sandbox's
// runsc processes are killed, its egress session (and the namespace and
// TUN device the daemon held for it) ends then, not at its next command.
func TestGVisorEgressEndsWithTheSandbox(t *testing.T) {
	b, _ := egressBackend(t)
	ctx := context.Background()
	const id = "egress-killed"
	if _, err := b.Create(ctx, id, backend.Spec{AllowEgressToCIDRs: []string{"127.0.0.1/32"}}); err != nil {
		t.Fatal(err)
	}
	if n := b.cfg.Egress.Sessions(); n != 1 {
		t.Fatalf("%d sessions for one sandbox", n)
	}
	for _, pid := range sandboxPIDs(t, b, id) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(20 * time.Second)
	for b.cfg.Egress.Sessions() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the dead sandbox's egress session was still served 20s after its runsc processes were killed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	res, err := b.Exec(ctx, id, backend.ExecRequest{Command: "true", Timeout: time.Minute})
	if err != nil || !res.SandboxTerminated {
		t.Fatalf("the next command: %+v %v, want sandbox_terminated", res, err)
	}
}

// TestGVisorEgressImage: a sandbox on an image whose /etc/resolv.conf is
// its own (a symlink here, as systemd-resolved images have) sees the
// daemon's resolver instead, and reaches the allowed name with the
// image's own programs (busybox).
func TestGVisorEgressImage(t *testing.T) {
	b, _ := egressBackend(t, func(c *Config) { c.InitPath = inittest.Init(t, "exe") })
	srv := egresstest.StartServers(t)
	root := busyboxRoot(t, true)
	if err := os.Symlink("../run/systemd/resolve/stub-resolv.conf", filepath.Join(root, "etc/resolv.conf")); err != nil {
		t.Fatal(err)
	}
	img := backend.Image{Name: "busybox", Digest: "sha256:" + strings.Repeat("ef", 32), Root: root, Env: []string{"PATH=/bin"}}
	ctx := context.Background()
	const id = "egress-image"
	if _, err := b.Create(ctx, id, backend.Spec{Image: img, AllowEgressTo: []string{egresstest.Allowed}}); err != nil {
		t.Fatal(err)
	}
	if got := string(guest(t, b, id, "/bin/busybox", "cat", "/etc/resolv.conf").Stdout); got != egress.ResolvConf() {
		t.Fatalf("the image sandbox's resolv.conf: %q", got)
	}
	res := guest(t, b, id, "/bin/busybox", "wget", "-q", "-O", "-", "http://"+egresstest.Allowed+":"+srv.HTTPPort+"/")
	if got := string(res.Stdout); got != "hello "+egresstest.Allowed+":"+srv.HTTPPort {
		t.Fatalf("busybox wget: exit %d %q %q", res.ExitCode, got, res.Stderr)
	}
	// A sandbox of the same image without lists: the daemon's empty file.
	if _, err := b.Create(ctx, "image-none", backend.Spec{Image: img}); err != nil {
		t.Fatal(err)
	}
	if got := string(guest(t, b, "image-none", "/bin/busybox", "cat", "/etc/resolv.conf").Stdout); got != "" {
		t.Fatalf("the image sandbox without lists has a resolver: %q", got)
	}
}

// TestGVisorEgressMeasure logs, interleaved in one run, one allowed
// connection's download rate (1 GiB over HTTP, curl to /dev/null, a CIDR
// entry so nothing is peeked) from a gVisor sandbox, from a bwrap sandbox
// on the same Egress, and over the host's loopback directly. It asserts
// nothing (performance is never asserted) and runs only with
// SANDBOX_SIDECAR_GVISOR_MEASURE=1.
func TestGVisorEgressMeasure(t *testing.T) {
	if os.Getenv("SANDBOX_SIDECAR_GVISOR_MEASURE") != "1" {
		t.Skip("set SANDBOX_SIDECAR_GVISOR_MEASURE=1 to measure")
	}
	const size = 1 << 30
	zeros := make([]byte, 256<<10)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		for sent := 0; sent < size; sent += len(zeros) {
			if _, err := w.Write(zeros); err != nil {
				return
			}
		}
	}))
	defer hs.Close()
	_, hport, _ := net.SplitHostPort(hs.Listener.Addr().String())
	init := inittest.Init(t, "exe") // both backends' sandboxes run the small static init
	// SANDBOX_SIDECAR_GVISOR_FLAGS: extra runsc flags to try.
	gb, _ := egressBackend(t, func(c *Config) {
		c.InitPath, c.ExtraFlags = init, strings.Fields(os.Getenv("SANDBOX_SIDECAR_GVISOR_FLAGS"))
	})
	bdir := filepath.Join(t.TempDir(), "bwrap")
	t.Cleanup(func() { bwrap.KillSandboxes(bdir) })
	bb, err := bwrap.New(bwrap.Config{Dir: bdir, SandboxUID: -1, SandboxGID: -1, Egress: gb.cfg.Egress,
		Limits: limits.Limits{OpenFiles: 1024, FileSizeBytes: 1 << 30}, InitPath: init})
	if err != nil {
		t.Fatal(err)
	}
	defer bb.Close()
	ctx := context.Background()
	spec := backend.Spec{AllowEgressToCIDRs: []string{"127.0.0.1/32"}}
	if _, err := gb.Create(ctx, "measure-gvisor", spec); err != nil {
		t.Fatal(err)
	}
	if _, err := bb.Create(ctx, "measure-bwrap", spec); err != nil {
		t.Fatal(err)
	}
	defer bb.Destroy(ctx, "measure-bwrap")
	curl := func(host string) string {
		return "curl -sS -o /dev/null -w '%{speed_download}' http://" + host + ":" + hport + "/"
	}
	mib := func(out []byte, err error) float64 {
		v, perr := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
		if err != nil || perr != nil {
			t.Fatalf("curl: %q %v %v", out, err, perr)
		}
		return v / (1 << 20)
	}
	in := func(b backend.Backend, id string) float64 {
		res, err := b.Exec(ctx, id, backend.ExecRequest{Command: curl(egresstest.AllowedGuestAddr), Timeout: 5 * time.Minute})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr)
		}
		return mib(res.Stdout, err)
	}
	for round := 1; round <= 3; round++ {
		g := in(gb, "measure-gvisor")
		w := in(bb, "measure-bwrap")
		l := mib(exec.Command("sh", "-c", curl("127.0.0.1")).Output())
		t.Logf("round %d: gvisor %.0f MiB/s, bwrap %.0f MiB/s, loopback directly %.0f MiB/s (gvisor/bwrap %.2f)", round, g, w, l, g/w)
	}
}

// TestAllowlistBundleAndFlags: only an allowlist sandbox's boot gets
// --network=sandbox (and --gso=false), its OCI spec's network namespace is
// the descriptor the daemon hands runsc, and its /etc/resolv.conf is bound
// from its own file; a sandbox without lists gets a new, empty namespace
// of runsc's and the root's empty resolv.conf. Needs no runsc.
func TestAllowlistBundleAndFlags(t *testing.T) {
	dir := t.TempDir()
	b := &Backend{cfg: Config{Dir: dir, Platform: PlatformSystrap}, exe: "/init"}
	flags := b.globalFlags()
	for _, network := range []string{networkNone, networkAllowlist} {
		sb := newSandbox("sb-"+network, filepath.Join(dir, network), persistedSpec{Network: network}, limits.Limits{})
		spec := b.specWith(sb, "/root", nil)
		var ns ociNamespace
		for _, n := range spec.Linux.Namespaces {
			if n.Type == "network" {
				ns = n
			}
		}
		var resolv []ociMount
		for _, m := range spec.Mounts {
			if m.Destination == "/etc/resolv.conf" {
				resolv = append(resolv, m)
			}
		}
		got := runscNetwork(flags, sb)
		switch network {
		case networkNone:
			if ns.Path != "" || len(resolv) != 0 || !slices.Equal(got, flags) {
				t.Errorf("none: namespace %+v, resolv.conf mounts %+v, flags %v", ns, resolv, got)
			}
		case networkAllowlist:
			if ns.Path != netnsPath || len(resolv) != 1 || resolv[0].Source != filepath.Join(sb.dir, resolvName) ||
				!slices.Contains(resolv[0].Options, "ro") {
				t.Errorf("allowlist: namespace %+v, resolv.conf mounts %+v", ns, resolv)
			}
			if slices.Contains(got, "--network=none") || !slices.Contains(got, "--network=sandbox") || !slices.Contains(got, "--gso=false") ||
				len(got) != len(flags)+1 {
				t.Errorf("allowlist flags %v (from %v)", got, flags)
			}
		}
	}
	if !slices.Contains(flags, "--network=none") {
		t.Fatalf("every other runsc command keeps --network=none: %v", flags)
	}
}

// TestOwnResolvConfFixesAnOldImageRoot: an image's mount-point root made
// by an older daemon holds the image's resolv.conf stub (here a symlink,
// as systemd-resolved images have); the daemon makes it its own empty
// file, the mount point an allowlist sandbox binds over.
func TestOwnResolvConfFixesAnOldImageRoot(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "etc", "resolv.conf")
	if err := os.Symlink("../run/systemd/resolve/stub-resolv.conf", p); err != nil {
		t.Fatal(err)
	}
	if err := ownResolvConf(dir); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(p)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 || fi.Size() != 0 {
		t.Fatalf("resolv.conf after ownResolvConf: %v %v", fi, err)
	}
}
