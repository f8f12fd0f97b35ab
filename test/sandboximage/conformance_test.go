package sandboximage

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/backendtest"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc/inittest"
	"github.com/sandbox-sidecar/sandbox-sidecar/internal/runscpin"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/image"
)

// bwrapOnImage and gvisorOnImage create every sandbox on img unless the
// spec names another (the backend embedded, so its optional capabilities
// stay visible); dir is its state directory, for a restarted instance.
type bwrapOnImage struct {
	*bwrap.Backend
	img backend.Image
	dir string
}

func (o bwrapOnImage) Create(ctx context.Context, id string, spec backend.Spec) (backend.Info, error) {
	return o.Backend.Create(ctx, id, onImage(spec, o.img))
}

type gvisorOnImage struct {
	*gvisor.Backend
	img backend.Image
	dir string
}

func (o gvisorOnImage) Create(ctx context.Context, id string, spec backend.Spec) (backend.Info, error) {
	return o.Backend.Create(ctx, id, onImage(spec, o.img))
}

func onImage(spec backend.Spec, img backend.Image) backend.Spec {
	if spec.Image.IsHost() {
		spec.Image = img
	}
	return spec
}

// importedNumpy imports the numpy rootfs into a store of its own, as the
// daemon does, and returns the image as a backend is told it.
func importedNumpy(t *testing.T) backend.Image {
	t.Helper()
	st, err := image.Open(filepath.Join(t.TempDir(), "images"), image.Limits{}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(numpyRootfs(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	in, err := st.ImportArchive(context.Background(), f, "numpy")
	if err != nil {
		t.Fatal(err)
	}
	return backend.Image{Name: in.Name, Digest: in.Digest, Root: in.Root, Env: in.Env}
}

// runscPath is the runsc the gvisor tests use.
func runscPath(t *testing.T) string {
	for _, p := range []string{os.Getenv("SANDBOX_SIDECAR_RUNSC"), runscpin.Path} {
		if p != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("needs runsc (scripts/install-runsc.sh), and CI=true forbids skipping")
	}
	t.Skip("needs runsc (scripts/install-runsc.sh)")
	return ""
}

// codePreload is what the image's code contexts preload.
var codePreload = []string{"numpy", "pandas"}

// TestConformanceOnAnImportedImage runs the shared backend suite with every
// sandbox on an imported image (the numpy image, through the store), on
// both backends that run one: what the daemon relies on holds on the
// image's root as on the host's.
func TestConformanceOnAnImportedImage(t *testing.T) {
	requireSlow(t)
	img := importedNumpy(t)
	initPath := inittest.Init(t, "exe")
	const grace = 500 * time.Millisecond
	opts := backendtest.Options{Workdir: "/workspace", RealIsolation: true, GuestView: true, AcceptBlockNetwork: true,
		KillGrace: grace, KillsEscapeesAtTimeout: true}

	t.Run("bwrap", func(t *testing.T) {
		open := func(t *testing.T, dir string) backend.Backend {
			b, err := bwrap.New(bwrap.Config{Dir: dir, InitPath: initPath, SandboxUID: -1, SandboxGID: -1, KillGrace: grace,
				Code: bwrap.CodeConfig{Preload: codePreload}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close(); bwrap.KillSandboxes(dir) })
			return bwrapOnImage{b, img, dir}
		}
		o := opts
		// The image has numpy, pandas and matplotlib: the code contexts'
		// tests that render DataFrames and figures, and check the
		// preloads, must pass here.
		o.Code, o.CodeLibraries, o.CodePreload = true, true, codePreload
		o.Reopen = func(t *testing.T, b backend.Backend) backend.Backend { return open(t, b.(bwrapOnImage).dir) }
		backendtest.Run(t, func(t *testing.T) backend.Backend { return open(t, filepath.Join(t.TempDir(), "bwrap")) }, o)
	})
	t.Run("gvisor", func(t *testing.T) {
		runsc := runscPath(t)
		open := func(t *testing.T, dir string) backend.Backend {
			b, err := gvisor.New(gvisor.Config{Dir: dir, RunscPath: runsc, InitPath: initPath, KillGrace: grace,
				Code: backend.CodeConfig{Preload: codePreload}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ids, _ := b.List(context.Background())
				for _, id := range ids {
					_ = b.Destroy(context.Background(), id)
				}
				_ = b.Close()
			})
			return gvisorOnImage{b, img, dir}
		}
		o := opts
		// The code contexts' contract on the image, as on bwrap; and
		// pause, which gVisor does on any image (a checkpoint of the
		// sandbox as it runs), with the durable processes it needs.
		o.Code, o.CodeLibraries, o.CodePreload = true, true, codePreload
		o.Pause, o.Processes = true, true
		o.Reopen = func(t *testing.T, b backend.Backend) backend.Backend {
			// A restart: the backend before lets go of its sandboxes
			// (whose inits the next re-attaches to) before the next starts.
			_ = b.(gvisorOnImage).Close()
			return open(t, b.(gvisorOnImage).dir)
		}
		backendtest.Run(t, func(t *testing.T) backend.Backend { return open(t, filepath.Join(t.TempDir(), "gvisor")) }, o)
	})
}
