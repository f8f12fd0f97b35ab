package bwrap

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/resources"
)

// TestBwrapSnapshotHoldLeftByADeadDaemonIsThawed: a daemon killed while it
// held a sandbox frozen for a snapshot leaves the sandbox's init and
// durable processes frozen (they outlive their daemon); the next daemon
// thaws them when it re-attaches, and they run on.
func TestBwrapSnapshotHoldLeftByADeadDaemonIsThawed(t *testing.T) {
	cgm := testCgroups(t)
	first := newTestBackend(t, rangeUID, func(c *Config) { c.Cgroups = cgm })
	id := create(t, first, backend.Spec{})
	p, err := first.StartProcess(context.Background(), id, backend.ProcessRequest{
		Command: `i=0; while :; do i=$((i+1)); echo $i > n.tmp; mv n.tmp n; sleep 0.01; done`,
	})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := first.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	count := func(b *Backend) string {
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if data, err := os.ReadFile(filepath.Join(sb.workDir(), "n")); err == nil && len(data) > 0 {
				return string(data)
			}
		}
		t.Fatal("the process wrote nothing")
		return ""
	}
	count(first)
	// The dying daemon's hold: never released.
	_, frozen := first.hold(context.Background(), sb)
	if !frozen {
		t.Fatal("the sandbox was not frozen")
	}
	held := count(first)
	time.Sleep(100 * time.Millisecond)
	if count(first) != held {
		t.Fatal("the frozen process counted on")
	}
	if _, err := os.Lstat(filepath.Join(sb.dir, resources.HeldMarker)); err != nil {
		t.Fatalf("no marker while held: %v", err)
	}

	second, err := New(first.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Adopt(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); count(second) == held; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the process did not run on after the restart")
		}
	}
	if _, err := os.Lstat(filepath.Join(sb.dir, resources.HeldMarker)); !os.IsNotExist(err) {
		t.Errorf("the marker is left: %v", err)
	}
	info, err := second.WaitProcess(context.Background(), id, p.ID, 0)
	if err != nil || !info.Running {
		t.Errorf("the durable process after the restart: %+v, %v", info, err)
	}
	if out := runOK(t, second, id, "echo ok"); out != "ok\n" {
		t.Errorf("a command after the restart: %q", out)
	}
}
