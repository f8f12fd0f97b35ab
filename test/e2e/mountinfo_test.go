package e2e

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
)

// guestMountRoots runs cat /proc/self/mountinfo in sandbox id and returns
// it whole, and the root field (the bound directory's path inside the
// filesystem it comes from) of each mount point.
func guestMountRoots(t *testing.T, c *ipc.Client, id string) (string, map[string]string) {
	t.Helper()
	res := run(t, c, id, "cat /proc/self/mountinfo")
	require.Equal(t, 0, res.ExitCode, "stderr: %s", res.Stderr)
	infos, err := mountinfo.GetMountsFromReader(strings.NewReader(string(res.Stdout)), nil)
	require.NoError(t, err)
	roots := map[string]string{}
	for _, in := range infos {
		roots[in.Mountpoint] = in.Root
	}
	return string(res.Stdout), roots
}

// rootFieldOf is what mountinfo shows as the root of a bind mount of host
// directory dir: its path inside the filesystem it lives on (the mount of
// this process's namespace with the longest mount point above dir).
func rootFieldOf(t *testing.T, dir string) string {
	t.Helper()
	infos, err := mountinfo.GetMounts(nil)
	require.NoError(t, err)
	var best *mountinfo.Info
	for _, in := range infos {
		if rel, err := filepath.Rel(in.Mountpoint, dir); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			if best == nil || len(in.Mountpoint) >= len(best.Mountpoint) {
				best = in
			}
		}
	}
	require.NotNil(t, best, "no mount holds %s", dir)
	rel, _ := filepath.Rel(best.Mountpoint, dir)
	return filepath.Join(best.Root, rel)
}

// A root daemon's sandbox (host image, disk caps in force) shows its guest
// nothing of the host's layout in /proc/self/mountinfo: /workspace and
// /tmp are directories of the sandbox's own filesystem, and neither the
// state directory's path nor the sandbox's id appears anywhere.
// docs/security.md says what a guest can learn there.
func TestRootDaemonsGuestMountinfoNamesNoHostPath(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	requireDiskCaps(t, c)
	id := create(t, c, nil)
	all, roots := guestMountRoots(t, c, id)
	assert.Equal(t, "/work", roots["/workspace"], "/workspace's root is its disk's /work")
	assert.Equal(t, "/tmp", roots["/tmp"], "/tmp's root is its disk's /tmp")
	for _, s := range []string{d.base, d.stateDir, filepath.Base(d.base), id} {
		assert.False(t, strings.Contains(all, s), "the guest's mountinfo names the host's %s", s)
	}
	if t.Failed() {
		t.Logf("the guest's mountinfo:\n%s", all)
	}
}
