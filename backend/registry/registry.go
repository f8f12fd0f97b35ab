// Package registry is the skeleton every backend builds its per-sandbox
// state on: the operations in flight in one sandbox (Ops: begin one,
// cancel them all for a destroy, wait for them boundedly), the backend's
// map of the sandboxes it knows (Registry: a lookup cache that loads a
// sandbox found on disk, forgets one whose files vanished, and the
// bookkeeping around Create and Destroy), and the persistence of a
// sandbox's settings (LoadSpec, SaveSpec).
//
// It decides nothing about what a sandbox is: a backend gives it hooks
// (how to load a sandbox from disk, whether its files are still there,
// what to stop when they vanished). It imports only backend and
// backend/statedir.
package registry

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sync"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/statedir"
)

// ErrDestroyed is the cancellation cause CancelAll gives running
// operations, so an operation can tell "destroyed under you" from "the
// request ended" (see Destroyed).
var ErrDestroyed = errors.New("sandbox destroyed")

// Destroyed reports whether ctx, from Ops.Begin, was cancelled by a
// destroy.
func Destroyed(ctx context.Context) bool { return errors.Is(context.Cause(ctx), ErrDestroyed) }

// MaxActive bounds the commands and file operations in flight in one
// sandbox.
const MaxActive = 32

// DestroyWait bounds how long a destroy waits for a sandbox's operations
// to end after cancelling them.
const DestroyWait = 10 * time.Second

// Ops tracks the operations in flight in one sandbox. The zero value is
// ready to use (for sandbox ID, set once before use).
type Ops struct {
	ID string

	mu         sync.Mutex
	destroying bool
	active     map[uint64]context.CancelCauseFunc
	next       uint64
	wg         sync.WaitGroup
}

// Begin registers one operation. The returned context ends when ctx does
// or when CancelAll runs; done, which may be called more than once, must be
// called when the operation is over. A sandbox being destroyed returns an
// error wrapping backend.ErrNotFound, one with MaxActive operations in
// flight backend.ErrUnavailable.
func (o *Ops) Begin(ctx context.Context) (context.Context, func(), error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.destroying {
		return nil, nil, backend.NotFound(o.ID)
	}
	if len(o.active) >= MaxActive {
		return nil, nil, fmt.Errorf("%w: sandbox %s already has %d commands and file operations in flight; wait for one to finish", backend.ErrUnavailable, o.ID, MaxActive)
	}
	if o.active == nil {
		o.active = make(map[uint64]context.CancelCauseFunc)
	}
	opCtx, cancel := context.WithCancelCause(ctx)
	key := o.next
	o.next++
	o.active[key] = cancel
	o.wg.Add(1)
	var once sync.Once
	done := func() {
		once.Do(func() {
			o.mu.Lock()
			delete(o.active, key)
			o.mu.Unlock()
			cancel(nil)
			o.wg.Done()
		})
	}
	return opCtx, done, nil
}

// CancelAll refuses new operations and cancels those in flight with
// ErrDestroyed.
func (o *Ops) CancelAll() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.destroying = true
	for _, cancel := range o.active {
		cancel(ErrDestroyed)
	}
}

// Destroying reports whether CancelAll has run.
func (o *Ops) Destroying() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.destroying
}

// Wait waits for the operations in flight for at most limit or until ctx
// ends; it reports whether they all ended.
func (o *Ops) Wait(ctx context.Context, limit time.Duration) bool {
	finished := make(chan struct{})
	go func() { o.wg.Wait(); close(finished) }()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-finished:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// Stop is CancelAll, then Wait.
func (o *Ops) Stop(ctx context.Context, limit time.Duration) bool {
	o.CancelAll()
	return o.Wait(ctx, limit)
}

// Sandbox is what the registry needs of a backend's state of one sandbox.
type Sandbox interface {
	comparable
	// Ops are its operations in flight.
	Ops() *Ops
}

// Hooks are what a backend tells its Registry.
type Hooks[S Sandbox] struct {
	// Load makes the state of a sandbox this process has not seen yet from
	// what is on disk (a restarted daemon re-adopting it). It runs under
	// the registry's lock, so two lookups never load one sandbox twice.
	Load func(id string) (S, error)
	// Usable reports whether a known sandbox's files are still there to
	// work in (its workspace): nil, or why not. An error wrapping
	// backend.ErrNotFound means they vanished (the sandbox is forgotten);
	// any other (damaged data) is returned as is and the sandbox kept.
	Usable func(sb S) error
	// Exists reports whether anything of a known sandbox is left on disk
	// (its directory).
	Exists func(sb S) bool
	// Forget, when set, stops what is left of a sandbox whose files
	// vanished behind the daemon's back, after its operations were
	// cancelled (the bwrap backend kills its init).
	Forget func(sb S)
	// Placeholder makes the state Destroy works with for a sandbox this
	// process never loaded (settings unread: it is only removed).
	Placeholder func(id string) S
}

// Registry is a backend's map of the sandboxes it knows. Safe for
// concurrent use.
type Registry[S Sandbox] struct {
	hooks Hooks[S]
	mu    sync.Mutex
	boxes map[string]S
}

// New returns an empty registry.
func New[S Sandbox](h Hooks[S]) *Registry[S] {
	return &Registry[S]{hooks: h, boxes: make(map[string]S)}
}

// Lookup returns sandbox id, loading it with Hooks.Load when this process
// has not seen it yet. A known sandbox whose files vanished (an operator, a
// disk wipe) and that is not being destroyed is forgotten: its operations
// are cancelled, Hooks.Forget runs, and Lookup reports it not found.
func (r *Registry[S]) Lookup(id string) (S, error) {
	var zero S
	if !backend.ValidID(id) {
		return zero, backend.NotFound(id)
	}
	r.mu.Lock()
	if sb, ok := r.boxes[id]; ok {
		if err := r.hooks.Usable(sb); err != nil && !sb.Ops().Destroying() {
			if !errors.Is(err, backend.ErrNotFound) {
				r.mu.Unlock()
				return zero, err
			}
			delete(r.boxes, id)
			r.mu.Unlock()
			r.forget(sb)
			return zero, backend.NotFound(id)
		}
		r.mu.Unlock()
		return sb, nil
	}
	defer r.mu.Unlock()
	sb, err := r.hooks.Load(id)
	if err != nil {
		return zero, err
	}
	r.boxes[id] = sb
	return sb, nil
}

// KnownAndPresent reports whether id is known and either still on disk or
// being destroyed; a known sandbox whose directory vanished is forgotten.
// Create uses it to refuse an id that is taken.
func (r *Registry[S]) KnownAndPresent(id string) bool {
	r.mu.Lock()
	sb, ok := r.boxes[id]
	if !ok {
		r.mu.Unlock()
		return false
	}
	if sb.Ops().Destroying() || r.hooks.Exists(sb) {
		r.mu.Unlock()
		return true
	}
	delete(r.boxes, id)
	r.mu.Unlock()
	r.forget(sb)
	return false
}

func (r *Registry[S]) forget(sb S) {
	sb.Ops().CancelAll()
	if r.hooks.Forget != nil {
		r.hooks.Forget(sb)
	}
}

// Created records the sandbox Create just made. Another call may have
// found its new directory first: an operation that loaded these same
// settings from disk (that state is kept), or a Destroy removing it, which
// is an error wrapping fs.ErrExist.
func (r *Registry[S]) Created(id string, sb S) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if existing, raced := r.boxes[id]; raced {
		if existing.Ops().Destroying() {
			return fmt.Errorf("sandbox %q was destroyed while being created; create it again: %w", id, fs.ErrExist)
		}
		return nil
	}
	r.boxes[id] = sb
	return nil
}

// Holds reports whether sb is what the registry holds for id: false after
// Created kept another operation's copy, or once a destroy is done.
func (r *Registry[S]) Holds(id string, sb S) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	cur, ok := r.boxes[id]
	return ok && cur == sb
}

// Destroying returns the state Destroy works with: the known sandbox, or a
// placeholder registered for the time of the destroy (known false), so
// that no lookup loads it meanwhile. Done must follow.
func (r *Registry[S]) Destroying(id string) (sb S, known bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sb, ok := r.boxes[id]; ok {
		return sb, true
	}
	sb = r.hooks.Placeholder(id)
	r.boxes[id] = sb
	return sb, false
}

// Done forgets sb, if it is still what the registry holds for id.
func (r *Registry[S]) Done(id string, sb S) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.boxes[id] == sb {
		delete(r.boxes, id)
	}
}

// All returns every known sandbox, in no order.
func (r *Registry[S]) All() []S {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]S, 0, len(r.boxes))
	for _, sb := range r.boxes {
		out = append(out, sb)
	}
	return out
}

// Settings persistence: each sandbox directory holds SpecName, the
// backend's own settings type, with a version.

// SpecName is the settings file in a sandbox's directory.
const SpecName = "spec.json"

// MaxSpecBytes bounds how much of a settings file is read back.
const MaxSpecBytes = 4 << 20

// Versioned is a settings type that carries its version.
type Versioned interface {
	SpecVersion() int
}

// LoadSpec reads sandbox id's settings from dir into spec and checks that
// they are of version want. A missing, unreadable or foreign file is an
// error wrapping backend.ErrNotFound that says to destroy and recreate.
func LoadSpec(dir, id string, want int, spec Versioned) error {
	if err := statedir.ReadSettings(dir, SpecName, id, MaxSpecBytes, spec); err != nil {
		return err
	}
	if v := spec.SpecVersion(); v != want {
		return fmt.Errorf("%w: settings of sandbox %q are from another version (%d); destroy it and create a new one", backend.ErrNotFound, id, v)
	}
	return nil
}

// SaveSpec writes spec as dir's settings, atomically.
func SaveSpec(dir string, spec any) error {
	return statedir.WriteJSON(filepath.Join(dir, SpecName), spec)
}
