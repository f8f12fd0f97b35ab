package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// Code contexts through the socket on the gvisor backend: hello says code,
// the operator's preloads are in every fresh context, state and rich
// results, an interrupt that keeps the context; then a kill -9 of the
// daemon while a cell runs: the restarted daemon re-attaches to the same
// gVisor sandbox, whose contexts kept their variables, and the cell the
// dead daemon asked for ran to its end there.
func TestGVisorCodeContextsOutliveTheDaemon(t *testing.T) {
	runsc := testRunsc(t)
	base := baseDir(t)
	conf := filepath.Join(base, "config.toml")
	require.NoError(t, os.WriteFile(conf, []byte("[code]\npreload = [\"fractions\"]\n"), 0o644))
	d := startDaemon(t, base, "--config", conf, "--backend", "gvisor", "--gvisor-runsc-path", runsc)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := d.client(t)
	hello, err := c.Hello(ctx, api.HelloRequest{})
	require.NoError(t, err)
	assert.Contains(t, hello.Features, "code")
	created, err := c.Create(ctx, api.CreateRequest{Spec: &api.Spec{Owner: "dag/run"}, TTLS: 600})
	require.NoError(t, err)
	id := created.Sandbox

	last := func(res api.RunCodeResult) any {
		if len(res.Results) == 0 {
			return nil
		}
		return res.Results[len(res.Results)-1]["text/plain"]
	}
	res, err := c.RunCode(ctx, api.RunCodeRequest{Sandbox: id, Code: "import sys, os\nrows = [1, 2, 3]\nprint('loaded')\n('fractions' in sys.modules, os.getuid())"})
	require.NoError(t, err)
	assert.Equal(t, "loaded\n", string(res.Stdout))
	assert.Equal(t, "(True, 1000)", last(res), "the preloaded module is there before the cell imports it; the guest runs it")
	assert.Equal(t, 1, res.ExecutionCount)
	res, err = c.RunCode(ctx, api.RunCodeRequest{Sandbox: id, Code: "class H:\n    def _repr_html_(self): return '<i>h</i>'\ndisplay(H())\nsum(rows)"})
	require.NoError(t, err)
	require.Len(t, res.Results, 2)
	assert.Equal(t, "<i>h</i>", res.Results[0]["text/html"])
	assert.Equal(t, "6", res.Results[1]["text/plain"])
	res, err = c.RunCode(ctx, api.RunCodeRequest{Sandbox: id, Code: "import time\nwhile True: time.sleep(0.05)", TimeoutS: 0.5})
	require.NoError(t, err)
	assert.Equal(t, "timed_out", res.Reason)
	assert.False(t, res.ContextLost)
	require.NotNil(t, res.Error)
	assert.Equal(t, "KeyboardInterrupt", res.Error.Name)

	// A cell runs as the daemon is killed.
	running := make(chan error, 1)
	go func() {
		_, err := c.RunCode(ctx, api.RunCodeRequest{Sandbox: id, Context: "slow", Code: "import time\ntime.sleep(3)\nafter = len(rows) if 'rows' in globals() else 'fresh'", TimeoutS: 60})
		running <- err
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		list, err := d.client(t).ListContexts(ctx, id)
		require.NoError(t, err)
		if len(list.Contexts) == 2 && list.Contexts[1].Running {
			break
		}
		require.True(t, time.Now().Before(deadline), "the slow cell did not start: %+v", list)
		time.Sleep(50 * time.Millisecond)
	}
	_, listedBefore, _ := gvisorState(t, runsc, d.stateDir)
	d.kill9()
	assert.Error(t, <-running, "the cell's caller lost its daemon")
	c.Close()
	d.restart()
	c = d.client(t)
	_, listedAfter, _ := gvisorState(t, runsc, d.stateDir)
	assert.Equal(t, listedBefore, listedAfter, "the same gVisor sandbox runs on")

	res, err = c.RunCode(ctx, api.RunCodeRequest{Sandbox: id, Code: "len(rows)"})
	require.NoError(t, err)
	assert.Equal(t, "3", last(res), "the variables outlived a kill -9 of the daemon")
	assert.Equal(t, 4, res.ExecutionCount)
	for {
		list, err := c.ListContexts(ctx, id)
		require.NoError(t, err)
		require.Len(t, list.Contexts, 2)
		if !list.Contexts[1].Running {
			assert.Equal(t, api.ContextInfo{Context: "slow", ExecutionCount: 1}, list.Contexts[1])
			break
		}
		require.True(t, time.Now().Before(deadline), "the dead daemon's cell did not end: %+v", list)
		time.Sleep(100 * time.Millisecond)
	}
	res, err = c.RunCode(ctx, api.RunCodeRequest{Sandbox: id, Context: "slow", Code: "after"})
	require.NoError(t, err)
	assert.Equal(t, "'fresh'", last(res), "the dead daemon's cell ran to its end, in a context of its own")
	require.NoError(t, c.RestartContext(ctx, api.ContextRequest{Sandbox: id, Context: "default"}))
	list, err := c.ListContexts(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, []api.ContextInfo{{Context: "default"}, {Context: "slow", ExecutionCount: 2}}, list.Contexts, "a restarted context is still listed, fresh")
	res, err = c.RunCode(ctx, api.RunCodeRequest{Sandbox: id, Code: "'rows' in globals()"})
	require.NoError(t, err)
	assert.Equal(t, "False", last(res))
	assert.Equal(t, 1, res.ExecutionCount)

	require.NoError(t, c.Destroy(ctx, id))
	dirs, listed, procs := gvisorState(t, runsc, d.stateDir)
	assert.Empty(t, dirs)
	assert.Empty(t, listed)
	assert.Empty(t, procs, "runsc processes of the destroyed sandbox")
	if t.Failed() {
		t.Logf("daemon log:\n%s", d.Logs())
	}
}
