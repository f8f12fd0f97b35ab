package bwrap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/internal/handoff"
)

const sessionScript = `
import json, os, pathlib
data = json.loads(pathlib.Path("input.json").read_text())
pathlib.Path("out").mkdir(exist_ok=True)
pathlib.Path("out/result.txt").write_text("sum=%d\n" % sum(data["numbers"]))
pathlib.Path("/tmp/scratch").write_text("kept")
with open("shared.txt", "a") as f:
    f.write("appended by the guest\n")
print("cwd", os.getcwd(), "uid", os.getuid())
`

func TestBwrapSession(t *testing.T) {
	forEachMode(t, func(t *testing.T, b *Backend) {
		ctx := context.Background()
		id := create(t, b, backend.Spec{})
		for name, data := range map[string]string{
			"script.py":  sessionScript,
			"input.json": `{"numbers": [1, 2, 3, 4]}`,
			"shared.txt": "written by the host\n",
		} {
			if err := b.WriteFile(ctx, id, name, []byte(data), 0); err != nil {
				t.Fatal(err)
			}
		}
		out := runOK(t, b, id, "python3 script.py")
		if out != "cwd /workspace uid 1000\n" {
			t.Errorf("script printed %q", out)
		}
		got, err := b.ReadFile(ctx, id, "/workspace/out/result.txt", 1<<20)
		if err != nil || string(got) != "sum=10\n" {
			t.Errorf("ReadFile(result) = %q, %v", got, err)
		}
		// The guest could modify a file the host wrote.
		got, err = b.ReadFile(ctx, id, "shared.txt", 1<<20)
		if err != nil || string(got) != "written by the host\nappended by the guest\n" {
			t.Errorf("ReadFile(shared.txt) = %q, %v", got, err)
		}
		got, err = b.ReadFile(ctx, id, "/tmp/scratch", 10)
		if err != nil || string(got) != "kept" {
			t.Errorf("ReadFile(/tmp/scratch) = %q, %v", got, err)
		}
		entries, err := b.ListDirectory(ctx, id, "/workspace", 100)
		if err != nil {
			t.Fatal(err)
		}
		want := []backend.DirEntry{{Name: "input.json"}, {Name: "out", IsDir: true}, {Name: "script.py"}, {Name: "shared.txt"}}
		if !slices.Equal(entries, want) {
			t.Errorf("ListDirectory = %v, want %v", entries, want)
		}
		if uid := sandboxUID(t, b, id); uid >= 0 {
			assertOwner(t, filepath.Join(b.sandboxDir(id), workDirName, "out", "result.txt"), uid)
			assertOwner(t, filepath.Join(b.sandboxDir(id), workDirName, "script.py"), uid)
		}
		if err := b.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(b.sandboxDir(id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Dir/<id> still exists after Destroy: %v", err)
		}
	})
}

func assertOwner(t *testing.T, path string, uid int) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := int(fi.Sys().(*syscall.Stat_t).Uid); got != uid {
		t.Errorf("%s is owned by uid %d on the host, want %d", path, got, uid)
	}
}

func TestBwrapFilesAndTmpPersistBetweenCommands(t *testing.T) {
	forEachMode(t, func(t *testing.T, b *Backend) {
		id := create(t, b, backend.Spec{})
		runOK(t, b, id, "echo one > /workspace/a; mkdir -p /tmp/d && echo two > /tmp/d/b")
		if out := runOK(t, b, id, "cat /workspace/a /tmp/d/b"); out != "one\ntwo\n" {
			t.Errorf("second command read %q", out)
		}
	})
}

func TestBwrapSandboxesCannotSeeEachOther(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	first := create(t, b, backend.Spec{})
	second := create(t, b, backend.Spec{})
	runOK(t, b, first, "echo first-secret > /workspace/mine; echo tmp-secret > /tmp/mine")
	out := runOK(t, b, second, "ls -A /workspace /tmp; grep -rs secret / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr || true")
	if strings.Contains(out, "mine") || strings.Contains(out, "secret") {
		t.Errorf("the second sandbox sees the first's files:\n%s", out)
	}
	if _, err := b.ReadFile(context.Background(), second, "mine", 100); !errors.Is(err, backend.ErrPathNotFound) {
		t.Errorf("ReadFile of the other sandbox's file name: %v", err)
	}
}

func TestBwrapIsolationFromInside(t *testing.T) {
	t.Setenv("SIDECAR_SECRET", "hunter2-from-the-daemon")
	forEachMode(t, func(t *testing.T, b *Backend) {
		id := create(t, b, backend.Spec{})
		check := func(name, command, want string) {
			t.Helper()
			if got := runOK(t, b, id, command); got != want {
				t.Errorf("%s: %q printed %q, want %q", name, command, got, want)
			}
		}
		check("only loopback", `tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '`, "lo\n")
		check("no /sys network view", `ls /sys/class/net 2>/dev/null | grep -v '^lo$' || true`, "")
		check("identity", `id -u; id -g; id -un; hostname`, "1000\n1000\nsandbox\nsandbox\n")
		check("no capabilities", `grep -E '^Cap(Eff|Prm|Bnd|Amb):' /proc/self/status | awk '{print $2}' | sort -u`, "0000000000000000\n")
		check("no new privileges via setuid", `cat /proc/self/status | grep -c '^NoNewPrivs:.1'`, "1\n")
		hidden := []string{"/root", "/home", "/run", "/var", "/srv", "/opt", "/mnt", "/boot", b.cfg.Dir, filepath.Dir(b.cfg.Dir)}
		for _, p := range hidden {
			check("hidden "+p, fmt.Sprintf("test -e %q && echo visible || echo hidden", p), "hidden\n")
		}
		allowed := map[string]bool{"bin": true, "dev": true, "etc": true, "lib": true, "lib32": true, "lib64": true,
			"libx32": true, "proc": true, "sbin": true, "tmp": true, "usr": true, "workspace": true}
		for _, name := range strings.Fields(runOK(t, b, id, "ls -A /")) {
			if !allowed[name] {
				t.Errorf("/%s is visible in the sandbox", name)
			}
		}
		env := runOK(t, b, id, "env | cut -d= -f1 | sort")
		if env != "HOME\nLANG\nPATH\nPWD\n" {
			t.Errorf("the guest's environment has %q, want only HOME LANG PATH (and the shell's PWD)", strings.Fields(env))
		}
		check("daemon env invisible to every process", `cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' | grep -c hunter2 || true`, "0\n")
		check("only the three streams", `ls /proc/self/fd | sort -n | tr '\n' ' '`, "0 1 2 3 ")
		check("read-only system", `touch /usr/x 2>/dev/null && echo writable || echo ro`, "ro\n")
	})
}

func TestBwrapEnvironmentLayers(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	id := create(t, b, backend.Spec{Env: map[string]string{"A": "sandbox", "B": "sandbox", "SPACES": "x y\nz"}})
	res, err := b.Exec(context.Background(), id, backend.ExecRequest{
		Command: `printf '%s|%s|%s|%s' "$A" "$B" "$SPACES" "$HOME"`,
		Env:     map[string]string{"B": "request"},
		Timeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res.Stdout); got != "sandbox|request|x y\nz|/workspace" {
		t.Errorf("env seen by the guest: %q", got)
	}
	// The values must not appear on bwrap's command line, which every
	// host user can read in /proc.
	_, err = b.Exec(context.Background(), id, backend.ExecRequest{Command: "true", Env: map[string]string{"BAD=NAME": "x"}, Timeout: time.Second})
	wantErr(t, err, backend.ErrInvalidArgument)
}

func TestBwrapEnvValuesStayOffHostCommandLine(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	id := create(t, b, backend.Spec{Env: map[string]string{"TOKEN": "tok-3f9a1c"}})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = b.Exec(context.Background(), id, backend.ExecRequest{Command: "sleep 1", Timeout: 10 * time.Second})
	}()
	deadline := time.Now().Add(5 * time.Second)
	sawBwrap := false
	for time.Now().Before(deadline) && !sawBwrap {
		matches, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, m := range matches {
			cmdline, _ := os.ReadFile(m)
			if strings.Contains(string(cmdline), "tok-3f9a1c") {
				t.Fatalf("an environment value is visible in %s: %q", m, cmdline)
			}
			if strings.HasPrefix(filepath.Base(strings.SplitN(string(cmdline), "\x00", 2)[0]), "bwrap") && strings.Contains(string(cmdline), "--args") {
				sawBwrap = true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	<-done
	if !sawBwrap {
		t.Fatal("never saw the bwrap process, so nothing was checked")
	}
}

func TestBwrapArgvCwdAndStdin(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	id := create(t, b, backend.Spec{})
	ctx := context.Background()
	res, err := b.Exec(ctx, id, backend.ExecRequest{Argv: []string{"printf", "[%s]", "a b", "-x", "$HOME"}, Timeout: 10 * time.Second})
	if err != nil || string(res.Stdout) != "[a b][-x][$HOME]" {
		t.Errorf("argv: %q %q %v", res.Stdout, res.Stderr, err)
	}
	res, err = b.Exec(ctx, id, backend.ExecRequest{Command: "pwd", Cwd: "/tmp/", Timeout: 10 * time.Second})
	if err != nil || string(res.Stdout) != "/tmp\n" {
		t.Errorf("cwd: %q %v", res.Stdout, err)
	}
	res, err = b.Exec(ctx, id, backend.ExecRequest{Command: "tr a-z A-Z", Stdin: []byte("hello\n"), Timeout: 10 * time.Second})
	if err != nil || string(res.Stdout) != "HELLO\n" {
		t.Errorf("stdin: %q %v", res.Stdout, err)
	}
}

func TestBwrapExitCodes(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	id := create(t, b, backend.Spec{})
	cases := []struct {
		command string
		code    int
	}{
		{"exit 3", 3},
		{"exit 124", 124},   // looks like timeout's code, but the budget did not elapse
		{"kill -9 $$", 137}, // looks like an escalation, but it was not one
		{"kill -TERM $$", 143},
		{"no-such-program", 127},
	}
	for _, tc := range cases {
		res := run(t, b, id, tc.command)
		if res.ExitCode != tc.code || res.TimedOut || res.SandboxTerminated {
			t.Errorf("%q: exit %d TimedOut %v SandboxTerminated %v, want %d false false", tc.command, res.ExitCode, res.TimedOut, res.SandboxTerminated, tc.code)
		}
	}
}

func TestBwrapLargeOutputIsCapped(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	id := create(t, b, backend.Spec{})
	const limit = 64 << 10
	start := time.Now()
	res, err := b.Exec(context.Background(), id, backend.ExecRequest{
		Command:        "head -c 209715200 /dev/zero | tr '\\0' 'x' | fold -w 99; echo; echo the end; echo to stderr >&2",
		Timeout:        time.Minute,
		MaxOutputBytes: limit,
	})
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("200 MiB of guest output captured in %v", elapsed)
	if !res.StdoutTruncated || len(res.Stdout) > limit || len(res.Stdout) < limit-200 {
		t.Errorf("stdout: %d bytes, truncated %v; want about %d, true", len(res.Stdout), res.StdoutTruncated, limit)
	}
	if !strings.HasSuffix(string(res.Stdout), "\nthe end\n") {
		t.Errorf("the tail is not the end of the output: ...%q", res.Stdout[max(0, len(res.Stdout)-30):])
	}
	if string(res.Stderr) != "to stderr\n" || res.StderrTruncated {
		t.Errorf("stderr %q truncated %v", res.Stderr, res.StderrTruncated)
	}
}

func TestBwrapTimeouts(t *testing.T) {
	b := newTestBackend(t, rangeUID, func(c *Config) { c.KillGrace = 500 * time.Millisecond })
	id := create(t, b, backend.Spec{})
	cases := []struct {
		name, command string
		timeout       time.Duration
		wantExit      int
		min, max      time.Duration
	}{
		{"sleep", "sleep 60", time.Second, 124, time.Second, 3 * time.Second},
		{"ignores SIGTERM", "trap '' TERM; sleep 60", time.Second, 137, 1500 * time.Millisecond, 3 * time.Second},
		{"sub-millisecond budget", "sleep 60", time.Nanosecond, 124, 0, 2 * time.Second},
		// As GNU timeout reported them: a command that handles SIGTERM and
		// exits by itself still timed out (124), and a stopped one gets
		// SIGCONT with its SIGTERM, so it ends at the budget, not the grace.
		{"handles SIGTERM and exits 0", "trap 'exit 0' TERM; sleep 60 & wait", time.Second, 124, time.Second, 1400*time.Millisecond + time.Second},
		{"stopped", "kill -STOP $$", time.Second, 124, time.Second, 1400*time.Millisecond + time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			res, err := b.Exec(context.Background(), id, backend.ExecRequest{Command: tc.command, Timeout: tc.timeout})
			elapsed := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("stopped after %v (exit %d)", elapsed, res.ExitCode)
			if !res.TimedOut || res.ExitCode != tc.wantExit || res.SandboxTerminated {
				t.Errorf("TimedOut %v exit %d SandboxTerminated %v, want true %d false", res.TimedOut, res.ExitCode, res.SandboxTerminated, tc.wantExit)
			}
			if elapsed < tc.min || elapsed > tc.max {
				t.Errorf("took %v, want between %v and %v", elapsed, tc.min, tc.max)
			}
			if want := backend.GuestTimeout(tc.timeout); res.AppliedTimeout != want {
				t.Errorf("AppliedTimeout %v, want %v", res.AppliedTimeout, want)
			}
		})
	}
}

func TestBwrapHungBwrapCannotHoldExec(t *testing.T) {
	// A stand-in for a bwrap that hangs and ignores SIGTERM, so the
	// sandbox's init never says it is ready: only the daemon's own
	// deadline (100ms budget + 100ms KillGrace + 200ms ExecGrace) stops
	// the wait.
	fake := filepath.Join(t.TempDir(), "hung-bwrap")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\ntrap '' TERM\nwhile :; do sleep 0.05; done\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "state")
	b, err := New(Config{Dir: dir, BwrapPath: fake, SandboxUID: -1, SandboxGID: -1, KillGrace: 100 * time.Millisecond, ExecGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	id := create(t, b, backend.Spec{})
	seen := make(chan bool, 1)
	go func() {
		deadline := time.Now().Add(10 * time.Second)
		for len(processesContaining(fake)) == 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		seen <- len(processesContaining(fake)) > 0
	}()
	start := time.Now()
	_, err = b.Exec(context.Background(), id, backend.ExecRequest{Command: "true", Timeout: 100 * time.Millisecond})
	elapsed := time.Since(start)
	wantErr(t, err, backend.ErrUnavailable)
	// Not a timing assertion: a bound far above the 400ms that only a
	// wait on the hung bwrap itself (no deadline) would pass.
	if elapsed > 20*time.Second {
		t.Errorf("Exec returned after %v; want about 400ms", elapsed)
	}
	if !<-seen {
		t.Fatal("never saw the fake bwrap running, so nothing was checked")
	}
	waitNoProcessContaining(t, 10*time.Second, fake)
	// The sandbox is not terminated by a start that failed: the next Exec
	// tries again.
	_, err = b.Exec(context.Background(), id, backend.ExecRequest{Command: "true", Timeout: 100 * time.Millisecond})
	wantErr(t, err, backend.ErrUnavailable)
}

func TestBwrapBackgroundedProcessesDieWithTheCommand(t *testing.T) {
	forEachMode(t, func(t *testing.T, b *Backend) {
		id := create(t, b, backend.Spec{})
		cases := []string{
			"sleep 1002 & echo started",
			"setsid nohup sleep 1002 >/dev/null 2>&1 < /dev/null & echo started",
		}
		for _, command := range cases {
			start := time.Now()
			out := runOK(t, b, id, command)
			elapsed := time.Since(start)
			if out != "started\n" || elapsed > 2*time.Second {
				t.Errorf("%q: printed %q after %v; want it back at once", command, out, elapsed)
			}
			// The PID namespace died with the command, taking the sleep with it.
			waitNoProcess(t, 2*time.Second, "sleep", "1002")
		}
		if err := b.Destroy(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		waitNoProcess(t, time.Second, "sleep", "1002")
	})
}

func TestBwrapDestroyStopsRunningCommands(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	id := create(t, b, backend.Spec{})
	type outcome struct {
		res backend.ExecResult
		err error
	}
	results := make(chan outcome, 1)
	go func() {
		res, err := b.Exec(context.Background(), id, backend.ExecRequest{Command: "trap '' TERM; sleep 1004", Timeout: time.Minute})
		results <- outcome{res, err}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for len(hostProcesses("sleep", "1004")) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the command never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The contract: commands in one sandbox do not overlap. One that would
	// is refused at once, and the running one goes on.
	if _, err := b.Exec(context.Background(), id, backend.ExecRequest{Command: "true", Timeout: time.Second}); !errors.Is(err, backend.ErrUnavailable) {
		t.Errorf("a second command while one runs: %v, want ErrUnavailable", err)
	}
	if n := len(hostProcesses("sleep", "1004")); n != 1 {
		t.Errorf("%d commands run after the refused one, want the first still running", n)
	}
	start := time.Now()
	if err := b.Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	t.Logf("Destroy with a running command took %v", time.Since(start))
	if o := <-results; o.err != nil || !o.res.SandboxTerminated || o.res.TimedOut {
		t.Errorf("Exec under Destroy: %+v, %v; want SandboxTerminated and no error", o.res, o.err)
	}
	waitNoProcess(t, time.Second, "sleep", "1004")
	if _, err := b.Exec(context.Background(), id, backend.ExecRequest{Command: "true", Timeout: time.Second}); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("Exec after Destroy: %v, want ErrNotFound", err)
	}
}

func TestBwrapExecContextCancel(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	id := create(t, b, backend.Spec{})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := b.Exec(ctx, id, backend.ExecRequest{Command: "sleep 1005", Timeout: time.Minute})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("Exec returned %v after its context ended", elapsed)
	}
	waitNoProcess(t, time.Second, "sleep", "1005")
	// The sandbox itself survives a cancelled request.
	runOK(t, b, id, "true")
}

func TestBwrapConcurrentSandboxes(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	const sandboxes, commands = 4, 5
	ids := make([]string, sandboxes)
	for i := range ids {
		ids[i] = create(t, b, backend.Spec{Env: map[string]string{"WHO": fmt.Sprint(i)}})
	}
	var wg sync.WaitGroup
	errs := make(chan error, sandboxes*commands)
	// The sandboxes in parallel, each one's commands one after the other
	// (commands in one sandbox never overlap).
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := 0; c < commands; c++ {
				res, err := b.Exec(context.Background(), id, backend.ExecRequest{
					Command: fmt.Sprintf(`echo "$WHO" > /workspace/c%d; sleep 0.2; cat /workspace/c%d; ls /workspace | wc -l`, c, c),
					Timeout: 30 * time.Second,
				})
				if err != nil {
					errs <- err
					return
				}
				lines := strings.Fields(string(res.Stdout))
				if len(lines) != 2 || lines[0] != fmt.Sprint(i) || lines[1] != fmt.Sprint(c+1) {
					errs <- fmt.Errorf("sandbox %d command %d printed %q (stderr %q)", i, c, res.Stdout, res.Stderr)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, id := range ids {
		entries, err := b.ListDirectory(context.Background(), id, "/workspace", 100)
		if err != nil || len(entries) != commands {
			t.Errorf("sandbox %s holds %v (%v), want exactly its own %d files", id, entries, err, commands)
		}
	}
}

func TestBwrapExecLatency(t *testing.T) {
	forEachMode(t, func(t *testing.T, b *Backend) {
		id := create(t, b, backend.Spec{})
		var times []time.Duration
		for i := 0; i < 30; i++ {
			start := time.Now()
			res, err := b.Exec(context.Background(), id, backend.ExecRequest{Argv: []string{"/bin/true"}, Timeout: 10 * time.Second})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("/bin/true: %+v %v", res, err)
			}
			times = append(times, time.Since(start))
		}
		sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
		t.Logf("Exec /bin/true: min %v, median %v, p90 %v, max %v", times[0], times[len(times)/2], times[len(times)*9/10], times[len(times)-1])
	})
}

// Init runs an argv itself, so it reports what a shell (or GNU timeout
// before it) would: 127 for a program that is not there, 126 for one that
// cannot run, and a working directory the guest may not enter as exit 1
// with the reason, not as a program that cannot run.
func TestBwrapArgvThatCannotRun(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	id := create(t, b, backend.Spec{})
	runOK(t, b, id, "printf 'echo hi' > /workspace/noexec; printf '#!/bin/sh\necho script\n' > /workspace/script; chmod +x /workspace/script; mkdir -m 0 /workspace/shut")
	cases := []struct {
		name   string
		req    backend.ExecRequest
		code   int
		stdout string
		stderr string
	}{
		{"not on PATH", backend.ExecRequest{Argv: []string{"no-such-program"}}, 127, "", "no-such-program"},
		{"no such path", backend.ExecRequest{Argv: []string{"/workspace/missing"}}, 127, "", "/workspace/missing"},
		{"not executable", backend.ExecRequest{Argv: []string{"/workspace/noexec"}}, 126, "", "permission denied"},
		{"a directory", backend.ExecRequest{Argv: []string{"/workspace"}}, 126, "", "/workspace"},
		{"a script", backend.ExecRequest{Argv: []string{"/workspace/script"}}, 0, "script\n", ""},
		{"on PATH", backend.ExecRequest{Argv: []string{"echo", "found"}}, 0, "found\n", ""},
		{"cwd not enterable", backend.ExecRequest{Argv: []string{"/bin/true"}, Cwd: "/workspace/shut"}, 1, "", "cannot change directory to /workspace/shut"},
	}
	for _, tc := range cases {
		tc.req.Timeout = 10 * time.Second
		res, err := b.Exec(context.Background(), id, tc.req)
		if err != nil || res.ExitCode != tc.code || string(res.Stdout) != tc.stdout || !strings.Contains(strings.ToLower(string(res.Stderr)), strings.ToLower(tc.stderr)) || res.TimedOut {
			t.Errorf("%s: exit %d stdout %q stderr %q timed out %v, %v; want exit %d, stdout %q, stderr holding %q", tc.name, res.ExitCode, res.Stdout, res.Stderr, res.TimedOut, err, tc.code, tc.stdout, tc.stderr)
		}
	}
}

// A command run on its connection's reader (internal/handoff) releases the
// connection before it waits: once for a command that outlasts the hot
// wait, while it still runs; and with its result as it would be without.
// Its first command also releases it before the init starts (a wait).
func TestBwrapExecReleasesTheConnectionBeforeItWaits(t *testing.T) {
	b := newTestBackend(t, daemonUID)
	id := create(t, b, backend.Spec{})
	exec := func(command string, watched ...int) (backend.ExecResult, []time.Duration) {
		t.Helper()
		var released []time.Duration
		start := time.Now()
		fd := -1
		if len(watched) > 0 {
			fd = watched[0]
		}
		ctx := handoff.With(context.Background(), handoff.New(fd, func() { released = append(released, time.Since(start)) }))
		res, err := b.Exec(ctx, id, backend.ExecRequest{Command: command, Timeout: 30 * time.Second})
		if err != nil {
			t.Fatalf("Exec(%q): %v", command, err)
		}
		return res, released
	}
	// A fresh sandbox's first command may start its init: released first,
	// if so; later commands find it running.
	if res, released := exec("true"); res.ExitCode != 0 || len(released) > 1 {
		t.Fatalf("first command: exit %d, released %d times", res.ExitCode, len(released))
	}
	res, released := exec("sleep 0.5; echo done")
	if res.ExitCode != 0 || string(res.Stdout) != "done\n" {
		t.Errorf("exit %d, stdout %q", res.ExitCode, res.Stdout)
	}
	if len(released) != 1 {
		t.Fatalf("released %d times, want once", len(released))
	}
	if released[0] >= 400*time.Millisecond {
		t.Errorf("released %v after the start: not before the command's wait", released[0])
	}
	// A connection with something to read (the next request, a hang-up)
	// is released by the hot wait that watches it, even for a command that
	// ends within it.
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	if _, err := syscall.Write(p[1], []byte{1}); err != nil {
		t.Fatal(err)
	}
	if res, released := exec("true", p[0]); res.ExitCode != 0 || len(released) != 1 {
		t.Errorf("a readable connection: exit %d, released %d times, want once", res.ExitCode, len(released))
	}
}
