package gvisor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/registry"
	"github.com/sandbox-sidecar/sandbox-sidecar/capture"
)

// baseEnv is every command's environment before the sandbox's and the
// request's.
var baseEnv = map[string]string{"PATH": guestPath, "HOME": guestWorkspace, "LANG": "C.UTF-8"}

// Exec runs one command in the sandbox and returns its bounded output.
//
// The command runs as uid 1000 in /workspace (or req.Cwd), exec'd by the
// sandbox's init, which keeps req.Timeout (rounded up to whole
// milliseconds) and KillGrace itself; if it outlives that by
// ExecGrace the daemon has init kill it, and if init does not answer
// within killAnswer the sandbox is stopped and the command reported
// SandboxTerminated. Its environment is PATH, HOME, LANG, then the
// sandbox's Env, then req.Env. Commands of one sandbox run one at a time;
// a second waits for the first (the daemon allows one per sandbox).
//
// A command stopped because Destroy ran, or because the sandbox died,
// returns SandboxTerminated and no error; the next Exec after a death
// returns an error wrapping backend.ErrNotFound. One stopped because ctx
// ended returns the partial result and an error wrapping ctx.Err().
func (b *Backend) Exec(ctx context.Context, id string, req backend.ExecRequest) (backend.ExecResult, error) {
	sb, err := b.lookup(id)
	if err != nil {
		return backend.ExecResult{}, err
	}
	if _, _, err := backend.CheckExecRequest(req, guestWorkspace); err != nil {
		return backend.ExecResult{}, err
	}
	opCtx, done, err := sb.ops.Begin(ctx)
	if err != nil {
		return backend.ExecResult{}, err
	}
	defer done()
	return b.execIn(ctx, opCtx, sb, req)
}

// execIn runs req in sb through its init (booting it if needed).
func (b *Backend) execIn(ctx, opCtx context.Context, sb *sandbox, req backend.ExecRequest) (backend.ExecResult, error) {
	argv, cwd, err := backend.CheckExecRequest(req, guestWorkspace)
	if err != nil {
		return backend.ExecResult{}, err
	}
	if len(req.Stdin) > gvwire.MaxStdinBytes {
		return backend.ExecResult{}, fmt.Errorf("%w: stdin is %d bytes, more than the %d a command may get; write it to a file with write_file instead", backend.ErrInvalidArgument, len(req.Stdin), gvwire.MaxStdinBytes)
	}
	if req.Command != "" && sb.image != nil && !sb.image.Shell {
		return backend.ExecResult{}, fmt.Errorf("%w: sandbox %s runs on image %s, which has no %s to run a command string; give the command as an argv", backend.ErrNoShell, sb.id, backend.ShortName(sb.image.Name), backend.ShellPath)
	}
	env, err := backend.MergeEnv(sb.baseEnvOf(), sb.env, req.Env)
	if err != nil {
		return backend.ExecResult{}, err
	}
	applied := backend.GuestTimeout(req.Timeout)
	terminated := backend.ExecResult{ExitCode: backend.ExitKilled, SandboxTerminated: true, AppliedTimeout: applied}
	log := b.log.With("sandbox", sb.id)

	c, err := b.acquireInit(opCtx, sb)
	switch {
	case err == nil:
	case errors.Is(err, errInitDied), registry.Destroyed(opCtx):
		log.Info("command not run: the sandbox is terminated", "reason", err)
		return terminated, nil
	case ctx.Err() != nil:
		return backend.ExecResult{AppliedTimeout: applied}, fmt.Errorf("command in sandbox %s was not run because the request ended: %w", sb.id, ctx.Err())
	default:
		return backend.ExecResult{}, err
	}
	defer sb.releaseInit()
	c.warm = true

	maxOut := req.MaxOutputBytes
	if maxOut <= 0 {
		maxOut = capture.DefaultMaxOutputBytes
	}
	cmd := &command{stdout: capture.NewTail(maxOut), stderr: capture.NewTail(maxOut), output: req.Output, end: make(chan frameEnd, 1)}
	c.mu.Lock()
	c.cur = cmd
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.cur == cmd {
			c.cur = nil
		}
		c.mu.Unlock()
	}()

	start := time.Now()
	oomBefore := sb.oomKills()
	result := func(code int) backend.ExecResult {
		return backend.ExecResult{
			ExitCode: code, Stdout: cmd.stdout.Bytes(), Stderr: cmd.stderr.Bytes(),
			StdoutTruncated: cmd.stdout.Truncated(), StderrTruncated: cmd.stderr.Truncated(),
			AppliedTimeout: applied, Duration: time.Since(start),
		}
	}
	run := gvwire.RunRequest{Argv: argv, Env: env, Cwd: cwd, Stdin: req.Stdin, Timeout: applied, KillAfter: backend.GuestTimeout(b.cfg.KillGrace)}
	if err := c.send(gvwire.KindRun, run.Encode()); err != nil {
		b.terminate(sb, c, fmt.Sprintf("cannot hand its init a command: %v", err))
		res := result(backend.ExitKilled)
		res.SandboxTerminated = true
		return res, nil
	}

	outer := time.NewTimer(applied + b.cfg.KillGrace + b.cfg.ExecGrace)
	defer outer.Stop()
	var killBy <-chan time.Time
	outerFired, cancelled := false, false
	opDone := opCtx.Done()
	askKill := func() {
		if killBy == nil {
			_ = c.send(gvwire.KindKill, nil)
			killBy = time.After(killAnswer)
		}
	}
	for {
		select {
		case e := <-cmd.end:
			res := result(e.exitCode)
			if e.failed != "" {
				return res, nil // init wrote why to the command's stderr
			}
			switch {
			case cancelled && registry.Destroyed(opCtx):
				res.SandboxTerminated = true
				return res, nil
			case cancelled:
				return res, fmt.Errorf("command in sandbox %s was killed because the request ended: %w", sb.id, ctx.Err())
			}
			b.classify(sb, &res, outerFired, e.timedOut, oomBefore)
			if res.OOMKills > 0 {
				log.Info("the sandbox reached its memory limit during the command", "oom_kills", res.OOMKills, "oom_killed", res.OOMKilled, "memory_bytes", sb.limits.MemoryBytes)
			}
			if outerFired {
				log.Warn("the command outlived its timeout and was killed", "timeout", applied, "duration", res.Duration)
			}
			log.Debug("command finished", "exit_code", res.ExitCode, "timed_out", res.TimedOut, "duration", res.Duration)
			return res, nil
		case <-c.dead:
			res := result(backend.ExitKilled)
			res.SandboxTerminated = true
			// The host's OOM killer can only kill the sentry or gofer:
			// a sandbox past its memory limit dies whole.
			if after := sb.oomKills(); after > oomBefore {
				res.OOMKills, res.OOMKilled = after-oomBefore, true
			}
			destroyed := registry.Destroyed(opCtx)
			if !destroyed {
				b.terminate(sb, c, fmt.Sprintf("its gVisor sandbox died during a command (%v)", c.deadErr))
			}
			log.Info("command ended with its sandbox", "destroyed", destroyed, "duration", res.Duration)
			return res, nil
		case <-opDone:
			if !cancelled {
				cancelled = true
				if registry.Destroyed(opCtx) {
					// Destroy stops the sandbox; wait (boundedly) to see it go.
					killBy = time.After(killAnswer)
				} else {
					askKill()
				}
			}
			opDone = nil // seen
		case <-outer.C:
			outerFired = true
			askKill()
		case <-killBy:
			b.terminate(sb, c, "its init did not report a killed command")
			res := result(backend.ExitKilled)
			res.SandboxTerminated, res.TimedOut = true, outerFired
			if cancelled && !registry.Destroyed(opCtx) && ctx.Err() != nil {
				return res, fmt.Errorf("command in sandbox %s was killed because the request ended: %w", sb.id, ctx.Err())
			}
			return res, nil
		}
	}
}
