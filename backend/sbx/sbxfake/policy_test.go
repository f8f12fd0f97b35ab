package main

import "testing"

// sbx's host patterns (docs.docker.com ai/governance/concepts, rule
// syntax): "*." is one level of subdomain, "**." any depth, neither the
// name itself; "**" everything; ":port" one port (bare hosts are 443).
func TestMatches(t *testing.T) {
	cases := []struct {
		pattern, host string
		port          int
		want          bool
	}{
		{"example.com", "example.com", 443, true},
		{"example.com", "api.example.com", 443, false},
		{"*.example.com", "api.example.com", 443, true},
		{"*.example.com", "v2.api.example.com", 443, false},
		{"*.example.com", "example.com", 443, false},
		{"**.example.com", "v2.api.example.com", 443, true},
		{"**.example.com", "api.example.com", 80, true},
		{"**.example.com", "example.com", 443, false},
		{"**.example.com", "badexample.com", 443, false},
		{"**", "anything.org", 22, true},
		{"example.com:443", "example.com", 443, true},
		{"example.com:443", "example.com", 80, false},
	}
	for _, tc := range cases {
		if got := matches(tc.pattern, tc.host, tc.port); got != tc.want {
			t.Errorf("matches(%q, %q, %d) = %v, want %v", tc.pattern, tc.host, tc.port, got, tc.want)
		}
	}
	for _, ok := range []string{"**", "**.example.com", "*.example.com", "example.com:8443", "_dmarc.example.com"} {
		if err := checkPattern(ok); err != nil {
			t.Errorf("checkPattern(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "*", "a..b", "example.com:0", "exa mple.com", "-a.com"} {
		if err := checkPattern(bad); err == nil {
			t.Errorf("checkPattern(%q) accepted it", bad)
		}
	}
}

func TestOlderThan(t *testing.T) {
	for v, want := range map[string]bool{"v0.41.9": true, "v0.42.0": false, "0.55.0": false, "v1.0.0": false, "nonsense": true} {
		if got := olderThan(v, 0, 42); got != want {
			t.Errorf("olderThan(%q, 0.42) = %v, want %v", v, got, want)
		}
	}
}
