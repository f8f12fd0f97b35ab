package lifecycle

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/procstore"
)

// The metrics' view of durable processes, on the real bwrap backend:
// running ones, ended ones by reason, the bytes their logs dropped, and
// the bound on how many sandboxes one call looks at.
func TestProcessStatsBwrap(t *testing.T) {
	const logBytes = 4096 // the smallest ring, so a little output overflows it
	e := newEnv(t, withBwrapConfig(func(c *bwrap.Config) { c.Processes = procstore.Limits{LogBytes: logBytes} }))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := func(id string, req backend.ProcessRequest) string {
		t.Helper()
		p, err := e.m.StartProcess(ctx, alice, id, req)
		require.NoError(t, err)
		return p.ID
	}
	ended := func(id, proc, reason string) {
		t.Helper()
		p, err := e.m.WaitProcess(ctx, alice, id, proc, time.Minute)
		require.NoError(t, err)
		require.False(t, p.Running)
		require.Equal(t, reason, p.Reason)
	}

	busy := e.create(alice, CreateRequest{}).ID
	flood := start(busy, backend.ProcessRequest{Command: "head -c 10000 /dev/zero; head -c 5000 /dev/zero >&2; exit 3"})
	start(busy, backend.ProcessRequest{Argv: []string{"sleep", "600"}})
	killed := start(busy, backend.ProcessRequest{Argv: []string{"sleep", "600"}})
	require.NoError(t, e.m.SignalProcess(ctx, alice, busy, killed, syscall.SIGKILL))
	ended(busy, flood, "exited")
	ended(busy, killed, "killed")

	quiet := e.create(alice, CreateRequest{}).ID
	ended(quiet, start(quiet, backend.ProcessRequest{Command: "echo hi"}), "exited")
	ended(quiet, start(quiet, backend.ProcessRequest{Argv: []string{"sleep", "600"}, Timeout: 200 * time.Millisecond}), "timed_out")
	e.create(alice, CreateRequest{}) // no process: never looked at

	// Counted again, the quiet sandbox runs nothing; its records stay
	// counted.
	e.m.recountProcesses(ctx, e.bw)

	st, ok := e.m.ProcessStats(ctx, logBytes, 10)
	require.True(t, ok)
	assert.Equal(t, 1, st.Running)
	assert.Equal(t, map[string]int{"exited": 2, "killed": 1, "timed_out": 1}, st.Ended)
	assert.EqualValues(t, (10000-logBytes)+(5000-logBytes), st.LogBytesDropped)
	assert.Equal(t, 2, st.Sandboxes)
	assert.Zero(t, st.Skipped)

	// One sandbox at most: the one running a process is looked at.
	st, _ = e.m.ProcessStats(ctx, logBytes, 1)
	assert.Equal(t, 1, st.Running)
	assert.Equal(t, 1, st.Sandboxes)
	assert.Equal(t, 1, st.Skipped)

	// Out of time: nothing looked at, nothing counted.
	done, stop := context.WithCancel(ctx)
	stop()
	st, _ = e.m.ProcessStats(done, logBytes, 10)
	assert.Equal(t, ProcessStats{Ended: map[string]int{}, Skipped: 2}, st)

	// A destroyed sandbox's processes go with it.
	require.NoError(t, e.m.Destroy(ctx, alice, busy))
	st, _ = e.m.ProcessStats(ctx, logBytes, 10)
	assert.Equal(t, ProcessStats{Ended: map[string]int{"exited": 1, "timed_out": 1}, Sandboxes: 1}, st)
}

// A backend without durable processes has no stats to give.
func TestProcessStatsWithoutProcesses(t *testing.T) {
	e := newEnv(t) // the host test backend runs no durable process
	if e.bw != nil {
		t.Skip("on bwrap (TestBwrapManager)")
	}
	_, ok := e.m.ProcessStats(context.Background(), 4096, 10)
	assert.False(t, ok)
}
