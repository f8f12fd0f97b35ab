package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/sandbox-sidecar/sandbox-sidecar/internal/hostname"
)

// MaxEntries bounds each of a policy's lists.
const MaxEntries = 64

// ErrInvalid marks a policy or configuration that cannot be used as given.
var ErrInvalid = errors.New("invalid egress policy")

// Policy is what one sandbox may reach: hostnames (an optional leading
// "*." for subdomains only, an optional ":port") and CIDRs (IPv4 or IPv6).
type Policy struct {
	names []namePattern
	cidrs []netip.Prefix
}

type namePattern struct {
	name     string // lower case, no trailing dot; for a wildcard, the suffix without "*."
	wildcard bool
	port     uint16 // 0: any
}

// ParsePolicy checks and normalises a spec's allow_egress_to and
// allow_egress_to_cidrs.
func ParsePolicy(names, cidrs []string) (Policy, error) {
	var p Policy
	if len(names) > MaxEntries || len(cidrs) > MaxEntries {
		return p, fmt.Errorf("%w: at most %d hostnames and %d CIDRs", ErrInvalid, MaxEntries, MaxEntries)
	}
	for _, n := range names {
		pat, err := parseName(n)
		if err != nil {
			return Policy{}, err
		}
		p.names = append(p.names, pat)
	}
	for _, c := range cidrs {
		pfx, err := netip.ParsePrefix(strings.TrimSpace(c))
		if err != nil {
			// A bare address is a /32 or /128.
			a, aerr := netip.ParseAddr(strings.TrimSpace(c))
			if aerr != nil {
				return Policy{}, fmt.Errorf("%w: allow_egress_to_cidrs entry %q is not a CIDR such as 192.0.2.0/24 or 2001:db8::/32", ErrInvalid, short(c))
			}
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
		if pfx.Addr().Is4In6() {
			return Policy{}, fmt.Errorf("%w: allow_egress_to_cidrs entry %q is an IPv4-mapped IPv6 prefix; write it as IPv4", ErrInvalid, short(c))
		}
		p.cidrs = append(p.cidrs, pfx.Masked())
	}
	return p, nil
}

func parseName(raw string) (namePattern, error) {
	hp, err := hostname.Parse(raw)
	switch {
	case errors.Is(err, hostname.ErrBadPort):
		return namePattern{}, fmt.Errorf("%w: allow_egress_to entry %q has a bad port (1 to 65535)", ErrInvalid, short(raw))
	case errors.Is(err, hostname.ErrBareWild):
		return namePattern{}, fmt.Errorf("%w: allow_egress_to entry %q: %v", ErrInvalid, short(raw), err)
	case err != nil:
		return namePattern{}, fmt.Errorf("%w: allow_egress_to entry %q is not a hostname (%s)", ErrInvalid, short(raw), hostname.Rule)
	}
	if _, err := netip.ParseAddr(hp.Name); err == nil {
		return namePattern{}, fmt.Errorf("%w: allow_egress_to entry %q is not a hostname; list addresses in allow_egress_to_cidrs", ErrInvalid, short(raw))
	}
	return namePattern{name: hp.Name, wildcard: hp.Wildcard, port: hp.Port}, nil
}

// normName lower-cases a name and drops its trailing dot.
func normName(n string) string { return strings.TrimSuffix(strings.ToLower(n), ".") }

// AllowsName reports whether name may be resolved (any port).
func (p Policy) AllowsName(name string) bool { return p.allowsNamePort(name, 0) }

// allowsNamePort reports whether name matches an entry whose port is port
// or any (port 0 asks about any entry at all).
func (p Policy) allowsNamePort(name string, port uint16) bool {
	name = normName(name)
	for _, pat := range p.names {
		if port != 0 && pat.port != 0 && pat.port != port {
			continue
		}
		if pat.wildcard {
			if strings.HasSuffix(name, "."+pat.name) {
				return true
			}
		} else if name == pat.name {
			return true
		}
	}
	return false
}

// AllowsCIDR reports whether a is inside an allowed CIDR.
func (p Policy) AllowsCIDR(a netip.Addr) bool {
	a = a.Unmap()
	for _, c := range p.cidrs {
		if c.Contains(a) {
			return true
		}
	}
	return false
}

// Empty reports whether the policy names nothing.
func (p Policy) Empty() bool { return len(p.names) == 0 && len(p.cidrs) == 0 }

// Address classes a destination can fall into; "" is a public address.
// Each is a noun phrase with its article: the reasons of audit lines and
// errors are made of them ("an unspecified address is never reachable").
const (
	classPublic      = ""
	classUnspecified = "an unspecified address"
	classMulticast   = "a multicast or broadcast address"
	classLinkLocal   = "a link-local address (the cloud metadata endpoint lives there)"
	classNAT64       = "a NAT64 address (could reach any IPv4 address)"
	classLoopback    = "a loopback address"
	classHost        = "one of the host's own addresses"
	classPrivate     = "a private or reserved address"
)

var (
	reserved = []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/8"),
		netip.MustParsePrefix("100.64.0.0/10"), // carrier-grade NAT
		netip.MustParsePrefix("192.0.0.0/24"),
		netip.MustParsePrefix("192.0.2.0/24"),
		netip.MustParsePrefix("198.18.0.0/15"),
		netip.MustParsePrefix("198.51.100.0/24"),
		netip.MustParsePrefix("203.0.113.0/24"),
		netip.MustParsePrefix("240.0.0.0/4"),
		netip.MustParsePrefix("2001:db8::/32"),
		netip.MustParsePrefix("100::/64"),
	}
	nat64 = []netip.Prefix{
		netip.MustParsePrefix("64:ff9b::/96"),
		netip.MustParsePrefix("64:ff9b:1::/48"),
		netip.MustParsePrefix("2002::/16"), // 6to4 embeds an IPv4 address too
	}
	metadataV6 = netip.MustParseAddr("fd00:ec2::254")
)

// classify says what kind of destination a is; own reports the host's own
// addresses.
func classify(a netip.Addr, own func(netip.Addr) bool) string {
	a = a.Unmap()
	switch {
	case !a.IsValid() || a.IsUnspecified():
		return classUnspecified
	case a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return classMulticast
	case a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a == metadataV6:
		return classLinkLocal
	case inAny(nat64, a):
		return classNAT64
	case a.IsLoopback():
		return classLoopback
	case own != nil && own(a):
		return classHost
	case a.IsPrivate() || inAny(reserved, a):
		return classPrivate
	}
	return classPublic
}

// neverAllowed are the classes no configuration opens.
func neverAllowed(class string) bool {
	return class == classUnspecified || class == classMulticast || class == classLinkLocal || class == classNAT64
}

func inAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func short(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
