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

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor"
	"github.com/sandbox-sidecar/sandbox-sidecar/internal/failpoint"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// gvCount reads a gvisor sandbox's count.txt (counterCommand's) from the
// host: any op naming the sandbox would resume it.
func gvCount(d *daemon, id string) int {
	b, err := os.ReadFile(filepath.Join(d.stateDir, "gvisor", id, "work", "count.txt"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

func gvStays(t *testing.T, d *daemon, id, what string) {
	t.Helper()
	at := gvCount(d, id)
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, at, gvCount(d, id), "%s: a paused sandbox's process went on", what)
}

func gvGoesOn(t *testing.T, d *daemon, id, what string) {
	t.Helper()
	at := gvCount(d, id)
	eventually(t, 30*time.Second, what+": the counter goes on", func() bool { return gvCount(d, id) > at })
}

// runscOf counts the processes of sandbox id's runsc sandbox (its sentry
// and gofer): command lines naming the daemon's runsc root and id.
func runscOf(d *daemon, id string) int {
	root := "--root=" + filepath.Join(d.stateDir, "gvisor", ".runsc")
	n := 0
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		hasRoot, hasID := false, false
		for _, a := range args {
			hasRoot = hasRoot || a == root
			hasID = hasID || a == id
		}
		if hasRoot && hasID {
			n++
		}
	}
	return n
}

func gvPause(t *testing.T, c *ipc.Client, id string) {
	t.Helper()
	res, err := c.Pause(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, "paused", res.State)
	require.True(t, res.MemoryReleased, "gVisor gives a paused sandbox's memory back")
}

// A gVisor sandbox paused through the socket is a checkpoint on disk and
// no runsc process; it survives a kill -9 of its daemon paused (the next
// daemon finds it so), and a use resumes it: its durable process goes on
// where it was.
func TestGVisorPauseThroughTheSocketAndKill9(t *testing.T) {
	runsc := testRunsc(t)
	d := startDaemon(t, "", "--backend", "gvisor", "--gvisor-runsc-path", runsc)
	c := d.client(t)
	hello, err := c.Hello(context.Background(), api.HelloRequest{})
	require.NoError(t, err)
	require.Contains(t, hello.Features, "pause")
	id := create(t, c, map[string]any{"spec": map[string]any{"owner": "hitl/run-1"}, "ttl_s": 600})
	p := call(t, c, ipc.OpStartCommand, map[string]any{"sandbox": id, "command": counterCommand, "name": "counter"})["process"].(string)
	eventually(t, 30*time.Second, "the counter's first number", func() bool { return gvCount(d, id) > 0 })
	require.Positive(t, runscOf(d, id))

	gvPause(t, c, id)
	state, _ := listedState(t, c, id)
	require.Equal(t, "paused", state)
	require.Zero(t, runscOf(d, id), "a paused gVisor sandbox has no runsc process")
	_, err = os.Stat(filepath.Join(d.stateDir, "gvisor", id, "checkpoint"))
	require.NoError(t, err, "a paused gVisor sandbox is a checkpoint on disk")
	gvStays(t, d, id, "paused")
	// A use resumes it.
	require.Equal(t, 0, run(t, c, id, "test -s count.txt").ExitCode)
	gvGoesOn(t, d, id, "resumed by a command")

	gvPause(t, c, id)
	at := gvCount(d, id)
	c.Close()
	d.kill9()
	time.Sleep(200 * time.Millisecond)
	d.restart()
	recovered(t, d)
	c = d.client(t)
	state, _ = listedState(t, c, id)
	require.Equal(t, "paused", state, "still paused after kill -9 and a restart")
	require.Zero(t, runscOf(d, id))
	gvStays(t, d, id, "after the restart")
	require.Equal(t, at, gvCount(d, id))
	res, err := c.Resume(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, "ready", res.State)
	gvGoesOn(t, d, id, "resumed after the restart")
	w := call(t, c, ipc.OpWaitProcess, map[string]any{"sandbox": id, "process": p})
	require.Equal(t, true, w["running"], "the durable process survived: %v", w)
	// The checkpoint goes once the restore has loaded the guest's memory
	// from it, in the background after the resume.
	eventually(t, time.Minute, "the checkpoint to go after the resume", func() bool {
		_, err := os.Stat(filepath.Join(d.stateDir, "gvisor", id, "checkpoint"))
		return os.IsNotExist(err)
	})
	// Destroyed paused, it leaves nothing.
	gvPause(t, c, id)
	call(t, c, ipc.OpDestroy, map[string]any{"sandbox": id})
	_, err = os.Stat(filepath.Join(d.stateDir, "gvisor", id))
	assert.True(t, os.IsNotExist(err))
}

// kill -9 of the gvisor daemon at every failpoint of a pause and of a
// resume (the lifecycle's and the backend's) leaves the sandbox either as
// it was or paused as asked, never lost: after the restart list says
// which, the host agrees (a paused one has no runsc process), and its
// durable process goes on once it is used.
func TestGVisorCrashDuringPauseAndResume(t *testing.T) {
	runsc := testRunsc(t)
	for _, tc := range []struct {
		point      string
		resume     bool
		wantPaused bool
	}{
		{lifecycle.FailPauseBegin, false, false},
		{gvisor.FailPauseWritten, false, false},
		{gvisor.FailPauseCheckpointed, false, true},
		{lifecycle.FailPauseFrozen, false, true},
		{lifecycle.FailResumeBegin, true, true},
		{gvisor.FailResumeRestored, true, false},
		{lifecycle.FailResumeThawed, true, false},
	} {
		t.Run(tc.point, func(t *testing.T) {
			d := startDaemon(t, "", "--backend", "gvisor", "--gvisor-runsc-path", runsc)
			c := d.client(t)
			id := create(t, c, map[string]any{"spec": map[string]any{"owner": "hitl/run-1"}, "ttl_s": 600})
			p := call(t, c, ipc.OpStartCommand, map[string]any{"sandbox": id, "command": counterCommand, "name": "counter"})["process"].(string)
			eventually(t, 30*time.Second, "the counter's first number", func() bool { return gvCount(d, id) > 0 })
			if tc.resume {
				gvPause(t, c, id)
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
			case <-time.After(60 * time.Second):
				t.Fatalf("the daemon did not die at failpoint %s", tc.point)
			}
			require.Contains(t, d.Logs(), `"failpoint":"`+tc.point+`"`)
			d.env = nil
			d.restart()
			recovered(t, d)
			c = d.client(t)
			state, _ := listedState(t, c, id)
			if tc.wantPaused {
				require.Equal(t, "paused", state, "the sandbox after a crash at %s", tc.point)
				require.Zero(t, runscOf(d, id), "a paused sandbox has no runsc process")
				gvStays(t, d, id, "after the restart")
				// Its memory is given back, whether or not the killed
				// daemon's journal said so (a crash after the checkpoint,
				// before the journal write, left it unsaid).
				again, err := c.Pause(context.Background(), id)
				require.NoError(t, err)
				require.True(t, again.MemoryReleased, "a pause of the paused sandbox after a crash at %s: %+v", tc.point, again)
			} else {
				require.Equal(t, "ready", state, "the sandbox after a crash at %s", tc.point)
				gvGoesOn(t, d, id, "after the restart")
			}
			require.Equal(t, 0, run(t, c, id, "test -s count.txt").ExitCode)
			gvGoesOn(t, d, id, "after a command")
			w := call(t, c, ipc.OpWaitProcess, map[string]any{"sandbox": id, "process": p})
			require.Equal(t, true, w["running"], "the durable process survived: %v", w)
			// A resume drops the checkpoint once its restore has loaded
			// the guest's memory, in the background.
			for _, leftover := range []string{"checkpoint", "checkpoint.new", "checkpoint.old"} {
				eventually(t, time.Minute, leftover+" to go after a resume", func() bool {
					_, err := os.Stat(filepath.Join(d.stateDir, "gvisor", id, leftover))
					return os.IsNotExist(err)
				})
			}
			if t.Failed() {
				t.Logf("daemon log:\n%s", d.Logs())
			}
		})
	}
}
