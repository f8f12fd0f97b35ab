package bwrap

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

// pauseBackend is a backend whose sandboxes can be paused: a cgroup each.
func pauseBackend(t *testing.T, tweak ...func(*Config)) *Backend {
	t.Helper()
	m := testCgroups(t)
	return newTestBackend(t, rangeUID, append([]func(*Config){withCgroups(m, limits.Defaults())}, tweak...)...)
}

// counted starts a durable process in id that writes 1, 2, 3, ... into
// count.txt, and waits until it wrote something.
func counted(t *testing.T, b *Backend, id string) backend.ProcessInfo {
	t.Helper()
	p, err := b.StartProcess(context.Background(), id, backend.ProcessRequest{Command: `i=0; while :; do i=$((i+1)); echo $i > count.tmp; mv count.tmp count.txt; sleep 0.01; done`})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for count(t, b, id) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the counter never counted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return p
}

// count reads count.txt from the host (a paused sandbox is not asked).
func count(t *testing.T, b *Backend, id string) int {
	t.Helper()
	sb, err := b.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(sb.workDir(), "count.txt"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return n
}

// A paused sandbox survives its daemon's clean stop (Close leaves its
// frozen group and its init, whether or not that daemon re-attached to
// the init) and a resume cut short after the thaw (the next daemon
// re-attaches to the init, as after any restart).
func TestBwrapPausedSandboxOutlivesCloseAndACutResume(t *testing.T) {
	var cut atomic.Bool
	first := pauseBackend(t, func(c *Config) {
		c.Failpoint = func(name string) {
			if name == FailResumeThawed && cut.Load() {
				panic(name)
			}
		}
	})
	id := create(t, first, backend.Spec{})
	counted(t, first, id)
	initBefore := initPID(t, first, id)
	if _, err := first.Pause(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	at := count(t, first, id)
	if err := first.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	second, err := New(first.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Adopt(context.Background(), id); err != nil {
		t.Fatalf("Adopt of a paused sandbox after a clean stop: %v", err)
	}
	if paused, _ := second.Paused(context.Background(), id); paused == nil || paused.MemoryReleased {
		t.Fatalf("a paused sandbox after its daemon's clean stop: %+v; want paused, its memory kept", paused)
	}
	time.Sleep(200 * time.Millisecond)
	if now := count(t, second, id); now != at {
		t.Fatalf("the counter went on while paused across a restart: %d, then %d", at, now)
	}
	if _, err := second.Exec(context.Background(), id, backend.ExecRequest{Command: "true", Timeout: time.Second}); !errors.Is(err, backend.ErrPaused) {
		t.Errorf("a command in a paused sandbox: %v, want ErrPaused (the caller resumes first)", err)
	}
	// Stopped again while it holds the sandbox paused but not its init.
	if err := second.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	second, err = New(first.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Adopt(context.Background(), id); err != nil {
		t.Fatalf("Adopt of a paused sandbox after a second clean stop: %v", err)
	}
	if paused, _ := second.Paused(context.Background(), id); paused == nil {
		t.Fatal("a paused sandbox is no longer paused after a second clean stop")
	}

	// The resume dies between the thaw and the re-attach.
	cut.Store(true)
	func() {
		defer func() {
			if r := recover(); r != FailResumeThawed {
				t.Fatalf("the resume was not cut at its failpoint: %v", r)
			}
		}()
		_ = second.Resume(context.Background(), id)
	}()
	cut.Store(false)
	third, err := New(first.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := third.Adopt(context.Background(), id); err != nil {
		t.Fatalf("Adopt after a cut resume: %v", err)
	}
	if paused, _ := third.Paused(context.Background(), id); paused != nil {
		t.Fatal("a sandbox thawed by a cut resume reads as paused")
	}
	if err := third.Resume(context.Background(), id); err != nil {
		t.Fatalf("Resume of a running sandbox: %v", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for count(t, third, id) <= at {
		if time.Now().After(deadline) {
			t.Fatal("the counter did not go on after the resume")
		}
		time.Sleep(10 * time.Millisecond)
	}
	runOK(t, third, id, "true")
	if got := initPID(t, third, id); got != initBefore {
		t.Errorf("init after the pause, a clean stop and a cut resume: %d, want the first one (%d) re-attached", got, initBefore)
	}
	if err := third.Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}
}

// A sandbox whose init is being started is paused once the start ended,
// never with its init frozen halfway.
func TestBwrapPauseWaitsForTheInitsStart(t *testing.T) {
	release := make(chan struct{})
	var held atomic.Bool
	b := pauseBackend(t, func(c *Config) {
		c.Failpoint = func(name string) {
			if name == FailStartSoon && held.CompareAndSwap(false, true) {
				<-release
			}
		}
	})
	id := create(t, b, backend.Spec{})
	paused := make(chan error, 1)
	go func() {
		_, err := b.Pause(context.Background(), id)
		paused <- err
	}()
	select {
	case err := <-paused:
		t.Fatalf("the pause did not wait for the init's start: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if err := <-paused; err != nil {
		t.Fatal(err)
	}
	if err := b.Resume(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	runOK(t, b, id, "true")
}
