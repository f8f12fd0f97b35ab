package hostname

import (
	"errors"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	long63 := strings.Repeat("a", 63)
	name253 := strings.Repeat(long63+".", 3) + strings.Repeat("b", 61) // 3*64 + 61 = 253
	cases := []struct {
		in   string
		want Pattern // zero: an error
		err  error
	}{
		{in: "pypi.org", want: Pattern{Name: "pypi.org"}},
		{in: "  PyPI.Org.  ", want: Pattern{Name: "pypi.org"}},
		{in: "localhost", want: Pattern{Name: "localhost"}},
		{in: "_dmarc.example.com", want: Pattern{Name: "_dmarc.example.com"}},
		{in: "a_b.example.com", want: Pattern{Name: "a_b.example.com"}},
		{in: "x-1.example.com", want: Pattern{Name: "x-1.example.com"}},
		{in: "*.npmjs.org", want: Pattern{Name: "npmjs.org", Wildcard: true}},
		{in: "api.example.com:443", want: Pattern{Name: "api.example.com", Port: 443}},
		{in: "*.example.com:8443", want: Pattern{Name: "example.com", Wildcard: true, Port: 8443}},
		{in: "a.com:65535", want: Pattern{Name: "a.com", Port: 65535}},
		{in: "1.2.3.4", want: Pattern{Name: "1.2.3.4"}}, // syntax only: the egress policy refuses addresses itself
		{in: long63 + ".org", want: Pattern{Name: long63 + ".org"}},
		{in: name253, want: Pattern{Name: name253}},

		{in: "", err: ErrNotHostname},
		{in: ".", err: ErrNotHostname},
		{in: "a..b", err: ErrNotHostname},
		{in: ".a.com", err: ErrNotHostname},
		{in: "a b", err: ErrNotHostname},
		{in: "a,b", err: ErrNotHostname},
		{in: "a/b", err: ErrNotHostname},
		{in: "http://x.org", err: ErrBadPort},
		{in: "-flag", err: ErrNotHostname},
		{in: "a-.example.com", err: ErrNotHostname},
		{in: "ex\u00e4mple.com", err: ErrNotHostname},
		{in: "*", err: ErrNotHostname},
		{in: "**", err: ErrNotHostname},
		{in: "*.", err: ErrNotHostname},
		{in: "a.*.com", err: ErrNotHostname},
		{in: "*.com", err: ErrBareWild},
		{in: strings.Repeat("a", 64) + ".org", err: ErrNotHostname},
		{in: name253 + "b", err: ErrNotHostname},
		{in: "a.com:0", err: ErrBadPort},
		{in: "a.com:65536", err: ErrBadPort},
		{in: "host:99999999", err: ErrBadPort},
		{in: "a.com:x", err: ErrBadPort},
		{in: "a.com:", err: ErrBadPort},
		{in: "a.com:1:2", err: ErrBadPort},
	}
	for _, c := range cases {
		got, err := Parse(c.in)
		switch {
		case c.err != nil && !errors.Is(err, c.err):
			t.Errorf("Parse(%q) = %+v, %v; want %v", c.in, got, err, c.err)
		case c.err == nil && (err != nil || got != c.want):
			t.Errorf("Parse(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
}

func TestPatternString(t *testing.T) {
	for in, want := range map[string]string{"PyPI.org.": "pypi.org", "*.Example.com:443": "*.example.com:443", "_x.test:53": "_x.test:53"} {
		p, err := Parse(in)
		if err != nil || p.String() != want {
			t.Errorf("Parse(%q).String() = %q, %v; want %q", in, p.String(), err, want)
		}
		if q, err := Parse(p.String()); err != nil || q != p {
			t.Errorf("%q does not parse back: %+v, %v", p.String(), q, err)
		}
	}
}
