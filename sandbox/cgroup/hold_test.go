package cgroup

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPlanTakesTheV1FreezerWithoutRequiringIt(t *testing.T) {
	mounts := []mount{
		{point: "/sys/fs/cgroup/memory", root: "/", controllers: []string{"memory"}},
		{point: "/sys/fs/cgroup/pids", root: "/", controllers: []string{"pids"}},
		{point: "/sys/fs/cgroup/cpu,cpuacct", root: "/", controllers: []string{"cpu", "cpuacct"}},
	}
	m, err := plan(layout{mounts: mounts, own: map[string]string{"": "/"}}, Options{Base: "sbx"})
	require.NoError(t, err)
	require.NotContains(t, m.v1Base, freezer)
	c, err := m.cgroupFor("a")
	require.NoError(t, err)
	_, err = c.Hold(context.Background())
	require.ErrorIs(t, err, ErrNoFreezer)

	mounts = append(mounts, mount{point: "/sys/fs/cgroup/freezer", root: "/", controllers: []string{"freezer"}})
	m, err = plan(layout{mounts: mounts, own: map[string]string{"": "/", "freezer": "/svc"}}, Options{Base: "sbx"})
	require.NoError(t, err)
	require.Equal(t, "/sys/fs/cgroup/freezer/svc/sbx", m.v1Base[freezer])
}

// TestRealHold holds a group whose process counts into a file: the count
// stops while held and goes on after; a group frozen by someone else (a
// pause) stays frozen after a hold's release.
func TestRealHold(t *testing.T) {
	m := realManager(t, Options{})
	c, err := m.Create(uniqueName("hold"), Limits{})
	require.NoError(t, err)
	if _, _, err := c.freezerFiles(); err != nil {
		requireCI(t, false, "a cgroup freezer ("+err.Error()+")")
	}
	counter := filepath.Join(t.TempDir(), "n")
	g := startGated(t, `i=0; while :; do i=$((i+1)); echo $i > `+counter+`.tmp; mv `+counter+`.tmp `+counter+`; done`)
	require.NoError(t, c.Add(g.cmd.Process.Pid))
	g.release(t)
	read := func() int {
		for {
			b, err := os.ReadFile(counter)
			if err == nil {
				if n, err := strconv.Atoi(string(b[:len(b)-1])); err == nil {
					return n
				}
			}
			time.Sleep(time.Millisecond)
		}
	}
	require.Eventually(t, func() bool { return read() > 10 }, 10*time.Second, time.Millisecond)

	release, err := c.Hold(context.Background())
	require.NoError(t, err)
	frozen, err := c.Frozen()
	require.NoError(t, err)
	require.True(t, frozen)
	before := read()
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, before, read(), "the count went on while the group was held")
	require.NoError(t, release())
	require.Eventually(t, func() bool { return read() > before }, 10*time.Second, time.Millisecond)

	// Frozen by someone else: a hold leaves it so.
	other, err := c.Hold(context.Background())
	require.NoError(t, err)
	again, err := c.Hold(context.Background())
	require.NoError(t, err)
	require.NoError(t, again())
	frozen, err = c.Frozen()
	require.NoError(t, err)
	require.True(t, frozen, "a hold of a frozen group thawed it")
	require.NoError(t, other())
	require.NoError(t, c.Thaw())
}

// TestRealKillOfAHeldGroup kills a group left held (a daemon that died
// mid-snapshot): on v1 a frozen process takes no SIGKILL until thawed.
func TestRealKillOfAHeldGroup(t *testing.T) {
	m := realManager(t, Options{})
	c, err := m.Create(uniqueName("heldkill"), Limits{})
	require.NoError(t, err)
	if _, _, err := c.freezerFiles(); err != nil {
		requireCI(t, false, "a cgroup freezer ("+err.Error()+")")
	}
	g := startGated(t, "sleep 1000")
	require.NoError(t, c.Add(g.cmd.Process.Pid))
	g.release(t)
	_, err = c.Hold(context.Background())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, c.Destroy(ctx))
	g.wait(t, 10*time.Second)
}
