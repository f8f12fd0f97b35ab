package bwrap

import (
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap/bwinit"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap/bwwire"
)

// The sandbox's side of the conversation (its init and opener) lives in
// bwinit, the format both sides speak in bwwire, so that the init's own
// binary (cmd/sandbox-sidecar-init) links only them and not this package.

// IsInit reports whether this process is a sandbox's init (bwinit.IsInit).
func IsInit() bool { return bwinit.IsInit() }

// InitMain runs a sandbox's init, or its opener, and never returns when
// this process is one; otherwise it returns at once and does nothing
// (bwinit.Main). The daemon's main function calls it first thing, before
// flags or logging, and so does every test binary that creates sandboxes
// (in TestMain): without the small static init (initproc.Find), a
// sandbox's init is the daemon's own executable, run again inside it.
func InitMain() { bwinit.Main() }

// reservedThreads is how many threads sb's init reserves: bwwire.Threads
// when its own cgroup caps its processes and threads (pids.max), which a
// fork bomb fills; none when nothing of the sandbox's own does. Then no pid
// runs out before the host's (or an enclosing unit's TasksMax, shared with
// the daemon and every other sandbox), which a reserve of this init's
// would not make safe, and every pid of the namespace still dies with the
// command (init's kill at its budget, or the kernel's with init).
func (sb *sandbox) reservedThreads() int {
	if sb.cg != nil && sb.limits.PIDs > 0 {
		return bwwire.Threads
	}
	return 0
}
