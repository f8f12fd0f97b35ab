package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// listed returns the ids the daemon lists (as root: every sandbox).
func listed(t *testing.T, d *daemon) []string {
	t.Helper()
	c := d.client(t)
	var res api.ListResult
	require.NoError(t, c.Call(context.Background(), ipc.OpList, nil, &res))
	var ids []string
	for _, s := range res.Sandboxes {
		ids = append(ids, s.Sandbox)
	}
	sort.Strings(ids)
	c.Close()
	return ids
}

// recovered waits until the daemon's start-up recovery has finished its
// background destroys (health's recovery.pending is 0): only then do the
// journal and the backend's directories agree.
func recovered(t *testing.T, d *daemon) {
	t.Helper()
	c := d.client(t)
	defer c.Close()
	require.Eventually(t, func() bool {
		var h api.HealthResult
		return c.Call(context.Background(), ipc.OpHealth, nil, &h) == nil && h.Recovery.Pending == 0
	}, 60*time.Second, 10*time.Millisecond, "recovery's background destroys did not finish")
}

// assertConsistent checks that what the daemon knows is exactly what is on
// disk, and that no process of any of its sandboxes runs (none is running a
// command at this point). It first waits for recovery's background destroys:
// a sandbox the restart decided to destroy is already gone from the list
// while its directory is still being removed.
func assertConsistent(t *testing.T, d *daemon) {
	t.Helper()
	recovered(t, d)
	ws := d.workspaces(t)
	sort.Strings(ws)
	assert.Equal(t, ws, listed(t, d), "the journal and the backend agree")
	assert.Empty(t, sandboxProcesses(d.stateDir), "no sandbox process survives")
}

// sandboxProcesses lists the processes carrying the bwrap backend's
// marker for a sandbox under stateDir.
func sandboxProcesses(stateDir string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		for _, kv := range strings.Split(string(b), "\x00") {
			if strings.HasPrefix(kv, "SANDBOX_SIDECAR_SANDBOX="+stateDir+"/") {
				var pid int
				fmt.Sscan(e.Name(), &pid)
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// TestCrashAtEveryPhase kills the daemon with SIGKILL at each point between
// durable steps of create and destroy, 20 times each, restarts it, and
// checks that nothing of ours survives that should not.
func TestCrashAtEveryPhase(t *testing.T) {
	requireHost(t)
	const iterations = 20
	phases := []string{lifecycle.FailCreateReserved, lifecycle.FailCreateJournaled, lifecycle.FailCreateBackend, lifecycle.FailDestroyJournal, lifecycle.FailDestroyBackend}
	for _, phase := range phases {
		t.Run(phase, func(t *testing.T) {
			d := startDaemon(t, "")
			c := d.client(t)
			keeper := create(t, c, map[string]any{"spec": map[string]any{"owner": "dag/keep"}, "ttl_s": 600})
			c.Close()
			for i := range iterations {
				d.stop()
				d.env = []string{"SANDBOX_SIDECAR_FAILPOINT=" + phase}
				d.restart()
				c := d.client(t)
				args := map[string]any{}
				if i%2 == 1 {
					args["ttl_s"] = 600 // alternate expiring and connection-bound
				}
				var victim string
				if strings.HasPrefix(phase, "destroy") {
					victim = create(t, c, args)
					go c.Call(context.Background(), ipc.OpDestroy, map[string]any{"sandbox": victim}, nil)
				} else {
					go c.Call(context.Background(), ipc.OpCreate, args, nil)
				}
				select {
				case <-d.proc.Done():
				case <-time.After(20 * time.Second):
					t.Fatalf("iteration %d: the daemon did not hit failpoint %s", i, phase)
				}
				c.Close()
				d.env = nil
				d.restart()
				recovered(t, d)
				ids := listed(t, d)
				assert.Contains(t, ids, keeper, "iteration %d: a leased sandbox is re-adopted", i)
				if victim != "" {
					assert.NotContains(t, ids, victim, "iteration %d: a sandbox being destroyed stays destroyed", i)
				}
				assert.Len(t, ids, 1, "iteration %d: only the leased sandbox survives", i)
				assertConsistent(t, d)
				if t.Failed() {
					t.Logf("daemon log:\n%s", d.Logs())
					return
				}
			}
			// The adopted sandbox still works.
			c = d.client(t)
			assert.Equal(t, "alive\n", string(run(t, c, keeper, "echo alive").Stdout))
		})
	}
}

func TestCrashDuringCommand(t *testing.T) {
	d := startDaemon(t, "")
	sleep := "sleep " + sleepToken()
	for i := range 20 {
		c := d.client(t)
		kept := create(t, c, map[string]any{"ttl_s": 600})
		bound := create(t, c, nil)
		for _, id := range []string{kept, bound} {
			go c.Call(context.Background(), ipc.OpRunCommand, map[string]any{"sandbox": id, "command": sleep, "timeout_s": 600}, nil)
		}
		// sh -c and its sleep, in each of two sandboxes
		eventually(t, 5*time.Second, "both commands running", func() bool { return len(processesMatching(sleep)) >= 4 })
		d.kill9()
		// The daemon's death kills its commands (parent-death signals);
		// the rare command whose bubblewrap was still starting is killed
		// by the restart's stray sweep. Either way none survives it.
		d.restart()
		deadline := time.Now().Add(5 * time.Second)
		for len(processesMatching(sleep)) > 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if left := processesMatching(sleep); len(left) > 0 {
			for _, pid := range left {
				st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
				cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				t.Logf("survivor %d: %s | %q", pid, st, cl)
			}
			t.Fatalf("iteration %d: commands outlived the daemon's restart", i)
		}
		ids := listed(t, d)
		assert.Contains(t, ids, kept)
		assert.NotContains(t, ids, bound, "a connection-bound sandbox dies with its connection")
		assertConsistent(t, d)
		c = d.client(t)
		call(t, c, ipc.OpDestroy, map[string]any{"sandbox": kept})
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.Logs())
			return
		}
	}
}

func TestKilledClientLeaksNothing(t *testing.T) {
	d := startDaemon(t, "", "--conn-grace", "1s")
	// A client process that creates a sandbox, starts a long command and
	// is then killed with SIGKILL.
	sleep := sleepToken()
	script := fmt.Sprintf(`%s create --ttl 1h >/dev/null && exec %s exec --command-timeout 10m -- sleep %s`, daemonBin, daemonBin, sleep)
	cmd := exec.Command("sh", "-c", script)
	cmd.Env = append(os.Environ(), "SANDBOX_SIDECAR_SOCKET="+d.socket)
	require.NoError(t, cmd.Start())
	// The client's own command line mentions the sleep too: wait for it
	// and the sandbox's sleep (an argv, exec'd by init directly).
	eventually(t, 10*time.Second, "the client's command running", func() bool {
		return len(d.workspaces(t)) == 2 && len(processesMatching("sleep "+sleep)) >= 2
	})
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	eventually(t, 10*time.Second, "the connection-bound sandbox and its command gone after grace + reap", func() bool {
		return len(d.workspaces(t)) == 1 && len(processesMatching("sleep "+sleep)) == 0
	})
	assert.Contains(t, d.Logs(), "connection closed")
}

func TestCorruptJournalOnStart(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	id := create(t, c, map[string]any{"ttl_s": 600})
	c.Close()
	d.kill9()
	journal := filepath.Join(d.stateDir, "journal.db")
	require.NoError(t, os.WriteFile(journal, []byte("this is not a bbolt file, not even close"), 0o600))
	d.restart()
	logs := d.Logs()
	assert.Contains(t, logs, "THE JOURNAL WAS UNREADABLE")
	moved, _ := filepath.Glob(journal + ".corrupt-*")
	assert.Len(t, moved, 1, "the bad journal is kept aside for a post-mortem")
	assert.NotContains(t, d.workspaces(t), id, "everything unknown is swept")
	assert.Empty(t, listed(t, d))
	out, _, code := d.cli(t, "health", "--json")
	assert.Equal(t, 0, code)
	var h map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &h))
	rec := h["recovery"].(map[string]any)
	assert.EqualValues(t, 1, rec["swept"])
	assert.Contains(t, rec["journal_moved_aside"], ".corrupt-")
}

func TestUnwritableStateDir(t *testing.T) {
	requireHost(t)
	base := baseDir(t)
	state := filepath.Join(base, "state")
	require.NoError(t, os.Mkdir(state, 0o755)) // root's, not writable by nobody
	cmd := exec.Command("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", daemonBin,
		"serve", "--config", "/dev/null", "--socket", filepath.Join(base, "run", "s.sock"), "--state-dir", state)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	require.Error(t, err)
	assert.Equal(t, 1, cmd.ProcessState.ExitCode())
	assert.Contains(t, string(out), "not writable")
}

func TestExpiryRenewIdleAndRuns(t *testing.T) {
	d := startDaemon(t, "", "--idle-timeout", "3s", "--max-lifetime", "1h")
	c := d.client(t)
	short := create(t, c, map[string]any{"ttl_s": 1})
	renewed := create(t, c, map[string]any{"ttl_s": 1})
	res := call(t, c, ipc.OpRenew, map[string]any{"sandbox": renewed, "ttl_s": 30})
	assert.Greater(t, res["remaining_s"], 20.0)
	idle := create(t, c, map[string]any{"spec": map[string]any{"owner": "dag/idle"}, "ttl_s": 600})
	eventually(t, 5*time.Second, "the expired sandbox reaped", func() bool { return !contains(d.workspaces(t), short) })
	assert.Contains(t, d.workspaces(t), renewed)
	e := callErr(t, c, ipc.OpRunCommand, map[string]any{"sandbox": short, "command": "true"})
	assert.Equal(t, ipc.CodeNotFound, e.Code)
	eventually(t, 8*time.Second, "the idle sandbox reaped", func() bool { return !contains(d.workspaces(t), idle) })
	// The workspace goes before the lifecycle logs the destroy.
	eventually(t, 5*time.Second, "the idle destroy logged", func() bool { return strings.Contains(d.Logs(), `"reason":"idle"`) })

	// destroy_run takes every sandbox of one run and nothing else.
	a1 := create(t, c, map[string]any{"spec": map[string]any{"owner": "etl/r1"}, "labels": map[string]any{"task_id": "t1"}})
	a2 := create(t, c, map[string]any{"spec": map[string]any{"owner": "etl/r1"}})
	b1 := create(t, c, map[string]any{"spec": map[string]any{"owner": "etl/r2"}})
	l := call(t, c, ipc.OpList, map[string]any{"owner": "etl/r1"})["sandboxes"].([]any)
	assert.Len(t, l, 2)
	res = call(t, c, ipc.OpDestroyRun, map[string]any{"owner": "etl/r1"})
	got := []string{res["destroyed"].([]any)[0].(string), res["destroyed"].([]any)[1].(string)}
	sort.Strings(got)
	want := []string{a1, a2}
	sort.Strings(want)
	assert.Equal(t, want, got)
	assert.Contains(t, d.workspaces(t), b1)
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func TestQuotas(t *testing.T) {
	d := startDaemon(t, "", "--max-sandboxes", "3", "--max-sandboxes-per-owner", "2")
	c := d.client(t)
	create(t, c, map[string]any{"spec": map[string]any{"owner": "o/1"}})
	create(t, c, map[string]any{"spec": map[string]any{"owner": "o/1"}})
	e := callErr(t, c, ipc.OpCreate, map[string]any{"spec": map[string]any{"owner": "o/1"}})
	assert.Equal(t, ipc.CodeQuotaExceeded, e.Code)
	assert.EqualValues(t, 2, e.Details["limit"])
	assert.Equal(t, "owner", e.Details["scope"])
	create(t, c, nil)
	e = callErr(t, c, ipc.OpCreate, nil)
	assert.Equal(t, "host", e.Details["scope"])
	assert.Len(t, d.workspaces(t), 3, "a refused create makes nothing")
}

func TestAttachReleaseOverTheWire(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	id := create(t, c, map[string]any{"spec": map[string]any{"owner": "dag/run"}, "ttl_s": 600, "labels": map[string]any{"dag_id": "dag", "run_id": "run"}})

	e := callErr(t, c, ipc.OpAttach, map[string]any{"sandbox": id, "owner": "dag/other", "holder": "t1"})
	assert.Equal(t, ipc.CodeOwnerMismatch, e.Code)
	res := call(t, c, ipc.OpAttach, map[string]any{"sandbox": id, "owner": "dag/run", "holder": "t1"})
	assert.Equal(t, "/workspace", res["workdir"])
	assert.JSONEq(t, `{"allow_egress_to":[],"allow_egress_to_cidrs":[],"block_network":true}`, res["network"].(string))
	call(t, c, ipc.OpAttach, map[string]any{"sandbox": id, "owner": "dag/run", "holder": "t1"}) // a retry re-attaches
	e = callErr(t, c, ipc.OpAttach, map[string]any{"sandbox": id, "owner": "dag/run", "holder": "t2"})
	assert.Equal(t, ipc.CodeHeldByOther, e.Code)
	assert.Equal(t, "t1", e.Details["holder"])
	tags := call(t, c, ipc.OpReadTags, map[string]any{"sandbox": id})["tags"].(map[string]any)
	assert.Equal(t, "dag/run", tags["airflow_owner"])
	assert.Equal(t, "t1", tags["airflow_holder"])
	assert.Equal(t, false, call(t, c, ipc.OpRelease, map[string]any{"sandbox": id, "holder": "t2"})["released"])
	assert.Equal(t, true, call(t, c, ipc.OpRelease, map[string]any{"sandbox": id, "holder": "t1"})["released"])
	assert.Equal(t, false, call(t, c, ipc.OpRelease, map[string]any{"sandbox": id, "holder": "t1"})["released"])
	assert.Contains(t, d.workspaces(t), id, "release never destroys")

	// Concurrent attaches from separate clients: exactly one wins, every time.
	for round := range 50 {
		holders := []string{"a", "b", "c", "d"}
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins := 0
		for _, h := range holders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cl := d.client(t)
				defer cl.Close()
				err := cl.Call(context.Background(), ipc.OpAttach, map[string]any{"sandbox": id, "owner": "dag/run", "holder": fmt.Sprint(round, h)}, nil)
				if err == nil {
					mu.Lock()
					wins++
					mu.Unlock()
				} else {
					assert.True(t, ipc.IsCode(err, ipc.CodeHeldByOther), "%v", err)
				}
			}()
		}
		wg.Wait()
		require.Equal(t, 1, wins, "round %d", round)
		call(t, c, ipc.OpWriteTags, map[string]any{"sandbox": id, "tags": map[string]any{"airflow_holder": ""}})
	}
}

func TestAuditTrail(t *testing.T) {
	auditFile := filepath.Join(baseDir(t), "audit.jsonl")
	d := startDaemon(t, "", "--audit-file", auditFile)
	c := d.client(t)
	id := create(t, c, map[string]any{"spec": map[string]any{"owner": "audit/run"}, "labels": map[string]any{"task_id": "t9"}})
	run(t, c, id, "echo "+strings.Repeat("x", 300))
	call(t, c, ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "f", "data": []byte("1")})
	callErr(t, c, ipc.OpReadFile, map[string]any{"sandbox": id, "path": "/etc/shadow"})
	call(t, c, ipc.OpDestroy, map[string]any{"sandbox": id})

	// A request's audit line follows its response: the daemon's
	// shutdown waits for the last one.
	d.stop()
	b, err := os.ReadFile(auditFile)
	require.NoError(t, err)
	var ops []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		if m["@message"] != "audit" {
			continue
		}
		ops = append(ops, m["op"].(string))
		assert.EqualValues(t, os.Getuid(), m["peer_uid"], line)
		assert.EqualValues(t, os.Getpid(), m["peer_pid"], line)
		assert.Equal(t, "audit/run", m["owner"], line)
		assert.Equal(t, id, m["sandbox"], line)
		switch m["op"] {
		case "run_command":
			assert.Len(t, []rune(m["command"].(string)), 201, "the first 200 characters and an ellipsis")
			assert.EqualValues(t, 0, m["exit_code"])
			assert.Contains(t, m, "timed_out")
		case "read_file":
			assert.Equal(t, "path_not_found", m["code"], "refusals are audited too (the host's /etc/shadow is not in the sandbox)")
		case "create":
			assert.Equal(t, map[string]any{"task_id": "t9"}, m["labels"])
		}
	}
	assert.Equal(t, []string{"create", "run_command", "write_file", "read_file", "destroy"}, ops)
}

// A command starts on the goroutine that read its request and gives the
// connection back before it waits: a request sent on the same connection
// while a long command runs is answered while it runs, and the command's
// own result is unaffected.
func TestConnectionServedWhileItsCommandRuns(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	id := create(t, c, map[string]any{"ttl_s": 600})
	run(t, c, id, "true")
	sleep := sleepToken()
	type outcome struct {
		res execResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var o outcome
		o.err = c.Call(ctx, ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "sleep " + sleep, "timeout_s": 60}, &o.res)
		done <- o
	}()
	eventually(t, 10*time.Second, "the command running", func() bool { return len(processesMatching("sleep "+sleep)) > 0 })
	assert.Equal(t, id, call(t, c, ipc.OpList, nil)["sandboxes"].([]any)[0].(map[string]any)["sandbox"])
	select {
	case o := <-done:
		t.Fatalf("the command ended (%+v, %v) before it was stopped", o.res, o.err)
	default:
	}
	for _, pid := range processesMatching("sleep " + sleep) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	select {
	case o := <-done:
		require.NoError(t, o.err)
		assert.Equal(t, 137, o.res.ExitCode, "the sleep was killed")
	case <-time.After(30 * time.Second):
		t.Fatal("the killed command's result did not come within 30 s")
	}
}
