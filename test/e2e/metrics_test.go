package e2e

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/metrics/metricstest"
	"github.com/sandbox-sidecar/sandbox-sidecar/test/internal/testdaemon"
)

// metricsAddr is where the daemon says it serves metrics ("" if it does
// not), from its JSON log.
func (d *daemon) metricsAddr() string {
	for _, line := range strings.Split(d.Logs(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["@message"] == "serving metrics" {
			a, _ := rec["address"].(string)
			return a
		}
	}
	return ""
}

// TestMetricsOfTheRealDaemon scrapes the real daemon's endpoint with a real
// HTTP client while it serves sandboxes, and checks that what it did shows.
func TestMetricsOfTheRealDaemon(t *testing.T) {
	d := startDaemon(t, "", "--metrics-listen", "127.0.0.1:0", "--pool-size", "1", "--max-sandboxes-per-owner", "1")
	addr := d.metricsAddr()
	require.NotEmpty(t, addr, "the daemon says where it serves metrics\n%s", d.Logs())
	require.True(t, strings.HasPrefix(addr, "127.0.0.1:"), addr)

	c := d.client(t)
	// Wait for the pool to fill, as an operator's dashboard would show it.
	require.Eventually(t, func() bool {
		v, _ := metricstest.Value(metricstest.Scrape(t, addr), "sandbox_sidecar_pool_size")
		return v == 1
	}, 30*time.Second, 50*time.Millisecond)

	pooled := create(t, c, nil) // served by the pool
	assert.Equal(t, 0, run(t, c, pooled, "true").ExitCode)
	assert.Equal(t, 3, run(t, c, pooled, "exit 3").ExitCode)
	assert.True(t, run(t, c, pooled, "sleep 30", "timeout_s", 0.2).TimedOut)
	owned := create(t, c, map[string]any{"spec": map[string]any{"owner": "dag/run"}, "ttl_s": 600})
	e := callErr(t, c, ipc.OpCreate, map[string]any{"spec": map[string]any{"owner": "dag/run"}, "ttl_s": 600})
	assert.Equal(t, ipc.CodeQuotaExceeded, e.Code)
	callErr(t, c, "no_such_op", nil)
	call(t, c, ipc.OpDestroy, map[string]any{"sandbox": owned})

	fams := metricstest.Scrape(t, addr)
	for _, c := range []struct {
		fam             string
		labels          []string
		atLeast, atMost float64
	}{
		{"sandbox_sidecar_creates_total", []string{"source", "pool"}, 1, 2},
		{"sandbox_sidecar_creates_total", []string{"source", "cold"}, 0, 1},
		{"sandbox_sidecar_pool_claims_total", []string{"result", "hit"}, 1, 2},
		{"sandbox_sidecar_first_command_duration_seconds", []string{"source", "pool"}, 1, 1},
		{"sandbox_sidecar_command_duration_seconds", []string{"outcome", "exited"}, 2, 2},
		{"sandbox_sidecar_command_duration_seconds", []string{"outcome", "timed_out"}, 1, 1},
		{"sandbox_sidecar_quota_refusals_total", []string{"scope", "owner"}, 1, 1},
		{"sandbox_sidecar_destroys_total", []string{"reason", "client_request"}, 1, 1},
		{"sandbox_sidecar_rpc_requests_total", []string{"op", "run_command", "code", "ok"}, 3, 3},
		{"sandbox_sidecar_rpc_errors_total", []string{"op", "create", "code", "quota_exceeded"}, 1, 1},
		{"sandbox_sidecar_rpc_errors_total", []string{"op", "unknown", "code", "unknown_op"}, 1, 1},
		{"sandbox_sidecar_sandboxes", []string{"backend", "bwrap", "state", "ready"}, 1, 1},
		{"sandbox_sidecar_connections", nil, 1, 1},
		{"sandbox_sidecar_pool_target", nil, 1, 1},
		{"sandbox_sidecar_recovery_sandboxes", []string{"result", "failed"}, 0, 0},
		{"sandbox_sidecar_journal_bytes", nil, 1, 1 << 30},
	} {
		v, ok := metricstest.Value(fams, c.fam, c.labels...)
		if assert.True(t, ok, "%s%v is missing", c.fam, c.labels) {
			assert.True(t, v >= c.atLeast && v <= c.atMost, "%s%v = %v, want %v..%v", c.fam, c.labels, v, c.atLeast, c.atMost)
		}
	}
	// No sandbox id or owner ever becomes a label.
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				assert.NotContains(t, l.GetValue(), "sc-", name)
				assert.NotContains(t, l.GetValue(), "dag/run", name)
			}
		}
	}
}

// TestMetricsAreOffByDefault: a daemon not asked for metrics opens no port.
func TestMetricsAreOffByDefault(t *testing.T) {
	d := startDaemon(t, "")
	assert.Empty(t, d.metricsAddr())
	assert.NotContains(t, d.Logs(), "metrics")
}

// TestMetricsRefuseEveryInterfaceUnlessWritten: ":9464" is refused before
// the daemon starts.
func TestMetricsRefuseEveryInterfaceUnlessWritten(t *testing.T) {
	requireHost(t)
	d := &daemon{t: t}
	_, stderr, code := d.cli(t, "serve", "--config", "/dev/null", "--metrics-listen", ":9464", "--socket", t.TempDir()+"/s.sock", "--state-dir", t.TempDir())
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "metrics.listen")
	assert.Contains(t, stderr, "every interface")
}

// TestMetricsOnTheSocketSystemdPasses: under socket activation the metrics
// listener is the TCP socket named "metrics" (sandbox-sidecar-metrics.socket,
// FileDescriptorName=metrics), next to the RPC socket; the packaged
// service's own PrivateNetwork= and IPAddressDeny= do not apply to it.
func TestMetricsOnTheSocketSystemdPasses(t *testing.T) {
	requireHost(t)
	base := baseDir(t)
	sock := filepath.Join(base, "sidecar.sock")
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	require.NoError(t, err)
	tl, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	uf, err := ul.File()
	require.NoError(t, err)
	tf, err := tl.File()
	require.NoError(t, err)
	addr := tl.Addr().String()
	ul.SetUnlinkOnClose(false)
	ul.Close()
	tl.Close()

	// LISTEN_PID must be the daemon's pid: a shell sets it and execs.
	cmd := exec.Command("/bin/sh", "-c", `LISTEN_PID=$$ exec "$0" "$@"`, daemonBin, "serve", "--config", "/dev/null",
		"--state-dir", filepath.Join(base, "state"), "--log-format", "json")
	cmd.Env = append(os.Environ(), "LISTEN_FDS=2", "LISTEN_FDNAMES=sandbox-sidecar.socket:metrics")
	cmd.ExtraFiles = []*os.File{uf, tf}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	proc := testdaemon.Start(t, cmd, 30*time.Second, func() { uf.Close(); tf.Close() })
	d := &daemon{t: t, proc: proc, cmd: cmd, socket: sock}
	t.Cleanup(d.stop)

	assert.Equal(t, addr, d.metricsAddr(), "\n%s", d.Logs())
	assert.Contains(t, d.Logs(), "the socket systemd passed")
	c := d.client(t)
	call(t, c, ipc.OpHello, map[string]any{"client": "e2e"})
	fams := metricstest.Scrape(t, addr)
	v, ok := metricstest.Value(fams, "sandbox_sidecar_rpc_requests_total", "op", "hello", "code", "ok")
	assert.True(t, ok)
	assert.Equal(t, 1.0, v)
}

// TestProcessMetricsOfTheRealDaemon: durable processes started, running,
// ended by reason and the bytes their logs dropped, as a scrape of the
// real daemon shows them.
func TestProcessMetricsOfTheRealDaemon(t *testing.T) {
	base := baseDir(t)
	conf := filepath.Join(base, "config.toml")
	require.NoError(t, os.WriteFile(conf, []byte("[processes]\nlog_bytes = \"8KiB\"\n"), 0o644))
	d := startDaemon(t, base, "--config", conf, "--metrics-listen", "127.0.0.1:0")
	addr := d.metricsAddr()
	require.NotEmpty(t, addr, "the daemon says where it serves metrics\n%s", d.Logs())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := d.client(t)

	fams := metricstest.Scrape(t, addr)
	v, ok := metricstest.Value(fams, "sandbox_sidecar_processes_running")
	assert.True(t, ok, "reported before any process")
	assert.Zero(t, v)

	created, err := c.Create(ctx, api.CreateRequest{TTLS: 600})
	require.NoError(t, err)
	id := created.Sandbox
	start := func(command string) string {
		t.Helper()
		p, err := c.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Command: command})
		require.NoError(t, err)
		return p.Process
	}
	wait := func(proc string) api.ProcessInfo {
		t.Helper()
		p, err := c.WaitProcess(ctx, api.WaitProcessRequest{Sandbox: id, Process: proc, TimeoutS: 60})
		require.NoError(t, err)
		require.False(t, p.Running)
		return p
	}
	flood := wait(start("seq 1 100000; exit 2"))
	require.Greater(t, flood.StdoutBytes, int64(8<<10))
	start("sleep 600")
	killed := start("sleep 600")
	require.NoError(t, c.SignalProcess(ctx, api.SignalProcessRequest{Sandbox: id, Process: killed, Signal: "TERM"}))
	wait(killed)

	fams = metricstest.Scrape(t, addr)
	for _, c := range []struct {
		fam    string
		labels []string
		want   float64
	}{
		{"sandbox_sidecar_processes_started_total", nil, 3},
		{"sandbox_sidecar_processes_running", nil, 1},
		{"sandbox_sidecar_processes_ended", []string{"reason", "exited"}, 1},
		{"sandbox_sidecar_processes_ended", []string{"reason", "killed"}, 1},
		{"sandbox_sidecar_processes_ended", []string{"reason", "timed_out"}, 0},
		{"sandbox_sidecar_process_log_dropped_bytes", nil, float64(flood.StdoutBytes - 8<<10)},
		{"sandbox_sidecar_processes_unsampled_sandboxes", nil, 0},
		{"sandbox_sidecar_rpc_requests_total", []string{"op", "start_command", "code", "ok"}, 3},
	} {
		v, ok := metricstest.Value(fams, c.fam, c.labels...)
		if assert.True(t, ok, "%s%v is missing", c.fam, c.labels) {
			assert.Equal(t, c.want, v, "%s%v", c.fam, c.labels)
		}
	}

	// Destroyed, the sandbox's processes end and their records go.
	require.NoError(t, c.Destroy(ctx, id))
	fams = metricstest.Scrape(t, addr)
	v, _ = metricstest.Value(fams, "sandbox_sidecar_processes_running")
	assert.Zero(t, v)
	v, _ = metricstest.Value(fams, "sandbox_sidecar_processes_ended", "reason", "exited")
	assert.Zero(t, v)
	v, _ = metricstest.Value(fams, "sandbox_sidecar_processes_started_total")
	assert.Equal(t, 3.0, v, "a counter")
}
