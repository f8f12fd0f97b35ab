package backend

import (
	"context"
	"errors"
)

// Pauser is implemented by backends that can pause a sandbox: every
// process of it stopped, using no CPU, until it is resumed, with nothing
// else of it lost (its files, its durable processes and code contexts with
// their memory, its lease). bwrap freezes the sandbox's cgroup and keeps
// its memory where it is; a backend that can also give the memory back to
// the host (a checkpoint to disk) says so in PauseInfo.
//
// Pause and Resume never overlap another operation on the same sandbox:
// the caller (lifecycle) lets the operations in flight end first and holds
// off new ones, as it holds off a second command. Any other operation on a
// paused sandbox but Destroy, Adopt and Paused may fail with an error
// wrapping ErrPaused: the caller resumes a sandbox before it uses it.
// Destroy of a paused sandbox removes it as of any other. A paused sandbox
// stays paused across a restart of the daemon (Adopt keeps it so), and
// Paused then says so.
type Pauser interface {
	// CanPause reports whether this backend, as configured on this host,
	// can pause sandboxes at all: nil, or an error wrapping
	// ErrUnsupported that says why not and what would change it.
	CanPause() error
	// Pause stops every process of sandbox id. It is idempotent. It
	// either pauses the whole sandbox or leaves it running as it was,
	// never half paused. A sandbox whose long-lived part is busy (a
	// command running, its init being started) is refused with an
	// error wrapping ErrBusy.
	Pause(ctx context.Context, id string) (PauseInfo, error)
	// Resume lets the processes of paused sandbox id run again, where
	// they were; resuming a sandbox that is not paused succeeds.
	Resume(ctx context.Context, id string) error
	// Paused reports whether sandbox id is paused now, as the host holds
	// it (the kernel's freezer, a checkpoint on disk), whatever a journal
	// says: recovery asks it of every sandbox it adopted, since a daemon
	// killed between the two leaves them apart. It returns what the pause
	// did (its memory given back or not), or nil for a running sandbox.
	Paused(ctx context.Context, id string) (*PauseInfo, error)
}

// PauseInfo is what a pause did.
type PauseInfo struct {
	// MemoryReleased says the sandbox's memory was given back to the
	// host (a checkpoint on disk), not only its CPU.
	MemoryReleased bool
}

var (
	// ErrPaused: the sandbox is paused; resume it first.
	ErrPaused = errors.New("the sandbox is paused")
	// ErrBusy: the sandbox (or the host) is in the middle of something
	// that must end first (a pause of a sandbox that runs a command);
	// retrying once it ended can help.
	ErrBusy = errors.New("busy")
)
