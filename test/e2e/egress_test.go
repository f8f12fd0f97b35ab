package e2e

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/metrics/metricstest"
)

// TestEgressAllowlistThroughTheDaemon: with [egress] on, a create naming one
// host reports network "allowlist", its programs reach that host (a server
// on the host's loopback, which the test's config maps the name to and
// permits) and nothing else, and the audit trail has a line per connection
// with the sandbox's owner.
// egressConfig writes the daemon's configuration both egress tests use:
// egress on, the loopback range permitted, allowed.test on 127.0.0.1 and
// other.test on 127.0.0.2 (never in a sandbox's list). It returns its path.
func egressConfig(t *testing.T, base string) string {
	t.Helper()
	conf := filepath.Join(base, "config.toml")
	require.NoError(t, os.WriteFile(conf, []byte(`[egress]
enabled = true
private_allowed = ["127.0.0.0/8"]
[egress.hosts]
"allowed.test" = ["127.0.0.1"]
"other.test" = ["127.0.0.2"]
`), 0o644))
	return conf
}

func TestEgressAllowlistThroughTheDaemon(t *testing.T) {
	requireHost(t)
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: egress needs /dev/net/tun: %v", err)
		}
		t.Skip("no /dev/net/tun")
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello ", r.Host) }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	base := baseDir(t)
	conf := egressConfig(t, base)
	d := startDaemon(t, base, "--config", conf, "--metrics-listen", "127.0.0.1:0")
	c := d.client(t)
	res := call(t, c, ipc.OpCreate, map[string]any{"spec": map[string]any{"owner": "dag/egress", "allow_egress_to": []string{"allowed.test"}}, "ttl_s": 600})
	assert.Equal(t, "allowlist", res["network"])
	id := res["sandbox"].(string)
	out := run(t, c, id, "curl -sS --max-time 20 http://allowed.test:"+port+"/")
	assert.Equal(t, "hello allowed.test:"+port, string(out.Stdout), "%s", out.Stderr)
	out = run(t, c, id, "curl -sS --max-time 20 http://other.test:"+port+"/")
	assert.NotEqual(t, 0, out.ExitCode, "other.test is not on the list: %s", out.Stdout)
	out = run(t, c, id, "curl -sS --max-time 10 http://169.254.169.254/")
	assert.NotEqual(t, 0, out.ExitCode, "the metadata address: %s", out.Stdout)

	// A sandbox without lists on the same daemon has no network.
	none := create(t, c, nil)
	out = run(t, c, none, `tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '`)
	assert.Equal(t, "lo\n", string(out.Stdout))

	// The refused metadata connection is counted where an operator's
	// dashboard reads it.
	addr := d.metricsAddr()
	require.NotEmpty(t, addr, "the daemon says where it serves metrics")
	refused, ok := metricstest.Value(metricstest.Scrape(t, addr), "sandbox_sidecar_egress_refusals_total")
	assert.True(t, ok && refused >= 1, "sandbox_sidecar_egress_refusals_total = %v (%v), want at least the metadata connect", refused, ok)

	logs := d.Logs()
	checkEgressAudit(t, logs, id, "dag/egress")
	assert.Contains(t, logs, `"name":"other.test"`, "the NXDOMAIN is audited")

	// A restart ends the init and its namespace; the adopted sandbox's next
	// command gets a new one under the same lists.
	d.stop()
	d.restart()
	c = d.client(t)
	out = run(t, c, id, "curl -sS --max-time 20 http://allowed.test:"+port+"/; curl -sS --max-time 20 http://other.test:"+port+"/ || echo refused")
	assert.Equal(t, "hello allowed.test:"+port+"refused\n", string(out.Stdout), "%s", out.Stderr)
}

// TestEgressOffRefusesLists: the default daemon still refuses the lists,
// saying how to turn egress on.
func TestEgressOffRefusesLists(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	e := callErr(t, c, ipc.OpCreate, map[string]any{"spec": map[string]any{"allow_egress_to": []string{"pypi.org"}}})
	assert.Equal(t, ipc.CodeSpecUnenforceable, e.Code)
	assert.Contains(t, e.Message, "egress filtering is not enabled")
}

// checkEgressAudit checks the daemon's audit lines for sandbox id's
// egress: every one names its owner, and of its TCP connections exactly
// one was allowed (to allowed.test) and one refused (the metadata
// address).
func checkEgressAudit(t *testing.T, logs, id, owner string) {
	t.Helper()
	var allowed, refused int
	for _, l := range strings.Split(logs, "\n") {
		if !strings.Contains(l, `"op":"egress"`) || !strings.Contains(l, `"sandbox":"`+id+`"`) {
			continue
		}
		assert.Contains(t, l, `"owner":"`+owner+`"`)
		if !strings.Contains(l, `"proto":"tcp"`) {
			continue
		}
		if strings.Contains(l, `"allowed":true`) {
			allowed++
			assert.Contains(t, l, `"name":"allowed.test"`)
		} else {
			refused++
		}
	}
	assert.Equal(t, 1, allowed, "allowed connections in the audit trail")
	assert.Equal(t, 1, refused, "refused connections in the audit trail (the metadata address)")
}
