package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

func callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Minute)
}

func call(c *ipc.Client, op string, args map[string]any, out any) error {
	ctx, cancel := callCtx()
	defer cancel()
	return c.Call(ctx, op, args, out)
}

type execResult = api.RunCommandResult

func create(c *ipc.Client, args map[string]any) (string, error) {
	var res api.CreateResult
	err := call(c, ipc.OpCreate, args, &res)
	return res.Sandbox, err
}

func runCmd(c *ipc.Client, id string, argv []string) (execResult, error) {
	ctx, cancel := callCtx()
	defer cancel()
	res, err := c.RunCommand(ctx, api.RunCommandRequest{Sandbox: id, Argv: argv, TimeoutS: 120})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("%v exited %d", argv, res.ExitCode)
	}
	return res, err
}

// --- 1. RPC floor -----------------------------------------------------

func benchRPC(o options, rep *report) error {
	d, c, stop, err := startWithClient(o)
	if err != nil {
		return err
	}
	defer stop()
	n := 5000
	if o.quick {
		n = 200
	}
	// The Go client and a synchronous one, call by call in turn, so both
	// see the same moments of a noisy machine.
	sc, err := dialSync(d.socket)
	if err != nil {
		return err
	}
	defer sc.Close()
	lat, syncLat := make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	for i := 0; i < n+100; i++ { // the first 100 warm up
		start := time.Now()
		if err := call(c, ipc.OpHealth, nil, nil); err != nil {
			return err
		}
		goLat := time.Since(start)
		one, err := sc.health()
		if err != nil {
			return err
		}
		if i >= 100 {
			lat, syncLat = append(lat, goLat), append(syncLat, one)
		}
	}
	goP50, syncP50 := percentile(lat, 50).Microseconds(), percentile(syncLat, 50).Microseconds()
	rep.add("rpc", "health latency, 1 connection, Go ipc client", map[string]float64{
		"p50_us": float64(goP50), "p99_us": float64(percentile(lat, 99).Microseconds()), "n": float64(n),
		"p50_over_sync_us": float64(goP50 - syncP50)},
		"interleaved with the next row; a lone call reads its own answer (no reader goroutine)",
		atMost("p50_over_sync_us", 20))
	rep.add("rpc", "health latency, 1 connection, synchronous client", map[string]float64{
		"p50_us": float64(syncP50), "p99_us": float64(percentile(syncLat, 99).Microseconds()), "n": float64(n)},
		"write a frame, read a frame: the daemon's own cost",
		atMost("p50_us", 100))

	dur := 2 * time.Second
	if o.quick {
		dur = 300 * time.Millisecond
	}
	for _, conns := range []int{1, 8, 64} {
		for _, depth := range []int{1, 16} {
			rps, err := throughput(d, conns, depth, dur)
			if err != nil {
				return err
			}
			mode := "one at a time"
			if depth > 1 {
				mode = fmt.Sprintf("pipelined, %d in flight each", depth)
			}
			var ts []target
			if conns == 8 {
				ts = append(ts, atLeast("req_per_s", 20000))
			}
			rep.add("rpc", fmt.Sprintf("health throughput, %d conns, %s", conns, mode), map[string]float64{"req_per_s": rps}, "", ts...)
		}
	}
	return nil
}

// syncClient makes health round trips the simplest way a client can: write
// one frame, read one frame, on one goroutine.
type syncClient struct {
	net.Conn
	br    *bufio.Reader
	frame []byte
}

func dialSync(socket string) (*syncClient, error) {
	nc, err := net.Dial("unix", socket)
	if err != nil {
		return nil, err
	}
	body, err := msgpack.Marshal(map[string]any{"v": 1, "id": 1, "op": ipc.OpHealth})
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &syncClient{Conn: nc, br: bufio.NewReader(nc), frame: ipc.AppendFrame(nil, body)}, nil
}

func (s *syncClient) health() (time.Duration, error) {
	s.SetDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	if _, err := s.Write(s.frame); err != nil {
		return 0, err
	}
	if _, err := ipc.ReadFrame(s.br, ipc.DefaultMaxFrame); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// throughput runs health calls on conns connections, depth at a time on
// each, for dur, and returns requests per second.
func throughput(d *daemon, conns, depth int, dur time.Duration) (float64, error) {
	clients := make([]*ipc.Client, conns)
	for i := range clients {
		c, err := d.client()
		if err != nil {
			return 0, err
		}
		defer c.Close()
		clients[i] = c
	}
	var total atomic.Int64
	var firstErr atomic.Value
	deadline := time.Now().Add(dur)
	start := time.Now()
	var wg sync.WaitGroup
	for _, c := range clients {
		for range depth {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					if err := call(c, ipc.OpHealth, nil, nil); err != nil {
						firstErr.CompareAndSwap(nil, err)
						return
					}
					total.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, err
	}
	return float64(total.Load()) / time.Since(start).Seconds(), nil
}

// --- 2. Command cost --------------------------------------------------

// directBwrap runs argv in a fresh bubblewrap with the isolation the
// bwrap backend gives a sandbox, as a caller driving bubblewrap itself
// would (workspace and /tmp bound from dir). Until the sidecar's init kept
// budgets itself, both ran the command under GNU timeout.
func directBwrap(dir string, argv []string) error {
	args := []string{
		"--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv",
		"--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/workspace", "--setenv", "LANG", "C.UTF-8",
		"--uid", "1000", "--gid", "1000", "--hostname", "sandbox",
		"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
		"--ro-bind-try", "/etc/alternatives", "/etc/alternatives", "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
		"--proc", "/proc", "--dev", "/dev",
		"--bind", filepath.Join(dir, "work"), "/workspace", "--bind", filepath.Join(dir, "tmp"), "/tmp", "--chdir", "/workspace",
		// The command alone, as the sidecar's init now runs it: such a
		// caller keeps the budget from outside (it can kill bwrap).
		"--",
	}
	cmd := exec.Command("bwrap", append(args, argv...)...)
	cmd.Env = []string{}
	if os.Geteuid() == 0 {
		// As the daemon does: bubblewrap as an unprivileged uid.
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	}
	return cmd.Run()
}

func benchCommand(o options, rep *report) error {
	_, c, stop, err := startWithClient(o)
	if err != nil {
		return err
	}
	defer stop()
	id, err := create(c, map[string]any{"ttl_s": 3600})
	if err != nil {
		return err
	}
	// The same daemon without per-sandbox cgroups, interleaved too: what
	// a sandbox's cgroup costs each command (placement is per init, the
	// OOM counter is read around every command).
	var cPlain *ipc.Client
	var idPlain string
	if o.socket == "" {
		_, cp, stopPlain, err := startWithClient(o, "--limit-cgroups", "off", "--limit-disk-caps", "off")
		if err != nil {
			return err
		}
		defer stopPlain()
		cPlain = cp
		if idPlain, err = create(cPlain, map[string]any{"ttl_s": 3600}); err != nil {
			return err
		}
	}
	dir, err := os.MkdirTemp("", "bench-direct")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	for _, sub := range []string{"work", "tmp"} {
		os.Mkdir(filepath.Join(dir, sub), 0o777)
		os.Chmod(filepath.Join(dir, sub), 0o777)
	}
	n := 100
	if o.quick {
		n = 10
	}
	for _, argv := range [][]string{{"/bin/true"}, {"/usr/bin/python3", "-c", "pass"}} {
		var side, plain, direct, host []time.Duration
		for i := 0; i < n+3; i++ { // interleaved; the first 3 of each warm up
			// The host's own program, spawned by this client: the floor.
			start := time.Now()
			if err := exec.Command(argv[0], argv[1:]...).Run(); err != nil {
				return fmt.Errorf("host %v: %w", argv, err)
			}
			if i >= 3 {
				host = append(host, time.Since(start))
			}
			start = time.Now()
			if _, err := runCmd(c, id, argv); err != nil {
				return err
			}
			s := time.Since(start)
			if cPlain != nil {
				start = time.Now()
				if _, err := runCmd(cPlain, idPlain, argv); err != nil {
					return err
				}
				if i >= 3 {
					plain = append(plain, time.Since(start))
				}
			}
			start = time.Now()
			if err := directBwrap(dir, argv); err != nil {
				return fmt.Errorf("direct bwrap: %w", err)
			}
			dd := time.Since(start)
			if i >= 3 {
				side, direct = append(side, s), append(direct, dd)
			}
		}
		sp50, dp50, hp50 := percentile(side, 50), percentile(direct, 50), percentile(host, 50)
		sp99, dp99 := percentile(side, 99), percentile(direct, 99)
		rep.add("command", fmt.Sprintf("run_command %v via sidecar", argv), map[string]float64{"p50_ms": ms(sp50), "p99_ms": ms(sp99)}, "")
		rep.add("command", fmt.Sprintf("direct bwrap %v", argv), map[string]float64{"p50_ms": ms(dp50), "p99_ms": ms(dp99)}, "the command alone, no GNU timeout")
		rep.add("command", fmt.Sprintf("host %v, spawned by the client", argv), map[string]float64{"p50_ms": ms(hp50), "p99_ms": ms(percentile(host, 99))}, "no sandbox: the floor")
		// The target against a direct bubblewrap is a short command's:
		// an interpreter's start dominates both sides of the other.
		note, ts := "the interpreter's own start dominates both; no target", []target(nil)
		if argv[0] == "/bin/true" {
			note, ts = "", []target{atMost("p50_ratio", 0.3), atMost("p99_ratio", 0.5)}
		}
		rep.add("command", fmt.Sprintf("ratio sidecar/direct %v", argv), map[string]float64{"p50_ratio": float64(sp50) / float64(dp50), "p99_ratio": float64(sp99) / float64(dp99)}, note, ts...)
		rep.add("command", fmt.Sprintf("ratio sidecar/host %v", argv), map[string]float64{"p50_ratio": float64(sp50) / float64(hp50)}, "", atMost("p50_ratio", 2))
		if len(plain) > 0 {
			pp50 := percentile(plain, 50)
			rep.add("command", fmt.Sprintf("run_command %v via sidecar, no per-sandbox cgroup", argv), map[string]float64{"p50_ms": ms(pp50), "p99_ms": ms(percentile(plain, 99))}, "")
			rep.add("command", fmt.Sprintf("ratio sidecar without cgroup/direct %v", argv), map[string]float64{"p50_ratio": float64(pp50) / float64(dp50)}, "direct bwrap has no cgroup either")
		}
	}
	return nil
}

// --- 3. Provisioning --------------------------------------------------

func benchProvision(o options, rep *report) error {
	n := 40
	if o.quick {
		n = 5
	}
	// Cold creates with each per-sandbox limit mechanism added in turn
	// (a cgroup; a disk of its own: a sparse image, mkfs.ext4 and a loop
	// mount), then the warm pool with all of them.
	// The targets: a cold first result within 5 ms of a direct bubblewrap
	// without limits, 20 ms with a cgroup and a disk (none with a cgroup
	// alone); from the pool, within 2 ms of a steady command.
	variants := []struct {
		pool   int
		name   string
		flags  []string
		target target
	}{
		{0, "cold (no pool), no cgroup or disk cap", []string{"--limit-cgroups", "off", "--limit-disk-caps", "off"}, atMost("p50_over_direct_ms", 5)},
		{0, "cold (no pool), cgroup", []string{"--limit-disk-caps", "off"}, target{}},
		{0, "cold (no pool), cgroup + 1 GiB disk cap", nil, atMost("p50_over_direct_ms", 20)},
		{4, "warm pool of 4, cgroup + 1 GiB disk cap", nil, atMost("p50_over_steady_ms", 2)},
	}
	dir, err := directDir()
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, v := range variants {
		r, err := provisionRuns(o, n, v.pool, v.flags, dir)
		if err != nil {
			return err
		}
		fp50, sp50, dp50 := percentile(r.firsts, 50), percentile(r.steady, 50), percentile(r.direct, 50)
		rep.add("provision", "create, "+v.name, map[string]float64{"p50_ms": ms(percentile(r.creates, 50)), "p99_ms": ms(percentile(r.creates, 99))}, "")
		rep.add("provision", "create → first command result, "+v.name, map[string]float64{"p50_ms": ms(fp50), "p99_ms": ms(percentile(r.firsts, 99))}, "")
		rep.add("provision", "steady run_command [/bin/true] in a used sandbox, interleaved, "+v.name, map[string]float64{"p50_ms": ms(sp50), "p99_ms": ms(percentile(r.steady, 99))}, "")
		rep.add("provision", "direct bwrap [/bin/true], interleaved, "+v.name, map[string]float64{"p50_ms": ms(dp50), "p99_ms": ms(percentile(r.direct, 99))}, "")
		var ts []target
		if v.target.Key != "" {
			ts = append(ts, v.target)
		}
		rep.add("provision", "first result minus steady and minus direct, "+v.name, map[string]float64{"p50_over_steady_ms": ms(fp50 - sp50), "p50_over_direct_ms": ms(fp50 - dp50)}, "", ts...)
		if len(r.afterPause) > 0 {
			ap50 := percentile(r.afterPause, 50)
			rep.add("provision", fmt.Sprintf("first command alone, %v after the create answered, %s", thinkTime, v.name),
				map[string]float64{"p50_ms": ms(ap50), "p99_ms": ms(percentile(r.afterPause, 99)), "p50_over_steady_ms": ms(ap50 - sp50)},
				"an agent's pause before its first step: the create's background start of the init is done by then")
		}
	}
	return nil
}

// directDir makes the workspace and /tmp a direct bubblewrap binds.
func directDir() (string, error) {
	dir, err := os.MkdirTemp("", "bench-direct")
	if err != nil {
		return "", err
	}
	os.Chmod(dir, 0o755)
	for _, sub := range []string{"work", "tmp"} {
		os.Mkdir(filepath.Join(dir, sub), 0o777)
		os.Chmod(filepath.Join(dir, sub), 0o777)
	}
	return dir, nil
}

type provisionResult struct {
	creates, firsts, steady, direct []time.Duration
	// afterPause: a cold create's first command alone, sent thinkTime
	// after the create answered, as an agent's would be.
	afterPause []time.Duration
}

// thinkTime is the pause between a create and its first command in the
// provision rows that stand for an agent (which thinks before it acts).
const thinkTime = 50 * time.Millisecond

// provisionRuns times n creates (and each one's first command) on a daemon
// of its own with a pool of pool sandboxes and the given flags,
// interleaved with a steady command in a sandbox that has run one before
// and a direct bubblewrap of the same command (binding dir).
func provisionRuns(o options, n, pool int, flags []string, dir string) (r provisionResult, err error) {
	_, c, stop, err := startWithClient(o, append([]string{"--pool-size", fmt.Sprint(pool)}, flags...)...)
	if err != nil {
		return r, err
	}
	defer stop()
	if pool > 0 {
		waitPooled(c, pool)
	}
	used, err := create(c, map[string]any{"ttl_s": 3600})
	if err != nil {
		return r, err
	}
	if _, err := runCmd(c, used, []string{"/bin/true"}); err != nil {
		return r, err
	}
	for i := 0; i < n; i++ {
		if pool > 0 {
			waitPooled(c, pool)
		}
		start := time.Now()
		id, err := create(c, nil)
		if err != nil {
			return r, err
		}
		r.creates = append(r.creates, time.Since(start))
		if _, err := runCmd(c, id, []string{"/bin/true"}); err != nil {
			return r, err
		}
		r.firsts = append(r.firsts, time.Since(start))
		call(c, ipc.OpDestroy, map[string]any{"sandbox": id}, nil)
		if pool == 0 {
			id, err := create(c, nil)
			if err != nil {
				return r, err
			}
			time.Sleep(thinkTime)
			start = time.Now()
			if _, err := runCmd(c, id, []string{"/bin/true"}); err != nil {
				return r, err
			}
			r.afterPause = append(r.afterPause, time.Since(start))
			call(c, ipc.OpDestroy, map[string]any{"sandbox": id}, nil)
		}
		start = time.Now()
		if _, err := runCmd(c, used, []string{"/bin/true"}); err != nil {
			return r, err
		}
		r.steady = append(r.steady, time.Since(start))
		start = time.Now()
		if err := directBwrap(dir, []string{"/bin/true"}); err != nil {
			return r, fmt.Errorf("direct bwrap: %w", err)
		}
		r.direct = append(r.direct, time.Since(start))
	}
	return r, nil
}

func waitPooled(c *ipc.Client, n int) { waitPooledFor(c, n, 10*time.Second) }

// --- 4. Output --------------------------------------------------------

func benchOutput(o options, rep *report) error {
	d, c, stop, err := startWithClient(o)
	if err != nil {
		return err
	}
	defer stop()
	id, err := create(c, nil)
	if err != nil {
		return err
	}
	size := int64(1 << 30)
	if o.quick {
		size = 64 << 20
	}
	const capBytes = 64 << 10
	d.resetPeak()
	before := d.status("VmHWM")
	start := time.Now()
	var res execResult
	err = call(c, ipc.OpRunCommand, map[string]any{"sandbox": id, "argv": []string{"head", "-c", fmt.Sprint(size), "/dev/zero"},
		"max_output_bytes": capBytes, "timeout_s": 600}, &res)
	if err != nil {
		return err
	}
	wall := time.Since(start)
	after := d.status("VmHWM")
	if !res.StdoutTruncated || len(res.Stdout) > capBytes {
		return fmt.Errorf("flood not capped: %d bytes, truncated=%v", len(res.Stdout), res.StdoutTruncated)
	}
	// The same bytes straight into /dev/null, as the pipe's own ceiling.
	pipeStart := time.Now()
	if err := exec.Command("sh", "-c", fmt.Sprintf("head -c %d /dev/zero | cat > /dev/null", size)).Run(); err != nil {
		return err
	}
	pipe := time.Since(pipeStart)
	rep.add("output", fmt.Sprintf("%d MiB to stdout, 64 KiB cap", size>>20), map[string]float64{
		"wall_s": wall.Seconds(), "MiB_per_s": float64(size>>20) / wall.Seconds(),
		"pipe_only_MiB_per_s":        float64(size>>20) / pipe.Seconds(),
		"daemon_peak_rss_growth_KiB": after - before}, "the daemon's peak RSS may grow by twice the cap and 16 MiB",
		atMost("daemon_peak_rss_growth_KiB", 2*capBytes/1024+16*1024))
	return nil
}

// --- 5. Scale ---------------------------------------------------------

func benchScale(o options, rep *report) error {
	// Without disk caps: hundreds of loop-mounted images measure mkfs, not
	// the daemon.
	d, err := startDaemon(o, "--limit-disk-caps", "off")
	if err != nil {
		return err
	}
	defer d.stop()
	time.Sleep(500 * time.Millisecond)
	idle := d.status("VmRSS")
	rep.add("scale", "idle daemon", map[string]float64{"rss_KiB": idle, "fds": d.fds()}, "", atMost("rss_KiB", 25*1024))

	levels, nConns, nSample := []int{1, 10, 100, 500}, 1000, 30
	if o.quick {
		levels, nConns, nSample = []int{1, 5}, 50, 3
	}
	c, err := d.client()
	if err != nil {
		return err
	}
	defer c.Close()
	runtime_GC(c)
	rss0, fds0 := d.status("VmRSS"), d.fds()
	// Live sandboxes as an agent leaves them: made, and one command run
	// (so each has its init, and the daemon its descriptors for it).
	var ids []string
	for _, level := range levels {
		for len(ids) < level {
			id, err := create(c, map[string]any{"ttl_s": 3600})
			if err != nil {
				return fmt.Errorf("live sandbox %d: %w", len(ids)+1, err)
			}
			if _, err := runCmd(c, id, []string{"/bin/true"}); err != nil {
				return err
			}
			ids = append(ids, id)
		}
		time.Sleep(300 * time.Millisecond)
		runtime_GC(c)
		rss, fds := d.status("VmRSS"), d.fds()
		// On top of them: creates (each destroyed again) and commands in
		// the live ones, in turn.
		var creates, destroys, cmds []time.Duration
		for i := range nSample {
			start := time.Now()
			id, err := create(c, map[string]any{"ttl_s": 3600})
			if err != nil {
				return err
			}
			creates = append(creates, time.Since(start))
			start = time.Now()
			if err := call(c, ipc.OpDestroy, map[string]any{"sandbox": id}, nil); err != nil {
				return err
			}
			destroys = append(destroys, time.Since(start))
			start = time.Now()
			if _, err := runCmd(c, ids[i%len(ids)], []string{"/bin/true"}); err != nil {
				return err
			}
			cmds = append(cmds, time.Since(start))
		}
		// The bound per sandbox holds where sandboxes, not the daemon's
		// first allocations, make the growth.
		var ts []target
		if level >= 100 {
			ts = append(ts, atMost("KiB_per_sandbox", 64))
		}
		rep.add("scale", fmt.Sprintf("%d live sandboxes (each ran a command)", level), map[string]float64{
			"rss_KiB": rss, "KiB_per_sandbox": (rss - rss0) / float64(level), "fds": fds, "fds_per_sandbox": (fds - fds0) / float64(level),
			"create_p50_ms": ms(percentile(creates, 50)), "create_p99_ms": ms(percentile(creates, 99)),
			"destroy_p50_ms": ms(percentile(destroys, 50)), "destroy_p99_ms": ms(percentile(destroys, 99)),
			"cmd_p50_ms": ms(percentile(cmds, 50)), "cmd_p99_ms": ms(percentile(cmds, 99))},
			fmt.Sprintf("%d creates (each destroyed at once) and %d commands at this level; cgroups, no disk caps", nSample, nSample), ts...)
	}
	rss1 := d.status("VmRSS")

	conns := make([]*ipc.Client, 0, nConns)
	for range nConns {
		cc, err := d.client()
		if err != nil {
			return fmt.Errorf("connection %d: %w", len(conns), err)
		}
		if err := call(cc, ipc.OpHello, nil, nil); err != nil {
			return err
		}
		conns = append(conns, cc)
	}
	time.Sleep(300 * time.Millisecond)
	rss2 := d.status("VmRSS")
	rep.add("scale", fmt.Sprintf("%d idle connections", nConns), map[string]float64{"rss_KiB": rss2, "KiB_per_connection": (rss2 - rss1) / float64(nConns), "fds": d.fds()}, "", atMost("KiB_per_connection", 64))
	for _, cc := range conns {
		cc.Close()
	}
	for _, id := range ids {
		call(c, ipc.OpDestroy, map[string]any{"sandbox": id}, nil)
	}

	return nil
}

// --- 6. Concurrent agents ---------------------------------------------

// benchAgents runs agents concurrent create → commands → destroy, each on
// its own connection, on a daemon with the default limits but for the
// counts the scenario needs.
func benchAgents(o options, rep *report) error {
	d, err := startDaemon(o, "--limit-disk-caps", "off")
	if err != nil {
		return err
	}
	defer d.stop()
	nAgents, nCmds := 50, 20
	if o.quick {
		nAgents, nCmds = 5, 3
	}
	wall, lat, creates, err := runAgents(d, nAgents, nCmds)
	if err != nil {
		return err
	}
	rep.add("agents", fmt.Sprintf("%d agents × (create, %d commands, destroy)", nAgents, nCmds), map[string]float64{
		"wall_s": wall.Seconds(), "commands_per_s": float64(nAgents*nCmds) / wall.Seconds(),
		"cmd_p50_ms": ms(percentile(lat, 50)), "cmd_p99_ms": ms(percentile(lat, 99)),
		"create_p50_ms": ms(percentile(creates, 50)), "create_p99_ms": ms(percentile(creates, 99))}, "cgroups, no disk caps",
		atLeast("commands_per_s", 150), atMost("cmd_p99_ms", 1000))
	return nil
}

// runAgents runs the agents and returns the wall time, every command's
// latency and every create's.
func runAgents(d *daemon, nAgents, nCmds int) (time.Duration, []time.Duration, []time.Duration, error) {
	var mu sync.Mutex
	var lat, creates []time.Duration
	var firstErr error
	start := time.Now()
	var wg sync.WaitGroup
	for range nAgents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := func() error {
				ac, err := d.client()
				if err != nil {
					return err
				}
				defer ac.Close()
				cs := time.Now()
				id, err := create(ac, nil)
				if err != nil {
					return err
				}
				mu.Lock()
				creates = append(creates, time.Since(cs))
				mu.Unlock()
				for range nCmds {
					s := time.Now()
					if _, err := runCmd(ac, id, []string{"/bin/true"}); err != nil {
						return err
					}
					mu.Lock()
					lat = append(lat, time.Since(s))
					mu.Unlock()
				}
				return call(ac, ipc.OpDestroy, map[string]any{"sandbox": id}, nil)
			}()
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return time.Since(start), lat, creates, firstErr
}

// runtime_GC gives the daemon a moment to settle before a baseline.
func runtime_GC(c *ipc.Client) {
	call(c, ipc.OpHealth, nil, nil)
	time.Sleep(200 * time.Millisecond)
}

// --- 7. Recovery ------------------------------------------------------

func benchRecovery(o options, rep *report) error {
	if o.socket != "" {
		return nil // needs a daemon of our own to kill
	}
	sizes := []int{1000, 10000}
	if o.quick {
		sizes = []int{40}
	}
	for _, n := range sizes {
		if err := recoveryRun(o, rep, n); err != nil {
			return fmt.Errorf("%d records: %w", n, err)
		}
	}
	return nil
}

// What one sandbox with a running init takes of the host's limits:
// descriptors of the daemon (its control socket, init's stderr, bwrap's
// pidfd: 3.2 measured, rounded up) and tasks, which count against
// kernel.pid_max (bwrap, init and init's threads: 14 measured, rounded
// up); and what the rest of the host needs besides.
const (
	descriptorsPerLiveSandbox = 3.5
	descriptorsSpare          = 1000
	tasksPerLiveSandbox       = 16
	tasksSpare                = 2000
)

// liveSandboxesHeld is how many sandboxes with a running init this host
// can hold: the daemon inherits this process's open-files limit, and every
// task counts against kernel.pid_max. why names the tighter bound.
func liveSandboxesHeld() (n int, why string) {
	n, why = 1<<30, ""
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err == nil && l.Cur < 1<<30 {
		n = max(0, int(float64(int64(l.Cur)-descriptorsSpare)/descriptorsPerLiveSandbox))
		why = fmt.Sprintf("the open-files limit (%d; raise it with ulimit -Hn, which needs CAP_SYS_RESOURCE)", l.Cur)
	}
	if b, err := os.ReadFile("/proc/sys/kernel/pid_max"); err == nil {
		if pidMax, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			if byPids := max(0, (pidMax-tasksSpare)/tasksPerLiveSandbox); byPids < n {
				n, why = byPids, fmt.Sprintf("kernel.pid_max (%d; raise it with sysctl -w kernel.pid_max=4194304)", pidMax)
			}
		}
	}
	return n, why
}

// recoveryRun makes n sandboxes (half connection-bound, so recovery
// destroys them; half with a lease, so it adopts them), kills the daemon
// with -9 and times its restart: until it listens, and until a health call
// on a fresh connection is answered.
//
// Every new sandbox's init starts at its create, and holds descriptors of
// the daemon until the kill. Where the open-files limit cannot hold n of
// them (a host whose hard limit this root may not raise), the leased half
// is made in batches, each ended by a kill -9 and a restart that adopts it
// (an adopted sandbox has no init until its next command), and only the
// connection-bound half is live at the measured kill. The journal then
// holds the same n records; the row says how many restarts made them.
func recoveryRun(o options, rep *report, n int) error {
	becomeSubreaper()
	count := fmt.Sprint(n + 100)
	d, err := startDaemon(o, "--limit-disk-caps", "off", "--max-sandboxes", count, "--max-sandboxes-per-uid", count)
	if err != nil {
		return err
	}
	defer d.stop()
	const conns = 8
	held, heldBy := liveSandboxesHeld()
	bound, leased := n/2, n-n/2
	batched := n > held
	if batched && bound > held {
		return fmt.Errorf("this host holds %d sandboxes with a running init, fewer than the %d connection-bound ones the scenario needs live at once; the bound is %s", held, bound, heldBy)
	}
	closeAll := func(cs []*ipc.Client) {
		for _, c := range cs {
			if c != nil {
				c.Close()
			}
		}
	}
	var owned []string
	var keep []*ipc.Client
	restarts := 0
	if !batched {
		// Interleaved, as an agent fleet makes them: one connection-bound
		// and one leased at a time on each connection.
		keep, owned, err = makeSandboxes(d, n, conns, func(i int) bool { return i%2 == 0 })
		if err != nil {
			closeAll(keep)
			return err
		}
	} else {
		batch := max(1, held-bound)
		if held-bound < held/4 {
			batch = held / 2
		}
		for left := leased; left > 0; {
			k := min(left, batch)
			cs, ids, err := makeSandboxes(d, k, conns, func(int) bool { return true })
			closeAll(cs)
			owned = append(owned, ids...)
			if err != nil {
				return err
			}
			left -= k
			if left > 0 || k+bound > held {
				d.kill9()
				if _, err := d.start(); err != nil {
					return err
				}
				restarts++
			}
		}
		if keep, _, err = makeSandboxes(d, bound, conns, func(int) bool { return false }); err != nil {
			closeAll(keep)
			return err
		}
	}
	teardown := d.kill9()
	closeAll(keep)
	begin := time.Now()
	listening, err := d.start()
	if err != nil {
		return err
	}
	c, err := d.client()
	if err != nil {
		return err
	}
	defer c.Close()
	var h api.HealthResult
	if err := call(c, ipc.OpHealth, nil, &h); err != nil {
		return err
	}
	answered := time.Since(begin)
	// A client's first command after the restart, in the leased sandbox
	// recovery's adopt queue reaches last (it goes in the journal's order,
	// by id).
	lastQueued := slices.Max(owned)
	if _, err := runCmd(c, lastQueued, []string{"true"}); err != nil {
		return fmt.Errorf("a command in an adopted sandbox after the restart: %w", err)
	}
	firstCommand := time.Since(begin)
	note := "sandboxes have cgroups, no disk caps; restarted once the killed daemon's processes had ended (old_sandboxes_gone_s after the kill), as systemd restarts the unit; command_in_last_queued_s: a command answered in the sandbox recovery's adopt queue reaches last"
	if batched {
		note += fmt.Sprintf("; this host holds %d live sandboxes (by %s), so the leased half was made over %d kill -9 restarts and only the connection-bound half had a running init at the measured kill", held, heldBy, restarts)
	}
	var ts []target // serving within 2 s of the start, at 10,000 records
	if n >= 10000 {
		ts = append(ts, atMost("until_health_answered_s", 2))
	}
	rep.add("recovery", fmt.Sprintf("start with %d journal records (half connection-bound)", n), map[string]float64{
		"until_listening_s": listening.Seconds(), "until_health_answered_s": answered.Seconds(), "reconcile_s": h.Recovery.DurationS,
		"adopted": float64(h.Recovery.Adopted), "destroyed": float64(h.Recovery.Destroyed), "failed": float64(h.Recovery.Failed),
		"destroys_left_to_background": float64(h.Recovery.Pending), "background_done_s": waitRecovered(c, begin).Seconds(),
		"restarts_to_make_records": float64(restarts), "old_sandboxes_gone_s": teardown.Seconds(),
		"command_in_last_queued_s": firstCommand.Seconds()},
		note, ts...)
	// Leave nothing behind: the leased half outlives a daemon's stop.
	destroyAll(d, owned, conns)
	return nil
}

// makeSandboxes creates n sandboxes over conns connections, the i-th with
// a lease when leased(i), otherwise bound to its connection. It returns
// the connections, which the caller keeps open as long as the bound ones
// should live, and the leased ids.
func makeSandboxes(d *daemon, n, conns int, leased func(i int) bool) ([]*ipc.Client, []string, error) {
	keep := make([]*ipc.Client, conns)
	for i := range keep {
		var err error
		if keep[i], err = d.client(); err != nil {
			return keep, nil, err
		}
	}
	var mu sync.Mutex
	var owned []string
	var firstErr error
	var wg sync.WaitGroup
	for w := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += conns {
				var args map[string]any // connection-bound: destroyed by recovery
				if leased(i) {
					args = map[string]any{"ttl_s": 3600}
				}
				id, err := create(keep[w], args)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil && args != nil {
					owned = append(owned, id)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	return keep, owned, firstErr
}

// waitRecovered waits (at most 10 minutes) until recovery's background
// destroys are done and returns how long after begin that was.
func waitRecovered(c *ipc.Client, begin time.Time) time.Duration {
	deadline := time.Now().Add(10 * time.Minute)
	for time.Now().Before(deadline) {
		var h api.HealthResult
		if call(c, ipc.OpHealth, nil, &h) == nil && h.Recovery.Pending == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(begin)
}

// destroyAll destroys ids on conns connections at once.
func destroyAll(d *daemon, ids []string, conns int) {
	var wg sync.WaitGroup
	for w := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := d.client()
			if err != nil {
				return
			}
			defer c.Close()
			for i := w; i < len(ids); i += conns {
				call(c, ipc.OpDestroy, map[string]any{"sandbox": ids[i]}, nil)
			}
		}()
	}
	wg.Wait()
}

// --- 8. sbx on its fake -----------------------------------------------

// sbxCreateDelay is how long the fake sbx takes to create a sandbox: a
// stand-in for a microVM's boot.
const sbxCreateDelay = 500 * time.Millisecond

// benchSbx runs the sbx backend against backend/sbx/sbxfake (no KVM
// needed; each command is one fake CLI process and the command, run on
// the host): commands, cold creates and the warm pool, the same rows as
// bwrap's. The fake is built with `go build`, so this scenario needs the
// source tree.
func benchSbx(o options, rep *report) error {
	if o.socket != "" {
		return nil
	}
	dir, err := os.MkdirTemp("", "bench-sbx")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fake := filepath.Join(dir, "sbx")
	if out, err := exec.Command("go", "build", "-o", fake, "github.com/sandbox-sidecar/sandbox-sidecar/backend/sbx/sbxfake").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "   skipped: cannot build the fake sbx (run from the source tree): %v\n%s", err, out)
		return nil
	}
	kvm := filepath.Join(dir, "kvm")
	if err := os.WriteFile(kvm, nil, 0o666); err != nil {
		return err
	}
	n := 20
	if o.quick {
		n = 3
	}
	start := func(pool int) (*daemon, *ipc.Client, func(), error) {
		fakeState, err := os.MkdirTemp(dir, "fake")
		if err != nil {
			return nil, nil, nil, err
		}
		// The daemon passes sbx only PATH, HOME and sbx's own variables:
		// the fake finds its state through sbx's storage root, and its
		// delay in a file there.
		if err := os.WriteFile(filepath.Join(fakeState, "create-delay"), []byte(sbxCreateDelay.String()), 0o644); err != nil {
			return nil, nil, nil, err
		}
		d, err := startDaemonEnv(o, []string{"SANDBOXES_STORAGE_ROOT=" + fakeState},
			"--backend", "sbx", "--sbx-path", fake, "--sbx-kvm-device", kvm, "--sbx-host-policy", "deny-all", "--pool-size", fmt.Sprint(pool))
		if err != nil {
			return nil, nil, nil, err
		}
		c, err := d.client()
		if err != nil {
			d.stop()
			return nil, nil, nil, err
		}
		return d, c, func() { c.Close(); d.stop() }, nil
	}

	// Commands, interleaved with the host's own /bin/true spawned here.
	_, c, stop, err := start(0)
	if err != nil {
		return err
	}
	id, err := create(c, map[string]any{"ttl_s": 3600})
	if err != nil {
		stop()
		return err
	}
	var side, host []time.Duration
	for i := 0; i < 3*n+3; i++ {
		s := time.Now()
		if _, err := runCmd(c, id, []string{"/bin/true"}); err != nil {
			stop()
			return err
		}
		sd := time.Since(s)
		s = time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			stop()
			return err
		}
		if i >= 3 {
			side, host = append(side, sd), append(host, time.Since(s))
		}
	}
	stop()
	sp50, hp50 := percentile(side, 50), percentile(host, 50)
	rep.add("sbx", "run_command [/bin/true], sbx backend on its fake", map[string]float64{"p50_ms": ms(sp50), "p99_ms": ms(percentile(side, 99))},
		"a command is one sbx CLI process (the fake) and the command")
	rep.add("sbx", "host's own /bin/true, spawned by the bench (interleaved)", map[string]float64{"p50_ms": ms(hp50), "p99_ms": ms(percentile(host, 99)),
		"sidecar_over_host_p50": float64(sp50) / float64(hp50)}, "")

	for _, pool := range []int{0, 2} {
		_, c, stop, err := start(pool)
		if err != nil {
			return err
		}
		var creates, firsts []time.Duration
		for range n {
			if pool > 0 {
				waitPooledFor(c, 1, 10*sbxCreateDelay)
			}
			s := time.Now()
			id, err := create(c, nil)
			if err != nil {
				stop()
				return err
			}
			creates = append(creates, time.Since(s))
			if _, err := runCmd(c, id, []string{"/bin/true"}); err != nil {
				stop()
				return err
			}
			firsts = append(firsts, time.Since(s))
			call(c, ipc.OpDestroy, map[string]any{"sandbox": id}, nil)
		}
		stop()
		name := fmt.Sprintf("cold (no pool), fake create delay %s", sbxCreateDelay)
		if pool > 0 {
			name = fmt.Sprintf("warm pool of %d, fake create delay %s", pool, sbxCreateDelay)
		}
		rep.add("sbx", "create, "+name, map[string]float64{"p50_ms": ms(percentile(creates, 50)), "p99_ms": ms(percentile(creates, 99))}, "")
		rep.add("sbx", "create → first command result, "+name, map[string]float64{"p50_ms": ms(percentile(firsts, 50)), "p99_ms": ms(percentile(firsts, 99))}, "")
	}
	return nil
}
