// Package hostname is the one check of what an allow-list's hostname
// entry may be (allow_egress_to), shared by the egress netstack
// (sandbox/egress) and the sbx backend so that a spec one accepts the
// other does not refuse. It decides syntax only; what a name may reach is
// the caller's. It imports nothing of the project.
package hostname

import (
	"errors"
	"strconv"
	"strings"
)

// MaxLen is the longest name (RFC 1035's 253 characters, no trailing dot);
// MaxLabel the longest label between dots.
const (
	MaxLen   = 253
	MaxLabel = 63
)

// Errors Parse returns; callers wrap them with their own code and words.
var (
	ErrBadPort     = errors.New("the port is not a number from 1 to 65535")
	ErrNotHostname = errors.New("not a hostname")
	ErrBareWild    = errors.New("a wildcard needs a name with a dot after *. (such as *.example.com)")
)

// Rule is the syntax in words, for error messages.
const Rule = "letters, digits, '-' and '_' in dot-separated labels of 1 to 63 (no '-' at either end), at most 253 in all, an optional leading *. and :port"

// Pattern is one parsed entry.
type Pattern struct {
	Name     string // lower case, no trailing dot; for a wildcard, the suffix after "*."
	Wildcard bool   // "*.Name": subdomains of Name only
	Port     uint16 // 0: any
}

// String is the entry in its normal form: "[*.]name[:port]".
func (p Pattern) String() string {
	s := p.Name
	if p.Wildcard {
		s = "*." + s
	}
	if p.Port != 0 {
		s += ":" + strconv.Itoa(int(p.Port))
	}
	return s
}

// Parse reads an entry: a hostname, an optional leading "*." (subdomains
// only; the rest must hold a dot) and an optional ":port". It lower-cases
// it and drops surrounding space and one trailing dot.
func Parse(raw string) (Pattern, error) {
	s := strings.ToLower(strings.TrimSpace(raw))
	var p Pattern
	if h, port, ok := strings.Cut(s, ":"); ok {
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 {
			return Pattern{}, ErrBadPort
		}
		s, p.Port = h, uint16(n)
	}
	s = strings.TrimSuffix(s, ".")
	if rest, ok := strings.CutPrefix(s, "*."); ok {
		s, p.Wildcard = rest, true
	}
	if !Valid(s) {
		return Pattern{}, ErrNotHostname
	}
	if p.Wildcard && !strings.Contains(s, ".") {
		return Pattern{}, ErrBareWild
	}
	p.Name = s
	return p, nil
}

// Valid reports whether s, lower case and without a trailing dot, is a
// hostname: labels of letters, digits, '-' and '_' ('_' for names such as
// _dmarc.example.com; never '-' first or last), 1 to MaxLabel each, at
// most MaxLen in all.
func Valid(s string) bool {
	if s == "" || len(s) > MaxLen {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || len(label) > MaxLabel || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}
