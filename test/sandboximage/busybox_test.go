package sandboximage

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// A busybox-static image: a root with no python and no libc at all, in
// which argv commands and, with its sh, command strings run; the same
// without sh refuses a command string with no_shell.
func TestBusyboxImage(t *testing.T) {
	d := startDaemon(t, "")
	dir := t.TempDir()
	archive := filepath.Join(dir, "busybox.tar")
	ref, err := name.ParseReference("sandbox-sidecar.test/busybox:1")
	require.NoError(t, err)
	require.NoError(t, tarball.WriteToFile(archive, ref, busyboxImage(t, true)))
	out := d.mustCLI(t, "image", "import", archive, "--name", "busybox")
	assert.Contains(t, out, "imported busybox")
	// The same image without sh, as an OCI layout directory.
	d.mustCLI(t, "image", "import", writeLayout(t, busyboxImage(t, false)), "--name", "nosh")

	c := d.client(t)
	ctx := ctxT(t, 5*time.Minute)
	sb, err := c.Create(ctx, api.CreateRequest{Image: "busybox"})
	require.NoError(t, err)
	res := run(t, c, sb.Sandbox, "/bin/busybox", "echo", "hello from busybox")
	require.Equal(t, 0, res.ExitCode, "stderr: %s", res.Stderr)
	assert.Equal(t, "hello from busybox\n", string(res.Stdout))
	res = sh(t, c, sb.Sandbox, `ls /usr/bin/python3 /usr/bin /lib 2>&1; echo "$IMAGE_TEST"; pwd`)
	assert.Contains(t, string(res.Stdout), "No such file or directory", "no python, no /lib: nothing of the host")
	assert.Contains(t, string(res.Stdout), "from-the-image\n/workspace\n")
	res = sh(t, c, sb.Sandbox, "python3 -c 1")
	assert.Equal(t, 127, res.ExitCode, "sh runs, python3 is not there")

	nosh, err := c.Create(ctx, api.CreateRequest{Image: "nosh"})
	require.NoError(t, err)
	res = run(t, c, nosh.Sandbox, "/bin/busybox", "true")
	assert.Equal(t, 0, res.ExitCode, "argv commands run without a shell: %s", res.Stderr)
	_, err = c.RunCommand(ctx, api.RunCommandRequest{Sandbox: nosh.Sandbox, Command: "true", TimeoutS: 10})
	var we *ipc.Error
	require.ErrorAs(t, err, &we)
	assert.Equal(t, ipc.CodeNoShell, we.Code, "%v", err)

	// ls/inspect for everyone, rm for admins (the test runs as root).
	ls := d.mustCLI(t, "image", "ls")
	for _, n := range []string{"host (default)", "busybox", "nosh"} {
		assert.Contains(t, ls, n)
	}
	_, errOut, code := d.cli(t, "image", "rm", "nosh")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errOut, "image_in_use")
	require.NoError(t, c.Destroy(ctx, nosh.Sandbox))
	d.mustCLI(t, "image", "rm", "nosh")
	_, errOut, code = d.cli(t, "image", "inspect", "nosh")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errOut, "image_not_found")
}

// gvisorImageRoots are the per-image mount-point roots the gvisor backend
// keeps in its state directory (.rootfs-<digest>).
func gvisorImageRoots(t *testing.T, stateDir string) []string {
	t.Helper()
	roots, err := filepath.Glob(filepath.Join(stateDir, "gvisor", ".rootfs-*"))
	require.NoError(t, err)
	return roots
}

// On gVisor an image's mount-point root is made for its first sandbox and
// goes with the image: image rm removes it, and so does the next start
// for one a daemon left (stopped between the store's removal and the
// backend's).
func TestGVisorImageRootGoesWithTheImage(t *testing.T) {
	runsc := runscPath(t)
	d := startDaemon(t, "", "--backend", "gvisor", "--gvisor-runsc-path", runsc)
	archive := filepath.Join(t.TempDir(), "busybox.tar")
	ref, err := name.ParseReference("sandbox-sidecar.test/busybox:1")
	require.NoError(t, err)
	require.NoError(t, tarball.WriteToFile(archive, ref, busyboxImage(t, true)))
	d.mustCLI(t, "image", "import", archive, "--name", "busybox")

	c := d.client(t)
	ctx := ctxT(t, 5*time.Minute)
	sb, err := c.Create(ctx, api.CreateRequest{Image: "busybox"})
	require.NoError(t, err)
	res := run(t, c, sb.Sandbox, "/bin/busybox", "true")
	require.Equal(t, 0, res.ExitCode, "stderr: %s", res.Stderr)
	roots := gvisorImageRoots(t, d.stateDir)
	require.Len(t, roots, 1, "the image's root, made for its first sandbox")

	_, errOut, code := d.cli(t, "image", "rm", "busybox")
	require.NotEqual(t, 0, code)
	assert.Contains(t, errOut, "image_in_use")
	assert.Equal(t, roots, gvisorImageRoots(t, d.stateDir), "a refused rm keeps the root")
	require.NoError(t, c.Destroy(ctx, sb.Sandbox))
	d.mustCLI(t, "image", "rm", "busybox")
	assert.Empty(t, gvisorImageRoots(t, d.stateDir), "image rm removed the image's root")

	// What a daemon stopped between the two removals leaves: a root of an
	// image the store no longer has. The next start removes it.
	d.stop()
	require.NoError(t, os.MkdirAll(filepath.Join(roots[0], "bin"), 0o755))
	d.start()
	require.Eventually(t, func() bool { return len(gvisorImageRoots(t, d.stateDir)) == 0 }, time.Minute, 50*time.Millisecond,
		"the start removed the left root: %v", gvisorImageRoots(t, d.stateDir))
}
