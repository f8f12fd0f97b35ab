package gvisor

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// TestRootfsModesIgnoreUmask makes the shared root under the packaged
// unit's UMask=0077: the guest (uid 1000) must still be able to enter its
// / and read /etc/passwd. Before exactModes every directory came out 0700
// and every file 0600, and in the packaging test's container every command
// failed with "cannot run /bin/true in /workspace: permission denied".
func TestRootfsModesIgnoreUmask(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), rootfsName)
	if err := makeRootfs(dir, "/"); err != nil {
		t.Fatal(err)
	}
	want := map[string]fs.FileMode{
		".":                   0o755 | fs.ModeDir,
		"etc":                 0o755 | fs.ModeDir,
		"usr":                 0o755 | fs.ModeDir,
		"workspace":           0o755 | fs.ModeDir,
		"tmp":                 0o755 | fs.ModeDir,
		"etc/passwd":          0o644,
		"etc/group":           0o644,
		"etc/hosts":           0o644,
		guestInit[1:]:         0o755,
		"etc/ld.so.cache":     0o644, // a bind's mount point, when the host has it
		"etc/ssl/certs":       0o755 | fs.ModeDir,
		"etc/ca-certificates": 0o755 | fs.ModeDir,
		"etc/alternatives":    0o755 | fs.ModeDir,
		"etc/localtime":       0o644,
		"etc/matplotlibrc":    0o644,
	}
	for name, mode := range want {
		fi, err := os.Lstat(filepath.Join(dir, name))
		if os.IsNotExist(err) && slices.Contains(etcBinds, "/"+name) && !hostHas(name) {
			continue // a bind's mount point, made only when the host has it
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if fi.Mode() != mode {
			t.Errorf("%s has mode %v under umask 0077, want %v", name, fi.Mode(), mode)
		}
	}
}

// hostHas reports whether the host has /name (an etcBinds entry).
func hostHas(name string) bool {
	_, err := os.Stat("/" + name)
	return err == nil
}

// The shared root a previous daemon made stays as it is when this one
// would make the same (the gVisor sandboxes left running use it: removing
// its mount points detaches their workspaces), and is replaced when it
// differs.
func TestRootfsKeptWhenTheSame(t *testing.T) {
	dir := filepath.Join(t.TempDir(), rootfsName)
	inode := func() uint64 {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(dir, "workspace"), &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	if err := makeRootfs(dir, "/"); err != nil {
		t.Fatal(err)
	}
	first := inode()
	if err := makeRootfs(dir, "/"); err != nil {
		t.Fatal(err)
	}
	if inode() != first {
		t.Fatal("the same root was made anew")
	}
	if err := os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte("changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := makeRootfs(dir, "/"); err != nil {
		t.Fatal(err)
	}
	if inode() == first {
		t.Fatal("a root that differs was kept")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "etc", "passwd")); string(b) != etcFiles["passwd"] {
		t.Fatalf("etc/passwd is %q", b)
	}
	if _, err := os.Stat(dir + ".new"); !os.IsNotExist(err) {
		t.Fatalf("the new root's temporary is left: %v", err)
	}
}
