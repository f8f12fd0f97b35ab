package statedir

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

func TestSandboxIDs(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"sb-b", "sb-a", ".probe-1", "Not Valid"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// A file with a valid id's name is not a sandbox.
	if err := os.WriteFile(filepath.Join(dir, "sb-c"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ids, err := SandboxIDs(dir)
	if want := []string{"sb-a", "sb-b"}; err != nil || !slices.Equal(ids, want) {
		t.Errorf("SandboxIDs = %q, %v; want %q", ids, err, want)
	}
	if _, err := SandboxIDs(filepath.Join(dir, "missing")); !errors.Is(err, backend.ErrUnavailable) {
		t.Errorf("a missing state directory: err = %v, want ErrUnavailable", err)
	}
}
