package bwrap

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
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
	uid  int // Config.SandboxUID and SandboxGID
}

var (
	daemonUID = testMode{"daemon-uid", -1}
	nobodyUID = testMode{"uid-65534", 65534}
	allModes  = []testMode{daemonUID, nobodyUID}
)

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
	cfg := Config{Dir: dir, SandboxUID: mode.uid, SandboxGID: mode.uid}
	for _, f := range tweak {
		f(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
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
	id = strings.Trim(id, "-") + "-" + string(rune('a'+idSeq%26)) + time.Now().Format("150405")
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
