package initproc

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc/inittest"
)

// TestShieldedSignals holds the set to what os/signal documents as ending
// a Go program that has not asked for a signal; that each really would end
// init, and nothing else does, is TestBwrapGuestCannotHurtInit's and
// TestGVisorGuestCannotHurtInit's to show.
func TestShieldedSignals(t *testing.T) {
	sigs := ShieldedSignals()
	fatal := []syscall.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, // exit
		syscall.SIGQUIT, syscall.SIGILL, syscall.SIGTRAP, syscall.SIGABRT, syscall.SIGSTKFLT, syscall.SIGSYS, // exit with a dump
		syscall.SIGBUS, syscall.SIGFPE, syscall.SIGSEGV} // sent by kill, as a guest does
	for _, s := range fatal {
		if !slices.Contains(sigs, os.Signal(s)) {
			t.Errorf("%v is not shielded", s)
		}
	}
	// Each of these costs init's start a round trip to the runtime's signal
	// thread, or takes a default init needs (SIGCHLD), or the runtime's own.
	for _, s := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP, syscall.SIGCHLD, syscall.SIGURG, syscall.SIGPROF,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE, syscall.SIGALRM, syscall.SIGWINCH, syscall.SIGTSTP, syscall.SIGCONT} {
		if slices.Contains(sigs, os.Signal(s)) {
			t.Errorf("%v is shielded; it needs no handler (or init or the runtime needs its own)", s)
		}
	}
	if len(sigs) != len(fatal) {
		t.Errorf("%d signals shielded, want %d", len(sigs), len(fatal))
	}
}

func TestIs(t *testing.T) {
	const env = "SANDBOX_SIDECAR_INITPROC_TEST"
	t.Setenv(env, "")
	if Is(env) {
		t.Error("Is with the variable empty")
	}
	Main(env, func() int { t.Fatal("Main ran init outside one"); return 1 })
	t.Setenv(env, "1")
	if !Is(env) {
		t.Error("not Is with the variable 1")
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	inittest.Remove()
	os.Exit(code)
}

func TestFind(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "usr", "bin")
	libexec := filepath.Join(dir, "usr", "libexec", "sandbox-sidecar")
	for _, d := range []string{bin, libexec} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	daemon := filepath.Join(bin, "sandbox-sidecar")
	if got := Find(daemon); got != "" {
		t.Errorf("Find with no init = %q, want none", got)
	}
	// A directory of that name is not an init.
	if err := os.Mkdir(filepath.Join(libexec, BinaryName), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := Find(daemon); got != "" {
		t.Errorf("Find with a directory in its place = %q, want none", got)
	}
	if err := os.Remove(filepath.Join(libexec, BinaryName)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(libexec, BinaryName), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, want := Find(daemon), filepath.Join(libexec, BinaryName); got != want {
		t.Errorf("Find (the package's layout) = %q, want %q", got, want)
	}
	if err := os.WriteFile(filepath.Join(bin, BinaryName), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, want := Find(daemon), filepath.Join(bin, BinaryName); got != want {
		t.Errorf("Find (a build tree: next to the daemon first) = %q, want %q", got, want)
	}
}

// threads is this process's number of OS threads.
func threads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads line in /proc/self/status")
	return 0
}

func TestReserveThreads(t *testing.T) {
	before := threads(t)
	ReserveThreads(before + 4)
	// Each of the goroutines held a thread of its own at once; the
	// threads stay, idle, for the runtime's later needs.
	if after := threads(t); after < before+4 {
		t.Errorf("%d threads after reserving %d (had %d)", after, before+4, before)
	}
}
