package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/proclog"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// counting is a process that writes lines 0..n-1, one every 100 ms, then
// exits with code.
func counting(n, code int) string {
	return fmt.Sprintf("i=0; while [ $i -lt %d ]; do echo line $i; i=$((i+1)); sleep 0.1; done; exit %d", n, code)
}

func countedLines(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	return b.String()
}

// exitRecorded waits, with no daemon up, until the keeper of process proc
// in sandbox id has written its exit record on the host.
func (d *daemon) exitRecorded(t *testing.T, id, proc string) {
	t.Helper()
	path := filepath.Join(d.backendDir(), id, "procs", proc, "exit")
	deadline := time.Now().Add(time.Minute)
	for {
		if b, err := os.ReadFile(path); err == nil {
			if _, err := proclog.DecodeExit(b); err == nil {
				return
			}
		}
		require.True(t, time.Now().Before(deadline), "no exit record for %s within a minute", proc)
		time.Sleep(20 * time.Millisecond)
	}
}

func readAll(t *testing.T, ctx context.Context, d *daemon, id, proc string) (string, api.ReadOutputResult) {
	t.Helper()
	c := d.client(t)
	defer c.Close()
	var out []byte
	offset := int64(0)
	for {
		r, err := c.ReadOutput(ctx, api.ReadOutputRequest{Sandbox: id, Process: proc, Stream: "stdout", Offset: offset, WaitS: 30})
		require.NoError(t, err)
		require.Zero(t, r.Dropped)
		out, offset = append(out, r.Data...), r.NextOffset
		if !r.Running && len(r.Data) == 0 {
			return string(out), r
		}
	}
}

// A durable process outlives a kill -9 of the daemon: it goes on writing
// while no daemon is up, one ends then and leaves its exit status, and the
// restarted daemon re-attaches to the sandbox's init, whose other process
// still runs and still takes signals.
func TestDurableProcessOutlivesADaemonKill9(t *testing.T) {
	d := startDaemon(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := d.client(t)
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

	d.kill9()
	d.exitRecorded(t, id, job.Process) // it ended while no daemon was up
	d.restart()

	out, end := readAll(t, ctx, d, id, job.Process)
	assert.Equal(t, countedLines(20), out, "every line, the ones written while no daemon was up too")
	require.NotNil(t, end.ExitCode)
	assert.Equal(t, 7, *end.ExitCode)
	assert.Equal(t, "exited", end.Reason)

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
	require.NoError(t, c.SignalProcess(ctx, api.SignalProcessRequest{Sandbox: id, Process: server.Process, Signal: "TERM"}))
	info, err = c.WaitProcess(ctx, api.WaitProcessRequest{Sandbox: id, Process: server.Process, TimeoutS: 20})
	require.NoError(t, err)
	require.NotNil(t, info.ExitCode)
	assert.Equal(t, 0, *info.ExitCode)
	out, _ = readAll(t, ctx, d, id, server.Process)
	assert.Equal(t, "up\nbye\n", out)
}

// A daemon stopped with SIGTERM (a restart, an upgrade) leaves a kept
// sandbox's processes running too; a connection-bound sandbox's end with
// it.
func TestDurableProcessOutlivesADaemonRestart(t *testing.T) {
	d := startDaemon(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := d.client(t)
	created, err := c.Create(ctx, api.CreateRequest{TTLS: 600})
	require.NoError(t, err)
	job, err := c.StartCommand(ctx, api.StartCommandRequest{Sandbox: created.Sandbox, Command: counting(30, 0)})
	require.NoError(t, err)
	bound, err := c.Create(ctx, api.CreateRequest{})
	require.NoError(t, err)
	require.True(t, bound.ConnBound)
	tok := fmt.Sprint(700000 + time.Now().UnixNano()%100000)
	_, err = c.StartCommand(ctx, api.StartCommandRequest{Sandbox: bound.Sandbox, Command: "sleep " + tok})
	require.NoError(t, err)
	c.Close()
	d.stop()
	d.restart()
	out, end := readAll(t, ctx, d, created.Sandbox, job.Process)
	assert.Equal(t, countedLines(30), out)
	require.NotNil(t, end.ExitCode)
	assert.Equal(t, 0, *end.ExitCode)
	for _, p := range processesMatching("sleep " + tok) {
		t.Errorf("the connection-bound sandbox's process outlived it: pid %d", p)
	}
}

// The daemon killed in the moment between a process's end and its exit
// record (the keeper stopped there by its failpoint): the record is written
// with no daemon up, and the next daemon reports the exit.
func TestDurableProcessExitRecordedAcrossAKill9AtItsEnd(t *testing.T) {
	d := startDaemonEnv(t, "", []string{"SANDBOX_SIDECAR_KEEPER_FAILPOINT=exited"})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := d.client(t)
	created, err := c.Create(ctx, api.CreateRequest{TTLS: 600})
	require.NoError(t, err)
	id := created.Sandbox
	p, err := c.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Command: "echo last words; exit 5"})
	require.NoError(t, err)
	var keeper int
	eventually(t, time.Minute, "the keeper stopped at its failpoint", func() bool {
		keeper = stoppedProcessNamed(agent.KeeperFailpointName)
		return keeper > 0
	})
	info, err := c.WaitProcess(ctx, api.WaitProcessRequest{Sandbox: id, Process: p.Process})
	require.NoError(t, err)
	assert.True(t, info.Running, "the process ended, its record is not written: it still counts as running")
	c.Close()

	d.kill9()
	require.NoError(t, syscall.Kill(keeper, syscall.SIGCONT))
	d.exitRecorded(t, id, p.Process)
	d.restart()

	c = d.client(t)
	info, err = c.WaitProcess(ctx, api.WaitProcessRequest{Sandbox: id, Process: p.Process, TimeoutS: 20})
	require.NoError(t, err)
	require.NotNil(t, info.ExitCode)
	assert.Equal(t, 5, *info.ExitCode)
	assert.Equal(t, "exited", info.Reason)
	out, _ := readAll(t, ctx, d, id, p.Process)
	assert.Equal(t, "last words\n", out)
}

// stoppedProcessNamed is the pid of a stopped process one of whose
// threads is named comm (a Go program names the thread it runs on), or 0.
func stoppedProcessNamed(comm string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		names, _ := filepath.Glob(filepath.Join("/proc", e.Name(), "task", "*", "comm"))
		named := false
		for _, n := range names {
			if b, err := os.ReadFile(n); err == nil && strings.TrimSpace(string(b)) == comm {
				named = true
			}
		}
		if !named {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i > 0 {
			if f := strings.Fields(s[i+1:]); len(f) > 0 && f[0] == "T" {
				return pid
			}
		}
	}
	return 0
}

// A sandbox whose init died while no daemon was up (killed here): its
// process is not running, and stays so once a command has started a new
// init there.
func TestDurableProcessOfAnInitThatDiedIsTerminated(t *testing.T) {
	d := startDaemon(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := d.client(t)
	created, err := c.Create(ctx, api.CreateRequest{TTLS: 600})
	require.NoError(t, err)
	p, err := c.StartCommand(ctx, api.StartCommandRequest{Sandbox: created.Sandbox, Command: "sleep 600"})
	require.NoError(t, err)
	c.Close()
	d.kill9()
	require.Positive(t, bwrap.KillSandboxes(filepath.Join(d.stateDir, "bwrap")))
	d.restart()
	c = d.client(t)
	for _, when := range []string{"before any command", "after a command started a new init"} {
		info, err := c.WaitProcess(ctx, api.WaitProcessRequest{Sandbox: created.Sandbox, Process: p.Process})
		require.NoError(t, err)
		assert.False(t, info.Running, when)
		assert.Equal(t, "sandbox_terminated", info.Reason, when)
		res := run(t, c, created.Sandbox, "true")
		require.Zero(t, res.ExitCode)
	}
}

// The per-uid bound on durable processes holds across a kill -9: the
// processes a previous daemon left running count against the next one's.
func TestDurableProcessQuotaCountsWhatOutlivedTheDaemon(t *testing.T) {
	base := baseDir(t)
	conf := filepath.Join(base, "config.toml")
	require.NoError(t, os.WriteFile(conf, []byte("[lifecycle]\nmax_processes = 4\nmax_processes_per_uid = 2\n"), 0o644))
	d := startDaemon(t, base, "--config", conf)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := d.client(t)
	created, err := c.Create(ctx, api.CreateRequest{TTLS: 600})
	require.NoError(t, err)
	id := created.Sandbox
	for range 2 {
		_, err := c.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Command: "sleep 600"})
		require.NoError(t, err)
	}
	c.Close()
	d.kill9()
	d.restart()

	c = d.client(t)
	_, err = c.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Command: "sleep 600"})
	var e *ipc.Error
	require.ErrorAs(t, err, &e, "a third process for a uid allowed two, after a restart")
	assert.Equal(t, ipc.CodeQuotaExceeded, e.Code)
	assert.Contains(t, e.Message, "processes_per_uid")
}
