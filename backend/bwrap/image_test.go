package bwrap

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

func TestImageRootOptions(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"usr/bin", "etc/ssl", "proc", "dev", "workspace", "tmp", "sys", "opt"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"etc/passwd", "etc/group", "etc/hosts", "etc/shadow", "etc/gshadow", "etc/os-release", "init.txt"} {
		if err := os.WriteFile(filepath.Join(root, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for l, target := range map[string]string{"bin": "usr/bin", "etc/localtime": "/usr/share/zoneinfo/Etc/UTC"} {
		if err := os.Symlink(target, filepath.Join(root, l)); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts, err := imageRootOptions(root, backend.ImageEtcLeftOut)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(opts, " ")
	want := strings.Join([]string{
		"--symlink usr/bin /bin",
		"--ro-bind " + root + "/init.txt /init.txt",
		"--ro-bind " + root + "/opt /opt",
		"--ro-bind " + root + "/usr /usr",
		"--perms 0755 --dir /etc",
		// An absolute symlink is made again as itself: bwrap never
		// follows it on the host.
		"--symlink /usr/share/zoneinfo/Etc/UTC /etc/localtime",
		"--ro-bind " + root + "/etc/os-release /etc/os-release",
		"--ro-bind " + root + "/etc/ssl /etc/ssl",
	}, " ")
	if got != want {
		t.Fatalf("options:\n got %s\nwant %s", got, want)
	}
}

func TestImageSandboxNeedsAStaticInit(t *testing.T) {
	b := newTestBackend(t, daemonUID)
	b.static = false // as the dynamically linked test binary is under -race
	root := t.TempDir()
	_, err := b.Create(context.Background(), "sb-img", backend.Spec{Image: backend.Image{Name: "numpy", Root: root}})
	if !errors.Is(err, backend.ErrSpecUnenforceable) || !strings.Contains(err.Error(), "dynamically linked") {
		t.Fatalf("create on an image with a dynamic init: %v, want spec_unenforceable naming the cause", err)
	}
	if ids, _ := b.List(context.Background()); slices.Contains(ids, "sb-img") {
		t.Fatal("a refused create left a sandbox")
	}
}

// With an egress allow-list the sandbox's resolv.conf is the daemon's
// resolver: the image's is left out, whatever it is (a symlink, often).
func TestImageRootLeavesResolvConfToEgress(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../run/systemd/resolve/stub-resolv.conf", filepath.Join(root, "etc/resolv.conf")); err != nil {
		t.Fatal(err)
	}
	for network, want := range map[string]bool{networkNone: true, networkAllowlist: false} {
		sb := &sandbox{id: "sb", network: network, image: &imageSpec{Name: "x", Root: root}}
		if err := sb.readImageRoot(); err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(sb.imageOpts, "/etc/resolv.conf"); got != want {
			t.Errorf("network %s: the image's resolv.conf bound %v, want %v (%q)", network, got, want, sb.imageOpts)
		}
	}
}

// An image root the sandboxes' uid cannot reach is refused with the path
// to fix, not a bwrap that dies before it can be placed in its cgroup.
func TestImageRootOutOfTheSandboxUIDsReach(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	b.static = true
	base := t.TempDir()
	if err := os.Chmod(base, 0o700); err != nil { // the range's uids cannot search it
		t.Fatal(err)
	}
	root := filepath.Join(base, "rootfs")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := b.Create(context.Background(), "sb-unreachable", backend.Spec{Image: backend.Image{Name: "numpy", Root: root}})
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), base) {
		t.Fatalf("an unreachable image root: %v, want backend_unavailable naming %s", err, base)
	}
}
