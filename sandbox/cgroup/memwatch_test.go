package cgroup

import (
	"context"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A watch fires once the group's memory use reaches its level, below the
// hard limit, and nothing is killed: the owner decides what to free.
func TestRealMemoryWatchFiresAtItsLevel(t *testing.T) {
	m := realManager(t, Options{})
	const limit, level = 128 << 20, 64 << 20
	cg, err := m.Create("watch", Limits{MemoryBytes: limit, PIDs: 16})
	require.NoError(t, err)
	w, err := cg.WatchMemory(level)
	require.NoError(t, err)
	defer w.Close()
	if m.Version() == V2 {
		require.Equal(t, "67108864", readTrim(t, cg.dir+"/memory.high"))
	}
	_, err = cg.WatchMemory(0)
	require.Error(t, err)

	// Nothing crosses the level: a wait ends with its context.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	for {
		err := w.Wait(ctx)
		if err != nil {
			require.ErrorIs(t, err, context.DeadlineExceeded)
			break
		}
		u, err := w.Usage()
		require.NoError(t, err)
		require.Less(t, u, int64(level), "a wake-up with nothing in the group")
	}

	// 96 MiB, touched and held: over the level, under the limit.
	g := startGated(t, `exec /usr/bin/python3 -c 'import time; b = bytearray(96 << 20); time.sleep(60)'`)
	require.NoError(t, cg.Add(g.cmd.Process.Pid))
	g.release(t)
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		require.NoError(t, w.Wait(ctx), "the watch did not fire at %d bytes", level)
		u, err := w.Usage()
		require.NoError(t, err)
		if u >= level {
			break
		}
	}
	kills, err := cg.OOMKills()
	require.NoError(t, err)
	require.Zero(t, kills)
	require.NoError(t, syscall.Kill(g.cmd.Process.Pid, syscall.SIGKILL))
	g.wait(t, 10*time.Second)
	u, err := w.Usage()
	require.NoError(t, err)
	require.Less(t, u, int64(level))
}

// SetMemoryMax raises and lowers the hard limit (v1: with the memory+swap
// limit, which may never be below it).
func TestRealSetMemoryMax(t *testing.T) {
	m := realManager(t, Options{})
	cg, err := m.Create("max", Limits{MemoryBytes: 64 << 20})
	require.NoError(t, err)
	file := cg.dir + "/memory.max"
	if m.Version() == V1 {
		file = cg.dirs["memory"] + "/memory.limit_in_bytes"
	}
	for _, n := range []int64{96 << 20, 32 << 20, 64 << 20} {
		require.NoError(t, cg.SetMemoryMax(n))
		require.Equal(t, strconv.FormatInt(n, 10), readTrim(t, file))
		if sw := cg.dirs["memory"] + "/memory.memsw.limit_in_bytes"; m.Version() == V1 && fileExists(sw) {
			require.Equal(t, strconv.FormatInt(n, 10), readTrim(t, sw))
		}
	}
	require.Error(t, cg.SetMemoryMax(0))
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Held counts anonymous and shared memory, never the page cache of files.
func TestHeldOfMemoryStat(t *testing.T) {
	v1 := parseKeyed([]byte("cache 900\nrss 5\nshmem 7\ntotal_cache 1000000\ntotal_rss 300\ntotal_shmem 200\ntotal_inactive_file 999000\n"))
	n, err := heldOf(v1, false)
	require.NoError(t, err)
	require.Equal(t, int64(500), n)
	v2 := parseKeyed([]byte("anon 4096\nfile 1000000\nshmem 1024\nfile_dirty 5\n"))
	n, err = heldOf(v2, true)
	require.NoError(t, err)
	require.Equal(t, int64(5120), n)
	_, err = heldOf(parseKeyed([]byte("cache 1\n")), false)
	require.Error(t, err)
}
