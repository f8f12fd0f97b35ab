package bwrap

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/cgroup"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

// logBuffer is a log sink tests read while the backend writes.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// A destroy that lands while a new sandbox's bwrap has just started, its
// first process not yet let go (on cgroup v1 it waits at the --block-fd
// gate, where bwrap has not yet given it a parent-death signal: the kill
// of bwrap's process group, which it is still in, is what ends it) ends
// the start at once, with no process outliving it and nothing of the
// sandbox left. The start is held exactly there by a failpoint.
func TestDestroyDuringInitSpawnEndsItAtTheGate(t *testing.T) {
	m := testCgroups(t)
	var armed atomic.Bool
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	logs := &logBuffer{}
	b := newTestBackend(t, rangeUID, withCgroups(m, limits.Limits{}), func(c *Config) {
		c.Logger = hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Warn})
		c.Failpoint = func(name string) {
			if name == FailInitSpawned && armed.Load() {
				once.Do(func() { close(reached) })
				<-release
			}
		}
	})
	armed.Store(true)
	id := create(t, b, backend.Spec{})
	// After create's: cleanups run last-first, and its destroy would wait
	// for the start held here.
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	await(t, reached, "the new sandbox's init start at its spawn")
	armed.Store(false)
	if m.Version() != cgroup.V2 {
		// bwrap and, once bwrap has built the namespaces, the first
		// process it forked, held at the gate.
		for deadline := time.Now().Add(20 * time.Second); len(b.findMarked(b.sandboxDir(id), false)) < 2; {
			if time.Now().After(deadline) {
				t.Fatal("bwrap's first process never reached the gate")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// What Destroy does first, done here so that it comes before the start
	// goes on: cancel the sandbox's operations, the start among them.
	sb, err := b.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	sb.ops.CancelAll()
	close(release)
	if err := b.Destroy(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	if out := logs.String(); strings.Contains(out, "outlived") || strings.Contains(out, "still alive") {
		t.Errorf("a process of the start outlived the kill of its bwrap's group:\n%s", out)
	}
	leftNothing(t, b, id)
}

// When what bwrap started outlives bwrap (a sandbox's first process has
// no parent-death signal for a moment after bwrap lets it go: killed
// then, bwrap leaves it running, re-parented, holding the control socket;
// seen as a 5 s destroy about once in 600 creates destroyed at once),
// stopping the init kills every process carrying the sandbox's marker as
// soon as the socket fails to hang up, rather than waiting out
// initReapWait for a death that will not come. The window is a few
// instructions inside bwrap, so this test makes it last: its "bwrap" runs
// the real one from a process of another session that the daemon's kill
// of bwrap does not reach, as a re-parented child would not be reached.
func TestStopInitKillsWhatOutlivesBwrap(t *testing.T) {
	real, err := exec.LookPath("bwrap")
	if err != nil {
		skipOrFail(t, "bubblewrap is not installed: %v", err)
	}
	wrapper := filepath.Join(t.TempDir(), "bwrap")
	// bwrap's parent is the middle shell, which lives on in a session of
	// its own: bwrap's --die-with-parent does not fire.
	script := "#!/bin/sh\nsetsid /bin/sh -c '\"$0\" \"$@\"; exit $?' " + real + " \"$@\" &\nwait $!\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	b := newTestBackend(t, daemonUID, func(c *Config) {
		c.BwrapPath = wrapper
		c.Logger = hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Warn})
	})
	id := create(t, b, backend.Spec{})
	runOK(t, b, id, "true")
	sb, err := b.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	// Stop the init as a destroy does, without the destroy's own sweep of
	// the sandbox's processes after it.
	b.killInit(sb)
	out := logs.String()
	if strings.Contains(out, "still alive after its bwrap was killed") {
		t.Errorf("stopping the init waited its whole limit for processes that outlived bwrap:\n%s", out)
	}
	if !strings.Contains(out, "outlived its init's bwrap") {
		t.Errorf("stopping the init did not kill what outlived bwrap:\n%s", out)
	}
	if left := b.findMarked(b.sandboxDir(id), false); len(left) > 0 {
		t.Errorf("processes of the sandbox are left after its init was stopped: %+v", left)
	}
}
