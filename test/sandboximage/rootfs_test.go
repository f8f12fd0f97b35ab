package sandboximage

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

// The numpy image: a minimal Debian bookworm with python3 and numpy,
// debootstrapped once and cached as a tarball under cacheDir, as
// test/packaging caches its rootfs.
const (
	suite   = "bookworm"
	variant = "minbase"
	// debootstrapTimeout bounds building the rootfs cold.
	debootstrapTimeout = 15 * time.Minute
	// rootfsFormat changes when what is done after debootstrap changes.
	rootfsFormat = "1"
)

var numpyPackages = []string{"python3", "python3-numpy"}

// numpyRootfs returns the cached rootfs tarball of the numpy image,
// debootstrapping it when there is none; concurrent runs wait on a lock.
func numpyRootfs(t *testing.T) string {
	t.Helper()
	dir := debroot.CacheDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("creating the cache %s: %v", dir, err)
	}
	tarball := filepath.Join(dir, fmt.Sprintf("sandbox-image-numpy-%s-%s.tar", suite, debroot.Key(rootfsFormat, suite, variant, numpyPackages)))
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
		t.Logf("numpy rootfs: cached %s", tarball)
		return tarball
	}
	mirror := debroot.Mirror(suite)
	start := time.Now()
	t.Logf("numpy rootfs: debootstrap %s (%s, +%s) from %s", suite, variant, strings.Join(numpyPackages, ","), mirror)
	root := filepath.Join(t.TempDir(), "root")
	ctx, cancel := context.WithTimeout(context.Background(), debootstrapTimeout)
	defer cancel()
	out, err := debroot.RunHost(ctx, "debootstrap", "--variant="+variant, "--include="+strings.Join(numpyPackages, ","), suite, root, mirror)
	if err != nil {
		t.Fatalf("debootstrap failed (%v); last output:\n%s", err, debroot.Tail(out, 40))
	}
	// What an image does not need: apt's lists and caches.
	for _, d := range []string{"var/cache/apt/archives", "var/lib/apt/lists"} {
		_ = os.RemoveAll(filepath.Join(root, d))
	}
	tmp := tarball + ".tmp"
	if out, err := debroot.RunHost(ctx, "tar", "--numeric-owner", "-C", root, "-cf", tmp, "."); err != nil {
		os.Remove(tmp)
		t.Fatalf("archiving the rootfs: %v\n%s", err, debroot.Tail(out, 20))
	}
	if err := os.Rename(tmp, tarball); err != nil {
		t.Fatal(err)
	}
	t.Logf("numpy rootfs: built in %s", time.Since(start).Round(time.Second))
	return tarball
}
