package bwrap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// marked is a sleeping process carrying the marker of a directory.
type marked struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once it has been reaped
}

// startMarked starts a sleeping process carrying the marker of dir.
func startMarked(t *testing.T, dir string) *marked {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	cmd.Env = []string{markerEnv + "=" + marker(dir)}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m := &marked{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(m.done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-m.done })
	return m
}

func (m *marked) exited(within time.Duration) bool {
	select {
	case <-m.done:
		return true
	case <-time.After(within):
		return false
	}
}

func TestNewKillsStraysOfItsOwnDirectoryOnly(t *testing.T) {
	if _, err := exec.LookPath("bwrap"); err != nil {
		skipOrFail(t, "bubblewrap is not installed: %v", err)
	}
	dir := filepath.Join(t.TempDir(), "state")
	ours := startMarked(t, filepath.Join(dir, "sc-0000000000000001"))
	other := startMarked(t, filepath.Join(t.TempDir(), "elsewhere", "sc-0000000000000001"))
	sibling := startMarked(t, dir+"-other/sc-0000000000000002") // shares a prefix, not the directory

	if _, err := New(Config{Dir: dir, SandboxUID: -1, SandboxGID: -1}); err != nil {
		t.Fatal(err)
	}
	if !ours.exited(5 * time.Second) {
		t.Fatal("a stray of this backend's directory survived New")
	}
	if ws, ok := ours.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the stray ended with %v, want SIGKILL", ours.cmd.ProcessState)
	}
	if other.exited(200*time.Millisecond) || sibling.exited(200*time.Millisecond) {
		t.Fatal("a process of another directory was killed")
	}
}

func TestDestroyKillsStraysOfThatSandbox(t *testing.T) {
	b := newTestBackend(t, daemonUID)
	id := create(t, b, backend.Spec{})
	stray := startMarked(t, b.sandboxDir(id))
	keep := startMarked(t, b.sandboxDir("sc-ffffffffffffffff"))
	if err := b.Destroy(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	if !stray.exited(5 * time.Second) {
		t.Fatal("destroy left a process of the sandbox running")
	}
	if keep.exited(200 * time.Millisecond) {
		t.Fatal("destroy killed a process of another sandbox")
	}
}

func TestStartTimeGuardsAgainstPidReuse(t *testing.T) {
	m := startMarked(t, "/nonexistent/x")
	st, err := startTime(m.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if n := killMarked([]markedProcess{{pid: m.cmd.Process.Pid, startTime: st + 1}}); n != 0 {
		t.Fatal("a process whose start time differs from the record was signalled")
	}
	if m.exited(200 * time.Millisecond) {
		t.Fatal("the process died")
	}
	if n := killMarked([]markedProcess{{pid: m.cmd.Process.Pid, startTime: st}}); n != 1 {
		t.Fatal("the recorded process was not signalled")
	}
	// killMarked returns once it is gone (a zombie of this test, its mount
	// namespace and the disk it held released), not merely signalled.
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", m.cmd.Process.Pid))
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return // reaped already (ESRCH: between the open and the read)
	}
	if err != nil {
		t.Fatal(err)
	}
	// Z: a zombie; X: being reaped right now (by this test's own Wait).
	if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(f) == 0 || (f[0] != "Z" && f[0] != "X") {
		t.Errorf("killMarked returned while the process still ran: %s", stat)
	}
}

func TestMarkerNamesNoHostPath(t *testing.T) {
	dir := "/var/lib/sandbox-sidecar/bwrap/sc-0123"
	m := marker(dir)
	if strings.Contains(m, "/") || strings.Contains(m, "sandbox-sidecar") || !strings.HasSuffix(m, "-sc-0123") {
		t.Errorf("marker(%q) = %q: it must name the sandbox without a host path", dir, m)
	}
	if !strings.HasPrefix(m, markerPrefix(filepath.Dir(dir))) || strings.HasPrefix(m, markerPrefix(dir+"x")) {
		t.Errorf("marker prefixes do not separate directories: %q", m)
	}
}

// A sandbox's start flag (startFlagName) is in its directory from before
// bwrap is spawned until its init is ready, and only then: a daemon's
// start-up looks for strays (as a non-root daemon, once per uid) only
// where one is left.
func TestStartFlagMarksOnlyAStartUnderWay(t *testing.T) {
	var atSpawn atomic.Int32 // flags present when bwrap had just been spawned
	var dir atomic.Value
	b := newTestBackend(t, daemonUID, func(c *Config) {
		c.Failpoint = func(name string) {
			if d, ok := dir.Load().(string); ok && name == FailInitSpawned {
				if startFlagged(d) {
					atSpawn.Add(1)
				}
			}
		}
	})
	dir.Store(b.sandboxDir("flagged"))
	if _, err := b.Create(t.Context(), "flagged", backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	res, err := b.Exec(t.Context(), "flagged", backend.ExecRequest{Command: "true", Timeout: 10 * time.Second})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %v %+v", err, res)
	}
	if got := atSpawn.Load(); got != 1 {
		t.Fatalf("the start flag was there at %d of 1 spawns", got)
	}
	if startFlagged(b.sandboxDir("flagged")) {
		t.Fatal("the start flag outlived a start that ended with the init ready")
	}
	// A flag a crash left (the start was under way) stays until the
	// sandbox's next start, which removes it once its init is ready.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := writeStartFlag(b.sandboxDir("flagged")); err != nil {
		t.Fatal(err)
	}
	b2 := newTestBackend(t, daemonUID, func(c *Config) { c.Dir = b.cfg.Dir })
	t.Cleanup(func() { b2.Destroy(context.Background(), "flagged") })
	if !startFlagged(b2.sandboxDir("flagged")) {
		t.Fatal("a new backend removed the flag of a start it never saw end")
	}
	if err := b2.Adopt(t.Context(), "flagged"); err != nil {
		t.Fatal(err)
	}
	if res, err := b2.Exec(t.Context(), "flagged", backend.ExecRequest{Command: "true", Timeout: 10 * time.Second}); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec after adopt: %v %+v", err, res)
	}
	if startFlagged(b2.sandboxDir("flagged")) {
		t.Fatal("the adopted sandbox's next start left the flag")
	}
}
