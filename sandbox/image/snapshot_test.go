package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

// sandboxDirs makes a sandbox's workspace and /tmp as a guest might
// leave them: files, an executable, a secret of mode 0600, a symlink out
// of the sandbox, a hard link, a FIFO.
func sandboxDirs(t *testing.T) map[string]string {
	t.Helper()
	parent := t.TempDir()
	ws, tmp := filepath.Join(parent, "work"), filepath.Join(parent, "tmp")
	for p, body := range map[string]string{
		"work/app/main.py":   "print('hi')\n",
		"work/bin/tool":      "#!/bin/sh\necho tool\n",
		"work/secret":        "s3cret",
		"tmp/cache/blob.bin": "cache",
	} {
		must(t, os.MkdirAll(filepath.Dir(filepath.Join(parent, p)), 0o700))
		must(t, os.WriteFile(filepath.Join(parent, p), []byte(body), 0o600))
	}
	must(t, os.Chmod(filepath.Join(ws, "bin/tool"), 0o700))
	must(t, os.Symlink("/etc/shadow", filepath.Join(ws, "shadow-link")))
	must(t, os.Link(filepath.Join(ws, "app/main.py"), filepath.Join(ws, "app/same.py")))
	must(t, syscall.Mkfifo(filepath.Join(ws, "pipe"), 0o600))
	return map[string]string{WorkspaceDir: ws, TmpDir: tmp}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func ino(t *testing.T, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Lstat(p, &st))
	return st.Ino
}

func TestSnapshotOfASandboxOnAnImage(t *testing.T) {
	e := newEnv(t, Limits{})
	base := e.mustImport("base", ociArchive(t, imageOf(t, baseLayer(), []ent{
		file("workspace/from-the-image", "image's own"), file("tmp/old", "x"),
	})))
	dirs := sandboxDirs(t)
	uid := uint32(4242)
	info, err := e.s.Snapshot(context.Background(), "prepared", SnapshotSource{BaseDigest: base.Digest, Dirs: dirs,
		Origin: Origin{Sandbox: "sc-1", BaseImage: "base", BaseDigest: base.Digest, UID: &uid}})
	must(t, err)
	if info.Source != SourceSnapshot || info.Base != "" || info.Origin == nil || info.Origin.Sandbox != "sc-1" ||
		info.Origin.BaseImage != "base" || *info.Origin.UID != 4242 || info.Origin.Taken.IsZero() {
		t.Fatalf("info %+v origin %+v", info, info.Origin)
	}
	if info.Digest == base.Digest || !strings.HasPrefix(info.Digest, "sha256:") {
		t.Errorf("digest %s", info.Digest)
	}
	if !equalStrings(info.Env, testConfig.Env) || info.WorkingDir != testConfig.WorkingDir {
		t.Errorf("the base's config did not carry over: %+v", info)
	}
	// The base's files are links of the base's, not copies.
	if ino(t, filepath.Join(info.Root, "etc/os-release")) != ino(t, filepath.Join(base.Root, "etc/os-release")) {
		t.Error("a base file was copied, not linked")
	}
	// The sandbox's files, in the store's modes; the base's own
	// workspace and tmp are replaced by the sandbox's.
	if got := readRoot(t, info, "workspace/app/main.py"); got != "print('hi')\n" {
		t.Errorf("main.py = %q", got)
	}
	if readRoot(t, info, "tmp/cache/blob.bin") != "cache" {
		t.Error("tmp not kept")
	}
	for _, p := range []string{"workspace/from-the-image", "tmp/old", "workspace/pipe"} {
		if exists(info.Root, p) {
			t.Errorf("%s is in the snapshot", p)
		}
	}
	for p, want := range map[string]fs.FileMode{"workspace/secret": 0o444, "workspace/bin/tool": 0o555, "workspace/app": fs.ModeDir | 0o755, "workspace": fs.ModeDir | 0o755} {
		fi, err := os.Lstat(filepath.Join(info.Root, p))
		must(t, err)
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), want)
		}
	}
	if l, err := os.Readlink(filepath.Join(info.Root, "workspace/shadow-link")); err != nil || l != "/etc/shadow" {
		t.Errorf("the symlink is %q (%v)", l, err)
	}
	if ino(t, filepath.Join(info.Root, "workspace/app/main.py")) != ino(t, filepath.Join(info.Root, "workspace/app/same.py")) {
		t.Error("a hard link in the workspace became two files")
	}
	// It is an image like any: listed, kept across a reopen, removable,
	// and the base's removal leaves it whole.
	e.open(Limits{})
	got, err := e.s.Get("prepared")
	must(t, err)
	if got.Origin == nil || got.Origin.Sandbox != "sc-1" || got.Digest != info.Digest || got.Bytes != info.Bytes || got.Files != info.Files {
		t.Errorf("after a reopen: %+v", got)
	}
	must(t, e.s.Remove("base"))
	if readRoot(t, got, "etc/os-release") == "" {
		t.Error("the base's removal emptied the snapshot's file")
	}
	if _, err := e.s.Snapshot(context.Background(), "prepared", SnapshotSource{Dirs: dirs}); !errors.Is(err, ErrExists) {
		t.Errorf("a snapshot under a taken name: %v, want ErrExists", err)
	}
	if _, err := e.s.Snapshot(context.Background(), "host", SnapshotSource{Dirs: dirs}); !errors.Is(err, ErrBadName) {
		t.Errorf("a snapshot named host: %v, want ErrBadName", err)
	}
	must(t, e.s.Remove("prepared"))
	e.checkEmpty()
	e.checkOutside()
}

func TestSnapshotOfASandboxOnTheHost(t *testing.T) {
	e := newEnv(t, Limits{})
	info, err := e.s.Snapshot(context.Background(), "on-host", SnapshotSource{Dirs: sandboxDirs(t), Origin: Origin{Sandbox: "sc-2", BaseImage: HostName}})
	must(t, err)
	if info.Base != BaseHost {
		t.Fatalf("base %q, want %q", info.Base, BaseHost)
	}
	ents, err := os.ReadDir(info.Root)
	must(t, err)
	if len(ents) != 2 || ents[0].Name() != TmpDir || ents[1].Name() != WorkspaceDir {
		t.Errorf("the root of a host snapshot holds %v, want tmp and workspace alone", ents)
	}
	e.open(Limits{})
	if got, _ := e.s.Get("on-host"); got.Base != BaseHost {
		t.Errorf("after a reopen the base is %q", got.Base)
	}
	// A sandbox made from it runs on the host's root: so does its
	// snapshot.
	again, err := e.s.Snapshot(context.Background(), "again", SnapshotSource{BaseDigest: info.Digest, Dirs: sandboxDirs(t)})
	must(t, err)
	if again.Base != BaseHost {
		t.Errorf("a snapshot of a sandbox on a host snapshot has base %q", again.Base)
	}
}

func TestSnapshotLimitsLeaveNothing(t *testing.T) {
	dirs := sandboxDirs(t)
	must(t, os.WriteFile(filepath.Join(dirs[WorkspaceDir], "big"), bytes.Repeat([]byte{7}, 64<<10), 0o644))
	for _, lim := range []Limits{{MaxBytes: 32 << 10}, {MaxFiles: 5}} {
		e := newEnv(t, lim)
		_, err := e.s.Snapshot(context.Background(), "too-big", SnapshotSource{Dirs: dirs})
		if !errors.Is(err, ErrTooLarge) {
			t.Errorf("limits %+v: %v, want ErrTooLarge", lim, err)
		}
		e.checkEmpty()
	}
	// The base counts too.
	e := newEnv(t, Limits{MaxFiles: 12})
	base := e.mustImport("base", ociArchive(t, imageOf(t, baseLayer())))
	if base.Files >= 12 {
		t.Fatalf("the base has %d files", base.Files)
	}
	if _, err := e.s.Snapshot(context.Background(), "s", SnapshotSource{BaseDigest: base.Digest, Dirs: dirs}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("base + sandbox over max_files: %v", err)
	}
	if l := e.s.List(); len(l) != 1 {
		t.Errorf("store lists %v", l)
	}
}

func TestSnapshotDiskFullLeavesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "mounting a small tmpfs needs root")
	}
	parent := t.TempDir()
	if err := unix.Mount("tmpfs", parent, "tmpfs", 0, "size=2m"); err != nil {
		skipOrFail(t, "mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(parent, unix.MNT_DETACH) })
	s, err := Open(filepath.Join(parent, "store"), Limits{}, testLogger(t))
	must(t, err)
	dirs := sandboxDirs(t)
	must(t, os.WriteFile(filepath.Join(dirs[WorkspaceDir], "big"), bytes.Repeat([]byte{7}, 4<<20), 0o644))
	_, err = s.Snapshot(context.Background(), "full", SnapshotSource{Dirs: dirs})
	if !errors.Is(err, ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a snapshot of 4 MiB into 2 MiB: %v, want ErrNoSpace", err)
	}
	e := &env{t: t, store: filepath.Join(parent, "store"), s: s}
	e.checkEmpty()
	// Room again: it works.
	must(t, os.Remove(filepath.Join(dirs[WorkspaceDir], "big")))
	if _, err := s.Snapshot(context.Background(), "fits", SnapshotSource{Dirs: dirs}); err != nil {
		t.Fatalf("after the space came back: %v", err)
	}
}

func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// TestCrashMidSnapshot kills a process taking a snapshot at each durable
// step and opens the store again: no half image, no name, no debris.
func TestCrashMidSnapshot(t *testing.T) {
	dirs := sandboxDirs(t)
	for _, stage := range []string{"snapshot-copied", "unpacked", "placed"} {
		t.Run(stage, func(t *testing.T) {
			e := newEnv(t, Limits{})
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), crashStoreEnv+"="+e.store, crashSnapshotEnv+"="+dirs[WorkspaceDir], crashStageEnv+"="+stage)
			out, err := cmd.StdoutPipe()
			must(t, err)
			cmd.Stderr = os.Stderr
			must(t, cmd.Start())
			reached := make(chan bool, 1)
			go func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					if sc.Text() == crashReady {
						reached <- true
						return
					}
					t.Logf("helper: %s", sc.Text())
				}
				reached <- false
			}()
			select {
			case ok := <-reached:
				if !ok {
					cmd.Wait()
					t.Fatalf("the helper ended before %s", stage)
				}
			case <-time.After(2 * time.Minute):
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("the helper did not reach %s", stage)
			}
			must(t, cmd.Process.Kill())
			cmd.Wait()
			e.open(Limits{})
			e.checkEmpty()
			if _, err := e.s.Snapshot(context.Background(), "img", SnapshotSource{Dirs: dirs}); err != nil {
				t.Fatalf("after the restart: %v", err)
			}
		})
	}
}

// TestExportRoundTrip exports a snapshot as a layer, makes it an image
// with the labels a push writes, and imports that into another store, as
// a second host's pull would: the files, the links and the base come
// back.
func TestExportRoundTrip(t *testing.T) {
	e := newEnv(t, Limits{})
	info, err := e.s.Snapshot(context.Background(), "on-host", SnapshotSource{Dirs: sandboxDirs(t), Origin: Origin{Sandbox: "sc-3", BaseImage: HostName, Taken: testTime}})
	must(t, err)
	var layerTar bytes.Buffer
	got, err := e.s.Export(context.Background(), "on-host", &layerTar)
	must(t, err)
	if got.Digest != info.Digest {
		t.Fatalf("Export returned %+v", got)
	}
	// Deterministic: the same bytes twice.
	var again bytes.Buffer
	_, err = e.s.Export(context.Background(), "on-host", &again)
	must(t, err)
	if !bytes.Equal(layerTar.Bytes(), again.Bytes()) {
		t.Error("two exports of one image differ")
	}
	tr := tar.NewReader(bytes.NewReader(layerTar.Bytes()))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(t, err)
		if hdr.Uid != 0 || hdr.Gid != 0 {
			t.Errorf("%s is owned by %d:%d in the layer", hdr.Name, hdr.Uid, hdr.Gid)
		}
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar.Bytes())), nil })
	must(t, err)
	img, err := mutate.AppendLayers(empty.Image, layer)
	must(t, err)
	img, err = mutate.Config(img, v1.Config{Labels: map[string]string{
		LabelBase: BaseHost, LabelSandbox: "sc-3", LabelBaseImage: HostName, LabelTaken: testTime.Format(time.RFC3339Nano),
	}})
	must(t, err)
	other := newEnv(t, Limits{})
	pulled, err := other.s.ImportImage(context.Background(), img, "pulled", SourceRegistry)
	must(t, err)
	if pulled.Base != BaseHost || pulled.Origin == nil || pulled.Origin.Sandbox != "sc-3" || !pulled.Origin.Taken.Equal(testTime) || pulled.Origin.UID != nil {
		t.Errorf("pulled %+v origin %+v", pulled, pulled.Origin)
	}
	if readRoot(t, pulled, "workspace/app/main.py") != "print('hi')\n" || readRoot(t, pulled, "tmp/cache/blob.bin") != "cache" {
		t.Error("the files did not come back")
	}
	if ino(t, filepath.Join(pulled.Root, "workspace/app/main.py")) != ino(t, filepath.Join(pulled.Root, "workspace/app/same.py")) {
		t.Error("the hard link did not come back")
	}
	if l, _ := os.Readlink(filepath.Join(pulled.Root, "workspace/shadow-link")); l != "/etc/shadow" {
		t.Errorf("the symlink came back as %q", l)
	}
}

// A snapshot with memory keeps it beside its root, the daemon's alone
// (0700, files 0600), counted against the caps and out of the export, of
// a sandbox on the host's root or on an image (which may go after); a
// record claiming memory whose directory is not private is dropped at the
// next open, and an import never carries any.
func TestSnapshotWithMemory(t *testing.T) {
	e := newEnv(t, Limits{})
	mem := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(mem, "checkpoint"), 0o755))
	must(t, os.WriteFile(filepath.Join(mem, "checkpoint", "pages.img"), []byte("the guest's memory"), 0o644))
	info, err := e.s.Snapshot(context.Background(), "with-memory", SnapshotSource{Dirs: sandboxDirs(t), Memory: mem, Origin: Origin{Sandbox: "sc-3", BaseImage: HostName}})
	must(t, err)
	if info.Memory != filepath.Join(filepath.Dir(info.Root), MemoryDir) {
		t.Fatalf("Memory %q, root %q", info.Memory, info.Root)
	}
	for p, want := range map[string]os.FileMode{info.Memory: 0o700, filepath.Join(info.Memory, "checkpoint"): 0o700, filepath.Join(info.Memory, "checkpoint", "pages.img"): 0o600} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v, %v; want mode %o", p, fi, err, want)
		}
	}
	var tarball strings.Builder
	_, err = e.s.Export(context.Background(), "with-memory", &tarball)
	must(t, err)
	if strings.Contains(tarball.String(), "the guest's memory") {
		t.Error("the export carries the memory")
	}
	plain, err := e.s.Snapshot(context.Background(), "files-only", SnapshotSource{Dirs: sandboxDirs(t), Origin: Origin{Sandbox: "sc-3", BaseImage: HostName}})
	must(t, err)
	if plain.Memory != "" {
		t.Errorf("a snapshot of files only has memory %q", plain.Memory)
	}
	base := e.mustImport("base", ociArchive(t, imageOf(t, baseLayer(), nil)))
	if base.Memory != "" {
		t.Errorf("an import has memory %q", base.Memory)
	}
	// Of a sandbox on an image: its root is the base's, its memory beside
	// it as ever, and neither needs the base once taken.
	onImage, err := e.s.Snapshot(context.Background(), "on-image", SnapshotSource{BaseDigest: base.Digest, Dirs: sandboxDirs(t), Memory: mem,
		Origin: Origin{Sandbox: "sc-4", BaseImage: "base", BaseDigest: base.Digest}})
	must(t, err)
	if onImage.Base != "" || onImage.Memory != filepath.Join(filepath.Dir(onImage.Root), MemoryDir) {
		t.Fatalf("a memory snapshot of a sandbox on an image: %+v", onImage)
	}
	if _, err := os.Stat(filepath.Join(onImage.Memory, "checkpoint", "pages.img")); err != nil {
		t.Fatal(err)
	}
	tarball.Reset()
	_, err = e.s.Export(context.Background(), "on-image", &tarball)
	must(t, err)
	if strings.Contains(tarball.String(), "the guest's memory") || !strings.Contains(tarball.String(), "workspace/") {
		t.Error("the export of a memory snapshot on an image carries the memory, or not its files")
	}
	must(t, e.s.Remove("base"))
	e.open(Limits{})
	if got, err := e.s.Get("with-memory"); err != nil || got.Memory != info.Memory {
		t.Fatalf("after a reopen: %+v, %v", got, err)
	}
	if got, err := e.s.Get("on-image"); err != nil || got.Memory != onImage.Memory {
		t.Fatalf("after its base's removal and a reopen: %+v, %v", got, err)
	}
	must(t, os.Chmod(info.Memory, 0o755))
	e.open(Limits{})
	if _, err := e.s.Get("with-memory"); err == nil {
		t.Error("an image whose memory others can reach was kept")
	}
}
