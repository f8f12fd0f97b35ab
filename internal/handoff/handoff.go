// Package handoff lets a request run on the goroutine that read it from
// its connection for as long as it does not wait, and hand the connection
// to a reader of its own before it does.
//
// A request usually gets a goroutine of its own, so that its connection is
// read while it runs (the next request, a hang-up that cancels it). Starting
// that goroutine wakes a second thread of the Go runtime, which on a small
// host costs a short command a measurable part of its time
// (docs/benchmarks-history.md, "A command in a bwrap sandbox"). A
// request that ipc runs inline instead carries a *Conn in its context, and
// whatever would wait on its path calls Release first: the connection is
// then read by a new goroutine while the request goes on where it is. A
// hot wait that polls descriptors anyway watches FD too and releases as
// soon as the connection has something to read or has hung up.
package handoff

import (
	"context"
	"sync"
)

// Conn is the connection an inline request was read from.
type Conn struct {
	fd      int
	once    sync.Once
	resume  func()
	mu      sync.Mutex
	resumed bool
}

// New returns the Conn of a request read from descriptor fd; resume starts
// reading the connection again elsewhere, and runs at most once.
func New(fd int, resume func()) *Conn { return &Conn{fd: fd, resume: resume} }

type key struct{}

// With returns ctx carrying c.
func With(ctx context.Context, c *Conn) context.Context { return context.WithValue(ctx, key{}, c) }

// From returns the Conn that ctx's request was read from, or nil when the
// request has a goroutine of its own (nothing to release).
func From(ctx context.Context) *Conn {
	c, _ := ctx.Value(key{}).(*Conn)
	return c
}

// Release hands ctx's connection to a reader of its own, if its request
// runs inline and has not done so yet; callers call it before anything
// that may wait longer than a few milliseconds.
func Release(ctx context.Context) { From(ctx).Release() }

// FD is the connection's descriptor, for a poll that also watches it
// (readable or hung up: call Release); -1 for a nil Conn or once released
// (the new reader may close it). It stays open until then.
func (c *Conn) FD() int {
	if c == nil || c.Released() {
		return -1
	}
	return c.fd
}

// Released reports whether the connection has been released.
func (c *Conn) Released() bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resumed
}

// Release starts reading the connection elsewhere, once; nil does nothing.
func (c *Conn) Release() {
	if c == nil {
		return
	}
	c.once.Do(func() {
		c.mu.Lock()
		c.resumed = true
		c.mu.Unlock()
		c.resume()
	})
}

// Done ends c's request: a Release from then on does nothing. It reports
// whether the connection was released, so that the goroutine that read the
// request knows whether it still reads the connection.
func (c *Conn) Done() (released bool) {
	c.once.Do(func() {})
	return c.Released()
}
