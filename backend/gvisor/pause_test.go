package gvisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// holder is a durable process that holds 64 MiB of random bytes and
// prints, every 10 ms, a line "n token crc": a counter, a token drawn at
// its start and the checksum of those bytes. A process that went on where
// it was prints every n once, in order, and the same token and checksum
// throughout: its memory is what it was.
const holder = `import os, sys, time, zlib
tok = os.urandom(8).hex()
b = os.urandom(64 << 20)
crc = zlib.crc32(b)
i = 0
while True:
    i += 1
    if i % 100 == 0:
        crc = zlib.crc32(b)
    print(i, tok, crc, flush=True)
    time.sleep(0.01)
`

// holderLines parses the output of a holder, checking that it went on
// where it was: every n once and in order, one token and one checksum.
// It returns the last n.
func holderLines(t *testing.T, out string) int {
	t.Helper()
	var tok, crc string
	n := 0
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 {
			t.Fatalf("line %d of the holder is %q", n+1, sc.Text())
		}
		if got, err := strconv.Atoi(f[0]); err != nil || got != n+1 {
			t.Fatalf("line %d of the holder counts %q: it did not go on where it was", n+1, f[0])
		}
		if n == 0 {
			tok, crc = f[1], f[2]
		} else if f[1] != tok || f[2] != crc {
			t.Fatalf("line %d of the holder has token %s and checksum %s, not %s %s: its memory changed", n+1, f[1], f[2], tok, crc)
		}
		n++
	}
	return n
}

// written is how many bytes process proc has written to stdout.
func written(t *testing.T, b *Backend, id, proc string) int64 {
	t.Helper()
	p, err := b.WaitProcess(context.Background(), id, proc, 0)
	if err != nil {
		t.Fatalf("WaitProcess(%s): %v", proc, err)
	}
	if !p.Running {
		t.Fatalf("process %s ended: %+v", proc, p)
	}
	return p.StdoutBytes
}

// holding creates sandbox id on b with a holder running in it, and waits
// until the holder writes: what a pause, a resume or a fork then carries.
func holding(t *testing.T, b *Backend, id, what string) backend.ProcessInfo {
	t.Helper()
	ctx := context.Background()
	if _, err := b.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	p, err := b.StartProcess(ctx, id, backend.ProcessRequest{Argv: []string{"python3", "-c", holder}})
	if err != nil {
		t.Fatal(err)
	}
	advances(t, b, id, p.ID, 0, what)
	return p
}

// advances waits until process proc has written more than n bytes.
func advances(t *testing.T, b *Backend, id, proc string, n int64, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for written(t, b, id, proc) <= n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: process %s wrote nothing past %d bytes in 30s", what, proc, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runscProcesses are the host pids of every process of sandbox id's runsc
// sandbox (its sentry, its gofer, a runsc command about it): every
// process whose command line names b's runsc root and id.
func runscProcesses(b *Backend, id string) []int {
	root := "--root=" + b.runscRoot()
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		hasRoot, hasID := false, false
		for _, a := range args {
			hasRoot = hasRoot || a == root
			hasID = hasID || a == id || strings.HasSuffix(a, "/"+id+"/"+bundleName)
		}
		if hasRoot && hasID {
			pids = append(pids, pid)
		}
	}
	return pids
}

// rssBytes is the resident memory of pids together (VmRSS).
func rssBytes(t *testing.T, pids []int) int64 {
	t.Helper()
	var total int64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				total += kb << 10
			}
		}
	}
	return total
}

func mustPause(t *testing.T, b *Backend, id string) {
	t.Helper()
	info, err := b.Pause(context.Background(), id)
	if err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if !info.MemoryReleased {
		t.Fatalf("Pause of a gVisor sandbox says its memory was not released")
	}
}

func paused(t *testing.T, b *Backend, id string) bool {
	t.Helper()
	p, err := b.Paused(context.Background(), id)
	if err != nil {
		t.Fatalf("Paused: %v", err)
	}
	if p != nil && !p.MemoryReleased {
		t.Fatalf("a paused gVisor sandbox says its memory was not released")
	}
	return p != nil
}

// A paused gVisor sandbox is a checkpoint on disk and no runsc process:
// the memory its sentry and gofer held (measured here, with a process
// holding 64 MiB) goes back to the host. Its processes do not run; the
// operations that need its init are refused with ErrPaused at once, its
// processes' logs still read. Resumed, the same processes go on where
// they were with the same memory, and commands run.
func TestGVisorPauseReleasesMemoryAndResumes(t *testing.T) {
	b := newTestBackend(t, func(c *Config) { c.Cgroups = testCgroups(t) })
	ctx := context.Background()
	const id = "pausing"
	if _, err := b.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	execOK(t, b, id, "echo kept > /workspace/f")
	p, err := b.StartProcess(ctx, id, backend.ProcessRequest{Argv: []string{"python3", "-c", holder}})
	if err != nil {
		t.Fatal(err)
	}
	advances(t, b, id, p.ID, 0, "before the pause")
	pids := runscProcesses(b, id)
	before := rssBytes(t, pids)
	if len(pids) < 2 || before < 64<<20 {
		t.Fatalf("before the pause: runsc processes %v hold %d bytes; want a sentry and a gofer holding the 64 MiB", pids, before)
	}

	start := time.Now()
	mustPause(t, b, id)
	took := time.Since(start)
	mustPause(t, b, id) // idempotent
	if left := runscProcesses(b, id); len(left) != 0 {
		t.Fatalf("after the pause runsc processes %v of the sandbox remain (%d bytes)", left, rssBytes(t, left))
	}
	size, err := syncedSize(filepath.Join(b.sandboxDir(id), checkpointName))
	if err != nil {
		t.Fatalf("the paused sandbox's checkpoint: %v", err)
	}
	t.Logf("pause took %v: released %d bytes of RSS (sentry and gofer), checkpoint %d bytes", took, before, size)
	if !paused(t, b, id) {
		t.Fatal("Paused says no after a pause")
	}
	if ids, _ := b.runscList(ctx); len(ids) != 0 {
		t.Fatalf("runsc lists %v while the sandbox is paused", ids)
	}
	at := written(t, b, id, p.ID)
	time.Sleep(300 * time.Millisecond)
	if now := written(t, b, id, p.ID); now != at {
		t.Fatalf("a paused sandbox's process went on writing (%d bytes, then %d)", at, now)
	}
	for what, err := range map[string]error{
		"Exec": func() error {
			_, err := b.Exec(ctx, id, backend.ExecRequest{Command: "true", Timeout: 10 * time.Second})
			return err
		}(),
		"ReadFile": func() error { _, err := b.ReadFile(ctx, id, "f", 64); return err }(),
		"StartProcess": func() error {
			_, err := b.StartProcess(ctx, id, backend.ProcessRequest{Command: "true"})
			return err
		}(),
		"SignalProcess": b.SignalProcess(ctx, id, p.ID, syscall.SIGTERM),
		"Warm":          b.Warm(ctx, id),
	} {
		if !errors.Is(err, backend.ErrPaused) {
			t.Errorf("%s on a paused sandbox: %v, want ErrPaused", what, err)
		}
	}

	start = time.Now()
	if err := b.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	restored := time.Since(start)
	if got := execOK(t, b, id, "cat /workspace/f"); got != "kept\n" {
		t.Errorf("after the resume /workspace/f is %q", got)
	}
	t.Logf("resume to the first command's result took %v; RSS after: %d bytes", time.Since(start), rssBytes(t, runscProcesses(b, id)))
	_ = restored
	if err := b.Resume(ctx, id); err != nil { // idempotent
		t.Fatalf("Resume again: %v", err)
	}
	if paused(t, b, id) {
		t.Fatal("Paused says yes after a resume")
	}
	settle(t, b, id)
	if _, err := os.Stat(filepath.Join(b.sandboxDir(id), checkpointName)); !os.IsNotExist(err) {
		t.Errorf("the checkpoint outlived the resume: %v", err)
	}
	advances(t, b, id, p.ID, written(t, b, id, p.ID), "after the resume")
	if n := holderLines(t, readProc(t, b, id, p.ID)); n < 2 {
		t.Fatalf("the holder printed %d lines", n)
	}
	if err := b.SignalProcess(ctx, id, p.ID, syscall.SIGKILL); err != nil {
		t.Fatalf("SignalProcess after the resume: %v", err)
	}
	if end := waitProc(t, b, id, p.ID); end.Running {
		t.Fatalf("the holder after SIGKILL: %+v", end)
	}
	// Pause, and destroy it paused.
	mustPause(t, b, id)
	if err := b.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy of a paused sandbox: %v", err)
	}
	if _, err := os.Stat(b.sandboxDir(id)); !os.IsNotExist(err) {
		t.Fatalf("a destroyed paused sandbox's directory is still there: %v", err)
	}
}

// settle waits for the end of the load of sandbox id's last resume.
func settle(t *testing.T, b *Backend, id string) {
	t.Helper()
	sb, err := b.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), restoreLoadTimeout+cliTimeout)
	defer cancel()
	if err := sb.awaitSettled(ctx); err != nil {
		t.Fatalf("the load of the resume of %s did not end: %v", id, err)
	}
}

// runscLogger returns a runsc that runs the real one and appends to the
// returned file a line per run once it ended: its subcommand and
// arguments (not the global flags the backend puts first).
func runscLogger(t *testing.T) (wrapper, log string) {
	t.Helper()
	runsc := testRunsc(t)
	dir := t.TempDir()
	wrapper, log = filepath.Join(dir, "runsc"), filepath.Join(dir, "runs.log")
	script := `#!/bin/sh
"` + runsc + `" "$@"
rc=$?
for a in "$@"; do
  case "$a" in --*) shift;; *) break;; esac
done
echo "$*" >>"` + log + `"
exit $rc
`
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return wrapper, log
}

// runs is the subcommands (with their flags) runscLogger's runsc ran.
func runs(t *testing.T, log string) []string {
	t.Helper()
	data, err := os.ReadFile(log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var subs []string
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		sub := f[0]
		for _, a := range f[1:] {
			if a == "--background" || a == "--restore" {
				sub += " " + a
			}
		}
		subs = append(subs, sub)
	}
	return subs
}

// A resume restores in the background: Resume returns once the restored
// init answers, and the checkpoint stays until runsc says the sentry has
// loaded all of the guest's memory from it; only then is it dropped. On
// its path runs nothing but `runsc restore` (the runsc sandbox the pause
// ended needs no delete). A pause right after a resume waits for that
// load and leaves its own checkpoint, from which the same process goes
// on again.
func TestGVisorResumeLoadsInTheBackground(t *testing.T) {
	wrapper, log := runscLogger(t)
	const id = "lazy"
	var b *Backend
	var atLoaded []string
	var keptAtLoaded bool
	b = newTestBackend(t, func(c *Config) {
		c.RunscPath = wrapper
		c.Failpoint = func(at string) {
			if at == FailResumeLoaded {
				atLoaded = runs(t, log)
				_, err := os.Stat(filepath.Join(b.sandboxDir(id), checkpointName, checkpointPagesName))
				keptAtLoaded = err == nil
			}
		}
	})
	ctx := context.Background()
	p := holding(t, b, id, "before the pause")
	mustPause(t, b, id)
	if err := os.Remove(log); err != nil {
		t.Fatal(err)
	}
	if err := b.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if got := runs(t, log); len(got) == 0 || got[0] != "restore --background" {
		t.Fatalf("runsc ran %q for a resume, want a background restore and nothing before it", got)
	}
	settle(t, b, id)
	if want := []string{"restore --background", "wait --restore"}; !slices.Equal(atLoaded, want) {
		t.Errorf("when the checkpoint was to be dropped runsc had run %q, want %q", atLoaded, want)
	}
	if !keptAtLoaded {
		t.Error("the checkpoint was gone before runsc said the restore had loaded it")
	}
	if _, err := os.Stat(filepath.Join(b.sandboxDir(id), checkpointName)); !os.IsNotExist(err) {
		t.Errorf("the checkpoint outlived the load of its restore: %v", err)
	}
	advances(t, b, id, p.ID, written(t, b, id, p.ID), "after the resume")

	// Pause at once after a resume, twice.
	for range 2 {
		if err := b.Resume(ctx, id); err != nil {
			t.Fatalf("Resume: %v", err)
		}
		mustPause(t, b, id)
		if _, err := os.Stat(filepath.Join(b.sandboxDir(id), checkpointName, checkpointPagesName)); err != nil {
			t.Fatalf("a pause right after a resume has no checkpoint: %v", err)
		}
	}
	if err := b.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	advances(t, b, id, p.ID, written(t, b, id, p.ID), "after pauses right after resumes")
	holderLines(t, readProc(t, b, id, p.ID))
	execOK(t, b, id, "true")
}

// A paused sandbox stays paused across a restart of the daemon, and its
// processes go on where they were once it is resumed by the next.
func TestGVisorPausedSurvivesARestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gvisor")
	first := newTestBackend(t, func(c *Config) { c.Dir = dir })
	ctx := context.Background()
	const id = "sleeper"
	p := holding(t, first, id, "before the pause")
	mustPause(t, first, id)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second := newTestBackend(t, func(c *Config) { c.Dir = dir })
	if err := second.Adopt(ctx, id); err != nil {
		t.Fatalf("Adopt of a paused sandbox: %v", err)
	}
	if !paused(t, second, id) {
		t.Fatal("a paused sandbox is not paused after a restart")
	}
	info, err := second.WaitProcess(ctx, id, p.ID, 0)
	if err != nil || !info.Running {
		t.Fatalf("a paused sandbox's process after a restart: %+v, %v; it lives in the checkpoint", info, err)
	}
	if err := second.Resume(ctx, id); err != nil {
		t.Fatalf("Resume after a restart: %v", err)
	}
	advances(t, second, id, p.ID, written(t, second, id, p.ID), "resumed after a restart")
	holderLines(t, readProc(t, second, id, p.ID))
	execOK(t, second, id, "true")
}

// crashAt returns a Config tweak whose failpoint does, at name, what a
// kill -9 of the daemon does there: the daemon's ends of sandbox id's init
// streams close, and nothing more of the operation runs (its goroutine
// ends; runtime.Goexit runs only the in-memory unlocks of its defers).
func crashAt(name, id string, b **Backend) func(*Config) {
	return func(c *Config) {
		c.Failpoint = func(at string) {
			if at != name {
				return
			}
			// The operation holds the sandbox's lock (at FailResumeLoaded
			// the resume has returned and nothing else runs in the
			// sandbox): its state is this goroutine's to touch.
			sb := (*b).reg.All()
			for _, s := range sb {
				if s.id == id && s.init != nil {
					s.init.close()
				}
			}
			runtime.Goexit()
		}
	}
}

// A daemon killed in the middle of a pause or a resume leaves the sandbox
// as it was or in its new state, never lost: the next daemon finds it so,
// and its process goes on where it was.
func TestGVisorPauseAndResumeCutShort(t *testing.T) {
	for _, tc := range []struct {
		failpoint  string
		resume     bool // the crash is in a resume (after a pause)
		wantPaused bool
	}{
		{FailPauseWritten, false, false},
		{FailPauseCheckpointed, false, true},
		{FailResumeRestored, true, false},
		// After Resume returned, its restore's load complete, the
		// checkpoint not yet dropped: the next daemon drops it.
		{FailResumeLoaded, true, false},
	} {
		t.Run(tc.failpoint, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "gvisor")
			var first *Backend
			first = newTestBackend(t, func(c *Config) { c.Dir = dir }, crashAt(tc.failpoint, "cut", &first))
			ctx := context.Background()
			if _, err := first.Create(ctx, "cut", backend.Spec{}); err != nil {
				t.Fatal(err)
			}
			p, err := first.StartProcess(ctx, "cut", backend.ProcessRequest{Argv: []string{"python3", "-c", holder}})
			if err != nil {
				t.Fatal(err)
			}
			advances(t, first, "cut", p.ID, 0, "before")
			if tc.resume {
				mustPause(t, first, "cut")
			}
			ended := make(chan struct{})
			go func() {
				defer close(ended)
				if tc.resume {
					if err := first.Resume(ctx, "cut"); err == nil && tc.failpoint == FailResumeLoaded {
						sb, _ := first.lookup("cut")
						_ = sb.awaitSettled(ctx)
						return // its goroutine crashed at the failpoint
					}
				} else {
					_, _ = first.Pause(ctx, "cut")
				}
				t.Errorf("the operation went past failpoint %s", tc.failpoint)
			}()
			select {
			case <-ended:
			case <-time.After(time.Minute):
				t.Fatal("the operation never reached its failpoint")
			}
			second := newTestBackend(t, func(c *Config) { c.Dir = dir })
			if err := second.Adopt(ctx, "cut"); err != nil {
				t.Fatalf("Adopt after a crash at %s: %v", tc.failpoint, err)
			}
			if got := paused(t, second, "cut"); got != tc.wantPaused {
				t.Fatalf("after a crash at %s the sandbox is paused=%v, want %v", tc.failpoint, got, tc.wantPaused)
			}
			for _, leftover := range []string{checkpointNewName, checkpointOldName} {
				if _, err := os.Stat(filepath.Join(dir, "cut", leftover)); !os.IsNotExist(err) {
					t.Errorf("%s is left: %v", leftover, err)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "cut", checkpointName)); os.IsNotExist(err) == tc.wantPaused {
				t.Errorf("checkpoint there: %v, paused: %v", err == nil, tc.wantPaused)
			}
			if tc.wantPaused {
				if left := runscProcesses(second, "cut"); len(left) != 0 {
					t.Errorf("a paused sandbox has runsc processes %v", left)
				}
				if err := second.Resume(ctx, "cut"); err != nil {
					t.Fatalf("Resume: %v", err)
				}
			}
			advances(t, second, "cut", p.ID, written(t, second, "cut", p.ID), "after the crash")
			holderLines(t, readProc(t, second, "cut", p.ID))
			execOK(t, second, "cut", "true")
		})
	}
}

// A pause that cannot keep its checkpoint (larger than the cap, or a full
// disk) is refused and leaves the sandbox running as it was.
func TestGVisorPauseRefusedLeavesItRunning(t *testing.T) {
	b := newTestBackend(t, func(c *Config) { c.MaxCheckpointBytes = 1 << 20 })
	ctx := context.Background()
	const id = "toolarge"
	p := holding(t, b, id, "before")
	_, err := b.Pause(ctx, id)
	if !errors.Is(err, backend.ErrNoSpace) || !strings.Contains(err.Error(), "max_checkpoint_bytes") {
		t.Fatalf("Pause past the cap: %v, want ErrNoSpace naming the cap", err)
	}
	if paused(t, b, id) {
		t.Fatal("a refused pause left the sandbox paused")
	}
	for _, name := range []string{checkpointName, checkpointNewName} {
		if _, err := os.Stat(filepath.Join(b.sandboxDir(id), name)); !os.IsNotExist(err) {
			t.Errorf("a refused pause left %s: %v", name, err)
		}
	}
	advances(t, b, id, p.ID, written(t, b, id, p.ID), "after a refused pause")
	holderLines(t, readProc(t, b, id, p.ID))
	execOK(t, b, id, "true")
}

// A disk that fills up during the checkpoint fails the pause and leaves
// the sandbox running as it was, nothing of the checkpoint kept.
func TestGVisorPauseOnAFullDisk(t *testing.T) {
	testRunsc(t)
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=256m,mode=0700"); err != nil {
		skipOrFail(t, "cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(mnt, syscall.MNT_DETACH) })
	b := newTestBackend(t, func(c *Config) { c.Dir = filepath.Join(mnt, "gvisor") })
	ctx := context.Background()
	const id = "fulldisk"
	p := holding(t, b, id, "before")
	// Leave more than the reserve the pause checks for, and less than the
	// checkpoint of 64 MiB of random bytes: runsc runs out of room.
	var st syscall.Statfs_t
	if err := syscall.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	fill := int64(st.Bavail)*st.Bsize - (spaceReserve + 4<<20)
	f, err := os.Create(filepath.Join(mnt, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i)
	}
	for n := int64(0); n < fill; n += int64(len(chunk)) {
		if _, err := f.Write(chunk[:min(int64(len(chunk)), fill-n)]); err != nil {
			t.Fatalf("filling the disk: %v", err)
		}
	}
	f.Close()
	_, err = b.Pause(ctx, id)
	if !errors.Is(err, backend.ErrNoSpace) {
		t.Fatalf("Pause on a full disk: %v, want ErrNoSpace", err)
	}
	t.Logf("refused: %v", err)
	if paused(t, b, id) {
		t.Fatal("a failed pause left the sandbox paused")
	}
	for _, name := range []string{checkpointName, checkpointNewName} {
		if _, err := os.Stat(filepath.Join(b.sandboxDir(id), name)); !os.IsNotExist(err) {
			t.Errorf("a failed pause left %s: %v", name, err)
		}
	}
	advances(t, b, id, p.ID, written(t, b, id, p.ID), "after a failed pause")
	holderLines(t, readProc(t, b, id, p.ID))
	execOK(t, b, id, "true")
	// Room again: the pause goes through.
	if err := os.Remove(filepath.Join(mnt, "fill")); err != nil {
		t.Fatal(err)
	}
	mustPause(t, b, id)
	if err := b.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	advances(t, b, id, p.ID, written(t, b, id, p.ID), "after the resume")
	holderLines(t, readProc(t, b, id, p.ID))
}

// A resume whose restore cannot load the guest's memory (its pages file
// cut short) leaves the sandbox paused, its checkpoint in place: from it,
// whole again, the next resume goes on where the pause was.
func TestGVisorResumeWhoseLoadFailsStaysPaused(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	const id = "cut-pages"
	p := holding(t, b, id, "before the pause")
	mustPause(t, b, id)
	pages := filepath.Join(b.sandboxDir(id), checkpointName, checkpointPagesName)
	whole := filepath.Join(t.TempDir(), "pages.img")
	if err := os.Rename(pages, whole); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(whole)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pages, data[:len(data)*19/20], 0o600); err != nil {
		t.Fatal(err)
	}
	err = b.Resume(ctx, id)
	t.Logf("Resume from a checkpoint whose pages are cut short: %v", err)
	if err == nil {
		settle(t, b, id)
	}
	if !paused(t, b, id) {
		res, err := b.Exec(ctx, id, backend.ExecRequest{Command: "true", Timeout: 10 * time.Second})
		t.Fatalf("after a restore that could not load its memory the sandbox is not paused (a command: %+v, %v)", res, err)
	}
	if left := runscProcesses(b, id); len(left) != 0 {
		t.Errorf("a sandbox paused again has runsc processes %v", left)
	}
	if err := copyFileTest(whole, pages); err != nil {
		t.Fatal(err)
	}
	if err := b.Resume(ctx, id); err != nil {
		t.Fatalf("Resume from the whole checkpoint: %v", err)
	}
	advances(t, b, id, p.ID, written(t, b, id, p.ID), "after the second resume")
	holderLines(t, readProc(t, b, id, p.ID))
	execOK(t, b, id, "true")
}

func copyFileTest(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	_ = os.Remove(to)
	return os.WriteFile(to, data, 0o600)
}

// A restore whose background load fails after Resume returned (forced
// here: at FailResumeLoaded the restored gVisor sandbox is killed, as
// gVisor kills one whose load failed, and the failure is reported) leaves
// the sandbox paused again with its checkpoint, not terminated: a command
// meanwhile is refused as paused, and the next resume goes on where the
// pause was.
func TestGVisorResumeLoadFailureRepauses(t *testing.T) {
	const id = "repause"
	var b *Backend
	armed := false
	b = newTestBackend(t, func(c *Config) {
		c.Failpoint = func(at string) {
			if at != FailResumeLoaded || !armed {
				return
			}
			armed = false
			sb, err := b.lookup(id)
			if err != nil {
				t.Error(err)
				runtime.Goexit()
			}
			sb.initMu.Lock()
			init := sb.init
			sb.initMu.Unlock()
			if out, err := b.cli(context.Background(), cliTimeout, "kill", id, "KILL"); err != nil {
				t.Errorf("runsc kill: %v: %s", err, out)
			}
			b.restoreFailed(sb, init, errors.New("a load failure forced by the test"))
			runtime.Goexit() // the checkpoint is not dropped
		}
	})
	ctx := context.Background()
	p := holding(t, b, id, "before the pause")
	mustPause(t, b, id)
	armed = true
	if err := b.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	settle(t, b, id)
	if !paused(t, b, id) {
		t.Fatal("after a failed load the sandbox is not paused")
	}
	if _, err := b.Exec(ctx, id, backend.ExecRequest{Command: "true", Timeout: 10 * time.Second}); !errors.Is(err, backend.ErrPaused) {
		t.Errorf("a command after a failed load: %v, want ErrPaused", err)
	}
	if left := runscProcesses(b, id); len(left) != 0 {
		t.Errorf("a sandbox paused again has runsc processes %v", left)
	}
	if err := b.Resume(ctx, id); err != nil {
		t.Fatalf("Resume after a failed load: %v", err)
	}
	advances(t, b, id, p.ID, written(t, b, id, p.ID), "after the second resume")
	holderLines(t, readProc(t, b, id, p.ID))
	execOK(t, b, id, "true")
}

// TestDirectReads: a restore asks runsc for O_DIRECT reads of the guest's
// memory only when the checkpoint's pages file opens with O_DIRECT (every
// resume of the gVisor tests takes that path where the state directory's
// filesystem allows it); a checkpoint without one restores without.
func TestDirectReads(t *testing.T) {
	dir := t.TempDir()
	if directReads(dir) {
		t.Error("direct reads of a checkpoint without a pages file")
	}
	if err := os.WriteFile(filepath.Join(dir, checkpointPagesName), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Open(filepath.Join(dir, checkpointPagesName), syscall.O_RDONLY|syscall.O_DIRECT, 0)
	if err == nil {
		syscall.Close(fd)
	}
	if got := directReads(dir); got != (err == nil) {
		t.Errorf("directReads on a filesystem whose O_DIRECT open says %v: %v", err, got)
	}
}

// A sentry that died without runsc's clean-up leaves its control socket;
// each later boot of the same container binds it one directory further
// (the root, /var/run, /run, /tmp). Planted in all four, they must not
// keep a paused sandbox from resuming, and its destroy leaves none.
func TestGVisorResumeAfterStaleControlSockets(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	const id = "stale-sockets"
	if _, err := b.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	execOK(t, b, id, "echo kept > /workspace/f")
	mustPause(t, b, id)
	sb, err := b.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	name := "runsc-" + sb.containerID() + ".sock"
	var planted []string
	seen := map[string]bool{}
	for _, dir := range []string{b.runscRoot(), "/var/run", "/run", "/tmp"} {
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			if seen[real] { // /var/run is often /run
				continue
			}
			seen[real] = true
		}
		p := filepath.Join(dir, name)
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
		if err != nil {
			t.Fatalf("plant a stale socket at %s: %v", p, err)
		}
		l.SetUnlinkOnClose(false)
		l.Close() // bound, then its listener gone: a dead sentry's
		planted = append(planted, p)
		t.Cleanup(func() { _ = os.Remove(p) })
	}
	if err := b.Resume(ctx, id); err != nil {
		t.Fatalf("Resume with a stale control socket in every place runsc binds one: %v", err)
	}
	if out := execOK(t, b, id, "cat /workspace/f"); out != "kept\n" {
		t.Fatalf("after the resume: %q", out)
	}
	if err := b.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	for _, p := range planted {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s is left after the destroy", p)
		}
	}
}
