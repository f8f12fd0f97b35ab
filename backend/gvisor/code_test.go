package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

func runCell(t *testing.T, b *Backend, id, ctxName, code string) backend.CodeResult {
	t.Helper()
	res, err := b.RunCode(context.Background(), id, backend.CodeRequest{Context: ctxName, Code: code, Timeout: time.Minute, MaxOutputBytes: 1 << 20})
	if err != nil {
		t.Fatalf("RunCode(%q): %v", code, err)
	}
	return res
}

func lastText(res backend.CodeResult) string {
	if len(res.Results) == 0 {
		return ""
	}
	s, _ := res.Results[len(res.Results)-1]["text/plain"].(string)
	return s
}

// A context is the guest's, in its sandbox: uid 1000, the sandbox's
// rlimits, gVisor's kernel, no way into the directory of the daemon's
// files; its output is handed on as it comes; a process a cell leaves
// holding its stdout holds up its end for no more than init's drain wait.
func TestGVisorCodeContextsAreTheGuests(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	const id = "code-guest"
	if _, err := b.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	res := runCell(t, b, id, "", `
import os, resource
try:
    os.listdir("`+gvwire.GuestProcs+`")
    procs = "listed"
except PermissionError:
    procs = "refused"
(os.getuid(), os.getgid(), resource.getrlimit(resource.RLIMIT_NOFILE), procs, os.getcwd(), open("/proc/version").read().split()[:2])`)
	if res.Error != nil || lastText(res) != "(1000, 1000, (1024, 1024), 'refused', '/workspace', ['Linux', 'version'])" {
		t.Errorf("the context's identity and limits: %q %+v", lastText(res), res)
	}
	// The host's kernel is not the guest's (gVisor reports its own).
	if host, err := os.ReadFile("/proc/version"); err == nil {
		if res := runCell(t, b, id, "", `open("/proc/version").read()`); strings.Contains(lastText(res), strings.Fields(string(host))[2]) {
			t.Errorf("the context runs on the host's kernel: %q", lastText(res))
		}
	}

	var mu sync.Mutex
	var streamed bytes.Buffer
	out, err := b.RunCode(ctx, id, backend.CodeRequest{Code: "import sys\nfor i in range(3): print('line', i)\nsys.stderr.write('err\\n')", Timeout: time.Minute, MaxOutputBytes: 1 << 20,
		Output: func(stderr bool, p []byte) {
			mu.Lock()
			defer mu.Unlock()
			if !stderr {
				streamed.Write(p)
			}
		}})
	if err != nil || string(out.Stdout) != "line 0\nline 1\nline 2\n" || string(out.Stderr) != "err\n" {
		t.Fatalf("a cell's output: %+v, %v", out, err)
	}
	mu.Lock()
	if streamed.String() != "line 0\nline 1\nline 2\n" {
		t.Errorf("handed on: %q", streamed.String())
	}
	mu.Unlock()

	start := time.Now()
	if res := runCell(t, b, id, "", "import subprocess\nsubprocess.Popen(['sleep', '60'])\n'left'"); lastText(res) != "'left'" {
		t.Errorf("a cell that leaves a process: %+v", res)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("a cell whose process holds its stdout took %v", took)
	}
	if res := runCell(t, b, id, "", "'after'"); lastText(res) != "'after'" || res.ExecutionCount != 5 {
		t.Errorf("the next cell: %+v", res)
	}
}

// A cell's output past its bounds keeps the daemon's share bounded: the
// tail of a flood, and results past max_output_bytes left out; the
// context lives on.
func TestGVisorCodeFloodIsBounded(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	const id = "code-flood"
	if _, err := b.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	const limit = 64 << 10
	res, err := b.RunCode(ctx, id, backend.CodeRequest{Timeout: time.Minute, MaxOutputBytes: limit, Code: `
import sys
chunk = "x" * (1 << 20)
for _ in range(16): sys.stdout.write(chunk)
sys.stdout.write("end\n")
class Big:
    def _repr_png_(self): return b"\x89PNG" + b"\0" * (2 << 20)
display(Big())
"small"`})
	if err != nil {
		t.Fatal(err)
	}
	if !res.StdoutTruncated || len(res.Stdout) != limit || !bytes.HasSuffix(res.Stdout, []byte("xxend\n")) {
		t.Errorf("a 16 MiB flood: truncated %v, %d bytes, ends %q", res.StdoutTruncated, len(res.Stdout), res.Stdout[max(0, len(res.Stdout)-10):])
	}
	if !res.ResultsTruncated || len(res.Results) != 1 || lastText(res) != "'small'" {
		t.Errorf("a 2 MiB image past a 64 KiB bound: truncated %v, %d results, %q", res.ResultsTruncated, len(res.Results), lastText(res))
	}
	if res := runCell(t, b, id, "", "chunk[:3]"); lastText(res) != "'xxx'" {
		t.Errorf("the context after the flood: %+v", res)
	}
}

// Contexts outlive a daemon killed with -9, and one killed while a cell
// ran and wrote (so that the cell's frames, and its sequence number, are
// a dead daemon's): the next daemon re-attaches, its own cells get only
// their own output, and the contexts keep their variables.
func TestGVisorCodeContextsOutliveTheDaemon(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gvisor")
	first := newTestBackend(t, func(c *Config) { c.Dir = dir })
	ctx := context.Background()
	const id = "code-survivor"
	if _, err := first.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	if res := runCell(t, first, id, "kept", "x = 41"); res.Error != nil {
		t.Fatal(res.Error)
	}
	kill9(t, first, id)
	abandonWritingCell(t, mustLookup(t, first, id))

	second := newTestBackend(t, func(c *Config) { c.Dir = dir })
	if err := second.Adopt(ctx, id); err != nil {
		t.Fatal(err)
	}
	res := runCell(t, second, id, "new", "import time\ntime.sleep(1)\nprint('mine')")
	if string(res.Stdout) != "mine\n" || res.ExecutionCount != 1 {
		t.Errorf("a cell of the next daemon got %q (count %d): the dead daemon's cell's output must not reach it", res.Stdout, res.ExecutionCount)
	}
	if res := runCell(t, second, id, "kept", "x + 1"); lastText(res) != "42" || res.ExecutionCount != 2 {
		t.Errorf("the context of the dead daemon: %+v", res)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		list, err := second.ListContexts(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) == 3 && list[2].Name == "writer" && !list[2].Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dead daemon's cell did not end: %+v", list)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if res := runCell(t, second, id, "writer", "n"); lastText(res) != "30" {
		t.Errorf("the context whose cell outlived its daemon: %+v", res)
	}
	if err := second.DeleteContext(ctx, id, "writer"); err != nil {
		t.Fatal(err)
	}
	if err := second.DeleteContext(ctx, id, "writer"); !errors.Is(err, backend.ErrContextNotFound) {
		t.Errorf("deleting it again: %v", err)
	}
}

// abandonWritingCell is a daemon that attaches to sb's init, has it run a
// cell (sequence number 1, as the next daemon's first) that writes for
// three seconds, and dies at once.
func abandonWritingCell(t *testing.T, sb *sandbox) {
	t.Helper()
	toInit, err := os.OpenFile(sb.toInitPath(), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer toInit.Close()
	fromInit, err := os.OpenFile(sb.fromInitPath(), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fromInit.Close()
	req := agent.CellRequest{Context: "writer", Code: []byte("import time\nfor n in range(1, 31):\n    print('old', n, flush=True)\n    time.sleep(0.1)"),
		Env: []string{"PATH=" + guestPath}, Timeout: time.Minute, Grace: time.Second}
	if err := gvwire.WriteFrame(toInit, gvwire.KindAttach, make([]byte, gvwire.NonceSize)); err != nil {
		t.Fatal(err)
	}
	if err := gvwire.WriteFrame(toInit, gvwire.KindCode, gvwire.Code{Seq: 1, Request: req.Encode()}.Encode()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // it starts writing
}

// An image without python3 (here: a PATH without it) refuses a cell with
// ErrNoPython.
func TestGVisorCodeWithoutPython(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	const id = "code-nopython"
	if _, err := b.Create(ctx, id, backend.Spec{Env: map[string]string{"PATH": "/nowhere"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.RunCode(ctx, id, backend.CodeRequest{Code: "1", Timeout: time.Minute}); !errors.Is(err, backend.ErrNoPython) {
		t.Errorf("a cell without python3: %v, want ErrNoPython", err)
	}
	if list, err := b.ListContexts(ctx, id); err != nil || len(list) != 0 {
		t.Errorf("contexts: %+v, %v", list, err)
	}
}

// A cell past its sandbox's memory limit loses its context, told as
// oom_killed: the daemon has init kill the largest guest process (the
// context) at the limit (memory.go), and the other contexts live on.
func TestGVisorCodeOutOfMemory(t *testing.T) {
	cgm := testCgroups(t)
	b := newTestBackend(t, func(c *Config) { c.Cgroups, c.Limits = cgm, limits.Defaults() })
	ctx := context.Background()
	const id = "code-balloon"
	if _, err := b.Create(ctx, id, backend.Spec{Resources: backend.Resources{MemoryBytes: 256 << 20, PIDs: 64}}); err != nil {
		t.Fatal(err)
	}
	if res := runCell(t, b, id, "other", "kept = 1"); res.Error != nil {
		t.Fatal(res.Error)
	}
	res := runCell(t, b, id, "", "b = []\nfor i in range(64): b.append(bytearray(16 << 20))")
	if !res.ContextLost || !res.OOMKilled || res.Reason() != "oom_killed" {
		t.Fatalf("a cell allocating 1 GiB under 256 MiB: %+v; want its context lost with oom_killed", res)
	}
	if res := runCell(t, b, id, "other", "kept + 1"); lastText(res) != "2" {
		t.Errorf("the other context after the OOM kill: %+v", res)
	}
	if res := runCell(t, b, id, "", "'b' in globals()"); lastText(res) != "False" || res.ExecutionCount != 1 {
		t.Errorf("the lost context starts afresh: %+v", res)
	}
}

// codeRuntimes lists the sandbox's processes that run the code runtime
// (the zygote and its forks, the contexts), as a command in it sees them.
func codeRuntimes(t *testing.T, b *Backend, id string) []string {
	t.Helper()
	return strings.Fields(execOK(t, b, id, `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null | grep -q '^python3 /proc/self/fd/4' && echo ${p#/proc/}; done; true`))
}

// A warm-pool member whose image's contexts preload modules has its code
// zygote started, and its preloads imported, by Warm (a code warm frame
// to init): the first cell's context is a fork of that zygote (a spare it
// forked ahead, or, the spare killed, another). Without preloads Warm
// starts none, and the first cell starts it.
func TestGVisorWarmStartsTheCodeZygote(t *testing.T) {
	b := newTestBackend(t, func(c *Config) { c.Code.Preload = []string{"decimal"} })
	ctx := context.Background()
	const id = "code-warm"
	if _, err := b.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Warm(ctx, id); err != nil {
		t.Fatalf("Warm: %v", err)
	}
	runtimes := codeRuntimes(t, b, id)
	if len(runtimes) != 2 {
		t.Fatalf("after Warm, the sandbox runs %d code runtimes (%v), want the zygote and its spare context", len(runtimes), runtimes)
	}
	spare := strings.TrimSpace(execOK(t, b, id, fmt.Sprintf(`for p in %s; do [ "$(cut -d' ' -f4 /proc/$p/stat)" != 1 ] && echo $p; done; true`, strings.Join(runtimes, " "))))
	if spare == "" {
		t.Fatalf("no spare context among %v", runtimes)
	}
	// A spare that dies is not handed out: the first cell gets another
	// fork.
	execOK(t, b, id, "kill -9 "+spare)
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := b.Exec(ctx, id, backend.ExecRequest{Command: "kill -0 " + spare, Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed spare %s was not reaped", spare)
		}
		time.Sleep(50 * time.Millisecond)
	}
	runtimes = codeRuntimes(t, b, id)
	res := runCell(t, b, id, "", "import os, sys\nos.getpid(), os.getppid(), 'decimal' in sys.modules")
	var pid, ppid int
	var imported bool
	fmt.Sscanf(lastText(res), "(%d, %d, %t)", &pid, &ppid, &imported)
	if !imported || strconv.Itoa(pid) == spare || !slices.Contains(runtimes, strconv.Itoa(ppid)) {
		t.Errorf("the first cell's context: %+v, want one forked by one of %v (the warm zygote), decimal imported", res, runtimes)
	}
	if err := b.Warm(ctx, id); err != nil {
		t.Fatalf("Warm again: %v", err)
	}

	plain := newTestBackend(t)
	if _, err := plain.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	if err := plain.Warm(ctx, id); err != nil {
		t.Fatalf("Warm: %v", err)
	}
	if z := codeRuntimes(t, plain, id); len(z) != 0 {
		t.Errorf("Warm without preloads started a code runtime: %v", z)
	}
	if res := runCell(t, plain, id, "", "6 * 7"); lastText(res) != "42" {
		t.Errorf("the first cell: %+v", res)
	}
}

// Code contexts go with their sandbox through a pause and a resume, and
// into the copies of a fork with memory, with their variables; there a
// context (and the spare forked ahead, which a new context is) holds the
// same random state in every copy until it reseeds, which it does at its
// first cell after the restore (the copy's /tmp/.sandbox-restored): the
// copies and the source draw apart, each keeping its variables.
func TestGVisorCodeContextsThroughPauseAndMemoryForks(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	const id = "code-forked"
	if _, err := b.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	runCell(t, b, id, "", "import random\nx = 41")
	if _, err := b.Pause(ctx, id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := b.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if res := runCell(t, b, id, "", "x + 1"); lastText(res) != "42" || res.ExecutionCount != 2 {
		t.Fatalf("the context after a pause and a resume: %+v", res)
	}
	copies := []string{"code-copy-1", "code-copy-2"}
	if _, err := b.Fork(ctx, id, copies, backend.SnapshotOptions{Memory: true}); err != nil {
		t.Fatalf("Fork with memory: %v", err)
	}
	kept, fresh := map[string]string{}, map[string]string{}
	for _, sb := range append([]string{id}, copies...) {
		res := runCell(t, b, sb, "", "(x, random.random())")
		if !strings.HasPrefix(lastText(res), "(41, ") || res.ExecutionCount != 3 {
			t.Errorf("the context in %s: %+v", sb, res)
		}
		kept[lastText(res)] = sb
		fresh[lastText(runCell(t, b, sb, "new", "import random\nrandom.random()"))] = sb
	}
	if len(kept) != 3 || len(fresh) != 3 {
		t.Errorf("the source and its copies drew the same numbers: in the forked context %v, in a new one %v", kept, fresh)
	}
}
