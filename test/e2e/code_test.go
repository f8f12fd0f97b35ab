package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// Code contexts over the wire: state between calls, rich results, the
// ops on contexts and their refusals, and a context that outlives a kill
// -9 of the daemon (it is a process of its sandbox).
func TestCodeContextsOverTheWire(t *testing.T) {
	d := startDaemon(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := d.client(t)
	hello, err := c.Hello(ctx, api.HelloRequest{})
	require.NoError(t, err)
	assert.Contains(t, hello.Features, "code")
	created, err := c.Create(ctx, api.CreateRequest{TTLS: 600})
	require.NoError(t, err)
	id := created.Sandbox

	res, err := c.RunCode(ctx, api.RunCodeRequest{Sandbox: id, Code: "import json\nrows = [1, 2, 3]\nprint('loaded')"})
	require.NoError(t, err)
	assert.Equal(t, "loaded\n", string(res.Stdout))
	assert.Equal(t, 1, res.ExecutionCount)
	assert.Equal(t, "ok", res.Reason)
	res, err = c.RunCode(ctx, api.RunCodeRequest{Sandbox: id, Code: "class H:\n    def _repr_html_(self): return '<i>h</i>'\ndisplay(H())\nsum(rows)"})
	require.NoError(t, err)
	require.Len(t, res.Results, 2)
	assert.Equal(t, "<i>h</i>", res.Results[0]["text/html"])
	assert.Equal(t, "6", res.Results[1]["text/plain"])
	res, err = c.RunCode(ctx, api.RunCodeRequest{Sandbox: id, Code: "rows[9]"})
	require.NoError(t, err)
	require.NotNil(t, res.Error)
	assert.Equal(t, "IndexError", res.Error.Name)
	assert.Equal(t, "error", res.Reason)

	// The context outlives the daemon.
	c.Close()
	d.kill9()
	d.restart()
	c = d.client(t)
	res, err = c.RunCode(ctx, api.RunCodeRequest{Sandbox: id, Code: "len(rows)"})
	require.NoError(t, err)
	require.NotEmpty(t, res.Results)
	assert.Equal(t, "3", res.Results[len(res.Results)-1]["text/plain"], "the variables outlived a kill -9 of the daemon")
	assert.Equal(t, 4, res.ExecutionCount)

	list, err := c.ListContexts(ctx, id)
	require.NoError(t, err)
	require.Len(t, list.Contexts, 1)
	assert.Equal(t, api.ContextInfo{Context: "default", ExecutionCount: 4}, list.Contexts[0])
	require.NoError(t, c.RestartContext(ctx, api.ContextRequest{Sandbox: id, Context: "default"}))
	res, err = c.RunCode(ctx, api.RunCodeRequest{Sandbox: id, Code: "'rows' in globals()"})
	require.NoError(t, err)
	assert.Equal(t, "False", res.Results[0]["text/plain"])
	assert.Equal(t, 1, res.ExecutionCount)

	code := func(err error) string {
		var e *ipc.Error
		require.ErrorAs(t, err, &e)
		return e.Code
	}
	assert.Equal(t, ipc.CodeContextNotFound, code(c.DeleteContext(ctx, api.ContextRequest{Sandbox: id, Context: "nope"})))
	_, err = c.RunCode(ctx, api.RunCodeRequest{Sandbox: id, Code: "1", Context: "bad name"})
	assert.Equal(t, ipc.CodeBadRequest, code(err))
	_, err = c.RunCode(ctx, api.RunCodeRequest{Sandbox: id})
	assert.Equal(t, ipc.CodeBadRequest, code(err))
}
