package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// --- Code contexts --------------------------------------------------------

// pandasCell is what the pandas rows run, as a cell and as python3 -c.
const pandasCell = `import pandas as pd; pd.DataFrame({"a": [1, 2], "b": [3, 4]}).shape`

// benchCode measures code contexts against the commands they replace, per
// backend (bwrap, and gvisor where runsc is), in one run, interleaved in
// the same sandbox: a fresh context's first cell (`1+1`, a fork of the
// zygote) against `python3 -c 1`; a follow-up cell against run_command
// /bin/true; where an image has pandas (o.codeImage, else the host's
// python3 if it has it), a fresh context's first cell that uses pandas,
// preloaded, against `python3 -c` of the same, and a warm-pool member's
// first cell; and on bwrap what the zygote and one more context cost in
// memory (read from the host: RSS, PSS, and a context's private pages,
// USS; gVisor's sentry holds its guests' memory, which the host does not
// see per process).
func benchCode(o options, rep *report) error {
	image, err := pandasImage(o)
	if err != nil {
		return err
	}
	backends := []codeBackend{{name: "bwrap", pandasTarget: 15}}
	if o.socket != "" {
		backends[0].name = "" // the daemon's own backend
	} else if runsc := findRunsc(o); runsc != "" {
		backends = append(backends, codeBackend{name: "gvisor", flags: []string{"--backend", "gvisor", "--gvisor-runsc-path", runsc}, pandasTarget: 40})
	} else {
		fmt.Fprintln(os.Stderr, "   gvisor skipped: no runsc")
	}
	for _, be := range backends {
		if err := codeRun(o, rep, image, be); err != nil {
			return fmt.Errorf("%s: %w", be.name, err)
		}
	}
	return nil
}

// codeBackend is one backend the code rows run on: its daemon's flags,
// and the target of a fresh context's first pandas cell there (issue 35:
// 15 ms on bwrap, 40 ms on gVisor).
type codeBackend struct {
	name         string
	flags        []string
	pandasTarget float64
}

// label is row name as this backend's.
func (be codeBackend) label(row string) string {
	if be.name == "" {
		return row
	}
	return row + ", " + be.name
}

// usage drops a row's context_cpu and context_minflt on gVisor, where
// getrusage inside the sentry does not say what the context alone spent
// (it reported no page faults, and the same CPU time for a bare context
// as for one that imported pandas).
func (be codeBackend) usage(values map[string]float64) map[string]float64 {
	if be.name == "gvisor" {
		delete(values, "context_cpu_p50_ms")
		delete(values, "context_minflt_p50")
	}
	return values
}

func codeRun(o options, rep *report, image string, be codeBackend) error {
	dir, err := os.MkdirTemp("", "sidecar-bench-code")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	config := filepath.Join(dir, "config.toml")
	preload := ""
	if image != "" {
		preload = fmt.Sprintf("[code]\nimage_preload = { %s = [\"numpy\", \"pandas\"] }\n", imageName(image))
	}
	if err := os.WriteFile(config, []byte(preload), 0o644); err != nil {
		return err
	}
	d, c, stop, err := startWithClient(o, append([]string{"--config", config}, be.flags...)...)
	if err != nil {
		return err
	}
	defer stop()
	var hello api.HelloResult
	if err := call(c, ipc.OpHello, nil, &hello); err != nil {
		return err
	}
	if !slices.Contains(hello.Features, "code") {
		fmt.Fprintln(os.Stderr, "   skipped: the daemon has no code contexts (hello's features)")
		return nil
	}
	n := 40
	if o.quick {
		n = 4
	}

	// A sandbox of the host image, no preloads: a bare zygote.
	id, err := create(c, map[string]any{"ttl_s": 3600})
	if err != nil {
		return err
	}
	if _, err := runCell(c, id, "warm", "1"); err != nil { // the zygote's start is not measured
		return err
	}
	var fresh, python, follow, trues, cpu []time.Duration
	var faults []float64
	for i := 0; i < n+2; i++ { // the first 2 warm up
		name := fmt.Sprintf("c%d", i)
		a, err := timed(func() error { _, err := runCell(c, id, name, "1+1"); return err })
		if err != nil {
			return err
		}
		u, fl, err := usage(c, id, name)
		if err != nil {
			return err
		}
		if i >= 2 {
			cpu, faults = append(cpu, u), append(faults, fl)
		}
		if err := deleteContext(c, id, name); err != nil {
			return err
		}
		b, err := timed(func() error { _, err := runCmd(c, id, []string{"python3", "-c", "1"}); return err })
		if err != nil {
			return err
		}
		f, err := timed(func() error { _, err := runCell(c, id, "warm", "x = 1; x + 1"); return err })
		if err != nil {
			return err
		}
		t, err := timed(func() error { _, err := runCmd(c, id, []string{"/bin/true"}); return err })
		if err != nil {
			return err
		}
		if i >= 2 {
			fresh, python, follow, trues = append(fresh, a), append(python, b), append(follow, f), append(trues, t)
		}
	}
	pp, tp := percentile(python, 50), percentile(trues, 50)
	rep.add("code", be.label("run_command [python3 -c 1], interleaved"), map[string]float64{"p50_ms": ms(pp), "p99_ms": ms(percentile(python, 99)), "n": float64(len(python))}, "a new interpreter in the same sandbox")
	fp := percentile(fresh, 50)
	rep.add("code", be.label("run_code `1+1` in a fresh context (its first cell)"), be.usage(map[string]float64{"p50_ms": ms(fp), "p99_ms": ms(percentile(fresh, 99)),
		"p50_over_python3_c": float64(fp) / float64(pp), "context_cpu_p50_ms": ms(percentile(cpu, 50)), "context_minflt_p50": medianOf(faults)}),
		"a fork of the zygote (no preloads); context_cpu: the fork's own CPU time to its cell's end; the context deleted after")
	rep.add("code", be.label("run_command [/bin/true], interleaved"), map[string]float64{"p50_ms": ms(tp), "p99_ms": ms(percentile(trues, 99)), "n": float64(len(trues))}, "")
	up := percentile(follow, 50)
	rep.add("code", be.label("run_code `x = 1; x + 1`, a follow-up cell"), map[string]float64{"p50_ms": ms(up), "p99_ms": ms(percentile(follow, 99)),
		"p50_over_run_command": float64(up) / float64(tp), "p50_minus_run_command_ms": ms(up - tp)}, "in a context that ran cells before",
		atMost("p50_minus_run_command_ms", 1))
	if be.name == "gvisor" {
		fmt.Fprintln(os.Stderr, "   memory rows skipped: gVisor's sentry holds its guests' memory, which the host does not see per process")
	} else if bare, err := runtimeMemory(c, id, "warm"); err != nil {
		fmt.Fprintf(os.Stderr, "   memory rows skipped: %v\n", err)
	} else {
		rep.add("code", be.label("memory: the zygote, no preloads"), map[string]float64{"rss_mib": mib(bare.zygote.rss), "pss_mib": mib(bare.zygote.pss)}, "python3 and the runtime (pyrt), read from the host's smaps_rollup")
		rep.add("code", be.label("memory: one more context, after `x + 1`"), map[string]float64{"uss_mib": mib(bare.context.uss), "pss_mib": mib(bare.context.pss), "rss_mib": mib(bare.context.rss)},
			"uss: the pages it alone holds, what one more context costs")
	}
	if o.socket != "" {
		fmt.Fprintln(os.Stderr, "   pandas and pool rows skipped: they need a daemon of the benchmark's own")
		return nil
	}
	if image == "" {
		fmt.Fprintln(os.Stderr, "   pandas rows skipped: the host's python3 has no pandas; give --code-image (e.g. test/sandboximage's rootfs tarball, cached under /var/cache/sandbox-sidecar-test)")
		return nil
	}
	// Each python3 -c of the pandas rows imports pandas: seconds of CPU.
	return benchPandas(o, rep, be, d, c, image, min(n, 12))
}

// benchPandas measures the pandas rows on image (or the host's, "host").
func benchPandas(o options, rep *report, be codeBackend, d *daemon, c *ipc.Client, image string, n int) error {
	name := imageName(image)
	if name != "host" {
		begin := time.Now()
		cmd := exec.Command(o.daemonBin, "image", "import", image, "--name", name)
		cmd.Env = append(os.Environ(), "SANDBOX_SIDECAR_SOCKET="+d.socket)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("image import %s: %v: %s", image, err, out)
		}
		fmt.Fprintf(os.Stderr, "   imported %s as %q in %s\n", image, name, time.Since(begin).Round(time.Millisecond))
	}
	id, err := create(c, map[string]any{"ttl_s": 3600, "image": name})
	if err != nil {
		return err
	}
	begin := time.Now()
	if _, err := runCell(c, id, "warm", "1"); err != nil {
		return err
	}
	zygoteStart := time.Since(begin)
	var fresh, python, cpu []time.Duration
	var faults []float64
	for i := 0; i < n+2; i++ {
		ctx := fmt.Sprintf("p%d", i)
		a, err := timed(func() error { _, err := runCell(c, id, ctx, pandasCell); return err })
		if err != nil {
			return err
		}
		// What the context itself spent (its CPU time and page faults
		// since the fork, this reading's own cell included): the part of
		// the first cell that the host's load does not inflate.
		u, f, err := usage(c, id, ctx)
		if err != nil {
			return err
		}
		if i >= 2 {
			cpu, faults = append(cpu, u), append(faults, f)
		}
		if err := deleteContext(c, id, ctx); err != nil {
			return err
		}
		b, err := timed(func() error { _, err := runCmd(c, id, []string{"python3", "-c", pandasCell}); return err })
		if err != nil {
			return err
		}
		if i >= 2 {
			fresh, python = append(fresh, a), append(python, b)
		}
	}
	pp := percentile(python, 50)
	rep.add("code", be.label("run_command [python3 -c 'import pandas; DataFrame']"), map[string]float64{"p50_ms": ms(pp), "p99_ms": ms(percentile(python, 99)), "n": float64(len(python))},
		"image "+name+"; the import paid by each new interpreter")
	fp := percentile(fresh, 50)
	rep.add("code", be.label("run_code of the same in a fresh context, pandas preloaded"), be.usage(map[string]float64{"p50_ms": ms(fp), "p99_ms": ms(percentile(fresh, 99)),
		"p50_over_python3_c": float64(fp) / float64(pp), "context_cpu_p50_ms": ms(percentile(cpu, 50)), "context_minflt_p50": medianOf(faults)}),
		fmt.Sprintf("a fork of a zygote that imported numpy and pandas (its start, once: %s); context_cpu: the fork's own CPU time to its cell's end", zygoteStart.Round(time.Millisecond)),
		atMost("p50_ms", be.pandasTarget))

	if be.name != "gvisor" {
		// Four contexts that used pandas, alive at once: what each costs (on
		// bwrap, whose guests' pages the host sees, as above).
		for i := range 4 {
			if _, err := runCell(c, id, fmt.Sprintf("m%d", i), pandasCell+"\ndf = pd.DataFrame({'x': range(1000)})"); err != nil {
				return err
			}
		}
		if mem, err := runtimeMemory(c, id, "m0"); err != nil {
			fmt.Fprintf(os.Stderr, "   memory rows skipped: %v\n", err)
		} else {
			rep.add("code", be.label("memory: the zygote, numpy and pandas preloaded"), map[string]float64{"rss_mib": mib(mem.zygote.rss), "pss_mib": mib(mem.zygote.pss)},
				"what a warm-pool member's zygote costs, started ahead by Warm")
			rep.add("code", be.label("memory: one more context, after a pandas cell"), map[string]float64{"uss_mib": mib(mem.context.uss), "pss_mib": mib(mem.context.pss), "rss_mib": mib(mem.context.rss)},
				fmt.Sprintf("one of %d live contexts (the spare, forked ahead, among them); its rss is mostly the zygote's shared pages", mem.contexts))
		}
	}

	// A new sandbox's first cell (no pool): the zygote's start and its
	// imports, then the fork.
	rounds := 8
	if o.quick {
		rounds = 2
	}
	var cold []time.Duration
	for range rounds {
		sb, err := create(c, map[string]any{"image": name})
		if err != nil {
			return err
		}
		t, err := timed(func() error { _, err := runCell(c, sb, "default", pandasCell); return err })
		if err != nil {
			return err
		}
		cold = append(cold, t)
		call(c, ipc.OpDestroy, map[string]any{"sandbox": sb}, nil)
	}
	cp := percentile(cold, 50)
	rep.add("code", be.label("run_code of the same, a new sandbox's first cell"), map[string]float64{"p50_ms": ms(cp), "p99_ms": ms(percentile(cold, 99)), "n": float64(len(cold))},
		"no pool: the first cell starts the zygote, which imports numpy and pandas, then forks")

	// A warm-pool member's first cell: its zygote was started by Warm.
	// The same daemon, restarted with a pool of the image (a pool's
	// image must be there when the daemon starts).
	c.Close()
	if err := d.restartWith("--pool-size", "0", "--image-pool", name+"=1"); err != nil {
		return err
	}
	pc, err := d.client()
	if err != nil {
		return err
	}
	defer pc.Close()
	var first []time.Duration
	for range rounds {
		if !waitPooledFor(pc, 1, 3*time.Minute) {
			return fmt.Errorf("the pool of %s did not fill within 3 minutes", name)
		}
		time.Sleep(500 * time.Millisecond) // the member's Warm is done when it counts as pooled; let the host settle
		sb, err := create(pc, map[string]any{"image": name})
		if err != nil {
			return err
		}
		t, err := timed(func() error { _, err := runCell(pc, sb, "default", pandasCell); return err })
		if err != nil {
			return err
		}
		first = append(first, t)
		call(pc, ipc.OpDestroy, map[string]any{"sandbox": sb}, nil)
	}
	pf := percentile(first, 50)
	rep.add("code", be.label("run_code of the same, a pool member's first cell"), map[string]float64{"p50_ms": ms(pf), "p99_ms": ms(percentile(first, 99)), "n": float64(len(first)),
		"p50_over_fresh_context": float64(pf) / float64(fp), "p50_over_new_sandbox": float64(pf) / float64(cp)},
		"a pool of 1, run as soon as claimed (the refill, whose zygote imports pandas, runs meanwhile); Warm started the member's zygote")
	return nil
}

// pandasImage is the image the pandas rows run on: o.codeImage, or
// "host" when the host's python3 imports pandas, or "" for none.
func pandasImage(o options) (string, error) {
	if o.codeImage != "" {
		p, err := filepath.Abs(o.codeImage)
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("--code-image: %w", err)
		}
		return p, nil
	}
	if exec.Command("/usr/bin/python3", "-c", "import pandas").Run() == nil {
		return "host", nil
	}
	return "", nil
}

func imageName(image string) string {
	if image == "host" {
		return "host"
	}
	return "pandas"
}

// usage runs contextUsage in context name and returns what it said.
func usage(c *ipc.Client, id, name string) (cpu time.Duration, minflt float64, err error) {
	used, err := runCell(c, id, name, contextUsage)
	if err != nil {
		return 0, 0, err
	}
	if len(used.Results) != 1 {
		return 0, 0, fmt.Errorf("the usage cell returned %d results", len(used.Results))
	}
	var secs float64
	if _, err := fmt.Sscanf(fmt.Sprint(used.Results[0]["text/plain"]), "(%g, %g)", &secs, &minflt); err != nil {
		return 0, 0, fmt.Errorf("the usage cell said %v: %w", used.Results[0]["text/plain"], err)
	}
	return time.Duration(secs * float64(time.Second)), minflt, nil
}

// contextUsage is a cell that says what its context has used since its
// fork: CPU seconds and minor page faults.
const contextUsage = "import resource\nr = resource.getrusage(resource.RUSAGE_SELF)\n(r.ru_utime + r.ru_stime, r.ru_minflt)"

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func timed(f func() error) (time.Duration, error) {
	begin := time.Now()
	err := f()
	return time.Since(begin), err
}

func runCell(c *ipc.Client, id, context, code string) (api.RunCodeResult, error) {
	ctx, cancel := callCtx()
	defer cancel()
	res, err := c.RunCode(ctx, api.RunCodeRequest{Sandbox: id, Context: context, Code: code, TimeoutS: 120})
	if err == nil && (res.Error != nil || res.ContextLost) {
		err = fmt.Errorf("the cell %q: %s (error %+v)", code, res.Reason, res.Error)
	}
	return res, err
}

func deleteContext(c *ipc.Client, id, name string) error {
	ctx, cancel := callCtx()
	defer cancel()
	return c.DeleteContext(ctx, api.ContextRequest{Sandbox: id, Context: name})
}

// procMemory is one process's memory, from its smaps_rollup.
type procMemory struct{ rss, pss, uss int64 }

type runtimeMem struct {
	zygote, context procMemory
	contexts        int // the zygote's live forks
}

// runtimeMemory reads, from the host, the memory of sandbox id's zygote
// and of context name: the context names its pid namespace and its and
// its parent's pids in it, and the host's /proc finds them.
func runtimeMemory(c *ipc.Client, id, name string) (runtimeMem, error) {
	res, err := runCell(c, id, name, "import os\n'%s %d %d' % (os.readlink('/proc/self/ns/pid'), os.getpid(), os.getppid())")
	if err != nil {
		return runtimeMem{}, err
	}
	if len(res.Results) == 0 {
		return runtimeMem{}, fmt.Errorf("the context did not say its pids")
	}
	f := strings.Fields(strings.Trim(fmt.Sprint(res.Results[0]["text/plain"]), "'"))
	if len(f) != 3 {
		return runtimeMem{}, fmt.Errorf("the context said %q", res.Results[0]["text/plain"])
	}
	var out runtimeMem
	entries, _ := os.ReadDir("/proc")
	found := 0
	for _, e := range entries {
		hostPid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", hostPid)); err != nil || ns != f[0] {
			continue
		}
		nspid := lastNSpid(hostPid)
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", hostPid))
		isRuntime := strings.HasPrefix(string(cmd), "python3\x00/proc/self/fd/4")
		switch {
		case nspid == f[1]:
			out.context, found = smapsRollup(hostPid), found+1
		case nspid == f[2]:
			out.zygote, found = smapsRollup(hostPid), found+1
		}
		if isRuntime && nspid != f[2] {
			out.contexts++
		}
	}
	if found != 2 {
		return out, fmt.Errorf("found %d of the context and its zygote in the host's /proc (run as root)", found)
	}
	return out, nil
}

// lastNSpid is a process's pid in its innermost pid namespace.
func lastNSpid(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				return f[len(f)-1]
			}
		}
	}
	return ""
}

func smapsRollup(pid int) procMemory {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return procMemory{}
	}
	var m procMemory
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "Rss:":
			m.rss = kb << 10
		case "Pss:":
			m.pss = kb << 10
		case "Private_Clean:", "Private_Dirty:":
			m.uss += kb << 10
		}
	}
	return m
}

func mib(b int64) float64 { return float64(b*10>>20) / 10 }

// restartWith stops d (its sandboxes and state kept) and starts it again
// with extra added to its arguments.
func (d *daemon) restartWith(extra ...string) error {
	if d.cmd == nil {
		return fmt.Errorf("not a daemon of the benchmark's")
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(2 * time.Minute):
		d.cmd.Process.Kill()
		<-d.done
	}
	d.args = append(d.args, extra...)
	_, err := d.start()
	return err
}
