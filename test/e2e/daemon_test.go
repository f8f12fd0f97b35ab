// Package e2e runs the real sandbox-sidecar daemonBin (built once per run) on a
// real Unix socket with the real bubblewrap backend, and talks to it the way
// clients do. Every test here needs root and bubblewrap: on a laptop they
// skip, under CI=true they fail instead.
package e2e

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/test/internal/testdaemon"
)

var daemonBin string // the daemon daemonBin built by TestMain

func TestMain(m *testing.M) { testdaemon.Main(m, &daemonBin) }

// requireHost skips (or, under CI=true, fails) when the host cannot run
// these tests.
func requireHost(t *testing.T) { testdaemon.RequireHost(t) }

// baseDir returns a fresh directory every uid may search (the sandbox uid
// must reach the state directory inside it).
func baseDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "sidecar-e2e")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(d, 0o755))
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

type daemon struct {
	t        *testing.T
	proc     *testdaemon.Process // the running (or last) daemon
	cmd      *exec.Cmd           // proc.Cmd
	base     string
	socket   string
	stateDir string
	args     []string
	env      []string
}

// startDaemon runs `sandbox-sidecar serve` with a temp socket and state
// directory (reused if base is given) and waits until it serves.
func startDaemon(t *testing.T, base string, extra ...string) *daemon {
	t.Helper()
	return startDaemonEnv(t, base, nil, extra...)
}

// startDaemonEnv is startDaemon with env added to the daemon's environment
// (failpoints), for this start and every restart.
func startDaemonEnv(t *testing.T, base string, env []string, extra ...string) *daemon {
	t.Helper()
	requireHost(t)
	if base == "" {
		base = baseDir(t)
	}
	d := &daemon{t: t, base: base, socket: filepath.Join(base, "run", "sidecar.sock"), stateDir: filepath.Join(base, "state"), env: env}
	d.args = testdaemon.NoHostConfig(append([]string{"serve", "--socket", d.socket, "--state-dir", d.stateDir, "--log-format", "json", "--reap-interval", "200ms"}, extra...))
	d.start()
	t.Cleanup(d.end)
	return d
}

// end stops the daemon and then ends what its kept sandboxes still run (a
// kept sandbox outlives its daemon): nothing of the test is left.
func (d *daemon) end() {
	d.stop()
	if d.arg("--backend") != "gvisor" {
		testdaemon.EndSandboxes(d.t, daemonBin, d.socket, d.stateDir)
		return
	}
	// gc --all on the gvisor backend, with the daemon's runsc: a config
	// file says both.
	conf := filepath.Join(d.base, "end-gvisor.toml")
	body := fmt.Sprintf("[server]\nbackend = \"gvisor\"\nstate_dir = %q\n[gvisor]\nrunsc_path = %q\n", d.stateDir, d.arg("--gvisor-runsc-path"))
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		d.t.Errorf("ending the gvisor sandboxes: %v", err)
		return
	}
	cmd := exec.Command(daemonBin, "gc", "--all", "--config", conf, "--socket", d.socket)
	if out, err := cmd.CombinedOutput(); err != nil {
		d.t.Logf("gc --all after the test: %v\n%s", err, out)
	}
}

// arg is the value the daemon's command line gives flag ("" without).
func (d *daemon) arg(flag string) string {
	for i, a := range d.args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
		if a == flag && i+1 < len(d.args) {
			return d.args[i+1]
		}
	}
	return ""
}

// backendDir is where the daemon's backend keeps its sandboxes.
func (d *daemon) backendDir() string {
	if b := d.arg("--backend"); b != "" {
		return filepath.Join(d.stateDir, b)
	}
	return filepath.Join(d.stateDir, "bwrap")
}

func (d *daemon) start() {
	d.t.Helper()
	cmd := exec.Command(daemonBin, d.args...)
	cmd.Env = append(os.Environ(), d.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	d.proc = testdaemon.Start(d.t, cmd, 30*time.Second, nil)
	d.cmd = cmd
}

// Logs returns everything the daemon wrote to stderr so far.
func (d *daemon) Logs() string { return d.proc.Logs() }

// stop sends SIGTERM and expects a clean exit 0.
func (d *daemon) stop() {
	if !d.proc.Running() {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.proc.Done():
		if err := d.proc.Err(); err != nil {
			d.t.Errorf("daemon did not exit cleanly after SIGTERM: %v\n%s", err, d.Logs())
		}
	case <-time.After(60 * time.Second):
		d.cmd.Process.Kill()
		<-d.proc.Done()
		d.t.Errorf("daemon did not stop within 60s of SIGTERM\n%s", d.Logs())
	}
}

// kill9 kills the daemon as a crash would.
func (d *daemon) kill9() {
	d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.proc.Done()
}

// restart starts the daemon again on the same state directory.
func (d *daemon) restart() { d.start() }

func (d *daemon) client(t *testing.T) *ipc.Client { return testdaemon.Dial(t, d.socket) }

// cli runs the daemonBin as a client of this daemon.
func (d *daemon) cli(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return testdaemon.CLI(t, daemonBin, d.socket, args...)
}

func call(t *testing.T, c *ipc.Client, op string, args map[string]any) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var res map[string]any
	require.NoError(t, c.Call(ctx, op, args, &res), "op %s", op)
	return res
}

func callErr(t *testing.T, c *ipc.Client, op string, args map[string]any) *ipc.Error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := c.Call(ctx, op, args, nil)
	require.Error(t, err, "op %s should fail", op)
	e, ok := err.(*ipc.Error)
	require.True(t, ok, "op %s: want a daemon error, got %v", op, err)
	return e
}

func create(t *testing.T, c *ipc.Client, args map[string]any) string {
	t.Helper()
	res := call(t, c, ipc.OpCreate, args)
	id, _ := res["sandbox"].(string)
	require.NotEmpty(t, id)
	return id
}

// execResult is run_command's result.
// execResult is run_command's result, the wire's own type.
type execResult = api.RunCommandResult

func run(t *testing.T, c *ipc.Client, id, command string, extra ...any) execResult {
	t.Helper()
	args := map[string]any{"sandbox": id, "command": command, "timeout_s": 30}
	for i := 0; i+1 < len(extra); i += 2 {
		args[extra[i].(string)] = extra[i+1]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var res execResult
	require.NoError(t, c.Call(ctx, ipc.OpRunCommand, args, &res))
	return res
}

// workspaces lists the sandbox directories the bwrap backend has on disk.
func (d *daemon) workspaces(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(d.stateDir, "bwrap"))
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "sc-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// sleepToken returns a sleep duration no other test (or test package
// running in parallel) uses, so that its processes can be told apart.
func sleepToken() string {
	var b [2]byte
	rand.Read(b[:])
	return fmt.Sprintf("%d.%03d", 5000+int(b[0])*10+int(b[1])%10, time.Now().Nanosecond()/1e6)
}

// processesMatching returns pids whose command line contains s.
func processesMatching(s string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(strings.ReplaceAll(string(b), "\x00", " "), s) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %s", what, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
