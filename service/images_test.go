package service

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
)

// Importing and removing images is an operator's act: a client that is
// not an admin is refused before anything is read or opened; listing and
// inspecting are for everyone.
func TestImageOpsForAdminsOnly(t *testing.T) {
	h := newHarness(t, nil)
	for op, args := range map[string]map[string]any{
		ipc.OpImageImportBegin: {"name": "numpy"},
		ipc.OpImageImportData:  {"upload": "up-1", "offset": 0, "data": []byte("x")},
		ipc.OpImageImportEnd:   {"upload": "up-1"},
		ipc.OpImageRm:          {"name": "numpy"},
	} {
		_, err := h.call(op, args)
		require.NotNil(t, err, op)
		assert.Equal(t, ipc.CodeUnauthorized, err.Code, "%s: %s", op, err.Message)
	}
	ls := h.ok(ipc.OpImageLs, nil)
	images := ls["images"].([]any)
	require.Len(t, images, 1)
	host := images[0].(map[string]any)
	assert.Equal(t, "host", host["name"])
	assert.Equal(t, true, host["builtin"])
	assert.Equal(t, true, host["default"])
	in := h.ok(ipc.OpImageInspect, map[string]any{"name": "host"})
	assert.Equal(t, "host", in["image"].(map[string]any)["name"])
	_, err := h.call(ipc.OpImageInspect, map[string]any{"name": "numpy"})
	require.NotNil(t, err)
	assert.Equal(t, ipc.CodeImageNotFound, err.Code)
	assert.Equal(t, "[host]", fmt.Sprint(err.Details["images"]))

	// An admin of a daemon without a store (a backend that runs no
	// image) is told so; host cannot be removed or taken.
	h.peer.UID = 0
	h.svc.policy = &Policy{AdminUIDs: []uint32{0}}
	_, err = h.call(ipc.OpImageImportBegin, map[string]any{"name": "numpy"})
	require.NotNil(t, err)
	assert.Equal(t, ipc.CodeUnsupported, err.Code)
	_, err = h.call(ipc.OpImageImportBegin, map[string]any{"name": "host"})
	require.NotNil(t, err)
	assert.Equal(t, ipc.CodeImageExists, err.Code)
	_, err = h.call(ipc.OpImageRm, map[string]any{"name": "host"})
	require.NotNil(t, err)
	assert.Equal(t, ipc.CodeBadRequest, err.Code)

	// create names an image; an unknown one lists those there are.
	_, err = h.call(ipc.OpCreate, map[string]any{"image": "pandas"})
	require.NotNil(t, err)
	assert.Equal(t, ipc.CodeImageNotFound, err.Code)
	assert.Equal(t, "[host]", fmt.Sprint(err.Details["images"]))
	res := h.ok(ipc.OpCreate, map[string]any{"image": "host"})
	assert.Equal(t, "host", res["image"])
	hello := h.ok(ipc.OpHello, nil)
	assert.Equal(t, []any{"host"}, hello["images"])
	assert.Equal(t, "host", hello["default_image"])
}
