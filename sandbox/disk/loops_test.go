package disk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// requireTool skips a test without the util-linux tool name, and fails it
// instead under CI=true.
func requireTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("needs %s (util-linux), and CI=true forbids skipping", name)
		}
		t.Skipf("needs %s (util-linux)", name)
	}
}

// newImage makes a minimal disk image in a temporary directory, and the
// empty directory to mount it on.
func newImage(ctx context.Context, t *testing.T) (img, mnt string) {
	t.Helper()
	base := t.TempDir()
	img, mnt = filepath.Join(base, "disk.img"), filepath.Join(base, "vol")
	require.NoError(t, os.Mkdir(mnt, 0o700))
	require.NoError(t, Create(ctx, img, Options{Size: MinSize, UID: -1, GID: -1}))
	return img, mnt
}

// holdInOtherNamespace mounts img in a mount namespace of its own, held by
// a process that outlives the mount call: what a daemon killed with -9
// leaves while one of its children lives. It returns that process.
func holdInOtherNamespace(t *testing.T, img string) *exec.Cmd {
	t.Helper()
	requireTool(t, "unshare")
	dir := filepath.Join(t.TempDir(), "elsewhere")
	require.NoError(t, os.Mkdir(dir, 0o700))
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount -o loop "$1" "$2" && echo mounted && exec sleep 600`, "sh", img, dir)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	buf := make([]byte, 8)
	n, _ := out.Read(buf)
	require.Equal(t, "mounted\n", string(buf[:n]), "the other namespace mounted the image")
	return cmd
}

// An image attached anywhere, even from a namespace this process cannot
// see, is never attached a second time; ReleaseStale detaches it there.
func TestImageAttachedElsewhereIsNeverMountedTwice(t *testing.T) {
	requireHost(t)
	requireTool(t, "nsenter")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	img, mnt := newImage(ctx, t)
	none, err := Attached(img)
	require.NoError(t, err)
	assert.Empty(t, none)

	holder := holdInOtherNamespace(t, img)
	held, err := Attached(img)
	require.NoError(t, err)
	require.Len(t, held, 1, "the other namespace's loop device is found by device and inode")

	err = Mount(img, mnt)
	require.True(t, errors.Is(err, ErrAttached), "Mount refuses an image attached elsewhere: %v", err)
	mounted, _ := Mounted(mnt)
	assert.False(t, mounted)
	after, _ := Attached(img)
	assert.Len(t, after, 1, "and attaches no second loop device")

	left, err := ReleaseStale(ctx, img, mnt)
	require.NoError(t, err)
	assert.Empty(t, left, "the other namespace's mount is gone, and its loop device with it")
	assert.Nil(t, holder.ProcessState, "without killing the process that held it")

	require.NoError(t, Mount(img, mnt), "now it mounts")
	t.Cleanup(func() { _ = Unmount(mnt) })
	_, err = ReleaseStale(ctx, img, mnt)
	assert.Error(t, err, "ReleaseStale never touches an image mounted in its own namespace")
	mine, _ := Attached(img)
	assert.Len(t, mine, 1)
}

// childCreateEnv makes the test binary a process that formats an image
// with a slow mkfs and waits to be killed (TestMkfsDiesWithItsParent).
const childCreateEnv = "SANDBOX_SIDECAR_DISK_TEST_CHILD"

func TestMkfsDiesWithItsParent(t *testing.T) {
	if dir := os.Getenv(childCreateEnv); dir != "" {
		_ = Create(context.Background(), filepath.Join(dir, "disk.img"), Options{Size: MinSize, UID: -1, GID: -1,
			MkfsPath: filepath.Join(dir, "slow-mkfs"), Formatting: func(pid int) { fmt.Println(pid) }})
		return
	}
	dir := t.TempDir()
	// A stand-in for an mkfs.ext4 that takes long on a big or slow disk.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "slow-mkfs"), []byte("#!/bin/sh\nexec sleep 600\n"), 0o755))
	child := exec.Command(os.Args[0], "-test.run=^TestMkfsDiesWithItsParent$")
	child.Env = append(os.Environ(), childCreateEnv+"="+dir)
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	var pid int
	_, err = fmt.Fscan(out, &pid)
	require.NoError(t, err, "the child reports mkfs's pid")
	require.NoError(t, child.Process.Kill()) // the daemon, killed with -9
	_ = child.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !strings.Contains(string(b), "sleep") {
			return // gone
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("mkfs (pid %d) outlived the process that started it", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A loop device still attached to an image when nothing mounts it any more
// is what a daemon killed with -9 leaves for a moment: the kernel frees it
// once its sandboxes' mount namespaces are torn down. Mount waits
// (boundedly) for that instead of refusing the image as held elsewhere;
// one that stays attached is refused once the wait is over.
func TestMountWaitsForALoopDeviceNobodyHolds(t *testing.T) {
	requireHost(t)
	requireTool(t, "losetup")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	img, mnt := newImage(ctx, t)
	attachBare := func() string {
		out, err := exec.Command("losetup", "--find", "--show", img).Output()
		require.NoError(t, err)
		dev := strings.TrimSpace(string(out))
		t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
		return dev
	}
	old := unheldWait
	unheldWait = 3 * time.Second
	defer func() { unheldWait = old }()

	// Freed a moment after Mount first looks (here by hand; after kill -9,
	// by the kernel): Mount waits, then mounts.
	dev := attachBare()
	freed := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		freed <- exec.Command("losetup", "-d", dev).Run()
	}()
	require.NoError(t, Mount(img, mnt), "an attachment nobody holds is waited out")
	require.NoError(t, <-freed)
	require.NoError(t, Unmount(mnt))

	// Never freed: refused once the wait is over, with nothing mounted.
	unheldWait = 200 * time.Millisecond
	attachBare()
	err := Mount(img, mnt)
	require.True(t, errors.Is(err, ErrAttached), "an attachment that stays is refused: %v", err)
	mounted, _ := Mounted(mnt)
	assert.False(t, mounted)
}
