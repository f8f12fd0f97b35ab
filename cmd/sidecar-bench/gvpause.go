package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

// --- gVisor pause and resume (a checkpoint) -------------------------------

// pandasHolder imports numpy and pandas, says so and waits: the sandbox a
// human-in-the-loop pause keeps (issue #36's numbers).
const pandasHolder = `import numpy, pandas, sys, time
df = pandas.DataFrame(numpy.arange(100000).reshape(-1, 10))
print("ready", int(df.values.sum()), flush=True)
while True:
    time.sleep(3600)
`

// benchGVisorPause measures the gvisor backend's pause (a runsc
// checkpoint, its sentry and gofer ended) and resume (a restore, then the
// first command's result) of a sandbox holding a Python process with
// numpy and pandas imported, and the memory the pause gives back (the RSS
// of the sandbox's runsc processes before it; none are left after). It
// drives the backend in this process, as the daemon does, with the
// daemon's binary as the sandboxes' init, so that the RSS read is the
// sandbox's alone; the socket and the journal add a few milliseconds
// (the pause scenario's bwrap rows).
func benchGVisorPause(o options, rep *report) error {
	runsc := findRunsc(o)
	if os.Geteuid() != 0 || runsc == "" || o.daemonBin == "" {
		fmt.Fprintln(os.Stderr, "   skipped: needs root, runsc and the daemon's binary (the sandboxes' init)")
		return nil
	}
	if err := exec.Command("/usr/bin/python3", "-c", "import numpy, pandas").Run(); err != nil {
		fmt.Fprintln(os.Stderr, "   skipped: the host's python3 has no numpy and pandas (apt-get install python3-numpy python3-pandas)")
		return nil
	}
	dir, err := os.MkdirTemp("", "sidecar-bench-gvpause-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	b, err := gvisor.New(gvisor.Config{Dir: filepath.Join(dir, "gvisor"), RunscPath: runsc, InitPath: o.daemonBin,
		Limits: limits.Limits{OpenFiles: 1024, FileSizeBytes: 1 << 30}})
	if err != nil {
		return err
	}
	ctx := context.Background()
	const id = "bench-pause"
	defer func() {
		_ = b.Destroy(ctx, id)
		_ = b.Close()
	}()
	if _, err := b.Create(ctx, id, backend.Spec{}); err != nil {
		return err
	}
	p, err := b.StartProcess(ctx, id, backend.ProcessRequest{Argv: []string{"python3", "-c", pandasHolder}})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		r, err := b.ReadOutput(ctx, id, p.ID, false, 0, 256, time.Second)
		if err != nil {
			return err
		}
		if strings.HasPrefix(string(r.Data), "ready") {
			break
		}
		if info, _ := b.WaitProcess(ctx, id, p.ID, 0); !info.Running || time.Now().After(deadline) {
			e, _ := b.ReadOutput(ctx, id, p.ID, true, 0, 4096, 0)
			return fmt.Errorf("python3 with numpy and pandas did not start (install python3-numpy python3-pandas): %s", e.Data)
		}
	}
	first := func() error {
		res, err := b.Exec(ctx, id, backend.ExecRequest{Argv: []string{"true"}, Timeout: time.Minute})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", res.ExitCode)
		}
		return err
	}
	if err := first(); err != nil {
		return err
	}
	n := 7
	if o.quick {
		n = 2
	}
	var pauses, resumes, resumed, boots []time.Duration
	var held, left, ckpt int64
	for range n {
		// A fresh sandbox's boot to its first command, interleaved: what
		// a resume costs against, on the same host at the same moment.
		start := time.Now()
		if _, err := b.Create(ctx, "bench-boot", backend.Spec{}); err != nil {
			return err
		}
		if res, err := b.Exec(ctx, "bench-boot", backend.ExecRequest{Argv: []string{"true"}, Timeout: time.Minute}); err != nil || res.ExitCode != 0 {
			return fmt.Errorf("a fresh sandbox's first command: %v, %+v", err, res)
		}
		boots = append(boots, time.Since(start))
		if err := b.Destroy(ctx, "bench-boot"); err != nil {
			return err
		}
		held = max(held, runscRSS(b, dir))
		start = time.Now()
		if _, err := b.Pause(ctx, id); err != nil {
			return err
		}
		pauses = append(pauses, time.Since(start))
		left = max(left, runscRSS(b, dir))
		ckpt = max(ckpt, dirBytes(filepath.Join(dir, "gvisor", id, "checkpoint")))
		time.Sleep(200 * time.Millisecond)
		start = time.Now()
		if err := b.Resume(ctx, id); err != nil {
			return err
		}
		resumed = append(resumed, time.Since(start))
		if err := first(); err != nil {
			return err
		}
		resumes = append(resumes, time.Since(start))
	}
	mib := func(n int64) float64 { return float64(n) / (1 << 20) }
	note := fmt.Sprintf("python3 with numpy+pandas imported; backend in process; n=%d", n)
	rep.add("gvpause", "gvisor pause (checkpoint, sentry ended)", map[string]float64{"p50_ms": ms(percentile(pauses, 50)), "max_ms": ms(percentile(pauses, 100))}, note, atMost("p50_ms", 1000))
	rep.add("gvpause", "gvisor resume → first command's result", map[string]float64{"p50_ms": ms(percentile(resumes, 50)), "max_ms": ms(percentile(resumes, 100)), "resumed_p50_ms": ms(percentile(resumed, 50))},
		"runsc restore, re-attach, `true`; resumed_p50_ms: Resume's return, before the command", atMost("p50_ms", 500))
	rep.add("gvpause", "gvisor create → first command's result, same run", map[string]float64{"p50_ms": ms(percentile(boots, 50)), "resume_ratio": float64(percentile(resumes, 50)) / float64(percentile(boots, 50))}, "a fresh boot, interleaved: the resume's yardstick")
	rep.add("gvpause", "gvisor pause: memory released", map[string]float64{"rss_before_mib": mib(held), "rss_after_mib": mib(left), "checkpoint_mib": mib(ckpt)},
		"RSS of the sandbox's runsc processes (sentry, gofer)", atMost("rss_after_mib", 0))
	return nil
}

// runscRSS is the resident memory of every process of b's runsc root.
func runscRSS(b *gvisor.Backend, dir string) int64 {
	root := "--root=" + filepath.Join(dir, "gvisor", ".runsc")
	var total int64
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), root+"\x00") {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(status)) {
			if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				total += kb << 10
			}
		}
	}
	return total
}

// dirBytes is the size of the regular files directly in dir.
func dirBytes(dir string) int64 {
	entries, _ := os.ReadDir(dir)
	var total int64
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			total += fi.Size()
		}
	}
	return total
}
