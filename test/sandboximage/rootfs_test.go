package sandboximage

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/test/internal/debroot"
)

// The numpy image: a minimal Debian bookworm with python3, numpy, pandas
// and matplotlib (what the code contexts' tests render: DataFrames and
// figures), debootstrapped once and cached as a tarball under cacheDir,
// as test/packaging caches its rootfs.
const (
	suite   = "bookworm"
	variant = "minbase"
	// debootstrapTimeout bounds building the rootfs cold.
	debootstrapTimeout = 15 * time.Minute
	// rootfsFormat changes when what is done after debootstrap changes.
	rootfsFormat = "1"
)

var numpyPackages = []string{"python3", "python3-numpy"}

// numpyAptPackages are installed with apt-get after debootstrap:
// matplotlib's fonttools needs python3-scipy or python3-munkres, and
// debootstrap would take scipy, with a compiler and a gigabyte of headers
// (pythran's); apt takes munkres, named first.
var numpyAptPackages = []string{"python3-munkres", "python3-pandas", "python3-matplotlib"}

// numpyRootfs returns the cached rootfs tarball of the numpy image,
// debootstrapping it when there is none; concurrent runs wait on a lock.
func numpyRootfs(t *testing.T) string {
	t.Helper()
	return debroot.Root{Prefix: "sandbox-image-numpy", Format: rootfsFormat, Suite: suite, Variant: variant, Packages: numpyPackages, AptPackages: numpyAptPackages,
		Timeout: debootstrapTimeout,
		// What an image does not need: apt's lists and caches.
		Tidy: func(root string) error {
			for _, d := range []string{"var/cache/apt/archives", "var/lib/apt/lists"} {
				_ = os.RemoveAll(filepath.Join(root, d))
			}
			return nil
		},
	}.Tarball(t)
}
