package main

import (
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// --- Paused sandboxes -----------------------------------------------------

// pauseLoop is the durable process of the paused sandbox: a shell that
// forks all the time, the freezer's hard case on cgroup v1 (a vfork
// parent caught between its fork and its wait is never counted frozen,
// and the freeze is thawed and asked again).
const pauseLoop = `while :; do /bin/true; done`

// benchPause measures, on bwrap, a pause and a resume through the daemon
// of a sandbox whose durable process forks in a loop (issue #36's
// targets: ≤ 20 ms each), the first pause of a daemon (on cgroup v1 it
// also makes the freezer's anchor, and turns the kernel's freezer branch
// on), and a command on the paused sandbox (which resumes it first)
// beside the same command on it running, interleaved.
func benchPause(o options, rep *report) error {
	_, c, stop, err := startWithClient(o)
	if err != nil {
		return err
	}
	defer stop()
	var hello api.HelloResult
	if err := call(c, ipc.OpHello, nil, &hello); err != nil {
		return err
	}
	if !slices.Contains(hello.Features, "pause") {
		fmt.Fprintln(os.Stderr, "   skipped: the daemon cannot pause (hello's features: bwrap needs sandbox cgroups, so root)")
		return nil
	}
	id, err := create(c, map[string]any{"ttl_s": 3600})
	if err != nil {
		return err
	}
	// Destroyed at the end, so the daemon's stop leaves no cgroup behind
	// (the bench removes its state directory).
	defer call(c, ipc.OpDestroy, map[string]any{"sandbox": id}, nil)
	if err := call(c, ipc.OpStartCommand, map[string]any{"sandbox": id, "command": pauseLoop}, nil); err != nil {
		return err
	}
	n := 40
	if o.quick {
		n = 3
	}
	pause := func() (time.Duration, error) {
		start := time.Now()
		var res api.PauseResult
		if err := call(c, ipc.OpPause, map[string]any{"sandbox": id}, &res); err != nil {
			return 0, err
		}
		if res.State != "paused" {
			return 0, fmt.Errorf("pause answered state %q", res.State)
		}
		return time.Since(start), nil
	}
	first, err := pause()
	if err != nil {
		return err
	}
	var pauses, resumes, onPaused, running []time.Duration
	for i := 0; i < n+1; i++ {
		if i > 0 {
			p, err := pause()
			if err != nil {
				return err
			}
			pauses = append(pauses, p)
		}
		time.Sleep(20 * time.Millisecond) // paused a moment, as a sandbox waits
		start := time.Now()
		var res api.PauseResult
		if err := call(c, ipc.OpResume, map[string]any{"sandbox": id}, &res); err != nil {
			return err
		}
		if res.State != "ready" {
			return fmt.Errorf("resume answered state %q", res.State)
		}
		if i > 0 {
			resumes = append(resumes, time.Since(start))
		}

		// A command on it running, and on it paused (resumed first), in
		// turn.
		start = time.Now()
		if _, err := runCmd(c, id, []string{"/bin/true"}); err != nil {
			return err
		}
		r := time.Since(start)
		if _, err := pause(); err != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond)
		start = time.Now()
		if _, err := runCmd(c, id, []string{"/bin/true"}); err != nil {
			return err
		}
		if i > 0 {
			running, onPaused = append(running, r), append(onPaused, time.Since(start))
		}
	}
	const note = "a sandbox whose durable process is a shell forking `/bin/true` in a loop (the v1 freezer's hard case)"
	rep.add("pause", "pause, bwrap", map[string]float64{
		"p50_ms": ms(percentile(pauses, 50)), "p90_ms": ms(percentile(pauses, 90)), "max_ms": ms(percentile(pauses, 100))},
		note+": its cgroup frozen, every process stopped, the journal written", atMost("p50_ms", 20))
	rep.add("pause", "resume, bwrap", map[string]float64{
		"p50_ms": ms(percentile(resumes, 50)), "p90_ms": ms(percentile(resumes, 90)), "max_ms": ms(percentile(resumes, 100))},
		"the same sandbox: its cgroup thawed, the journal written", atMost("p50_ms", 20))
	rep.add("pause", "first pause of a daemon, bwrap", map[string]float64{"ms": ms(first)},
		"cgroup v1: also makes the freezer's anchor group (the kernel's freezer branch turned on); one sample")
	p50, r50 := percentile(onPaused, 50), percentile(running, 50)
	rep.add("pause", "run_command /bin/true on the paused sandbox → result", map[string]float64{
		"p50_ms": ms(p50), "p50_over_running": float64(p50) / float64(r50)}, "resumed first, then the command")
	rep.add("pause", "run_command /bin/true on it running", map[string]float64{"p50_ms": ms(r50)},
		"the baseline, interleaved with the row above")
	return nil
}
