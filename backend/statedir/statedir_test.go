package statedir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

const helperEnv = "STATEDIR_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "remove-all":
		if err := os.RemoveAll(os.Getenv("STATEDIR_TEST_DIR")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "remove-all-force":
		if err := RemoveAll(os.Getenv("STATEDIR_TEST_DIR")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	os.Exit(0)
}

func TestWriteJSON(t *testing.T) {
	p := filepath.Join(t.TempDir(), "spec.json")
	if err := WriteJSON(p, map[string]int{"version": 1}); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSON(p, map[string]int{"version": 2}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(p)
	if err != nil || string(got) != `{"version":2}` {
		t.Errorf("after two writes: %q, %v", got, err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode: %v %v", fi, err)
	}
	if _, err := os.Stat(p + ".tmp"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the temporary file is left: %v", err)
	}
	if err := WriteJSON(p, func() {}); err == nil {
		t.Error("a value JSON cannot hold was written")
	}
	if got, _ := os.ReadFile(p); string(got) != `{"version":2}` {
		t.Errorf("a failed write changed the file: %q", got)
	}
}

// TestRemoveAllUnprivileged runs as uid 65534 what a non-root daemon
// faces: a tree it owns but cannot enter or modify.
func TestRemoveAllUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("switching to uid 65534 needs root, and CI=true forbids skipping")
		}
		t.Skip("switching to uid 65534 needs root")
	}
	parent := t.TempDir()
	if err := os.Chmod(filepath.Dir(parent), 0o711); err != nil {
		t.Fatal(err)
	}
	build := func() string {
		base := filepath.Join(parent, "tree")
		for _, d := range []string{"a/b/c", "ro"} {
			if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for _, f := range []string{"a/b/c/f", "ro/f"} {
			if err := os.WriteFile(filepath.Join(base, f), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		_ = filepath.WalkDir(parent, func(p string, _ fs.DirEntry, _ error) error { return os.Lchown(p, 65534, 65534) })
		for p, mode := range map[string]os.FileMode{"a/b": 0, "a/b/c": 0, "ro": 0o500} {
			if err := os.Chmod(filepath.Join(base, p), mode); err != nil {
				t.Fatal(err)
			}
		}
		return base
	}
	// The test binary sits in a 0700 build directory; uid 65534 needs a copy
	// it can execute.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(filepath.Dir(parent), "helper.test")
	if data, err := os.ReadFile(self); err != nil || os.WriteFile(bin, data, 0o755) != nil {
		t.Fatalf("copy the test binary: %v", err)
	}
	helper := func(mode, dir string) error {
		cmd := exec.Command(bin)
		cmd.Env = []string{helperEnv + "=" + mode, "STATEDIR_TEST_DIR=" + dir}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
		out, err := cmd.CombinedOutput()
		var exitErr *exec.ExitError
		if err != nil && !errors.As(err, &exitErr) {
			t.Fatalf("the helper did not run: %v", err)
		}
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	base := build()
	if err := helper("remove-all", base); err == nil {
		t.Fatal("plain os.RemoveAll removed the tree, so this test proves nothing")
	} else {
		t.Logf("as expected, plain os.RemoveAll fails: %v", err)
	}
	if err := helper("remove-all-force", base); err != nil {
		t.Fatalf("RemoveAll as uid 65534: %v", err)
	}
	if _, err := os.Lstat(base); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the tree is still there: %v", err)
	}
}

func TestReadSettingsRefusesWhatIsNotOurs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sc-1")
	var v map[string]int
	if err := ReadSettings(dir, "spec.json", "sc-1", 64, &v); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("no directory: %v", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{"": "", "too large": `{"a":` + strings.Repeat(" ", 100) + `1}`, "garbage": "\x00{"} {
		if content != "" {
			if err := os.WriteFile(filepath.Join(dir, "spec.json"), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := ReadSettings(dir, "spec.json", "sc-1", 64, &v); !errors.Is(err, backend.ErrNotFound) || !strings.Contains(err.Error(), "create a new one") {
			t.Errorf("%q: %v, want ErrNotFound saying what to do", name, err)
		}
	}
	if err := WriteJSON(filepath.Join(dir, "spec.json"), map[string]int{"a": 1}); err != nil {
		t.Fatal(err)
	}
	if err := ReadSettings(dir, "spec.json", "sc-1", 64, &v); err != nil || v["a"] != 1 {
		t.Errorf("round trip: %v %v", v, err)
	}
}
