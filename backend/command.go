package backend

import (
	"fmt"
	"time"
)

// Every backend runs a guest command as an argv of a process (bwrap's or
// sbx exec's), under GNU timeout inside the sandbox. These are the bounds
// and conventions that follow, the same for all of them.

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

// GNU timeout's exit codes.
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
