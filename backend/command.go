package backend

import (
	"fmt"
	"path"
	"sort"
	"strings"
	"time"
)

// Every backend runs a guest command as an argv of a process inside the
// sandbox, under a budget: the sandbox's init keeps it (bwrap, gVisor) or
// GNU timeout does (sbx, the host test backend), with GNU timeout's
// conventions either way. These are the bounds and conventions that
// follow, the same for all of them.

// Limits on a request, from the kernel's exec limits: one argument or
// environment string may not exceed MAX_ARG_STRLEN (128 KiB), and all of
// them together must stay well below ARG_MAX (typically 2 MiB).
const (
	MaxArgBytes     = 128<<10 - 1
	MaxExecBytes    = 1 << 20
	MaxArgv         = 4096
	MaxGuestPathLen = 4096
	// MaxTimeout is the longest budget a backend accepts.
	MaxTimeout = 24 * time.Hour
)

// ShellPath runs a request's command string (sh -c) in every guest.
const ShellPath = "/bin/sh"

// GNU timeout's exit codes, which the inits that keep budgets report too.
const (
	// ExitTimedOut: the command died to timeout's SIGTERM.
	ExitTimedOut = 124
	// ExitKilled: 128+SIGKILL, timeout had to escalate (also what an OOM
	// kill gives).
	ExitKilled = 137
)

// GuestTimeout rounds d up to a whole number of milliseconds, at least one,
// and at most MaxTimeout: GNU timeout reads 0 as "no timeout", so a tiny
// budget must not become 0.
func GuestTimeout(d time.Duration) time.Duration {
	d = min(d, MaxTimeout)
	ms := (d + time.Millisecond - 1) / time.Millisecond
	return max(ms, 1) * time.Millisecond
}

// TimeoutSeconds formats d (whole milliseconds) as GNU timeout reads it:
// "1.500".
func TimeoutSeconds(d time.Duration) string {
	ms := d.Milliseconds()
	return fmt.Sprintf("%d.%03d", ms/1000, ms%1000)
}

// CheckExecRequest validates req and returns the argv to run under timeout
// and the working directory (workdir when req has none). Every refusal
// wraps ErrInvalidArgument and says what to do instead.
func CheckExecRequest(req ExecRequest, workdir string) (argv []string, cwd string, err error) {
	bad := func(format string, args ...any) ([]string, string, error) {
		return nil, "", fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
	}
	switch {
	case req.Timeout <= 0:
		return bad("the timeout must be positive, got %v", req.Timeout)
	case req.Timeout > MaxTimeout:
		return bad("the timeout %v is longer than the %v allowed; split the work into shorter commands", req.Timeout, MaxTimeout)
	case req.Command != "" && len(req.Argv) > 0:
		return bad("set either a command string or an argv, not both")
	case req.Command != "":
		argv = []string{ShellPath, "-c", req.Command}
	case len(req.Argv) > 0:
		argv = req.Argv
	default:
		return bad("the command is empty; give a command to run")
	}
	if len(argv) > MaxArgv {
		return bad("argv has %d elements, more than the %d allowed; write a script with write_file and run it", len(argv), MaxArgv)
	}
	total := 0
	for _, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return bad("the command contains a NUL byte, which cannot be passed to a program; remove it")
		}
		if len(a) > MaxArgBytes {
			return bad("the command is %d bytes, more than the %d a single argument may be; write it to a file with write_file and run that file", len(a), MaxArgBytes)
		}
		total += len(a) + 1
	}
	if total > MaxExecBytes {
		return bad("the command's arguments total %d bytes, more than the %d allowed; write them to a file with write_file", total, MaxExecBytes)
	}

	cwd = workdir
	if req.Cwd != "" {
		switch {
		case strings.IndexByte(req.Cwd, 0) >= 0:
			return bad("the working directory contains a NUL byte")
		case !path.IsAbs(req.Cwd):
			return bad("the working directory %s must be an absolute path inside the sandbox, such as %s/project", ShortName(req.Cwd), workdir)
		case len(req.Cwd) > MaxGuestPathLen:
			return bad("the working directory is %d bytes long, more than the %d allowed", len(req.Cwd), MaxGuestPathLen)
		}
		cwd = path.Clean(req.Cwd)
	}
	return argv, cwd, nil
}

// MergeEnv layers base, the sandbox's environment and the request's, in
// that order, and returns it as NAME=value entries sorted by name.
func MergeEnv(base, sandboxEnv, requestEnv map[string]string) ([]string, error) {
	if err := ValidateEnv(requestEnv, "the command's"); err != nil {
		return nil, err
	}
	merged := make(map[string]string, len(base)+len(sandboxEnv)+len(requestEnv))
	for _, layer := range []map[string]string{base, sandboxEnv, requestEnv} {
		for k, v := range layer {
			merged[k] = v
		}
	}
	if err := ValidateEnv(merged, "the combined"); err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(merged))
	for k := range merged {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	env := make([]string, 0, len(keys))
	for _, k := range keys {
		env = append(env, k+"="+merged[k])
	}
	return env, nil
}

// CheckProcessRequest checks a durable process's request as
// CheckExecRequest checks a command's (a timeout of 0 is none) and
// returns its argv and working directory.
func CheckProcessRequest(req ProcessRequest, workdir string) (argv []string, cwd string, err error) {
	if req.Timeout < 0 || req.Timeout > MaxTimeout {
		return nil, "", fmt.Errorf("%w: the timeout must be between 0 (none) and %v, got %v", ErrInvalidArgument, MaxTimeout, req.Timeout)
	}
	return CheckExecRequest(ExecRequest{Command: req.Command, Argv: req.Argv, Env: req.Env, Cwd: req.Cwd, Timeout: time.Second}, workdir)
}
