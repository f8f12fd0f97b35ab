// Package backendtest is the conformance suite every backend.Backend passes:
// one set of behaviours, written once, that the lifecycle and service layers
// rely on whichever backend runs underneath. A backend's own tests call Run
// with a constructor and the Options that describe how it legitimately
// differs (its workdir, which network specs it can enforce, whether it
// isolates sandboxes from the host for real).
//
// It only imports backend and the standard library, and is imported only by
// tests.
package backendtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// Options describe what a backend may do differently.
type Options struct {
	// Workdir is the working directory every sandbox must report ("/workspace"
	// for bwrap). Empty accepts any absolute path, possibly different for
	// every sandbox (sbx mounts each workspace at its host path).
	Workdir string
	// RealIsolation says sandboxes are really isolated from the host and
	// from each other (namespaces, a microVM): a sandbox cannot read a host
	// file or another sandbox's files by absolute path, and has its own
	// /tmp. A fake that runs commands on the host sets it false, which skips
	// those checks; isolation of the workdirs is checked either way.
	RealIsolation bool
	// GuestView says reads and listings (ReadFile, ReadFileRange,
	// ListDirectory) take any path of the sandbox's own view, resolved
	// inside the sandbox as its guest resolves it (bwrap, gVisor): the
	// sandbox's /etc, /usr and /proc/self, symlinks followed there, a host
	// file the sandbox does not see not found. Without it they are confined
	// to the workdir and /tmp like writes (bad_path elsewhere): the host
	// fake, whose "view" is the host, and sbx, as docs/sbx.md says. Writes
	// are confined either way.
	GuestView bool
	// AcceptBlockNetwork, AcceptOpenNetwork and AcceptEgressHosts say
	// whether Create, as the backend under test is configured, accepts
	// block_network=true, block_network=false and allow_egress_to. An
	// accepted spec must create a working sandbox; a refused one must fail
	// with backend.ErrSpecUnenforceable and leave nothing behind.
	// allow_egress_to_cidrs must always be refused.
	AcceptBlockNetwork, AcceptOpenNetwork, AcceptEgressHosts bool
	// KillGrace is the backend's SIGTERM-to-SIGKILL grace for a timed-out
	// command (default 2 s).
	KillGrace time.Duration
	// Slack is how much longer than its budget a command may take to come
	// back, for the backend's own overhead (default 5 s).
	Slack time.Duration
	// KillsEscapeesAtTimeout says a timed-out command's processes are all
	// killed, even those that left its process group or session (setsid, a
	// double fork). A fake that runs commands on the host under GNU timeout
	// cannot promise it.
	KillsEscapeesAtTimeout bool
	// HostProcesses, when set, lists the host's processes whose command
	// line contains s (a backend whose guests are host processes sets it;
	// a microVM backend leaves it nil and those checks are skipped).
	HostProcesses func(s string) []int
	// KillSandboxInit, when set, kills sandbox id's long-lived process (an
	// init, a VM) the way a crash would.
	KillSandboxInit func(b backend.Backend, id string) error
	// Code says the backend runs code contexts (backend.CodeRunner), and
	// the suite holds it to their contract; the sandbox needs python3.
	Code bool
	// CodeLibraries says the sandboxes' python3 has numpy, pandas and
	// matplotlib (the test image does): the tests that render DataFrames
	// and figures then fail without them. Without it they run where the
	// sandbox has them and skip where it has not.
	CodeLibraries bool
	// CodePreload is the modules the backend is configured to preload in
	// its contexts' interpreter: the suite checks that a fresh context has
	// imported each one the sandbox has, before its first cell.
	CodePreload []string
	// Processes says the backend runs durable processes
	// (backend.Processes), and the suite holds it to their contract.
	Processes bool
	// Snapshots says the backend hands over a sandbox's files
	// (backend.Snapshotter), forks (backend.Forker) and seeds a new
	// sandbox (Spec.Seed), and the suite holds it to their contract.
	// Freezes says it freezes the sandbox meanwhile, as configured.
	Snapshots, Freezes bool
	// Memory says Fork and SnapshotFiles take the processes and memory
	// too (SnapshotOptions.Memory); without it both must refuse it with
	// ErrUnsupported. The backend's own tests hold it to what they make.
	Memory bool
	// Pause says the backend, as configured, pauses sandboxes
	// (backend.Pauser), and the suite holds it to their contract; it
	// needs Processes. Without it a backend that implements Pauser must
	// refuse with ErrUnsupported.
	Pause bool
	// Reopen, when set, returns a new instance of the backend on b's state,
	// as a restarted daemon makes it (b is abandoned, not closed). Without
	// it the Adopt checks adopt on b itself.
	Reopen func(t *testing.T, b backend.Backend) backend.Backend
}

// opTimeout bounds every single backend call the suite makes, so a broken
// backend fails the suite instead of hanging it.
const opTimeout = 2 * time.Minute

func (o Options) withDefaults() Options {
	if o.KillGrace <= 0 {
		o.KillGrace = 2 * time.Second
	}
	if o.Slack <= 0 {
		o.Slack = 5 * time.Second
	}
	return o
}

// daemonOnlyEnv is set in the test process while the suite runs; no
// sandbox may see it.
const daemonOnlyEnv = "SANDBOX_SIDECAR_CONFORMANCE_DAEMON_ONLY"

// GuestAttackOnInit is what a hostile command tries against its sandbox's
// init, which both inits' tests run as a command: every signal sent to pid
// 1 (SIGKILL and SIGSTOP included), then a look at whether init was
// stopped, its descriptors and memory, and a flood of signals for a
// second. It prints only "survived" when init withstood all of it; init
// killed ends the sandbox, init stopped leaves the command's result
// unreported.
const GuestAttackOnInit = `
for s in HUP INT QUIT ILL TRAP ABRT BUS FPE USR1 SEGV USR2 PIPE ALRM TERM STKFLT CHLD CONT TSTP TTIN TTOU URG XCPU XFSZ VTALRM PROF WINCH IO PWR SYS STOP KILL; do
  kill -s $s 1 2>/dev/null
  grep -q '^State:[[:space:]]*[Tt]' /proc/1/status 2>/dev/null && echo "init stopped by SIG$s"
done
cat /proc/1/environ >/dev/null 2>&1 && echo environ-readable
cat /proc/1/mem >/dev/null 2>&1 && echo mem-readable
readlink /proc/1/fd/3 >/dev/null 2>&1 && echo control-socket-visible
(exec 9<>/proc/1/fd/3) 2>/dev/null && echo control-socket-reachable
end=$(( $(date +%s) + 1 ))
while [ $(date +%s) -lt $end ]; do kill -USR1 1; kill -TERM 1; kill -CHLD 1; kill -SEGV 1; kill -TSTP 1; done 2>/dev/null
grep -q '^State:[[:space:]]*[Tt]' /proc/1/status 2>/dev/null && echo "init stopped by the flood"
echo survived
`

// Run runs the suite. newBackend is called once per subtest, which run in
// parallel, so it must not use t.Setenv; it may skip the test (or fail it)
// when the host lacks what the backend needs. Run sets an environment
// variable on t, so the calling test must not be parallel itself.
func Run(t *testing.T, newBackend func(t *testing.T) backend.Backend, opts Options) {
	t.Helper()
	opts = opts.withDefaults()
	t.Setenv(daemonOnlyEnv, "the daemon's own environment")
	tests := []struct {
		name string
		fn   func(*suite)
	}{
		{"Lifecycle", testLifecycle},
		{"FilesPersistBetweenCommands", testFilesPersist},
		{"FileRoundTrips", testFileRoundTrips},
		{"ListDirectory", testListDirectory},
		{"SandboxesAreIsolated", testIsolation},
		{"IsolatedFromHost", testHostIsolation},
		{"Environment", testEnvironment},
		{"ArgvCwdStdin", testArgvCwdStdin},
		{"ExitCodes", testExitCodes},
		{"OutputIsCappedKeepingTheTail", testOutputCaps},
		{"Timeouts", testTimeouts},
		{"BackgroundedChildrenDoNotHangTheCall", testBackgrounded},
		{"DestroyIsIdempotentAndLeavesNothing", testDestroy},
		{"DestroyStopsRunningCommands", testDestroyRunning},
		{"SpecRefusals", testSpecs},
		{"InvalidRequests", testInvalidRequests},
		{"BadPaths", testBadPaths},
		{"FilesAsTheGuestSeesThem", testGuestView},
		{"FileErrors", testFileErrors},
		{"FileTooLarge", testFileTooLarge},
		{"RangedFiles", testRangedFiles},
		{"OutputIsHandedOnAsRead", testOutputHandedOn},
		{"ConcurrentSandboxes", testConcurrent},
		{"TimeoutKillsEscapees", testTimeoutKillsEscapees},
		{"DestroyKillsEverything", testDestroyKillsEverything},
		{"CrashedSandboxIsTerminated", testCrashedSandboxIsTerminated},
		{"AdoptAfterRestart", testAdopt},
		{"AdoptRefusesWhatIsGone", testAdoptGone},
		{"CancelledCommandsNeverEndTheSandbox", testCancelledExec},
	}
	if opts.Processes {
		tests = append(tests, processTests...)
	}
	if opts.Code {
		tests = append(tests, codeTests...)
	}
	if opts.Snapshots {
		tests = append(tests, snapshotTests...)
	}
	if opts.Pause {
		tests = append(tests, pauseTests...)
	} else {
		tests = append(tests, pauseRefusedTests...)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBackend(t)
			tc.fn(&suite{T: t, b: b, opts: opts})
		})
	}
}

// suite is one subtest's backend and helpers.
type suite struct {
	*testing.T
	b    backend.Backend
	opts Options
}

func (s *suite) ctx() context.Context {
	ctx, cancel := context.WithTimeout(s.Context(), opTimeout)
	s.Cleanup(cancel)
	return ctx
}

// newID returns a fresh id shaped like the daemon's: "sc-" and 16 hex.
func newID() string {
	raw := make([]byte, 8)
	_, _ = rand.Read(raw)
	return "sc-" + hex.EncodeToString(raw)
}

// unique returns a name no other test uses, for paths outside the workdir.
func unique(prefix string) string { return prefix + "-" + newID()[3:] }

// sandbox is one created sandbox.
type sandbox struct {
	id   string
	info backend.Info
}

// create makes a sandbox and destroys it when the test ends.
func (s *suite) create(spec backend.Spec) sandbox {
	s.Helper()
	id := newID()
	info, err := s.b.Create(s.ctx(), id, spec)
	if err != nil {
		s.Fatalf("Create(%s): %v", id, err)
	}
	s.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := s.b.Destroy(ctx, id); err != nil {
			s.Errorf("Destroy(%s) at cleanup: %v", id, err)
		}
	})
	switch {
	case s.opts.Workdir != "" && info.Workdir != s.opts.Workdir:
		s.Fatalf("Create(%s): Workdir %q, want %q", id, info.Workdir, s.opts.Workdir)
	case !path.IsAbs(info.Workdir) || path.Clean(info.Workdir) != info.Workdir:
		s.Fatalf("Create(%s): Workdir %q is not a clean absolute path", id, info.Workdir)
	case info.Network == "":
		s.Fatalf("Create(%s): Network is empty; say what network the sandbox got", id)
	}
	return sandbox{id: id, info: info}
}

func (s *suite) exec(sb sandbox, req backend.ExecRequest) backend.ExecResult {
	s.Helper()
	if req.Timeout == 0 {
		req.Timeout = 60 * time.Second
	}
	if req.MaxOutputBytes == 0 {
		req.MaxOutputBytes = 1 << 20
	}
	res, err := s.b.Exec(s.ctx(), sb.id, req)
	if err != nil {
		s.Fatalf("Exec(%s, %q %q): %v", sb.id, req.Command, req.Argv, err)
	}
	return res
}

func (s *suite) run(sb sandbox, command string) backend.ExecResult {
	s.Helper()
	return s.exec(sb, backend.ExecRequest{Command: command})
}

// runOK runs command, requires exit status 0 and returns its stdout.
func (s *suite) runOK(sb sandbox, command string) string {
	s.Helper()
	res := s.run(sb, command)
	if res.ExitCode != 0 || res.TimedOut || res.SandboxTerminated {
		s.Fatalf("Exec(%q): exit %d timed_out %v terminated %v, stdout %q, stderr %q",
			command, res.ExitCode, res.TimedOut, res.SandboxTerminated, res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}

func (s *suite) write(sb sandbox, p string, data []byte) {
	s.Helper()
	if err := s.b.WriteFile(s.ctx(), sb.id, p, data, 0); err != nil {
		s.Fatalf("WriteFile(%q): %v", p, err)
	}
}

func (s *suite) read(sb sandbox, p string) []byte {
	s.Helper()
	data, err := s.b.ReadFile(s.ctx(), sb.id, p, 1<<20)
	if err != nil {
		s.Fatalf("ReadFile(%q): %v", p, err)
	}
	return data
}

func (s *suite) listed(id string) bool {
	s.Helper()
	ids, err := s.b.List(s.ctx())
	if err != nil {
		s.Fatalf("List: %v", err)
	}
	return slices.Contains(ids, id)
}

func wantErr(t testing.TB, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: err = %v, want one wrapping %q", what, err, target)
	}
}

func boolPtr(v bool) *bool { return &v }

// underTmp reports whether p is /tmp or below it.
func underTmp(p string) bool { return p == "/tmp" || strings.HasPrefix(p, "/tmp/") }

// quote makes s a single-quoted shell word.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func testLifecycle(s *suite) {
	sb := s.create(backend.Spec{})
	if !s.listed(sb.id) {
		s.Errorf("List does not have the sandbox %s just created", sb.id)
	}
	res := s.run(sb, "pwd; echo to-stderr >&2; exit 3")
	if res.ExitCode != 3 || string(res.Stdout) != sb.info.Workdir+"\n" || string(res.Stderr) != "to-stderr\n" {
		s.Errorf("exit %d stdout %q stderr %q; want 3, the workdir %q, to-stderr", res.ExitCode, res.Stdout, res.Stderr, sb.info.Workdir)
	}
	if res.TimedOut || res.SandboxTerminated || res.StdoutTruncated || res.StderrTruncated {
		s.Errorf("flags set on a plain command: %+v", res)
	}
	if res.AppliedTimeout != 60*time.Second || res.Duration <= 0 {
		s.Errorf("AppliedTimeout %v Duration %v; want the 60s asked for and a positive duration", res.AppliedTimeout, res.Duration)
	}

	ctx := s.ctx()
	if err := s.b.Destroy(ctx, sb.id); err != nil {
		s.Fatalf("Destroy: %v", err)
	}
	if s.listed(sb.id) {
		s.Errorf("List still has %s after Destroy", sb.id)
	}
	_, err := s.b.Exec(ctx, sb.id, backend.ExecRequest{Command: "true", Timeout: 10 * time.Second})
	wantErr(s, "Exec after Destroy", err, backend.ErrNotFound)
	_, err = s.b.ReadFile(ctx, sb.id, "x", 10)
	wantErr(s, "ReadFile after Destroy", err, backend.ErrNotFound)
	err = s.b.WriteFile(ctx, sb.id, "x", []byte("x"), 0)
	wantErr(s, "WriteFile after Destroy", err, backend.ErrNotFound)
	_, err = s.b.ListDirectory(ctx, sb.id, ".", 10)
	wantErr(s, "ListDirectory after Destroy", err, backend.ErrNotFound)
	_, err = s.b.Exec(ctx, newID(), backend.ExecRequest{Command: "true", Timeout: 10 * time.Second})
	wantErr(s, "Exec in a sandbox never created", err, backend.ErrNotFound)
}

func testFilesPersist(s *suite) {
	sb := s.create(backend.Spec{})
	tmpDir := "/tmp/" + unique("persist")
	s.write(sb, "from-host/nested/input.txt", []byte("written by the host\n"))
	s.runOK(sb, "echo appended by the guest >> from-host/nested/input.txt && echo made by a command > made.txt && mkdir -p "+tmpDir+" && echo scratch > "+tmpDir+"/f")
	if got := s.runOK(sb, "cat made.txt "+tmpDir+"/f"); got != "made by a command\nscratch\n" {
		s.Errorf("a later command read %q", got)
	}
	if got := string(s.read(sb, "from-host/nested/input.txt")); got != "written by the host\nappended by the guest\n" {
		s.Errorf("ReadFile of a file the host wrote and the guest appended to = %q", got)
	}
	if got := string(s.read(sb, sb.info.Workdir+"/made.txt")); got != "made by a command\n" {
		s.Errorf("ReadFile by absolute path = %q", got)
	}
	if got := string(s.read(sb, tmpDir+"/f")); got != "scratch\n" {
		s.Errorf("ReadFile under /tmp = %q", got)
	}
	s.write(sb, tmpDir+"/from-host", []byte("into tmp"))
	if got := s.runOK(sb, "cat "+tmpDir+"/from-host; rm -rf "+tmpDir); got != "into tmp" {
		s.Errorf("a command read %q from a file WriteFile put under /tmp", got)
	}
}

func testFileRoundTrips(s *suite) {
	sb := s.create(backend.Spec{})
	all := make([]byte, 0, 3*256)
	for range 3 {
		for c := range 256 {
			all = append(all, byte(c))
		}
	}
	cases := map[string][]byte{
		"binary.bin":            all,
		"empty":                 {},
		"large.txt":             bytes.Repeat([]byte("0123456789abcdef\n"), 64<<10), // 1.1 MB, past any argv limit
		"name with spaces 'q'":  []byte("quoted"),
		"-leading-dash":         []byte("dash"),
		"new\nline":             []byte("newline in the name"),
		"trailing-newline\n":    []byte("trailing newline in the name"),
		"d1/d2/d3/deep.txt":     []byte("deep"),
		"unicode-é-日本.txt":      []byte("unicode"),
		"$(touch pwned)`x`;|&>": []byte("shell metacharacters"),
	}
	for name, data := range cases {
		if err := s.b.WriteFile(s.ctx(), sb.id, name, data, 0); err != nil {
			s.Errorf("WriteFile(%q): %v", name, err)
			continue
		}
		got, err := s.b.ReadFile(s.ctx(), sb.id, name, 2<<20)
		if err != nil || !bytes.Equal(got, data) {
			s.Errorf("ReadFile(%q) = %d bytes, %v; want the %d bytes written", name, len(got), err, len(data))
		}
	}
	if got := s.runOK(sb, "wc -c < binary.bin; wc -c < large.txt; test ! -e pwned && echo no-injection"); got != fmt.Sprintf("%d\n%d\nno-injection\n", len(all), len(cases["large.txt"])) {
		s.Errorf("the guest sees %q", got)
	}

	// Overwrite replaces; modes are exact; a symlink at the path is
	// replaced, not written through.
	s.write(sb, "over.txt", []byte("a much longer first version"))
	s.write(sb, "over.txt", []byte("short"))
	if got := string(s.read(sb, "over.txt")); got != "short" {
		s.Errorf("after overwrite ReadFile = %q", got)
	}
	if err := s.b.WriteFile(s.ctx(), sb.id, "mode.sh", []byte("#!/bin/sh\necho run\n"), 0o751); err != nil {
		s.Fatal(err)
	}
	if got := s.runOK(sb, "stat -c %a mode.sh; ./mode.sh"); got != "751\nrun\n" {
		s.Errorf("mode 0751 file: %q", got)
	}
	s.runOK(sb, "echo target > link-target; ln -s link-target link")
	s.write(sb, "link", []byte("replaced"))
	if got := s.runOK(sb, "cat link-target; test -L link || echo not-a-link"); got != "target\nnot-a-link\n" {
		s.Errorf("writing over a symlink: %q; want the target untouched and the link replaced", got)
	}
}

func testListDirectory(s *suite) {
	sb := s.create(backend.Spec{})
	s.runOK(sb, "mkdir -p dir/sub .hidden-dir && touch dir/b dir/a dir/.dot 'dir/with\nnewline' && ln -s sub dir/link-to-dir && ln -s /nonexistent dir/dangling")
	got, err := s.b.ListDirectory(s.ctx(), sb.id, "dir", 100)
	if err != nil {
		s.Fatal(err)
	}
	want := []backend.DirEntry{
		{Name: ".dot"}, {Name: "a"}, {Name: "b"}, {Name: "dangling"},
		{Name: "link-to-dir"}, {Name: "sub", IsDir: true}, {Name: "with\nnewline"},
	}
	if !slices.Equal(got, want) {
		s.Errorf("ListDirectory(dir) = %+v, want %+v", got, want)
	}
	root, err := s.b.ListDirectory(s.ctx(), sb.id, sb.info.Workdir, 100)
	if err != nil {
		s.Fatal(err)
	}
	if !slices.Contains(root, backend.DirEntry{Name: "dir", IsDir: true}) || !slices.Contains(root, backend.DirEntry{Name: ".hidden-dir", IsDir: true}) {
		s.Errorf("ListDirectory(workdir) = %+v, want dir and .hidden-dir among them", root)
	}
	empty, err := s.b.ListDirectory(s.ctx(), sb.id, "dir/sub", 1)
	if err != nil || len(empty) != 0 {
		s.Errorf("ListDirectory(empty dir) = %+v, %v", empty, err)
	}

	s.runOK(sb, "mkdir many && cd many && for i in 1 2 3 4 5 6 7 8 9 10 11 12; do touch f$i; done")
	if _, err := s.b.ListDirectory(s.ctx(), sb.id, "many", 11); !errors.Is(err, backend.ErrTooManyEntries) {
		s.Errorf("12 entries with a bound of 11: err = %v, want ErrTooManyEntries", err)
	}
	if got, err := s.b.ListDirectory(s.ctx(), sb.id, "many", 12); err != nil || len(got) != 12 {
		s.Errorf("12 entries with a bound of 12: %d entries, %v", len(got), err)
	}
}

func testIsolation(s *suite) {
	a := s.create(backend.Spec{})
	b := s.create(backend.Spec{})
	s.write(a, "secret.txt", []byte("a's secret"))
	if _, err := s.b.ReadFile(s.ctx(), b.id, "secret.txt", 100); !errors.Is(err, backend.ErrPathNotFound) {
		s.Errorf("b reading a's file by the same relative path: err = %v, want ErrPathNotFound", err)
	}
	if res := s.run(b, "cat secret.txt"); res.ExitCode == 0 || bytes.Contains(res.Stdout, []byte("secret")) {
		s.Errorf("b's command read a's file: exit %d stdout %q", res.ExitCode, res.Stdout)
	}
	if !s.opts.RealIsolation {
		return
	}
	if res := s.run(b, "cat "+quote(a.info.Workdir+"/secret.txt")); bytes.Contains(res.Stdout, []byte("secret")) {
		s.Errorf("b's command read a's file by absolute path %s", a.info.Workdir)
	}
	name := "/tmp/" + unique("private")
	s.runOK(a, "echo a-tmp > "+name)
	if res := s.run(b, "cat "+name); res.ExitCode == 0 {
		s.Errorf("b sees a's %s: %q", name, res.Stdout)
	}
	if _, err := s.b.ReadFile(s.ctx(), b.id, name, 100); !errors.Is(err, backend.ErrPathNotFound) {
		s.Errorf("ReadFile in b of a's %s: err = %v, want ErrPathNotFound", name, err)
	}
}

func testHostIsolation(s *suite) {
	if !s.opts.RealIsolation {
		s.Skip("the backend under test runs commands on the host (a fake); host isolation is not its job")
	}
	sb := s.create(backend.Spec{})
	dir := s.TempDir()
	for p := dir; p != "/" && p != "." && p != os.TempDir(); p = filepath.Dir(p) {
		// Readable by anyone, so only isolation can keep the guest out.
		_ = os.Chmod(p, 0o755)
	}
	hostFile := filepath.Join(dir, "host-secret")
	if err := os.WriteFile(hostFile, []byte("host secret"), 0o644); err != nil {
		s.Fatal(err)
	}
	if res := s.run(sb, "cat "+quote(hostFile)); bytes.Contains(res.Stdout, []byte("host secret")) {
		s.Errorf("the sandbox read the host file %s", hostFile)
	}
	if s.opts.GuestView {
		// The file operations see what the sandbox sees: not the host's.
		_, err := s.b.ReadFile(s.ctx(), sb.id, hostFile, 100)
		wantErr(s, "ReadFile(a host file)", err, backend.ErrPathNotFound)
		_, err = s.b.ListDirectory(s.ctx(), sb.id, dir, 100)
		wantErr(s, "ListDirectory(a host directory)", err, backend.ErrPathNotFound)
		if got, err := s.b.ReadFile(s.ctx(), sb.id, "/etc/shadow", 1<<20); err == nil || bytes.Contains(got, []byte("root:")) {
			s.Errorf("ReadFile(/etc/shadow) = %d bytes, %v; the guest cannot read a shadow file", len(got), err)
		}
	}
	if res := s.run(sb, "touch "+quote(filepath.Join(dir, "planted"))); res.ExitCode == 0 {
		if _, err := os.Stat(filepath.Join(dir, "planted")); err == nil {
			s.Errorf("the sandbox created a file in the host directory %s", dir)
		}
	}
}

func testEnvironment(s *suite) {
	tricky := "spaces  and 'quotes' \"double\" $HOME `x` \\ ; | & é = # c"
	multiline := "first line\nsecond line"
	env := map[string]string{"SANDBOX_VAR": "from-spec", "OVERRIDDEN": "spec", "TRICKY": tricky, "MULTILINE": multiline}
	// A backend that can pass only some environments (backend.EnvChecker)
	// must refuse a newline it cannot carry, at create, with
	// ErrInvalidArgument and nothing left behind; any other must carry it.
	if ec, ok := s.b.(backend.EnvChecker); ok && ec.CheckEnv(map[string]string{"MULTILINE": multiline}) != nil {
		id := newID()
		if _, err := s.b.Create(s.ctx(), id, backend.Spec{Env: env}); !errors.Is(err, backend.ErrInvalidArgument) {
			s.Errorf("Create with an env its CheckEnv refuses = %v, want ErrInvalidArgument", err)
			_ = s.b.Destroy(s.ctx(), id)
		}
		delete(env, "MULTILINE")
	}
	sb := s.create(backend.Spec{Env: env})
	if _, ok := env["MULTILINE"]; ok {
		if got := s.runOK(sb, `printf '%s' "$MULTILINE"`); got != multiline {
			s.Errorf("a value with a newline came through as %q", got)
		}
	}
	for range 2 { // every command sees it, not only the first
		if got := s.runOK(sb, `printf '%s|%s' "$SANDBOX_VAR" "$OVERRIDDEN"`); got != "from-spec|spec" {
			s.Errorf("spec env in a command: %q", got)
		}
	}
	if got := s.runOK(sb, `printf '%s' "$TRICKY"`); got != tricky {
		s.Errorf("a value with metacharacters came through as %q", got)
	}
	res := s.exec(sb, backend.ExecRequest{Command: `printf '%s|%s|%s' "$SANDBOX_VAR" "$OVERRIDDEN" "$REQUEST_ONLY"`,
		Env: map[string]string{"OVERRIDDEN": "request", "REQUEST_ONLY": "r"}})
	if string(res.Stdout) != "from-spec|request|r" {
		s.Errorf("request env layered over spec env: %q", res.Stdout)
	}
	if got := s.runOK(sb, `printf '%s' "${REQUEST_ONLY-unset}"`); got != "unset" {
		s.Errorf("a request's env leaked into the next command: %q", got)
	}
	if got := s.runOK(sb, `printf '%s' "${`+daemonOnlyEnv+`-unset}"`); got != "unset" {
		s.Errorf("the daemon's environment leaked into the sandbox: %q", got)
	}
	if got := s.runOK(sb, "command -v sh >/dev/null && echo path-ok"); got != "path-ok\n" {
		s.Errorf("PATH in the sandbox cannot find sh: %q", got)
	}
}

func testArgvCwdStdin(s *suite) {
	sb := s.create(backend.Spec{})
	res := s.exec(sb, backend.ExecRequest{Argv: []string{"printf", "%s|", "a b", "$HOME", "'q'", "-n"}})
	if res.ExitCode != 0 || string(res.Stdout) != "a b|$HOME|'q'|-n|" {
		s.Errorf("argv is not passed literally: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	s.runOK(sb, "mkdir -p sub/dir")
	res = s.exec(sb, backend.ExecRequest{Command: "pwd", Cwd: sb.info.Workdir + "/sub/dir"})
	if string(res.Stdout) != sb.info.Workdir+"/sub/dir\n" {
		s.Errorf("Cwd: pwd printed %q", res.Stdout)
	}
	in := bytes.Repeat([]byte("stdin line\n"), 20000) // 220 KB, more than a pipe holds
	res = s.exec(sb, backend.ExecRequest{Command: "cat", Stdin: in})
	if res.ExitCode != 0 || !bytes.Equal(res.Stdout, in) {
		s.Errorf("stdin through cat: exit %d, %d bytes back of %d", res.ExitCode, len(res.Stdout), len(in))
	}
	if got := s.runOK(sb, "wc -c"); strings.TrimSpace(got) != "0" {
		s.Errorf("a command without stdin read %q bytes", got)
	}
}

func testExitCodes(s *suite) {
	sb := s.create(backend.Spec{})
	for cmd, want := range map[string]int{"true": 0, "exit 7": 7, "false": 1, "kill -TERM $$": 143, "kill -KILL $$": 137, "exit 124": 124} {
		res := s.run(sb, cmd)
		if res.ExitCode != want || res.TimedOut || res.SandboxTerminated {
			s.Errorf("%q: exit %d timed_out %v terminated %v, want exit %d and no flags", cmd, res.ExitCode, res.TimedOut, res.SandboxTerminated, want)
		}
	}
	res := s.exec(sb, backend.ExecRequest{Argv: []string{"/nonexistent/program"}})
	if res.ExitCode == 0 || res.SandboxTerminated {
		s.Errorf("a program that does not exist: exit %d terminated %v", res.ExitCode, res.SandboxTerminated)
	}
}

func testOutputCaps(s *suite) {
	sb := s.create(backend.Spec{})
	const limit = 1000
	res := s.exec(sb, backend.ExecRequest{
		Command:        "yes 0123456789 | head -n 100000; echo OUT-END; yes e | head -n 100000 >&2; echo ERR-END >&2",
		MaxOutputBytes: limit,
	})
	if res.ExitCode != 0 {
		s.Fatalf("exit %d, stderr tail %q", res.ExitCode, res.Stderr)
	}
	if !res.StdoutTruncated || !res.StderrTruncated {
		s.Errorf("StdoutTruncated %v StderrTruncated %v, want both", res.StdoutTruncated, res.StderrTruncated)
	}
	if len(res.Stdout) > limit || !bytes.HasSuffix(res.Stdout, []byte("0123456789\nOUT-END\n")) || !bytes.HasPrefix(res.Stdout, []byte("0123456789\n")) {
		s.Errorf("stdout: %d bytes, want at most %d holding whole lines and ending with OUT-END: ...%q", len(res.Stdout), limit, res.Stdout[max(0, len(res.Stdout)-40):])
	}
	if len(res.Stderr) > limit || !bytes.HasSuffix(res.Stderr, []byte("e\nERR-END\n")) {
		s.Errorf("stderr: %d bytes, want at most %d ending with ERR-END: ...%q", len(res.Stderr), limit, res.Stderr[max(0, len(res.Stderr)-40):])
	}
	small := s.exec(sb, backend.ExecRequest{Command: "echo small", MaxOutputBytes: limit})
	if string(small.Stdout) != "small\n" || small.StdoutTruncated {
		s.Errorf("small output: %q truncated %v", small.Stdout, small.StdoutTruncated)
	}
}

func testTimeouts(s *suite) {
	sb := s.create(backend.Spec{})
	k, slack := s.opts.KillGrace, s.opts.Slack
	cases := []struct {
		name    string
		command string
		budget  time.Duration
		min     time.Duration
	}{
		{"obeys SIGTERM", "echo started; sleep 60", time.Second, time.Second},
		{"ignores SIGTERM", "trap '' TERM; echo started; sleep 60", time.Second, time.Second + k},
		{"handles SIGTERM and carries on", "trap 'echo caught' TERM; echo started; while :; do sleep 0.1; done", time.Second, time.Second + k},
	}
	for _, tc := range cases {
		start := time.Now()
		res := s.exec(sb, backend.ExecRequest{Command: tc.command, Timeout: tc.budget})
		elapsed := time.Since(start)
		if !res.TimedOut || res.SandboxTerminated {
			s.Errorf("%s: TimedOut %v SandboxTerminated %v exit %d, want a plain timeout", tc.name, res.TimedOut, res.SandboxTerminated, res.ExitCode)
		}
		if !strings.HasPrefix(string(res.Stdout), "started\n") {
			s.Errorf("%s: the output before the timeout was lost: %q", tc.name, res.Stdout)
		}
		if res.AppliedTimeout != tc.budget {
			s.Errorf("%s: AppliedTimeout %v, want %v", tc.name, res.AppliedTimeout, tc.budget)
		}
		if elapsed < tc.min || elapsed > tc.budget+k+slack {
			s.Errorf("%s: took %v, want between %v and %v", tc.name, elapsed, tc.min, tc.budget+k+slack)
		}
	}
	// A tiny budget is rounded up, never to "no timeout".
	start := time.Now()
	res := s.exec(sb, backend.ExecRequest{Command: "sleep 60", Timeout: time.Microsecond})
	if !res.TimedOut || res.AppliedTimeout <= 0 || res.AppliedTimeout > time.Second || time.Since(start) > k+slack+time.Second {
		s.Errorf("1µs budget: TimedOut %v AppliedTimeout %v after %v", res.TimedOut, res.AppliedTimeout, time.Since(start))
	}
	// A command that finishes in time is not a timeout, whatever it exits.
	if res := s.exec(sb, backend.ExecRequest{Command: "sleep 0.2; exit 124", Timeout: 30 * time.Second}); res.TimedOut || res.ExitCode != 124 {
		s.Errorf("exit 124 within the budget: TimedOut %v exit %d", res.TimedOut, res.ExitCode)
	}
	if got := s.runOK(sb, "echo still-usable"); got != "still-usable\n" {
		s.Errorf("the sandbox after timeouts: %q", got)
	}
}

func testBackgrounded(s *suite) {
	sb := s.create(backend.Spec{})
	for _, cmd := range []string{
		"sleep 60 & echo started",
		"(sleep 60 &) ; echo started",
		"nohup sleep 60 >/dev/null 2>&1 & echo started",
		"sleep 60 >&2 & echo started",
	} {
		start := time.Now()
		res := s.exec(sb, backend.ExecRequest{Command: cmd, Timeout: 30 * time.Second})
		elapsed := time.Since(start)
		if res.ExitCode != 0 || string(res.Stdout) != "started\n" || res.TimedOut {
			s.Errorf("%q: exit %d stdout %q timed_out %v", cmd, res.ExitCode, res.Stdout, res.TimedOut)
		}
		if elapsed > s.opts.Slack {
			s.Errorf("%q: took %v; a backgrounded child held the call", cmd, elapsed)
		}
	}
}

func testDestroy(s *suite) {
	ctx := s.ctx()
	sb := s.create(backend.Spec{Env: map[string]string{"GEN": "first"}})
	s.write(sb, "data/file.txt", []byte("data"))
	s.runOK(sb, "sleep 60 >/dev/null 2>&1 & echo bg")
	for i := range 3 {
		if err := s.b.Destroy(ctx, sb.id); err != nil {
			s.Errorf("Destroy #%d: %v", i+1, err)
		}
	}
	if s.listed(sb.id) {
		s.Errorf("List still has %s after Destroy", sb.id)
	}
	for _, id := range []string{newID(), "", "../escape", "UPPER", "a/b", strings.Repeat("x", 100)} {
		if err := s.b.Destroy(ctx, id); err != nil {
			s.Errorf("Destroy(%q) of something that never existed: %v", id, err)
		}
	}
	// Nothing is left that a new sandbox with the same id could trip over.
	info, err := s.b.Create(ctx, sb.id, backend.Spec{})
	if err != nil {
		s.Fatalf("Create with the id of a destroyed sandbox: %v", err)
	}
	defer s.b.Destroy(context.WithoutCancel(ctx), sb.id)
	again := sandbox{id: sb.id, info: info}
	if got := s.runOK(again, `ls -A; printf '%s' "${GEN-unset}"`); got != "unset" {
		s.Errorf("a new sandbox with a destroyed one's id sees %q", got)
	}
}

func testDestroyRunning(s *suite) {
	sb := s.create(backend.Spec{})
	type outcome struct {
		res backend.ExecResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := s.b.Exec(s.ctx(), sb.id, backend.ExecRequest{Command: "echo started; sleep 60", Timeout: 90 * time.Second})
		done <- outcome{res, err}
	}()
	time.Sleep(time.Second)
	start := time.Now()
	if err := s.b.Destroy(s.ctx(), sb.id); err != nil {
		s.Fatalf("Destroy with a command running: %v", err)
	}
	select {
	case o := <-done:
		if o.err != nil && !errors.Is(o.err, backend.ErrNotFound) {
			s.Errorf("the running command returned %v; want SandboxTerminated or ErrNotFound", o.err)
		}
		if o.err == nil && !o.res.SandboxTerminated {
			s.Errorf("the running command returned %+v without SandboxTerminated", o.res)
		}
	case <-time.After(30 * time.Second):
		s.Fatal("the running command did not come back within 30s of Destroy")
	}
	if elapsed := time.Since(start); elapsed > 20*time.Second {
		s.Errorf("Destroy with a command running took %v", elapsed)
	}
}

func testSpecs(s *suite) {
	cases := []struct {
		name   string
		spec   backend.Spec
		accept bool
	}{
		{"allow_egress_to_cidrs", backend.Spec{AllowEgressToCIDRs: []string{"10.0.0.0/8"}}, false},
		{"allow_egress_to_cidrs with hosts", backend.Spec{AllowEgressTo: []string{"pypi.org"}, AllowEgressToCIDRs: []string{"192.0.2.0/24"}}, false},
		{"block_network=true", backend.Spec{BlockNetwork: boolPtr(true)}, s.opts.AcceptBlockNetwork},
		{"block_network=false", backend.Spec{BlockNetwork: boolPtr(false)}, s.opts.AcceptOpenNetwork},
		{"allow_egress_to", backend.Spec{AllowEgressTo: []string{"pypi.org", "files.pythonhosted.org"}}, s.opts.AcceptEgressHosts},
	}
	for _, tc := range cases {
		id := newID()
		info, err := s.b.Create(s.ctx(), id, tc.spec)
		if !tc.accept {
			wantErr(s, tc.name, err, backend.ErrSpecUnenforceable)
			if err != nil && len(err.Error()) < 40 {
				s.Errorf("%s: the refusal %q does not explain itself", tc.name, err)
			}
			if s.listed(id) {
				s.Errorf("%s: a refused Create left %s behind", tc.name, id)
			}
			if err == nil {
				_ = s.b.Destroy(s.ctx(), id)
			}
			continue
		}
		if err != nil {
			s.Errorf("%s: Create: %v", tc.name, err)
			continue
		}
		if got := s.runOK(sandbox{id, info}, "echo ok"); got != "ok\n" || info.Network == "" {
			s.Errorf("%s: network %q, command printed %q", tc.name, info.Network, got)
		}
		if err := s.b.Destroy(s.ctx(), id); err != nil {
			s.Errorf("%s: Destroy: %v", tc.name, err)
		}
	}
	for _, env := range []map[string]string{{"A=B": "x"}, {"": "x"}, {"A": "nul\x00"}} {
		id := newID()
		_, err := s.b.Create(s.ctx(), id, backend.Spec{Env: env})
		wantErr(s, fmt.Sprintf("Create with env %q", env), err, backend.ErrInvalidArgument)
		if err == nil {
			_ = s.b.Destroy(s.ctx(), id)
		}
	}
	for _, id := range []string{"", "UPPER", "../x", "a/b", "-lead", strings.Repeat("a", 64)} {
		_, err := s.b.Create(s.ctx(), id, backend.Spec{})
		wantErr(s, fmt.Sprintf("Create(%q)", id), err, backend.ErrInvalidArgument)
	}
	sb := s.create(backend.Spec{})
	if _, err := s.b.Create(s.ctx(), sb.id, backend.Spec{}); err == nil {
		s.Errorf("Create of an id that exists succeeded")
	}
	if got := s.runOK(sb, "echo survived"); got != "survived\n" {
		s.Errorf("the existing sandbox after a duplicate Create: %q", got)
	}
}

func testInvalidRequests(s *suite) {
	sb := s.create(backend.Spec{})
	ctx := s.ctx()
	for name, req := range map[string]backend.ExecRequest{
		"empty command":       {Timeout: time.Second},
		"command and argv":    {Command: "true", Argv: []string{"true"}, Timeout: time.Second},
		"zero timeout":        {Command: "true"},
		"negative timeout":    {Command: "true", Timeout: -time.Second},
		"relative cwd":        {Command: "true", Cwd: "relative", Timeout: time.Second},
		"NUL in command":      {Command: "echo \x00", Timeout: time.Second},
		"env name with =":     {Command: "true", Env: map[string]string{"A=B": "x"}, Timeout: time.Second},
		"NUL in an env value": {Command: "true", Env: map[string]string{"A": "x\x00"}, Timeout: time.Second},
	} {
		_, err := s.b.Exec(ctx, sb.id, req)
		wantErr(s, name, err, backend.ErrInvalidArgument)
	}
	_, err := s.b.ReadFile(ctx, sb.id, "x", -1)
	wantErr(s, "ReadFile with a negative bound", err, backend.ErrInvalidArgument)
	_, err = s.b.ListDirectory(ctx, sb.id, ".", 0)
	wantErr(s, "ListDirectory with a zero bound", err, backend.ErrInvalidArgument)
}

func testBadPaths(s *suite) {
	sb := s.create(backend.Spec{})
	ctx := s.ctx()
	hostName := unique("sidecar-conformance")
	s.runOK(sb, "echo inside > real.txt && mkdir -p realdir && ln -s /etc etc-link && ln -s /etc/hostname file-link && "+
		"ln -s ../../../../../../../../../../etc up-link && ln -s real.txt inner-link && ln -s realdir inner-dir-link && "+
		"ln -s /etc/"+hostName+" dangling-out && mkdir -p sub && ln -s .. sub/parent")

	escapes := []string{"", "a\x00b"}
	outside := []string{"../../../../../../../../../../etc/passwd", "/etc/passwd", "/tmp/../etc/passwd", "etc-link/passwd", "up-link/passwd"}
	if !s.opts.GuestView {
		escapes = append(escapes, outside...)
		escapes = append(escapes, "/", "etc-link", "file-link", "dangling-out")
	}
	// Just above the workdir is outside, unless the workdir lives under
	// /tmp, which file operations may reach too.
	parentOutside := !underTmp(path.Dir(sb.info.Workdir))
	if parentOutside && !s.opts.GuestView {
		escapes = append(escapes, "../x", sb.info.Workdir+"/../outside", "sub/../../x")
	}
	for _, p := range escapes {
		_, err := s.b.ReadFile(ctx, sb.id, p, 1<<20)
		wantErr(s, fmt.Sprintf("ReadFile(%q)", p), err, backend.ErrBadPath)
	}
	lists := []string{""}
	if !s.opts.GuestView {
		lists = append(lists, "/etc", "etc-link", "up-link", "etc-link/ssl")
		if parentOutside {
			lists = append(lists, "../x", "..")
		}
	}
	for _, p := range lists {
		_, err := s.b.ListDirectory(ctx, sb.id, p, 100)
		wantErr(s, fmt.Sprintf("ListDirectory(%q)", p), err, backend.ErrBadPath)
	}
	if s.opts.GuestView {
		// Every way out leads to the sandbox's own /etc/passwd, what cat
		// shows the guest; a link to what the sandbox lacks is not found.
		want := s.runOK(sb, "cat /etc/passwd")
		for _, p := range outside {
			if got, err := s.b.ReadFile(ctx, sb.id, p, 1<<20); err != nil || string(got) != want {
				s.Errorf("ReadFile(%q) = %d bytes, %v; want the guest's /etc/passwd (%d bytes)", p, len(got), err, len(want))
			}
		}
		_, err := s.b.ReadFile(ctx, sb.id, "dangling-out", 1<<20)
		wantErr(s, "ReadFile(dangling-out)", err, backend.ErrPathNotFound)
		for _, p := range []string{"/etc", "etc-link", "up-link"} {
			if got, err := s.b.ListDirectory(ctx, sb.id, p, 10000); err != nil || !slices.Contains(got, backend.DirEntry{Name: "passwd"}) {
				s.Errorf("ListDirectory(%q) = %d entries, %v; want the guest's /etc", p, len(got), err)
			}
		}
	}
	writes := []string{"", "/etc/" + hostName, "etc-link/" + hostName, "up-link/" + hostName, "etc-link/new-dir/" + hostName}
	if parentOutside {
		writes = append(writes, "../"+hostName)
	}
	for _, p := range writes {
		err := s.b.WriteFile(ctx, sb.id, p, []byte("escaped"), 0)
		wantErr(s, fmt.Sprintf("WriteFile(%q)", p), err, backend.ErrBadPath)
	}
	for _, p := range []string{"/etc/" + hostName, "/etc/new-dir"} {
		if _, err := os.Lstat(p); err == nil {
			s.Errorf("a refused WriteFile created %s on the host", p)
		}
	}
	// Symlinks that stay inside are followed.
	if got := string(s.read(sb, "inner-link")); got != "inside\n" {
		s.Errorf("ReadFile through a symlink that stays inside = %q", got)
	}
	if got, err := s.b.ListDirectory(ctx, sb.id, "inner-dir-link", 10); err != nil || len(got) != 0 {
		s.Errorf("ListDirectory through a symlink to a directory inside = %+v, %v", got, err)
	}
	if got := string(s.read(sb, "sub/parent/real.txt")); got != "inside\n" {
		s.Errorf("ReadFile through sub/parent (a link to ..) = %q", got)
	}
}

func testFileErrors(s *suite) {
	sb := s.create(backend.Spec{})
	ctx := s.ctx()
	s.runOK(sb, "mkdir -p dir && echo x > file")
	_, err := s.b.ReadFile(ctx, sb.id, "missing", 10)
	wantErr(s, "ReadFile(missing)", err, backend.ErrPathNotFound)
	_, err = s.b.ReadFile(ctx, sb.id, "missing-dir/file", 10)
	wantErr(s, "ReadFile(missing-dir/file)", err, backend.ErrPathNotFound)
	_, err = s.b.ListDirectory(ctx, sb.id, "missing", 10)
	wantErr(s, "ListDirectory(missing)", err, backend.ErrPathNotFound)
	_, err = s.b.ReadFile(ctx, sb.id, "dir", 10)
	wantErr(s, "ReadFile(dir)", err, backend.ErrIsDirectory)
	_, err = s.b.ReadFile(ctx, sb.id, sb.info.Workdir, 10)
	wantErr(s, "ReadFile(workdir)", err, backend.ErrIsDirectory)
	err = s.b.WriteFile(ctx, sb.id, "dir", []byte("x"), 0)
	wantErr(s, "WriteFile(dir)", err, backend.ErrIsDirectory)
	err = s.b.WriteFile(ctx, sb.id, sb.info.Workdir, []byte("x"), 0)
	wantErr(s, "WriteFile(workdir)", err, backend.ErrIsDirectory)
	_, err = s.b.ListDirectory(ctx, sb.id, "file", 10)
	wantErr(s, "ListDirectory(file)", err, backend.ErrNotDirectory)
	if err := s.b.WriteFile(ctx, sb.id, "file/below", []byte("x"), 0); err == nil {
		s.Errorf("WriteFile(file/below) under a regular file succeeded")
	}
	s.runOK(sb, "mkfifo fifo")
	_, err = s.b.ReadFile(ctx, sb.id, "fifo", 10)
	wantErr(s, "ReadFile(fifo)", err, backend.ErrBadPath)
}

func testFileTooLarge(s *suite) {
	sb := s.create(backend.Spec{})
	ctx := s.ctx()
	data := bytes.Repeat([]byte("x"), 5000)
	s.write(sb, "big", data)
	_, err := s.b.ReadFile(ctx, sb.id, "big", 100)
	var tooLarge *backend.FileTooLargeError
	if !errors.As(err, &tooLarge) {
		s.Fatalf("ReadFile of 5000 bytes with a bound of 100: err = %v, want *FileTooLargeError", err)
	}
	if tooLarge.Size != 5000 || tooLarge.MaxBytes != 100 || tooLarge.Path != "big" {
		s.Errorf("FileTooLargeError = %+v, want the real size 5000, MaxBytes 100, Path big", tooLarge)
	}
	for _, bound := range []int64{5000, 5001} {
		if got, err := s.b.ReadFile(ctx, sb.id, "big", bound); err != nil || len(got) != 5000 {
			s.Errorf("ReadFile with a bound of %d: %d bytes, %v", bound, len(got), err)
		}
	}
	if _, err := s.b.ReadFile(ctx, sb.id, "big", 4999); !errors.As(err, &tooLarge) {
		s.Errorf("ReadFile with a bound one short: err = %v, want *FileTooLargeError", err)
	}
	s.write(sb, "empty", nil)
	if got, err := s.b.ReadFile(ctx, sb.id, "empty", 0); err != nil || len(got) != 0 {
		s.Errorf("ReadFile of an empty file with a bound of 0: %q, %v", got, err)
	}
}

// testOutputHandedOn: ExecRequest.Output gets every byte of both streams
// (streamed run_command), the first of it while the command still runs,
// and the result keeps its tail as without it.
func testOutputHandedOn(s *suite) {
	sb := s.create(backend.Spec{})
	var mu sync.Mutex
	var got [2]bytes.Buffer
	var first time.Time
	start := time.Now()
	res := s.exec(sb, backend.ExecRequest{
		Command:        "echo one; echo err >&2; sleep 1; head -c 100000 /dev/zero; echo two",
		MaxOutputBytes: 100,
		Output: func(stderr bool, p []byte) {
			mu.Lock()
			defer mu.Unlock()
			if first.IsZero() {
				first = time.Now()
			}
			i := 0
			if stderr {
				i = 1
			}
			got[i].Write(p)
		},
	})
	took := time.Since(start)
	mu.Lock()
	defer mu.Unlock()
	if want := "one\n" + strings.Repeat("\x00", 100000) + "two\n"; got[0].String() != want || got[1].String() != "err\n" {
		s.Errorf("Output got %d bytes of stdout and %q of stderr; want all %d and \"err\\n\"", got[0].Len(), got[1].String(), len(want))
	}
	if !res.StdoutTruncated || len(res.Stdout) > 100 || !strings.HasSuffix(string(res.Stdout), "two\n") {
		s.Errorf("the result's stdout with Output set: truncated %v, %d bytes", res.StdoutTruncated, len(res.Stdout))
	}
	if first.IsZero() || first.Sub(start) > took-500*time.Millisecond {
		s.Errorf("the first output reached Output %v after the start of a %v command: not while it ran", first.Sub(start), took)
	}
}

// testRangedFiles: a file moved in pieces, both ways, with the refusals
// export_file relies on (directories, FIFOs, symlinks at the path).
func testRangedFiles(s *suite) {
	rb, ok := s.b.(backend.RangedFiles)
	if !ok {
		s.Fatalf("%T does not implement backend.RangedFiles; every backend must move files in pieces", s.b)
	}
	sb := s.create(backend.Spec{})
	ctx := s.ctx()
	want := make([]byte, 300000)
	for i := range want {
		want[i] = byte(i*7 + i/251)
	}
	// Upload in pieces: a whole write, then appends and an overwrite at an offset.
	s.write(sb, "up/big.bin", want[:1000])
	for off := 1000; off < len(want); off += 65536 {
		size, err := rb.WriteFileAt(ctx, sb.id, "up/big.bin", want[off:min(off+65536, len(want))], -1)
		if err != nil || size != int64(min(off+65536, len(want))) {
			s.Fatalf("WriteFileAt(append at %d): size %d, %v", off, size, err)
		}
	}
	if size, err := rb.WriteFileAt(ctx, sb.id, "up/big.bin", want[5:10], 5); err != nil || size != int64(len(want)) {
		s.Fatalf("WriteFileAt(offset 5): size %d, %v", size, err)
	}
	if got := s.runOK(sb, "cksum < up/big.bin"); got != s.runOK(sb, "cksum < up/big.bin") || got == "" {
		s.Fatalf("cksum: %q", got)
	}
	// Download in pieces of an odd size, the last one short.
	var got []byte
	for off := int64(0); ; {
		data, size, err := rb.ReadFileRange(ctx, sb.id, "up/big.bin", off, 70001)
		if err != nil || size != int64(len(want)) {
			s.Fatalf("ReadFileRange(%d): size %d, %v", off, size, err)
		}
		got = append(got, data...)
		off += int64(len(data))
		if len(data) == 0 || off >= size {
			break
		}
	}
	if !bytes.Equal(got, want) {
		s.Fatalf("the file read back in pieces (%d bytes) differs from the one written in pieces (%d bytes)", len(got), len(want))
	}
	if data, size, err := rb.ReadFileRange(ctx, sb.id, "up/big.bin", 0, 0); err != nil || len(data) != 0 || size != int64(len(want)) {
		s.Errorf("ReadFileRange(length 0) = %d bytes, size %d, %v; want the size alone", len(data), size, err)
	}
	if data, _, err := rb.ReadFileRange(ctx, sb.id, "up/big.bin", int64(len(want))+10, 100); err != nil || len(data) != 0 {
		s.Errorf("ReadFileRange past the end = %d bytes, %v; want none", len(data), err)
	}
	_, err := rb.WriteFileAt(ctx, sb.id, "up/big.bin", []byte("x"), int64(len(want))+1)
	wantErr(s, "WriteFileAt past the end", err, backend.ErrInvalidArgument)
	_, err = rb.WriteFileAt(ctx, sb.id, "up/missing", []byte("x"), -1)
	wantErr(s, "WriteFileAt(missing)", err, backend.ErrPathNotFound)

	s.runOK(sb, "mkdir -p d && mkfifo fifo && ln -s up/big.bin link")
	_, _, err = rb.ReadFileRange(ctx, sb.id, "d", 0, 10)
	wantErr(s, "ReadFileRange(dir)", err, backend.ErrIsDirectory)
	_, _, err = rb.ReadFileRange(ctx, sb.id, "fifo", 0, 10)
	wantErr(s, "ReadFileRange(fifo)", err, backend.ErrBadPath)
	_, err = rb.WriteFileAt(ctx, sb.id, "fifo", []byte("x"), -1)
	wantErr(s, "WriteFileAt(fifo)", err, backend.ErrBadPath)
	_, err = rb.WriteFileAt(ctx, sb.id, "link", []byte("x"), -1)
	wantErr(s, "WriteFileAt(a symlink)", err, backend.ErrBadPath)
	if s.opts.GuestView {
		want := s.runOK(sb, "cat /etc/passwd")
		if data, size, err := rb.ReadFileRange(ctx, sb.id, "/etc/passwd", 1, 10); err != nil || size != int64(len(want)) || string(data) != want[1:11] {
			s.Errorf("ReadFileRange(/etc/passwd, 1, 10) = %q, size %d, %v; want the guest's (%d bytes)", data, size, err, len(want))
		}
		_, _, err = rb.ReadFileRange(ctx, sb.id, "/dev/zero", 0, 10)
		wantErr(s, "ReadFileRange(/dev/zero)", err, backend.ErrBadPath)
	} else {
		_, _, err = rb.ReadFileRange(ctx, sb.id, "/etc/passwd", 0, 10)
		wantErr(s, "ReadFileRange(/etc/passwd)", err, backend.ErrBadPath)
	}
	_, _, err = rb.ReadFileRange(ctx, sb.id, "up/big.bin", -1, 10)
	wantErr(s, "ReadFileRange(negative offset)", err, backend.ErrInvalidArgument)
}

func testConcurrent(s *suite) {
	const n = 4
	const nap = 2 * time.Second
	boxes := make([]sandbox, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := newID()
			info, err := s.b.Create(s.ctx(), id, backend.Spec{Env: map[string]string{"WHO": id}})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				s.Errorf("concurrent Create: %v", err)
				return
			}
			boxes[i] = sandbox{id, info}
			s.Cleanup(func() { _ = s.b.Destroy(context.Background(), id) })
		}()
	}
	wg.Wait()
	if s.Failed() {
		return
	}
	start := time.Now()
	outs := make([]string, n)
	for i, sb := range boxes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := s.b.Exec(s.ctx(), sb.id, backend.ExecRequest{
				Command: fmt.Sprintf(`sleep %d; echo "$WHO" > who; cat who`, int(nap.Seconds())), Timeout: time.Minute})
			if err != nil {
				s.Errorf("Exec in %s: %v", sb.id, err)
				return
			}
			outs[i] = string(res.Stdout)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	for i, sb := range boxes {
		if outs[i] != sb.id+"\n" {
			s.Errorf("sandbox %s printed %q", sb.id, outs[i])
		}
	}
	if elapsed > n*nap-time.Second {
		s.Errorf("%d commands of %v in %d sandboxes took %v: they did not run concurrently", n, nap, n, elapsed)
	}
}

// countSleeps is a shell pipeline counting the processes whose whole command
// line is "sleep [123]<tok>" (a shell whose script mentions them does not
// count).
func countSleeps(tok string) string {
	return `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -cE "^sleep [123]` + tok + ` $"`
}

// sleepToken is a number for sleep no other subtest uses ("sleep 1<tok>"
// must be a valid interval, or the sleep exits at once and proves nothing).
func sleepToken() string { return fmt.Sprint(100000 + time.Now().UnixNano()%900000) }

func testTimeoutKillsEscapees(s *suite) {
	if !s.opts.KillsEscapeesAtTimeout {
		s.Skip("the backend does not promise to kill processes that left the command's session")
	}
	sb := s.create(backend.Spec{})
	tok := sleepToken()
	// The command waits (up to ~2.5 s) until its three escapees run, then
	// counts them; the budget leaves the count time to run on a loaded
	// host (gVisor's /proc walk included): the timeout must find the
	// escapees, not cut their count short.
	res := s.exec(sb, backend.ExecRequest{Timeout: 5 * time.Second, Command: fmt.Sprintf(
		`setsid sleep 1%[1]s >/dev/null 2>&1 & (setsid sleep 2%[1]s >/dev/null 2>&1 &); (trap '' TERM HUP; exec setsid nohup sleep 3%[1]s >/dev/null 2>&1 &)
i=0; while [ "$(%[2]s)" != 3 ] && [ $i -lt 25 ]; do sleep 0.1; i=$((i+1)); done; %[2]s; sleep 60`, tok, countSleeps(tok))})
	if !res.TimedOut || strings.TrimSpace(string(res.Stdout)) != "3" {
		s.Fatalf("want a timeout with 3 escapees running before it: %+v", res)
	}
	// A setsid or a double fork must not escape the kill at the timeout.
	deadline := time.Now().Add(2 * time.Second)
	for strings.TrimSpace(string(s.exec(sb, backend.ExecRequest{Command: countSleeps(tok) + " || true"}).Stdout)) != "0" {
		if time.Now().After(deadline) {
			s.Fatalf("processes of a timed-out command survived it")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func testDestroyKillsEverything(s *suite) {
	if s.opts.HostProcesses == nil {
		s.Skip("the backend's guests are not host processes")
	}
	sb := s.create(backend.Spec{})
	tok := sleepToken()
	// Background processes may or may not outlive their command (a microVM
	// keeps them; bwrap ends them with the command): Destroy ends them all.
	s.runOK(sb, fmt.Sprintf(`sleep 1%[1]s >/dev/null 2>&1 & setsid sleep 2%[1]s >/dev/null 2>&1 & echo started`, tok))
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.b.Exec(s.ctx(), sb.id, backend.ExecRequest{Command: "sleep 3" + tok, Timeout: time.Minute, MaxOutputBytes: 1024})
	}()
	deadline := time.Now().Add(5 * time.Second)
	for len(s.opts.HostProcesses("sleep 3"+tok)) == 0 {
		if time.Now().After(deadline) {
			s.Fatalf("the command never started, so nothing would be checked")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := s.b.Destroy(s.ctx(), sb.id); err != nil {
		s.Fatal(err)
	}
	<-done
	deadline = time.Now().Add(2 * time.Second)
	for len(s.opts.HostProcesses(tok)) > 0 {
		if time.Now().After(deadline) {
			s.Fatalf("processes of a destroyed sandbox survived: %v", s.opts.HostProcesses(tok))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func testCrashedSandboxIsTerminated(s *suite) {
	if s.opts.KillSandboxInit == nil {
		s.Skip("the backend has no long-lived process to crash")
	}
	sb := s.create(backend.Spec{})
	s.runOK(sb, "true")
	if err := s.opts.KillSandboxInit(s.b, sb.id); err != nil {
		s.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(s.ctx(), 10*time.Second)
	defer cancel()
	start := time.Now()
	res, err := s.b.Exec(ctx, sb.id, backend.ExecRequest{Command: "true", Timeout: time.Minute, MaxOutputBytes: 1024})
	if time.Since(start) > 5*time.Second {
		s.Errorf("Exec took %v to notice the crash", time.Since(start))
	}
	// Either is allowed: the next command reports the sandbox gone.
	if !(err == nil && res.SandboxTerminated) && !errors.Is(err, backend.ErrNotFound) {
		s.Errorf("Exec after a crash: %+v, %v; want SandboxTerminated or ErrNotFound", res, err)
	}
	if err := s.b.Destroy(s.ctx(), sb.id); err != nil {
		s.Errorf("Destroy after a crash: %v", err)
	}
}

// A restarted daemon adopts the sandboxes it keeps: files intact, commands
// run; adopting twice is harmless.
func testAdopt(s *suite) {
	sb := s.create(backend.Spec{Env: map[string]string{"KEPT_ENV": "yes"}})
	s.write(sb, "kept.txt", []byte("kept\n"))
	s.runOK(sb, "true")
	b := s.b
	if s.opts.Reopen != nil {
		b = s.opts.Reopen(s.T, s.b)
	}
	for i := range 2 {
		if err := b.Adopt(s.ctx(), sb.id); err != nil {
			s.Fatalf("Adopt #%d of a kept sandbox: %v", i+1, err)
		}
	}
	after := &suite{T: s.T, b: b, opts: s.opts}
	if got := string(after.read(sb, "kept.txt")); got != "kept\n" {
		s.Errorf("after adopt, kept.txt is %q", got)
	}
	if out := after.runOK(sb, `cat kept.txt; echo "$KEPT_ENV"`); out != "kept\nyes\n" {
		s.Errorf("after adopt, a command saw %q; want the file and the sandbox's env", out)
	}
	if err := b.Destroy(s.ctx(), sb.id); err != nil {
		s.Errorf("Destroy after adopt: %v", err)
	}
}

// Adopt reports a sandbox that does not exist (never made, destroyed, or
// an id that is no id) as ErrNotFound, which recovery reads as "gone".
func testAdoptGone(s *suite) {
	wantErr(s.T, "Adopt of an unknown id", s.b.Adopt(s.ctx(), newID()), backend.ErrNotFound)
	wantErr(s.T, "Adopt of a hostile id", s.b.Adopt(s.ctx(), "../../etc"), backend.ErrNotFound)
	sb := s.create(backend.Spec{})
	if err := s.b.Destroy(s.ctx(), sb.id); err != nil {
		s.Fatal(err)
	}
	wantErr(s.T, "Adopt of a destroyed sandbox", s.b.Adopt(s.ctx(), sb.id), backend.ErrNotFound)
	if s.listed(sb.id) {
		s.Errorf("Adopt brought a destroyed sandbox back")
	}
}

// A command whose caller goes away, at any moment, is cancelled; the
// sandbox is never terminated for it (a client disconnecting must not lose
// an owner's sandbox).
func testCancelledExec(s *suite) {
	sb := s.create(backend.Spec{})
	s.write(sb, "kept.txt", []byte("kept"))
	s.runOK(sb, "true")
	for i := range 20 {
		ctx, cancel := context.WithTimeout(s.ctx(), time.Duration(i%5)*time.Millisecond)
		res, err := s.b.Exec(ctx, sb.id, backend.ExecRequest{Command: "sleep 5", Timeout: time.Minute, MaxOutputBytes: 1024})
		cancel()
		if res.SandboxTerminated {
			s.Fatalf("cancel #%d after %v: the sandbox was terminated (%v)", i, time.Duration(i%5)*time.Millisecond, err)
		}
		if err == nil && !res.TimedOut && res.ExitCode == 0 {
			s.Fatalf("cancel #%d: sleep 5 finished although its caller had gone", i)
		}
	}
	if got := s.runOK(sb, "cat kept.txt"); got != "kept" {
		s.Errorf("after cancelled commands, kept.txt is %q", got)
	}
}

// testGuestView: with Options.GuestView, reads and listings of any path
// give what a guest process gets there: the same bytes as cat, the same
// names as ls, /proc/self of a process with the guest's identity (never
// init's), devices bounded, what the guest may not read refused; writes
// stay confined. Without it, such paths are bad_path (testBadPaths).
func testGuestView(s *suite) {
	if !s.opts.GuestView {
		s.Skip("the backend confines reads to the workdir and /tmp (testBadPaths checks that)")
	}
	sb := s.create(backend.Spec{})
	ctx := s.ctx()

	ls := strings.Fields(s.runOK(sb, "ls -A /"))
	entries, err := s.b.ListDirectory(ctx, sb.id, "/", 10000)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name)
	}
	if err != nil || !slices.Equal(names, ls) {
		s.Errorf("ListDirectory(/) = %v, %v; the guest's ls -A / says %v", names, err, ls)
	}

	// /proc/self is a process like the guest's: its identity, its
	// confinement, and not pid 1 (init).
	status, err := s.b.ReadFile(ctx, sb.id, "/proc/self/status", 1<<20)
	if err != nil {
		s.Fatalf("ReadFile(/proc/self/status): %v", err)
	}
	mine := statusFields(string(status))
	for k, v := range statusFields(s.runOK(sb, "cat /proc/self/status")) {
		switch k {
		case "Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp":
			if mine[k] != v {
				s.Errorf("/proc/self/status read as a file says %s %q; a guest command's says %q", k, mine[k], v)
			}
		}
	}
	if mine["Pid"] == "1" || mine["Pid"] == "" {
		s.Errorf("/proc/self read as a file is pid %q: the sandbox's init, not a process of the guest's", mine["Pid"])
	}

	// Devices are read bounded: an endless one is too large, never a hang.
	var tooLarge *backend.FileTooLargeError
	if _, err := s.b.ReadFile(ctx, sb.id, "/dev/zero", 1000); !errors.As(err, &tooLarge) || tooLarge.MaxBytes != 1000 || tooLarge.Size <= 1000 {
		s.Errorf("ReadFile(/dev/zero, 1000) = %v; want *FileTooLargeError past 1000 bytes", err)
	}
	if got, err := s.b.ReadFile(ctx, sb.id, "/dev/null", 10); err != nil || len(got) != 0 {
		s.Errorf("ReadFile(/dev/null) = %q, %v", got, err)
	}

	// Symlinks resolve in the sandbox; the guest's permissions hold.
	s.runOK(sb, "ln -s /etc/passwd pw && mkdir -p locked && echo hidden > locked/f && chmod 000 locked/f")
	if got, err := s.b.ReadFile(ctx, sb.id, "pw", 1<<20); err != nil || string(got) != s.runOK(sb, "cat /etc/passwd") {
		s.Errorf("ReadFile(pw -> /etc/passwd) = %q, %v", got, err)
	}
	if s.run(sb, "cat locked/f").ExitCode != 0 {
		_, err := s.b.ReadFile(ctx, sb.id, "locked/f", 100)
		wantErr(s, "ReadFile of a file the guest may not read", err, backend.ErrBadPath)
	}

	// Reads are served while a command runs: the command waits for a file
	// the suite writes only after its read, so a backend that served reads
	// only between commands fails the read rather than pass by waiting.
	gate := "/tmp/" + unique("go")
	done := make(chan backend.ExecResult, 1)
	go func() {
		res, _ := s.b.Exec(ctx, sb.id, backend.ExecRequest{Command: "touch running; while [ ! -e " + gate + " ]; do sleep 0.05; done", Timeout: time.Minute})
		done <- res
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := s.b.ReadFile(ctx, sb.id, "running", 10); err == nil {
			break
		}
		if time.Now().After(deadline) {
			s.Fatalf("the command never started")
		}
	}
	_, readErr := s.b.ReadFile(ctx, sb.id, "/etc/passwd", 1<<20)
	if err := s.b.WriteFile(ctx, sb.id, gate, nil, 0); err != nil {
		s.Fatalf("WriteFile(%s): %v", gate, err)
	}
	if readErr != nil {
		s.Errorf("ReadFile while a command runs: %v", readErr)
	}
	if res := <-done; res.ExitCode != 0 {
		s.Errorf("the command beside the reads: %+v", res)
	}
	if _, err := s.b.ReadFile(ctx, sb.id, "/etc/passwd", 1<<20); err != nil {
		s.Errorf("ReadFile after a command ended: %v", err)
	}

	// Writes stay in the workdir and /tmp.
	for _, p := range []string{"/etc/" + unique("probe"), "/usr/" + unique("probe")} {
		err := s.b.WriteFile(ctx, sb.id, p, []byte("x"), 0)
		wantErr(s, fmt.Sprintf("WriteFile(%q)", p), err, backend.ErrBadPath)
	}
}

// statusFields parses /proc/PID/status into field → value (whitespace
// squeezed).
func statusFields(s string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	return out
}
