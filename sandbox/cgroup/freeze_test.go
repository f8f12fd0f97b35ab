package cgroup

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPlanAddsTheV1FreezerWhenMounted(t *testing.T) {
	mounts := []mount{
		{point: "/sys/fs/cgroup/memory", root: "/", controllers: []string{"memory"}},
		{point: "/sys/fs/cgroup/pids", root: "/", controllers: []string{"pids"}},
		{point: "/sys/fs/cgroup/cpu", root: "/", controllers: []string{"cpu"}},
	}
	own := map[string]string{"memory": "/", "pids": "/", "cpu": "/", "freezer": "/svc"}
	m, err := plan(layout{mounts: mounts, own: own}, Options{Base: "sbx"})
	require.NoError(t, err)
	require.NotContains(t, m.v1Base, "freezer", "no freezer mounted: none planned")
	require.ErrorIs(t, m.CanFreeze(), ErrNoFreezer)
	c, err := m.cgroupFor("a")
	require.NoError(t, err)
	_, err = c.Hold(context.Background())
	require.ErrorIs(t, err, ErrNoFreezer)
	require.ErrorIs(t, c.Freeze(context.Background()), ErrNoFreezer)

	mounts = append(mounts, mount{point: "/sys/fs/cgroup/freezer", root: "/", controllers: []string{"freezer"}})
	m, err = plan(layout{mounts: mounts, own: own}, Options{Base: "sbx"})
	require.NoError(t, err)
	require.Equal(t, "/sys/fs/cgroup/freezer/svc/sbx", m.v1Base["freezer"], "under the daemon's own freezer group")
	require.NoError(t, m.CanFreeze())
	m, err = plan(layout{mounts: mounts, own: own}, Options{Base: "sbx", UnderRoot: true})
	require.NoError(t, err)
	require.Equal(t, "/sys/fs/cgroup/freezer/sbx", m.v1Base["freezer"])
	require.Equal(t, []string{"memory", "pids", "cpu"}, m.controllers, "the freezer is never a required controller")
}

// counterScript counts as fast as a shell can, into file c, with a short
// sleep per step so it does not take a whole CPU.
func counterScript(dir string) string {
	return `i=0; while :; do i=$((i+1)); echo $i > ` + filepath.Join(dir, "c.tmp") + ` && mv ` + filepath.Join(dir, "c.tmp") + ` ` + filepath.Join(dir, "c") + `; sleep 0.005; done`
}

func readCounter(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "c"))
	require.NoError(t, err)
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	return n
}

// testFreezeMechanics freezes a group whose process counts, checks that it
// stops counting and is reported frozen, thaws it, and then kills the
// group while frozen again (a destroy of a paused sandbox).
func testFreezeMechanics(t *testing.T, m *Manager) {
	require.NoError(t, m.CanFreeze())
	cg, err := m.Create(uniqueName("fz"), Limits{})
	require.NoError(t, err)
	frozen, err := cg.Freezing()
	require.NoError(t, err)
	require.False(t, frozen, "a new group runs")

	dir := t.TempDir()
	g := startGated(t, counterScript(dir))
	require.NoError(t, cg.Add(g.cmd.Process.Pid))
	g.release(t)
	waitFor(t, "the counter to start", func() bool { _, err := os.Stat(filepath.Join(dir, "c")); return err == nil })

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, cg.Freeze(ctx))
	require.NoError(t, cg.Freeze(ctx), "freezing a frozen group succeeds")
	frozen, err = cg.Freezing()
	require.NoError(t, err)
	require.True(t, frozen)
	frozen, err = cg.Frozen()
	require.NoError(t, err)
	require.True(t, frozen, "Freeze returns once every process stopped")
	at := readCounter(t, dir)
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, at, readCounter(t, dir), "a frozen process does not run")

	require.NoError(t, cg.Thaw())
	require.NoError(t, cg.Thaw(), "thawing a thawed group succeeds")
	frozen, err = cg.Freezing()
	require.NoError(t, err)
	require.False(t, frozen)
	waitFor(t, "the counter to go on", func() bool { return readCounter(t, dir) > at })

	// A shell that forks all the time (dash with vfork): on cgroup v1 a
	// vfork parent caught between its vfork and its wait keeps the group
	// FREEZING unless thawed and asked again (freezeRounds). Every freeze
	// must succeed.
	forker := startGated(t, `while :; do /bin/true; done`)
	require.NoError(t, cg.Add(forker.cmd.Process.Pid))
	forker.release(t)
	for i := range 150 {
		require.NoError(t, cg.Freeze(ctx), "freeze %d", i)
		require.NoError(t, cg.Thaw())
		time.Sleep(2 * time.Millisecond)
	}

	// Frozen again, then killed: the kill thaws it so that its processes
	// die, and the group can be removed.
	require.NoError(t, cg.Freeze(ctx))
	require.NoError(t, cg.Destroy(ctx))
	select {
	case <-g.done:
	case <-time.After(10 * time.Second):
		t.Fatal("a frozen process survived its group's kill")
	}
	_, err = cg.Freezing()
	require.ErrorIs(t, err, ErrNotFound, "a removed group is not found")
	require.ErrorIs(t, cg.Freeze(ctx), ErrNotFound)
}

func TestRealFreezeThawKill(t *testing.T) {
	m := realManager(t, Options{})
	if m.Version() == V1 {
		requireCI(t, m.CanFreeze() == nil, "cgroup v1's freezer mounted ("+errString(m.CanFreeze())+")")
	}
	testFreezeMechanics(t, m)
	if m.Version() != V1 {
		return
	}
	// The anchor keeps the v1 freezer's kernel branch on after the first
	// freeze: an empty group, frozen, that List never names and Release
	// removes with the base.
	anchor := filepath.Join(m.v1Base[freezer], freezeAnchor)
	b, err := os.ReadFile(filepath.Join(anchor, "freezer.state"))
	require.NoError(t, err, "the first freeze made the anchor")
	require.Equal(t, "FROZEN", strings.TrimSpace(string(b)))
	names, err := m.List()
	require.NoError(t, err)
	require.NotContains(t, names, freezeAnchor)
	require.NoError(t, m.Release())
	_, err = os.Stat(anchor)
	require.ErrorIs(t, err, os.ErrNotExist, "Release removes the anchor")
	for _, d := range m.Dirs() {
		_, err := os.Stat(d)
		require.ErrorIs(t, err, os.ErrNotExist, "and then the base")
	}
}

// The same on this host's v2 hierarchy, whatever controllers it has:
// cgroup.freeze is in every v2 group.
func TestRealV2FreezeThawKill(t *testing.T) {
	requireCI(t, os.Geteuid() == 0, "root")
	m, err := New(Options{Base: uniqueName("sidecar-cgtest-v2fz"), Force: V2, UnderRoot: true, Controllers: []string{}})
	requireCI(t, err == nil, "a cgroup v2 mount ("+errString(err)+")")
	t.Cleanup(func() {
		names, _ := m.List()
		for _, n := range names {
			_ = m.Remove(context.Background(), n)
		}
		for _, d := range m.Dirs() {
			_ = syscall.Rmdir(d)
		}
	})
	testFreezeMechanics(t, m)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
