package packaging

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/test/internal/debroot"
)

// Named bounds on every wait of the container's life.
const (
	// initTimeout bounds finding the container's init after nspawn starts.
	initTimeout = 20 * time.Second
	// bootTimeout bounds "systemctl is-system-running --wait".
	bootTimeout = 90 * time.Second
	// poweroffTimeout bounds a clean shutdown before nspawn is killed.
	poweroffTimeout = 30 * time.Second
	// commandTimeout is the default bound on one command in the container.
	commandTimeout = 60 * time.Second
)

// containerEnv is the whole environment of commands run in the container.
var containerEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root", "LANG=C.UTF-8", "DEBIAN_FRONTEND=noninteractive",
	"SANDBOX_SIDECAR_SOCKET=/run/sandbox-sidecar/sidecar.sock",
	"SYSTEMD_PAGER=", "SYSTEMD_COLORS=0",
}

// container is a Debian booted with systemd-nspawn, driven from the host
// with nsenter into its init's namespaces (no machined, no machinectl).
type container struct {
	t      *testing.T
	name   string
	root   string // its root directory on the host
	share  string // bound at /share inside
	nspawn *exec.Cmd
	exited chan struct{} // closed when nspawn exits
	init   int           // the container's PID 1, as the host sees it
	log    string        // nspawn's output: the boot log
}

// boot starts systemd-nspawn -b on root in the background and waits until
// systemd inside says the system is up. Cleanup powers it off, or kills it.
// nspawnArgs are more options for systemd-nspawn.
func boot(t *testing.T, root, share string, nspawnArgs ...string) *container {
	t.Helper()
	c := &container{t: t, name: fmt.Sprintf("sidecar-pkgtest-%d", os.Getpid()), root: root, share: share,
		exited: make(chan struct{}), log: filepath.Join(t.TempDir(), "nspawn.log")}
	// Empty leftovers of runs that could not clean up (rmdir only).
	stale, _ := filepath.Glob("/run/systemd/nspawn/propagate/sidecar-pkgtest-*")
	for _, d := range stale {
		os.Remove(d)
	}
	logf, err := os.Create(c.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	// nspawn runs as PID 1 of a PID namespace of its own, which dies with
	// this test process even when it cannot clean up (a go test timeout, a
	// Ctrl-C): unshare gets SIGKILL when the test dies and passes it on to
	// nspawn, and the end of nspawn's namespace kills every process in it,
	// the booted container included. (Killing nspawn alone would leave the
	// container's systemd running.)
	args := append([]string{"--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL", "--",
		"systemd-nspawn", "--quiet", "--boot", "--register=no", "--keep-unit",
		"--directory=" + root, "--machine=" + c.name, "--bind=" + share + ":/share", "--console=read-only"}, nspawnArgs...)
	c.nspawn = exec.Command("unshare", args...)
	c.nspawn.Stdout, c.nspawn.Stderr = logf, logf
	// A unified cgroup hierarchy inside, as on a Debian 12 host, even when
	// this host mounts a hybrid one (cgroup v2 at /sys/fs/cgroup/unified).
	c.nspawn.Env = os.Environ()
	if _, err := os.Stat("/sys/fs/cgroup/unified/cgroup.controllers"); err == nil {
		c.nspawn.Env = append(c.nspawn.Env, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1")
	}
	c.nspawn.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := c.nspawn.Start(); err != nil {
		t.Fatalf("starting systemd-nspawn: %v", err)
	}
	go func() { c.nspawn.Wait(); close(c.exited) }()
	t.Cleanup(c.shutdown)

	deadline := time.Now().Add(initTimeout)
	for c.init == 0 {
		select {
		case <-c.exited:
			t.Fatalf("systemd-nspawn exited at start; its output:\n%s", c.bootLog(40))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no container init under systemd-nspawn (pid %d) after %s", c.nspawn.Process.Pid, initTimeout)
		}
		// unshare, its child nspawn, nspawn's child the container's init.
		if nspawn := firstChild(c.nspawn.Process.Pid); nspawn != 0 {
			c.init = firstChild(nspawn)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// systemctl cannot talk to systemd until it has made its private
	// socket: until then, try again.
	var out string
	for deadline := time.Now().Add(bootTimeout); ; {
		out, _ = c.runTimeout(time.Until(deadline), "systemctl", "is-system-running", "--wait")
		if !strings.Contains(out, "Failed to connect to bus") || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	switch state := strings.TrimSpace(out); state {
	case "running":
	case "degraded":
		failed, _ := c.run("systemctl", "--failed", "--no-legend")
		t.Logf("the container booted degraded (not ours to fix):\n%s", failed)
	default:
		t.Fatalf("the container did not boot (state %q); boot log:\n%s", state, c.bootLog(60))
	}
	return c
}

// firstChild returns a child of pid, or 0.
func firstChild(pid int) int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		if fs := strings.Fields(string(b)); len(fs) > 0 {
			n, _ := strconv.Atoi(fs[0])
			return n
		}
	}
	return 0
}

func (c *container) bootLog(lines int) string {
	b, _ := os.ReadFile(c.log)
	return debroot.Tail(string(b), lines)
}

// command builds a command that runs args inside the container as root.
func (c *container) command(ctx context.Context, args ...string) *exec.Cmd {
	nsargs := append([]string{"-t", strconv.Itoa(c.init), "-a", "env", "-i"}, containerEnv...)
	cmd := exec.CommandContext(ctx, "nsenter", append(nsargs, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// background is a command started in the container and left running.
type background struct {
	done chan error      // gets the command's Wait result
	out  strings.Builder // its combined output; read once done has delivered
}

// background starts args in the container, bound to the test's context.
func (c *container) background(t *testing.T, args ...string) *background {
	t.Helper()
	b := &background{done: make(chan error, 1)}
	cmd := c.command(t.Context(), args...)
	cmd.Stdout, cmd.Stderr = &b.out, &b.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { b.done <- cmd.Wait() }()
	return b
}

// runTimeout runs args in the container within limit and returns its
// combined output; err is an *exec.ExitError for a non-zero exit.
func (c *container) runTimeout(limit time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var buf bytes.Buffer
	cmd := c.command(ctx, args...)
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%q did not finish within %s: %w", strings.Join(args, " "), limit, ctx.Err())
	}
	return buf.String(), err
}

func (c *container) run(args ...string) (string, error) { return c.runTimeout(commandTimeout, args...) }

// sh runs a shell script in the container and fails the test unless it
// exits 0.
func (c *container) sh(script string) string {
	c.t.Helper()
	out, err := c.run("bash", "-euo", "pipefail", "-c", script)
	if err != nil {
		c.t.Fatalf("in the container: %s\n-> %v\n%s", script, err, out)
	}
	return out
}

// shTimeout is sh with its own bound.
func (c *container) shTimeout(limit time.Duration, script string) string {
	c.t.Helper()
	out, err := c.runTimeout(limit, "bash", "-euo", "pipefail", "-c", script)
	if err != nil {
		c.t.Fatalf("in the container: %s\n-> %v\n%s", script, err, out)
	}
	return out
}

// exitCode runs a shell script and returns its exit code and output.
func (c *container) exitCode(script string) (int, string) {
	c.t.Helper()
	out, err := c.run("bash", "-c", script)
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out
	case errors.As(err, &ee):
		return ee.ExitCode(), out
	default:
		c.t.Fatalf("in the container: %s\n-> %v\n%s", script, err, out)
		return -1, out
	}
}

// waitFor polls a shell condition (exit 0) until limit.
func (c *container) waitFor(limit time.Duration, what, script string) {
	c.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		out, err := c.run("bash", "-c", script)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: not within %s; last try: %v\n%s", what, limit, err, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// shutdown powers the container off, and kills it if that does not work;
// on a failed test it first logs what the container's systemd knows.
func (c *container) shutdown() {
	if c.init != 0 && c.t.Failed() {
		out, _ := c.runTimeout(20*time.Second, "bash", "-c",
			"systemctl status --no-pager --full 'sandbox-sidecar*' 2>&1; journalctl -b --no-pager -n 200 2>&1")
		c.t.Logf("container state at failure:\n%s", out)
	}
	if c.init != 0 {
		c.runTimeout(10*time.Second, "systemctl", "poweroff", "--no-block")
	}
	select {
	case <-c.exited:
	case <-time.After(poweroffTimeout):
		c.t.Logf("the container did not power off within %s: killing it", poweroffTimeout)
		syscall.Kill(-c.nspawn.Process.Pid, syscall.SIGKILL)
		if c.init != 0 {
			syscall.Kill(c.init, syscall.SIGKILL) // takes its PID namespace with it
		}
		select {
		case <-c.exited:
		case <-time.After(10 * time.Second):
			c.t.Errorf("systemd-nspawn (pid %d) survived SIGKILL", c.nspawn.Process.Pid)
		}
	}
	// nspawn leaves this behind when it cannot remove it itself.
	os.Remove(filepath.Join("/run/systemd/nspawn/propagate", c.name))
}
