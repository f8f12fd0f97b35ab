package e2e

import (
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress/egresstest"
)

// TestGVisorEgressThroughTheDaemon: a daemon on the gvisor backend with
// [egress] on gives a create naming one host network "allowlist"; inside
// gVisor its programs reach that host (a server on the host's loopback,
// which the test's config maps the name to and permits) and nothing else,
// with an audit line per connection naming the owner; a sandbox without
// lists has no network. After kill -9 of the daemon nothing of its runsc
// sandboxes is left, and the re-adopted sandbox's next command runs in a
// new namespace under the same lists.
func TestGVisorEgressThroughTheDaemon(t *testing.T) {
	runsc := testRunsc(t)
	if why := egresstest.Missing(); why != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: %s", why)
		}
		t.Skip(why)
	}
	srv := egresstest.StartServers(t)
	base := baseDir(t)
	conf := egressConfig(t, base)
	d := startDaemon(t, base, "--config", conf, "--backend", "gvisor", "--gvisor-runsc-path", runsc)
	c := d.client(t)
	res := call(t, c, ipc.OpCreate, map[string]any{"spec": map[string]any{"owner": "dag/gvisor-egress", "allow_egress_to": []string{"allowed.test"}}, "ttl_s": 600})
	assert.Equal(t, "allowlist", res["network"])
	id := res["sandbox"].(string)
	url := "http://allowed.test:" + srv.HTTPPort + "/"
	want := "hello allowed.test:" + srv.HTTPPort
	out := run(t, c, id, "uname -r; curl -sS --max-time 20 "+url)
	host, err := os.ReadFile("/proc/sys/kernel/osrelease")
	require.NoError(t, err)
	kernel, body, _ := strings.Cut(string(out.Stdout), "\n")
	assert.NotEqual(t, strings.TrimSpace(string(host)), kernel, "the guest's kernel is gVisor's, not the host's: %s", out.Stderr)
	assert.NotEmpty(t, kernel, "uname -r printed nothing: %s", out.Stderr)
	assert.Equal(t, want, body, "the allowed host answers: %s", out.Stderr)
	out = run(t, c, id, "curl -sS --max-time 20 http://other.test:"+srv.HTTPPort+"/")
	assert.NotEqual(t, 0, out.ExitCode, "other.test is not on the list: %s", out.Stdout)
	out = run(t, c, id, "curl -sS --max-time 10 http://169.254.169.254/")
	assert.NotEqual(t, 0, out.ExitCode, "the metadata address: %s", out.Stdout)

	none := create(t, c, map[string]any{"ttl_s": 600})
	out = run(t, c, none, `tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '`)
	assert.Equal(t, "lo\n", string(out.Stdout), "a sandbox without lists")

	checkEgressAudit(t, d.Logs(), id, "dag/gvisor-egress")

	// kill -9: the TUN device and the namespace go with the daemon, so the
	// restarted one removes the allowlist sandbox's gVisor sandbox (it
	// boots again at its next command); the other's outlives the daemon.
	c.Close()
	d.kill9()
	d.restart()
	assert.ElementsMatch(t, []string{id, none}, listed(t, d))
	dirs, inRunsc, procs := gvisorState(t, runsc, d.stateDir)
	assert.ElementsMatch(t, []string{id, none}, dirs)
	assert.Equal(t, []string{none}, inRunsc, "runsc lists the allowlist sandbox's gVisor sandbox of the dead daemon")
	assert.Equal(t, []string{none}, slices.Collect(maps.Keys(procs)), "runsc processes of the allowlist sandbox survive the daemon that served its network")
	c = d.client(t)
	out = run(t, c, id, "curl -sS --max-time 20 "+url+"; curl -sS --max-time 20 http://other.test:"+srv.HTTPPort+"/ || echo refused")
	assert.Equal(t, want+"refused\n", string(out.Stdout), "the re-adopted sandbox: %s", out.Stderr)
	out = run(t, c, none, `tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '`)
	assert.Equal(t, "lo\n", string(out.Stdout), "the re-adopted sandbox without lists")
	if t.Failed() {
		t.Logf("daemon log:\n%s", d.Logs())
	}
}
