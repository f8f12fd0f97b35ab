package gvisor

import (
	"context"
	"encoding/json"
	"strings"
	"syscall"
	"testing"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// A fork with memory makes copies whose durable processes go on from
// where the source's were, with the source's memory (the holder's token
// and checksum), each its own: killing a copy's process leaves the
// source's and the other's running. The source runs on; each copy's guest
// can tell it was restored (RestoredMarker) and gets its own kernel
// randomness. A paused source forks too, and stays paused.
func TestGVisorForkWithMemory(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	const src = "origin"
	if _, err := b.Create(ctx, src, backend.Spec{Env: map[string]string{"WHO": "origin"}}); err != nil {
		t.Fatal(err)
	}
	execOK(t, b, src, "echo kept > /workspace/f")
	p, err := b.StartProcess(ctx, src, backend.ProcessRequest{Argv: []string{"python3", "-c", holder}})
	if err != nil {
		t.Fatal(err)
	}
	advances(t, b, src, p.ID, 0, "before the fork")
	res, err := b.Fork(ctx, src, []string{"copy-a", "copy-b"}, backend.SnapshotOptions{Memory: true})
	if err != nil {
		t.Fatalf("Fork with memory: %v", err)
	}
	if len(res.Infos) != 2 {
		t.Fatalf("Fork made %d sandboxes", len(res.Infos))
	}
	srcLines := holderLines(t, readProc(t, b, src, p.ID))
	tokenOf := func(id string) string {
		out := readProc(t, b, id, p.ID)
		return strings.Fields(out)[1]
	}
	randoms := map[string]bool{}
	for _, id := range []string{"copy-a", "copy-b"} {
		advances(t, b, id, p.ID, written(t, b, id, p.ID), "a copy's process")
		if n := holderLines(t, readProc(t, b, id, p.ID)); n < 2 {
			t.Fatalf("%s's holder printed %d lines", id, n)
		}
		if tokenOf(id) != tokenOf(src) {
			t.Errorf("%s's holder has another token: its memory is not the source's", id)
		}
		if got := execOK(t, b, id, `cat /workspace/f; echo "$WHO"`); got != "kept\norigin\n" {
			t.Errorf("%s: %q", id, got)
		}
		var m restored
		if err := json.Unmarshal([]byte(execOK(t, b, id, "cat /tmp/"+RestoredMarker)), &m); err != nil || m.From != src {
			t.Errorf("%s's restored marker: %+v, %v", id, m, err)
		}
		randoms[execOK(t, b, id, "head -c 16 /dev/urandom | od -An -tx1")] = true
	}
	randoms[execOK(t, b, src, "head -c 16 /dev/urandom | od -An -tx1")] = true
	if len(randoms) != 3 {
		t.Errorf("the source and its copies drew the same kernel randomness: %v", randoms)
	}
	if _, err := b.ReadFile(ctx, src, "/tmp/"+RestoredMarker, 1024); err == nil {
		t.Error("the source has a restored marker")
	}
	// Independent: a copy's process killed, the others run on.
	if err := b.SignalProcess(ctx, "copy-a", p.ID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitProc(t, b, "copy-a", p.ID)
	advances(t, b, src, p.ID, written(t, b, src, p.ID), "the source after its copy's process was killed")
	advances(t, b, "copy-b", p.ID, written(t, b, "copy-b", p.ID), "the other copy")
	if n := holderLines(t, readProc(t, b, src, p.ID)); n <= srcLines {
		t.Errorf("the source's holder did not go on (%d lines, then %d)", srcLines, n)
	}
	// A paused source: its checkpoint is the copy's, and it stays paused.
	mustPause(t, b, src)
	if _, err := b.Fork(ctx, src, []string{"copy-c"}, backend.SnapshotOptions{Memory: true}); err != nil {
		t.Fatalf("Fork of a paused sandbox with memory: %v", err)
	}
	if !paused(t, b, src) {
		t.Fatal("a fork unpaused its source")
	}
	advances(t, b, "copy-c", p.ID, written(t, b, "copy-c", p.ID), "a paused source's copy")
	holderLines(t, readProc(t, b, "copy-c", p.ID))
	if err := b.Resume(ctx, src); err != nil {
		t.Fatal(err)
	}
	advances(t, b, src, p.ID, written(t, b, src, p.ID), "the source resumed after its fork")
}
