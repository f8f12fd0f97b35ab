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

// TestHoldRoundsThawAStuckFreeze scripts a v1 freezer that never finishes
// the first freeze (a vfork parent caught between its clone and its wait
// is never counted frozen) and finishes the one after a thaw: a freeze
// (Hold's, Freeze's) thaws,
// freezes again and holds; on v2, which counts such a parent, one freeze
// is all it writes.
func TestHoldRoundsThawAStuckFreeze(t *testing.T) {
	for _, v := range []Version{V1, V2} {
		var writes []string
		rounds := 0
		f := freezerOps{
			write: func(freeze bool) error {
				if freeze {
					rounds++
					writes = append(writes, "freeze")
				} else {
					writes = append(writes, "thaw")
				}
				return nil
			},
			frozen: func() (bool, error) { return v == V2 || rounds > 1, nil },
		}
		release, err := freezeRounds(context.Background(), f, v)
		require.NoError(t, err)
		if v == V2 {
			require.Equal(t, []string{"freeze"}, writes)
		} else {
			require.Equal(t, []string{"freeze", "thaw", "freeze"}, writes)
		}
		require.NoError(t, release())
		require.Equal(t, "thaw", writes[len(writes)-1])
	}

	// Stuck for good: bounded by ctx, and left thawed.
	var last string
	f := freezerOps{
		write: func(freeze bool) error {
			last = map[bool]string{true: "freeze", false: "thaw"}[freeze]
			return nil
		},
		frozen: func() (bool, error) { return false, nil },
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := freezeRounds(ctx, f, V1)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, "thaw", last)
}

// TestRealHoldOfAVforkLoop holds, again and again, a group whose shell
// vforks in a loop: each hold must finish however the freeze meets it.
func TestRealHoldOfAVforkLoop(t *testing.T) {
	m := realManager(t, Options{})
	c, err := m.Create(uniqueName("vfork"), Limits{})
	require.NoError(t, err)
	if _, _, err := c.freezerFiles(); err != nil {
		requireCI(t, false, "a cgroup freezer ("+err.Error()+")")
	}
	g := startGated(t, `while :; do /bin/true; done`)
	require.NoError(t, c.Add(g.cmd.Process.Pid))
	g.release(t)
	for i := 0; i < 20; i++ {
		release, err := c.Hold(context.Background())
		require.NoError(t, err, "hold %d", i)
		require.NoError(t, release())
	}
}
