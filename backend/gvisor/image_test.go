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

// The mount-point roots of images go when the lifecycle says their image
// left the store (PruneImages), never while a sandbox of this backend runs
// on one (loaded, or only on disk after a restart) or a create is making
// it, and never with anything mounted below; a new sandbox of a pruned
// image makes it again.
func TestGVisorPruneImages(t *testing.T) {
	b := newTestBackend(t, func(c *Config) { c.InitPath = inittest.Init(t, "exe") })
	digestA, digestB := "sha256:"+strings.Repeat("ab", 32), "sha256:"+strings.Repeat("cd", 32)
	imgA := backend.Image{Name: "a", Digest: digestA, Root: busyboxRoot(t, true), Env: []string{"PATH=/bin"}}
	imgB := backend.Image{Name: "b", Digest: digestB, Root: busyboxRoot(t, true), Env: []string{"PATH=/bin"}}
	rootOf := func(digest string) string {
		name, ok := imageRootfsName(digest)
		if !ok {
			t.Fatalf("no root name for %s", digest)
		}
		return filepath.Join(b.cfg.Dir, name)
	}
	exists := func(p string) bool { _, err := os.Lstat(p); return err == nil }
	prune := func(b *Backend, keep ...string) int {
		t.Helper()
		n, err := b.PruneImages(keep)
		if err != nil {
			t.Fatalf("PruneImages(%v): %v", keep, err)
		}
		return n
	}
	for id, img := range map[string]backend.Image{"sb-a": imgA, "sb-b": imgB} {
		if _, err := b.Create(context.Background(), id, backend.Spec{Image: img}); err != nil {
			t.Fatal(err)
		}
	}
	// What a daemon left: the root of an image removed since, and a root
	// whose making it did not finish.
	stale := rootOf("sha256:" + strings.Repeat("ef", 32))
	for _, d := range []string{stale, rootOf("sha256:"+strings.Repeat("12", 32)) + ".new"} {
		if err := os.MkdirAll(filepath.Join(d, "bin"), 0o755); err != nil {
			t.Fatal(err)
		}
	}

	// A is out of the store, but sb-a runs on it; B is kept by the store.
	if n := prune(b, digestB); n != 1 {
		t.Fatalf("removed %d roots, want 1 (the stale one)", n)
	}
	if !exists(rootOf(digestA)) || !exists(rootOf(digestB)) || exists(stale) || exists(rootOf("sha256:"+strings.Repeat("12", 32))+".new") {
		t.Fatal("pruning kept the wrong roots")
	}
	if !exists(filepath.Join(b.cfg.Dir, rootfsName)) {
		t.Fatal("pruning removed the host image's root")
	}
	for _, id := range []string{"sb-a", "sb-b"} {
		if res, err := b.Exec(context.Background(), id, backend.ExecRequest{Argv: []string{"/bin/busybox", "true"}, Timeout: time.Minute}); err != nil || res.ExitCode != 0 {
			t.Fatalf("%s after a prune: %+v %v", id, res, err)
		}
	}

	// The next daemon, before it has loaded any sandbox: their settings
	// on disk keep their roots.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b2, err := New(b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n := prune(b2); n != 0 || !exists(rootOf(digestA)) || !exists(rootOf(digestB)) {
		t.Fatalf("a restarted backend pruned %d roots of its sandboxes' images", n)
	}

	// Destroyed, sb-a no longer holds A.
	if err := b2.Destroy(context.Background(), "sb-a"); err != nil {
		t.Fatal(err)
	}
	if n := prune(b2, digestB); n != 1 || exists(rootOf(digestA)) || !exists(rootOf(digestB)) {
		t.Fatalf("after sb-a's destroy: removed %d, A there %v", n, exists(rootOf(digestA)))
	}
	if res, err := b2.Exec(context.Background(), "sb-b", backend.ExecRequest{Argv: []string{"/bin/busybox", "true"}, Timeout: time.Minute}); err != nil || res.ExitCode != 0 {
		t.Fatalf("sb-b after A's prune: %+v %v", res, err)
	}

	// A create holds its root until its sandbox's settings are on disk.
	release, err := b2.holdImageRootfs(&imageSpec{Name: "a", Digest: digestA, Root: imgA.Root})
	if err != nil {
		t.Fatal(err)
	}
	if n := prune(b2, digestB); n != 0 || !exists(rootOf(digestA)) {
		t.Fatal("pruned a root a create holds")
	}
	release()

	// A mount below a root keeps it (RemoveAll would delete what it shows).
	if err := syscall.Mount("tmpfs", filepath.Join(rootOf(digestA), "bin"), "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(filepath.Join(rootOf(digestA), "bin"), syscall.MNT_DETACH) })
	if n, err := b2.PruneImages([]string{digestB}); n != 0 || err == nil || !strings.Contains(err.Error(), "mounted below it") || !exists(rootOf(digestA)) {
		t.Fatalf("a root with a mount below it: removed %d, %v", n, err)
	}
	if err := syscall.Unmount(filepath.Join(rootOf(digestA), "bin"), 0); err != nil {
		t.Fatal(err)
	}
	if n := prune(b2, digestB); n != 1 || exists(rootOf(digestA)) {
		t.Fatal("the unmounted root was not pruned")
	}

	// A's image back in the store: a new sandbox on it makes its root again.
	if _, err := b2.Create(context.Background(), "sb-a2", backend.Spec{Image: imgA}); err != nil {
		t.Fatal(err)
	}
	if res, err := b2.Exec(context.Background(), "sb-a2", backend.ExecRequest{Argv: []string{"/bin/busybox", "true"}, Timeout: time.Minute}); err != nil || res.ExitCode != 0 || !exists(rootOf(digestA)) {
		t.Fatalf("a sandbox of a pruned image: %+v %v", res, err)
	}
	for _, id := range []string{"sb-b", "sb-a2"} {
		_ = b2.Destroy(context.Background(), id)
	}
	_ = b2.Close()
}
