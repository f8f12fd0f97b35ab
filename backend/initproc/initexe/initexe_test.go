package initexe

import (
	"os"
	"testing"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc/inittest"
)

func TestStatic(t *testing.T) {
	check := func(path string, want bool) {
		t.Helper()
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		got, err := Static(f)
		if err != nil || got != want {
			t.Errorf("Static(%s) = %v, %v; want %v", path, got, err, want)
		}
	}
	// The init built as the package builds it, and as a PIE (which links
	// the loader even without cgo).
	check(inittest.Init(t, "exe"), true)
	check(inittest.Init(t, "pie"), false)
	// Debian's own: a dynamically linked program, and busybox-static.
	check("/bin/true", false)
	if _, err := os.Stat("/bin/busybox"); err == nil {
		check("/bin/busybox", true)
	} else if os.Getenv("CI") == "true" {
		t.Errorf("/bin/busybox (busybox-static) is not installed: %v", err)
	}
	notELF, err := os.Open("initexe.go")
	if err != nil {
		t.Fatal(err)
	}
	defer notELF.Close()
	if _, err := Static(notELF); err == nil {
		t.Error("Static of a Go source file succeeded")
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	inittest.Remove()
	os.Exit(code)
}
