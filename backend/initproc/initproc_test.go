package initproc

import (
	"os"
	"slices"
	"syscall"
	"testing"
)

func TestShieldedSignals(t *testing.T) {
	sigs := ShieldedSignals()
	for _, s := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP, syscall.SIGCHLD, syscall.SIGURG, syscall.SIGPROF} {
		if slices.Contains(sigs, os.Signal(s)) {
			t.Errorf("%v is shielded; init needs its default (or the runtime does)", s)
		}
	}
	for _, s := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGSEGV} {
		if !slices.Contains(sigs, os.Signal(s)) {
			t.Errorf("%v is not shielded", s)
		}
	}
	if len(sigs) != 31-5 {
		t.Errorf("%d signals shielded, want 26", len(sigs))
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
