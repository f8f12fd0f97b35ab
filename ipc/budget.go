package ipc

import (
	"context"
	"fmt"
	"sync"
)

// Budget is a number of bytes that holders acquire before they hold that
// much memory and release once they no longer do, so that what the daemon
// holds for a purpose never exceeds a figure read off its configuration.
// The server keeps one for requests (all connections together), one for
// responses (all connections together), and one per connection for that
// connection's responses.
//
// Waiters are not served in order: a large acquisition may wait while
// smaller ones that fit go first. Every holder releases within a bounded
// time (a handler returns, a write meets its deadline), so none waits
// forever.
type Budget struct {
	mu    sync.Mutex
	limit int64
	used  int64
	// freed is closed (and cleared) when bytes are released while someone
	// waits; waiters then look again.
	freed chan struct{}
}

// NewBudget returns a budget of limit bytes.
func NewBudget(limit int64) *Budget { return &Budget{limit: limit} }

// Limit is the budget's size in bytes.
func (b *Budget) Limit() int64 { return b.limit }

// InUse is how many bytes are held now.
func (b *Budget) InUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// TryAcquire takes n bytes if they are free now.
func (b *Budget) TryAcquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.limit {
		return false
	}
	b.used += n
	return true
}

// Acquire takes n bytes, waiting until they are free or ctx is done. More
// than the whole budget can never be had: that is an error at once.
func (b *Budget) Acquire(ctx context.Context, n int64) error {
	if n > b.limit {
		return fmt.Errorf("%d bytes is more than the whole %d-byte budget", n, b.limit)
	}
	for {
		b.mu.Lock()
		if b.used+n <= b.limit {
			b.used += n
			b.mu.Unlock()
			return nil
		}
		if b.freed == nil {
			b.freed = make(chan struct{})
		}
		freed := b.freed
		b.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Release gives back n bytes taken by Acquire or TryAcquire.
func (b *Budget) Release(n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	if b.used < 0 {
		b.mu.Unlock()
		panic("ipc: Budget released more than was acquired")
	}
	if b.freed != nil {
		close(b.freed)
		b.freed = nil
	}
	b.mu.Unlock()
}
