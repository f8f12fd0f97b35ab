package lifecycle

import (
	"errors"
	"fmt"
)

var (
	// ErrShuttingDown: the manager is closing; no new work is accepted.
	ErrShuttingDown = errors.New("the daemon is shutting down")
	// ErrInvalid: the request is malformed (bad owner, labels, ttl ...).
	ErrInvalid = errors.New("invalid request")
	// ErrJournal: the journal could not be written, so nothing was done.
	ErrJournal = errors.New("journal write failed")
)

// QuotaError says which limit a request would exceed.
type QuotaError struct {
	// Scope is "uid", "owner", "host", "commands_per_host",
	// "commands_per_uid" or "commands_per_sandbox".
	Scope string
	Limit int
	// Destroying is how many of the sandboxes a host refusal counted are
	// being destroyed: they hold the host's resources until they are gone,
	// but no uid's or owner's quota.
	Destroying int
}

func (e *QuotaError) Error() string {
	switch e.Scope {
	case "commands_per_host":
		return fmt.Sprintf("quota exceeded: at most %d commands may run at once on this host", e.Limit)
	case "commands_per_uid":
		return fmt.Sprintf("quota exceeded: at most %d commands of one uid may run at once on this host; wait for one to finish", e.Limit)
	case "commands_per_sandbox":
		return fmt.Sprintf("quota exceeded: a command is already running in this sandbox; commands in one sandbox run one at a time (at most %d)", e.Limit)
	case "owner":
		return fmt.Sprintf("quota exceeded: at most %d sandboxes per owner (run) of one uid", e.Limit)
	case "host":
		if e.Destroying > 0 {
			return fmt.Sprintf("quota exceeded: at most %d sandboxes per host, and %d of them are still being destroyed (they hold the host's resources until they are gone); retry in a moment", e.Limit, e.Destroying)
		}
	}
	return fmt.Sprintf("quota exceeded: at most %d sandboxes per %s", e.Limit, e.Scope)
}

// OwnerMismatchError: attach named an owner the sandbox does not have.
type OwnerMismatchError struct {
	Sandbox, Owner, Want string
}

func (e *OwnerMismatchError) Error() string {
	return fmt.Sprintf("sandbox %s belongs to owner %q, not %q; a sandbox can only be attached by tasks of the run that provisioned it", e.Sandbox, e.Owner, e.Want)
}

// HeldByOtherError: attach found the sandbox held by another holder.
type HeldByOtherError struct {
	Sandbox, Holder string
}

func (e *HeldByOtherError) Error() string {
	return fmt.Sprintf("sandbox %s is held by %q; wait until it is released, or provision another", e.Sandbox, e.Holder)
}
