package packaging

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/test/internal/debroot"
)

// The container image: a minimal Debian bookworm with systemd as init. The
// packages are what the test needs inside; bubblewrap is there already so
// installing the .deb needs no network and no apt lists.
const (
	suite   = "bookworm"
	variant = "minbase"
	// debootstrapTimeout bounds building the image cold (a few minutes on
	// two cores with a nearby mirror).
	debootstrapTimeout = 12 * time.Minute
	// extractTimeout bounds unpacking the cached image.
	extractTimeout = 2 * time.Minute
	// imageFormat changes when what is done to the image after debootstrap
	// changes, so an old cache is not reused.
	imageFormat = "1"
)

var includePackages = []string{
	"systemd", "systemd-sysv", "dbus", // init, systemctl, the system bus
	"bubblewrap",      // the .deb's dependency
	"procps",          // pgrep, to look for orphans
	"python3-minimal", // what guest code runs; loopback TCP inside a sandbox
	"man-db",          // systemd-analyze verify checks Documentation=man:...
}

// image returns the cached image tarball, building it with debootstrap when
// there is none. Concurrent runs wait for each other on a lock.
func image(t *testing.T) string {
	t.Helper()
	dir := debroot.CacheDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("creating the image cache %s: %v", dir, err)
	}
	tarball := filepath.Join(dir, fmt.Sprintf("rootfs-%s-%s.tar", suite, debroot.Key(imageFormat, suite, variant, includePackages)))
	lock, err := os.OpenFile(tarball+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := debroot.FlockTimeout(lock, debootstrapTimeout); err != nil {
		t.Fatalf("waiting for another run building %s: %v", tarball, err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)

	if _, err := os.Stat(tarball); err == nil {
		t.Logf("image: cached %s", tarball)
		return tarball
	}
	mirror := debroot.Mirror(suite)
	start := time.Now()
	t.Logf("image: debootstrap %s (%s, +%s) from %s: no cached %s", suite, variant, strings.Join(includePackages, ","), mirror, tarball)
	build := t.TempDir()
	root := filepath.Join(build, "root")
	ctx, cancel := context.WithTimeout(context.Background(), debootstrapTimeout)
	defer cancel()
	out, err := debroot.RunHost(ctx, "debootstrap", "--variant="+variant, "--include="+strings.Join(includePackages, ","), suite, root, mirror)
	if err != nil {
		t.Fatalf("debootstrap failed (%v); last output:\n%s", err, debroot.Tail(out, 40))
	}
	// An empty machine-id: systemd makes one at each boot of a copy.
	if err := os.WriteFile(filepath.Join(root, "etc/machine-id"), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	tmp := tarball + ".tmp"
	if out, err := debroot.RunHost(ctx, "tar", "--numeric-owner", "--xattrs", "-C", root, "-cf", tmp, "."); err != nil {
		os.Remove(tmp)
		t.Fatalf("archiving the image: %v\n%s", err, debroot.Tail(out, 20))
	}
	if err := os.Rename(tmp, tarball); err != nil {
		t.Fatal(err)
	}
	t.Logf("image: built in %s", time.Since(start).Round(time.Second))
	return tarball
}

// unpack extracts the image into a fresh directory.
func unpack(t *testing.T, tarball string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), extractTimeout)
	defer cancel()
	if out, err := debroot.RunHost(ctx, "tar", "--numeric-owner", "--xattrs", "-C", root, "-xf", tarball); err != nil {
		t.Fatalf("unpacking %s: %v\n%s", tarball, err, debroot.Tail(out, 20))
	}
	return root
}
