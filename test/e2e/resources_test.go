package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// whyResult is the part of run_command's result that says why the command
// ended, so a test can compare it whole.
type whyResult struct {
	ExitCode          int
	TimedOut          bool
	SandboxTerminated bool
	OOMKilled         bool
	OOMKills          uint64
	Reason            string
}

func runWhy(t *testing.T, c *ipc.Client, id, command string, timeoutS float64) whyResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := c.RunCommand(ctx, api.RunCommandRequest{Sandbox: id, Command: command, TimeoutS: timeoutS})
	require.NoError(t, err)
	return whyResult{ExitCode: r.ExitCode, TimedOut: r.TimedOut, SandboxTerminated: r.SandboxTerminated,
		OOMKilled: r.OOMKilled, OOMKills: r.OOMKills, Reason: r.Reason}
}

// requireMemoryLimit returns health's limits; a host that cannot enforce a memory
// limit skips the test (fails it under CI=true).
func requireMemoryLimit(t *testing.T, c *ipc.Client) map[string]any {
	t.Helper()
	limits, ok := call(t, c, ipc.OpHealth, nil)["limits"].(map[string]any)
	require.True(t, ok, "the bwrap backend reports the limits in force")
	if mem, _ := limits["memory"].(string); mem == "" || mem == "off" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("this host cannot enforce a memory limit (health: %v), and CI=true forbids skipping", limits)
		}
		t.Skipf("this host cannot enforce a memory limit (health: %v)", limits)
	}
	return limits
}

// balloon allocates memory until something stops it.
const balloon = `python3 -c 'b = []
while True: b.append(bytearray(1 << 20))'`

func TestOOMKillIsReportedAndAudited(t *testing.T) {
	auditFile := filepath.Join(baseDir(t), "audit.jsonl")
	d := startDaemon(t, "", "--audit-file", auditFile)
	c := d.client(t)
	limits := requireMemoryLimit(t, c)
	for _, k := range []string{"memory", "pids", "cpu", "disk"} {
		assert.Contains(t, limits, k)
	}

	id := create(t, c, map[string]any{"resources": map[string]any{"memory_bytes": 64 << 20}})
	res := runWhy(t, c, id, balloon, 60)
	assert.Equal(t, whyResult{ExitCode: 137, OOMKilled: true, OOMKills: res.OOMKills, Reason: "oom_killed"}, res)
	assert.GreaterOrEqual(t, res.OOMKills, uint64(1))

	res = runWhy(t, c, id, "exit 4", 10)
	assert.Equal(t, whyResult{ExitCode: 4, Reason: "exited"}, res, "a later command in the same sandbox is not blamed")
	res = runWhy(t, c, id, "trap '' TERM; sleep 30", 0.5)
	assert.True(t, res.TimedOut)
	assert.Equal(t, "timed_out", res.Reason)
	assert.False(t, res.OOMKilled)

	var listed map[string]any
	for _, s := range call(t, c, ipc.OpList, nil)["sandboxes"].([]any) {
		if s := s.(map[string]any); s["sandbox"] == id {
			listed = s
		}
	}
	require.NotNil(t, listed)
	assert.EqualValues(t, 64<<20, listed["resources"].(map[string]any)["memory_bytes"])

	// A request's audit line follows its response: the daemon's
	// shutdown waits for the last one.
	d.stop()
	b, err := os.ReadFile(auditFile)
	require.NoError(t, err)
	var reasons []any
	var created map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		switch {
		case m["@message"] != "audit":
		case m["op"] == "run_command":
			reasons = append(reasons, m["reason"])
		case m["op"] == "create":
			created = m
		}
	}
	assert.Equal(t, []any{"oom_killed", "exited", "timed_out"}, reasons)
	require.NotNil(t, created)
	assert.Equal(t, map[string]any{"memory_bytes": float64(64 << 20)}, created["resources"])
}

func TestResourcesOverTheWire(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	requireMemoryLimit(t, c)
	assert.Contains(t, call(t, c, ipc.OpHello, nil)["features"], "create_resources")

	for _, tc := range []struct {
		resources any
		code      string
		message   string
	}{
		{map[string]any{"memory_bytes": -1}, ipc.CodeBadRequest, `"memory_bytes" must be greater than 0`},
		{map[string]any{"cpus": "two"}, ipc.CodeBadRequest, `"cpus" must be a number`},
		{map[string]any{"swap_bytes": 1}, ipc.CodeBadRequest, `unknown resources field "swap_bytes"`},
		{[]any{1}, ipc.CodeBadRequest, `"resources" must be a map`},
		{map[string]any{"memory_bytes": int64(1) << 50}, ipc.CodeSpecUnenforceable, ""},
	} {
		e := callErr(t, c, ipc.OpCreate, map[string]any{"resources": tc.resources})
		assert.Equal(t, tc.code, e.Code, "%v: %s", tc.resources, e.Message)
		assert.Contains(t, e.Message, tc.message)
	}
	assert.Empty(t, call(t, c, ipc.OpList, nil)["sandboxes"], "no refused create left anything")
	assert.Empty(t, d.workspaces(t))
}

// mountsUnder counts the mounts below dir listed in a mountinfo-style file
// (/proc/self/mounts, /proc/<pid>/mounts).
func mountsUnder(t *testing.T, mounts, dir string) int {
	t.Helper()
	b, err := os.ReadFile(mounts)
	require.NoError(t, err)
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
			n++
		}
	}
	return n
}

// A root daemon's sandbox disks live in its own mount namespace: the host
// never sees them, a daemon killed with -9 leaves none behind, and a
// restart mounts them again with the files intact.
func TestSandboxDisksNeverOutliveTheDaemon(t *testing.T) {
	d := startDaemon(t, "", "--limit-disk", "67108864")
	c := d.client(t)
	limits := call(t, c, ipc.OpHealth, nil)["limits"].(map[string]any)
	if limits["disk"] != "ext4 image" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("disk caps are not in force (health: %v), and CI=true forbids skipping", limits)
		}
		t.Skipf("disk caps are not in force here (health: %v)", limits)
	}
	id := create(t, c, map[string]any{"ttl_s": 600})
	res := runWhy(t, c, id, `echo kept > /workspace/f; df -k /workspace | tail -1`, 30)
	require.Equal(t, 0, res.ExitCode)
	pid := d.cmd.Process.Pid
	assert.Equal(t, 1, mountsUnder(t, fmt.Sprintf("/proc/%d/mounts", pid), d.stateDir), "the daemon sees its sandbox's disk")
	assert.Zero(t, mountsUnder(t, "/proc/self/mounts", d.stateDir), "the host does not")

	c.Close()
	d.kill9()
	assert.Zero(t, mountsUnder(t, "/proc/self/mounts", d.stateDir), "nothing stays mounted after kill -9")
	d.restart()
	c = d.client(t)
	defer c.Close()
	var out api.RunCommandResult
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, c.Call(ctx, ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "cat /workspace/f", "timeout_s": 30}, &out))
	assert.Equal(t, "kept\n", string(out.Stdout), "the re-adopted sandbox's disk is mounted again with its files")
	call(t, c, ipc.OpDestroy, map[string]any{"sandbox": id})
	_, err := os.Stat(filepath.Join(d.stateDir, "bwrap", id))
	assert.True(t, os.IsNotExist(err), "destroy removed the sandbox and its image: %v", err)
}

func TestCLIResourcesAndOOMKill(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	requireMemoryLimit(t, c)
	c.Close()
	_, stderr, code := d.cli(t, "exec", "--memory", "67108864", "--sh", balloon)
	assert.Equal(t, 137, code, "exec exits with the command's 137")
	assert.Contains(t, stderr, "oom_killed", "and says why")
	_, stderr, code = d.cli(t, "create", "--memory", "1099511627776000")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, stderr, "exceeds the daemon's maximum", "a sandbox larger than the daemon allows is refused")
	_, stderr, code = d.cli(t, "exec", "--sandbox", "sc-0000000000000000", "--pids", "16", "--", "true")
	assert.Equal(t, 2, code, "resources size a throwaway sandbox only: %s", stderr)
}

// TestHostMemoryBoundsEverySandboxTogether: with --limit-host-memory the
// cgroup every sandbox's group sits under has that limit, health says what
// the host can hold, and what a sandbox keeps in its tmpfs between commands
// (counted as memory, not disk) leaves another sandbox less: within its own
// limit, that one's balloon is killed at the common limit (#13).
func TestHostMemoryBoundsEverySandboxTogether(t *testing.T) {
	const perSandbox, all = 256 << 20, 384 << 20
	d := startDaemon(t, "", "--limit-memory", fmt.Sprint(perSandbox), "--limit-host-memory", fmt.Sprint(all))
	c := d.client(t)
	requireMemoryLimit(t, c)
	mem, ok := call(t, c, ipc.OpHealth, nil)["memory"].(map[string]any)
	require.True(t, ok, "health reports the memory every sandbox together may use")
	assert.EqualValues(t, all, mem["sandboxes_limit_bytes"])
	assert.EqualValues(t, perSandbox, mem["per_sandbox_bytes"])
	assert.EqualValues(t, 1, mem["fits_sandboxes"], "384 MiB hold one sandbox at its 256 MiB limit")
	assert.EqualValues(t, 64, mem["max_sandboxes"])
	assert.Greater(t, toInt(mem["host_bytes"]), int64(all))

	// A keeps 200 MB in its tmpfs root after its command has ended.
	a := create(t, c, nil)
	res := runWhy(t, c, a, "head -c 200000000 /dev/zero > /kept && echo ok", 60)
	require.Equal(t, 0, res.ExitCode, "%+v", res)
	// health's memory figures are up to a second old (one reading serves
	// the probes of a second).
	assert.Eventually(t, func() bool {
		mem = call(t, c, ipc.OpHealth, nil)["memory"].(map[string]any)
		return toInt(mem["sandboxes_used_bytes"]) >= 200_000_000
	}, 5*time.Second, 100*time.Millisecond, "the kept file is charged")

	// B's 200 MB balloon is within its own 256 MiB but not beside A's file.
	b := create(t, c, nil)
	res = runWhy(t, c, b, `python3 -c 'b = b"x" * 200000000; print("survived")'`, 60)
	assert.Equal(t, 137, res.ExitCode, "%+v", res)
	assert.False(t, res.TimedOut)

	// Once A is gone, B has room again.
	call(t, c, ipc.OpDestroy, map[string]any{"sandbox": a})
	res = runWhy(t, c, b, `python3 -c 'b = b"x" * 200000000; print("survived")'`, 60)
	assert.Equal(t, 0, res.ExitCode, "%+v", res)
}

// toInt reads a number msgpack decoded into any (it picks the smallest
// integer type that holds it), or -1.
func toInt(v any) int64 {
	rv := reflect.ValueOf(v)
	switch {
	case rv.CanInt():
		return rv.Int()
	case rv.CanUint():
		return int64(rv.Uint())
	case rv.CanFloat():
		return int64(rv.Float())
	}
	return -1
}
