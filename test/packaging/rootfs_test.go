package packaging

import (
	"context"
	"os"
	"path/filepath"
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
	return debroot.Root{Prefix: "rootfs", Format: imageFormat, Suite: suite, Variant: variant, Packages: includePackages,
		Timeout: debootstrapTimeout, TarArgs: []string{"--xattrs"},
		// An empty machine-id: systemd makes one at each boot of a copy.
		Tidy: func(root string) error { return os.WriteFile(filepath.Join(root, "etc/machine-id"), nil, 0o444) },
	}.Tarball(t)
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
