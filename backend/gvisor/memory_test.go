package gvisor

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

func TestMemoryHeadroom(t *testing.T) {
	for limit, want := range map[int64]int64{64 << 20: 64 << 20, 256 << 20: 64 << 20, 1 << 30: 128 << 20, 8 << 30: 256 << 20} {
		if got := memoryHeadroom(limit); got != want {
			t.Errorf("memoryHeadroom(%d) = %d, want %d", limit, got, want)
		}
	}
}

// A reclaim frame is its sequence number and nothing else; its answer
// carries the longest body init gives it.
func TestReclaimFrameBounds(t *testing.T) {
	var buf bytes.Buffer
	if err := gvwire.WriteFrame(&buf, gvwire.KindReclaim, gvwire.U32s(7)); err != nil {
		t.Fatal(err)
	}
	if kind, p, err := gvwire.ReadFrame(&buf, 1<<gvwire.KindReclaim); err != nil || kind != gvwire.KindReclaim || len(p) != 4 {
		t.Fatalf("a reclaim frame read back as %d %x %v", kind, p, err)
	}
	_ = gvwire.WriteFrame(&buf, gvwire.KindReclaim, gvwire.U32s(7, 0))
	if _, _, err := gvwire.ReadFrame(&buf, 1<<gvwire.KindReclaim); !errors.Is(err, gvwire.ErrBadFrame) {
		t.Errorf("a reclaim frame of 8 bytes: %v, want ErrBadFrame", err)
	}
	if gvwire.MaxPayload(gvwire.KindProcAnswer) < 12+gvwire.MaxReclaimBody {
		t.Error("a proc answer cannot carry a reclaim's longest body")
	}
}

// waitOutput waits until process proc of sandbox id wrote want on stdout.
func waitOutput(t *testing.T, b *Backend, id, proc, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		out, err := b.ReadOutput(context.Background(), id, proc, false, 0, 1<<10, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out.Data), want) {
			return
		}
		if !out.Process.Running {
			t.Fatalf("process %s ended before it said %q: %+v", proc, want, out.Process)
		}
	}
	t.Fatalf("process %s did not say %q within a minute", proc, want)
}

// The mechanism a sandbox at its memory limit is held by (memory.go): its
// cgroup gets the headroom above the sandbox's limit; init's reclaim kills
// the guest's process with the largest resident set and no other, and a
// durable process it took is reported oom_killed (the counter init hands
// the keepers); and a durable process that allocates past the limit is
// killed so by the daemon, not by the host's OOM killer, the sandbox living
// on.
func TestGVisorReclaimTakesTheLargestGuestProcess(t *testing.T) {
	cgm := testCgroups(t)
	b := newTestBackend(t, func(c *Config) { c.Cgroups, c.Limits = cgm, limits.Defaults() })
	ctx := context.Background()
	const id, limit = "reclaim", 256 << 20
	if _, err := b.Create(ctx, id, backend.Spec{Resources: backend.Resources{MemoryBytes: limit}}); err != nil {
		t.Fatal(err)
	}
	sb, err := b.lookup(id)
	if err != nil || sb.cg == nil {
		t.Fatalf("the sandbox has no cgroup: %v", err)
	}
	if max := readCgroupInt(t, sb, "memory.limit_in_bytes", "memory.max"); max != limit+memoryHeadroom(limit) {
		t.Errorf("the cgroup's hard limit is %d, want the sandbox's %d and its headroom %d", max, int64(limit), memoryHeadroom(limit))
	}

	start := func(code string) string {
		t.Helper()
		p, err := b.StartProcess(ctx, id, backend.ProcessRequest{Argv: []string{"python3", "-u", "-c", code}})
		if err != nil {
			t.Fatal(err)
		}
		waitOutput(t, b, id, p.ID, "ready")
		return p.ID
	}
	bigID := start("import time\nb = bytearray(96 << 20)\nprint('ready')\ntime.sleep(600)")
	smallID := start("import time\nb = bytearray(16 << 20)\nprint('ready')\ntime.sleep(600)")
	c := sb.liveInit()
	if c == nil {
		t.Fatal("no live init")
	}
	ans, err := c.procCallWithin(ctx, gvwire.KindReclaim, func(seq uint32) []byte { return gvwire.U32s(seq) }, reclaimTimeout)
	if err != nil || ans.Errno != 0 {
		t.Fatalf("reclaim: %+v, %v", ans, err)
	}
	t.Logf("reclaim killed pid %d: %s", ans.Value, ans.Body)
	big, err := b.WaitProcess(ctx, id, bigID, 30*time.Second)
	if err != nil || big.Running || big.Reason != backend.ReasonOOMKilled || big.ExitCode != backend.ExitKilled {
		t.Errorf("the largest process after a reclaim: %+v, %v; want oom_killed, 137", big, err)
	}
	if small, err := b.WaitProcess(ctx, id, smallID, 0); err != nil || !small.Running {
		t.Errorf("a smaller process after a reclaim: %+v, %v; want it running", small, err)
	}

	// Past the limit for real: the daemon's watch kills it.
	p, err := b.StartProcess(ctx, id, backend.ProcessRequest{Argv: []string{"python3", "-c", "b = []\nfor i in range(64): b.append(bytearray(16 << 20))"}})
	if err != nil {
		t.Fatal(err)
	}
	hog, err := b.WaitProcess(ctx, id, p.ID, 2*time.Minute)
	if err != nil || hog.Running || hog.Reason != backend.ReasonOOMKilled {
		t.Errorf("a process allocating 1 GiB under 256 MiB: %+v, %v; want oom_killed", hog, err)
	}
	if small, err := b.WaitProcess(ctx, id, smallID, 0); err != nil || !small.Running {
		t.Errorf("the smaller process after another's kill at the limit: %+v, %v; want it running", small, err)
	}
	if kills, err := sb.cg.OOMKills(); err != nil || kills != 0 {
		t.Errorf("the host's OOM killer killed %d processes of the sandbox (%v)", kills, err)
	}
	if out := execOK(t, b, id, "echo alive"); out != "alive\n" {
		t.Errorf("the sandbox after its kills: %q", out)
	}

	// A resume boots a new sentry in a new cgroup: it is watched again.
	if _, err := b.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := b.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if sb, err = b.lookup(id); err != nil {
		t.Fatal(err)
	}
	if max := readCgroupInt(t, sb, "memory.limit_in_bytes", "memory.max"); max != limit+memoryHeadroom(limit) {
		t.Errorf("after a resume the cgroup's hard limit is %d, want %d", max, limit+memoryHeadroom(limit))
	}
	res, err := b.Exec(ctx, id, backend.ExecRequest{Argv: []string{"python3", "-c", "b = []\nfor i in range(64): b.append(bytearray(16 << 20))"}, Timeout: 2 * time.Minute})
	if err != nil || res.SandboxTerminated || !res.OOMKilled || res.ExitCode != backend.ExitKilled {
		t.Errorf("a command past the limit after a resume: %+v, %v; want oom_killed, 137, the sandbox alive", res, err)
	}
	if small, err := b.WaitProcess(ctx, id, smallID, 0); err != nil || !small.Running {
		t.Errorf("the smaller process after a resume and a kill at the limit: %+v, %v; want it running", small, err)
	}
	if kills, err := sb.cg.OOMKills(); err != nil || kills != 0 {
		t.Errorf("after a resume the host's OOM killer killed %d processes of the sandbox (%v)", kills, err)
	}
}

// readCgroupInt reads sb's memory control file v1 (or v2) as a number.
func readCgroupInt(t *testing.T, sb *sandbox, v1, v2 string) int64 {
	t.Helper()
	for _, d := range sb.cg.Dirs() {
		for _, name := range []string{v1, v2} {
			if b, err := os.ReadFile(filepath.Join(d, name)); err == nil {
				n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				if err != nil {
					t.Fatalf("%s: %q", name, b)
				}
				return n
			}
		}
	}
	t.Fatalf("sandbox %s's cgroup has neither %s nor %s", sb.id, v1, v2)
	return 0
}

// Files written through the gofer fill the host's page cache, charged to
// the sandbox's cgroup: the group's use reaches the sandbox's limit though
// the guest's processes hold little. The kernel reclaims that cache; the
// daemon must not kill a process for it.
func TestGVisorPageCacheKillsNothing(t *testing.T) {
	cgm := testCgroups(t)
	b := newTestBackend(t, func(c *Config) { c.Cgroups, c.Limits = cgm, limits.Defaults() })
	ctx := context.Background()
	const id, limit = "cache", 256 << 20
	if _, err := b.Create(ctx, id, backend.Spec{Resources: backend.Resources{MemoryBytes: limit}}); err != nil {
		t.Fatal(err)
	}
	p, err := b.StartProcess(ctx, id, backend.ProcessRequest{Argv: []string{"python3", "-u", "-c", "import time\nb = bytearray(32 << 20)\nprint('ready')\ntime.sleep(600)"}})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, b, id, p.ID, "ready")
	for _, dir := range []string{"/workspace", "/tmp"} {
		res, err := b.Exec(ctx, id, backend.ExecRequest{Command: "for i in 1 2 3; do dd if=/dev/zero of=" + dir + "/big bs=1M count=600 conv=fsync 2>/dev/null || exit 9; done; echo done", Timeout: 3 * time.Minute})
		if err != nil || res.ExitCode != 0 || res.OOMKilled || string(res.Stdout) != "done\n" {
			t.Errorf("writing 1.8 GB to %s under a 256 MiB limit: %+v, %v", dir, res, err)
		}
		if info, err := b.WaitProcess(ctx, id, p.ID, 0); err != nil || !info.Running {
			t.Errorf("a 32 MiB process after 1.8 GB written to %s: %+v, %v; want it running", dir, info, err)
		}
		execOK(t, b, id, "rm "+dir+"/big")
	}
}
