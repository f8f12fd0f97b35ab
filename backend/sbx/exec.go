package sbx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/capture"
)

// Every argument of sbx exec, environment included, is an argument of a
// host process: the backend's exec limits (backend.MaxArgBytes, ...) bound
// them all.
const (
	shellPath = backend.ShellPath
	guestTmp  = "/tmp"
)

// Exec runs one command in the sandbox's microVM:
//
//	sbx exec [-i] [--env-file F] -w CWD -- NAME timeout --kill-after=K -- S ARGV...
//
// ARGV is "sh -c COMMAND" or the request's argv; S is req.Timeout rounded
// up to whole milliseconds (never 0, which GNU timeout reads as "none"); the
// environment is the sandbox's Env overridden by req.Env, passed on every
// call (sbx keeps none between calls) in the file F, which only the daemon
// can read and which is removed after the call (see envfile.go): never on
// the command line, which every local user can read. A zero
// req.MaxOutputBytes keeps capture.DefaultMaxOutputBytes of each stream,
// the tail.
//
// TimedOut is exit 124 once S has passed, or 137 once S+K has. When sbx exec
// itself outlives S+K+ExecGrace it is killed and the sandbox destroyed (the
// command may still run inside the microVM, and only removing the microVM
// stops it): the result is TimedOut and SandboxTerminated. sbx exec exits 1
// for a sandbox it does not have, exactly like a failing command, so an exit
// 1 (or sbx's own 125/255) with no output on stdout is checked with sbx ls:
// a sandbox sbx no longer lists is reported SandboxTerminated.
//
// A command stopped because Destroy ran returns SandboxTerminated and no
// error; one stopped because ctx ended returns the partial result and an
// error wrapping ctx.Err(). Killing sbx exec does not necessarily stop the
// command inside the microVM; its in-guest timeout does, at the latest.
func (b *Backend) Exec(ctx context.Context, id string, req backend.ExecRequest) (backend.ExecResult, error) {
	sb, err := b.lookup(id)
	if err != nil {
		return backend.ExecResult{}, err
	}
	argv, cwd, err := backend.CheckExecRequest(req, sb.workspace())
	if err != nil {
		return backend.ExecResult{}, err
	}
	env, err := mergeEnv(sb.env, req.Env)
	if err != nil {
		return backend.ExecResult{}, err
	}
	if err := checkEnvFile(sb.env, "the sandbox's"); err != nil {
		return backend.ExecResult{}, err
	}
	if err := checkEnvFile(req.Env, "the command's"); err != nil {
		return backend.ExecResult{}, err
	}
	applied := backend.GuestTimeout(req.Timeout)
	killAfter := backend.GuestTimeout(b.cfg.KillAfter)

	args := []string{"exec"}
	if len(req.Stdin) > 0 {
		args = append(args, "-i")
	}
	envAt := -1 // where the env file's path goes, once the request is known to be good
	if len(env) > 0 {
		args = append(args, "--env-file", "")
		envAt = len(args) - 1
	}
	args = append(args, "-w", cwd, "--", sb.name,
		"timeout", "--kill-after="+backend.TimeoutSeconds(killAfter), "--", backend.TimeoutSeconds(applied))
	args = append(args, argv...)
	if err := checkArgvSize(args); err != nil {
		return backend.ExecResult{}, err
	}

	opCtx, done, err := sb.begin(ctx)
	if err != nil {
		return backend.ExecResult{}, err
	}
	defer done()

	// A stopped microVM is started first, under a deadline of its own: the
	// boot is not the command's time (autostop.go).
	switch err := b.ensureRunning(opCtx, sb); {
	case errors.Is(err, errGone):
		b.log.Warn("the sandbox's microVM is gone: sbx no longer lists it", "sandbox", id, "sbx_name", sb.name)
		return backend.ExecResult{SandboxTerminated: true}, nil
	case err != nil && errors.Is(context.Cause(opCtx), errSandboxDestroyed):
		return backend.ExecResult{SandboxTerminated: true}, nil
	case err != nil:
		return backend.ExecResult{}, fmt.Errorf("command in sandbox %s did not run: %w", id, err)
	}
	endSession := sb.session()
	defer endSession()

	if envAt >= 0 {
		path, err := writeEnvFile(sb.dir, env)
		if err != nil {
			return backend.ExecResult{}, err
		}
		defer os.Remove(path)
		args[envAt] = path
	}

	log := b.log.With("sandbox", id)
	res, runErr := b.runSbxOutput(opCtx, applied+killAfter+b.cfg.ExecGrace, req.MaxOutputBytes, req.Stdin, backend.OutputFunc(req.Output), args...)
	out := backend.ExecResult{
		ExitCode:        res.ExitCode,
		Stdout:          res.Stdout,
		Stderr:          res.Stderr,
		StdoutTruncated: res.StdoutTruncated,
		StderrTruncated: res.StderrTruncated,
		AppliedTimeout:  applied,
		Duration:        res.Duration,
	}
	// A microVM has no OOM counter the host can read: its kernel's OOM
	// kills are the guest's business, and 137 is reported as such.
	backend.Classify(backend.Facts{ExitCode: res.ExitCode, Elapsed: res.Duration, Applied: applied, KillAfter: killAfter,
		Ended: true, Terminated: runErr != nil && errors.Is(context.Cause(opCtx), errSandboxDestroyed)}).Apply(&out)
	switch {
	case runErr == nil:
	case out.SandboxTerminated:
		log.Info("command stopped: sandbox destroyed", "duration", res.Duration)
		return out, nil
	case ctx.Err() != nil:
		return out, fmt.Errorf("command in sandbox %s was abandoned because the request ended (it may run on in the microVM until its timeout): %w", id, runErr)
	default:
		return out, fmt.Errorf("%w: sbx exec could not be started for sandbox %s (%v); check that %s is installed and executable", backend.ErrUnavailable, id, runErr, b.sbx)
	}

	if res.TimedOut {
		// sbx exec outlived the in-guest timeout by ExecGrace: the CLI or
		// the microVM is stuck, and killing the CLI does not reach the
		// guest. Only removing the microVM stops whatever still runs.
		log.Error("sbx exec outlived the command's timeout and grace; destroying the sandbox",
			"timeout", applied, "kill_after", killAfter, "grace", b.cfg.ExecGrace, "duration", res.Duration)
		endSession()
		done()
		if err := b.Destroy(context.WithoutCancel(ctx), id); err != nil {
			log.Error("cannot destroy the stuck sandbox; the caller's destroy will retry", "error", err)
		}
		out.TimedOut, out.SandboxTerminated = true, true
		return out, nil
	}

	if !out.TimedOut && looksLikeMissingSandbox(res) {
		exists, lsErr := b.sbxHas(ctx, sb.name)
		switch {
		case errors.Is(lsErr, errSignedOut), errors.Is(lsErr, errNoPolicy):
			// sbx refused the command itself (the sandbox is not at fault).
			log.Warn("sbx refused the command", "error", lsErr)
			return out, fmt.Errorf("command in sandbox %s did not run: %w", id, lsErr)
		case lsErr != nil:
			log.Warn("sbx exec failed without output and sbx ls cannot tell whether the sandbox still exists; reporting the exit status as is", "exit_code", res.ExitCode, "error", lsErr)
		case !exists:
			log.Warn("the sandbox's microVM is gone: sbx no longer lists it", "sbx_name", sb.name, "stderr", firstLine(res.Stderr))
			out.SandboxTerminated = true
			return out, nil
		}
	}
	log.Debug("command finished", "exit_code", out.ExitCode, "timed_out", out.TimedOut,
		"duration", res.Duration, "stdout_bytes", res.StdoutTotal, "stderr_bytes", res.StderrTotal)
	return out, nil
}

// looksLikeMissingSandbox reports whether an sbx exec result is what sbx
// gives for a sandbox it does not have: exit 1 (or its own error statuses
// 125 and 255) and nothing on stdout. A command can end that way too, so
// this only decides whether to ask sbx ls.
func looksLikeMissingSandbox(res capture.Result) bool {
	switch res.ExitCode {
	case 1, 125, 255:
		return res.StdoutTotal == 0
	}
	return false
}

// checkArgvSize checks the whole sbx exec command line against the
// kernel's limits.
func checkArgvSize(args []string) error {
	total := 0
	for _, a := range args {
		total += len(a) + 1
	}
	if total > backend.MaxExecBytes {
		return fmt.Errorf("%w: the command and its environment total %d bytes, more than the %d allowed; write large values to files with write_file", backend.ErrInvalidArgument, total, backend.MaxExecBytes)
	}
	return nil
}

// mergeEnv is the command's environment: the sandbox's, then the
// request's, over the image's own (which sbx exec keeps).
func mergeEnv(sandboxEnv, requestEnv map[string]string) ([]string, error) {
	return backend.MergeEnv(nil, sandboxEnv, requestEnv)
}

// probeScript checks, once per new sandbox, what the backend relies on in
// the guest: GNU coreutils (timeout --kill-after, realpath -m, stat -c,
// head -c, mktemp), the workspace mounted at its host path, shown by
// printing the token the host wrote there, and writable by the guest's
// user (a file written, read back and removed): a workspace the guest can
// read but not write fails every write_file and most commands later.
const probeScript = `w=$1
missing=
for c in timeout realpath stat head mktemp mv cat chmod mkdir rm; do
	command -v "$c" >/dev/null 2>&1 || missing="$missing $c"
done
if [ -n "$missing" ]; then echo "the image lacks:$missing" >&2; exit 90; fi
realpath -m -- /nonexistent/sidecar >/dev/null 2>&1 || { echo "realpath is not GNU coreutils (no -m)" >&2; exit 90; }
timeout --kill-after=1 5 true || { echo "timeout is not GNU coreutils (no --kill-after)" >&2; exit 90; }
cat -- "$w/.sidecar-probe" 2>/dev/null || { echo "the workspace is not at $w inside the sandbox" >&2; exit 91; }
t=$(mktemp -- "$w/.sidecar-probe-write.XXXXXX" 2>&1) || { echo "$t" >&2; exit 92; }
printf written >"$t" && [ "$(cat -- "$t")" = written ] || { rm -f -- "$t"; echo "a file written there does not read back" >&2; exit 92; }
rm -f -- "$t" || exit 92
`

// probe runs probeScript in the new microVM.
func (b *Backend) probe(ctx context.Context, name, ws, token string) error {
	res, err := b.runSbx(ctx, probeTimeout, cliOutputBytes, nil,
		"exec", "-w", "/", "--", name, shellPath, "-c", probeScript, "sidecar-probe", ws)
	switch {
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("the request ended while checking the new microVM: %w", ctx.Err())
	case err == nil && operatorNeeded(res) != nil:
		return operatorNeeded(res)
	case err != nil || res.TimedOut:
		return fmt.Errorf("%w: the new microVM did not run a first command (%s); check the sbx daemon's log", backend.ErrUnavailable, failure(res, err, probeTimeout))
	case res.ExitCode == 90:
		return fmt.Errorf("%w: the template image cannot be used: %s; use a Debian- or Ubuntu-based image with GNU coreutils (the default is %s)", backend.ErrUnavailable, firstLine(res.Stderr), DefaultTemplate)
	case res.ExitCode == 92:
		return fmt.Errorf("%w: the guest cannot write the workspace %s (%s): sbx mounted it, but not writable for the template's user; check the workspace's owner and mode on the host and the template's user (docs/sbx.md)", backend.ErrUnavailable, ws, firstLine(res.Stderr))
	case res.ExitCode == 91 || (res.ExitCode == 0 && string(bytes.TrimSpace(res.Stdout)) != token):
		return fmt.Errorf("%w: sbx did not mount the workspace %s at the same path inside the microVM (%s); this sbx version behaves differently from what the backend expects, see docs/sbx.md", backend.ErrUnavailable, ws, failure(res, nil, probeTimeout))
	case res.ExitCode != 0:
		return fmt.Errorf("%w: the new microVM did not run a first command (%s); check the sbx daemon's log", backend.ErrUnavailable, failure(res, nil, probeTimeout))
	}
	return nil
}
