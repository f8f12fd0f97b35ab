package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/test/internal/testdaemon"
)

// startSbxDaemon runs the daemon with the sbx backend driving the fake
// sbx (backend/sbx/sbxfake: no KVM here), slowed by createDelay.
func startSbxDaemon(t *testing.T, createDelay string, extra ...string) (*daemon, string) {
	t.Helper()
	requireHost(t)
	base := baseDir(t)
	fake := filepath.Join(base, "sbx")
	build := exec.Command("go", "build", "-o", fake, "github.com/sandbox-sidecar/sandbox-sidecar/backend/sbx/sbxfake")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	fakeState := filepath.Join(base, "fake")
	require.NoError(t, os.MkdirAll(fakeState, 0o755))
	kvm := filepath.Join(base, "kvm")
	require.NoError(t, os.WriteFile(kvm, nil, 0o666))
	// The fake keeps workspaces where the daemon puts them; /var/tmp, not
	// /tmp, so paths under the workdir cannot be confused with the guest's
	// /tmp.
	state, err := os.MkdirTemp("/var/tmp", "sidecar-e2e-sbx")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(state) })
	d := &daemon{t: t, base: base, socket: filepath.Join(base, "run", "sidecar.sock"), stateDir: state}
	d.args = testdaemon.NoHostConfig(append([]string{"serve", "--backend", "sbx", "--socket", d.socket, "--state-dir", d.stateDir, "--log-format", "json",
		"--reap-interval", "200ms", "--sbx-path", fake, "--sbx-kvm-device", kvm, "--sbx-host-policy", "deny-all"}, extra...))
	// The daemon passes sbx only PATH, HOME and sbx's own variables: the
	// fake finds its state through sbx's storage root, and its delay in a
	// file there.
	d.env = []string{"SANDBOXES_STORAGE_ROOT=" + fakeState}
	require.NoError(t, os.WriteFile(filepath.Join(fakeState, "create-delay"), []byte(createDelay), 0o644))
	d.start()
	t.Cleanup(d.stop)
	return d, fakeState
}

func TestServeWithSbxBackend(t *testing.T) {
	d, fakeState := startSbxDaemon(t, "0s")
	out, _, code := d.cli(t, "health", "--json")
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, `"backend": "sbx"`)

	// The CLI, end to end.
	out, errOut, code := d.cli(t, "create", "--ttl", "10m", "--owner", "etl/run")
	require.Equal(t, 0, code, errOut)
	id := strings.TrimSpace(out)
	cmd := exec.Command(daemonBin, "write", id, "job.py")
	cmd.Env = append(os.Environ(), "SANDBOX_SIDECAR_SOCKET="+d.socket)
	cmd.Stdin = strings.NewReader("print(sum(range(10)))\n")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	out, errOut, code = d.cli(t, "exec", "--sandbox", id, "--", "/usr/bin/python3", "job.py")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, "45\n", out)

	// Over the socket: egress rules go to sbx's per-sandbox policy on a
	// deny-all host; CIDRs cannot be enforced.
	c := d.client(t)
	res := call(t, c, ipc.OpCreate, map[string]any{"spec": map[string]any{"allow_egress_to": []string{"pypi.org"}}})
	egress := res["sandbox"].(string)
	calls, err := os.ReadFile(filepath.Join(fakeState, "calls.log"))
	require.NoError(t, err)
	assert.Contains(t, string(calls), "pypi.org")
	e := callErr(t, c, ipc.OpCreate, map[string]any{"spec": map[string]any{"allow_egress_to_cidrs": []string{"10.0.0.0/8"}}})
	assert.Equal(t, ipc.CodeSpecUnenforceable, e.Code)

	r := run(t, c, egress, "sleep 30", "timeout_s", 1)
	assert.True(t, r.TimedOut)

	call(t, c, ipc.OpDestroy, map[string]any{"sandbox": egress})
	_, _, code = d.cli(t, "rm", id)
	assert.Equal(t, 0, code)
	var listed []any
	out, _, _ = d.cli(t, "ls", "--json")
	require.NoError(t, json.Unmarshal([]byte(out), &listed))
	assert.Empty(t, listed)
}

func TestSbxWarmPoolHidesSlowCreates(t *testing.T) {
	d, _ := startSbxDaemon(t, "1.5s", "--pool-size", "2")
	c := d.client(t)
	eventually(t, 20*time.Second, "the pool to fill", func() bool {
		var h api.HealthResult
		return c.Call(t.Context(), ipc.OpHealth, nil, &h) == nil && h.Pooled == 2
	})
	start := time.Now()
	create(t, c, map[string]any{"spec": map[string]any{"env": map[string]any{"X": "1"}}})
	warm := time.Since(start)
	start = time.Now()
	create(t, c, map[string]any{"spec": map[string]any{"allow_egress_to": []string{"example.com"}}}) // the pool cannot serve this one
	cold := time.Since(start)
	t.Logf("create from the pool: %s; cold create with a 1.5 s boot: %s", warm, cold)
	assert.Less(t, warm, 500*time.Millisecond)
	assert.Greater(t, cold, 1500*time.Millisecond)
}
