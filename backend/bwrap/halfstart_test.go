package bwrap

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/procstore"
)

// dyingAgent stands for a daemon killed mid-start: its StartKeeper has the
// record made and never hands the process to init (until released).
type dyingAgent struct{ entered, release chan struct{} }

func (a dyingAgent) StartKeeper(ctx context.Context, req agent.Request, f procstore.Files) (int, error) {
	close(a.entered)
	<-a.release
	return 0, errors.New("released by the test")
}

func (dyingAgent) SignalKeeper(context.Context, string, syscall.Signal) error {
	return backend.ErrProcessEnded
}

func (dyingAgent) AgentAlive() bool { return true }

// A daemon that died between recording a process and init taking it left
// a record with no keeper: the next daemon, re-attaching to the init,
// ends it (it would read as running for as long as the init lives), and
// spares the process init does run. The start, delivered late, is refused.
func TestBwrapRestartEndsAStartItsDaemonDiedIn(t *testing.T) {
	ctx := context.Background()
	first := newTestBackend(t, rangeUID)
	id := create(t, first, backend.Spec{})
	live, err := first.StartProcess(ctx, id, backend.ProcessRequest{Name: "live", Command: "sleep 60"})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := first.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	dying := dyingAgent{entered: make(chan struct{}), release: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		_, err := first.store(sb).Start(ctx, dying, procstore.StartSpec{Name: "half", Command: "true",
			Request: agent.Request{Argv: []string{"/bin/true"}, Cwd: "/"}})
		started <- err
	}()
	<-dying.entered
	defer func() { close(dying.release); <-started }()

	second, err := New(first.cfg)
	if err != nil {
		t.Fatal(err)
	}
	procs, err := second.ListProcesses(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var half backend.ProcessInfo
	for _, p := range procs {
		switch p.Name {
		case "half":
			half = p
		case "live":
			if !p.Running {
				t.Errorf("the process init runs was ended by the re-attach: %+v", p)
			}
		}
	}
	if half.ID == "" || half.Running || half.ExitCode != 137 || half.Reason != "killed" {
		t.Fatalf("the half-started process after a restart: %+v; want ended (killed, exit unknown) in %+v", half, procs)
	}

	// Its start reaches init after all (it was in the socket when the
	// daemon died): init refuses it, so it never runs under an end said.
	dir := filepath.Join(procsDir(sb.dir), half.ID)
	var f procstore.Files
	f.Stdin, _ = os.Open(os.DevNull)
	for _, x := range []struct {
		name string
		to   **os.File
	}{{"stdout", &f.Stdout}, {"stderr", &f.Stderr}, {"exit", &f.Exit}} {
		if *x.to, err = os.OpenFile(filepath.Join(dir, x.name), os.O_RDWR, 0); err != nil {
			t.Fatal(err)
		}
	}
	defer f.Close()
	sb2, err := second.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	_, err = (&bwAgent{b: second, sb: sb2}).StartKeeper(ctx, agent.Request{ID: half.ID, Argv: []string{"/bin/sh", "-c", "touch /workspace/ran"}, Cwd: "/"}, f)
	if err == nil || !strings.Contains(err.Error(), "given up") {
		t.Errorf("a late start of a given-up process: %v; want it refused", err)
	}
	if res := run(t, second, id, "test -e /workspace/ran"); res.ExitCode == 0 {
		t.Error("the given-up process ran")
	}
	if err := second.SignalProcess(ctx, id, live.ID, syscall.SIGKILL); err != nil {
		t.Error(err)
	}
	if p, err := second.WaitProcess(ctx, id, live.ID, 10*time.Second); err != nil || p.Running {
		t.Errorf("the live process after SIGKILL: %+v, %v", p, err)
	}
}
