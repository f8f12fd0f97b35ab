package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostback"
)

func TestMain(m *testing.M) {
	// The bwrap backend runs this binary as each sandbox's init.
	bwrap.InitMain()
	// The truncated-journal test runs OpenJournal in a child process (a
	// fault while reading a damaged file kills the whole process), and
	// this is that child.
	if dir := os.Getenv(childOpenJournalEnv); dir != "" {
		os.Exit(childOpenJournal(dir))
	}
	os.Exit(m.Run())
}

// skipOrFail skips the test on a workstation that lacks what it needs, but
// fails it when CI=true: there a missing bwrap is a broken runner.
func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// requireBwrap skips (or fails in CI) when bubblewrap is not installed.
func requireBwrap(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		skipOrFail(t, "bubblewrap is not installed: %v", err)
	}
}

// newBwrap returns the real bwrap backend on dir, skipping (or failing in
// CI) when bubblewrap cannot create sandboxes here.
func newBwrap(t testing.TB, dir string, tweak ...func(*bwrap.Config)) *bwrap.Backend {
	t.Helper()
	requireBwrap(t)
	cfg := bwrap.Config{Dir: dir, SandboxUID: -1, SandboxGID: -1}
	for _, f := range tweak {
		f(&cfg)
	}
	b, err := bwrap.New(cfg)
	require.NoError(t, err)
	// Sandboxes' inits outlive their backend: end the test's with it.
	t.Cleanup(func() { bwrap.KillSandboxes(cfg.Dir) })
	if err := b.Health(context.Background()); err != nil {
		skipOrFail(t, "bubblewrap cannot create sandboxes here: %v", err)
	}
	return b
}

// newHost returns the host test backend on dir.
func newHost(t testing.TB, dir string, script hostback.Script) *hostback.Backend {
	t.Helper()
	b, err := hostback.New(hostback.Config{Dir: dir, Script: script})
	require.NoError(t, err)
	return b
}

// newBase returns a second backend of the env's kind on its directory, as
// a restarted daemon would make.
func (e *testEnv) newBase() backend.Backend {
	e.t.Helper()
	if e.bw != nil {
		return newBwrap(e.t, e.bwrapDir, e.bwrapCfg...)
	}
	return newHost(e.t, e.bwrapDir, nil)
}

// workdir and network are what the env's backend reports of a new
// sandbox: bwrap's /workspace and no network, the host backend's directory
// on the host and the host's network.
func (e *testEnv) workdir(id string) string {
	if e.bw != nil {
		return "/workspace"
	}
	return filepath.Join(e.bwrapDir, id, "work")
}

func (e *testEnv) network() string {
	if e.bw != nil {
		return "none"
	}
	return "host"
}

// fakeClock is an injectable clock (Config.Now) moved by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

var clockStart = time.Date(2031, 3, 14, 9, 26, 53, 0, time.UTC)

func newClock() *fakeClock { return &fakeClock{now: clockStart} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// testEnv is a manager in a fresh state directory, on the host test
// backend (backend/hostback: real commands and files, no bubblewrap
// needed) or, withBwrap, on the real bwrap backend.
type testEnv struct {
	t        *testing.T
	m        *Manager
	bw       *bwrap.Backend    // withBwrap
	host     *hostback.Backend // otherwise
	base     backend.Backend   // bw or host
	be       backend.Backend   // what the manager drives (base, or a wrapper of it)
	clock    *fakeClock
	stateDir string
	bwrapDir string
	journal  *Journal
	bwrapCfg []func(*bwrap.Config) // tweaks of the backend's config, again at restart
}

type envOpt func(*envSetup)

type envSetup struct {
	journal  bool
	cfg      func(*Config)
	wrap     func(backend.Backend) backend.Backend
	bwrap    bool
	bwrapCfg []func(*bwrap.Config)
	script   hostback.Script
}

// withBwrapConfig runs the manager on the real bwrap backend (withBwrap),
// configured by f.
func withBwrapConfig(f func(*bwrap.Config)) envOpt {
	return func(s *envSetup) { s.bwrap, s.bwrapCfg = true, append(s.bwrapCfg, f) }
}

// withHost gives the host test backend script, which decides the commands
// it names.
func withHost(script hostback.Script) envOpt {
	return func(s *envSetup) { s.script = script }
}

// onBwrap makes every env use the bwrap backend (TestBwrapManager).
var onBwrap bool

// withBwrap runs the manager on the real bwrap backend, for the tests that
// need what only it does (isolation, network and resource specs); they say
// Bwrap in their names, and skip without bubblewrap except under CI=true.
func withBwrap() envOpt { return func(s *envSetup) { s.bwrap = true } }

func withJournal() envOpt { return func(s *envSetup) { s.journal = true } }

func withConfig(f func(*Config)) envOpt { return func(s *envSetup) { s.cfg = f } }

func withWrapper(f func(backend.Backend) backend.Backend) envOpt {
	return func(s *envSetup) { s.wrap = f }
}

func newEnv(t *testing.T, opts ...envOpt) *testEnv {
	t.Helper()
	var s envSetup
	for _, o := range opts {
		o(&s)
	}
	stateDir := t.TempDir()
	e := &testEnv{t: t, clock: newClock(), stateDir: stateDir, bwrapDir: filepath.Join(stateDir, "bwrap"), bwrapCfg: s.bwrapCfg}
	if s.bwrap || onBwrap {
		e.bw = newBwrap(t, e.bwrapDir, s.bwrapCfg...)
		e.base = e.bw
	} else {
		e.host = newHost(t, e.bwrapDir, s.script)
		e.base = e.host
	}
	e.be = e.base
	if s.wrap != nil {
		e.be = s.wrap(e.base)
	}
	if s.journal {
		j, moved, err := OpenJournal(stateDir)
		require.NoError(t, err)
		require.Empty(t, moved)
		e.journal = j
		t.Cleanup(func() { _ = j.Close() })
	}
	cfg := Config{Backend: e.be, Journal: e.journal, Now: e.clock.Now}
	if s.cfg != nil {
		s.cfg(&cfg)
	}
	m, err := New(cfg)
	require.NoError(t, err)
	e.m = m
	// Registered after the journal's cleanup, so it runs before it.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = m.Close(ctx)
	})
	return e
}

// Callers used throughout.
var (
	alice = Caller{UID: 1000, PID: 4242, ConnID: 1}
	bob   = Caller{UID: 1001, PID: 4343, ConnID: 2}
	admin = Caller{UID: 0, PID: 1, ConnID: 3, Admin: true}
)

func (e *testEnv) create(c Caller, req CreateRequest) Sandbox {
	e.t.Helper()
	s, err := e.m.Create(context.Background(), c, req)
	require.NoError(e.t, err)
	require.Equal(e.t, StateReady, s.State)
	return s
}

// listed returns the ids the backend has on disk.
func (e *testEnv) listed() []string {
	e.t.Helper()
	ids, err := e.base.List(context.Background())
	require.NoError(e.t, err)
	return ids
}

// dirExists reports whether sandbox id's directory exists on the host.
func (e *testEnv) dirExists(id string) bool {
	_, err := os.Stat(filepath.Join(e.bwrapDir, id))
	return err == nil
}

// workspaceExists reports whether sandbox id's workspace exists on the host.
func (e *testEnv) workspaceExists(id string) bool {
	_, err := os.Stat(filepath.Join(e.bwrapDir, id, "work")) // the same in both backends
	return err == nil
}

func (e *testEnv) journaled() map[string]journalRecord {
	e.t.Helper()
	return journalMap(e.t, e.journal)
}

func journalMap(t testing.TB, j *Journal) map[string]journalRecord {
	t.Helper()
	all, err := j.All()
	require.NoError(t, err)
	out := map[string]journalRecord{}
	for _, r := range all {
		out[r.ID] = r
	}
	return out
}

func (e *testEnv) exec(c Caller, id, command string) backend.ExecResult {
	e.t.Helper()
	res, err := e.m.Exec(context.Background(), c, id, backend.ExecRequest{Command: command, Timeout: 30 * time.Second})
	require.NoError(e.t, err)
	return res
}

// sandboxIDs returns the ids of sandboxes.
func sandboxIDs(list []Sandbox) []string {
	out := make([]string, 0, len(list))
	for _, s := range list {
		out = append(out, s.ID)
	}
	return out
}

// faultyBackend wraps a real backend and injects failures on purpose: it
// exists only to test the manager's handling of a backend that fails,
// which a real backend cannot be made to do reliably. Everything else goes
// to the real backend.
type faultyBackend struct {
	backend.Backend
	// destroyFailures is how many Destroy calls still fail.
	destroyFailures atomic.Int32
	destroyCalls    atomic.Int32
	// createAfter makes Create fail after the real backend made the
	// sandbox (a failure half-way); createBefore makes it fail before.
	createAfter  atomic.Bool
	createBefore atomic.Bool
	listFails    atomic.Bool
}

var errInjected = errors.New("injected backend failure")

func (f *faultyBackend) Destroy(ctx context.Context, id string) error {
	f.destroyCalls.Add(1)
	if f.destroyFailures.Add(-1) >= 0 {
		return errInjected
	}
	f.destroyFailures.Store(0)
	return f.Backend.Destroy(ctx, id)
}

func (f *faultyBackend) Create(ctx context.Context, id string, spec backend.Spec) (backend.Info, error) {
	if f.createBefore.Load() {
		return backend.Info{}, errInjected
	}
	info, err := f.Backend.Create(ctx, id, spec)
	if err == nil && f.createAfter.Load() {
		return backend.Info{}, errInjected
	}
	return info, err
}

func (f *faultyBackend) List(ctx context.Context) ([]string, error) {
	if f.listFails.Load() {
		return nil, errInjected
	}
	return f.Backend.List(ctx)
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

// failpointPanic is what an armed failpoint panics with.
type failpointPanic struct{ name string }

// failpoints arms one failpoint at a time; an armed one panics, like a
// daemon killed at that moment.
type failpoints struct{ armed atomic.Value }

func (f *failpoints) arm(name string) { f.armed.Store(name) }
func (f *failpoints) disarm()         { f.armed.Store("") }

func (f *failpoints) hook(name string) {
	if v, _ := f.armed.Load().(string); v != "" && v == name {
		panic(failpointPanic{name})
	}
}

// crashAt runs op and requires it to stop at failpoint name.
func crashAt(t *testing.T, name string, op func()) {
	t.Helper()
	hit := func() (hit bool) {
		defer func() {
			if r := recover(); r != nil {
				fp, ok := r.(failpointPanic)
				if !ok {
					panic(r)
				}
				require.Equal(t, name, fp.name)
				hit = true
			}
		}()
		op()
		return false
	}()
	require.True(t, hit, "failpoint %s was never reached", name)
}
