// Package inittest builds, for tests, the sandboxes' init
// (cmd/sandbox-sidecar-init) as a static executable, to run where the test
// binary itself cannot: under -race (cgo) a test binary is dynamically linked and needs
// the host's loader and C library, which a sandbox whose root is not the
// host's does not have. It is imported by tests only.
package inittest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// buildTimeout bounds one go build of the init (a cold build cache on a
// loaded 2-core machine takes about a minute).
const buildTimeout = 5 * time.Minute

var builds struct {
	sync.Mutex
	dir  string
	done map[string]string // buildmode → path
}

// Init returns the path of ./cmd/sandbox-sidecar-init built with
// CGO_ENABLED=0 and the given -buildmode ("exe": static, as the package
// builds it; "pie": linked against the loader), once per test process and
// build mode. It fails the test when the build fails: the module's own
// source must build.
func Init(t testing.TB, buildmode string) string {
	t.Helper()
	builds.Lock()
	defer builds.Unlock()
	if p, ok := builds.done[buildmode]; ok {
		return p
	}
	if builds.dir == "" {
		// Outside t.TempDir: the binary is shared by the tests of the
		// process. Mode 0755 so a sandbox's uid may execute it.
		dir, err := os.MkdirTemp("", "sandbox-sidecar-init-")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		builds.dir, builds.done = dir, map[string]string{}
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(builds.dir, "sandbox-sidecar-init-"+buildmode)
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		gobin = "go"
	}
	cmd := exec.Command(gobin, "build", "-trimpath", "-buildmode="+buildmode, "-o", out, "./cmd/sandbox-sidecar-init")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.WaitDelay = time.Second
	timer := time.AfterFunc(buildTimeout, func() {
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
		}
	})
	b, err := cmd.CombinedOutput()
	timer.Stop()
	if err != nil {
		t.Fatalf("go build -buildmode=%s ./cmd/sandbox-sidecar-init: %v\n%s", buildmode, err, b)
	}
	if err := os.Chmod(out, 0o755); err != nil {
		t.Fatal(err)
	}
	builds.done[buildmode] = out
	return out
}

// moduleRoot is the directory holding go.mod, from the test's working
// directory (its package's) up.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/sandbox-sidecar/sandbox-sidecar\n") {
			return d, nil
		}
		if d == "/" {
			return "", os.ErrNotExist
		}
	}
}

// Remove deletes what Daemon built; a TestMain calls it after m.Run.
func Remove() {
	builds.Lock()
	defer builds.Unlock()
	if builds.dir != "" {
		_ = os.RemoveAll(builds.dir)
		builds.dir, builds.done = "", nil
	}
}
