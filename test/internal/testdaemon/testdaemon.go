// Package testdaemon is what the tests that run the real daemon share:
// building its binary once per test binary, deciding whether this host can
// run them at all, and starting the daemon and keeping its log.
package testdaemon

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
)

// BinEnv names a daemon built elsewhere (a release binary, another
// revision) to test instead of building one.
const BinEnv = "SANDBOX_SIDECAR_BIN"

// Main is a TestMain: it builds the daemon (as the package does, without
// cgo) into a directory every uid may
// search and run from (tests run it as other uids too), stores its path in
// *bin, runs the tests and removes the build.
func Main(m *testing.M, bin *string) {
	dir, err := os.MkdirTemp("", "sidecar-test-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_ = os.Chmod(dir, 0o755)
	*bin = filepath.Join(dir, "sandbox-sidecar")
	if prebuilt := os.Getenv(BinEnv); prebuilt != "" {
		*bin = prebuilt
	} else {
		build := exec.Command("go", "build", "-o", *bin, "github.com/sandbox-sidecar/sandbox-sidecar/cmd/sandbox-sidecar")
		// As the package builds it (packaging/deb/build.sh): without cgo,
		// a non-root daemon can clear its ambient capabilities on every
		// thread (backend/bwrap/privilege.go).
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building the daemon:", err)
			os.Exit(1)
		}
		// And beside it the sandboxes' small static init, where the
		// daemon looks for it (initproc.Find), as the package installs it.
		build = exec.Command("go", "build", "-o", filepath.Join(dir, "sandbox-sidecar-init"), "github.com/sandbox-sidecar/sandbox-sidecar/cmd/sandbox-sidecar-init")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building the sandboxes' init:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// RequireHost skips the test, or fails it under CI=true, unless the host
// can run the daemon's sandboxes for real: root, bubblewrap, and the files
// given (programs the test runs inside sandboxes, e.g. /usr/bin/python3).
func RequireHost(t testing.TB, files ...string) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	if _, err := exec.LookPath("bwrap"); err != nil {
		missing = append(missing, "bubblewrap (apt-get install bubblewrap)")
	}
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, f)
		}
	}
	if len(missing) == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("this test needs %s, and CI=true forbids skipping", strings.Join(missing, " and "))
	}
	t.Skipf("needs %s", strings.Join(missing, " and "))
}

// NoHostConfig returns a serve command line (args[0] == "serve") that
// reads no config file unless it names one: --config /dev/null is added
// after "serve". Without it a daemon a test starts reads the host's
// /etc/sandbox-sidecar/config.toml when there is one (a worker host with
// the package installed), and the test would run with whatever that
// host's operator set (a warm pool, other limits, egress, another
// backend).
func NoHostConfig(args []string) []string {
	if len(args) == 0 || args[0] != "serve" {
		panic("testdaemon.NoHostConfig: not a serve command line")
	}
	for _, a := range args {
		if a == "--config" || strings.HasPrefix(a, "--config=") {
			return args
		}
	}
	return append([]string{"serve", "--config", "/dev/null"}, args[1:]...)
}

// What Start watches for, and how much of the daemon's stderr it keeps.
const (
	readyLine = "is listening on"
	logCap    = 8 << 20
)

// Process is a daemon a test started: its stderr is kept (the first
// logCap bytes) and watched for the line that says it serves.
type Process struct {
	Cmd *exec.Cmd

	done chan struct{} // closed once Cmd.Wait has returned
	err  error         // Cmd.Wait's, once done

	mu   sync.Mutex
	logs bytes.Buffer
}

// Start starts cmd, taking over its stderr, runs started (when not nil)
// right after the process exists, then waits until the daemon says it
// serves. It fails t if the daemon exits first or says nothing within
// limit, with what the daemon wrote.
func Start(t testing.TB, cmd *exec.Cmd, limit time.Duration, started func()) *Process {
	t.Helper()
	p := &Process{Cmd: cmd, done: make(chan struct{})}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if started != nil {
		started()
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		once := sync.Once{}
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			if p.logs.Len() < logCap {
				p.logs.WriteString(line + "\n")
			}
			p.mu.Unlock()
			if strings.Contains(line, readyLine) {
				once.Do(func() { close(ready) })
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		p.err = cmd.Wait()
		close(p.done)
	}()
	select {
	case <-ready:
	case <-p.done:
		t.Fatalf("daemon exited before serving: %v\n%s", p.err, p.Logs())
	case <-time.After(limit):
		t.Fatalf("daemon did not serve within %v\n%s", limit, p.Logs())
	}
	return p
}

// Logs returns what the daemon wrote to stderr so far.
func (p *Process) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// Done is closed once the daemon has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is how the daemon exited; meaningful once Done is closed.
func (p *Process) Err() error {
	<-p.done
	return p.err
}

// Running reports whether the daemon has not exited yet.
func (p *Process) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Dial connects to the daemon on socket within 10 s; the connection closes
// when the test ends.
func Dial(t testing.TB, socket string) *ipc.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := ipc.Dial(ctx, socket)
	if err != nil {
		t.Fatalf("connecting to the daemon on %s: %v", socket, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// EndSandboxes destroys every sandbox of a stopped daemon's state
// directory (offline `gc --all`), kept ones included, whose inits and
// durable processes outlive the daemon: a test leaves nothing running.
func EndSandboxes(t testing.TB, bin, socket, stateDir string) {
	t.Helper()
	cmd := exec.Command(bin, "gc", "--all", "--config", "/dev/null", "--socket", socket, "--state-dir", stateDir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Logf("gc --all after the test: %v\n%s", err, out)
	}
}

// CLI runs bin (the daemon's binary) with args as a client of the daemon
// on socket, and returns what it printed and its exit code.
func CLI(t testing.TB, bin, socket string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "SANDBOX_SIDECAR_SOCKET="+socket)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		t.Fatalf("running %v: %v", args, err)
	}
	return o.String(), e.String(), code
}
