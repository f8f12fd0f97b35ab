package disk

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func requireHost(t *testing.T) {
	t.Helper()
	err := Check()
	if err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("this test needs a host that can loop-mount (%v), and CI=true forbids skipping", err)
	}
	t.Skipf("needs a host that can loop-mount: %v", err)
}

func TestCreateValidates(t *testing.T) {
	dir := t.TempDir()
	require.Error(t, Create(context.Background(), filepath.Join(dir, "img"), Options{Size: 1 << 20}))
	require.Error(t, Create(context.Background(), filepath.Join(dir, "img"), Options{Size: MinSize, Inodes: -1}))
	_, err := os.Stat(filepath.Join(dir, "img"))
	require.True(t, errors.Is(err, os.ErrNotExist))
}

func TestMounted(t *testing.T) {
	requireHost(t)
	dir := filepath.Join(t.TempDir(), "with space")
	require.NoError(t, os.Mkdir(dir, 0o700))
	got, err := Mounted(dir)
	require.NoError(t, err)
	require.False(t, got, "a plain directory")
	got, err = Mounted(filepath.Join(dir, "missing"))
	require.NoError(t, err)
	require.False(t, got, "a directory that does not exist")
	require.NoError(t, unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"))
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	got, err = Mounted(dir)
	require.NoError(t, err)
	require.True(t, got, "a mount point whose name mountinfo escapes")
}

// capped makes and mounts a 32 MiB cap with 256 inodes owned by 65534, and
// unmounts it at the end whatever happens.
func capped(t *testing.T) (img, mnt string) {
	t.Helper()
	requireHost(t)
	base := t.TempDir()
	require.NoError(t, os.Chmod(base, 0o755))
	require.NoError(t, os.Chmod(filepath.Dir(base), 0o755)) // bwrap runs as 65534 and must reach it
	img, mnt = filepath.Join(base, "work.img"), filepath.Join(base, "work")
	require.NoError(t, os.Mkdir(mnt, 0o700))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, Create(ctx, img, Options{Size: 32 << 20, Inodes: 256, UID: 65534, GID: 65534}))
	require.NoError(t, Mount(img, mnt))
	t.Cleanup(func() {
		if err := Unmount(mnt); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return img, mnt
}

func TestRealCapStopsWritesAndFiles(t *testing.T) {
	img, mnt := capped(t)
	mounted, err := Mounted(mnt)
	require.NoError(t, err)
	require.True(t, mounted)
	fi, err := os.Stat(mnt)
	require.NoError(t, err)
	require.Equal(t, uint32(65534), fi.Sys().(*syscall.Stat_t).Uid, "the root of the cap belongs to the sandbox uid")

	// Bytes: at most 64 MiB written into a 32 MiB cap, so the loop is bounded.
	require.ErrorIs(t, fill(t, mnt), unix.ENOSPC)
	u, err := UsageOf(mnt)
	require.NoError(t, err)
	require.LessOrEqual(t, u.TotalBytes, int64(32<<20))

	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(img, &st))
	require.LessOrEqual(t, st.Blocks*512, int64(32<<20), "the host holds at most the cap")

	// Files: at most 1000 tries against 256 inodes.
	require.NoError(t, os.Remove(filepath.Join(mnt, "fill")))
	var cerr error
	for i := 0; i < 1000 && cerr == nil; i++ {
		var g *os.File
		g, cerr = os.Create(filepath.Join(mnt, "f"+strconv.Itoa(i)))
		if g != nil {
			g.Close()
		}
	}
	require.ErrorIs(t, cerr, unix.ENOSPC)

	require.NoError(t, Unmount(mnt))
	mounted, err = Mounted(mnt)
	require.NoError(t, err)
	require.False(t, mounted)
	require.NoError(t, Unmount(mnt), "unmounting twice is success")

	// AUTOCLEAR: no loop device keeps the image.
	deadline := time.Now().Add(10 * time.Second)
	for loopHolding(img) {
		require.True(t, time.Now().Before(deadline), "a loop device still holds %s", img)
		time.Sleep(20 * time.Millisecond)
	}
}

func loopHolding(img string) bool {
	matches, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err == nil && strings.TrimSpace(string(b)) == img {
			return true
		}
	}
	return false
}

// What the guest sees: a write past the cap fails with ENOSPC inside the
// sandbox, and setuid bits on the cap mean nothing (nosuid).
func TestRealCapInsideBubblewrap(t *testing.T) {
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs bubblewrap, and CI=true forbids skipping")
		}
		t.Skip("needs bubblewrap")
	}
	_, mnt := capped(t)
	cmd := exec.Command(bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
		"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev",
		"--bind", mnt, "/workspace", "--", "/bin/sh", "-c",
		"dd if=/dev/zero of=/workspace/f bs=1M count=64 2>&1; echo rc=$?; grep ' /workspace ' /proc/self/mountinfo")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	s := string(out)
	require.Contains(t, s, "No space left on device")
	require.NotContains(t, s, "rc=0")
	require.Contains(t, s, "nosuid")
	require.Contains(t, s, "nodev")
}

// fill writes at most 64 MiB of zeros to dir/fill (so the loop is bounded
// against a smaller cap) and returns the error that stopped it, if any.
func fill(t *testing.T, dir string) error {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "fill"))
	require.NoError(t, err)
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for range 64 {
		if _, err := f.Write(chunk); err != nil {
			return err
		}
	}
	return f.Sync()
}
