package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/internal/runscpin"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// pinnedRunsc is where scripts/install-runsc.sh caches the pinned build.
const pinnedRunsc = runscpin.Path

// findRunsc returns the runsc to measure: --runsc, $SANDBOX_SIDECAR_RUNSC,
// the pinned build, or runsc on PATH; "" when there is none.
func findRunsc(o options) string {
	for _, p := range []string{o.runsc, os.Getenv("SANDBOX_SIDECAR_RUNSC"), pinnedRunsc} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, _ := exec.LookPath("runsc")
	return p
}

// bareRunscExec runs argv with a bare `runsc exec` in the runsc sandbox id
// of the gvisor daemon d, as the guest user, with the flags the backend
// gives runsc: what a caller driving runsc itself pays per command.
func bareRunscExec(runsc string, d *daemon, id string, argv []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args := []string{"--root=" + filepath.Join(d.stateDir, "gvisor", ".runsc"), "--platform=systrap", "--network=none",
		"--overlay2=none", "--file-access-mounts=shared", "--ignore-cgroups",
		"exec", "--user", "1000:1000", "--cwd", "/workspace", "--env", "PATH=/usr/local/bin:/usr/bin:/bin", id}
	cmd := exec.CommandContext(ctx, runsc, append(args, argv...)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("runsc exec %v: %v: %s", argv, err, out)
	}
	return nil
}

// benchGVisor puts the gvisor backend beside the bwrap backend and a bare
// `runsc exec`, interleaved in one run: the steady cost of run_command, and
// create → first result cold and from a warm pool. Every daemon has the
// per-sandbox cgroups a root daemon gets and no disk caps (the gvisor
// backend has none). It needs root and runsc, and is skipped without them.
func benchGVisor(o options, rep *report) error {
	runsc := findRunsc(o)
	if o.socket != "" || os.Geteuid() != 0 || runsc == "" {
		fmt.Fprintln(os.Stderr, "   skipped: needs root, runsc (--runsc, $SANDBOX_SIDECAR_RUNSC or scripts/install-runsc.sh) and daemons of its own")
		return nil
	}
	gvFlags := []string{"--backend", "gvisor", "--gvisor-runsc-path", runsc, "--limit-disk-caps", "off"}
	bwFlags := []string{"--limit-disk-caps", "off"}
	if err := gvisorSteady(o, rep, runsc, gvFlags, bwFlags); err != nil {
		return err
	}
	return gvisorProvision(o, rep, gvFlags, bwFlags)
}

// gvisorSteady measures run_command on one sandbox of each backend and a
// bare runsc exec, the same command in turn, in rotating order.
func gvisorSteady(o options, rep *report, runsc string, gvFlags, bwFlags []string) error {
	gd, gc, stopG, err := startWithClient(o, gvFlags...)
	if err != nil {
		return fmt.Errorf("gvisor daemon: %w", err)
	}
	defer stopG()
	_, bc, stopB, err := startWithClient(o, bwFlags...)
	if err != nil {
		return err
	}
	defer stopB()
	gid, err := create(gc, map[string]any{"ttl_s": 3600})
	if err != nil {
		return err
	}
	// The bare runsc exec runs in a sandbox of its own: a command right
	// after a runsc exec into the same sandbox costs gVisor 1.5–2 ms more
	// (docs/performance.md, "gVisor: where a command's time goes"), which a
	// fixed order would charge to one side.
	rid, err := create(gc, map[string]any{"ttl_s": 3600})
	if err != nil {
		return err
	}
	bid, err := create(bc, map[string]any{"ttl_s": 3600})
	if err != nil {
		return err
	}
	n := 40
	if o.quick {
		n = 3
	}
	for _, argv := range [][]string{{"/bin/true"}, {"/usr/bin/python3", "-c", "pass"}} {
		ways := []func() error{
			func() error { _, err := runCmd(gc, gid, argv); return err },
			func() error { _, err := runCmd(bc, bid, argv); return err },
			func() error { return bareRunscExec(runsc, gd, rid, argv) },
		}
		d, err := rotate(ways, n, 3)
		if err != nil {
			return fmt.Errorf("%v: %w", argv, err)
		}
		gv, bw, bare := d[0], d[1], d[2]
		g50, b50, r50 := percentile(gv, 50), percentile(bw, 50), percentile(bare, 50)
		rep.add("gvisor", fmt.Sprintf("run_command %v, gvisor backend", argv), map[string]float64{"p50_ms": ms(g50), "p99_ms": ms(percentile(gv, 99))}, "through the daemon and the sandbox's init")
		rep.add("gvisor", fmt.Sprintf("run_command %v, bwrap backend", argv), map[string]float64{"p50_ms": ms(b50), "p99_ms": ms(percentile(bw, 99))}, "same run, interleaved")
		rep.add("gvisor", fmt.Sprintf("bare runsc exec %v", argv), map[string]float64{"p50_ms": ms(r50), "p99_ms": ms(percentile(bare, 99))}, "in the gvisor daemon's sandbox, no daemon")
		// As for bwrap, the target is a short command's; the
		// interpreter's start inside gVisor dominates the other.
		var ts []target
		if argv[0] == "/bin/true" {
			ts = append(ts, atMost("p50_ratio", 0.5))
		}
		rep.add("gvisor", fmt.Sprintf("ratio gvisor/bare runsc exec %v", argv), map[string]float64{"p50_ratio": float64(g50) / float64(r50)}, "", ts...)
		rep.add("gvisor", fmt.Sprintf("ratio gvisor/bwrap %v", argv), map[string]float64{"p50_ratio": float64(g50) / float64(b50)}, "what gVisor's kernel costs a command")
	}
	return nil
}

// gvisorProvision runs four daemons (gvisor and bwrap, cold and pooled) and
// one create → /bin/true → destroy on each in turn per round. A pooled
// daemon's pool is full before each take (its refill then boots while the
// first command runs, as in production).
func gvisorProvision(o options, rep *report, gvFlags, bwFlags []string) error {
	const poolSize = 2
	variants := []struct {
		name    string
		pool    int
		flags   []string
		targets []target
	}{
		{"gvisor, cold (no pool)", 0, gvFlags, nil},
		{fmt.Sprintf("gvisor, warm pool of %d", poolSize), poolSize, gvFlags, []target{atMost("p50_ms", 50)}},
		{"bwrap, cold (no pool)", 0, bwFlags, nil},
		{fmt.Sprintf("bwrap, warm pool of %d", poolSize), poolSize, bwFlags, nil},
	}
	clients := make([]*ipc.Client, len(variants))
	for i, v := range variants {
		_, c, stop, err := startWithClient(o, append([]string{"--pool-size", fmt.Sprint(v.pool)}, v.flags...)...)
		if err != nil {
			return fmt.Errorf("%s: %w", v.name, err)
		}
		defer stop()
		clients[i] = c
	}
	rounds := 15
	if o.quick {
		rounds = 2
	}
	creates := make([][]time.Duration, len(variants))
	firsts := make([][]time.Duration, len(variants))
	for range rounds {
		for i, v := range variants {
			c := clients[i]
			// Every pool full first: a refill booting a sandbox in
			// another daemon would take the CPU from this create.
			for j, w := range variants {
				if w.pool > 0 && !waitPooledFor(clients[j], w.pool, time.Minute) {
					return fmt.Errorf("%s: the pool did not fill within a minute", w.name)
				}
			}
			start := time.Now()
			id, err := create(c, nil)
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			creates[i] = append(creates[i], time.Since(start))
			if _, err := runCmd(c, id, []string{"/bin/true"}); err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			firsts[i] = append(firsts[i], time.Since(start))
			if err := call(c, ipc.OpDestroy, map[string]any{"sandbox": id}, nil); err != nil {
				return fmt.Errorf("%s: destroy: %w", v.name, err)
			}
		}
	}
	for i, v := range variants {
		rep.add("gvisor", "create, "+v.name, map[string]float64{"p50_ms": ms(percentile(creates[i], 50)), "p99_ms": ms(percentile(creates[i], 99))}, "")
		rep.add("gvisor", "create → first command result, "+v.name, map[string]float64{"p50_ms": ms(percentile(firsts[i], 50)), "p99_ms": ms(percentile(firsts[i], 99))}, "", v.targets...)
	}
	return nil
}

// waitPooledFor waits until the daemon's pool holds n sandboxes, at most
// limit; it reports whether it did.
func waitPooledFor(c *ipc.Client, n int, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		var h api.HealthResult
		if call(c, ipc.OpHealth, nil, &h) == nil && h.Pooled >= n {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

// rotate runs each of ways warm+n times, round by round, each round
// starting one further along (so none always follows the same other),
// and returns the durations of each past its first warm runs.
func rotate(ways []func() error, n, warm int) ([][]time.Duration, error) {
	d := make([][]time.Duration, len(ways))
	for i := 0; i < n+warm; i++ {
		for k := range ways {
			w := (i + k) % len(ways)
			start := time.Now()
			if err := ways[w](); err != nil {
				return nil, err
			}
			if i >= warm {
				d[w] = append(d[w], time.Since(start))
			}
		}
	}
	return d, nil
}
