package gvisor

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress/egresstest"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc/inittest"
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
// the restored marker.
func TestGVisorSnapshotWithMemory(t *testing.T) {
	b, _ := egressBackend(t) // egress on: a create with an allow-list is refused for its memory alone
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
	// A restore has its checkpoint's network: an allow-list is refused
	// before anything is made, not by runsc's spec check at boot.
	if _, err := b.Create(ctx, "from-memory-egress", backend.Spec{Image: im, AllowEgressTo: []string{egresstest.Allowed}}); !errors.Is(err, backend.ErrUnsupported) {
		t.Errorf("Create from a memory snapshot with an allow-list: %v, want ErrUnsupported", err)
	}
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

// rootTar is a plain rootfs tar of the tree at root (what `image import`
// takes).
func rootTar(t *testing.T, root string) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(data)
			return err
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return &buf
}

// shellHolder is holder for an image with busybox alone: a token drawn
// once and kept in the shell's memory, printed with a count.
const shellHolder = `tok=$(busybox od -An -N8 -tx8 /dev/urandom | busybox tr -d ' ')
i=0
while :; do i=$((i+1)); echo "$i $tok same"; busybox sleep 0.01; done`

// A snapshot with memory of a sandbox on an imported image (busybox, in a
// real store): the store keeps the checkpoint beside the snapshot's root,
// which is the base's hard-linked, and the base image can go; a sandbox
// created from the snapshot runs on the snapshot's root and restores the
// source's process where it was, with the source's files and a restored
// marker the guest can read whatever the daemon's umask.
func TestGVisorSnapshotWithMemoryOnAnImage(t *testing.T) {
	b := newTestBackend(t, func(c *Config) { c.InitPath = inittest.Init(t, "exe") })
	st, err := image.Open(filepath.Join(t.TempDir(), "images"), image.Limits{}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	base, err := st.ImportArchive(ctx, rootTar(t, busyboxRoot(t, true)), "busybox")
	if err != nil {
		t.Fatal(err)
	}
	// As the packaged unit runs it (UMask=0077).
	old := syscall.Umask(0o077)
	t.Cleanup(func() { syscall.Umask(old) })
	const src = "on-busybox"
	img := backend.Image{Name: base.Name, Digest: base.Digest, Root: base.Root, Env: []string{"PATH=/bin"}}
	if _, err := b.Create(ctx, src, backend.Spec{Image: img}); err != nil {
		t.Fatal(err)
	}
	execOK(t, b, src, "echo kept > /workspace/f")
	p, err := b.StartProcess(ctx, src, backend.ProcessRequest{Argv: []string{"/bin/sh", "-c", shellHolder}})
	if err != nil {
		t.Fatal(err)
	}
	advances(t, b, src, p.ID, 0, "before the snapshot")
	var in image.Info
	err = b.SnapshotFiles(ctx, src, backend.SnapshotOptions{Memory: true}, func(f backend.SandboxFiles) error {
		var err error
		in, err = st.Snapshot(ctx, "busybox-memory", image.SnapshotSource{BaseDigest: base.Digest,
			Dirs:   map[string]string{image.WorkspaceDir: f.Workspace, image.TmpDir: f.Tmp},
			Memory: f.Memory, Origin: image.Origin{Sandbox: src, BaseImage: base.Name, BaseDigest: base.Digest}})
		return err
	})
	if err != nil {
		t.Fatalf("SnapshotFiles with memory of a sandbox on an image: %v", err)
	}
	if in.Memory == "" || in.Base != "" {
		t.Fatalf("the snapshot: %+v", in)
	}
	advances(t, b, src, p.ID, written(t, b, src, p.ID), "the source after its snapshot")
	if err := b.Destroy(ctx, src); err != nil {
		t.Fatal(err)
	}
	if err := st.Remove("busybox"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.PruneImages([]string{in.Digest}); err != nil {
		t.Fatal(err)
	}
	im := backend.Image{Name: in.Name, Digest: in.Digest, Root: in.Root, Env: in.Env, Memory: in.Memory,
		Origin: &backend.ImageOrigin{Sandbox: src, BaseImage: base.Name, BaseDigest: base.Digest}}
	if _, err := b.Create(ctx, "from-memory", backend.Spec{Image: im}); err != nil {
		t.Fatalf("Create from a memory snapshot of a sandbox on an image: %v", err)
	}
	advances(t, b, "from-memory", p.ID, written(t, b, "from-memory", p.ID), "the restored holder")
	holderLines(t, readProc(t, b, "from-memory", p.ID))
	if got := execOK(t, b, "from-memory", "cat /workspace/f /tmp/"+RestoredMarker+" /etc/image-marker"); !strings.HasPrefix(got, "kept\n{\"from\":\""+src+"\"") || !strings.HasSuffix(got, "image\n") {
		t.Errorf("a sandbox from the snapshot has %q", got)
	}
}
