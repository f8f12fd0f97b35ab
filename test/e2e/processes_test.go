package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// A durable process over the wire: started by one client that then goes
// away, followed by another from an offset, signalled, listed, and every
// refusal with its own code.
func TestDurableProcessOverTheWire(t *testing.T) {
	d := startDaemon(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	first := d.client(t)
	hello, err := first.Hello(ctx, api.HelloRequest{})
	require.NoError(t, err)
	assert.Contains(t, hello.Features, "processes")
	created, err := first.Create(ctx, api.CreateRequest{Spec: &api.Spec{Owner: "dag/run-1"}, TTLS: 600})
	require.NoError(t, err)
	id := created.Sandbox

	started, err := first.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Name: "job",
		Command: "for i in 1 2 3; do echo line $i; sleep 0.3; done; echo done >&2; exit 4"})
	require.NoError(t, err)
	assert.True(t, started.Running)
	assert.False(t, started.Existing)
	first.Close() // the client that started it goes away

	c := d.client(t)
	again, err := c.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Name: "job", Command: "echo never"})
	require.NoError(t, err)
	assert.Equal(t, started.Process, again.Process)
	assert.True(t, again.Existing)

	var out []byte
	offset := int64(0)
	for {
		r, err := c.ReadOutput(ctx, api.ReadOutputRequest{Sandbox: id, Process: started.Process, Stream: "stdout", Offset: offset, WaitS: 20})
		require.NoError(t, err)
		out, offset = append(out, r.Data...), r.NextOffset
		if !r.Running && len(r.Data) == 0 {
			require.NotNil(t, r.ExitCode)
			assert.Equal(t, 4, *r.ExitCode)
			assert.Equal(t, "exited", r.Reason)
			break
		}
	}
	assert.Equal(t, "line 1\nline 2\nline 3\n", string(out))
	info, err := c.WaitProcess(ctx, api.WaitProcessRequest{Sandbox: id, Process: started.Process})
	require.NoError(t, err)
	assert.False(t, info.Running)
	require.NotNil(t, info.EndedAt)
	assert.EqualValues(t, 5, info.StderrBytes)
	assert.Equal(t, "job", info.Name)

	sleeper, err := c.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Argv: []string{"sleep", "600"}})
	require.NoError(t, err)
	waited, err := c.WaitProcess(ctx, api.WaitProcessRequest{Sandbox: id, Process: sleeper.Process, TimeoutS: 0.2})
	require.NoError(t, err)
	assert.True(t, waited.Running, "still running at the timeout")
	require.NoError(t, c.SignalProcess(ctx, api.SignalProcessRequest{Sandbox: id, Process: sleeper.Process, Signal: "INT"}))
	waited, err = c.WaitProcess(ctx, api.WaitProcessRequest{Sandbox: id, Process: sleeper.Process, TimeoutS: 20})
	require.NoError(t, err)
	require.NotNil(t, waited.ExitCode)
	assert.Equal(t, 130, *waited.ExitCode)
	assert.Equal(t, "killed", waited.Reason)

	list, err := c.ListProcesses(ctx, id)
	require.NoError(t, err)
	require.Len(t, list.Processes, 2)
	assert.Equal(t, started.Process, list.Processes[0].Process)
	assert.Equal(t, []string{"sleep", "600"}, list.Processes[1].Argv)

	code := func(err error) string {
		var e *ipc.Error
		require.ErrorAs(t, err, &e)
		return e.Code
	}
	assert.Equal(t, ipc.CodeProcessEnded, code(c.SignalProcess(ctx, api.SignalProcessRequest{Sandbox: id, Process: sleeper.Process, Signal: "TERM"})))
	assert.Equal(t, ipc.CodeBadRequest, code(c.SignalProcess(ctx, api.SignalProcessRequest{Sandbox: id, Process: sleeper.Process, Signal: "STOP"})))
	_, err = c.WaitProcess(ctx, api.WaitProcessRequest{Sandbox: id, Process: "p-000000000000"})
	assert.Equal(t, ipc.CodeProcessNotFound, code(err))
	_, err = c.ReadOutput(ctx, api.ReadOutputRequest{Sandbox: id, Process: started.Process, Stream: "both"})
	assert.Equal(t, ipc.CodeBadRequest, code(err))
	_, err = c.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Command: "true", Name: "a/b"})
	assert.Equal(t, ipc.CodeBadRequest, code(err))
}

// A sandbox runs at most processes.max_running processes at once.
func TestDurableProcessesAreBounded(t *testing.T) {
	base := baseDir(t)
	conf := filepath.Join(base, "config.toml")
	require.NoError(t, os.WriteFile(conf, []byte("[processes]\nmax_running = 2\nmax_ended = 2\nlog_bytes = \"8KiB\"\n"), 0o644))
	d := startDaemon(t, base, "--config", conf)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := d.client(t)
	created, err := c.Create(ctx, api.CreateRequest{TTLS: 600})
	require.NoError(t, err)
	id := created.Sandbox
	var ids []string
	for range 2 {
		p, err := c.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Command: "sleep 600"})
		require.NoError(t, err)
		ids = append(ids, p.Process)
	}
	_, err = c.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Command: "sleep 600"})
	var e *ipc.Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, ipc.CodeQuotaExceeded, e.Code)
	assert.Equal(t, "processes_per_sandbox", e.Details["scope"])

	// A flood keeps the last log_bytes, at absolute offsets.
	require.NoError(t, c.SignalProcess(ctx, api.SignalProcessRequest{Sandbox: id, Process: ids[0], Signal: "KILL"}))
	_, err = c.WaitProcess(ctx, api.WaitProcessRequest{Sandbox: id, Process: ids[0], TimeoutS: 30})
	require.NoError(t, err)
	flood, err := c.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Command: "seq 1 100000"})
	require.NoError(t, err)
	done, err := c.WaitProcess(ctx, api.WaitProcessRequest{Sandbox: id, Process: flood.Process, TimeoutS: 60})
	require.NoError(t, err)
	require.False(t, done.Running)
	r, err := c.ReadOutput(ctx, api.ReadOutputRequest{Sandbox: id, Process: flood.Process, Stream: "stdout"})
	require.NoError(t, err)
	assert.Equal(t, done.StdoutBytes-8<<10, r.Offset)
	assert.Equal(t, r.Offset, r.Dropped)
	assert.True(t, strings.HasSuffix(string(r.Data), "99999\n100000\n"))

	// Ended records beyond max_ended are dropped, oldest first.
	for range 3 {
		p, err := c.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Command: "true"})
		require.NoError(t, err)
		_, err = c.WaitProcess(ctx, api.WaitProcessRequest{Sandbox: id, Process: p.Process, TimeoutS: 30})
		require.NoError(t, err)
	}
	list, err := c.ListProcesses(ctx, id)
	require.NoError(t, err)
	ended := 0
	for _, p := range list.Processes {
		if !p.Running {
			ended++
		}
	}
	assert.LessOrEqual(t, ended, 3, "max_ended 2, plus the one a start may have made room for")
	assert.False(t, slices.ContainsFunc(list.Processes, func(p api.ProcessInfo) bool { return p.Process == ids[0] }), "the oldest ended record was dropped")
}

// A background process writes 1 GiB while a follower reads it: the daemon
// reads only what it is asked for, so its peak resident set does not move
// with the flood, and the log keeps its last processes.log_bytes on disk
// (offsets stay absolute: a read from 0 says what was dropped).
func TestDurableProcessFloodOf1GiBIsBounded(t *testing.T) {
	const (
		flood    = 1 << 30
		logBytes = 1 << 20
	)
	base := baseDir(t)
	conf := filepath.Join(base, "config.toml")
	require.NoError(t, os.WriteFile(conf, []byte("[processes]\nlog_bytes = \"1MiB\"\n"), 0o644))
	d := startDaemon(t, base, "--config", conf)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := d.client(t)
	created, err := c.Create(ctx, api.CreateRequest{TTLS: 600})
	require.NoError(t, err)
	id := created.Sandbox
	before := vmHWM(t, d.cmd.Process.Pid)

	p, err := c.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Command: "head -c 1073741824 /dev/zero"})
	require.NoError(t, err)
	// Follow it as a client does, asking for the most a read may return.
	offset, reads := int64(0), 0
	for {
		r, err := c.ReadOutput(ctx, api.ReadOutputRequest{Sandbox: id, Process: p.Process, Stream: "stdout", Offset: offset, WaitS: 5})
		require.NoError(t, err)
		reads++
		offset = r.NextOffset
		if !r.Running && len(r.Data) == 0 {
			require.NotNil(t, r.ExitCode)
			assert.Equal(t, 0, *r.ExitCode)
			break
		}
	}
	info, err := c.WaitProcess(ctx, api.WaitProcessRequest{Sandbox: id, Process: p.Process})
	require.NoError(t, err)
	assert.EqualValues(t, flood, info.StdoutBytes)
	assert.EqualValues(t, flood, offset, "the follower reached the end")

	r, err := c.ReadOutput(ctx, api.ReadOutputRequest{Sandbox: id, Process: p.Process, Stream: "stdout", Offset: 0})
	require.NoError(t, err)
	assert.EqualValues(t, flood-logBytes, r.Offset, "the oldest byte kept")
	assert.EqualValues(t, flood-logBytes, r.Dropped)

	// The log on disk: the ring and its header, however much went through.
	logs, err := filepath.Glob(filepath.Join(d.stateDir, "*", id, "procs", p.Process, "stdout"))
	require.NoError(t, err)
	require.Len(t, logs, 1, "the process's stdout log under the state directory")
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(logs[0], &st))
	assert.LessOrEqual(t, st.Blocks*512, int64(logBytes+64<<10), "disk the 1 GiB log takes")
	grew := vmHWM(t, d.cmd.Process.Pid) - before
	t.Logf("1 GiB followed in %d reads; the daemon's peak resident set grew %d KiB; the log takes %d KiB", reads, grew>>10, st.Blocks/2)
	assert.Less(t, grew, int64(64<<20), "the daemon's peak resident set grew with the flood")
}
