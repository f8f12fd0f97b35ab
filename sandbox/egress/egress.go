// Package egress is a sandbox's only way out: a user-space TCP/IP stack
// (gVisor's tcpip) served on a TUN device that sits in the sandbox's own
// network namespace. Every TCP connection and UDP datagram the sandbox sends
// arrives here, is checked against the sandbox's Policy and is either
// dialled by the daemon or refused (TCP: a reset; UDP: dropped). DNS inside
// the sandbox is answered here too: allowed names resolve (with the host's
// resolver, or the operator's Hosts table), every other name is NXDOMAIN,
// and the addresses handed out are remembered per sandbox. A connection is
// allowed when its destination is in an allowed CIDR, or was handed out to
// this sandbox for an allowed name; for TLS (SNI) and HTTP (Host) the name
// the client asks for must be allowed as well. Loopback, link-local (the
// cloud metadata endpoint), the host's own and private addresses are never
// dialled unless the operator permits them (Config.PrivateAllowed), and
// link-local, multicast and NAT64 never. The package imports nothing of
// the project but internal/hostname (the allow-list's hostname syntax,
// which the sbx backend checks with too).
package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"
)

// Guest-side addresses of the TUN device and of the resolver the netstack
// answers on (CGNAT and ULA space: never a destination anyway).
var (
	GuestAddr4    = netip.MustParseAddr("100.100.0.2")
	GuestAddr6    = netip.MustParseAddr("fd00:5b5b::2")
	ResolverAddr4 = netip.MustParseAddr("100.100.0.1")
	ResolverAddr6 = netip.MustParseAddr("fd00:5b5b::1")
)

// Loopback stand-ins: inside the sandbox 127.0.0.0/8 and ::1 are the
// sandbox's own lo, so a loopback destination the operator permits (a test
// server on the host, say) is handed out as 100.127.y.z for 127.0.y.z, and
// as loopback6Standin for ::1, and dialled as the loopback address.
var (
	loopbackStandin4 = netip.MustParsePrefix("100.127.0.0/16")
	loopbackSource4  = netip.MustParsePrefix("127.0.0.0/16")
	loopbackStandin6 = netip.MustParseAddr("fd00:5b5b::7f00:1")
)

// toGuest is the address the sandbox is given for real address a (ok false:
// none can stand for it).
func toGuest(a netip.Addr) (netip.Addr, bool) {
	a = a.Unmap()
	switch {
	case a == netip.IPv6Loopback():
		return loopbackStandin6, true
	case loopbackSource4.Contains(a):
		b := a.As4()
		return netip.AddrFrom4([4]byte{100, 127, b[2], b[3]}), true
	case a.IsLoopback():
		return netip.Addr{}, false
	}
	return a, true
}

// fromGuest is the real address behind an address the sandbox dials.
func fromGuest(a netip.Addr) netip.Addr {
	a = a.Unmap()
	switch {
	case a == loopbackStandin6:
		return netip.IPv6Loopback()
	case loopbackStandin4.Contains(a):
		b := a.As4()
		return netip.AddrFrom4([4]byte{127, 0, b[2], b[3]})
	}
	return a
}

// MTU of the TUN device and the netstack's link: large, so one packet
// carries much (the device is a memory copy, not a wire).
const MTU = 65520

// ResolvConf is the /etc/resolv.conf a sandbox behind the egress path gets.
func ResolvConf() string {
	return fmt.Sprintf("nameserver %s\noptions timeout:2 attempts:2\n", ResolverAddr4)
}

// Event is one audit line: a connection, a datagram flow, or a DNS query
// the resolver answered or dropped (or, over TCP, a DNS connection it
// refused or closed); or ("suppressed") the summary of lines past the
// sandbox's audit budget (auditBurst, auditRate) that were not written.
//
// For a connection or flow ("tcp", "udp"), Addr and Port are the
// destination the sandbox asked for (the real address behind a loopback
// stand-in). For DNS ("dns") they are the resolver the query went to, as
// the sandbox addressed it (ResolverAddr4 or ResolverAddr6) and port 53;
// Transport says over which protocol, and the query's fields what was
// asked and answered.
type Event struct {
	Sandbox, Owner string
	Proto          string // "tcp", "udp", "dns", or "suppressed" (a summary of lines not written)
	Name           string // the name asked for (DNS question, SNI, Host, or the name the address was handed out for)
	Addr           netip.Addr
	Port           uint16
	Allowed        bool // a connection: relayed; DNS: at least one address handed out
	Reason         string
	BytesOut       int64         // sandbox to the world
	BytesIn        int64         // the world to the sandbox
	Duration       time.Duration // a summary: since the first line it counts
	Suppressed     int64         // a summary: the lines not written (Reason says how many were refusals)

	// DNS only.
	Transport string       // "udp" or "tcp": how the query came to the resolver
	QType     string       // the query's type: "A", "AAAA", "TXT", ... ("TYPE65" for one without a name); "" when no question parsed
	RCode     string       // the reply's: "NOERROR", "NXDOMAIN", "SERVFAIL", "NOTIMP" or "FORMERR"; "" when no reply was sent
	Answers   []netip.Addr // the addresses handed out, as the sandbox was given them (a loopback address as its stand-in)
	Withheld  []Withheld   // addresses the name resolved to that were not handed out (at most maxDNSAnswers)
}

// Withheld is an address a name resolved to that the resolver did not hand
// out, and why.
type Withheld struct {
	Addr   netip.Addr
	Reason string
}

func (w Withheld) String() string { return w.Addr.String() + " (" + w.Reason + ")" }

// Config is the operator's side of egress, shared by every sandbox.
type Config struct {
	// Hosts maps names to addresses the egress resolver answers instead of
	// asking the host's resolver (an /etc/hosts for sandboxes; tests map
	// their names to 127.0.0.1 here). Names are lower case, no trailing dot.
	Hosts map[string][]netip.Addr
	// PrivateAllowed lists the loopback, private and host-own ranges a
	// sandbox may be let reach (through an allowed name, or a CIDR entry
	// of its spec inside them). Empty: none. Link-local (169.254.0.0/16,
	// fe80::/10), multicast and NAT64 ranges may not be listed.
	PrivateAllowed []netip.Prefix
	// MaxConns bounds a sandbox's concurrent connections and UDP flows
	// (default 256); past it new ones are refused.
	MaxConns int
	// IdleTimeout closes a connection with no byte either way for this
	// long (default 5m; UDP flows: a fifth of it, at most a minute).
	IdleTimeout time.Duration
	// DialTimeout bounds the daemon's dial of an allowed destination
	// (default 10s).
	DialTimeout time.Duration
	// PeekTimeout is how long a connection to a name-allowed address is
	// given to send its first bytes (TLS ClientHello, HTTP request line)
	// before it is treated as another protocol (default 500ms).
	PeekTimeout time.Duration
	// Lookup resolves a name for one family ("ip4" or "ip6"); default the
	// host's resolver.
	Lookup func(ctx context.Context, network, name string) ([]netip.Addr, error)
	// Dial dials an allowed destination; default a net.Dialer.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// Audit receives the Events within each session's audit budget, and
	// the summaries of those past it (a session's are handed over one at
	// a time, in order); it must not block for long.
	Audit func(Event)
	// OwnAddrs lists the host's own addresses; default the addresses of
	// the daemon's interfaces, read again at most every 10 seconds.
	OwnAddrs func() []netip.Addr
}

// Egress holds the configuration and the sessions of one daemon.
type Egress struct {
	cfg Config

	mu       sync.Mutex
	own      map[netip.Addr]bool
	ownAt    time.Time
	sessions map[*Session]struct{}
	count    counters

	// The clock of the sessions' audit budgets (tests set them).
	now       func() time.Time
	afterFunc func(time.Duration, func()) *time.Timer
}

// New checks cfg and fills in its defaults.
func New(cfg Config) (*Egress, error) {
	for _, p := range cfg.PrivateAllowed {
		if p.Bits() == 0 {
			return nil, fmt.Errorf("%w: private destination %s may not be permitted: it holds every address; list the private ranges sandboxes may reach (such as 10.20.0.0/16)", ErrInvalid, p)
		}
		if c := classify(p.Addr(), nil); neverAllowed(c) {
			return nil, fmt.Errorf("%w: private destination %s may not be permitted: it is %s, never reachable", ErrInvalid, p, c)
		}
		for _, bad := range []netip.Prefix{netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("fe80::/10")} {
			if p.Overlaps(bad) {
				return nil, fmt.Errorf("%w: private destination %s may not be permitted: it overlaps link-local %s (the cloud metadata endpoint)", ErrInvalid, p, bad)
			}
		}
	}
	hosts := make(map[string][]netip.Addr, len(cfg.Hosts))
	for n, as := range cfg.Hosts {
		hosts[normName(n)] = as
	}
	cfg.Hosts = hosts
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 256
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 5 * time.Minute
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.PeekTimeout <= 0 {
		cfg.PeekTimeout = 500 * time.Millisecond
	}
	if cfg.Lookup == nil {
		cfg.Lookup = net.DefaultResolver.LookupNetIP
	}
	if cfg.Dial == nil {
		d := &net.Dialer{}
		cfg.Dial = d.DialContext
	}
	if cfg.Audit == nil {
		cfg.Audit = func(Event) {}
	}
	return &Egress{cfg: cfg, sessions: map[*Session]struct{}{}, now: time.Now, afterFunc: time.AfterFunc}, nil
}

// isOwn reports whether a is one of the host's own addresses.
func (e *Egress) isOwn(a netip.Addr) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.own == nil || time.Since(e.ownAt) > 10*time.Second {
		e.own = map[netip.Addr]bool{}
		var addrs []netip.Addr
		if e.cfg.OwnAddrs != nil {
			addrs = e.cfg.OwnAddrs()
		} else if ifas, err := net.InterfaceAddrs(); err == nil {
			for _, ifa := range ifas {
				if n, ok := ifa.(*net.IPNet); ok {
					if a, ok := netip.AddrFromSlice(n.IP); ok {
						addrs = append(addrs, a.Unmap())
					}
				}
			}
		}
		for _, a := range addrs {
			e.own[a.Unmap()] = true
		}
		e.ownAt = time.Now()
	}
	return e.own[a.Unmap()]
}

// permitted reports whether the daemon may ever dial a (for any sandbox),
// and why not.
func (e *Egress) permitted(a netip.Addr) (bool, string) {
	a = a.Unmap()
	c := classify(a, e.isOwn)
	switch {
	case c == classPublic:
		return true, ""
	case neverAllowed(c):
		return false, c + " is never reachable"
	case inAny(e.cfg.PrivateAllowed, a):
		return true, ""
	}
	return false, c + ", which the operator does not permit"
}

// Serve serves a sandbox's TUN device (the daemon's end of it, which Serve
// owns from now on) under policy p, until Close.
func (e *Egress) Serve(tun *os.File, sandbox, owner string, p Policy) (*Session, error) {
	s, err := newSession(e, tun, sandbox, owner, p)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.sessions[s] = struct{}{}
	e.mu.Unlock()
	return s, nil
}

// Sessions is the number of sandboxes being served.
func (e *Egress) Sessions() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.sessions)
}

func (e *Egress) forget(s *Session) {
	e.mu.Lock()
	delete(e.sessions, s)
	e.mu.Unlock()
}
