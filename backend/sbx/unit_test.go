package sbx

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/capture"
)

func TestParseLs(t *testing.T) {
	cases := []struct {
		name string
		out  string
		want []string
		bad  bool
	}{
		{"object", `{"sandboxes":[{"name":"a","agent":"shell","status":"running","workspaces":["/w"]},{"name":"b"}]}`, []string{"a", "b"}, false},
		{"empty", `{"sandboxes":[]}`, nil, false},
		{"null list", `{"sandboxes":null}`, nil, false},
		{"bare array", `[{"name":"a"}]`, []string{"a"}, false},
		{"banner first", "Starting sandboxd daemon…\n{\"sandboxes\":[{\"name\":\"a\"}]}\n", []string{"a"}, false},
		{"banner and blank lines, pretty JSON", "Starting sandboxd daemon…\r\n\n{\n  \"sandboxes\": [\n    {\"name\": \"a\"}\n  ]\n}\n", []string{"a"}, false},
		{"trailing noise", "{\"sandboxes\":[{\"name\":\"a\"}]}\nwarning: update available\n", []string{"a"}, false},
		{"unknown fields", `{"sandboxes":[{"name":"a","ports":[1,2],"extra":{"x":1}}],"version":2}`, []string{"a"}, false},
		{"nameless entries skipped", `{"sandboxes":[{"status":"running"},{"name":"b"}]}`, []string{"b"}, false},
		{"a brace in the banner", "{starting} daemon\n{\"sandboxes\":[{\"name\":\"a\"}]}", []string{"a"}, false},
		{"banner only", "Starting sandboxd daemon…\n", nil, true},
		{"nothing", "", nil, true},
		{"table", "SANDBOX  AGENT  STATUS\na  shell  running\n", nil, true},
		{"object without sandboxes", `{"error":"not logged in"}`, nil, true},
		{"truncated", `{"sandboxes":[{"name":"a"`, nil, true},
	}
	for _, tc := range cases {
		entries, err := parseLs([]byte(tc.out))
		if tc.bad {
			if err == nil {
				t.Errorf("%s: parsed %+v, want an error", tc.name, entries)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name)
		}
		if !slices.Equal(names, tc.want) {
			t.Errorf("%s: names %v, want %v", tc.name, names, tc.want)
		}
	}
}

func FuzzParseLs(f *testing.F) {
	f.Add([]byte(`{"sandboxes":[{"name":"a"}]}`))
	f.Add([]byte("Starting sandboxd daemon…\n[{\"name\":\"x\"}]"))
	f.Add([]byte("{\n[\n"))
	f.Fuzz(func(t *testing.T, out []byte) {
		entries, err := parseLs(out)
		if err != nil {
			return
		}
		for _, e := range entries {
			if e.Name == "" {
				t.Fatalf("parseLs returned a nameless entry from %q", out)
			}
		}
	})
}

func TestParseListing(t *testing.T) {
	got, err := parseListing([]byte("fb\x00dsub\x00fwith\nnewline\x00f.dot\x00"))
	want := []backend.DirEntry{{Name: ".dot"}, {Name: "b"}, {Name: "sub", IsDir: true}, {Name: "with\nnewline"}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("parseListing = %+v, %v; want %+v", got, err, want)
	}
	if got, err := parseListing(nil); err != nil || len(got) != 0 {
		t.Errorf("empty listing: %+v, %v", got, err)
	}
	for _, bad := range []string{"fa", "xname\x00", "d\x00", "\x00"} {
		if _, err := parseListing([]byte(bad)); err == nil {
			t.Errorf("parseListing(%q) succeeded", bad)
		}
	}
}

func FuzzParseListing(f *testing.F) {
	f.Add([]byte("fa\x00dsub\x00"))
	f.Fuzz(func(t *testing.T, out []byte) {
		entries, err := parseListing(out)
		if err != nil {
			return
		}
		if !slices.IsSortedFunc(entries, func(a, b backend.DirEntry) int { return strings.Compare(a.Name, b.Name) }) {
			t.Fatalf("not sorted: %+v", entries)
		}
		for _, e := range entries {
			if e.Name == "" {
				t.Fatalf("empty name from %q", out)
			}
		}
	})
}

func TestNetworkFor(t *testing.T) {
	yes, no := boolPtr(true), boolPtr(false)
	hosts := []string{"pypi.org"}
	cases := []struct {
		policy HostPolicy
		spec   backend.Spec
		want   string // network, or "" for a refusal
		deny   bool   // sbx create --deny-network "**"
	}{
		{PolicyDenyAll, backend.Spec{}, networkNone, true},
		{PolicyDenyAll, backend.Spec{BlockNetwork: yes}, networkNone, true},
		{PolicyDenyAll, backend.Spec{BlockNetwork: no}, "", false},
		{PolicyDenyAll, backend.Spec{AllowEgressTo: hosts}, networkAllowList, false},
		{PolicyDenyAll, backend.Spec{AllowEgressTo: hosts, BlockNetwork: yes}, networkAllowList, false},
		{PolicyDenyAll, backend.Spec{AllowEgressTo: hosts, BlockNetwork: no}, networkAllowList, false},
		{PolicyDenyAll, backend.Spec{AllowEgressToCIDRs: []string{"10.0.0.0/8"}}, "", false},
		{PolicyAllowAll, backend.Spec{}, networkOpen, false},
		{PolicyAllowAll, backend.Spec{BlockNetwork: no}, networkOpen, false},
		{PolicyAllowAll, backend.Spec{BlockNetwork: yes}, networkNone, true},
		{PolicyAllowAll, backend.Spec{AllowEgressTo: hosts}, "", false},
		{PolicyAllowAll, backend.Spec{AllowEgressToCIDRs: []string{"10.0.0.0/8"}}, "", false},
		{PolicyUnknown, backend.Spec{}, networkUnknown, false},
		{PolicyUnknown, backend.Spec{BlockNetwork: yes}, networkNone, true},
		{PolicyUnknown, backend.Spec{BlockNetwork: no}, "", false},
		{PolicyUnknown, backend.Spec{AllowEgressTo: hosts}, "", false},
	}
	for _, tc := range cases {
		got, err := networkFor(tc.policy, tc.spec)
		switch {
		case tc.want == "" && !errors.Is(err, backend.ErrSpecUnenforceable):
			t.Errorf("%s %+v: %+v, %v; want ErrSpecUnenforceable", tc.policy, tc.spec, got, err)
		case tc.want != "" && (err != nil || got.network != tc.want || got.deny != tc.deny):
			t.Errorf("%s %+v: %+v, %v; want %q, deny %v", tc.policy, tc.spec, got, err, tc.want, tc.deny)
		}
	}
}

// Ours "*.x" is every subdomain at any depth; sbx's "*." is one level and
// "**." any depth.
func TestSbxPatterns(t *testing.T) {
	got := sbxPatterns([]string{"*.npmjs.org", "pypi.org", "*.example.com:8443", "api.example.com:443"})
	want := []string{"**.npmjs.org", "pypi.org", "**.example.com:8443", "api.example.com:443"}
	if !slices.Equal(got, want) {
		t.Errorf("sbxPatterns = %q, want %q", got, want)
	}
	if got := policyProbe("*.example.com:8443"); got != "sidecar-check.sub.example.com:8443" {
		t.Errorf("policyProbe = %q", got)
	}
}

func TestListedRules(t *testing.T) {
	cases := []struct {
		out  string
		want []string
		ok   bool
	}{
		{`{"policies":[]}`, nil, true},
		{`[]`, nil, true},
		{`{"governance":"Managed by acme","policies":[{"decision":"allow","resources":["api.openai.com","**.npmjs.org"]}]}`, []string{"**.npmjs.org", "api.openai.com"}, true},
		{`[{"name":"kit","resource":"x.org"},{"name":"other"}]`, []string{"x.org", "?"}, true},
		{"Starting sandboxd…\n{\"rules\":[{\"Resources\":\"a.org\"}]}", []string{"a.org"}, true},
		{"No policies found.", nil, false},
		{`"text"`, nil, false},
	}
	for _, tc := range cases {
		got, ok := listedRules([]byte(tc.out))
		if ok != tc.ok || !slices.Equal(got, tc.want) {
			t.Errorf("listedRules(%q) = %q, %v; want %q, %v", tc.out, got, ok, tc.want, tc.ok)
		}
	}
}

func TestCheckEgressHosts(t *testing.T) {
	// The egress netstack's syntax (internal/hostname): '_' in a label,
	// a trailing dot and upper case are taken and normalised; a label that
	// ends in '-', a port outside 1 to 65535 and a wildcard over a bare
	// label are not (this copy's own regexp took the '-' and the ports and
	// refused the '_').
	got, err := checkEgressHosts([]string{"PyPI.org", "*.npmjs.org", "api.example.com:443", "pypi.org.", "localhost", "_dmarc.Example.com"})
	want := []string{"*.npmjs.org", "_dmarc.example.com", "api.example.com:443", "localhost", "pypi.org"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("checkEgressHosts = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"", "a,b", "-flag", "**", "a b", "a..b", "host:99999999", "http://x.org", "*", "a/b", strings.Repeat("a", 64) + ".org", "a-.example.com", "a.com:0", "a.com:70000", "*.com"} {
		if _, err := checkEgressHosts([]string{bad}); !errors.Is(err, backend.ErrInvalidArgument) {
			t.Errorf("checkEgressHosts(%q) = %v, want ErrInvalidArgument", bad, err)
		}
	}
	if _, err := checkEgressHosts(make([]string, maxEgressHosts+1)); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("too many hosts: %v", err)
	}
}

func TestParseMemory(t *testing.T) {
	cases := []struct {
		in    string
		flag  string
		bytes int64
	}{
		{"2g", "2g", 2 << 30},
		{"2G", "2g", 2 << 30},
		{"2GiB", "2g", 2 << 30},
		{"1536m", "1536m", 1536 << 20},
		{"1048576k", "1048576k", 1 << 30},
		{"1073741824", "1073741824b", 1 << 30},
		{" 4g ", "4g", 4 << 30},
	}
	for _, tc := range cases {
		flag, n, err := parseMemory(tc.in)
		if err != nil || flag != tc.flag || n != tc.bytes {
			t.Errorf("parseMemory(%q) = %q, %d, %v; want %q, %d", tc.in, flag, n, err, tc.flag, tc.bytes)
		}
	}
	for _, bad := range []string{"", "g", "1.5g", "-1g", "2x", "2 g", "99999999999999t"} {
		if _, _, err := parseMemory(bad); err == nil {
			t.Errorf("parseMemory(%q) succeeded", bad)
		}
	}
}

func TestLooksLikeMissingSandbox(t *testing.T) {
	cases := []struct {
		res  capture.Result
		want bool
	}{
		{capture.Result{ExitCode: 1, Stderr: []byte("Error: sandbox x not found")}, true},
		{capture.Result{ExitCode: 1}, true},
		{capture.Result{ExitCode: 125}, true},
		{capture.Result{ExitCode: 1, Stdout: []byte("out"), StdoutTotal: 3}, false},
		{capture.Result{ExitCode: 0}, false},
		{capture.Result{ExitCode: 2}, false},
		{capture.Result{ExitCode: 127}, false},
	}
	for _, tc := range cases {
		if got := looksLikeMissingSandbox(tc.res); got != tc.want {
			t.Errorf("looksLikeMissingSandbox(exit %d, stdout %q) = %v, want %v", tc.res.ExitCode, tc.res.Stdout, got, tc.want)
		}
	}
}

func TestGuestPath(t *testing.T) {
	const wd = "/var/lib/sidecar/sbx/sc-1/workspace"
	cases := []struct {
		in, want string
	}{
		{"a.txt", wd + "/a.txt"},
		{".", wd},
		{"sub/../b", wd + "/b"},
		{wd + "/x", wd + "/x"},
		{wd, wd},
		{"/tmp", "/tmp"},
		{"/tmp/x/../y", "/tmp/y"},
		{"/tmp//z", "/tmp/z"},
	}
	for _, tc := range cases {
		if got, err := guestPath(wd, tc.in); err != nil || got != tc.want {
			t.Errorf("guestPath(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "..", "../x", "/etc/passwd", "/", "/tmpx", wd + "x", wd + "/../x", "a\x00b", strings.Repeat("a", backend.MaxGuestPathLen+1)} {
		if _, err := guestPath(wd, bad); !errors.Is(err, backend.ErrBadPath) {
			t.Errorf("guestPath(%q) = %v, want ErrBadPath", bad, err)
		}
	}
}

func TestNamesCarryTheMarker(t *testing.T) {
	b := &Backend{cfg: Config{Marker: "sc0123456789"}}
	id := "sc-0123456789abcdef"
	name := b.sbxName(id)
	if got, ok := b.idFromName(name); !ok || got != id {
		t.Errorf("idFromName(%q) = %q, %v", name, got, ok)
	}
	for _, foreign := range []string{"airflow-sandbox-0123456789ab", "other-sc-1", "sc0123456789", "sc0123456789-", "sc0123456789-UPPER", "sc0123456789x-sc-1", "shell-workspace"} {
		if id, ok := b.idFromName(foreign); ok {
			t.Errorf("idFromName(%q) claimed it as %q", foreign, id)
		}
	}
	if DefaultMarker("/var/lib/a") == DefaultMarker("/var/lib/b") || DefaultMarker("/x/") != DefaultMarker("/x") {
		t.Errorf("DefaultMarker is not one per state directory")
	}
	if m := DefaultMarker("/var/lib/sandbox-sidecar/sbx"); !validMarker.MatchString(m) {
		t.Errorf("DefaultMarker %q is not a valid marker", m)
	}
}

func TestMergeEnv(t *testing.T) {
	env, err := mergeEnv(map[string]string{"A": "spec", "B": "spec"}, map[string]string{"B": "req"})
	if err != nil || !slices.Equal(env, []string{"A=spec", "B=req"}) {
		t.Errorf("mergeEnv = %v, %v", env, err)
	}
}

// sbx resolves only references that name their registry; a Docker Hub
// short name is refused at start with the fully qualified form to write.
func TestTemplatesAreFullyQualified(t *testing.T) {
	for _, ok := range []string{DefaultTemplate, "docker.io/library/python:3.12-slim", "ghcr.io/acme/agent:1", "localhost/agent:1", "registry:5000/agent", "docker.io/docker/sandbox-templates:shell@sha256:" + strings.Repeat("a", 64)} {
		if err := checkTemplate(ok); err != nil {
			t.Errorf("checkTemplate(%q) = %v", ok, err)
		}
	}
	for bad, hint := range map[string]string{
		"python:3.12-slim":               "docker.io/library/python:3.12-slim",
		"ubuntu":                         "docker.io/library/ubuntu",
		"docker/sandbox-templates:shell": "docker.io/docker/sandbox-templates:shell",
		"acme/agent:1":                   "fully qualified",
		"--privileged":                   "not an image reference",
		"host":                           "not an image reference",
		"a b":                            "not an image reference",
	} {
		if err := checkTemplate(bad); err == nil || !strings.Contains(err.Error(), hint) {
			t.Errorf("checkTemplate(%q) = %v; want an error saying %q", bad, err, hint)
		}
	}
}
