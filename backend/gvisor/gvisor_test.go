package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/backendtest"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc/inittest"
	"github.com/sandbox-sidecar/sandbox-sidecar/internal/runscpin"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/cgroup"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

func TestMain(m *testing.M) {
	// This binary is also every test sandbox's init, as the daemon's is.
	InitMain()
	code := m.Run()
	inittest.Remove()
	os.Exit(code)
}

// pinnedRunsc is where scripts/install-runsc.sh caches the pinned build.
const pinnedRunsc = runscpin.Path

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
	root := "--root=" + b.runscRoot()
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

// conformancePreload is what the suite's contexts preload, as on bwrap: a
// module of the standard library no interpreter imports at start, and
// numpy and pandas where the sandbox has them.
var conformancePreload = []string{"decimal", "numpy", "pandas"}

// TestGVisorConformance runs the shared backend suite on gVisor. It needs
// root and runsc: it skips without them on a workstation and fails under
// CI=true.
func TestGVisorConformance(t *testing.T) {
	testRunsc(t)
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		return newTestBackend(t, func(c *Config) { c.Code.Preload = conformancePreload })
	}, backendtest.Options{
		Workdir:            guestWorkspace,
		RealIsolation:      true,
		GuestView:          true,
		AcceptBlockNetwork: true,
		KillGrace:          500 * time.Millisecond,
		// Init ends every process of the sandbox when a command ends.
		KillsEscapeesAtTimeout: true,
		// The guest's processes live inside the sentry, not on the host.
		HostProcesses: nil,
		Processes:     true,
		Code:          true,
		CodePreload:   conformancePreload,
		// runsc pause stops the guest's tasks, cgroup or not.
		Snapshots: true, Freezes: true, Memory: true, Pause: true,
		Reopen: func(t *testing.T, b backend.Backend) backend.Backend {
			// A restart: the daemon before lets go of its sandboxes
			// (as its death or its stop does) before the next starts.
			_ = b.(*Backend).Close()
			nb, err := New(b.(*Backend).cfg)
			if err != nil {
				t.Fatal(err)
			}
			return nb
		},
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

func execOK(t *testing.T, b *Backend, id, command string) string {
	t.Helper()
	res, err := b.Exec(context.Background(), id, backend.ExecRequest{Command: command, Timeout: 30 * time.Second})
	if err != nil || res.ExitCode != 0 || res.SandboxTerminated {
		t.Fatalf("%q: %+v, %v", command, res, err)
	}
	return string(res.Stdout)
}

// TestGVisorFilesVisibleAtOnceBothWays writes on one side and reads on the
// other immediately, many times over with changing sizes: gVisor must not
// serve the guest a cached view of the workspace (or /tmp), and the host
// must see what the guest wrote as soon as the command returns.
func TestGVisorFilesVisibleAtOnceBothWays(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	const id = "files-both-ways"
	if _, err := b.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"/workspace", "/tmp"} {
		for i := range 8 {
			p := dir + "/f"
			// Host then guest: a new size each time (a stale cached size
			// shows as a cut or padded read).
			want := strings.Repeat(fmt.Sprintf("host %d;", i), i+1)
			if err := b.WriteFile(ctx, id, p, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			if got := execOK(t, b, id, "cat "+p); got != want {
				t.Fatalf("guest read %q right after the host wrote %q", got, want)
			}
			// Guest then host.
			want = strings.Repeat(fmt.Sprintf("guest %d;", i), 9-i)
			execOK(t, b, id, fmt.Sprintf("printf %%s '%s' > %s", want, p))
			got, err := b.ReadFile(ctx, id, p, 1<<20)
			if err != nil || string(got) != want {
				t.Fatalf("host read %q (%v) right after the guest wrote %q", got, err, want)
			}
		}
		// A removal on the host is seen inside at once, and one inside on
		// the host.
		if err := os.Remove(filepath.Join(b.sandboxDir(id), map[string]string{"/workspace": workDirName, "/tmp": tmpDirName}[dir], "f")); err != nil {
			t.Fatal(err)
		}
		if got := execOK(t, b, id, "ls -A "+dir); got != "" {
			t.Fatalf("guest still lists %q in %s after the host removed it", got, dir)
		}
		execOK(t, b, id, "echo x > "+dir+"/g && mkdir "+dir+"/d && rm "+dir+"/g")
		entries, err := b.ListDirectory(ctx, id, dir, 10)
		if err != nil || len(entries) != 1 || entries[0].Name != "d" || !entries[0].IsDir {
			t.Fatalf("host lists %+v (%v) in %s, want just the directory d", entries, err, dir)
		}
	}
}

// TestGVisorCommandStdioBlocking: init keeps its own ends of a command's
// pipes non-blocking (in the Go runtime's poller), but the command gets
// blocking descriptors, as from any shell: a program that reads its stdin
// or writes its stdout without handling EAGAIN must work. Also what each
// command inherits from init's own descriptors: nothing beyond 0-2.
func TestGVisorCommandStdioBlocking(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	if _, err := b.Create(ctx, "stdio", backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	const probe = `import fcntl, os
print(*[fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK for fd in (0, 1, 2)], sorted(int(f) for f in os.listdir("/proc/self/fd")))`
	for _, stdin := range [][]byte{nil, []byte("some input\n")} {
		res, err := b.Exec(ctx, "stdio", backend.ExecRequest{Argv: []string{"python3", "-c", probe}, Stdin: stdin, Timeout: 30 * time.Second})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%+v %v", res, err)
		}
		// 3 is the directory listdir reads /proc/self/fd with.
		if got := strings.TrimSpace(string(res.Stdout)); got != "0 0 0 [0, 1, 2, 3]" {
			t.Errorf("stdin %q: the command's O_NONBLOCK of 0, 1, 2 and its descriptors: %q, want \"0 0 0 [0, 1, 2, 3]\"", stdin, got)
		}
	}
}

// TestGVisorCommandStart: init's spawn (initproc.Spawn) inside the
// sentry gives a command the guest's identity with no supplementary
// groups, a session of its own, every signal's disposition its default
// and an empty mask (init itself handles every signal, and its child
// does not reset them one by one), and reports a command that cannot
// start as a shell does: 127 for a missing program, 126 for one that may
// not or cannot be executed, with the errno on stderr.
func TestGVisorCommandStart(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	const id = "start"
	if _, err := b.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	// gVisor's /proc/self/status has no Sig* lines: Python reports the
	// mask, and the disposition of every signal it does not set itself
	// (SIGINT, SIGPIPE, SIGXFSZ) as it found it at start.
	const probe = `import signal
print(sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))
print([n for n in range(1, signal.NSIG) if n not in (2, 9, 13, 19, 25) and signal.getsignal(n) not in (signal.SIG_DFL, None)])`
	res, err := b.Exec(ctx, id, backend.ExecRequest{Argv: []string{"python3", "-c", probe}, Timeout: 30 * time.Second})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%+v %v", res, err)
	}
	if got := string(res.Stdout); got != "[]\n[]\n" {
		t.Errorf("the command's blocked signals, then those not at their default disposition:\n%s", got)
	}
	res, err = b.Exec(ctx, id, backend.ExecRequest{Argv: []string{"cat", "/proc/self/status", "/proc/self/stat"}, Timeout: 30 * time.Second})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%+v %v", res, err)
	}
	status := string(res.Stdout)
	field := func(name string) string {
		for _, line := range strings.Split(status, "\n") {
			if v, ok := strings.CutPrefix(line, name+":"); ok {
				return strings.TrimSpace(v)
			}
		}
		return "(missing)"
	}
	for name, want := range map[string]string{"Uid": "1000\t1000\t1000\t1000", "Gid": "1000\t1000\t1000\t1000"} {
		if got := field(name); got != want {
			t.Errorf("the command's %s: %q, want %q", name, got, want)
		}
	}
	stat := status[strings.LastIndex(status, ")")+2:]
	var state string
	var ppid, pgrp, sid int
	if _, err := fmt.Sscan(stat, &state, &ppid, &pgrp, &sid); err != nil {
		t.Fatalf("stat %q: %v", stat, err)
	}
	if pid := field("Pid"); pid != strconv.Itoa(pgrp) || pid != strconv.Itoa(sid) || ppid != 1 {
		t.Errorf("pid %s, parent %d, process group %d, session %d: want init's child in a session of its own", pid, ppid, pgrp, sid)
	}

	execOK(t, b, id, "printf '#!/bin/sh\\n' > plain; chmod 644 plain; printf '\\177ELF\\0\\0' > garbage; chmod 755 garbage")
	for _, c := range []struct {
		argv   []string
		code   int
		stderr string
	}{
		{[]string{"/no/such"}, 127, "no such file or directory"},
		{[]string{"no-such-command"}, 127, "no such file or directory"},
		{[]string{"./plain"}, 126, "permission denied"},
		{[]string{"/workspace"}, 126, "permission denied"},
		{[]string{"./garbage"}, 126, "exec format error"},
	} {
		res, err := b.Exec(ctx, id, backend.ExecRequest{Argv: c.argv, Timeout: 30 * time.Second})
		if err != nil || res.ExitCode != c.code || !strings.Contains(string(res.Stderr), c.stderr) || res.TimedOut || res.SandboxTerminated {
			t.Errorf("%v: exit %d, stderr %q (%v), want %d and %q", c.argv, res.ExitCode, res.Stderr, err, c.code, c.stderr)
		}
	}
	// And the next command starts as ever.
	if got := execOK(t, b, id, "echo after"); got != "after\n" {
		t.Errorf("after the failures: %q", got)
	}
}

// TestGVisorKilledRunscIsTerminatedNotHung kills a sandbox's runsc
// processes with SIGKILL while a command runs: the command comes back
// SandboxTerminated at once, and the next one finds the sandbox gone.
func TestGVisorKilledRunscIsTerminatedNotHung(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	const id = "killed"
	if _, err := b.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		res backend.ExecResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := b.Exec(ctx, id, backend.ExecRequest{Command: "echo started; sleep 600", Timeout: 20 * time.Minute})
		done <- outcome{res, err}
	}()
	time.Sleep(time.Second)
	for _, pid := range sandboxPIDs(t, b, id) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	select {
	case o := <-done:
		if o.err != nil || !o.res.SandboxTerminated || o.res.Reason() != backend.ReasonSandboxTerminated {
			t.Fatalf("the running command returned %+v, %v; want sandbox_terminated", o.res, o.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the running command did not come back within 20s of its sandbox's death")
	}
	if _, err := b.Exec(ctx, id, backend.ExecRequest{Command: "true", Timeout: time.Minute}); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("the next command: %v, want ErrNotFound", err)
	}
	if err := b.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if ids, _ := b.runscList(ctx); len(ids) != 0 {
		t.Fatalf("runsc still lists %v", ids)
	}
}

// TestGVisorStartErrors: a missing or broken runsc, a relative path and an
// unusable platform are clear start errors.
func TestGVisorStartErrors(t *testing.T) {
	runsc := testRunsc(t)
	dir := t.TempDir()
	notRunsc := filepath.Join(dir, "not-runsc")
	if err := os.WriteFile(notRunsc, []byte("#!/bin/sh\necho 'this is not runsc'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Dir: filepath.Join(dir, "a"), RunscPath: filepath.Join(dir, "missing")}, "no such file"},
		{Config{Dir: filepath.Join(dir, "b"), RunscPath: "runsc-relative"}, "absolute path"},
		{Config{Dir: filepath.Join(dir, "c"), RunscPath: notRunsc}, "not a runsc version"},
		{Config{Dir: filepath.Join(dir, "d"), RunscPath: dir}, "not an executable file"},
		{Config{Dir: filepath.Join(dir, "e"), RunscPath: runsc, Platform: "vmware"}, "unknown platform"},
		{Config{Dir: filepath.Join(dir, "f"), RunscPath: runsc, ExtraFlags: []string{"--network=host"}}, "decides itself"},
		{Config{Dir: "relative", RunscPath: runsc}, "absolute path"},
	} {
		_, err := New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error saying %q", tc.cfg, err, tc.want)
		}
	}
}

// TestGVisorMeasure logs, interleaved in one run, what a command costs
// through the sandbox's init, through a bare `runsc exec` of the same
// command in the same sandbox and run by sh in a loop inside it (the
// floor), and what a create costs; with
// SANDBOX_SIDECAR_GVISOR_MEASURE_FLAGS ("--directfs=false|--platform=ptrace")
// the same for each variant of runsc's flags too, in a sandbox of its own.
// It asserts nothing (performance is never asserted) and runs only with
// SANDBOX_SIDECAR_GVISOR_MEASURE=1.
func TestGVisorMeasure(t *testing.T) {
	if os.Getenv("SANDBOX_SIDECAR_GVISOR_MEASURE") != "1" {
		t.Skip("set SANDBOX_SIDECAR_GVISOR_MEASURE=1 to measure")
	}
	// Variants of runsc's flags to measure beside the backend's own, in
	// sandboxes of their own, interleaved: "--directfs=false|--platform=ptrace".
	variants := []string{""}
	if v := os.Getenv("SANDBOX_SIDECAR_GVISOR_MEASURE_FLAGS"); v != "" {
		variants = append(variants, strings.Split(v, "|")...)
	}
	ctx := context.Background()
	const rounds = 15
	median := func(d []time.Duration) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[len(s)/2]
	}
	const id = "measure-0"
	backends := make([]*Backend, len(variants))
	for i, v := range variants {
		backends[i] = newTestBackend(t, func(c *Config) {
			for _, f := range strings.Fields(v) {
				if p, ok := strings.CutPrefix(f, "--platform="); ok {
					c.Platform = p
				} else {
					c.ExtraFlags = append(c.ExtraFlags, f)
				}
			}
		})
	}
	var creates []time.Duration
	for i := range 5 {
		start := time.Now()
		id := fmt.Sprintf("measure-%d", i)
		if _, err := backends[0].Create(ctx, id, backend.Spec{}); err != nil {
			t.Fatal(err)
		}
		creates = append(creates, time.Since(start))
		if i > 0 {
			_ = backends[0].Destroy(ctx, id)
		}
	}
	t.Logf("create (boot included): median %v", median(creates))
	for _, b := range backends[1:] {
		if _, err := b.Create(ctx, id, backend.Spec{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, argv := range [][]string{{"/bin/true"}, {"python3", "-c", "pass"}} {
		viaInit := make([][]time.Duration, len(variants))
		viaExec := make([][]time.Duration, len(variants))
		inLoop := make([][]time.Duration, len(variants))
		// The floor: the same command run by sh inside the sandbox, in a
		// loop timed inside (a vfork and exec each, no init, no daemon).
		const loopN = 10
		loop := fmt.Sprintf("i=0; s=$(date +%%s%%N); while [ $i -lt %d ]; do %s; i=$((i+1)); done; e=$(date +%%s%%N); echo $(( (e-s)/%d ))",
			loopN, strings.Join(argv, " "), loopN)
		for range rounds {
			for i, b := range backends {
				res, err := b.Exec(ctx, id, backend.ExecRequest{Command: loop, Timeout: time.Minute})
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("loop of %v: %+v %v", argv, res, err)
				}
				ns, err := strconv.ParseInt(strings.TrimSpace(string(res.Stdout)), 10, 64)
				if err != nil {
					t.Fatalf("loop of %v printed %q", argv, res.Stdout)
				}
				inLoop[i] = append(inLoop[i], time.Duration(ns))
				start := time.Now()
				if res, err := b.Exec(ctx, id, backend.ExecRequest{Argv: argv, Timeout: time.Minute}); err != nil || res.ExitCode != 0 {
					t.Fatalf("%v: %+v %v", argv, res, err)
				}
				viaInit[i] = append(viaInit[i], time.Since(start))
				start = time.Now()
				args := append([]string{"exec", "--user", "1000:1000", "--cwd", guestWorkspace, "--env", "PATH=" + guestPath, id}, argv...)
				if out, err := b.cli(ctx, time.Minute, args...); err != nil {
					t.Fatalf("runsc exec %v: %v %s", argv, err, out)
				}
				viaExec[i] = append(viaExec[i], time.Since(start))
			}
		}
		for i, v := range variants {
			if v == "" {
				v = "the backend's flags"
			}
			t.Logf("%v [%s]: through init median %v, bare runsc exec median %v (ratio %.2f); run by sh in a loop inside, each %v",
				argv, v, median(viaInit[i]), median(viaExec[i]), float64(median(viaInit[i]))/float64(median(viaExec[i])), median(inLoop[i]))
		}
	}
}

// testCgroups is a cgroup manager of the test's own (root only).
func testCgroups(t *testing.T) *cgroup.Manager {
	t.Helper()
	base := fmt.Sprintf("sandbox-sidecar-gvisor-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	m, err := cgroup.New(cgroup.Options{Base: base, UnderRoot: true})
	if err != nil {
		skipOrFail(t, "cgroups unavailable: %v", err)
	}
	t.Cleanup(func() {
		names, _ := m.List()
		for _, n := range names {
			_ = m.Remove(context.Background(), n)
		}
		for _, d := range m.Dirs() {
			if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the test's cgroup base %s is left behind: %v", d, err)
			}
		}
	})
	return m
}

// TestGVisorConformanceWithLimits runs the suite again with a cgroup per
// sandbox and the daemon's default limits.
func TestGVisorConformanceWithLimits(t *testing.T) {
	testRunsc(t)
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		// A manager per backend: New removes every cgroup under its base.
		cgm := testCgroups(t)
		return newTestBackend(t, func(c *Config) { c.Cgroups, c.Limits = cgm, limits.Defaults() })
	}, backendtest.Options{
		Workdir: guestWorkspace, RealIsolation: true, GuestView: true, AcceptBlockNetwork: true,
		KillGrace: 500 * time.Millisecond, KillsEscapeesAtTimeout: true, Processes: true,
		Snapshots: true, Freezes: true, Memory: true, Pause: true,
		Code: true,
	})
}

// TestGVisorMemoryLimit: a command that allocates past its sandbox's
// memory limit is killed, reported oom_killed with exit 137, and the
// sandbox lives on (memory.go); a shell whose child was killed so goes on
// with its own status. A spec asking for more than the daemon's maximum,
// or for a disk cap, is refused.
func TestGVisorMemoryLimit(t *testing.T) {
	testRunsc(t)
	cgm := testCgroups(t)
	lim := limits.Defaults()
	b := newTestBackend(t, func(c *Config) { c.Cgroups, c.Limits = cgm, lim })
	ctx := context.Background()
	for _, r := range []backend.Resources{{MemoryBytes: 2 * lim.MemoryBytes}, {DiskBytes: 1 << 20}, {PIDs: -1}} {
		if _, err := b.Create(ctx, "refused", backend.Spec{Resources: r}); !errors.Is(err, backend.ErrSpecUnenforceable) {
			t.Errorf("Create with %+v: %v, want ErrSpecUnenforceable", r, err)
		}
	}
	const py = "py-balloon"
	if _, err := b.Create(ctx, py, backend.Spec{Resources: backend.Resources{MemoryBytes: 256 << 20, PIDs: 64}}); err != nil {
		t.Fatal(err)
	}
	sb, err := b.lookup(py)
	if err != nil || sb.cg == nil {
		t.Fatalf("the sandbox has no cgroup: %v", err)
	}
	pids, err := sb.cg.PIDs()
	if err != nil || len(pids) == 0 {
		t.Fatalf("the sandbox's cgroup holds no process (%v): runsc was not started in it", err)
	}
	balloon := []string{"python3", "-c", "b = []\nfor i in range(64): b.append(bytearray(16 << 20))"}
	res, err := b.Exec(ctx, py, backend.ExecRequest{Argv: balloon, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.SandboxTerminated || !res.OOMKilled || res.OOMKills == 0 || res.ExitCode != backend.ExitKilled || res.Reason() != backend.ReasonOOMKilled {
		t.Fatalf("python3 allocating 1 GiB in 16 MiB blocks under 256 MiB: %+v (reason %s); want oom_killed with exit 137, the sandbox alive", res, res.Reason())
	}
	// A child lost at the limit, its parent going on: the parent's own
	// status, the kill counted.
	res, err = b.Exec(ctx, py, backend.ExecRequest{Command: "python3 -c 'b = []\nfor i in range(64): b.append(bytearray(16 << 20))'; echo after $?", Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.SandboxTerminated || res.ExitCode != 0 || res.OOMKilled || res.OOMKills == 0 || string(res.Stdout) != "after 137\n" {
		t.Errorf("a shell whose python3 was killed at the limit, going on: %+v (stdout %q); want exit 0, oom_kills > 0, not oom_killed", res, res.Stdout)
	}
	if kills, err := sb.cg.OOMKills(); err != nil || kills != 0 {
		t.Errorf("the host's OOM killer killed %d processes of the sandbox (%v); the daemon should have freed the memory first", kills, err)
	}
	if err := b.Destroy(ctx, py); err != nil {
		t.Fatal(err)
	}

	// dd's one 400 MiB buffer, which the sentry itself fills in one
	// read(2) from /dev/zero, faster than the daemon can act: the host's
	// OOM killer may take the sentry at the cgroup's hard limit. Either
	// way the command says it was killed for memory.
	const id = "balloon"
	if _, err := b.Create(ctx, id, backend.Spec{Resources: backend.Resources{MemoryBytes: 256 << 20, PIDs: 64}}); err != nil {
		t.Fatal(err)
	}
	res, err = b.Exec(ctx, id, backend.ExecRequest{Command: `dd if=/dev/zero of=/dev/null bs=400M count=1`, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OOMKilled || res.OOMKills == 0 || (!res.SandboxTerminated && res.ExitCode != backend.ExitKilled) {
		t.Fatalf("dd's 400 MiB buffer under 256 MiB: %+v; want oom_killed", res)
	}
	t.Logf("dd's 400 MiB buffer: sandbox_terminated %v", res.SandboxTerminated)
	if err := b.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if names, _ := cgm.List(); len(names) != 0 {
		t.Fatalf("cgroups left after Destroy: %v", names)
	}
}

// TestGVisorHealthLeavesNothing: Health boots a trial sandbox (under a
// cgroup like any sandbox's) and removes all of it; it reports the runsc
// version and platform.
func TestGVisorHealthLeavesNothing(t *testing.T) {
	testRunsc(t)
	cgm := testCgroups(t)
	b := newTestBackend(t, func(c *Config) { c.Cgroups, c.Limits = cgm, limits.Defaults() })
	if err := b.Health(context.Background()); err != nil {
		t.Fatalf("Health: %v", err)
	}
	if d := b.Describe(); d["platform"] != PlatformSystrap || d["runsc_version"] == "" {
		t.Errorf("Describe: %v", d)
	}
	probes, _ := filepath.Glob(filepath.Join(b.cfg.Dir, probePrefix+"*"))
	names, _ := cgm.List()
	ids, _ := b.runscList(context.Background())
	if len(probes)+len(names)+len(ids) != 0 {
		t.Fatalf("Health left %v, cgroups %v, runsc sandboxes %v", probes, names, ids)
	}
}

// A static build of the daemon serves as the sandboxes' init (StaticInit
// says so), and Warm boots a re-adopted sandbox before its first command.
func TestGVisorStaticInitAndWarm(t *testing.T) {
	static := inittest.Init(t, "exe")
	dir := filepath.Join(t.TempDir(), "gvisor")
	first := newTestBackend(t, func(c *Config) { c.Dir, c.InitPath = dir, static })
	if !first.StaticInit() {
		t.Fatalf("StaticInit is false for %s, built CGO_ENABLED=0 -buildmode=exe", static)
	}
	ctx := context.Background()
	const id = "warmed"
	if _, err := first.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	if got := execOK(t, first, id, "cat /proc/1/comm"); got != "sandbox-init\n" {
		t.Errorf("through the static init: %q", got)
	}
	if err := first.Warm(ctx, id); err != nil {
		t.Errorf("Warm of a booted sandbox: %v", err)
	}
	// A restart: the next backend has no init for it until Warm.
	sb, err := first.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	sb.initMu.Lock()
	sb.init.close()
	sb.init = nil
	sb.initMu.Unlock()
	second := newTestBackend(t, func(c *Config) { c.Dir, c.InitPath = dir, static })
	if err := second.Warm(ctx, id); err != nil {
		t.Fatalf("Warm after a restart: %v", err)
	}
	sb2, err := second.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	sb2.initMu.Lock()
	booted := sb2.init != nil
	sb2.initMu.Unlock()
	if !booted {
		t.Fatal("no init after Warm")
	}
	if got := execOK(t, second, id, "echo warm"); got != "warm\n" {
		t.Errorf("after Warm: %q", got)
	}
	if err := second.Warm(ctx, "no-such-sandbox"); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("Warm of an unknown sandbox: %v, want ErrNotFound", err)
	}
}

// A pool member's Warm has its init run `true` from the sandbox's PATH
// before any client's command, once: here an image's `true` that leaves a
// trace in /tmp. In a root without `true` the warm-up is the init's own
// executable, which exits 0 at once under initproc.WarmEnv.
func TestGVisorWarmRunsACommand(t *testing.T) {
	ctx := context.Background()
	b := newTestBackend(t, func(c *Config) { c.InitPath = inittest.Init(t, "exe") })
	trace := busyboxRoot(t, true)
	if err := os.WriteFile(filepath.Join(trace, "bin/true"), []byte("#!/bin/sh\necho warm-up >> /tmp/trace\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	img := backend.Image{Name: "busybox", Digest: "sha256:" + strings.Repeat("ef", 32), Root: trace, Env: []string{"PATH=/bin"}}
	for _, id := range []string{"cold", "warmed"} {
		if _, err := b.Create(ctx, id, backend.Spec{Image: img}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if err := b.Warm(ctx, "warmed"); err != nil {
			t.Fatalf("Warm: %v", err)
		}
	}
	traced := func(id string) string {
		t.Helper()
		res, err := b.Exec(ctx, id, backend.ExecRequest{Command: "cat /tmp/trace 2>/dev/null; true", Timeout: 30 * time.Second})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("the trace in %s: %+v, %v", id, res, err)
		}
		return string(res.Stdout)
	}
	if got := traced("warmed"); got != "warm-up\n" {
		t.Errorf("the trace of a sandbox warmed twice before its first command: %q, want one warm-up", got)
	}
	if got := traced("cold"); got != "" {
		t.Errorf("the trace of a sandbox not warmed: %q", got)
	}
	// A Warm after a command runs nothing (the shell's `true` is its own).
	if err := b.Warm(ctx, "cold"); err != nil {
		t.Fatalf("Warm after a command: %v", err)
	}
	if got := traced("cold"); got != "" {
		t.Errorf("a Warm after a command ran the warm-up: trace %q", got)
	}

	nothing := img
	nothing.Name, nothing.Digest, nothing.Root = "no-true", "sha256:"+strings.Repeat("fe", 32), busyboxRoot(t, false)
	if _, err := b.Create(ctx, "no-true", backend.Spec{Image: nothing}); err != nil {
		t.Fatal(err)
	}
	if err := b.Warm(ctx, "no-true"); err != nil {
		t.Fatalf("Warm in a root without true: %v", err)
	}
	res, err := b.Exec(ctx, "no-true", backend.ExecRequest{Argv: []string{guestInit}, Env: map[string]string{initproc.WarmEnv: "1"}, Timeout: 30 * time.Second})
	if err != nil || res.ExitCode != 0 || len(res.Stderr) != 0 {
		t.Errorf("the init's executable as the warm-up: %+v, %v; want exit 0 and nothing", res, err)
	}
}

// TestGVisorGuestCannotHurtInit is TestBwrapGuestCannotHurtInit in gVisor's
// kernel: every signal to the sandbox's pid 1, a look at its memory and
// descriptors, a flood of signals. Here a command runs as uid 1000 and init
// as the sandbox's root, so the sentry refuses a command's signal to init
// (EPERM) before init's shield (initproc.ShieldedSignals) is needed: the
// test holds that first line, and would catch a command that could signal
// init and end or stop it.
func TestGVisorGuestCannotHurtInit(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	const id = "attacked"
	if _, err := b.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	if got := execOK(t, b, id, "cat /proc/1/comm"); got != "sandbox-init\n" {
		t.Fatalf("pid 1 is %q", got)
	}
	res, err := b.Exec(ctx, id, backend.ExecRequest{Command: backendtest.GuestAttackOnInit, Timeout: 60 * time.Second})
	if err != nil || res.SandboxTerminated || res.TimedOut || string(res.Stdout) != "survived\n" {
		t.Fatalf("the attack: %+v, %v", res, err)
	}
	res, err = b.Exec(ctx, id, backend.ExecRequest{Command: `sleep 60 & kill -9 -1; wait $!; echo "sleep ended $?"`, Timeout: 30 * time.Second})
	if err != nil || res.SandboxTerminated || res.ExitCode != 0 || string(res.Stdout) != "sleep ended 137\n" {
		t.Errorf("kill -9 -1: %+v, %v", res, err)
	}
	if got := execOK(t, b, id, "echo alive"); got != "alive\n" {
		t.Errorf("after the attack: %q", got)
	}
}

// The kvm platform is accepted only when a trial sandbox runs on it. Where
// it does, the backend runs a command on kvm; where it does not (this CI's
// VMs: /dev/kvm makes a VM, but it is a paravirtualised KVM on which runsc
// hangs at its first vCPU), New refuses with ErrUnavailable and a hint,
// within the trial's bound, leaving no runsc sandbox, process or probe
// directory behind.
func TestGVisorKVMPlatformTrial(t *testing.T) {
	runsc := testRunsc(t)
	dir := filepath.Join(t.TempDir(), "gvisor")
	start := time.Now()
	b, err := New(Config{Dir: dir, RunscPath: runsc, Platform: PlatformKVM, KillGrace: 500 * time.Millisecond,
		Limits: limits.Limits{OpenFiles: 1024, FileSizeBytes: 1 << 30}})
	took := time.Since(start)
	if kerr := KVMUsable("/dev/kvm"); kerr != nil {
		// No KVM at all: refused before any trial.
		if err == nil || !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "needs a working KVM") {
			t.Fatalf("New on a host without KVM (%v) = %v, want ErrUnavailable saying it needs a working KVM", kerr, err)
		}
		return
	}
	if err == nil {
		t.Cleanup(func() { _ = b.Close() })
		if d := b.Describe(); d["platform"] != PlatformKVM {
			t.Errorf("Describe: %v", d)
		}
		if _, err := b.Create(context.Background(), "kvm1", backend.Spec{}); err != nil {
			t.Fatalf("Create on kvm: %v", err)
		}
		defer b.Destroy(context.Background(), "kvm1")
		res, err := b.Exec(context.Background(), "kvm1", backend.ExecRequest{Argv: []string{"/bin/echo", "on kvm"}, Timeout: 30 * time.Second})
		if err != nil || strings.TrimSpace(string(res.Stdout)) != "on kvm" {
			t.Fatalf("Exec on kvm: %v, %+v", err, res)
		}
		t.Logf("the kvm platform works here (trial %v)", took)
		return
	}
	t.Logf("New refused kvm after %v: %v", took, err)
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "use platform systrap") {
		t.Errorf("New's error = %v, want ErrUnavailable saying to use systrap", err)
	}
	if took > kvmTrialTimeout+2*cliTimeout {
		t.Errorf("New took %v to refuse, beyond its trial's bound %v and the clean-up's", took, kvmTrialTimeout)
	}
	probes, _ := filepath.Glob(filepath.Join(dir, probePrefix+"*"))
	if len(probes) != 0 {
		t.Errorf("the trial left %v", probes)
	}
	root := filepath.Join(dir, runscRootName)
	out, _ := exec.Command(runsc, "--root="+root, "list", "--quiet").CombinedOutput()
	if s := strings.TrimSpace(string(out)); s != "" {
		t.Errorf("runsc list after the refused start: %q", s)
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), root) {
			t.Errorf("process %s still runs from the trial: %q", e.Name(), strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
}

// A boot cut short before runsc saved its state (here by the create's
// deadline; in life also a hung kvm boot) leaves runsc's sandbox and gofer
// processes with no name `runsc delete` knows. The create that fails kills
// them, and so does New for those of a daemon killed mid-boot. A runsc
// wrapper makes it deterministic: its `run` starts a process with the
// command line runsc gives its sandbox process, and hangs.
func TestGVisorBootCutShortLeavesNoProcess(t *testing.T) {
	runsc := testRunsc(t)
	tmp := t.TempDir()
	fifo := filepath.Join(tmp, "never-written")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// The stray is one process (sh blocked opening a FIFO nobody writes)
	// whose arguments carry --root= and --bundle= as runsc's do. It makes
	// its ready file only once it is that sh (after setsid's exec of it),
	// and the wrapper hangs only then: a scan never meets it mid-exec,
	// when its command line is setsid's or, for a moment, empty.
	wrapper := filepath.Join(tmp, "runsc")
	ready1 := filepath.Join(tmp, "stray-ready")
	script := `#!/bin/sh
mode=; prev=; root=; bundle=
for a in "$@"; do
  case "$a" in --root=*) root="$a";; run) mode=run;; esac
  [ "$prev" = --bundle ] && bundle="--bundle=$a"
  prev="$a"
done
if [ "$mode" = run ]; then
  setsid sh -c ': >"$2"; read x <"$1"' runsc-sandbox ` + fifo + ` ` + ready1 + ` "$root" "$bundle" </dev/null >/dev/null 2>&1 &
  while [ ! -e ` + ready1 + ` ]; do sleep 0.01; done
  exec sleep 600
fi
exec ` + runsc + ` "$@"
`
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tmp, "gvisor")
	root := filepath.Join(dir, runscRootName)
	strays := func() []int {
		var pids []int
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if argv, ok := readArgv(pid); ok && slices.Contains(argv, "--root="+root) && slices.Contains(argv, fifo) {
				pids = append(pids, pid)
			}
		}
		return pids
	}
	t.Cleanup(func() {
		for _, pid := range strays() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	cfg := Config{Dir: dir, RunscPath: wrapper, KillGrace: 500 * time.Millisecond, Limits: limits.Limits{OpenFiles: 1024, FileSizeBytes: 1 << 30}}
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := b.Create(ctx, "cut1", backend.Spec{}); err == nil {
		t.Fatal("Create succeeded through a runsc whose run hangs")
	}
	if pids := strays(); len(pids) != 0 {
		t.Errorf("the failed create left runsc processes %v running", pids)
	}
	_ = b.Close()

	// A daemon killed mid-boot leaves the same: the next New kills it.
	// The stand-in is sh itself in a new session (no setsid(1) exec in
	// between), and it is waited for by its ready file, made after its
	// only exec, never by the scan: CI once saw the scan find setsid and
	// the next scan miss the sh it was becoming.
	ready2 := filepath.Join(tmp, "left-ready")
	cmd := exec.Command("sh", "-c", `: >"$2"; read x <"$1"`, "runsc-sandbox", fifo, ready2, "--root="+root, "--bundle="+filepath.Join(dir, "left", "bundle"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(ready2); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stand-in for a left runsc process did not start in 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(strays()) != 1 {
		t.Fatalf("the scan finds %v for the one stand-in of a left runsc process", strays())
	}
	b2, err := New(cfg)
	if err != nil {
		t.Fatalf("New again: %v", err)
	}
	defer b2.Close()
	if pids := strays(); len(pids) != 0 {
		t.Errorf("New left the runsc processes %v of a boot its predecessor was killed in", pids)
	}
}

// Systrap's fast path (spinning instead of sleeping in the hand-offs
// between the guest and the sentry) is off by default on a host of two
// CPUs or fewer, on where runsc's controller should judge, and always
// what the operator set; never on another platform.
func TestWantFastPathOff(t *testing.T) {
	for _, tc := range []struct {
		setting, platform string
		ncpu              int
		want              bool
	}{
		{FastPathAuto, PlatformSystrap, 1, true},
		{FastPathAuto, PlatformSystrap, 2, true},
		{FastPathAuto, PlatformSystrap, 3, false},
		{FastPathAuto, PlatformSystrap, 64, false},
		{FastPathOff, PlatformSystrap, 64, true},
		{FastPathOn, PlatformSystrap, 2, false},
		{FastPathOff, PlatformPtrace, 2, false},
		{FastPathAuto, PlatformKVM, 2, false},
	} {
		if got := wantFastPathOff(tc.setting, tc.platform, tc.ncpu); got != tc.want {
			t.Errorf("wantFastPathOff(%q, %q, %d) = %v, want %v", tc.setting, tc.platform, tc.ncpu, got, tc.want)
		}
	}
}

// The resolved setting reaches the sentry: its command line carries
// --systrap-disable-fast-path exactly when the fast path is off, and health
// says which. A runsc that does not know the flag (a wrapper refusing it as
// an old runsc does) is refused for "off" and left to itself under "auto".
func TestGVisorFastPathSetting(t *testing.T) {
	runsc := testRunsc(t)
	sentryHasFlag := func(b *Backend) bool {
		t.Helper()
		if _, err := b.Create(context.Background(), "fp1", backend.Spec{}); err != nil {
			t.Fatalf("Create: %v", err)
		}
		defer b.Destroy(context.Background(), "fp1")
		argv, ok := readArgv(sandboxPIDs(t, b, "fp1")[0])
		if !ok {
			t.Fatal("cannot read the sentry's command line")
		}
		return slices.ContainsFunc(argv, func(a string) bool { return a == fastPathFlag || a == fastPathFlag+"=true" })
	}
	for _, setting := range []string{FastPathOn, FastPathOff} {
		b := newTestBackend(t, func(c *Config) { c.SystrapFastPath = setting })
		if got, want := sentryHasFlag(b), setting == FastPathOff; got != want {
			t.Errorf("systrap_fast_path %s: the sentry has %s: %v, want %v", setting, fastPathFlag, got, want)
		}
		if d := b.Describe()["systrap_fast_path"]; (d == FastPathOff) != (setting == FastPathOff) {
			t.Errorf("systrap_fast_path %s: health says %q", setting, d)
		}
	}
	auto := newTestBackend(t)
	if got, want := auto.noFastPath, runtime.NumCPU() <= 2; got != want {
		t.Errorf("auto on %d CPUs: fast path off %v, want %v", runtime.NumCPU(), got, want)
	}

	old := filepath.Join(t.TempDir(), "runsc")
	script := "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = " + fastPathFlag + " ] && { echo 'flag provided but not defined: " + fastPathFlag[1:] + "' >&2; exit 2; }; done\nexec " + runsc + " \"$@\"\n"
	if err := os.WriteFile(old, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Dir: filepath.Join(t.TempDir(), "gvisor"), RunscPath: old, SystrapFastPath: FastPathOff, Limits: limits.Limits{OpenFiles: 1024, FileSizeBytes: 1 << 30}}
	if _, err := New(cfg); err == nil || !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "does not know") {
		t.Errorf("New with systrap_fast_path off on a runsc without the flag = %v, want ErrUnavailable saying it does not know it", err)
	}
	cfg.SystrapFastPath = FastPathAuto
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("New with auto on a runsc without the flag: %v", err)
	}
	defer b.Close()
	if b.noFastPath || sentryHasFlag(b) {
		t.Error("auto passed the flag to a runsc that does not know it")
	}
	if _, err := New(Config{Dir: filepath.Join(t.TempDir(), "g"), RunscPath: runsc, SystrapFastPath: "sometimes"}); err == nil || !strings.Contains(err.Error(), "use auto") {
		t.Errorf("New with systrap_fast_path sometimes = %v", err)
	}
	if _, err := New(Config{Dir: filepath.Join(t.TempDir(), "g2"), RunscPath: runsc, ExtraFlags: []string{fastPathFlag}}); err == nil || !strings.Contains(err.Error(), "systrap_fast_path") {
		t.Errorf("New with the flag in extra flags = %v", err)
	}
}
