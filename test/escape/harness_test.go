// Package escape is the escape-attempt battery: each attempt runs from
// inside a sandbox of the real daemon (built from cmd/sandbox-sidecar,
// serving on a temporary socket, with the real bubblewrap backend) and must
// fail safely, with the daemon healthy afterwards.
//
// The daemon runs inside a harness that bounds it whatever a guest does:
// a cgroup of its own (memory, pids, CPU; the limits are read back before
// anything runs) and a size- and inode-capped tmpfs holding its state
// directory, so a fork bomb, a memory balloon or a disk fill exhausts the
// harness, never the host. Those bounds are the harness's, not the
// sandbox's: until per-sandbox limits are wired into the backend, attempts
// that only the harness contains are reported as gaps, not as contained.
//
// `go test ./test/escape -run Battery -update-doc` rewrites the results
// table in docs/security.md; SANDBOX_SIDECAR_BIN=/path/to/daemon runs it
// against a daemon built elsewhere. Every test here needs root and bubblewrap: on
// a laptop they skip, under CI=true they fail instead.
package escape

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/cgroup"
	"github.com/sandbox-sidecar/sandbox-sidecar/test/internal/testdaemon"
)

var (
	updateDoc = flag.Bool("update-doc", false, "rewrite the results table in docs/security.md")
	// limitsWired asserts what per-sandbox limits must give (oom_killed,
	// ENOSPC at the sandbox's cap, seccomp denials). The bwrap backend of a
	// root daemon enforces them all; -limits-wired=false (or
	// SANDBOX_SIDECAR_LIMITS_WIRED=0) reports those attempts as gaps instead,
	// for a host that cannot give sandboxes cgroups or disk caps.
	limitsWired = flag.Bool("limits-wired", os.Getenv("SANDBOX_SIDECAR_LIMITS_WIRED") != "0", "assert per-sandbox limits (false: report what they would contain as gaps)")
	// exhaust runs the exhaustion attempts (fork bomb, balloon, disk fill).
	// They run only inside a harness whose bounds were verified.
	exhaust = flag.Bool("exhaust", true, "run the exhaustion attempts (inside the verified harness bounds only)")
)

// Harness bounds around the daemon. A root daemon gives each sandbox a
// cgroup of its own at the top of the hierarchy, outside these: the
// sandboxes' own limits contain the exhaustion attempts, the harness the daemon.
const (
	harnessMemory = 2560 << 20 // bytes
	harnessPIDs   = 1024
	harnessCPUs   = 1.5
	harnessTmpfs  = 768 << 20 // bytes of state directory (the sandboxes' workspaces)
	harnessInodes = 300000
	// harnessSandboxDisk is each sandbox's disk cap (--limit-disk): a sparse image on the tmpfs.
	harnessSandboxDisk = 256 << 20
	daemonStartMax     = 30 * time.Second
	callTimeout        = 2 * time.Minute
)

var daemonBin string

func TestMain(m *testing.M) {
	flag.Parse()
	// SANDBOX_SIDECAR_BIN runs the battery against a daemon built
	// elsewhere (a release binary, another revision).
	testdaemon.Main(m, &daemonBin)
}

func requireHost(t *testing.T) { testdaemon.RequireHost(t, "/usr/bin/python3") }

func token() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// harness is one daemon in its bounds.
type harness struct {
	t        *testing.T
	base     string // the tmpfs
	socket   string
	stateDir string
	cg       *cgroup.Cgroup
	cgm      *cgroup.Manager
	cmd      *exec.Cmd
	proc     *testdaemon.Process

	client *ipc.Client
	bounds string   // what the harness verified, for the report
	extra  []string // more serve flags
}

// startHarness starts the daemon in the harness; extra are more serve
// flags (another backend).
func startHarness(t *testing.T, extra ...string) *harness {
	t.Helper()
	requireHost(t)
	h := &harness{t: t, extra: extra}

	// The state directory lives on a capped tmpfs.
	base, err := os.MkdirTemp("", "sidecar-escape")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(base, 0o755))
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0755", harnessTmpfs, harnessInodes)
	require.NoError(t, unix.Mount("tmpfs", base, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts), "mount the harness tmpfs")
	h.base = base
	t.Cleanup(func() {
		if err := unix.Unmount(base, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", base, err)
		}
		os.Remove(base)
	})
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(base, &st))
	require.LessOrEqual(t, int64(st.Blocks)*int64(st.Bsize), int64(harnessTmpfs), "the tmpfs cap is in force")

	// The daemon runs in a cgroup of its own whose limits are read back.
	cgm, err := cgroup.New(cgroup.Options{Base: "sidecar-escape-" + token()})
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the harness needs cgroups with memory, pids and cpu: %v", err)
		}
		t.Skipf("the harness needs cgroups with memory, pids and cpu: %v", err)
	}
	h.cgm = cgm
	cg, err := cgm.Create("daemon", cgroup.Limits{MemoryBytes: harnessMemory, PIDs: harnessPIDs, CPUs: harnessCPUs})
	require.NoError(t, err)
	h.cg = cg
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cg.Destroy(ctx); err != nil {
			t.Errorf("remove the harness cgroup: %v", err)
		}
		for _, d := range cgm.Dirs() {
			syscall.Rmdir(d)
		}
	})
	h.bounds = verifyBounds(t, cgm, cg)

	h.socket = filepath.Join(base, "run", "sidecar.sock")
	h.stateDir = filepath.Join(base, "state")
	h.start()
	t.Cleanup(h.stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h.client, err = ipc.Dial(ctx, h.socket)
	require.NoError(t, err)
	t.Cleanup(func() { h.client.Close() })
	return h
}

// verifyBounds reads the harness cgroup's limits back from the kernel.
func verifyBounds(t *testing.T, m *cgroup.Manager, cg *cgroup.Cgroup) string {
	t.Helper()
	read := func(file string) string {
		for _, d := range cg.Dirs() {
			if b, err := os.ReadFile(filepath.Join(d, file)); err == nil {
				return strings.TrimSpace(string(b))
			}
		}
		t.Fatalf("cannot read %s of the harness cgroup %v", file, cg.Dirs())
		return ""
	}
	var mem string
	if m.Version() == cgroup.V2 {
		mem = read("memory.max")
	} else {
		mem = read("memory.limit_in_bytes")
	}
	require.Equal(t, strconv.Itoa(harnessMemory), mem)
	require.Equal(t, strconv.Itoa(harnessPIDs), read("pids.max"))
	return fmt.Sprintf("%v: memory %d MiB, pids %d, %.1f CPUs; state on a %d MiB, %d-inode tmpfs",
		m.Version(), harnessMemory>>20, harnessPIDs, harnessCPUs, harnessTmpfs>>20, harnessInodes)
}

// start runs the daemon: a shell waits on a pipe until it has been moved
// into the harness cgroup, then execs the daemon, so nothing of the daemon
// ever runs outside the bounds.
func (h *harness) start() {
	t := h.t
	gateR, gateW, err := os.Pipe()
	require.NoError(t, err)
	defer gateR.Close()
	serve := []string{"serve", "--socket", h.socket, "--state-dir", h.stateDir, "--log-format", "json", "--reap-interval", "200ms",
		// Each sandbox's disk cap must fit in the harness's tmpfs.
		"--limit-disk", strconv.Itoa(harnessSandboxDisk)}
	args := append([]string{"-c", `read _ <&3; exec 3<&-; exec "$0" "$@"`, daemonBin}, testdaemon.NoHostConfig(append(serve, h.extra...))...)
	h.cmd = exec.Command("/bin/sh", args...)
	h.cmd.ExtraFiles = []*os.File{gateR}
	h.cmd.Env = os.Environ()
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	h.proc = testdaemon.Start(t, h.cmd, daemonStartMax, func() {
		require.NoError(t, h.cg.Add(h.cmd.Process.Pid))
		pids, err := h.cg.PIDs()
		require.NoError(t, err)
		require.Contains(t, pids, h.cmd.Process.Pid, "the daemon must be inside the harness before it runs")
		_, err = gateW.Write([]byte("go\n"))
		require.NoError(t, err)
		gateW.Close()
	})
}

func (h *harness) Logs() string { return h.proc.Logs() }

func (h *harness) running() bool { return h.proc.Running() }

func (h *harness) stop() {
	if !h.running() {
		return
	}
	h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.proc.Done():
	case <-time.After(60 * time.Second):
		h.cmd.Process.Kill()
		<-h.proc.Done()
		h.t.Errorf("daemon did not stop within 60s of SIGTERM")
	}
	// A kept sandbox outlives its daemon: end what it still runs.
	testdaemon.EndSandboxes(h.t, daemonBin, h.socket, h.stateDir)
	gvisor.KillSandboxes(filepath.Join(h.stateDir, "gvisor"))
}

func (h *harness) call(op string, args map[string]any, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return h.client.Call(ctx, op, args, out)
}

func (h *harness) create() string {
	h.t.Helper()
	var res api.CreateResult
	require.NoError(h.t, h.call(ipc.OpCreate, map[string]any{}, &res))
	require.NotEmpty(h.t, res.Sandbox)
	return res.Sandbox
}

func (h *harness) destroy(id string) {
	h.t.Helper()
	require.NoError(h.t, h.call(ipc.OpDestroy, map[string]any{"sandbox": id}, nil))
}

// execResult is run_command's result (the wire's own type), with a helper.
type execResult api.RunCommandResult

func (r execResult) out() string { return strings.TrimSpace(string(r.Stdout)) }

// run runs a shell command in sandbox id.
func (h *harness) run(id, command string, timeoutS float64, extra ...any) execResult {
	h.t.Helper()
	args := map[string]any{"sandbox": id, "command": command, "timeout_s": timeoutS}
	for i := 0; i+1 < len(extra); i += 2 {
		args[extra[i].(string)] = extra[i+1]
	}
	var res execResult
	require.NoError(h.t, h.call(ipc.OpRunCommand, args, &res), "run %q", command)
	return res
}

// fileErr calls a file op and returns the daemon's error code ("" for
// success).
func (h *harness) fileErr(op string, args map[string]any, out any) string {
	err := h.call(op, args, out)
	if err == nil {
		return ""
	}
	var e *ipc.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return "transport: " + err.Error()
}

// healthy checks the daemon answers health "ok" and a fresh sandbox runs a
// command normally.
func (h *harness) healthy() error {
	if !h.running() {
		return fmt.Errorf("the daemon exited: %v", h.proc.Err())
	}
	var res api.HealthResult
	if err := h.call(ipc.OpHealth, map[string]any{}, &res); err != nil {
		return fmt.Errorf("health: %w", err)
	}
	if res.Status != "ok" {
		return fmt.Errorf("health is %q: %s", res.Status, res.BackendError)
	}
	var c api.CreateResult
	if err := h.call(ipc.OpCreate, map[string]any{}, &c); err != nil {
		return fmt.Errorf("create after the attempt: %w", err)
	}
	defer h.call(ipc.OpDestroy, map[string]any{"sandbox": c.Sandbox}, nil)
	var r execResult
	if err := h.call(ipc.OpRunCommand, map[string]any{"sandbox": c.Sandbox, "command": "echo fresh", "timeout_s": 30}, &r); err != nil {
		return fmt.Errorf("run after the attempt: %w", err)
	}
	if r.ExitCode != 0 || r.out() != "fresh" {
		return fmt.Errorf("a fresh sandbox answered exit %d, %q, %q", r.ExitCode, r.Stdout, r.Stderr)
	}
	return nil
}
