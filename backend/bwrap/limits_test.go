package bwrap

import (
	"fmt"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

// limitsProbe prints what a command sees of its rlimits and seccomp state.
const limitsProbe = `ulimit -n; ulimit -f; ulimit -c; grep '^Seccomp:' /proc/self/status`

func wantLimits(t *testing.T, out string) {
	t.Helper()
	// ulimit -f counts 512-byte blocks in dash.
	want := "100\n2048\n0\nSeccomp:\t2\n"
	if out != want {
		t.Errorf("rlimits and seccomp seen by a command = %q, want %q", out, want)
	}
}

func TestLimitsApplyToEveryCommand(t *testing.T) {
	for _, m := range allModes {
		t.Run(m.name, func(t *testing.T) {
			b := newTestBackend(t, m, func(c *Config) {
				c.Limits = limits.Limits{OpenFiles: 100, FileSizeBytes: 1 << 20}
			})
			id := create(t, b, backend.Spec{})
			// Through init, twice: the limits are init's, inherited.
			wantLimits(t, runOK(t, b, id, limitsProbe))
			wantLimits(t, runOK(t, b, id, limitsProbe))
			// A file past the size limit is refused.
			res := run(t, b, id, `dd if=/dev/zero of=/workspace/big bs=1M count=2 2>&1; echo rc=$?`)
			if !strings.Contains(string(res.Stdout), "File too large") && !strings.Contains(string(res.Stdout), "rc=153") {
				t.Errorf("writing past RLIMIT_FSIZE: %q", res.Stdout)
			}
		})
	}
}

func TestSeccompContainsGuestCommands(t *testing.T) {
	b := newTestBackend(t, daemonUID)
	id := create(t, b, backend.Spec{})
	// unshare(CLONE_NEWUSER) and mount are refused by the filter; an
	// ordinary command still runs.
	res := run(t, b, id, `unshare -U true 2>&1; echo rc=$?; ulimit -c`)
	out := string(res.Stdout)
	if !strings.Contains(out, "Operation not permitted") || strings.Contains(out, "rc=0") {
		t.Errorf("unshare -U in a sandbox: %q, want it refused", out)
	}
	if !strings.HasSuffix(out, "0\n") {
		t.Errorf("core size in a sandbox: %q, want 0", out)
	}
}

func TestNewRefusesInvalidLimits(t *testing.T) {
	_, err := New(Config{Dir: t.TempDir(), SandboxUID: -1, SandboxGID: -1, Limits: limits.Limits{OpenFiles: 3}})
	if err == nil || !strings.Contains(err.Error(), "open files") {
		t.Fatalf("New with OpenFiles 3: %v, want a validation error", err)
	}
}

func TestLimitsAboveTheDaemonsOwnAreClamped(t *testing.T) {
	var own unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &own); err != nil || own.Max == unix.RLIM_INFINITY {
		t.Skipf("no finite hard RLIMIT_NOFILE here (%v)", err)
	}
	l := clampToOwnHardLimits(limits.Limits{OpenFiles: own.Max + 1, FileSizeBytes: 0}, hclog.NewNullLogger())
	if l.OpenFiles != own.Max || l.FileSizeBytes != 0 {
		t.Errorf("clamped limits = %+v, want OpenFiles %d and FileSizeBytes 0 (no limit stays no limit)", l, own.Max)
	}
}

// Without an open-files limit a command's NOFILE soft limit is its hard
// one, whatever soft limit the daemon was started with: init's own Go
// runtime raised init's soft limit to one below the hard, which commands
// spawned by initproc.Spawn would otherwise inherit (and which
// syscall.ForkExec used to put back to the daemon's original soft limit).
func TestNoOpenFilesLimitMeansSoftIsHard(t *testing.T) {
	var own unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &own); err != nil || own.Max == unix.RLIM_INFINITY {
		t.Skipf("no finite hard RLIMIT_NOFILE here (%+v, %v)", own, err)
	}
	// A daemon started with a soft limit below its hard one, as systemd
	// starts services (1024 of 524288): bwrap, and so init, start with it.
	// A host (a container) whose hard limit is 1024 or less gets a hard
	// limit of 2048 for the test, which root may raise to.
	low := unix.Rlimit{Cur: 1024, Max: max(own.Max, 2048)}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Skipf("the hard RLIMIT_NOFILE here is %d, not above the soft 1024 the test starts the daemon with, and raising it to 2048 failed (it needs CAP_SYS_RESOURCE): %v", own.Max, err)
	}
	t.Cleanup(func() { _ = unix.Setrlimit(unix.RLIMIT_NOFILE, &own) })
	b := newTestBackend(t, daemonUID, func(c *Config) {
		c.Limits = limits.Limits{FileSizeBytes: 1 << 20}
	})
	id := create(t, b, backend.Spec{})
	want := fmt.Sprintf("%d\n%d\n", low.Max, low.Max)
	for range 2 {
		if out := runOK(t, b, id, `ulimit -Sn; ulimit -Hn`); out != want {
			t.Errorf("NOFILE soft and hard seen by a command without open_files = %q, want %q", out, want)
		}
	}
}
