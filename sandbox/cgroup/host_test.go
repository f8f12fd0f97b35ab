package cgroup

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func writeFiles(t *testing.T, files map[string]string) {
	t.Helper()
	for p, data := range files {
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(data), 0o644))
	}
}

func TestOwnV2Dir(t *testing.T) {
	root, tmp := t.TempDir(), t.TempDir()
	mi, self := filepath.Join(tmp, "mountinfo"), filepath.Join(tmp, "cgroup")
	mount := func(line string) { writeFiles(t, map[string]string{mi: line}) }
	own := func(data string) { writeFiles(t, map[string]string{self: data}) }
	opts := Options{MountInfo: mi, SelfCgroup: self}

	// The whole hierarchy mounted: the path under the mount point.
	mount("35 23 0:27 / " + root + " rw,nosuid shared:11 - cgroup2 cgroup2 rw,nsdelegate\n")
	own("0::/system.slice/x.service\n")
	path, dir, err := OwnV2Dir(opts)
	require.NoError(t, err)
	assert.Equal(t, "/system.slice/x.service", path)
	assert.Equal(t, filepath.Join(root, "system.slice", "x.service"), dir)

	// Only part of it mounted (a container's namespace): relative to the
	// mount's root.
	mount("35 23 0:27 /system.slice " + root + " rw - cgroup2 cgroup2 rw\n")
	_, dir, err = OwnV2Dir(opts)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(root, "x.service"), dir)

	// Outside what is mounted.
	mount("35 23 0:27 /other.slice " + root + " rw - cgroup2 cgroup2 rw\n")
	_, _, err = OwnV2Dir(opts)
	assert.ErrorIs(t, err, ErrUnavailable)

	// A v1-only process: no v2 entry.
	mount("30 23 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")
	own("4:memory:/a\n")
	path, _, err = OwnV2Dir(opts)
	assert.ErrorIs(t, err, ErrUnavailable)
	assert.Empty(t, path)
}

// A manager placed under the process's own cgroup in a v1 hierarchy where
// the process sits at the top puts its base at the hierarchy's top, which
// BaseAtHierarchyTop reports; Release then removes the empty base and
// leaves one that holds something.
func TestBaseAtHierarchyTopAndRelease(t *testing.T) {
	tmp := t.TempDir()
	mem, pids, cpu := filepath.Join(tmp, "memory"), filepath.Join(tmp, "pids"), filepath.Join(tmp, "cpu")
	mi, self := filepath.Join(tmp, "mountinfo"), filepath.Join(tmp, "cgroup")
	writeFiles(t, map[string]string{
		mi: "30 23 0:26 / " + mem + " rw - cgroup cgroup rw,memory\n" +
			"31 23 0:27 / " + pids + " rw - cgroup cgroup rw,pids\n" +
			"32 23 0:28 / " + cpu + " rw - cgroup cgroup rw,cpu\n",
		self: "4:memory:/\n5:pids:/\n6:cpu:/\n",
	})
	m, err := New(Options{Base: "sandboxes", MountInfo: mi, SelfCgroup: self, Force: V1})
	require.NoError(t, err)
	d, top := m.BaseAtHierarchyTop()
	assert.True(t, top)
	assert.Contains(t, []string{filepath.Join(mem, "sandboxes"), filepath.Join(pids, "sandboxes"), filepath.Join(cpu, "sandboxes")}, d)

	// A sandbox group that still holds something (here: a file, which
	// rmdir refuses just as cgroupfs refuses a group with a process).
	writeFiles(t, map[string]string{filepath.Join(mem, "sandboxes", "busy", "cgroup.procs"): "77\n"})
	require.NoError(t, os.MkdirAll(filepath.Join(pids, "sandboxes", "idle"), 0o755))
	require.NoError(t, m.Release())
	assert.NoDirExists(t, filepath.Join(pids, "sandboxes"), "an empty group and then its base are removed")
	assert.NoDirExists(t, filepath.Join(cpu, "sandboxes"))
	assert.FileExists(t, filepath.Join(mem, "sandboxes", "busy", "cgroup.procs"), "a group in use is left alone")
	require.NoError(t, m.Release(), "releasing again, or with a base already gone, is no failure")

	// Under a cgroup of its own, the base is not at the top.
	writeFiles(t, map[string]string{self: "4:memory:/svc\n5:pids:/svc\n6:cpu:/svc\n"})
	for _, h := range []string{mem, pids, cpu} {
		require.NoError(t, os.MkdirAll(filepath.Join(h, "svc"), 0o755))
	}
	m, err = New(Options{Base: "sandboxes", MountInfo: mi, SelfCgroup: self, Force: V1})
	require.NoError(t, err)
	_, top = m.BaseAtHierarchyTop()
	assert.False(t, top)
}
