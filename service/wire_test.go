package service

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// Every op refuses a key its request type in ipc/api does not name, and
// takes every key it names: the type is the op's one list of arguments,
// for the daemon, the Go client and the docs.
func TestOpsTakeExactlyTheirRequestTypesKeys(t *testing.T) {
	h := newHarness(t, nil)
	h.peer.UID = 0 // an admin, for gc and the image ops
	h.svc.policy = &Policy{AdminUIDs: []uint32{0}}
	for op, req := range api.Requests {
		r := ipc.Request{V: 1, ID: 1, Op: op, Args: ipc.NewArgs(map[string]any{"no_such_argument": 1})}
		_, err := h.svc.Handle(context.Background(), h.peer, &r)
		var we *ipc.Error
		require.ErrorAs(t, err, &we, "op %s", op)
		assert.Equal(t, ipc.CodeBadRequest, we.Code, "op %s", op)
		assert.Contains(t, we.Message, `unknown argument "no_such_argument"`, "op %s", op)

		// Each key of the type is read: given with a value of a type no
		// field has, it is refused by name (never "unknown").
		for _, key := range topKeys(req) {
			r := ipc.Request{V: 1, ID: 1, Op: op, Args: ipc.NewArgs(map[string]any{key: struct{}{}})}
			_, err := h.svc.Handle(context.Background(), h.peer, &r)
			require.ErrorAs(t, err, &we, "op %s key %s", op, key)
			assert.NotContains(t, we.Message, "unknown argument", "op %s does not read %q", op, key)
		}
	}
}

// topKeys are the msgpack keys of a request type's own fields.
func topKeys(v any) []string {
	t := reflect.TypeOf(v)
	var out []string
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("msgpack"), ","); name != "" && name != "-" {
			out = append(out, name)
		}
	}
	return out
}

// The bounds the request types' wire tags spell are the ones the rest of
// the daemon enforces.
func TestWireTagsSpellTheBounds(t *testing.T) {
	assert.Equal(t, lifecycle.MaxLabels, api.MaxLabels)
	assert.Equal(t, lifecycle.MaxTags, api.MaxTags)
	bound := func(v any, field string) int {
		f, ok := reflect.TypeOf(v).FieldByName(field)
		require.True(t, ok, field)
		for opt := range strings.SplitSeq(f.Tag.Get("wire"), ",") {
			if n, ok := strings.CutPrefix(opt, "max="); ok {
				x, err := strconv.ParseInt(n, 0, 64)
				require.NoError(t, err)
				return int(x)
			}
		}
		t.Fatalf("%T.%s has no max", v, field)
		return 0
	}
	assert.Equal(t, api.MaxLabels, bound(api.CreateRequest{}, "Labels"))
	assert.Equal(t, api.MaxTags, bound(api.WriteTagsRequest{}, "Tags"))
	assert.Equal(t, api.MaxEnv, bound(api.Spec{}, "Env"))
	assert.Equal(t, api.MaxEnv, bound(api.RunCommandRequest{}, "Env"))
	assert.Equal(t, api.MaxArgv, bound(api.RunCommandRequest{}, "Argv"))
	assert.Equal(t, api.MaxEgress, bound(api.Spec{}, "AllowEgressTo"))
	assert.Equal(t, api.MaxEgress, bound(api.Spec{}, "AllowEgressToCIDRs"))
	assert.Equal(t, api.MaxCPUs, bound(api.Resources{}, "CPUs"))
	assert.Equal(t, api.MaxPIDs, bound(api.Resources{}, "PIDs"))
}
