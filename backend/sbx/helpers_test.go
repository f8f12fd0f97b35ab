package sbx

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/statedir"
)

// The fake sbx (./sbxfake), built once per test binary by TestMain.
var (
	fakeBin      string
	fakeBuildErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sbxfake-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fakeBin, fakeBuildErr = buildFake(dir)
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// buildFake compiles ./sbxfake into dir with the go tool that runs the
// tests.
func buildFake(dir string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(dir, "sbx")
	cmd := exec.Command(goBin, "build", "-o", out, "./sbxfake")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./sbxfake: %v\n%s", err, msg)
	}
	return out, nil
}

// skipOrFail skips the test on a workstation that lacks what it needs, but
// fails it when CI=true: there a missing tool is a broken runner.
func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// fakeHost is one fake sbx installation: its state directory, and the
// backend's state directory and KVM device.
type fakeHost struct {
	t     testing.TB
	state string // SBXFAKE_STATE
	dir   string // Config.Dir
	kvm   string
}

func newFakeHost(t testing.TB) *fakeHost {
	t.Helper()
	if fakeBuildErr != nil {
		skipOrFail(t, "cannot build the fake sbx: %v", fakeBuildErr)
	}
	for _, tool := range []string{"timeout", "realpath", "stat", "head", "mktemp", "sh"} {
		if _, err := exec.LookPath(tool); err != nil {
			skipOrFail(t, "the fake sbx runs commands on this host, which lacks %s: %v", tool, err)
		}
	}
	root := testRoot(t)
	f := &fakeHost{t: t, state: filepath.Join(root, "fake"), dir: filepath.Join(root, "state", "sbx"), kvm: filepath.Join(root, "kvm")}
	if err := os.WriteFile(f.kvm, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	return f
}

// testRoot returns a fresh directory for one fake host, outside /tmp when it
// can: file operations may reach /tmp, so a workdir under /tmp would make
// "../x" a legitimate path and hide the confinement checks.
func testRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "sbx-test-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { _ = statedir.RemoveAll(dir) })
	return dir
}

// config is a Config for this fake with short timings.
func (f *fakeHost) config(tweak ...func(*Config)) Config {
	cfg := Config{
		Dir:         f.dir,
		SbxPath:     fakeBin,
		Env:         []string{"SBXFAKE_STATE=" + f.state},
		HostPolicy:  PolicyDenyAll,
		KVMDevice:   f.kvm,
		ListTimeout: 3 * time.Second,
		KillAfter:   testKillAfter,
		ExecGrace:   2 * time.Second,
	}
	for _, fn := range tweak {
		fn(&cfg)
	}
	return cfg
}

const testKillAfter = 500 * time.Millisecond

func (f *fakeHost) backend(tweak ...func(*Config)) *Backend {
	f.t.Helper()
	b, err := New(f.config(tweak...))
	if err != nil {
		f.t.Fatal(err)
	}
	return b
}

func newFakeBackend(t testing.TB, tweak ...func(*Config)) (*Backend, *fakeHost) {
	t.Helper()
	f := newFakeHost(t)
	return f.backend(tweak...), f
}

// set turns on a fake behaviour (see sbxfake's doc); unset turns it off.
func (f *fakeHost) set(name, value string) {
	f.t.Helper()
	if err := os.MkdirAll(f.state, 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.state, name), []byte(value), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeHost) unset(name string) { _ = os.Remove(filepath.Join(f.state, name)) }

// sbx runs the fake directly, as an operator would, behind the backend's
// back; it returns stdout and the exit status.
func (f *fakeHost) sbx(args ...string) (string, int) {
	f.t.Helper()
	cmd := exec.Command(fakeBin, args...)
	cmd.Env = append(os.Environ(), "SBXFAKE_STATE="+f.state)
	out, err := cmd.Output()
	var exitErr *exec.ExitError
	switch {
	case errors.As(err, &exitErr):
		return string(out), exitErr.ExitCode()
	case err != nil:
		f.t.Fatal(err)
	}
	return string(out), 0
}

// names returns the sandboxes the fake has.
func (f *fakeHost) names() []string {
	f.t.Helper()
	out, code := f.sbx("ls", "-q")
	if code != 0 {
		f.t.Fatalf("sbx ls -q exited %d", code)
	}
	return strings.Fields(out)
}

// calls returns the argument lists of every fake invocation so far,
// without the global flags before the command (--no-input).
func (f *fakeHost) calls() [][]string {
	f.t.Helper()
	var out [][]string
	for _, args := range f.rawCalls() {
		for len(args) > 0 && (args[0] == "--no-input" || args[0] == "-D") {
			args = args[1:]
		}
		out = append(out, args)
	}
	return out
}

// rawCalls returns the argument lists of every fake invocation so far.
func (f *fakeHost) rawCalls() [][]string {
	f.t.Helper()
	data, err := os.ReadFile(filepath.Join(f.state, "calls.log"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		f.t.Fatal(err)
	}
	var out [][]string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var c struct{ Args []string }
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			f.t.Fatalf("calls.log: %v", err)
		}
		out = append(out, c.Args)
	}
	return out
}

// envs returns the environment of every fake invocation so far.
func (f *fakeHost) envs() [][]string {
	f.t.Helper()
	data, err := os.ReadFile(filepath.Join(f.state, "calls.log"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		f.t.Fatal(err)
	}
	var out [][]string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var c struct{ Env []string }
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			f.t.Fatalf("calls.log: %v", err)
		}
		out = append(out, c.Env)
	}
	return out
}

// checkSbxNeverSaw fails the test if any fake invocation's environment
// held one of names.
func (f *fakeHost) checkSbxNeverSaw(names ...string) {
	f.t.Helper()
	for _, env := range f.envs() {
		for _, kv := range env {
			k, _, _ := strings.Cut(kv, "=")
			if slices.Contains(names, k) {
				f.t.Errorf("sbx was run with %s in its environment", kv)
			}
		}
	}
}

// called reports whether some invocation began with prefix.
func (f *fakeHost) called(prefix ...string) bool {
	return slices.ContainsFunc(f.calls(), func(args []string) bool {
		return len(args) >= len(prefix) && slices.Equal(args[:len(prefix)], prefix)
	})
}

// callsOf returns the fake invocations whose arguments start with prefix.
func (f *fakeHost) callsOf(prefix ...string) [][]string {
	var out [][]string
	for _, args := range f.calls() {
		if len(args) >= len(prefix) && slices.Equal(args[:len(prefix)], prefix) {
			out = append(out, args)
		}
	}
	return out
}

// envFile is what the fake saw of an env file sbx exec read.
type envFile struct {
	Path, Mode string
	UID        uint32
}

// envFiles returns the env files the fake's exec read, in order.
func (f *fakeHost) envFiles() []envFile {
	f.t.Helper()
	data, err := os.ReadFile(filepath.Join(f.state, "envfiles.log"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		f.t.Fatal(err)
	}
	var out []envFile
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		var e envFile
		if err := json.Unmarshal(line, &e); err != nil {
			f.t.Fatalf("envfiles.log: %v", err)
		}
		out = append(out, e)
	}
	return out
}

func newID() string {
	raw := make([]byte, 8)
	_, _ = rand.Read(raw)
	return "sc-" + hex.EncodeToString(raw)
}

// create makes a sandbox and destroys it when the test ends.
func create(t *testing.T, b *Backend, spec backend.Spec) (string, backend.Info) {
	t.Helper()
	id := newID()
	info, err := b.Create(context.Background(), id, spec)
	if err != nil {
		t.Fatalf("Create(%s): %v", id, err)
	}
	t.Cleanup(func() { _ = b.Destroy(context.Background(), id) })
	return id, info
}

func run(t *testing.T, b *Backend, id, command string) backend.ExecResult {
	t.Helper()
	res, err := b.Exec(context.Background(), id, backend.ExecRequest{Command: command, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("Exec(%q): %v", command, err)
	}
	return res
}

func wantErr(t *testing.T, err, target error, hints ...string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("err = %v, want one wrapping %q", err, target)
	}
	for _, h := range hints {
		if !strings.Contains(err.Error(), h) {
			t.Errorf("err = %v; want it to say %q", err, h)
		}
	}
}

func boolPtr(v bool) *bool { return &v }

// callsContain reports whether a fake invocation has args as a run.
func (f *fakeHost) callsContain(args ...string) bool {
	return slices.ContainsFunc(f.calls(), func(c []string) bool {
		for i := 0; i+len(args) <= len(c); i++ {
			if slices.Equal(c[i:i+len(args)], args) {
				return true
			}
		}
		return false
	})
}

// autoStop makes the fake stop a sandbox grace after its last session and
// take boot to start it again; the returned tweak tells the backend sbx's
// grace.
func (f *fakeHost) autoStop(grace, boot time.Duration) func(*Config) {
	f.t.Helper()
	f.set("auto-stop-grace", grace.String())
	f.set("boot-delay", boot.String())
	return func(c *Config) { c.AutoStopGrace = grace }
}

// status is sbx ls --json's status of sandbox name (as the fake sees it
// now), or "" when it has none.
func (f *fakeHost) status(name string) string {
	f.t.Helper()
	out, code := f.sbx("ls", "--json")
	if code != 0 {
		f.t.Fatalf("sbx ls --json exited %d", code)
	}
	entries, err := parseLs([]byte(out))
	if err != nil {
		f.t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name == name {
			return e.Status
		}
	}
	return ""
}

// waitStopped waits (up to 10 s) until the fake has stopped sandbox name.
func (f *fakeHost) waitStopped(name string) {
	f.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if f.status(name) == "stopped" {
			return
		}
	}
	f.t.Fatalf("sandbox %s did not auto-stop", name)
}
