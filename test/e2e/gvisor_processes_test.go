package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// A durable process on the gvisor backend outlives a kill -9 of the
// daemon: it goes on writing while no daemon is up, one ends then and
// leaves its exit status, and the restarted daemon re-attaches to the
// sandbox's init (the same gVisor sandbox), whose other process still runs
// and takes signals. A stop with SIGTERM and a start leave it running too.
func TestGVisorDurableProcessOutlivesTheDaemon(t *testing.T) {
	runsc := testRunsc(t)
	d := startDaemon(t, "", "--backend", "gvisor", "--gvisor-runsc-path", runsc)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := d.client(t)
	hello, err := c.Hello(ctx, api.HelloRequest{})
	require.NoError(t, err)
	assert.Contains(t, hello.Features, "processes")
	created, err := c.Create(ctx, api.CreateRequest{Spec: &api.Spec{Owner: "dag/run"}, TTLS: 600})
	require.NoError(t, err)
	id := created.Sandbox
	job, err := c.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Command: counting(20, 7)})
	require.NoError(t, err)
	server, err := c.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Name: "server", Command: "trap 'echo bye; exit 0' TERM; echo up; while :; do sleep 0.1; done"})
	require.NoError(t, err)
	r, err := c.ReadOutput(ctx, api.ReadOutputRequest{Sandbox: id, Process: job.Process, Stream: "stdout", WaitS: 20})
	require.NoError(t, err)
	require.NotEmpty(t, r.Data, "the job started writing")
	c.Close()
	_, listedBefore, _ := gvisorState(t, runsc, d.stateDir)

	d.kill9()
	d.exitRecorded(t, id, job.Process) // it ended while no daemon was up
	d.restart()

	out, end := readAll(t, ctx, d, id, job.Process)
	assert.Equal(t, countedLines(20), out, "every line, the ones written while no daemon was up too")
	require.NotNil(t, end.ExitCode)
	assert.Equal(t, 7, *end.ExitCode)
	assert.Equal(t, "exited", end.Reason)
	_, listedAfter, _ := gvisorState(t, runsc, d.stateDir)
	assert.Equal(t, listedBefore, listedAfter, "the same gVisor sandbox runs on")

	c = d.client(t)
	info, err := c.WaitProcess(ctx, api.WaitProcessRequest{Sandbox: id, Process: server.Process})
	require.NoError(t, err)
	assert.True(t, info.Running, "the server outlived the daemon")
	again, err := c.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Name: "server", Command: "echo never"})
	require.NoError(t, err)
	assert.True(t, again.Existing)
	assert.Equal(t, server.Process, again.Process)
	res := run(t, c, id, "echo still here")
	assert.Equal(t, "still here\n", string(res.Stdout))
	c.Close()

	d.stop()
	d.restart()
	c = d.client(t)
	info, err = c.WaitProcess(ctx, api.WaitProcessRequest{Sandbox: id, Process: server.Process})
	require.NoError(t, err)
	assert.True(t, info.Running, "the server outlived a stop and start of the daemon")
	require.NoError(t, c.SignalProcess(ctx, api.SignalProcessRequest{Sandbox: id, Process: server.Process, Signal: "TERM"}))
	info, err = c.WaitProcess(ctx, api.WaitProcessRequest{Sandbox: id, Process: server.Process, TimeoutS: 20})
	require.NoError(t, err)
	require.NotNil(t, info.ExitCode)
	assert.Equal(t, 0, *info.ExitCode)
	out, _ = readAll(t, ctx, d, id, server.Process)
	assert.Equal(t, "up\nbye\n", out)

	require.NoError(t, c.Destroy(ctx, id))
	dirs, listed, procs := gvisorState(t, runsc, d.stateDir)
	assert.Empty(t, dirs)
	assert.Empty(t, listed)
	assert.Empty(t, procs, "runsc processes of the destroyed sandbox")
	if t.Failed() {
		t.Logf("daemon log:\n%s", d.Logs())
	}
}
