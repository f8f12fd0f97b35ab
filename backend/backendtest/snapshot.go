package backendtest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// The contract of snapshots and forks (backend.Snapshotter,
// backend.Forker) and of a new sandbox's seed (Spec.Seed, an image's
// workspace), for backends with Options.Snapshots.
var snapshotTests = []struct {
	name string
	fn   func(*suite)
}{
	{"SnapshotHandsOverTheFiles", testSnapshotFiles},
	{"SnapshotHoldsRunningCommandsStill", testSnapshotHolds},
	{"ForksAreIndependentCopies", testForks},
	{"ForkIsAllOrNothing", testForkAllOrNothing},
	{"SeedOfANewSandbox", testSeed},
}

func (s *suite) snapshotter() backend.Snapshotter {
	s.Helper()
	sn, ok := s.b.(backend.Snapshotter)
	if !ok {
		s.Fatalf("%T does not implement backend.Snapshotter", s.b)
	}
	return sn
}

func (s *suite) forker() backend.Forker {
	s.Helper()
	f, ok := s.b.(backend.Forker)
	if !ok {
		s.Fatalf("%T does not implement backend.Forker", s.b)
	}
	return f
}

// fill writes what the snapshot tests look for: a file, an executable,
// a nested file, a symlink and, where the sandbox has a /tmp of its own,
// a file there.
func (s *suite) fill(sb sandbox) {
	s.Helper()
	script := `set -e; cd ` + quote(sb.info.Workdir) + `
echo alpha > a.txt
mkdir -p sub/deeper && echo deep > sub/deeper/d.txt
printf '#!/bin/sh\necho tool-ran\n' > tool && chmod 755 tool
ln -s a.txt link`
	if s.opts.RealIsolation {
		script += "\necho in-tmp > /tmp/t.txt"
	}
	s.runOK(sb, script)
}

func testSnapshotFiles(s *suite) {
	sb := s.create(backend.Spec{})
	s.fill(sb)
	var got backend.SandboxFiles
	err := s.snapshotter().SnapshotFiles(s.ctx(), sb.id, backend.SnapshotOptions{}, func(f backend.SandboxFiles) error {
		got = f
		read := func(dir, p string) string {
			var data []byte
			err := withReader(f, func() (err error) { data, err = os.ReadFile(filepath.Join(dir, p)); return err })
			if err != nil {
				s.Errorf("the handed-over %s: %v", p, err)
			}
			return string(data)
		}
		if got := read(f.Workspace, "a.txt"); got != "alpha\n" {
			s.Errorf("a.txt in the handed-over workspace: %q", got)
		}
		if got := read(f.Workspace, "sub/deeper/d.txt"); got != "deep\n" {
			s.Errorf("sub/deeper/d.txt: %q", got)
		}
		var target string
		_ = withReader(f, func() (err error) { target, err = os.Readlink(filepath.Join(f.Workspace, "link")); return err })
		if target != "a.txt" {
			s.Errorf("link points to %q, want a.txt", target)
		}
		if s.opts.RealIsolation {
			if f.Tmp == "" {
				s.Error("a sandbox with a /tmp of its own handed over none")
			} else if got := read(f.Tmp, "t.txt"); got != "in-tmp\n" {
				s.Errorf("t.txt in the handed-over /tmp: %q", got)
			}
		}
		return nil
	})
	if err != nil {
		s.Fatalf("SnapshotFiles: %v", err)
	}
	if s.opts.Freezes && !got.Frozen {
		s.Error("the backend should freeze the sandbox for a snapshot here, and said it did not")
	}
	// fn's error comes back as it is.
	mine := errors.New("the store said no")
	if err := s.snapshotter().SnapshotFiles(s.ctx(), sb.id, backend.SnapshotOptions{}, func(backend.SandboxFiles) error { return mine }); !errors.Is(err, mine) {
		s.Errorf("fn's error came back as %v", err)
	}
	// The sandbox is as it was.
	if got := s.runOK(sb, "cat a.txt"); got != "alpha\n" {
		s.Errorf("after the snapshot: %q", got)
	}
	if !s.opts.Memory {
		err = s.snapshotter().SnapshotFiles(s.ctx(), sb.id, backend.SnapshotOptions{Memory: true}, func(backend.SandboxFiles) error { return nil })
		wantErr(s, "a snapshot with memory", err, backend.ErrUnsupported)
	}
	err = s.snapshotter().SnapshotFiles(s.ctx(), newID(), backend.SnapshotOptions{}, func(backend.SandboxFiles) error { return nil })
	wantErr(s, "a snapshot of an unknown sandbox", err, backend.ErrNotFound)
}

func withReader(f backend.SandboxFiles, fn func() error) error {
	if f.ReadAs != nil {
		return f.ReadAs(fn)
	}
	return fn()
}

// testSnapshotHolds takes a snapshot while a command keeps writing a
// counter: where the backend says it froze the sandbox, the counter stands
// still while the files are handed over, and runs on after.
func testSnapshotHolds(s *suite) {
	sb := s.create(backend.Spec{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		res, err := s.b.Exec(s.ctx(), sb.id, backend.ExecRequest{
			Command: `i=0; while [ ! -e stop ]; do i=$((i+1)); echo $i > n.tmp; mv n.tmp n; done`,
			Timeout: time.Minute, MaxOutputBytes: 4096,
		})
		if err != nil || res.ExitCode != 0 {
			s.Errorf("the counting command: %v, %+v", err, res)
		}
	}()
	defer wg.Wait()
	defer s.write(sb, "stop", nil)
	count := func() string {
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if data, err := s.b.ReadFile(s.ctx(), sb.id, "n", 64); err == nil && len(data) > 0 {
				return string(data)
			}
		}
		s.Fatal("the counting command wrote nothing")
		return ""
	}
	count()
	var before, after string
	var frozen bool
	err := s.snapshotter().SnapshotFiles(s.ctx(), sb.id, backend.SnapshotOptions{}, func(f backend.SandboxFiles) error {
		frozen = f.Frozen
		read := func() string {
			var data []byte
			_ = withReader(f, func() (err error) { data, err = os.ReadFile(filepath.Join(f.Workspace, "n")); return err })
			return string(data)
		}
		before = read()
		time.Sleep(300 * time.Millisecond)
		after = read()
		return nil
	})
	if err != nil {
		s.Fatalf("SnapshotFiles: %v", err)
	}
	if s.opts.Freezes && !frozen {
		s.Error("not frozen")
	}
	if frozen && before != after {
		s.Errorf("the sandbox said frozen, and its command counted from %q to %q meanwhile", before, after)
	}
	// Thawed: it counts on.
	first := count()
	for deadline := time.Now().Add(30 * time.Second); count() == first; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			s.Fatal("the command did not run on after the snapshot")
		}
	}
}

func testForks(s *suite) {
	spec := backend.Spec{Env: map[string]string{"FORK_MARK": "from-the-spec"}}
	if s.opts.AcceptBlockNetwork {
		spec.BlockNetwork = boolPtr(true)
	}
	src := s.create(spec)
	s.fill(src)
	ids := []string{newID(), newID()}
	res, err := s.forker().Fork(s.ctx(), src.id, ids, backend.SnapshotOptions{})
	if err != nil {
		s.Fatalf("Fork: %v", err)
	}
	forks := make([]sandbox, len(ids))
	for i, id := range ids {
		s.Cleanup(func() { _ = s.b.Destroy(context.Background(), id) })
		if len(res.Infos) != len(ids) {
			s.Fatalf("Fork made %d infos for %d ids", len(res.Infos), len(ids))
		}
		forks[i] = sandbox{id: id, info: res.Infos[i]}
		if s.opts.Workdir != "" && res.Infos[i].Workdir != s.opts.Workdir {
			s.Errorf("fork %d: workdir %q", i, res.Infos[i].Workdir)
		}
	}
	if s.opts.Freezes && !res.Frozen {
		s.Error("the fork did not freeze its source")
	}
	if res.Infos[0].HostUID != 0 && (res.Infos[0].HostUID == res.Infos[1].HostUID) {
		s.Errorf("two forks share host uid %d", res.Infos[0].HostUID)
	}
	for i, f := range forks {
		if got := s.runOK(f, "cat a.txt sub/deeper/d.txt; ./tool; readlink link; echo $FORK_MARK"); got != "alpha\ndeep\ntool-ran\na.txt\nfrom-the-spec\n" {
			s.Errorf("fork %d sees %q", i, got)
		}
		if s.opts.RealIsolation {
			if got := s.runOK(f, "cat /tmp/t.txt"); got != "in-tmp\n" {
				s.Errorf("fork %d's /tmp: %q", i, got)
			}
		}
	}
	// Independent: a write in one is seen in no other, nor in the source,
	// and the source's later writes reach no fork.
	s.runOK(forks[0], "echo fork0 > a.txt; echo only0 > new.txt")
	s.runOK(src, "echo src-later > a.txt")
	for _, c := range []struct {
		sb   sandbox
		want string
	}{{src, "src-later\n"}, {forks[0], "fork0\n"}, {forks[1], "alpha\n"}} {
		if got := s.runOK(c.sb, "cat a.txt"); got != c.want {
			s.Errorf("%s: a.txt is %q, want %q", c.sb.id, got, c.want)
		}
	}
	if got := s.run(forks[1], "cat new.txt"); got.ExitCode == 0 {
		s.Error("a file one fork wrote is in the other")
	}
	// Each a sandbox of its own: destroying one leaves the others.
	if err := s.b.Destroy(s.ctx(), forks[0].id); err != nil {
		s.Fatal(err)
	}
	if got := s.runOK(forks[1], "cat a.txt"); got != "alpha\n" {
		s.Errorf("after the other fork's destroy: %q", got)
	}
	if got := s.runOK(src, "cat a.txt"); got != "src-later\n" {
		s.Errorf("after a fork's destroy, the source: %q", got)
	}
	if !s.opts.Memory {
		_, err = s.forker().Fork(s.ctx(), src.id, []string{newID()}, backend.SnapshotOptions{Memory: true})
		wantErr(s, "a fork with memory", err, backend.ErrUnsupported)
	}
	_, err = s.forker().Fork(s.ctx(), newID(), []string{newID()}, backend.SnapshotOptions{})
	wantErr(s, "a fork of an unknown sandbox", err, backend.ErrNotFound)
}

// testForkAllOrNothing asks for a fork whose second id is taken: the
// first, made already, is removed again.
func testForkAllOrNothing(s *suite) {
	src := s.create(backend.Spec{})
	s.fill(src)
	taken := s.create(backend.Spec{})
	first := newID()
	_, err := s.forker().Fork(s.ctx(), src.id, []string{first, taken.id}, backend.SnapshotOptions{})
	if err == nil {
		_ = s.b.Destroy(context.Background(), first)
		s.Fatal("a fork into an id that is taken succeeded")
	}
	if s.listed(first) {
		s.Errorf("the failed fork left %s", first)
		_ = s.b.Destroy(context.Background(), first)
	}
	if _, err := s.b.Exec(s.ctx(), first, backend.ExecRequest{Command: "true", Timeout: 10 * time.Second}); !errors.Is(err, backend.ErrNotFound) {
		s.Errorf("a command in the failed fork's first sandbox: %v, want not found", err)
	}
	if got := s.runOK(taken, "ls -A"); strings.Contains(got, "a.txt") {
		s.Error("the fork wrote into the sandbox whose id was taken")
	}
	if got := s.runOK(src, "cat a.txt"); got != "alpha\n" {
		s.Errorf("the source after a failed fork: %q", got)
	}
}

// testSeed creates sandboxes from a seed as a fork does (modes kept) and
// as an image's workspace does (made writable by their owner), and from
// an image of a sandbox on the host's root (Base host), which runs there.
func testSeed(s *suite) {
	dir := s.TempDir()
	ws := filepath.Join(dir, backend.SeedWorkspace)
	for p, body := range map[string]string{"seeded.txt": "seeded\n", "pkg/mod.py": "X = 1\n"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(ws, p)), 0o755); err != nil {
			s.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ws, p), []byte(body), 0o444); err != nil {
			s.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		s.Fatal(err)
	}
	// An image's workspace, read-only in the store, becomes the guest's.
	im := backend.Image{Name: "seed-test", Digest: "sha256:" + strings.Repeat("5", 64), Root: dir, Base: backend.HostImage}
	sb := s.create(backend.Spec{Image: im})
	if got := s.runOK(sb, "cat seeded.txt pkg/mod.py && echo more >> seeded.txt && cat seeded.txt"); got != "seeded\nX = 1\nseeded\nmore\n" {
		s.Errorf("a sandbox of an image with a workspace: %q", got)
	}
	// A fork's seed keeps modes: a read-only file stays so (its owner
	// may still change that).
	sb = s.create(backend.Spec{Seed: backend.Seed{Workspace: ws, KeepModes: true}})
	if got := s.runOK(sb, "cat seeded.txt; test -w seeded.txt && echo writable || echo read-only; chmod u+w seeded.txt && echo changed"); got != "seeded\nread-only\nchanged\n" {
		// root inside a sandbox (hostback runs as the test's user)
		// writes anything; the mode must still be kept.
		if !strings.HasPrefix(got, "seeded\n") {
			s.Errorf("a sandbox seeded with modes kept: %q", got)
		}
	}
	if got := s.runOK(sb, "stat -c %a pkg/mod.py 2>/dev/null || echo no-stat"); got != "444\n" && got != "no-stat\n" {
		s.Errorf("pkg/mod.py has mode %q in a sandbox seeded with modes kept", got)
	}
}
