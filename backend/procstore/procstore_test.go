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
	if n, err := s.AgentLost(); n != 0 || err != nil {
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
	running, ended := mk("p-000000000001"), mk("p-000000000002")
	defer running.Close()
	defer ended.Close()
	if err := proclog.WriteExit(ended.Exit, proclog.Exit{How: proclog.EndExited, Code: 3, EndedNS: time.Now().UnixNano()}); err != nil {
		t.Fatal(err)
	}
	if p, err := s.Info("p-000000000001", true); err != nil || !p.Running {
		t.Fatalf("before AgentLost, with a live agent: %+v, %v", p, err)
	}
	if n, err := s.AgentLost(); n != 1 || err != nil {
		t.Fatalf("AgentLost marked %d (%v), want the one without an exit record", n, err)
	}
	if n, err := s.AgentLost(); n != 0 || err != nil {
		t.Fatalf("AgentLost again marked %d (%v)", n, err)
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
