package lifecycle

import (
	"errors"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// Observer is told what the manager does, for metrics. The manager calls
// it outside its lock, from whichever goroutine did the work: methods must
// be quick, safe for concurrent use, and never call back into the Manager.
// Every string argument comes from a small fixed set (no ids, no owners),
// so an observer may use them as metric labels.
type Observer interface {
	// Created: a sandbox was handed to a client, made by the backend
	// (SourceCold) or claimed from the warm pool (SourcePool), after took
	// since the create began.
	Created(source string, took time.Duration)
	// CreateFailed: a create the quotas let through did not produce a
	// sandbox (CreateFail*).
	CreateFailed(reason string)
	// PoolClaim: a create the pool could have served (a pool is
	// configured) found a ready member (hit) or not (miss).
	PoolClaim(hit bool)
	// Destroyed: the backend destroyed a sandbox; reason is why
	// ("client request", "expired", "idle", "daemon shutdown", ...).
	// DestroyFailed: it failed to, and the reaper retries.
	Destroyed(reason string)
	DestroyFailed(reason string)
	// CommandDone: a command finished. outcome is its result's reason
	// (backend.Reason*) or "error" when the backend failed to run it;
	// first is set for the first command of a sandbox made (source) by
	// this daemon; oomKills are the kernel's OOM kills during it.
	CommandDone(outcome string, took time.Duration, first bool, source string, oomKills uint64)
	// ProcessStarted: a durable process was started.
	ProcessStarted()
}

// How a sandbox was made, for Observer.Created and CommandDone.
const (
	SourceCold = "cold"
	SourcePool = "pool"
)

// Why a create failed, for Observer.CreateFailed.
const (
	CreateFailBackend    = "backend"
	CreateFailRefused    = "refused_spec" // the backend refused the spec (invalid, unenforceable)
	CreateFailJournal    = "journal"
	CreateFailClientGone = "client_gone"
	CreateFailShutdown   = "shutting_down"
	CreateFailPool       = "pool_refill"
)

// createFailReason says why the backend's create failed: the client's
// spec, or the backend itself.
func createFailReason(err error) string {
	if errors.Is(err, backend.ErrInvalidArgument) || errors.Is(err, backend.ErrSpecUnenforceable) {
		return CreateFailRefused
	}
	return CreateFailBackend
}

// nopObserver is the observer of a manager configured without one.
type nopObserver struct{}

func (nopObserver) Created(string, time.Duration)                           {}
func (nopObserver) CreateFailed(string)                                     {}
func (nopObserver) PoolClaim(bool)                                          {}
func (nopObserver) Destroyed(string)                                        {}
func (nopObserver) DestroyFailed(string)                                    {}
func (nopObserver) CommandDone(string, time.Duration, bool, string, uint64) {}
func (nopObserver) ProcessStarted()                                         {}
