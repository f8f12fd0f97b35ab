package gvisor

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/backendtest"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

func TestMain(m *testing.M) {
	// This binary is also every test sandbox's init, as the daemon's is.
	InitMain()
	os.Exit(m.Run())
}

// pinnedRunsc is where scripts/install-runsc.sh caches the pinned build.
const pinnedRunsc = "/var/cache/sandbox-sidecar-test/runsc-v0.0.0-20250205023644-9414b50a5633"

// skipOrFail skips the test on a workstation that lacks what it needs, but
// fails it when CI=true: there a missing runsc or root is a broken runner.
func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true: "+format+" (scripts/test.sh installs runsc as root)", args...)
	}
	t.Skipf(format+"; run scripts/install-runsc.sh as root", args...)
}

// testRunsc is the runsc the tests use: $SANDBOX_SIDECAR_RUNSC, or the
// pinned build, or runsc on PATH.
func testRunsc(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(t, "the gvisor backend needs root")
	}
	for _, p := range []string{os.Getenv("SANDBOX_SIDECAR_RUNSC"), pinnedRunsc} {
		if p != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p
	}
	skipOrFail(t, "runsc is not installed (neither %s nor on PATH)", pinnedRunsc)
	return ""
}

// newTestBackend makes a backend in a fresh state directory, destroying
// every sandbox it made when the test ends.
func newTestBackend(t testing.TB, tweak ...func(*Config)) *Backend {
	t.Helper()
	cfg := Config{Dir: filepath.Join(t.TempDir(), "gvisor"), RunscPath: testRunsc(t), KillGrace: 500 * time.Millisecond,
		Limits: limits.Limits{OpenFiles: 1024, FileSizeBytes: 1 << 30}}
	for _, f := range tweak {
		f(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ids, _ := b.List(context.Background())
		for _, id := range ids {
			_ = b.Destroy(context.Background(), id)
		}
		_ = b.Close()
	})
	return b
}

// sandboxPIDs returns the host pids of sandbox id's runsc processes (the
// sentry, its gofer): every process whose command line names its id as a
// runsc container of this backend's root.
func sandboxPIDs(t testing.TB, b *Backend, id string) []int {
	t.Helper()
	out, err := b.cli(context.Background(), cliTimeout, "state", id)
	if err != nil {
		t.Fatalf("runsc state %s: %v", id, err)
	}
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
		t.Fatalf("runsc state %s: %q (%v)", id, out, err)
	}
	pids := []int{st.Pid}
	root := "--root=" + filepath.Join(b.cfg.Dir, runscRootName)
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || pid == st.Pid {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), root) && strings.Contains(string(cmdline), "gofer") &&
			strings.Contains(string(cmdline), id) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestGVisorConformance runs the shared backend suite on gVisor. It needs
// root and runsc: it skips without them on a workstation and fails under
// CI=true.
func TestGVisorConformance(t *testing.T) {
	testRunsc(t)
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		return newTestBackend(t)
	}, backendtest.Options{
		Workdir:            guestWorkspace,
		RealIsolation:      true,
		AcceptBlockNetwork: true,
		KillGrace:          500 * time.Millisecond,
		// Init ends every process of the sandbox when a command ends.
		KillsEscapeesAtTimeout: true,
		// The guest's processes live inside the sentry, not on the host.
		HostProcesses: nil,
		KillSandboxInit: func(b backend.Backend, id string) error {
			for _, pid := range sandboxPIDs(t, b.(*Backend), id) {
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					return err
				}
			}
			return nil
		},
	})
}
