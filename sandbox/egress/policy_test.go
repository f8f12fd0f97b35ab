package egress

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestParsePolicy(t *testing.T) {
	p, err := ParsePolicy([]string{"PyPI.org.", "*.example.com", "api.test:8443"}, []string{"192.0.2.0/24", "2001:db8::/32", "198.51.100.7"})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"pypi.org": true, "PYPI.ORG.": true, "a.pypi.org": false,
		"a.example.com": true, "a.b.example.com": true, "example.com": false, "badexample.com": false,
		"api.test": true, "other.test": false,
	} {
		if got := p.AllowsName(name); got != want {
			t.Errorf("AllowsName(%q) = %v, want %v", name, got, want)
		}
	}
	if !p.allowsNamePort("api.test", 8443) || p.allowsNamePort("api.test", 443) || !p.allowsNamePort("pypi.org", 443) {
		t.Error("ports")
	}
	for a, want := range map[string]bool{"192.0.2.9": true, "192.0.3.1": false, "2001:db8::1": true, "::ffff:192.0.2.1": true, "198.51.100.7": true, "198.51.100.8": false} {
		if got := p.AllowsCIDR(netip.MustParseAddr(a)); got != want {
			t.Errorf("AllowsCIDR(%s) = %v", a, got)
		}
	}
	for _, bad := range [][2][]string{
		{{"exa mple.com"}, nil}, {{"*"}, nil}, {{"*.com"}, nil}, {{"1.2.3.4"}, nil}, {{"a.com:0"}, nil}, {{"a.com:x"}, nil},
		{nil, {"10.0.0.0/33"}}, {nil, {"host.example"}}, {nil, {"::ffff:10.0.0.0/104"}},
		{make([]string, MaxEntries+1), nil},
	} {
		if _, err := ParsePolicy(bad[0], bad[1]); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParsePolicy(%q, %q): %v, want ErrInvalid", bad[0], bad[1], err)
		}
	}
}

func TestClassify(t *testing.T) {
	own := func(a netip.Addr) bool { return a == netip.MustParseAddr("203.0.114.5") }
	for a, want := range map[string]string{
		"169.254.169.254": classLinkLocal, "fe80::1": classLinkLocal, "fd00:ec2::254": classLinkLocal,
		"::ffff:169.254.169.254": classLinkLocal, "127.0.0.1": classLoopback, "::1": classLoopback,
		"10.1.2.3": classPrivate, "172.16.0.1": classPrivate, "192.168.1.1": classPrivate, "100.64.0.1": classPrivate,
		"fd12::1": classPrivate, "0.0.0.0": classUnspecified, "::": classUnspecified, "224.0.0.1": classMulticast,
		"255.255.255.255": classMulticast, "64:ff9b::a9fe:a9fe": classNAT64, "203.0.114.5": classHost,
		"1.1.1.1": classPublic, "2606:4700::1111": classPublic,
	} {
		if got := classify(netip.MustParseAddr(a), own); got != want {
			t.Errorf("classify(%s) = %q, want %q", a, got, want)
		}
	}
}

func TestPermittedNeedsTheOperator(t *testing.T) {
	e, err := New(Config{OwnAddrs: func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("198.51.99.1")} }})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"127.0.0.1", "10.0.0.1", "198.51.99.1", "169.254.169.254"} {
		if ok, why := e.permitted(netip.MustParseAddr(a)); ok || why == "" {
			t.Errorf("%s permitted without the operator", a)
		}
	}
	if ok, _ := e.permitted(netip.MustParseAddr("8.8.8.8")); !ok {
		t.Error("public address refused")
	}
	e, err = New(Config{PrivateAllowed: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := e.permitted(netip.MustParseAddr("10.0.0.1")); !ok {
		t.Error("operator-permitted private address refused")
	}
	// Each refusal says why (a /0 of a public address once read "it is a ").
	for bad, why := range map[string]string{
		"169.254.0.0/16": "it is a link-local address", "169.0.0.0/8": "it overlaps link-local 169.254.0.0/16", "fe80::/64": "it is a link-local address",
		"0.0.0.0/0": "it holds every address", "8.8.8.8/0": "it holds every address", "127.0.0.1/0": "it holds every address",
		"224.0.0.0/4": "it is a multicast or broadcast address, never reachable", "0.0.0.0/8": "it is an unspecified address, never reachable",
	} {
		_, err := New(Config{PrivateAllowed: []netip.Prefix{netip.MustParsePrefix(bad)}})
		if err == nil || !strings.Contains(err.Error(), "private destination "+bad+" may not be permitted: "+why) {
			t.Errorf("operator permitted %s: %v; want it refused saying %q", bad, err, why)
		}
	}
	// A refused destination's reason reads as a sentence.
	for a, why := range map[string]string{
		"0.0.0.0": "an unspecified address is never reachable", "198.51.99.1": "one of the host's own addresses, which the operator does not permit",
		"127.0.0.1": "a loopback address, which the operator does not permit",
	} {
		own, _ := New(Config{OwnAddrs: func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("198.51.99.1")} }})
		if ok, got := own.permitted(netip.MustParseAddr(a)); ok || got != why {
			t.Errorf("%s: permitted %v, %q; want refused, %q", a, ok, got, why)
		}
	}
}

func TestLoopbackStandins(t *testing.T) {
	for real, guest := range map[string]string{"127.0.0.1": "100.127.0.1", "127.0.3.4": "100.127.3.4", "::1": "fd00:5b5b::7f00:1", "1.2.3.4": "1.2.3.4"} {
		g, ok := toGuest(netip.MustParseAddr(real))
		if !ok || g.String() != guest || fromGuest(g).String() != real {
			t.Errorf("%s <-> %s: %v %v %v", real, guest, g, ok, fromGuest(g))
		}
	}
	if _, ok := toGuest(netip.MustParseAddr("127.1.0.1")); ok {
		t.Error("127.1.0.1 has no stand-in")
	}
}

func TestPeekNames(t *testing.T) {
	if h := httpHost([]byte("GET / HTTP/1.1\r\nUser-Agent: x\r\nhOsT: Example.COM:8080\r\n\r\n")); h != "example.com" {
		t.Errorf("host %q", h)
	}
	if h := httpHost([]byte("GET / HTTP/1.0\r\n\r\n")); h != "" {
		t.Errorf("host %q", h)
	}
	if serverName([]byte{0x16, 3, 1, 0, 5, 1, 0, 0, 1, 0}) != "" {
		t.Error("garbage hello has a name")
	}
}

// TestPeekErrors: a first flight that names nothing says why, with the
// bound it passed (these are the reasons of refused connections' audit
// lines).
func TestPeekErrors(t *testing.T) {
	old := peekRest
	peekRest = 200 * time.Millisecond
	defer func() { peekRest = old }()
	long := make([]byte, 5)
	long[0], long[3], long[4] = 0x16, 0x4f, 0xff // a TLS record of 20479 bytes
	head := []byte("GET / HTTP/1.1\r\nHost: a.test\r\n")
	for _, c := range []struct {
		what  string
		send  []byte
		close bool
		want  string
	}{
		{"a TLS record longer than the bound", long, false, fmt.Sprintf("a TLS ClientHello of more than %d bytes", maxPeek)},
		{"a ClientHello cut short", []byte{0x16, 3, 1, 0, 200, 1}, true, "incomplete TLS ClientHello: the client closed the connection"},
		{"an HTTP head cut short", head, true, "incomplete HTTP request head: the client closed the connection"},
		{"an HTTP head longer than the bound", append(append([]byte{}, head...), bytes.Repeat([]byte("X-Pad: y\r\n"), maxPeek/10+1)...), false,
			fmt.Sprintf("no name asked for in the first %d bytes", maxPeek)},
		{"an HTTP head that stops", head, false, "incomplete HTTP request head: the rest did not come within"},
	} {
		client, server := net.Pipe()
		go func() {
			client.Write(c.send)
			if c.close {
				client.Close()
			}
		}()
		_, _, err := peekName(server, time.Second)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error beginning %q", c.what, err, c.want)
		}
		client.Close()
		server.Close()
	}
}
