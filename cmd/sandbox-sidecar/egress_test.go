package main

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress"
)

// TestEgressAuditLines holds the egress audit lines to what
// docs/operations.md (Egress, the audit lines) says: a connection's line
// has exactly the keys it always had; a DNS line names the resolver's
// address and port 53, its transport, the query's type, the reply's code
// and the addresses handed out and withheld (lists, never absent), and no
// byte counts; a refused DNS-over-TCP connection has no query fields.
func TestEgressAuditLines(t *testing.T) {
	var buf bytes.Buffer
	log := hclog.New(&hclog.LoggerOptions{JSONFormat: true, Output: &buf})
	var a egressAudit
	emit := a.event(log)
	lines := func() []map[string]any {
		var out []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			m := map[string]any{}
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("%v: %s", err, l)
			}
			for _, k := range []string{"@level", "@message", "@timestamp"} {
				delete(m, k)
			}
			out = append(out, m)
		}
		buf.Reset()
		return out
	}
	keys := func(m map[string]any) []string {
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		return ks
	}
	common := []string{"allowed", "name", "op", "owner", "proto", "reason", "sandbox", "uid"}
	withKeys := func(extra ...string) []string {
		return slices.Sorted(slices.Values(append(slices.Clone(common), extra...)))
	}

	emit(egress.Event{Sandbox: "sb", Owner: "o", Proto: "tcp", Name: "allowed.test", Addr: netip.MustParseAddr("127.0.0.1"), Port: 8080,
		Allowed: true, Reason: "handed out for an allowed name", BytesOut: 10, BytesIn: 20, Duration: 3 * time.Millisecond})
	tcp := lines()[0]
	if got, want := keys(tcp), withKeys("addr", "port", "bytes_out", "bytes_in", "duration_ms"); !slices.Equal(got, want) {
		t.Errorf("a connection's line has keys %v, want %v", got, want)
	}
	if tcp["addr"] != "127.0.0.1" || tcp["port"] != 8080.0 || tcp["bytes_in"] != 20.0 || tcp["duration_ms"] != 3.0 {
		t.Errorf("a connection's line: %v", tcp)
	}

	emit(egress.Event{Sandbox: "sb", Proto: "dns", Name: "mixed.test", Addr: egress.ResolverAddr4, Port: 53, Allowed: true, Reason: "answered",
		Transport: "udp", QType: "A", RCode: "NOERROR", Answers: []netip.Addr{netip.MustParseAddr("100.127.0.1")},
		Withheld: []egress.Withheld{{Addr: netip.MustParseAddr("10.0.0.5"), Reason: "a private or reserved address, which the operator does not permit"}}})
	emit(egress.Event{Sandbox: "sb", Proto: "dns", Name: "other.test", Addr: egress.ResolverAddr6, Port: 53, Reason: "name not allowed: NXDOMAIN",
		Transport: "tcp", QType: "AAAA", RCode: "NXDOMAIN"})
	emit(egress.Event{Sandbox: "sb", Proto: "dns", Addr: egress.ResolverAddr4, Port: 53, Reason: "DNS over TCP: more than 4 connections at once", Transport: "tcp"})
	dns := lines()
	query := withKeys("addr", "port", "transport", "qtype", "rcode", "answers", "withheld")
	for i, want := range [][]string{query, query, withKeys("addr", "port", "transport")} {
		if got := keys(dns[i]); !slices.Equal(got, want) {
			t.Errorf("DNS line %d has keys %v, want %v", i, got, want)
		}
	}
	if l := dns[0]; l["addr"] != "100.100.0.1" || l["port"] != 53.0 || l["transport"] != "udp" || l["qtype"] != "A" || l["rcode"] != "NOERROR" ||
		!slices.Equal(strs(l["answers"]), []string{"100.127.0.1"}) ||
		!slices.Equal(strs(l["withheld"]), []string{"10.0.0.5 (a private or reserved address, which the operator does not permit)"}) {
		t.Errorf("an answered query's line: %v", l)
	}
	if l := dns[1]; l["addr"] != "fd00:5b5b::1" || l["transport"] != "tcp" || l["rcode"] != "NXDOMAIN" || l["answers"] == nil || len(strs(l["answers"])) != 0 || len(strs(l["withheld"])) != 0 {
		t.Errorf("an NXDOMAIN's line: %v", l)
	}

	// The summary of lines past a sandbox's audit budget: how many, over
	// how long; no destination, no byte counts.
	emit(egress.Event{Sandbox: "sb", Proto: "suppressed", Suppressed: 51, Duration: 50 * time.Millisecond,
		Reason: "51 audit lines of this sandbox not written (50 of them refusals, all enforced): past its budget of 200 lines at once and 20 a second"})
	sum := lines()[0]
	if got, want := keys(sum), withKeys("suppressed", "duration_ms"); !slices.Equal(got, want) {
		t.Errorf("a summary line has keys %v, want %v", got, want)
	}
	if sum["suppressed"] != 51.0 || sum["duration_ms"] != 50.0 || sum["allowed"] != false || sum["proto"] != "suppressed" {
		t.Errorf("a summary line: %v", sum)
	}
}

func strs(v any) []string {
	l, _ := v.([]any)
	out := []string{}
	for _, x := range l {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}
