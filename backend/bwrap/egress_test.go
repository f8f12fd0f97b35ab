package bwrap

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress"
)

// egressBackend is a root backend with egress on: test names map to the
// host's loopback, which the operator permits. Dials are recorded.
func egressBackend(t *testing.T) (*Backend, *egressLog) {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(t, "egress needs root (network namespaces, TUN)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		skipOrFail(t, "egress needs /dev/net/tun: %v", err)
	}
	el := &egressLog{}
	e, err := egress.New(egress.Config{
		Hosts: map[string][]netip.Addr{
			"allowed.test": {netip.MustParseAddr("127.0.0.1")},
			"other.test":   {netip.MustParseAddr("127.0.0.2")},
		},
		PrivateAllowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Lookup: func(context.Context, string, string) ([]netip.Addr, error) {
			return nil, fmt.Errorf("test: the host's resolver is never asked")
		},
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			el.mu.Lock()
			el.dials = append(el.dials, address)
			el.mu.Unlock()
			if ap, err := netip.ParseAddrPort(address); err != nil || !ap.Addr().IsLoopback() {
				t.Errorf("asked to dial %s", address)
				return nil, fmt.Errorf("test: loopback only")
			}
			return (&net.Dialer{}).DialContext(ctx, network, address)
		},
		Audit: func(ev egress.Event) {
			el.mu.Lock()
			el.events = append(el.events, ev)
			el.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return newTestBackend(t, rangeUID, func(c *Config) { c.Egress = e }), el
}

type egressLog struct {
	mu     sync.Mutex
	dials  []string
	events []egress.Event
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
	count := func() (allowed, refused int) {
		for _, ev := range el.events {
			if ev.Proto == "tcp" && ev.Sandbox == id {
				if ev.Allowed {
					allowed++
				} else {
					refused++
				}
			}
		}
		return allowed, refused
	}
	el.mu.Lock()
	defer el.mu.Unlock()
	allowed, refused := count()
	for deadline := time.Now().Add(10 * time.Second); (allowed < 2 || refused < 2) && time.Now().Before(deadline); allowed, refused = count() {
		el.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
		el.mu.Lock()
	}
	for _, d := range el.dials {
		if d != "127.0.0.1:"+port {
			t.Errorf("dialled %s", d)
		}
	}
	if allowed != 2 || refused != 2 {
		t.Errorf("audit: %d allowed, %d refused: %+v", allowed, refused, el.events)
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
