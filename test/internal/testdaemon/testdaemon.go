// Package testdaemon is what the tests that run the real daemon share:
// building its binary once per test binary, and deciding whether this host
// can run them at all.
package testdaemon

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// BinEnv names a daemon built elsewhere (a release binary, another
// revision) to test instead of building one.
const BinEnv = "SANDBOX_SIDECAR_BIN"

// Main is a TestMain: it builds the daemon into a directory every uid may
// search and run from (tests run it as other uids too), stores its path in
// *bin, runs the tests and removes the build.
func Main(m *testing.M, bin *string) {
	dir, err := os.MkdirTemp("", "sidecar-test-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_ = os.Chmod(dir, 0o755)
	*bin = filepath.Join(dir, "sandbox-sidecar")
	if prebuilt := os.Getenv(BinEnv); prebuilt != "" {
		*bin = prebuilt
	} else {
		build := exec.Command("go", "build", "-o", *bin, "github.com/sandbox-sidecar/sandbox-sidecar/cmd/sandbox-sidecar")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building the daemon:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// RequireHost skips the test, or fails it under CI=true, unless the host
// can run the daemon's sandboxes for real: root, bubblewrap, and the files
// given (programs the test runs inside sandboxes, e.g. /usr/bin/python3).
func RequireHost(t testing.TB, files ...string) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	if _, err := exec.LookPath("bwrap"); err != nil {
		missing = append(missing, "bubblewrap (apt-get install bubblewrap)")
	}
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, f)
		}
	}
	if len(missing) == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("this test needs %s, and CI=true forbids skipping", strings.Join(missing, " and "))
	}
	t.Skipf("needs %s", strings.Join(missing, " and "))
}
