package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/internal/failpoint"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// counterCommand is a durable process that writes 1, 2, 3, ... into
// count.txt every 10 ms.
const counterCommand = `i=0; while :; do i=$((i+1)); echo $i > count.tmp; mv count.tmp count.txt; sleep 0.01; done`

// startCounter starts counterCommand in id and waits for its first number.
func (d *daemon) startCounter(t *testing.T, c *ipc.Client, id string) string {
	t.Helper()
	p := call(t, c, ipc.OpStartCommand, map[string]any{"sandbox": id, "command": counterCommand, "name": "counter"})["process"].(string)
	eventually(t, 20*time.Second, "the counter's first number", func() bool { return d.count(id) > 0 })
	return p
}

// workFile is the host path of a file in sandbox id's workspace, as the
// daemon sees it: on the sandbox's own disk when the daemon caps disks,
// mounted on its vol/ in the daemon's private mount namespace (reached
// through the daemon's /proc/PID/root), else in its directory.
func (d *daemon) workFile(id, name string) string {
	dir := filepath.Join(d.stateDir, "bwrap", id)
	if _, err := os.Stat(filepath.Join(dir, "disk.img")); err == nil {
		return filepath.Join("/proc", strconv.Itoa(d.cmd.Process.Pid), "root", dir, "vol", "work", name)
	}
	return filepath.Join(dir, "work", name)
}

// count reads a sandbox's count.txt from the host: any op naming the
// sandbox would resume it.
func (d *daemon) count(id string) int {
	b, err := os.ReadFile(d.workFile(id, "count.txt"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// stays requires the counter of id to stand still: its sandbox is paused.
func (d *daemon) stays(t *testing.T, id, what string) {
	t.Helper()
	at := d.count(id)
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, at, d.count(id), "%s: a paused sandbox's process went on", what)
}

// goesOn requires the counter of id to advance.
func (d *daemon) goesOn(t *testing.T, id, what string) {
	t.Helper()
	at := d.count(id)
	eventually(t, 20*time.Second, what+": the counter goes on", func() bool { return d.count(id) > at })
}

// stateOf is id's state as list reports it ("" when it is not listed).
func listedState(t *testing.T, c *ipc.Client, id string) (state string, pausedAt float64) {
	t.Helper()
	res, err := c.List(context.Background(), "")
	require.NoError(t, err)
	for _, s := range res.Sandboxes {
		if s.Sandbox == id {
			return s.State, s.PausedAt
		}
	}
	return "", 0
}

func pause(t *testing.T, c *ipc.Client, id string) {
	t.Helper()
	res, err := c.Pause(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, "paused", res.State)
	require.False(t, res.MemoryReleased, "bwrap keeps a paused sandbox's memory")
	require.Positive(t, res.PausedAt)
	require.Positive(t, res.RemainingS)
}

// TestPauseThroughTheSocket: the contract of pause and resume on the
// real daemon: what a pause stops and what it leaves, that every use
// resumes first, busy while a command runs, the CLI, and a destroy.
func TestPauseThroughTheSocket(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	ctx := context.Background()
	hello, err := c.Hello(ctx, api.HelloRequest{})
	require.NoError(t, err)
	require.Contains(t, hello.Features, "pause")

	id := create(t, c, map[string]any{"spec": map[string]any{"owner": "hitl/run-1"}, "ttl_s": 600})
	p := d.startCounter(t, c, id)
	pause(t, c, id)
	state, pausedAt := listedState(t, c, id)
	assert.Equal(t, "paused", state)
	assert.Positive(t, pausedAt)
	health, err := c.Health(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, health.Paused)
	d.stays(t, id, "paused")
	// A renewal and tags leave it paused.
	call(t, c, ipc.OpRenew, map[string]any{"sandbox": id, "ttl_s": 900})
	call(t, c, ipc.OpWriteTags, map[string]any{"sandbox": id, "tags": map[string]string{"stage": "review"}})
	d.stays(t, id, "paused, after renew and write_tags")

	// Every use resumes it first and then succeeds.
	call(t, c, ipc.OpRunCode, map[string]any{"sandbox": id, "code": "n = 41"})
	uses := map[string]func(){
		"run_command": func() { require.Equal(t, 0, run(t, c, id, "test -s count.txt").ExitCode) },
		"read_file":   func() { call(t, c, ipc.OpReadFile, map[string]any{"sandbox": id, "path": "count.txt"}) },
		"read_output": func() {
			call(t, c, ipc.OpReadOutput, map[string]any{"sandbox": id, "process": p, "stream": "stdout"})
		},
		"wait_process": func() {
			res := call(t, c, ipc.OpWaitProcess, map[string]any{"sandbox": id, "process": p})
			require.Equal(t, true, res["running"])
		},
		"run_code": func() {
			res := call(t, c, ipc.OpRunCode, map[string]any{"sandbox": id, "code": "n"})
			require.Nil(t, res["error"])
		},
		"attach": func() {
			call(t, c, ipc.OpAttach, map[string]any{"sandbox": id, "owner": "hitl/run-1", "holder": "review-task"})
		},
	}
	for name, use := range uses {
		pause(t, c, id)
		use()
		state, _ := listedState(t, c, id)
		require.Equal(t, "ready", state, "%s resumed the sandbox", name)
		d.goesOn(t, id, name)
	}
	// The context kept its state through the pauses.
	pause(t, c, id)
	res := call(t, c, ipc.OpRunCode, map[string]any{"sandbox": id, "code": "n + 1"})
	require.Equal(t, "42", res["results"].([]any)[0].(map[string]any)["text/plain"], "a code context's variables survive a pause")

	// A pause never stops a command halfway: busy while one runs.
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(t, d.client(t), id, "touch started; sleep 2")
	}()
	eventually(t, 20*time.Second, "the command started", func() bool {
		_, err := os.Stat(d.workFile(id, "started"))
		return err == nil
	})
	e := callErr(t, c, ipc.OpPause, map[string]any{"sandbox": id})
	assert.Equal(t, ipc.CodeBusy, e.Code)
	<-done

	// The CLI.
	out, stderr, code := d.cli(t, "pause", id)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, id+"\n", out)
	out, _, _ = d.cli(t, "ls")
	assert.Contains(t, out, "paused")
	out, _, _ = d.cli(t, "health")
	assert.Contains(t, out, "(1 paused)")
	d.stays(t, id, "paused by the CLI")
	out, stderr, code = d.cli(t, "resume", id)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, id+"\n", out)
	d.goesOn(t, id, "resumed by the CLI")
	_, stderr, code = d.cli(t, "pause", "sc-0000000000000000")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "not_found")

	// A paused sandbox is destroyed as it is, processes and all.
	tok := sleepToken()
	call(t, c, ipc.OpStartCommand, map[string]any{"sandbox": id, "command": "sleep " + tok})
	eventually(t, 20*time.Second, "the sleep started", func() bool { return len(processesMatching("sleep "+tok)) > 0 })
	pause(t, c, id)
	call(t, c, ipc.OpDestroy, map[string]any{"sandbox": id})
	assert.Empty(t, d.workspaces(t))
	eventually(t, 10*time.Second, "the paused sandbox's processes ended", func() bool { return len(processesMatching("sleep "+tok)) == 0 })
}

// A paused sandbox survives kill -9 of its daemon paused, its processes
// stopped where they were, and goes on when it is used.
func TestPausedSandboxSurvivesKill9(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	id := create(t, c, map[string]any{"spec": map[string]any{"owner": "hitl/run-1"}, "ttl_s": 600})
	p := d.startCounter(t, c, id)
	call(t, c, ipc.OpRunCode, map[string]any{"sandbox": id, "code": "x = 41"})
	pause(t, c, id)
	at := d.count(id)
	c.Close()
	d.kill9()
	time.Sleep(200 * time.Millisecond)
	d.restart()
	c = d.client(t)
	state, _ := listedState(t, c, id)
	require.Equal(t, "paused", state, "still paused after kill -9 and a restart")
	d.stays(t, id, "after the restart")
	require.Equal(t, at, d.count(id))
	// Used, it resumes: the same process goes on, the context's state is
	// there.
	res := call(t, c, ipc.OpRunCode, map[string]any{"sandbox": id, "code": "x + 1"})
	require.Equal(t, "42", res["results"].([]any)[0].(map[string]any)["text/plain"])
	d.goesOn(t, id, "after the restart")
	w := call(t, c, ipc.OpWaitProcess, map[string]any{"sandbox": id, "process": p})
	require.Equal(t, true, w["running"], "the durable process survived: %v", w)
	assertConsistent(t, d)
}

// kill -9 of the daemon in the middle of a pause and of a resume, at each
// failpoint, leaves the sandbox either as it was or as it was asked to
// be after the restart, never lost: its durable process goes on once it
// is used.
func TestCrashDuringPauseAndResume(t *testing.T) {
	for _, tc := range []struct {
		point      string
		resume     bool
		wantPaused bool
	}{
		{lifecycle.FailPauseBegin, false, false},
		{lifecycle.FailPauseFrozen, false, true},
		{lifecycle.FailResumeBegin, true, true},
		{bwrap.FailResumeThawed, true, false},
		{lifecycle.FailResumeThawed, true, false},
	} {
		t.Run(tc.point, func(t *testing.T) {
			d := startDaemon(t, "")
			c := d.client(t)
			id := create(t, c, map[string]any{"spec": map[string]any{"owner": "hitl/run-1"}, "ttl_s": 600})
			p := d.startCounter(t, c, id)
			if tc.resume {
				pause(t, c, id)
			}
			c.Close()
			d.stop()
			d.env = []string{failpoint.Env + "=" + tc.point}
			d.restart()
			c = d.client(t)
			op := ipc.OpPause
			if tc.resume {
				op = ipc.OpResume
			}
			go c.Call(context.Background(), op, map[string]any{"sandbox": id}, nil)
			select {
			case <-d.proc.Done():
			case <-time.After(30 * time.Second):
				t.Fatalf("the daemon did not die at failpoint %s", tc.point)
			}
			require.Contains(t, d.Logs(), `"failpoint":"`+tc.point+`"`)
			d.env = nil
			d.restart()
			c = d.client(t)
			want := "ready"
			if tc.wantPaused {
				want = "paused"
				d.stays(t, id, "after the restart")
			} else {
				d.goesOn(t, id, "after the restart")
			}
			state, _ := listedState(t, c, id)
			require.Equal(t, want, state, "the sandbox after a crash at %s", tc.point)
			require.Equal(t, 0, run(t, c, id, "test -s count.txt").ExitCode)
			d.goesOn(t, id, "after a command")
			w := call(t, c, ipc.OpWaitProcess, map[string]any{"sandbox": id, "process": p})
			require.Equal(t, true, w["running"], "the durable process survived: %v", w)
			assertConsistent(t, d)
			if t.Failed() {
				t.Logf("daemon log:\n%s", d.Logs())
			}
		})
	}
}

// A paused sandbox still ends at its TTL, processes and all.
func TestPausedSandboxEndsAtItsTTL(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	id := create(t, c, map[string]any{"ttl_s": 3})
	tok := sleepToken()
	call(t, c, ipc.OpStartCommand, map[string]any{"sandbox": id, "command": "sleep " + tok})
	eventually(t, 20*time.Second, "the process started", func() bool { return len(processesMatching("sleep "+tok)) > 0 })
	pause(t, c, id)
	eventually(t, 30*time.Second, "the paused sandbox expired", func() bool {
		state, _ := listedState(t, c, id)
		return state == ""
	})
	eventually(t, 10*time.Second, "its process ended", func() bool { return len(processesMatching("sleep "+tok)) == 0 })
	assert.Empty(t, d.workspaces(t))
}

// A snapshot leaves a paused sandbox paused, and so does a daemon killed
// while its snapshot holds one (a held sandbox is thawed by the next
// daemon; a paused one is not held, and stays paused).
func TestSnapshotOfAPausedSandboxLeavesItPaused(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	id := create(t, c, map[string]any{"spec": map[string]any{"owner": "hitl/run-1"}, "ttl_s": 600})
	d.startCounter(t, c, id)
	pause(t, c, id)
	call(t, c, ipc.OpSnapshot, map[string]any{"sandbox": id, "name": "paused-snap"})
	state, _ := listedState(t, c, id)
	require.Equal(t, "paused", state, "a snapshot leaves a paused sandbox paused")
	d.stays(t, id, "after a snapshot")

	c.Close()
	d.stop()
	d.env = []string{failpoint.Env + "=" + bwrap.FailSnapshotHeld}
	d.restart()
	c = d.client(t)
	go c.Call(context.Background(), ipc.OpSnapshot, map[string]any{"sandbox": id, "name": "cut-snap"}, nil)
	select {
	case <-d.proc.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the daemon did not die while its snapshot held the sandbox")
	}
	d.env = nil
	d.restart()
	c = d.client(t)
	state, _ = listedState(t, c, id)
	require.Equal(t, "paused", state, "a paused sandbox a killed daemon's snapshot held stays paused")
	d.stays(t, id, "after the restart")
	require.Equal(t, 0, run(t, c, id, "true").ExitCode)
	d.goesOn(t, id, "used after the restart")
}
