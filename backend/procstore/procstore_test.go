package procstore

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/proclog"
)

// A process whose agent is lost for good reads as ended with its sandbox,
// even once another agent runs; one that had ended keeps its own end.
func TestAgentLostEndsWhatHasNoExitRecord(t *testing.T) {
	s := New(filepath.Join(t.TempDir(), "procs"), Limits{}, nil)
	if n, err := s.AgentLost(nil); n != 0 || err != nil {
		t.Fatalf("AgentLost before any process: %d, %v", n, err)
	}
	mk := func(id string) Files {
		if err := os.MkdirAll(s.dir, 0o700); err != nil {
			t.Fatal(err)
		}
		f, err := s.create(meta{ID: id, Command: "sleep 600", StartedNS: time.Now().UnixNano()})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	running, ended, listed := mk("p-000000000001"), mk("p-000000000002"), mk("p-000000000003")
	defer running.Close()
	defer ended.Close()
	defer listed.Close()
	if err := proclog.WriteExit(ended.Exit, proclog.Exit{How: proclog.EndExited, Code: 3, EndedNS: time.Now().UnixNano()}); err != nil {
		t.Fatal(err)
	}
	if p, err := s.Info("p-000000000001", true); err != nil || !p.Running {
		t.Fatalf("before AgentLost, with a live agent: %+v, %v", p, err)
	}
	// The agent lists p-3 as running: only p-1 never got a keeper.
	if n, err := s.AgentLost(func(id string) bool { return id == "p-000000000003" }); n != 1 || err != nil {
		t.Fatalf("AgentLost marked %d (%v), want the one without an exit record the agent does not run", n, err)
	}
	if p, err := s.Info("p-000000000003", true); err != nil || !p.Running {
		t.Errorf("a process the agent runs, after AgentLost: %+v, %v", p, err)
	}
	if n, err := s.AgentLost(nil); n != 1 || err != nil {
		t.Fatalf("AgentLost of them all marked %d (%v), want the one left", n, err)
	}
	p, err := s.Info("p-000000000001", true)
	if err != nil || p.Running || p.Reason != "sandbox_terminated" || p.ExitCode != 137 {
		t.Errorf("a lost process while the next agent runs: %+v, %v", p, err)
	}
	p, err = s.Info("p-000000000002", true)
	if err != nil || p.Running || p.Reason != "exited" || p.ExitCode != 3 {
		t.Errorf("an ended process after AgentLost: %+v, %v", p, err)
	}
}
