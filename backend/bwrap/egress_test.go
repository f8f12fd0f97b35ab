package bwrap

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress/egresstest"
)

// egressBackend is a root backend with egress on (egresstest.New): test
// names map to the host's loopback, which the operator permits. Dials and
// audit events are recorded.
func egressBackend(t *testing.T) (*Backend, *egresstest.Log) {
	t.Helper()
	if why := egresstest.Missing(); why != "" {
		skipOrFail(t, "%s", why)
	}
	e, el := egresstest.New(t)
	return newTestBackend(t, rangeUID, func(c *Config) { c.Egress = e }), el
}

func TestBwrapEgressAllowlist(t *testing.T) {
	b, el := egressBackend(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello ", r.Host) }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	ctx := context.Background()
	id := "egress-allow"
	info, err := b.Create(ctx, id, backend.Spec{AllowEgressTo: []string{"allowed.test"}})
	if err != nil || info.Network != "allowlist" {
		t.Fatalf("Create: %+v %v", info, err)
	}
	defer b.Destroy(ctx, id)
	// Every program, with no proxy settings: curl and Python's urllib.
	if out := runOK(t, b, id, "curl -sS --max-time 20 http://allowed.test:"+port+"/"); out != "hello allowed.test:"+port {
		t.Fatalf("curl: %q", out)
	}
	py := `import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode())`
	if out := runOK(t, b, id, "env | grep -i proxy; /usr/bin/python3 -c '"+py+"' http://allowed.test:"+port+"/"); strings.TrimSpace(out) != "hello allowed.test:"+port {
		t.Fatalf("python: %q", out)
	}
	// Not on the list: NXDOMAIN; its address directly: refused.
	res := run(t, b, id, "getent ahosts other.test; echo rc=$?; curl -sS --max-time 20 http://100.127.0.2:"+port+"/; echo rc=$?")
	if out := string(res.Stdout); !strings.Contains(out, "rc=2") || strings.Contains(out, "hello") || strings.Contains(out, "rc=0") {
		t.Fatalf("other.test: %q %q", out, res.Stderr)
	}
	// The guest cannot change its network: it has no CAP_NET_ADMIN over
	// the namespace (owned by the daemon's user namespace).
	if res := run(t, b, id, "ip route del default 2>&1 || echo refused"); !strings.Contains(string(res.Stdout), "refused") && res.ExitCode == 0 {
		t.Fatalf("guest changed its routes: %q", res.Stdout)
	}
	// The metadata address: refused before any dial.
	if res := run(t, b, id, "curl -sS --max-time 10 http://169.254.169.254/"); res.ExitCode == 0 {
		t.Fatalf("metadata reached: %q", res.Stdout)
	}
	// An allowed connection's event is written when its relay ends, a
	// moment after the guest's program exits: wait for it, bounded.
	tcp := func(allowed bool) func(egress.Event) bool {
		return func(ev egress.Event) bool { return ev.Proto == "tcp" && ev.Sandbox == id && ev.Allowed == allowed }
	}
	allowed, refused := len(el.Await(tcp(true), 2)), len(el.Await(tcp(false), 2))
	for _, d := range el.Dials() {
		if d != "tcp 127.0.0.1:"+port {
			t.Errorf("dialled %s", d)
		}
	}
	if allowed != 2 || refused != 2 {
		t.Errorf("audit: %d allowed, %d refused: %+v", allowed, refused, el.Events(func(egress.Event) bool { return true }))
	}
}

func TestBwrapEgressCIDRAndDestroy(t *testing.T) {
	b, _ := egressBackend(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	ctx := context.Background()
	id := "egress-cidr"
	if _, err := b.Create(ctx, id, backend.Spec{AllowEgressToCIDRs: []string{"127.0.0.1/32"}}); err != nil {
		t.Fatal(err)
	}
	defer b.Destroy(ctx, id)
	if out := runOK(t, b, id, "curl -sS --max-time 20 http://100.127.0.1:"+port+"/"); out != "ok" {
		t.Fatalf("CIDR: %q", out)
	}
	if e := b.cfg.Egress.Sessions(); e != 1 {
		t.Fatalf("%d egress sessions", e)
	}
	if err := b.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if e := b.cfg.Egress.Sessions(); e != 0 {
		t.Fatalf("%d egress sessions after destroy", e)
	}
}

func TestBwrapNoListsNoNetwork(t *testing.T) {
	b, _ := egressBackend(t)
	id := create(t, b, backend.Spec{})
	if out := runOK(t, b, id, `tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '`); out != "lo\n" {
		t.Fatalf("a sandbox without lists sees %q", out)
	}
	if res := run(t, b, id, "curl -sS --max-time 5 http://100.127.0.1:1/"); res.ExitCode == 0 {
		t.Fatal("reached something")
	}
	if e := b.cfg.Egress.Sessions(); e != 0 {
		t.Fatalf("%d egress sessions for a sandbox without lists", e)
	}
}

func TestBwrapEgressNotConfigured(t *testing.T) {
	b := newTestBackend(t, daemonUID)
	_, err := b.Create(context.Background(), "nolists", backend.Spec{AllowEgressTo: []string{"pypi.org"}})
	wantErr(t, err, backend.ErrSpecUnenforceable)
	if !strings.Contains(err.Error(), "egress filtering is not enabled") {
		t.Fatalf("message: %v", err)
	}
}
