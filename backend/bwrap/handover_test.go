package bwrap

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// An init that dies between the daemon's check that it lives and the
// hand-over of a command: the send fails, and the command ends at once as
// one that ended with its sandbox (never waiting on pipes nobody was
// given). The failpoint kills init exactly there.
func TestBwrapInitDeadAtTheHandOver(t *testing.T) {
	var b *Backend
	var armed atomic.Bool
	const id = "handover"
	b = newTestBackend(t, daemonUID, func(c *Config) {
		c.Failpoint = func(name string) {
			if name != FailExecSending || !armed.CompareAndSwap(true, false) {
				return
			}
			sb, err := b.lookup(id)
			if err != nil {
				t.Error(err)
				return
			}
			sb.initMu.Lock()
			ip := sb.init
			sb.initMu.Unlock()
			_ = unix.Kill(-ip.cmd.Process.Pid, unix.SIGKILL)
			for deadline := time.Now().Add(10 * time.Second); ip.alive() && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
		}
	})
	ctx := context.Background()
	_, err := b.Create(ctx, id, backend.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Destroy(ctx, id)
	if _, err := b.Exec(ctx, id, backend.ExecRequest{Command: "true", Timeout: 10 * time.Second}); err != nil {
		t.Fatal(err) // init started and warm
	}
	armed.Store(true)
	done := make(chan backend.ExecResult, 1)
	go func() {
		res, err := b.Exec(ctx, id, backend.ExecRequest{Command: "echo never", Timeout: 10 * time.Second})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	select {
	case res := <-done:
		if !res.SandboxTerminated || res.ExitCode != backend.ExitKilled || len(res.Stdout) != 0 {
			t.Errorf("a command init never got: %+v", res)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Exec hung after a failed hand-over")
	}
	if armed.Load() {
		t.Fatal("the failpoint was never reached")
	}
}
