package capture

import (
	"os"
	"os/exec"
	"testing"
)

// skipOrFail skips the test on a workstation that lacks something the test
// needs, but fails it when CI=true: in CI a missing tool is a broken runner,
// not a reason to pass silently.
func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// requireTools makes sure the programs the process tests drive exist.
func requireTools(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			skipOrFail(t, "this test needs %s: %v", n, err)
		}
	}
}
