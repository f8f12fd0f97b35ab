package service

import (
	"context"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// topKeys are the msgpack keys of a request type's own fields.
func topKeys(v any) []string {
	t := reflect.TypeOf(v)
	out := []string{}
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("msgpack"), ","); name != "" && name != "-" {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// The arguments every op reads are exactly the keys of its request type in
// ipc/api: one list of names for the daemon, the Go client and the docs.
// An op asked with no arguments at all still asks for each (the Args
// accessors record the keys they look up).
func TestOpsReadTheRequestTypesKeys(t *testing.T) {
	h := newHarness(t, nil)
	h.peer.UID = 0 // an admin, for gc
	h.svc.policy = &Policy{AdminUIDs: []uint32{0}}
	for op, req := range api.Requests {
		r := ipc.Request{V: 1, ID: 1, Op: op, Args: ipc.NewArgs(nil)}
		_, _ = h.svc.Handle(context.Background(), h.peer, &r)
		assert.Equal(t, topKeys(req), r.Args.Asked(), "op %s reads other arguments than api's request type names", op)
	}
}
