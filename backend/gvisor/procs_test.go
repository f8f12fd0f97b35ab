package gvisor

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// waitProc waits for process proc's end.
func waitProc(t *testing.T, b *Backend, id, proc string) backend.ProcessInfo {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		p, err := b.WaitProcess(context.Background(), id, proc, 10*time.Second)
		if err != nil {
			t.Fatalf("WaitProcess(%s): %v", proc, err)
		}
		if !p.Running {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %s still runs after a minute", proc)
		}
	}
}

// readProc reads all of a process's stdout.
func readProc(t *testing.T, b *Backend, id, proc string) string {
	t.Helper()
	r, err := b.ReadOutput(context.Background(), id, proc, false, 0, 1<<20, 0)
	if err != nil {
		t.Fatalf("ReadOutput(%s): %v", proc, err)
	}
	return string(r.Data)
}

// A durable process runs as the guest under a keeper that is root, its
// logs in a directory of the host that the guest cannot reach, and what
// it writes there wakes the daemon's inotify on the host (the sentry
// writes through to the host's file at once).
func TestGVisorProcessesAreTheGuestsAndTheirLogsTheDaemons(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	const id = "procs-guest"
	if _, err := b.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	p, err := b.StartProcess(ctx, id, backend.ProcessRequest{Command: "id -u; id -g; ls " + guestProcs + " 2>&1; echo ls=$?; touch " + guestProcs + "/x 2>&1; echo touch=$?"})
	if err != nil {
		t.Fatal(err)
	}
	if end := waitProc(t, b, id, p.ID); end.ExitCode != 0 || end.Reason != "exited" {
		t.Fatalf("the end: %+v", end)
	}
	out := readProc(t, b, id, p.ID)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 4 || lines[0] != "1000" || lines[1] != "1000" || !strings.Contains(out, "Permission denied") || strings.Contains(out, "ls=0") || strings.Contains(out, "touch=0") {
		t.Errorf("the process as the guest, and the procs directory closed to it:\n%s", out)
	}
	if got := execOK(t, b, id, "ls -ld "+guestProcs+" | cut -c1-10; ls "+guestProcs+" 2>&1 | head -1"); !strings.HasPrefix(got, "drwx------\n") || !strings.Contains(got, "Permission denied") {
		t.Errorf("a command looking at the procs directory: %q", got)
	}

	// Subscribed while the process sleeps: its write, made inside the
	// sentry, must reach the host as an inotify event on its directory.
	p, err = b.StartProcess(ctx, id, backend.ProcessRequest{Command: "sleep 2; echo later"})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	ch, unsubscribe := b.watcher.Subscribe(filepath.Join(sb.procsDir(), p.ID))
	defer unsubscribe()
	if ch == nil {
		t.Fatal("no inotify watch on the process's directory")
	}
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatal("no inotify event on the host for the process's output")
	}
	waitProc(t, b, id, p.ID)
	if got := readProc(t, b, id, p.ID); got != "later\n" {
		t.Errorf("the process wrote %q", got)
	}
}

// A command's end never touches a durable process, whether the command
// exits, is killed at its budget (SIGKILL to all it left) or is cancelled
// by its caller: init kills only what is not a keeper's.
func TestGVisorCommandKillsSpareProcesses(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	const id = "procs-spared"
	if _, err := b.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	// A beat is a byte appended (never a file truncated and rewritten,
	// which a loaded host shows empty for as long as date takes to start).
	p, err := b.StartProcess(ctx, id, backend.ProcessRequest{Command: "trap 'echo bye; exit 0' TERM; sleep 600 & while :; do echo >> /tmp/beats; sleep 0.05; done"})
	if err != nil {
		t.Fatal(err)
	}
	beating := func(when string) {
		t.Helper()
		before := execOK(t, b, id, "cat /tmp/beats 2>/dev/null | wc -c")
		deadline := time.Now().Add(10 * time.Second)
		for execOK(t, b, id, "cat /tmp/beats 2>/dev/null | wc -c") == before {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the durable process stopped (%s bytes of beats for 10 s)", when, strings.TrimSpace(before))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	beating("after plain commands")
	res, err := b.Exec(ctx, id, backend.ExecRequest{Command: "trap '' TERM; sleep 60 & sleep 60", Timeout: 500 * time.Millisecond})
	if err != nil || !res.TimedOut {
		t.Fatalf("a command past its budget that ignores TERM: %+v, %v", res, err)
	}
	beating("after a command killed at its budget")
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = b.Exec(cctx, id, backend.ExecRequest{Command: "sleep 60", Timeout: time.Minute})
	cancel()
	if err == nil {
		t.Fatal("a cancelled command returned no error")
	}
	beating("after a cancelled command")
	if got := execOK(t, b, id, "ps -eo args | grep -c '^sleep 60$'; true"); strings.TrimSpace(got) != "0" {
		t.Errorf("the commands' sleeps outlived them: %q", got)
	}
	if got := execOK(t, b, id, "ps -eo args | grep -c '^sleep 600$'; true"); strings.TrimSpace(got) != "1" {
		t.Errorf("the durable process's own child: %q running", got)
	}
	if err := b.SignalProcess(ctx, id, p.ID, 15); err != nil {
		t.Fatal(err)
	}
	if end := waitProc(t, b, id, p.ID); end.ExitCode != 0 {
		t.Errorf("after TERM: %+v", end)
	}
	// The process's own leftovers end with it (its keeper's subreaping).
	if got := execOK(t, b, id, "ps -eo args | grep -c '^sleep 600$'; true"); strings.TrimSpace(got) != "0" {
		t.Errorf("the durable process's child outlived it: %q running", got)
	}
}
