package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/internal/failpoint"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// A sandbox mid-teardown over the wire: its destroy is held (between the
// journal's "destroying" and the backend's work) until a command runs in
// another sandbox. Meanwhile its user's destroy returns at once, a create
// of the same run is not refused for it, and the host's quota still counts
// it, the refusal saying how many it counted that are being destroyed.
func TestQuotasOfASandboxBeingDestroyed(t *testing.T) {
	d := startDaemonEnv(t, "", []string{failpoint.Env + "=" + lifecycle.FailDestroyJournal + "=after:" + bwrap.FailExecHandedOver},
		"--max-sandboxes", "3", "--max-sandboxes-per-owner", "1")
	c := d.client(t)
	other := create(t, c, map[string]any{"ttl_s": 600})
	victim := create(t, c, map[string]any{"spec": map[string]any{"owner": "dag/run"}, "ttl_s": 600})

	held := make(chan error, 1)
	cl := d.client(t) // another connection: this one's destroy stays in flight
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		held <- cl.Call(ctx, ipc.OpDestroy, map[string]any{"sandbox": victim}, nil)
	}()
	eventually(t, 20*time.Second, "the destroy held at its failpoint", func() bool {
		return strings.Contains(d.Logs(), `"failpoint":"`+lifecycle.FailDestroyJournal+`"`)
	})
	call(t, c, ipc.OpDestroy, map[string]any{"sandbox": victim}) // returns: it is being destroyed

	create(t, c, map[string]any{"spec": map[string]any{"owner": "dag/run"}, "ttl_s": 600})
	e := callErr(t, c, ipc.OpCreate, map[string]any{"ttl_s": 600})
	assert.Equal(t, ipc.CodeQuotaExceeded, e.Code)
	assert.Equal(t, "host", e.Details["scope"])
	assert.EqualValues(t, 3, e.Details["limit"])
	assert.EqualValues(t, 1, e.Details["destroying"])
	assert.Contains(t, e.Message, "1 of them are still being destroyed")

	require.Equal(t, 0, run(t, c, other, "true").ExitCode) // lets the destroy go on
	require.NoError(t, <-held)
	create(t, c, map[string]any{"ttl_s": 600})
	if t.Failed() {
		t.Logf("daemon log:\n%s", d.Logs())
	}
}
