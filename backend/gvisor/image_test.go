package gvisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc/inittest"
)

// busyboxRoot is an image root of busybox-static alone (and, with shell,
// its sh), with an /etc of its own.
func busyboxRoot(t *testing.T, shell bool) string {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		skipOrFail(t, "needs busybox-static (/bin/busybox): %v", err)
	}
	root := t.TempDir()
	for _, d := range []string{"bin", "etc"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), bb, 0o755); err != nil {
		t.Fatal(err)
	}
	if shell {
		if err := os.Symlink("busybox", filepath.Join(root, "bin/sh")); err != nil {
			t.Fatal(err)
		}
	}
	for f, data := range map[string]string{"etc/passwd": "image:x:0:0::/:/bin/sh\n", "etc/image-marker": "image\n", "etc/shadow": "image:secret:1::::::\n"} {
		if err := os.WriteFile(filepath.Join(root, f), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/proc/mounts", filepath.Join(root, "etc/mtab")); err != nil {
		t.Fatal(err)
	}
	// As the store writes a root, whatever the test's umask.
	for p, mode := range map[string]os.FileMode{"": 0o755, "bin": 0o755, "etc": 0o755, "bin/busybox": 0o755, "etc/passwd": 0o644, "etc/image-marker": 0o644, "etc/shadow": 0o444} {
		if err := os.Chmod(filepath.Join(root, p), mode); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// A gVisor sandbox on an image: the image's entries as its root, its /etc
// but the daemon's passwd, group and hosts, nothing of the host's /usr.
func TestGVisorImage(t *testing.T) {
	b := newTestBackend(t, func(c *Config) { c.InitPath = inittest.Init(t, "exe") })
	img := backend.Image{Name: "busybox", Digest: "sha256:" + strings.Repeat("ab", 32), Root: busyboxRoot(t, true), Env: []string{"PATH=/bin", "FROM_IMAGE=yes"}}

	// A dynamically linked init is refused, with the reason.
	b.static = false
	if _, err := b.Create(context.Background(), "sb-dyn", backend.Spec{Image: img}); !errors.Is(err, backend.ErrSpecUnenforceable) || !strings.Contains(err.Error(), "dynamically linked") {
		t.Fatalf("an image with a dynamic init: %v", err)
	}
	b.static = true
	// As the packaged unit runs it (UMask=0077): the image's mount-point
	// root must still let the guest in.
	old := syscall.Umask(0o077)
	t.Cleanup(func() { syscall.Umask(old) })

	id := "sb-image"
	if _, err := b.Create(context.Background(), id, backend.Spec{Image: img}); err != nil {
		t.Fatal(err)
	}
	run := func(req backend.ExecRequest) backend.ExecResult {
		t.Helper()
		req.Timeout = time.Minute
		res, err := b.Exec(context.Background(), id, req)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := run(backend.ExecRequest{Argv: []string{"/bin/busybox", "cat", "/etc/passwd", "/etc/image-marker"}})
	if res.ExitCode != 0 || !strings.Contains(string(res.Stdout), "sandbox:x:1000:1000") || !strings.Contains(string(res.Stdout), "image\n") || strings.Contains(string(res.Stdout), "image:x:0") {
		t.Fatalf("the daemon's /etc/passwd and the image's other /etc: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	res = run(backend.ExecRequest{Command: `echo "$PATH $FROM_IMAGE $(pwd)"; ls /usr /lib /etc/ld.so.cache /etc/shadow 2>&1`})
	out := string(res.Stdout)
	if !strings.HasPrefix(out, "/bin yes /workspace\n") || strings.Count(out, "No such file or directory") != 4 {
		t.Fatalf("env, workdir and nothing of the host: %q (stderr %q)", out, res.Stderr)
	}
	if res := run(backend.ExecRequest{Argv: []string{"/bin/busybox", "touch", "/bin/x"}}); res.ExitCode == 0 {
		t.Fatal("the image's root is writable")
	}

	// Without /bin/sh a command string is no_shell; argv still runs.
	nosh := img
	nosh.Name, nosh.Root = "nosh", busyboxRoot(t, false)
	nosh.Digest = "sha256:" + strings.Repeat("cd", 32)
	if _, err := b.Create(context.Background(), "sb-nosh", backend.Spec{Image: nosh}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Exec(context.Background(), "sb-nosh", backend.ExecRequest{Command: "true", Timeout: time.Minute}); !errors.Is(err, backend.ErrNoShell) {
		t.Fatalf("a command string without a shell: %v", err)
	}
	if res, err := b.Exec(context.Background(), "sb-nosh", backend.ExecRequest{Argv: []string{"/bin/busybox", "true"}, Timeout: time.Minute}); err != nil || res.ExitCode != 0 {
		t.Fatalf("argv without a shell: %+v %v", res, err)
	}
}
