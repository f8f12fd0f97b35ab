package e2e

import (
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/internal/runscpin"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// pinnedRunsc is where scripts/install-runsc.sh caches the pinned build.
const pinnedRunsc = runscpin.Path

// testRunsc finds runsc ($SANDBOX_SIDECAR_RUNSC, the pinned build, PATH):
// without one the test skips, and under CI=true fails.
func testRunsc(t *testing.T) string {
	t.Helper()
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
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true: runsc is not installed (scripts/test.sh installs it)")
	}
	t.Skip("runsc is not installed; run scripts/install-runsc.sh as root")
	return ""
}

// gvisorState is what the gvisor backend has on the host under stateDir:
// its sandbox directories, the sandboxes runsc lists in its root, and the
// host processes of runsc running with that root, counted by the sandbox
// their bundle is of ("" for none).
func gvisorState(t *testing.T, runsc, stateDir string) (dirs, listed []string, procs map[string]int) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(stateDir, "gvisor"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "sc-") {
			dirs = append(dirs, e.Name())
		}
	}
	root := "--root=" + filepath.Join(stateDir, "gvisor", ".runsc")
	out, err := exec.Command(runsc, root, "list", "--quiet").CombinedOutput()
	require.NoError(t, err, "runsc list: %s", out)
	for _, l := range strings.Fields(string(out)) {
		listed = append(listed, l)
	}
	procs = map[string]int{}
	pe, _ := os.ReadDir("/proc")
	for _, e := range pe {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(b), root+"\x00") {
			continue
		}
		argv := strings.Split(string(b), "\x00")
		sandbox := ""
		for i, a := range argv {
			bundle, ok := strings.CutPrefix(a, "--bundle=")
			if !ok && a == "--bundle" && i+1 < len(argv) {
				bundle, ok = argv[i+1], true
			}
			if ok {
				sandbox = filepath.Base(filepath.Dir(bundle))
			}
		}
		procs[sandbox]++
	}
	sort.Strings(dirs)
	sort.Strings(listed)
	return dirs, listed, procs
}

// TestGVisorCrashAtEveryPhase is the kill -9 matrix on the gvisor backend:
// the daemon SIGKILLs itself at each point between durable steps of create
// and destroy, and after each restart only the leased sandbox is left (its
// files, re-adopted, and its gVisor sandbox, which outlives the daemon):
// runsc lists nothing else and no other runsc process of this state
// directory runs.
func TestGVisorCrashAtEveryPhase(t *testing.T) {
	runsc := testRunsc(t)
	const iterations = 5
	phases := []string{lifecycle.FailCreateReserved, lifecycle.FailCreateJournaled, lifecycle.FailCreateBackend, lifecycle.FailDestroyJournal, lifecycle.FailDestroyBackend}
	for _, phase := range phases {
		t.Run(phase, func(t *testing.T) {
			d := startDaemon(t, "", "--backend", "gvisor", "--gvisor-runsc-path", runsc)
			c := d.client(t)
			keeper := create(t, c, map[string]any{"spec": map[string]any{"owner": "dag/keep"}, "ttl_s": 600})
			assert.Equal(t, "kept\n", string(run(t, c, keeper, "echo kept > f; cat f").Stdout))
			c.Close()
			for i := range iterations {
				d.stop()
				d.env = []string{"SANDBOX_SIDECAR_FAILPOINT=" + phase}
				d.restart()
				c := d.client(t)
				var victim string
				if strings.HasPrefix(phase, "destroy") {
					victim = create(t, c, map[string]any{"ttl_s": 600})
					go c.Call(context.Background(), ipc.OpDestroy, map[string]any{"sandbox": victim}, nil)
				} else {
					go c.Call(context.Background(), ipc.OpCreate, map[string]any{"ttl_s": 600}, nil)
				}
				select {
				case <-d.proc.Done():
				case <-time.After(30 * time.Second):
					t.Fatalf("iteration %d: the daemon did not hit failpoint %s", i, phase)
				}
				c.Close()
				d.env = nil
				d.restart()
				recovered(t, d)
				ids := listed(t, d)
				assert.Equal(t, []string{keeper}, ids, "iteration %d: only the leased sandbox survives", i)
				var dirs, inRunsc []string
				var procs map[string]int
				eventually(t, 30*time.Second, "the sweep of what the dead daemon was making", func() bool {
					dirs, inRunsc, procs = gvisorState(t, runsc, d.stateDir)
					return len(inRunsc) <= 1 && len(procs) <= 1
				})
				assert.Equal(t, ids, dirs, "iteration %d: the journal and the backend's directories agree", i)
				assert.Equal(t, []string{keeper}, inRunsc, "iteration %d: runsc lists other sandboxes than the kept one's", i)
				assert.Equal(t, []string{keeper}, slices.Collect(maps.Keys(procs)), "iteration %d: runsc processes of other sandboxes than the kept one's survive", i)
				if t.Failed() {
					t.Logf("daemon log:\n%s", d.Logs())
					return
				}
			}
			// The re-adopted sandbox boots again and still has its files.
			c = d.client(t)
			assert.Equal(t, "kept\n", string(run(t, c, keeper, "cat f").Stdout))
		})
	}
}
