package bwrap

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc/inittest"
)

// busyboxRoot makes a guest root holding nothing of the host's: a static
// busybox (Debian's busybox-static) as /bin/busybox and its applets, the
// mount points bwrap binds onto, and no /lib, /lib64 or /usr, so no
// loader and no C library.
func busyboxRoot(t *testing.T) string {
	t.Helper()
	src := "/bin/busybox"
	f, err := os.Open(src)
	if err != nil {
		skipOrFail(t, "busybox-static is not installed (%v): apt-get install busybox-static", err)
	}
	defer f.Close()
	root := filepath.Join(t.TempDir(), "root")
	for p := filepath.Dir(root); p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"bin", "etc", "proc", "dev", "workspace", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"etc/passwd", "etc/group", "etc/hosts"} {
		if err := os.WriteFile(filepath.Join(root, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The mount points of the host files every sandbox gets where the
	// host has them (etcFiles): bubblewrap cannot make them in this root,
	// which the sandbox's uid may not write. Which of them the host has
	// (a matplotlibrc where python3-matplotlib is installed) is the
	// host's business: each gets its kind of mount point.
	for _, f := range etcFiles {
		fi, err := os.Stat(f)
		if err != nil {
			continue
		}
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if fi.IsDir() {
			err = os.MkdirAll(p, 0o755)
		} else {
			err = os.WriteFile(p, nil, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"sh", "true", "echo", "ls", "cat", "sleep", "test"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// The static init runs in a sandbox whose root has no /lib, /lib64 or /usr
// at all: it needs nothing of the host. A command string runs under that
// root's own /bin/sh (busybox), an argv is found in PATH, and the budget
// holds, all without GNU timeout (which that root does not have).
func TestBwrapStaticInitRunsWithoutTheHostsLibraries(t *testing.T) {
	static := inittest.Init(t, "exe")
	for _, mode := range allModes {
		t.Run(mode.name, func(t *testing.T) {
			b := newTestBackend(t, mode, func(c *Config) { c.InitPath = static })
			if !b.StaticInit() {
				t.Fatalf("StaticInit is false for %s, built CGO_ENABLED=0 -buildmode=exe", static)
			}
			b.testRoot = busyboxRoot(t)
			id := create(t, b, backend.Spec{})
			out := runOK(t, b, id, `cat /proc/1/comm; for d in /lib /lib64 /usr /usr/bin/timeout; do test -e $d && echo "$d exists"; done; ls /bin | tr '\n' ' '; echo; echo hi > /workspace/f; cat /workspace/f`)
			if out != "sandbox-init\nbusybox cat echo ls sh sleep test true \nhi\n" {
				t.Errorf("in the busybox root: %q", out)
			}
			res, err := b.Exec(context.Background(), id, backend.ExecRequest{Argv: []string{"true"}, Timeout: 10 * time.Second})
			if err != nil || res.ExitCode != 0 {
				t.Errorf("argv [true] through PATH: %+v, %v", res, err)
			}
			res, err = b.Exec(context.Background(), id, backend.ExecRequest{Argv: []string{"no-such-program"}, Timeout: 10 * time.Second})
			if err != nil || res.ExitCode != 127 || !strings.Contains(string(res.Stderr), "no-such-program") {
				t.Errorf("argv [no-such-program]: exit %d stderr %q, %v; want 127 and the name", res.ExitCode, res.Stderr, err)
			}
			res, err = b.Exec(context.Background(), id, backend.ExecRequest{Command: "trap '' TERM; echo started; sleep 60", Timeout: 2 * time.Second}) // the trap is set well before
			if err != nil || !res.TimedOut || res.ExitCode != backend.ExitKilled || string(res.Stdout) != "started\n" {
				t.Errorf("a command ignoring SIGTERM past its budget: %+v, %v; want timed out, exit 137", res, err)
			}
		})
	}
}

// The same root with an init linked against the host's loader (a PIE)
// cannot start, and says so: the test above proves the static init, not a
// root that happens to hold the host's libraries.
func TestBwrapDynamicInitCannotStartWithoutTheHostsLibraries(t *testing.T) {
	dynamic := inittest.Init(t, "pie")
	b := newTestBackend(t, rangeUID, func(c *Config) { c.InitPath = dynamic })
	if b.StaticInit() {
		t.Fatalf("StaticInit is true for %s, a PIE", dynamic)
	}
	b.testRoot = busyboxRoot(t)
	id := create(t, b, backend.Spec{})
	_, err := b.Exec(context.Background(), id, backend.ExecRequest{Command: "true", Timeout: 10 * time.Second})
	t.Logf("the error: %v", err)
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "No such file or directory") {
		t.Errorf("a dynamic init in a root without its loader: %v; want ErrUnavailable saying the loader is missing", err)
	}
}
