package service

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
)

// A backend that cannot pause (sbx, the host test backend): hello does not
// offer it, pause says not_supported, resume of a running sandbox is what
// it is asked (nothing to do), and the sandbox is untouched.
func TestPauseRefusedWhereTheBackendHasNone(t *testing.T) {
	h := newHarness(t, nil)
	hello := h.ok(ipc.OpHello, nil)
	assert.NotContains(t, hello["features"], "pause")
	id := h.ok(ipc.OpCreate, map[string]any{"ttl_s": 60})["sandbox"]
	_, err := h.call(ipc.OpPause, map[string]any{"sandbox": id})
	require.NotNil(t, err)
	assert.Equal(t, ipc.CodeNotSupported, err.Code)
	assert.Contains(t, err.Message, "cannot pause")
	res := h.ok(ipc.OpResume, map[string]any{"sandbox": id})
	assert.Equal(t, "ready", res["state"])
	assert.Equal(t, false, res["memory_released"])
	listed := h.ok(ipc.OpList, nil)["sandboxes"].([]any)
	require.Len(t, listed, 1)
	assert.Equal(t, "ready", listed[0].(map[string]any)["state"])
	assert.EqualValues(t, 0, h.ok(ipc.OpHealth, nil)["paused"])

	_, err = h.call(ipc.OpPause, map[string]any{})
	require.NotNil(t, err)
	assert.Equal(t, ipc.CodeBadRequest, err.Code, "pause names a sandbox")
	_, err = h.call(ipc.OpResume, map[string]any{"sandbox": "sc-0000000000000000"})
	require.NotNil(t, err)
	assert.Equal(t, ipc.CodeNotFound, err.Code)
}
