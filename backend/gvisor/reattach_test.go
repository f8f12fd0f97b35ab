package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/proclog"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/procstore"
)

// counting writes lines 0..n-1, one every 100 ms, then exits with code.
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

// kill9 does to b's sandbox id what a kill -9 of the daemon does: its ends
// of the init's streams close, nothing is stopped or destroyed.
func kill9(t *testing.T, b *Backend, id string) {
	t.Helper()
	sb, err := b.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	if sb.init != nil {
		sb.init.close()
		sb.init = nil
	}
	sb.gone = true
}

// exitRecorded waits until process proc of sandbox dir's exit record is
// on the host.
func exitRecorded(t *testing.T, dir, proc string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if b, err := os.ReadFile(filepath.Join(dir, procsName, proc, "exit")); err == nil {
			if _, err := proclog.DecodeExit(b); err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no exit record for %s within a minute", proc)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A sandbox's gVisor sandbox, its init and its durable processes outlive
// a daemon killed with -9, and one killed while a command streamed output
// (so that init's stream holds what that daemon never read): a process ends
// while no daemon is up and leaves its exit and all its output; the next
// daemon re-attaches to the same init, whose other process still runs and
// takes signals, and runs commands there.
func TestGVisorInitOutlivesTheDaemon(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gvisor")
	first := newTestBackend(t, func(c *Config) { c.Dir = dir })
	ctx := context.Background()
	const id = "survivor"
	if _, err := first.Create(ctx, id, backend.Spec{Env: map[string]string{"WHO": "me"}}); err != nil {
		t.Fatal(err)
	}
	execOK(t, first, id, "echo kept > /workspace/f")
	job, err := first.StartProcess(ctx, id, backend.ProcessRequest{Command: counting(20, 7)})
	if err != nil {
		t.Fatal(err)
	}
	server, err := first.StartProcess(ctx, id, backend.ProcessRequest{Name: "server", Command: "trap 'echo bye; exit 0' TERM; echo up; while :; do sleep 0.1; done"})
	if err != nil {
		t.Fatal(err)
	}
	kill9(t, first, id)
	abandonStreamingCommand(t, mustLookup(t, first, id))
	exitRecorded(t, filepath.Join(dir, id), job.ID) // it ended while no daemon was up

	second := newTestBackend(t, func(c *Config) { c.Dir = dir })
	if ids, err := second.runscList(ctx); err != nil || len(ids) != 1 || ids[0] != id {
		t.Fatalf("after a restart runsc lists %v (%v); the live sandbox must be kept", ids, err)
	}
	if err := second.Adopt(ctx, id); err != nil {
		t.Fatal(err)
	}
	if !(&gvAgent{b: second, sb: mustLookup(t, second, id)}).AgentAlive() {
		t.Fatal("the next daemon did not re-attach to the live init")
	}
	end := waitProc(t, second, id, job.ID)
	if end.ExitCode != 7 || end.Reason != "exited" {
		t.Errorf("the job that ended while no daemon was up: %+v", end)
	}
	if got := readProc(t, second, id, job.ID); got != countedLines(20) {
		t.Errorf("its output: %q", got)
	}
	info, err := second.WaitProcess(ctx, id, server.ID, 0)
	if err != nil || !info.Running {
		t.Fatalf("the server after the restart: %+v, %v", info, err)
	}
	again, err := second.StartProcess(ctx, id, backend.ProcessRequest{Name: "server", Command: "echo never"})
	if err != nil || !again.Existing || again.ID != server.ID {
		t.Errorf("a start of server again: %+v, %v", again, err)
	}
	if got := execOK(t, second, id, `cat /workspace/f; echo "$WHO"; ps -eo args | grep -c '^cat /dev/zero$'; true`); got != "kept\nme\n0\n" {
		t.Errorf("a command in the re-attached sandbox printed %q (the dead daemon's command must be gone)", got)
	}
	if err := second.SignalProcess(ctx, id, server.ID, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if end := waitProc(t, second, id, server.ID); end.ExitCode != 0 {
		t.Errorf("the server after TERM: %+v", end)
	}
	if got := readProc(t, second, id, server.ID); got != "up\nbye\n" {
		t.Errorf("the server wrote %q", got)
	}
	if err := second.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if ids, err := second.runscList(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("after Destroy runsc still lists %v (%v)", ids, err)
	}
	if _, err := os.Stat(filepath.Join(dir, id)); !os.IsNotExist(err) {
		t.Fatalf("after Destroy the sandbox's directory is still there: %v", err)
	}
}

// abandonStreamingCommand is a daemon that attaches to sb's init, has it
// run a command that writes without end, reads none of it and dies: what
// it leaves unread in init's stream, the next daemon must skip.
func abandonStreamingCommand(t *testing.T, sb *sandbox) {
	t.Helper()
	toInit, err := os.OpenFile(sb.toInitPath(), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer toInit.Close()
	fromInit, err := os.OpenFile(sb.fromInitPath(), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fromInit.Close()
	run := gvwire.RunRequest{Argv: []string{"cat", "/dev/zero"}, Env: []string{"PATH=" + guestPath}, Cwd: guestWorkspace, Timeout: time.Minute, KillAfter: time.Second}
	if err := gvwire.WriteFrame(toInit, gvwire.KindAttach, make([]byte, gvwire.NonceSize)); err != nil {
		t.Fatal(err)
	}
	if err := gvwire.WriteFrame(toInit, gvwire.KindRun, run.Encode()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := unix.IoctlGetInt(int(fromInit.Fd()), unix.TIOCINQ)
		if err != nil {
			t.Fatal(err)
		}
		if n >= 32<<10 {
			return // a FIFO's worth, unread, as the daemon dies
		}
		if time.Now().After(deadline) {
			t.Fatalf("init's stream holds %d bytes after 10 s of cat /dev/zero", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mustLookup(t *testing.T, b *Backend, id string) *sandbox {
	t.Helper()
	sb, err := b.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// A daemon stopped (Close, as at SIGTERM) leaves its sandboxes running for
// the next; an allowlist-less sandbox that never booted is left alone.
func TestGVisorCloseLeavesSandboxesForTheNext(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gvisor")
	first := newTestBackend(t, func(c *Config) { c.Dir = dir })
	ctx := context.Background()
	const id = "kept-on-close"
	if _, err := first.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	p, err := first.StartProcess(ctx, id, backend.ProcessRequest{Command: "echo up; sleep 600"})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second := newTestBackend(t, func(c *Config) { c.Dir = dir })
	info, err := second.WaitProcess(ctx, id, p.ID, 0)
	if err != nil || !info.Running {
		t.Fatalf("the process after a stop and start of the daemon: %+v, %v", info, err)
	}
	if err := second.SignalProcess(ctx, id, p.ID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if end := waitProc(t, second, id, p.ID); end.Reason != "killed" || end.ExitCode != 137 {
		t.Errorf("after KILL: %+v", end)
	}
}

// An init that did not outlive the daemon (its sandbox died meanwhile)
// takes its processes with it: they read as sandbox_terminated, and stay
// so once the sandbox's next command has booted a new init.
func TestGVisorProcessesOfALostInitStayEnded(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gvisor")
	first := newTestBackend(t, func(c *Config) { c.Dir = dir })
	ctx := context.Background()
	const id = "lost-init"
	if _, err := first.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	p, err := first.StartProcess(ctx, id, backend.ProcessRequest{Command: "sleep 600"})
	if err != nil {
		t.Fatal(err)
	}
	pids := sandboxPIDs(t, first, id)
	kill9(t, first, id)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	second := newTestBackend(t, func(c *Config) { c.Dir = dir })
	check := func(when string) {
		t.Helper()
		info, err := second.WaitProcess(ctx, id, p.ID, 0)
		if err != nil || info.Running || info.Reason != "sandbox_terminated" || info.ExitCode != 137 {
			t.Errorf("%s: %+v, %v", when, info, err)
		}
	}
	check("after the restart")
	if got := execOK(t, second, id, "echo booted"); got != "booted\n" {
		t.Fatalf("a command after the restart printed %q", got)
	}
	check("once a new init runs")
	if err := second.SignalProcess(ctx, id, p.ID, syscall.SIGTERM); err == nil {
		t.Error("a signal reached a process of the lost init")
	}
}

// The daemon killed in the moment between a process's end and its exit
// record (the keeper stopped there by its failpoint, inside gVisor): the
// record is written with no daemon attached, and the next daemon reports
// the exit.
func TestGVisorExitRecordedAcrossAKill9AtItsEnd(t *testing.T) {
	t.Setenv(agent.KeeperFailpointEnv, "exited") // the sandboxes booted from now on
	dir := filepath.Join(t.TempDir(), "gvisor")
	first := newTestBackend(t, func(c *Config) { c.Dir = dir })
	ctx := context.Background()
	const id = "fp-exit"
	if _, err := first.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	p, err := first.StartProcess(ctx, id, backend.ProcessRequest{Command: "echo last words; exit 5"})
	if err != nil {
		t.Fatal(err)
	}
	// The keeper, root inside the sandbox, is found and continued by
	// runsc exec (root there too): no process of the host is it. Its
	// failpoint names the thread it runs on, which is not always the
	// main one: every thread's name is looked at.
	var keeper string
	deadline := time.Now().Add(time.Minute)
	for keeper == "" {
		out, err := first.cli(ctx, cliTimeout, "exec", id, "/bin/sh", "-c",
			`for d in /proc/[0-9]*; do for c in $d/task/*/comm; do [ "$(cat $c 2>/dev/null)" = `+agent.KeeperFailpointName+` ] || continue; case "$(cat $d/stat 2>/dev/null)" in *") T "*) echo $d; break;; esac; done; done`)
		if err != nil {
			t.Fatalf("runsc exec: %v: %s", err, out)
		}
		keeper = strings.TrimPrefix(strings.TrimSpace(string(out)), "/proc/")
		if keeper == "" && time.Now().After(deadline) {
			dbg, _ := first.cli(ctx, cliTimeout, "exec", id, "/bin/sh", "-c", `for d in /proc/[0-9]*; do echo "$d $(cat $d/stat) :: $(cat $d/task/*/comm | tr '\n' ' ')"; done`)
			t.Logf("procs:\n%s", dbg)
			t.Fatal("the keeper did not stop at its failpoint within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	info, err := first.WaitProcess(ctx, id, p.ID, 0)
	if err != nil || !info.Running {
		t.Fatalf("the process ended, its record is not written: it still counts as running, not %+v, %v", info, err)
	}
	kill9(t, first, id)
	if out, err := first.cli(ctx, cliTimeout, "exec", id, "/bin/kill", "-CONT", keeper); err != nil {
		t.Fatalf("continuing the keeper (pid %s): %v: %s", keeper, err, out)
	}
	exitRecorded(t, filepath.Join(dir, id), p.ID)

	second := newTestBackend(t, func(c *Config) { c.Dir = dir })
	end := waitProc(t, second, id, p.ID)
	if end.ExitCode != 5 || end.Reason != "exited" {
		t.Errorf("the end recorded with no daemon attached: %+v", end)
	}
	if got := readProc(t, second, id, p.ID); got != "last words\n" {
		t.Errorf("its output: %q", got)
	}
}

// diesMidStart is a daemon killed between a process's record and its
// start: its StartKeeper never hands init the process.
// diesMidStart stands for a daemon killed mid-start: its StartKeeper has
// the record written and never hands the process over (the store gives
// it no cancellation: it returns once the test lets it).
type diesMidStart struct{ recorded, release chan struct{} }

func (a diesMidStart) StartKeeper(ctx context.Context, _ agent.Request, _ procstore.Files) (int, error) {
	close(a.recorded)
	<-a.release
	return 0, errors.New("the daemon died here")
}
func (diesMidStart) SignalKeeper(context.Context, string, syscall.Signal) error { return nil }
func (diesMidStart) AgentAlive() bool                                           { return true }

// A process whose record a daemon wrote but which it died before handing
// to init never runs: the next daemon, re-attached to the init, learns
// from it that no keeper runs the process and ends its record
// (killed, 137, no end time: it never ran), while a process init does run stays running.
func TestGVisorProcessNeverStartedEndsAtReattach(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gvisor")
	first := newTestBackend(t, func(c *Config) { c.Dir = dir })
	ctx := context.Background()
	const id = "mid-start"
	if _, err := first.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	real, err := first.StartProcess(ctx, id, backend.ProcessRequest{Command: "sleep 600"})
	if err != nil {
		t.Fatal(err)
	}
	sb := mustLookup(t, first, id)
	dying := diesMidStart{recorded: make(chan struct{}), release: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = first.store(sb).Start(ctx, dying, procstore.StartSpec{Command: "echo never", Request: agent.Request{Argv: []string{"/bin/sh", "-c", "echo never"}, Cwd: guestWorkspace, UID: guestUID, GID: guestGID}})
	}()
	<-dying.recorded
	list, err := first.ListProcesses(ctx, id)
	if err != nil || len(list) != 2 {
		t.Fatalf("the two records: %+v, %v", list, err)
	}
	var never string
	for _, p := range list {
		if p.ID != real.ID {
			never = p.ID
		}
	}
	kill9(t, first, id) // the record stays: Start is stopped where a kill -9 would stop it
	second := newTestBackend(t, func(c *Config) { c.Dir = dir })
	info, err := second.WaitProcess(ctx, id, never, 0)
	if err != nil || info.Running || info.Reason != "killed" || info.ExitCode != 137 {
		t.Errorf("the process never handed to init: %+v, %v", info, err)
	}
	if info, err := second.WaitProcess(ctx, id, real.ID, 0); err != nil || !info.Running {
		t.Errorf("the process init runs: %+v, %v", info, err)
	}
	close(dying.release)
	<-done
}
