package capture

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// helperEnv selects a helper mode when the test binary re-executes itself.
const helperEnv = "CAPTURE_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "pdeathsig" {
		runPdeathsigHelper()
		return
	}
	os.Exit(m.Run())
}

// runPdeathsigHelper starts a long sleep through Run and blocks; the parent
// test kills this process and checks that the sleep died with it.
func runPdeathsigHelper() {
	pidFile := os.Getenv("CAPTURE_TEST_PIDFILE")
	cmd := exec.Command("/bin/sh", "-c", `echo $$ > "$0"; exec sleep 1003`, pidFile)
	_, _ = Run(context.Background(), cmd, Options{Timeout: time.Minute})
	os.Exit(3)
}

func sh(script string) *exec.Cmd { return exec.Command("/bin/sh", "-c", script) }

func TestRunExitCodesAndSignals(t *testing.T) {
	requireTools(t, "/bin/sh")
	cases := []struct {
		script string
		code   int
		sig    syscall.Signal
	}{
		{"exit 0", 0, 0},
		{"exit 7", 7, 0},
		{"kill -TERM $$", 128 + 15, syscall.SIGTERM},
		{"kill -SEGV $$", 128 + 11, syscall.SIGSEGV},
		{"kill -KILL $$", 128 + 9, syscall.SIGKILL},
	}
	for _, tc := range cases {
		t.Run(tc.script, func(t *testing.T) {
			res, err := Run(context.Background(), sh(tc.script), Options{Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tc.code || res.Signal != tc.sig {
				t.Errorf("ExitCode %d Signal %v, want %d %v", res.ExitCode, res.Signal, tc.code, tc.sig)
			}
			if res.TimedOut || res.Killed {
				t.Errorf("TimedOut %v Killed %v for a command that ended by itself", res.TimedOut, res.Killed)
			}
		})
	}
}

func TestRunStreamsAndStdin(t *testing.T) {
	requireTools(t, "/bin/sh", "cat")
	in := bytes.Repeat([]byte("stdin line\n"), 20000) // 220 KB, more than a pipe holds
	res, err := Run(context.Background(), sh("cat; echo to-stderr >&2"), Options{Timeout: 10 * time.Second, Stdin: in})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(res.Stdout, in) || res.StdoutTruncated || res.StdoutTotal != int64(len(in)) {
		t.Errorf("stdout: %d bytes (total %d, truncated %v), want the %d bytes of stdin", len(res.Stdout), res.StdoutTotal, res.StdoutTruncated, len(in))
	}
	if string(res.Stderr) != "to-stderr\n" {
		t.Errorf("stderr = %q", res.Stderr)
	}

	// nil stdin is empty, not the daemon's own stdin.
	res, err = Run(context.Background(), sh("wc -c"), Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(res.Stdout)) != "0" {
		t.Errorf("wc -c of a nil stdin printed %q, want 0", res.Stdout)
	}
}

func TestRunKeepsTailOfLargeOutputInBoundedMemory(t *testing.T) {
	requireTools(t, "/bin/sh", "yes", "head")
	const total = 200 << 20
	const limit = 64 << 10

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	rssBefore := procStatusKiB(t, "VmRSS")
	resetPeakRSS()

	start := time.Now()
	res, err := Run(context.Background(), sh(fmt.Sprintf("yes 0123456789abcdef | head -c %d; echo done", total)),
		Options{Timeout: time.Minute, MaxOutputBytes: limit})
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	peak := procStatusKiB(t, "VmHWM")
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("200 MiB through a %d KiB tail: %v (%.0f MiB/s); Go allocated %d KiB during the run; RSS %d KiB before, peak %d KiB",
		limit>>10, elapsed, float64(total)/(1<<20)/elapsed.Seconds(), allocated>>10, rssBefore, peak)

	if res.StdoutTotal != total+5 || !res.StdoutTruncated {
		t.Errorf("StdoutTotal %d Truncated %v, want %d true", res.StdoutTotal, res.StdoutTruncated, total+5)
	}
	if len(res.Stdout) > limit || len(res.Stdout) < limit-17 {
		t.Errorf("kept %d bytes, want about %d", len(res.Stdout), limit)
	}
	// head -c cuts the last line short, so "done" ends a partial line.
	if !bytes.HasSuffix(res.Stdout, []byte("0123done\n")) {
		t.Errorf("the tail does not end with the last line: ...%q", res.Stdout[max(0, len(res.Stdout)-40):])
	}
	if !bytes.HasPrefix(res.Stdout, []byte("0123456789abcdef\n")) {
		t.Errorf("the kept window does not start on a whole line: %q...", res.Stdout[:min(40, len(res.Stdout))])
	}
	// Unbounded buffering would allocate at least the 200 MiB written.
	if allocated > 16<<20 {
		t.Errorf("Go allocated %d MiB while capturing; the buffers are not bounded", allocated>>20)
	}
	if growth := int64(peak) - int64(rssBefore); peak > 0 && rssBefore > 0 && growth > 64<<10 {
		t.Errorf("peak RSS grew by %d MiB while capturing", growth>>10)
	}
}

// resetPeakRSS makes VmHWM start again from the current RSS (Linux 4.0+).
// A command whose output is one long line (minified JSON, a progress bar)
// followed by its newline keeps the end of that line when truncated: the
// caller never gets an empty stdout for output that was there.
func TestRunTruncatedSingleLineKeepsItsTail(t *testing.T) {
	requireTools(t, "/bin/sh", "head", "tr")
	res, err := Run(context.Background(), sh("head -c 100000 /dev/zero | tr '\\0' x; echo end"),
		Options{Timeout: time.Minute, MaxOutputBytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Repeat("x", 996) + "end\n"
	if !res.StdoutTruncated || string(res.Stdout) != want {
		t.Errorf("Truncated %v, stdout %d bytes ending %q; want the last 1000 bytes", res.StdoutTruncated, len(res.Stdout), res.Stdout[max(0, len(res.Stdout)-10):])
	}
}

func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

func procStatusKiB(t *testing.T, field string) uint64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

func TestRunTimeoutStopsCommands(t *testing.T) {
	requireTools(t, "/bin/sh", "sleep")
	cases := []struct {
		name       string
		script     string
		wantKilled bool
		wantSig    syscall.Signal
	}{
		{"obeys SIGTERM", "sleep 1000", false, syscall.SIGTERM},
		{"ignores SIGTERM", "trap '' TERM; sleep 1000", true, syscall.SIGKILL},
		{"handles SIGTERM and carries on", "trap 'echo caught' TERM; while :; do sleep 0.05; done", true, syscall.SIGKILL},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A budget the shell's trap is set well within, on a loaded host.
			opts := Options{Timeout: time.Second, KillGrace: 300 * time.Millisecond}
			start := time.Now()
			res, err := Run(context.Background(), sh(tc.script), opts)
			elapsed := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			if !res.TimedOut || res.Killed != tc.wantKilled || res.Signal != tc.wantSig {
				t.Errorf("TimedOut %v Killed %v Signal %v, want true %v %v", res.TimedOut, res.Killed, res.Signal, tc.wantKilled, tc.wantSig)
			}
			lo, hi := opts.Timeout, opts.Timeout+opts.KillGrace+time.Second
			if tc.wantKilled {
				lo = opts.Timeout + opts.KillGrace
			}
			if elapsed < lo || elapsed > hi {
				t.Errorf("Run took %v, want between %v and %v", elapsed, lo, hi)
			}
		})
	}
}

func TestRunReturnsWhenBackgroundedChildHoldsPipes(t *testing.T) {
	requireTools(t, "/bin/sh", "sleep")
	const drainGrace = 250 * time.Millisecond
	cmd := sh("sleep 1001 & echo started")
	start := time.Now()
	// The stdin is larger than a pipe and never read: the writer must not
	// keep Run waiting either.
	res, err := Run(context.Background(), cmd, Options{Timeout: time.Minute, DrainGrace: drainGrace, Stdin: make([]byte, 1<<20)})
	elapsed := time.Since(start)
	if cmd.Process != nil {
		// Run leaves what the command left behind; clean it up here.
		t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Run returned after %v with a grandchild holding the pipes (DrainGrace %v)", elapsed, drainGrace)
	if elapsed < drainGrace || elapsed > drainGrace+time.Second {
		t.Errorf("Run took %v, want about DrainGrace (%v)", elapsed, drainGrace)
	}
	if res.ExitCode != 0 || string(res.Stdout) != "started\n" || res.TimedOut {
		t.Errorf("ExitCode %d Stdout %q TimedOut %v", res.ExitCode, res.Stdout, res.TimedOut)
	}
}

func TestRunContextCancelKillsAtOnce(t *testing.T) {
	requireTools(t, "/bin/sh", "sleep")
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	res, err := Run(ctx, sh("echo before; trap '' TERM; sleep 1000"), Options{Timeout: time.Minute})
	elapsed := time.Since(start)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if res.Signal != syscall.SIGKILL || res.TimedOut || string(res.Stdout) != "before\n" {
		t.Errorf("Signal %v TimedOut %v Stdout %q; want SIGKILL, false, the partial output", res.Signal, res.TimedOut, res.Stdout)
	}
	if elapsed > time.Second {
		t.Errorf("Run took %v after cancellation, want it to kill at once", elapsed)
	}
}

func TestRunContextAlreadyDoneStartsNothing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cmd := sh("exit 0")
	if _, err := Run(ctx, cmd, Options{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if cmd.Process != nil {
		t.Error("the process was started although the context had ended")
	}
}

func TestRunStartFailure(t *testing.T) {
	_, err := Run(context.Background(), exec.Command(filepath.Join(t.TempDir(), "missing")), Options{})
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want one wrapping os.ErrNotExist", err)
	}
}

// TestRunChildDiesWithDaemon kills a process that is inside Run and checks
// that Pdeathsig took the child down with it.
func TestRunChildDiesWithDaemon(t *testing.T) {
	requireTools(t, "/bin/sh", "sleep")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(t.TempDir(), "pid")
	helper := exec.Command(self)
	helper.Env = append(os.Environ(), helperEnv+"=pdeathsig", "CAPTURE_TEST_PIDFILE="+pidFile)
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = helper.Process.Kill(); _ = helper.Wait() }()

	var pid int
	for deadline := time.Now().Add(10 * time.Second); pid == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the helper never started its child")
		}
		b, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	waitFor(t, 5*time.Second, "the child to exec sleep", func() bool { return isSleep1003(pid) })
	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = helper.Wait()
	waitFor(t, 5*time.Second, "the child to die with its parent", func() bool { return !isSleep1003(pid) })
}

// isSleep1003 reports whether pid is a live (not zombie) "sleep 1003".
func isSleep1003(pid int) bool {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || string(cmdline) != "sleep\x001003\x00" {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] != 'Z'
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
	}
}

func TestRunChildInheritsOnlyItsStreams(t *testing.T) {
	requireTools(t, "/bin/sh", "ls")
	// A descriptor without close-on-exec, like one the daemon inherited
	// from whatever started it.
	fd, err := unix.Open("/dev/null", unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	extra, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()

	cmd := exec.Command("ls", "/proc/self/fd")
	cmd.ExtraFiles = []*os.File{extra}
	res, err := Run(context.Background(), cmd, Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// 0-2 are the streams, 3 the extra file, 4 the directory ls reads.
	if got := strings.Fields(string(res.Stdout)); strings.Join(got, " ") != "0 1 2 3 4" {
		t.Errorf("the child has descriptors %v, want only 0 1 2, ExtraFiles (3) and its own (4); descriptor %d leaked", got, fd)
	}
}

// TestRunTimeoutReachesProcessThatLeftItsGroup covers a main process that
// moves itself out of the group Run made for it (here into the test's own
// group): signalling the group alone would never reach it.
func TestRunTimeoutReachesProcessThatLeftItsGroup(t *testing.T) {
	// Debian's interpreter, not whatever python3 is first on PATH (a
	// version manager's shim can take seconds to start under load).
	requireTools(t, "/usr/bin/python3")
	script := "import os, time\nos.setpgid(0, os.getpgid(os.getppid()))\nprint('moved', flush=True)\ntime.sleep(1000)\n"
	start := time.Now()
	res, err := Run(context.Background(), exec.Command("/usr/bin/python3", "-c", script), Options{Timeout: 5 * time.Second, KillGrace: 300 * time.Millisecond})
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "moved\n" {
		t.Fatalf("the process did not leave its group: stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	if !res.TimedOut || res.Signal != syscall.SIGTERM || elapsed > 8*time.Second {
		t.Errorf("TimedOut %v Signal %v after %v; want the timeout to reach it", res.TimedOut, res.Signal, elapsed)
	}
}

func TestRunStartedHook(t *testing.T) {
	requireTools(t, "/bin/sh", "sleep")
	t.Run("runs once the process exists, before it is fed", func(t *testing.T) {
		cmd := sh(`cat`)
		var pidSeen int
		res, err := Run(context.Background(), cmd, Options{Timeout: 10 * time.Second, Stdin: []byte("in"), Started: func() error {
			pidSeen = cmd.Process.Pid
			return unix.Kill(pidSeen, 0)
		}})
		if err != nil {
			t.Fatal(err)
		}
		if pidSeen == 0 || string(res.Stdout) != "in" || res.ExitCode != 0 {
			t.Errorf("hook saw pid %d; result exit %d stdout %q", pidSeen, res.ExitCode, res.Stdout)
		}
	})
	t.Run("an error kills the process and is returned", func(t *testing.T) {
		refused := errors.New("not placed")
		start := time.Now()
		res, err := Run(context.Background(), sh(`exec sleep 30`), Options{Timeout: time.Minute, Started: func() error { return refused }})
		if !errors.Is(err, refused) {
			t.Fatalf("error %v, want one wrapping %v", err, refused)
		}
		if took := time.Since(start); took > 20*time.Second || res.Signal != syscall.SIGKILL {
			t.Errorf("the process ran on: %v, signal %v", took, res.Signal)
		}
	})
}
