package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// --- Durable processes --------------------------------------------------

// benchProcesses measures durable processes against a command, in one run:
// from sending start_command to a read_output returning the first byte of
// a process that prints at once (in a sandbox keeping few ended records,
// and in one keeping as many as it may, processes.max_ended), and how long
// a follower waiting at the end of a stream (read_output with wait_s)
// takes to get a new byte; beside them, run_command [/bin/true] in the
// same sandboxes, interleaved.
func benchProcesses(o options, rep *report) error {
	_, c, stop, err := startWithClient(o)
	if err != nil {
		return err
	}
	defer stop()
	var hello api.HelloResult
	if err := call(c, ipc.OpHello, nil, &hello); err != nil {
		return err
	}
	if !slices.Contains(hello.Features, "processes") {
		fmt.Fprintln(os.Stderr, "   skipped: the daemon has no durable processes (hello's features)")
		return nil
	}
	n, followN := 100, 200
	if o.quick {
		n, followN = 8, 10
	}
	// A fresh sandbox every few starts keeps few records; the full one
	// keeps max_ended ended ones first, as a busy sandbox does.
	const freshEvery = 8
	var fresh, full, fullAnswer, freshAnswer, runs []time.Duration
	var id string
	for i := 0; i < n+2; i++ { // the first 2 warm up
		if i%freshEvery == 0 {
			if id != "" {
				call(c, ipc.OpDestroy, map[string]any{"sandbox": id}, nil)
			}
			if id, err = create(c, map[string]any{"ttl_s": 3600}); err != nil {
				return err
			}
			if _, err := runCmd(c, id, []string{"/bin/true"}); err != nil {
				return err
			}
		}
		answer, first, err := startToFirstByte(c, id)
		if err != nil {
			return err
		}
		start := time.Now()
		if _, err := runCmd(c, id, []string{"/bin/true"}); err != nil {
			return err
		}
		if i >= 2 {
			fresh, freshAnswer, runs = append(fresh, first), append(freshAnswer, answer), append(runs, time.Since(start))
		}
	}
	call(c, ipc.OpDestroy, map[string]any{"sandbox": id}, nil)

	busy, err := create(c, map[string]any{"ttl_s": 3600})
	if err != nil {
		return err
	}
	const maxEnded = 64 // processes.max_ended's default, which the daemon runs with
	for range maxEnded {
		if _, _, err := startToFirstByte(c, busy); err != nil {
			return err
		}
	}
	for i := 0; i < n; i++ {
		answer, first, err := startToFirstByte(c, busy)
		if err != nil {
			return err
		}
		start := time.Now()
		if _, err := runCmd(c, busy, []string{"/bin/true"}); err != nil {
			return err
		}
		full, fullAnswer, runs = append(full, first), append(fullAnswer, answer), append(runs, time.Since(start))
	}
	var list api.ListProcessesResult
	if err := call(c, ipc.OpListProcesses, map[string]any{"sandbox": busy}, &list); err != nil {
		return err
	}

	delays, err := followDelays(c, busy, followN)
	if err != nil {
		return err
	}
	rp50 := percentile(runs, 50)
	row := func(name string, d, answers []time.Duration, note string) {
		p50 := percentile(d, 50)
		rep.add("processes", name, map[string]float64{"p50_ms": ms(p50), "p99_ms": ms(percentile(d, 99)),
			"answer_p50_ms": ms(percentile(answers, 50)), "p50_over_run_command": float64(p50) / float64(rp50)}, note)
	}
	rep.add("processes", "run_command [/bin/true], interleaved with the rows below", map[string]float64{"p50_ms": ms(rp50), "p99_ms": ms(percentile(runs, 99)), "n": float64(len(runs))}, "")
	row(fmt.Sprintf("start_command → first byte readable, < %d records kept", freshEvery), fresh, freshAnswer,
		"echo; until a read_output (wait_s) returns its line; answer: start_command's own answer")
	row(fmt.Sprintf("start_command → first byte readable, %d records kept", len(list.Processes)), full, fullAnswer,
		"as above, in a sandbox keeping as many ended records as it may (processes.max_ended)")
	dp50 := percentile(delays, 50)
	rep.add("processes", "read_output wait_s: a new byte to the waiting follower", map[string]float64{
		"p50_ms": ms(dp50), "p99_ms": ms(percentile(delays, 99)), "n": float64(len(delays)),
		"p50_over_run_command": float64(dp50) / float64(rp50)},
		"the process writes its clock every 50 ms; the follower's clock when its read returns, less it")
	return nil
}

// startToFirstByte starts a process that prints a line at once in
// sandbox id, and reads its stdout until the line is there: it returns
// how long start_command took to answer, and how long until the first
// byte was read.
func startToFirstByte(c *ipc.Client, id string) (answer, first time.Duration, err error) {
	ctx, cancel := callCtx()
	defer cancel()
	begin := time.Now()
	p, err := c.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Argv: []string{"/bin/echo", "first"}})
	if err != nil {
		return 0, 0, err
	}
	answer = time.Since(begin)
	for ended := 0; ; {
		r, err := c.ReadOutput(ctx, api.ReadOutputRequest{Sandbox: id, Process: p.Process, Stream: "stdout", WaitS: 10})
		if err != nil {
			return 0, 0, err
		}
		if len(r.Data) > 0 {
			return answer, time.Since(begin), nil
		}
		// A read may say the process ended and return nothing while its
		// line is there: it read the log before the process wrote, and
		// the process's state after it ended. Read again, once.
		if !r.Running {
			if ended++; ended > 1 {
				return 0, 0, fmt.Errorf("echo ended (%s) without output", r.Reason)
			}
		}
	}
}

// followerScript writes the time (ns since the epoch) on a line every
// 50 ms, written the moment it is read.
const followerScript = `import sys, time
while True:
    time.sleep(0.05)
    sys.stdout.write("%d\n" % time.time_ns())
    sys.stdout.flush()
`

// followDelays follows a process that writes its clock every 50 ms, from
// the end of its stream, and returns n delays from a line's writing to
// the follower's read returning it. Only reads that were waiting when the
// line was written, and returned that line alone, count.
func followDelays(c *ipc.Client, id string, n int) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p, err := c.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Argv: []string{"/usr/bin/python3", "-c", followerScript}})
	if err != nil {
		return nil, err
	}
	defer c.SignalProcess(context.Background(), api.SignalProcessRequest{Sandbox: id, Process: p.Process, Signal: "KILL"})
	var out []time.Duration
	offset := int64(0)
	for tries := 0; len(out) < n; tries++ {
		if tries > 4*n+20 {
			return nil, fmt.Errorf("%d reads made only %d clean samples", tries, len(out))
		}
		asked := time.Now()
		r, err := c.ReadOutput(ctx, api.ReadOutputRequest{Sandbox: id, Process: p.Process, Stream: "stdout", Offset: offset, WaitS: 5})
		got := time.Now()
		if err != nil {
			return nil, err
		}
		if !r.Running {
			return nil, fmt.Errorf("the follower's process ended (%s)", r.Reason)
		}
		offset = r.NextOffset
		lines := strings.Split(strings.TrimSuffix(string(r.Data), "\n"), "\n")
		if r.Dropped > 0 || len(lines) != 1 || !strings.HasSuffix(string(r.Data), "\n") {
			continue // behind, or a line cut: not a waiting follower's read
		}
		ns, err := strconv.ParseInt(lines[0], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("the follower read %q", r.Data)
		}
		if written := time.Unix(0, ns); written.After(asked) {
			out = append(out, got.Sub(written))
		}
	}
	return out, nil
}
