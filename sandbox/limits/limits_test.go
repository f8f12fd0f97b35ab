package limits

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/cgroup"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/seccomp"
)

func TestValidateAndWithin(t *testing.T) {
	require.NoError(t, Defaults().Validate())
	require.NoError(t, Limits{}.Validate())
	require.Error(t, Limits{MemoryBytes: 1 << 20}.Validate())
	require.Error(t, Limits{PIDs: 2}.Validate())
	require.Error(t, Limits{CPUs: -1}.Validate())
	require.Error(t, Limits{DiskBytes: 1}.Validate())

	ceil := Defaults()
	require.NoError(t, Defaults().Within(ceil))
	require.Error(t, Limits{MemoryBytes: 2 << 30, CPUs: 1, PIDs: 1, OpenFiles: 1, FileSizeBytes: 1, DiskBytes: 1 << 20}.Within(ceil))
	require.Error(t, Limits{}.Within(ceil), "no limit at all exceeds any ceiling")
	require.NoError(t, Limits{}.Within(Limits{}))
}

// prlimitArgs is an argv prefix that starts the command after it with
// l.Rlimits(), through util-linux's prlimit inside the sandbox: how these
// tests give a bare bubblewrap the limits a sandbox's init sets on itself.
func prlimitArgs(l Limits) []string {
	args := []string{"/usr/bin/prlimit"}
	for _, r := range l.Rlimits() {
		v := strconv.FormatUint(r.Value, 10)
		args = append(args, "--"+r.Name+"="+v+":"+v)
	}
	return append(args, "--")
}

func TestRlimits(t *testing.T) {
	l := Limits{OpenFiles: 64, FileSizeBytes: 1 << 20}
	require.Equal(t, []string{"/usr/bin/prlimit", "--core=0:0", "--nofile=64:64", "--fsize=1048576:1048576", "--"}, prlimitArgs(l))
	require.Equal(t, []string{"/usr/bin/prlimit", "--core=0:0", "--"}, prlimitArgs(Limits{}))
}

func requireCI(t *testing.T, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("this test needs %s, and CI=true forbids skipping", what)
	}
	t.Skipf("needs %s", what)
}

// sandboxRun is one bubblewrap command run the way the integration note
// describes: seccomp filter, gate, cgroup, rlimits.
type sandboxRun struct {
	exitCode int
	output   string
	stats    cgroup.Stats
	oomKills uint64 // the group's OOM kills during the run
}

// exitKilled is 128+SIGKILL, what a shell reports for a process the kernel
// (or timeout -s KILL) killed.
const exitKilled = 128 + int(syscall.SIGKILL)

func runInSandbox(t *testing.T, cg *cgroup.Cgroup, l Limits, timeout time.Duration, script string) sandboxRun {
	t.Helper()
	bwrap, err := exec.LookPath("bwrap")
	requireCI(t, err == nil, "bubblewrap")

	// Whatever this test process inherited (from go test, a CI runner)
	// must not reach the sandbox; the daemon does the same (capture).
	require.NoError(t, unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC))
	filter, err := seccomp.Memfd(seccomp.Guest())
	require.NoError(t, err)
	defer filter.Close()
	gate, err := NewGate()
	require.NoError(t, err)
	defer gate.Close()

	args := []string{"--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
		"--uid", "1000", "--gid", "1000",
		"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
		"--seccomp", "3"}
	args = append(args, gate.Args(4, 5)...)
	args = append(args, "--", "/usr/bin/timeout", "-s", "KILL", strings.TrimSuffix(timeout.String(), "0s"))
	args = append(args, prlimitArgs(l)...)
	args = append(args, "/bin/sh", "-c", script)
	cmd := exec.Command(bwrap, args...)
	cmd.ExtraFiles = append([]*os.File{filter}, gate.Files()...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}},
		Setpgid:    true, Pdeathsig: syscall.SIGKILL,
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}()

	child, err := gate.ChildPID()
	if err != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done // out is complete only once Wait has returned
		t.Fatalf("%v: %s", err, out.String())
	}
	require.NoError(t, cg.Add(child))
	oomBefore, err := cg.OOMKills()
	require.NoError(t, err)
	require.NoError(t, gate.Release())

	select {
	case <-done:
	case <-time.After(timeout + 30*time.Second):
		t.Fatalf("bwrap did not end within %v", timeout+30*time.Second)
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(waitErr, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, waitErr)
	}
	st, err := cg.Stats()
	require.NoError(t, err)
	return sandboxRun{exitCode: code, output: out.String(), stats: st, oomKills: st.OOMKills - min(oomBefore, st.OOMKills)}
}

func sandboxGroup(t *testing.T, l Limits) *cgroup.Cgroup {
	t.Helper()
	requireCI(t, os.Geteuid() == 0, "root")
	var b [4]byte
	rand.Read(b[:])
	m, err := cgroup.New(cgroup.Options{Base: "sidecar-limitstest-" + hex.EncodeToString(b[:])})
	requireCI(t, err == nil, "cgroups with the memory, pids and cpu controllers")
	cg, err := m.Create("sbx", cgroup.Limits{MemoryBytes: l.MemoryBytes, PIDs: l.PIDs, CPUs: l.CPUs, CPUWeight: l.CPUWeight})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := cg.Destroy(ctx); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		for _, d := range m.Dirs() {
			_ = syscall.Rmdir(d)
		}
	})
	return cg
}

func TestBubblewrapSandboxMemoryBalloonIsOOMKilled(t *testing.T) {
	l := Limits{MemoryBytes: 64 << 20, PIDs: 32, CPUs: 1, OpenFiles: 64, FileSizeBytes: 1 << 20}
	cg := sandboxGroup(t, l)
	r := runInSandbox(t, cg, l, 30*time.Second, `exec /usr/bin/python3 -c 'b = bytearray(512 << 20); print("survived")'`)
	require.Equal(t, exitKilled, r.exitCode, r.output)
	require.Greater(t, r.oomKills, uint64(0), "the kernel's OOM killer, not something else, ended it: %+v", r)
	require.NotContains(t, r.output, "survived")
}

func TestBubblewrapSandboxForkBombIsContained(t *testing.T) {
	l := Limits{MemoryBytes: 256 << 20, PIDs: 32, CPUs: 1}
	cg := sandboxGroup(t, l)
	// One fork before the bomb exists ("b &"), then exec: dash forks each
	// element of "b | b" itself, so after "b;" its second fork could fail
	// once pids.max is full, and dash would exit at once.
	r := runInSandbox(t, cg, l, 3*time.Second, `b() { b | b & }; b & exec sleep 10`)
	require.Equal(t, exitKilled, r.exitCode, "timeout -s KILL ends it: %s", r.output)
	require.Greater(t, r.stats.PIDsLimitHits, uint64(0), "the bomb must have hit pids.max: %+v", r.stats)
	// The kernel tears the PID namespace down after bwrap's exit is
	// reported: give it a moment, bounded.
	var pids []int
	require.Eventually(t, func() bool {
		var err error
		pids, err = cg.PIDs()
		return err == nil && len(pids) == 0
	}, 10*time.Second, 20*time.Millisecond, "the PID namespace died with bwrap: %v", pids)
}

func TestBubblewrapSandboxRlimitsAndFilter(t *testing.T) {
	l := Limits{MemoryBytes: 128 << 20, PIDs: 32, OpenFiles: 64, FileSizeBytes: 1 << 20}
	cg := sandboxGroup(t, l)
	r := runInSandbox(t, cg, l, 20*time.Second, `ulimit -n; ulimit -c; grep -E '^(Seccomp|NoNewPrivs|CapEff):' /proc/self/status
dd if=/dev/zero of=/tmp/big bs=1M count=4 2>&1 | tail -1; echo "dd=$?"; ls -l /tmp/big | cut -d' ' -f5
unshare -U true 2>&1; echo "unshare=$?"
exec /usr/bin/python3 -c 'import os
def link(f):
    try: return os.readlink("/proc/self/fd/" + f)
    except OSError: return "closed"
print("fds", sorted((int(f), link(f)) for f in os.listdir("/proc/self/fd")))'`)
	require.Equal(t, 0, r.exitCode, r.output)
	lines := strings.Split(r.output, "\n")
	require.Equal(t, "64", lines[0])
	require.Equal(t, "0", lines[1])
	require.Contains(t, r.output, "Seccomp:\t2")
	require.Contains(t, r.output, "NoNewPrivs:\t1")
	require.Contains(t, r.output, "CapEff:\t0000000000000000")
	require.Contains(t, r.output, "1048576\n", "RLIMIT_FSIZE stops the file at 1 MiB")
	require.Contains(t, r.output, "unshare=1")
	require.Contains(t, r.output, "fds [(0, '/dev/null'), (1, 'pipe:", "only stdio (and the listing's own directory, closed by now): bwrap closed the filter and gate descriptors")
	require.Contains(t, r.output, "(3, 'closed')]\n")
}
