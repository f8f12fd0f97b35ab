package gvisor

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/image"
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

// A snapshot with memory of a sandbox on the host's root becomes an image
// of the store (sandbox/image) that keeps the checkpoint beside its root,
// where no sandbox reaches and no export takes it; a sandbox created from
// it starts with the source's processes where they were, its files, and
// the restored marker. A sandbox on another image is refused.
func TestGVisorSnapshotWithMemory(t *testing.T) {
	b := newTestBackend(t)
	st, err := image.Open(filepath.Join(t.TempDir(), "images"), image.Limits{}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const src = "snapped"
	if _, err := b.Create(ctx, src, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	execOK(t, b, src, "echo kept > /workspace/f")
	p, err := b.StartProcess(ctx, src, backend.ProcessRequest{Argv: []string{"python3", "-c", holder}})
	if err != nil {
		t.Fatal(err)
	}
	advances(t, b, src, p.ID, 0, "before the snapshot")
	var in image.Info
	err = b.SnapshotFiles(ctx, src, backend.SnapshotOptions{Memory: true}, func(f backend.SandboxFiles) error {
		if f.Memory == "" || !f.Frozen {
			t.Errorf("a snapshot with memory handed over %+v", f)
		}
		var err error
		in, err = st.Snapshot(ctx, "with-memory", image.SnapshotSource{Dirs: map[string]string{image.WorkspaceDir: f.Workspace, image.TmpDir: f.Tmp},
			Memory: f.Memory, Origin: image.Origin{Sandbox: src, BaseImage: backend.HostImage}})
		return err
	})
	if err != nil {
		t.Fatalf("SnapshotFiles with memory: %v", err)
	}
	if fi, err := os.Stat(in.Memory); err != nil || fi.Mode().Perm() != 0o700 || strings.HasPrefix(in.Memory, in.Root+"/") {
		t.Fatalf("the image's memory %q: %v, %v; want a 0700 directory beside its root", in.Memory, fi, err)
	}
	advances(t, b, src, p.ID, written(t, b, src, p.ID), "the source after its snapshot")
	im := backend.Image{Name: in.Name, Digest: in.Digest, Root: in.Root, Base: in.Base, Memory: in.Memory,
		Origin: &backend.ImageOrigin{Sandbox: src}}
	if _, err := b.Create(ctx, "from-memory", backend.Spec{Image: im}); err != nil {
		t.Fatalf("Create from a memory snapshot: %v", err)
	}
	advances(t, b, "from-memory", p.ID, written(t, b, "from-memory", p.ID), "the restored holder")
	holderLines(t, readProc(t, b, "from-memory", p.ID))
	if strings.Fields(readProc(t, b, "from-memory", p.ID))[1] != strings.Fields(readProc(t, b, src, p.ID))[1] {
		t.Error("the restored holder's token is not the source's")
	}
	if got := execOK(t, b, "from-memory", "cat /workspace/f /tmp/"+RestoredMarker); !strings.HasPrefix(got, "kept\n{\"from\":\""+src+"\"") {
		t.Errorf("a sandbox from the snapshot has %q", got)
	}
	// Twice from one image: each its own.
	if _, err := b.Create(ctx, "from-memory-2", backend.Spec{Image: im}); err != nil {
		t.Fatalf("a second Create from the memory snapshot: %v", err)
	}
	advances(t, b, "from-memory-2", p.ID, written(t, b, "from-memory-2", p.ID), "the second restored holder")
	// The export is the root alone.
	var tarball strings.Builder
	if _, err := st.Export(ctx, "with-memory", &tarball); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(tarball.String(), "pages") || strings.Contains(tarball.String(), "checkpoint") {
		t.Error("the export carries the memory checkpoint")
	}
}
