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
	list, err = c.ListContexts(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, []api.ContextInfo{{Context: "default"}}, list.Contexts, "a restarted context is still listed, fresh")
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

// Hostile cells against the real daemon: a gibibyte of stdout, a repr of
// 300 MiB, an image of 200 MiB, ten thousand displays, and frames the cell
// writes itself on its results stream (one that says it is 4 GiB long, and
// a flood of frames each as large as may be kept). Each result stays
// within max_output_bytes and says what it left out; the daemon's peak
// resident set stays far below its memory bound, as if the cells had
// written nothing (everything past the bounds is read and dropped, never
// held); the context and the sandbox live on.
func TestCodeHostileCellsKeepTheDaemonBounded(t *testing.T) {
	hostileCells(t, startDaemon(t, ""))
}

// The same on the gvisor backend, where a cell's streams come out of the
// sandbox through its init's stream (copied in cell output frames).
func TestGVisorCodeHostileCellsKeepTheDaemonBounded(t *testing.T) {
	runsc := testRunsc(t)
	hostileCells(t, startDaemon(t, "", "--backend", "gvisor", "--gvisor-runsc-path", runsc))
}

func hostileCells(t *testing.T, d *daemon) {
	bound := loggedMemoryBound(t, d.Logs())
	pid := d.cmd.Process.Pid
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := d.client(t)
	created, err := c.Create(ctx, api.CreateRequest{TTLS: 600})
	require.NoError(t, err)
	id := created.Sandbox
	const maxOut = 4 << 20 // the daemon's cap
	cell := func(code string) api.RunCodeResult {
		t.Helper()
		mo := maxOut
		res, err := c.RunCode(ctx, api.RunCodeRequest{Sandbox: id, Code: code, MaxOutputBytes: &mo, TimeoutS: 120})
		require.NoError(t, err)
		assert.False(t, res.ContextLost, "the context was lost: %+v", res.Error)
		return res
	}
	cell("1")
	idle := vmHWM(t, pid)

	res := cell("import os\nb = b'x' * (1 << 20)\nfor i in range(1024):\n    os.write(1, b)\n'flooded'")
	assert.True(t, res.StdoutTruncated)
	assert.LessOrEqual(t, len(res.Stdout), maxOut)
	res = cell("class Huge:\n    def __repr__(self): return 'y' * (300 << 20)\nHuge()")
	assert.True(t, res.ResultsTruncated)
	res = cell("class Giant:\n    def _repr_png_(self): return b'\\x89PNG' + bytes(200 << 20)\n    def __repr__(self): return 'Giant()'\nGiant()")
	assert.True(t, res.ResultsTruncated)
	require.Len(t, res.Results, 1)
	assert.Equal(t, "Giant()", res.Results[0]["text/plain"])
	res = cell("for i in range(10000):\n    display(i)\n'after'")
	assert.True(t, res.ResultsTruncated)
	assert.Equal(t, "'after'", res.Results[len(res.Results)-1]["text/plain"])
	// The cell's own frames, written on its results stream (the stream
	// socket among its descriptors): a frame that says it is 4 GiB long
	// and 100 MiB behind it; then 64 frames of almost 4 MiB each.
	res = cell(`import os, socket, struct, json
def results():
    for fd in range(3, 64):
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            continue
        kind = s.type
        s.detach()
        if kind == socket.SOCK_STREAM:
            return fd
fd = results()
one = json.dumps({"t": "display", "data": {"text/plain": "z" * ((4 << 20) - 64)}}).encode()
for i in range(64):
    os.write(fd, struct.pack(">I", len(one)) + one)
os.write(fd, b"\xff\xff\xff\xff")
junk = b"j" * (1 << 20)
for i in range(100):
    os.write(fd, junk)
'wrote'`)
	assert.True(t, res.ResultsTruncated)
	assert.Equal(t, 6, res.ExecutionCount)

	peak := vmHWM(t, pid)
	t.Logf("the daemon's peak resident set: %d MiB before the hostile cells, %d MiB after; its bound %d MiB", idle>>20, peak>>20, bound>>20)
	assert.Less(t, peak, bound, "the daemon's peak resident set passed its bound")
	// What a cell may make the daemon hold: its two streams' tails, its
	// results (decoded and encoded) and one frame being read; 128 MiB is
	// several times that, and far less than any of the floods.
	assert.Less(t, peak-idle, int64(128<<20), "the hostile cells grew the daemon's peak resident set")

	res = cell("'alive'")
	assert.Equal(t, "'alive'", res.Results[0]["text/plain"])
	assert.Equal(t, 7, res.ExecutionCount)
	out, err := c.RunCommand(ctx, api.RunCommandRequest{Sandbox: id, Command: "echo still", TimeoutS: 30})
	require.NoError(t, err)
	assert.Equal(t, "still\n", string(out.Stdout))
}
