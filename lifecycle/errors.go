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
)

// QuotaError says which limit a request would exceed.
type QuotaError struct {
	// Scope is "uid", "owner", "host" or "commands_per_host".
	Scope string
	Limit int
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("quota exceeded: at most %d sandboxes per %s", e.Limit, e.Scope)
}
