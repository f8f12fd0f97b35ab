package bwrap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap/bwwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/hostids"
)

// skipOrFail skips the test on a workstation that lacks what it needs, but
// fails it when CI=true: there a missing bwrap or root is a broken runner.
func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// testMode is one way the daemon can run bwrap.
type testMode struct {
	name string
	uid  int  // Config.SandboxUID and SandboxGID
	own  bool // a uid of its own for every sandbox, from testRange
}

var (
	daemonUID = testMode{"daemon-uid", -1, false}
	// rangeUID is a root daemon's default: a uid of its own per sandbox,
	// 65534 for sandboxes made before the range.
	rangeUID = testMode{"uid-range", 65534, true}
	// sharedUID is every sandbox as 65534 (a root daemon without a range,
	// as before it existed).
	sharedUID = testMode{"uid-65534", 65534, false}
	allModes  = []testMode{daemonUID, rangeUID}
)

// testRange is this test process's share of the default range: a random
// block of it, so test processes running at once rarely share uids.
var testRange = hostids.Range{First: hostids.DefaultFirst + uint32(rand.IntN(hostids.DefaultSize/256))*256, Size: 256}

// config is mode's Config for state directory dir.
func (m testMode) config(dir string) Config {
	cfg := Config{Dir: dir, SandboxUID: m.uid, SandboxGID: m.uid}
	if m.own {
		cfg.UIDRange = testRange
	}
	return cfg
}

// newTestBackend returns a Backend in a fresh state directory, skipping (or
// failing in CI) when bwrap, or root for a SandboxUID, is missing.
func newTestBackend(t *testing.T, mode testMode, tweak ...func(*Config)) *Backend {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		skipOrFail(t, "bubblewrap is not installed: %v", err)
	}
	if mode.uid >= 0 && os.Geteuid() != 0 {
		skipOrFail(t, "running sandboxes as uid %d needs root", mode.uid)
	}
	dir := filepath.Join(t.TempDir(), "state")
	if mode.uid >= 0 {
		// t.TempDir makes 0700 directories; the sandbox uid must traverse.
		for p := filepath.Dir(dir); p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
			if err := os.Chmod(p, 0o711); err != nil {
				t.Fatal(err)
			}
		}
	}
	cfg := mode.config(dir)
	for _, f := range tweak {
		f(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// A sandbox's init outlives its backend (a restarted daemon
	// re-attaches to it): what a test's backends leave running ends with
	// the test.
	t.Cleanup(func() { KillSandboxes(cfg.Dir) })
	if err := b.Health(context.Background()); err != nil {
		skipOrFail(t, "bubblewrap cannot create sandboxes here: %v", err)
	}
	return b
}

func forEachMode(t *testing.T, f func(t *testing.T, b *Backend)) {
	for _, m := range allModes {
		t.Run(m.name, func(t *testing.T) { f(t, newTestBackend(t, m)) })
	}
}

var idSeq int

// create makes a sandbox with a fresh id and destroys it when the test ends.
func create(t *testing.T, b *Backend, spec backend.Spec) string {
	t.Helper()
	idSeq++
	id := "t" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(id) > 50 {
		id = id[:50]
	}
	id = strings.Trim(id, "-") + "-" + strconv.Itoa(idSeq) + "t" + time.Now().Format("150405")
	info, err := b.Create(context.Background(), id, spec)
	if err != nil {
		t.Fatalf("Create(%s): %v", id, err)
	}
	if info.Workdir != "/workspace" {
		t.Fatalf("Workdir = %q", info.Workdir)
	}
	t.Cleanup(func() { _ = b.Destroy(context.Background(), id) })
	return id
}

// run executes a shell command with a generous budget and fails the test
// on an error.
func run(t *testing.T, b *Backend, id, command string) backend.ExecResult {
	t.Helper()
	res, err := b.Exec(context.Background(), id, backend.ExecRequest{Command: command, Timeout: 30 * time.Second, MaxOutputBytes: 1 << 20})
	if err != nil {
		t.Fatalf("Exec(%q): %v", command, err)
	}
	return res
}

// runOK is run, also requiring exit status 0.
func runOK(t *testing.T, b *Backend, id, command string) string {
	t.Helper()
	res := run(t, b, id, command)
	if res.ExitCode != 0 {
		t.Fatalf("Exec(%q): exit %d, stdout %q, stderr %q", command, res.ExitCode, res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}

func wantErr(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("err = %v, want one wrapping %q", err, target)
	}
}

// hostProcesses returns the pids on the host whose command line is exactly
// argv.
func hostProcesses(argv ...string) []string {
	want := []byte(strings.Join(argv, "\x00") + "\x00")
	matches, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []string
	for _, m := range matches {
		if b, err := os.ReadFile(m); err == nil && bytes.Equal(b, want) {
			pids = append(pids, filepath.Base(filepath.Dir(m)))
		}
	}
	return pids
}

func waitNoProcess(t *testing.T, limit time.Duration, argv ...string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		pids := hostProcesses(argv...)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes %q still running on the host after %v: pids %v", strings.Join(argv, " "), limit, pids)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// processesContaining returns the pids on the host whose command line,
// its arguments joined by spaces, contains s.
func processesContaining(s string) []int {
	matches, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []int
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil || !strings.Contains(strings.ReplaceAll(string(b), "\x00", " "), s) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(m))); err == nil && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitProcessesContaining waits until at least n host processes' command
// lines contain s.
func waitProcessesContaining(t *testing.T, limit time.Duration, n int, s string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for len(processesContaining(s)) < n {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d processes %q appeared within %v: %v", n, s, limit, processesContaining(s))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitNoProcessContaining waits until no host process's command line
// contains s.
func waitNoProcessContaining(t *testing.T, limit time.Duration, s string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		pids := processesContaining(s)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes %q still running on the host after %v: pids %v", s, limit, pids)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// initPID returns the host pid of sandbox id's init, or 0 if it has none:
// the process carrying both the init flag and the sandbox's marker.
func initPID(t *testing.T, b *Backend, id string) int {
	t.Helper()
	if pids := initPIDs(b, id); len(pids) > 0 {
		return pids[0]
	}
	return 0
}

// forgetInit stops sb's init as a daemon restart would: the sandbox is
// left without one, not terminated, and its next command or Warm starts
// another.
func forgetInit(b *Backend, sb *sandbox) {
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	b.stopInit(sb.init)
	sb.init = nil
}

// initPIDs returns the pids of every init of sandbox id: processes with
// the init's variable and the sandbox's marker in their environment.
func initPIDs(b *Backend, id string) []int {
	flag, mark := bwwire.InitEnv+"=1", markerEnv+"="+marker(b.sandboxDir(id))
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			continue
		}
		vars := strings.Split(string(env), "\x00")
		if slices.Contains(vars, flag) && slices.Contains(vars, mark) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// sleepToken returns an argument for sleep that no other test uses, so
// that the test can find its own sleeps among the host's processes.
func sleepToken(t *testing.T) string {
	t.Helper()
	var n uint32
	for _, c := range t.Name() + time.Now().String() {
		n = n*31 + uint32(c)
	}
	return fmt.Sprintf("%d.%d", 2000+n%7000, time.Now().UnixNano()%1000)
}

// countFDs returns how many descriptors this process has open.
func countFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries) - 1 // the directory being read
}

// sandboxUID is the host uid sandbox id runs as (-1: the daemon's).
func sandboxUID(t testing.TB, b *Backend, id string) int {
	t.Helper()
	sb, err := b.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	return sb.uid
}

// known returns the state of sandbox id, which b must know.
func known(t *testing.T, b *Backend, id string) *sandbox {
	t.Helper()
	sb, err := b.lookup(id)
	if err != nil {
		t.Fatalf("sandbox %s: %v", id, err)
	}
	return sb
}
