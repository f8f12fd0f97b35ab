package lifecycle

// Paused sandboxes (backend.Pauser): a sandbox a client paused keeps its
// record, lease and quotas as a ready one does, its processes stopped by
// the backend; every use of it resumes it first (use), a destroy removes it
// as it is. The record says Paused (journaled, with when), and the
// backend's view (the kernel's freezer) wins at recovery, since a daemon
// killed between the two leaves them apart (reconcilePause): a pause or a
// resume cut short by a crash leaves the sandbox as it was or as it was
// asked to be, never in between.
//
// A pause and the operations on its sandbox exclude each other through the
// record's gate: operations go in together, a pause or a resume waits for
// those inside to end and holds the next ones off, so no operation finds
// its sandbox frozen halfway. A command or a code cell is not waited for: a
// pause of a sandbox that runs one is refused (ErrBusy), since a command may
// run for hours and a pause must not freeze it halfway either.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/internal/handoff"
)

// Failpoints of a pause and a resume.
const (
	// FailPauseBegin: a pause decided (operations held off), the backend
	// not asked.
	FailPauseBegin = "pause-begin"
	// FailPauseFrozen: the backend paused the sandbox; the journal still
	// says it runs.
	FailPauseFrozen = "pause-frozen"
	// FailResumeBegin: a resume decided, the backend not asked.
	FailResumeBegin = "resume-begin"
	// FailResumeThawed: the backend resumed the sandbox; the journal still
	// says it is paused.
	FailResumeThawed = "resume-thawed"
)

// Bounds of a pause and a resume.
const (
	// pauseDrainWait bounds how long a pause waits for the operations on
	// its sandbox in flight (file operations, a process's start) to end;
	// past it the pause is refused as busy.
	pauseDrainWait = 10 * time.Second
	// pauseTimeout bounds the backend's pause or resume.
	pauseTimeout = 30 * time.Second
	// wakeTries bounds how often an operation resumes a sandbox that is
	// paused again before it gets in.
	wakeTries = 3
)

// pauser is the backend's pause, or an error saying why there is none.
func (m *Manager) pauser() (backend.Pauser, error) {
	pz, ok := m.be.(backend.Pauser)
	if !ok {
		return nil, fmt.Errorf("%w: the %s backend cannot pause a sandbox; destroy it when it is no longer needed, or keep it running", backend.ErrUnsupported, m.be.Name())
	}
	if err := pz.CanPause(); err != nil {
		return nil, err
	}
	return pz, nil
}

// CanPause reports whether this daemon's backend pauses sandboxes (hello's
// "pause" feature).
func (m *Manager) CanPause() bool {
	_, err := m.pauser()
	return err == nil
}

// Pause stops every process of sandbox id until it is used or resumed
// again. Pausing a paused sandbox returns it as it is. A sandbox that runs
// a command or a code cell is refused with an error wrapping
// backend.ErrBusy.
func (m *Manager) Pause(ctx context.Context, c Caller, id string) (Sandbox, error) {
	pz, err := m.pauser()
	if err != nil {
		return Sandbox{}, err
	}
	r, done, err := m.enter(ctx, c, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer done()
	if err := r.lockPause(ctx); err != nil {
		return Sandbox{}, err
	}
	defer r.unlockPause()
	if m.isPaused(r) {
		return m.snapshotOf(r), nil
	}
	busy := func() error {
		return fmt.Errorf("%w: sandbox %s runs a command or a code cell; pause it once that ended (a pause never stops one halfway)", backend.ErrBusy, id)
	}
	if len(r.cmd) > 0 {
		return Sandbox{}, busy()
	}
	wctx, cancel := context.WithTimeout(ctx, pauseDrainWait)
	err = r.gate.close(wctx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return Sandbox{}, ctx.Err()
		}
		return Sandbox{}, fmt.Errorf("%w: operations on sandbox %s did not end within %v; pause it once they ended", backend.ErrBusy, id, pauseDrainWait)
	}
	defer r.gate.open()
	if len(r.cmd) > 0 {
		return Sandbox{}, busy() // a command got in before the gate closed
	}
	m.failpoint(FailPauseBegin)
	bctx, bcancel := context.WithTimeout(context.WithoutCancel(ctx), pauseTimeout)
	start := time.Now()
	info, err := pz.Pause(bctx, id)
	bcancel()
	if err != nil {
		return Sandbox{}, err
	}
	m.failpoint(FailPauseFrozen)
	m.mu.Lock()
	r.Paused, r.PausedAt, r.MemoryReleased = true, m.cfg.Now(), info.MemoryReleased
	m.mu.Unlock()
	log := m.log.With("sandbox", id, "owner", r.Owner, "holder", r.Holder)
	if err := m.persist(r); err != nil {
		// The backend's view wins at the next start (reconcilePause), so
		// the pause stands; only its time is lost then.
		log.Error("journal write failed; the sandbox is paused all the same", "error", err)
	}
	log.Info("sandbox paused", "took", time.Since(start), "memory_released", info.MemoryReleased)
	return m.snapshotOf(r), nil
}

// Resume lets a paused sandbox's processes run again; resuming one that
// is not paused returns it as it is.
func (m *Manager) Resume(ctx context.Context, c Caller, id string) (Sandbox, error) {
	r, done, err := m.enter(ctx, c, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer done()
	if err := m.resume(ctx, r, "client request"); err != nil {
		return Sandbox{}, err
	}
	return m.snapshotOf(r), nil
}

// resume resumes r if it is paused, holding its operations off meanwhile.
func (m *Manager) resume(ctx context.Context, r *record, why string) error {
	if err := r.lockPause(ctx); err != nil {
		return err
	}
	defer r.unlockPause()
	if !m.isPaused(r) {
		return nil
	}
	pz, ok := m.be.(backend.Pauser)
	if !ok {
		return fmt.Errorf("%w: sandbox %s is recorded paused, and the %s backend cannot resume it", backend.ErrUnsupported, r.ID, m.be.Name())
	}
	// Nothing is inside a paused sandbox's gate but the ends of reads that
	// need none of its processes.
	if err := r.gate.close(ctx); err != nil {
		return err
	}
	defer r.gate.open()
	m.failpoint(FailResumeBegin)
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pauseTimeout)
	start := time.Now()
	err := pz.Resume(bctx, r.ID)
	cancel()
	if err != nil {
		return err
	}
	m.failpoint(FailResumeThawed)
	m.mu.Lock()
	pausedAt := r.PausedAt
	r.Paused, r.PausedAt, r.MemoryReleased = false, time.Time{}, false
	r.LastUsed = m.cfg.Now() // the idle clock starts again
	m.mu.Unlock()
	log := m.log.With("sandbox", r.ID, "owner", r.Owner, "holder", r.Holder)
	if err := m.persist(r); err != nil {
		log.Error("journal write failed; the sandbox runs all the same", "error", err)
	}
	log.Info("sandbox resumed", "reason", why, "took", time.Since(start), "paused_for", m.cfg.Now().Sub(pausedAt).Round(time.Millisecond))
	return nil
}

// awake gets an operation into r: a paused r is resumed first, and the
// operation is let in through r's gate (waiting for a pause or resume
// under way). leave lets it out again. A request running on its
// connection's reader has the connection released before anything waits.
func (m *Manager) awake(ctx context.Context, r *record) (leave func(), err error) {
	for try := 1; ; try++ {
		if m.isPaused(r) {
			handoff.Release(ctx)
			if err := m.resume(ctx, r, "used"); err != nil {
				return nil, err
			}
		}
		if !r.gate.tryEnter() {
			handoff.Release(ctx)
			if err := r.gate.enter(ctx); err != nil {
				return nil, err
			}
		}
		if !m.isPaused(r) {
			return r.gate.leave, nil
		}
		r.gate.leave() // paused again meanwhile
		if try == wakeTries {
			return nil, fmt.Errorf("%w: sandbox %s was paused again each time it was resumed for this request; retry", backend.ErrBusy, r.ID)
		}
	}
}

// useResumed is use for an operation that needs its sandbox resumed (as
// every use does) but none of its processes while it runs: the read of a
// durable process's output or end, served from the host, which may wait
// long and must not hold a pause off meanwhile.
func (m *Manager) useResumed(ctx context.Context, c Caller, id string) (*record, func(), error) {
	r, done, err := m.enter(ctx, c, id)
	if err != nil {
		return nil, nil, err
	}
	leave, err := m.awake(ctx, r)
	if err != nil {
		done()
		return nil, nil, err
	}
	leave()
	return r, done, nil
}

// useAsIs is use for an operation that needs only the sandbox's files,
// copied as they are (a snapshot, a fork: the backend holds the files
// still itself, and a paused sandbox's are): a paused sandbox stays
// paused, and no pause or resume comes until the operation ended.
func (m *Manager) useAsIs(ctx context.Context, c Caller, id string) (*record, func(), error) {
	r, done, err := m.enter(ctx, c, id)
	if err != nil {
		return nil, nil, err
	}
	if !r.gate.tryEnter() {
		handoff.Release(ctx)
		if err := r.gate.enter(ctx); err != nil {
			done()
			return nil, nil, err
		}
	}
	return r, func() { r.gate.leave(); done() }, nil
}

// resumeAttached resumes a sandbox an attach just claimed, if it is
// paused: the next task of a run carries on where the last one left it.
func (m *Manager) resumeAttached(ctx context.Context, c Caller, id string, sb Sandbox) (Sandbox, error) {
	if !sb.Paused {
		return sb, nil
	}
	r, done, err := m.enter(ctx, c, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer done()
	if err := m.resume(ctx, r, "attach"); err != nil {
		return Sandbox{}, err
	}
	return m.snapshotOf(r), nil
}

// reconcilePause makes r's paused state the backend's after r was
// adopted: a daemon killed between a pause (or resume) and its journal
// write left the journal behind the kernel.
func (m *Manager) reconcilePause(r *record) {
	var info *backend.PauseInfo
	if pz, ok := m.be.(backend.Pauser); ok {
		ctx, cancel := context.WithTimeout(context.Background(), adoptTimeout)
		p, err := pz.Paused(ctx, r.ID)
		cancel()
		if err != nil {
			m.log.Warn("cannot tell whether an adopted sandbox is paused; keeping what the journal says", "sandbox", r.ID, "error", err)
			return
		}
		info = p
	}
	paused := info != nil
	m.mu.Lock()
	was := r.Paused
	if was == paused && (!paused || r.MemoryReleased == info.MemoryReleased) {
		m.mu.Unlock()
		return
	}
	r.Paused = paused
	if paused {
		if !was {
			r.PausedAt = m.cfg.Now() // when it was paused is not known; from now
		}
		// What the pause did, as the backend holds it: a pause the
		// journal missed gave the memory back all the same.
		r.MemoryReleased = info.MemoryReleased
	} else {
		r.PausedAt, r.MemoryReleased = time.Time{}, false
	}
	m.mu.Unlock()
	m.log.Info("the sandbox's pause is as the backend has it, not as journaled (the daemon stopped between the two)", "sandbox", r.ID, "paused", paused, "journaled_paused", was)
	if err := m.persist(r); err != nil {
		m.log.Error("journal write failed", "sandbox", r.ID, "error", err)
	}
}

// adoptRecord adopts r (recovery, or a quarantined sandbox's retry) and,
// once adopted, takes its paused state from the backend.
func (m *Manager) adoptRecord(r *record) error {
	err := m.adopt(r.ID)
	if err == nil {
		m.reconcilePause(r)
	}
	return err
}

// pausedTooLong says why a sandbox paused for longer than maxPaused must
// go ("" if it may stay, or maxPaused is 0: no bound but its lease). It
// is pure, as reapReason is.
func pausedTooLong(s Sandbox, now time.Time, maxPaused time.Duration) string {
	if s.State != StateReady || !s.Paused || maxPaused <= 0 || s.PausedAt.IsZero() || now.Sub(s.PausedAt) < maxPaused {
		return ""
	}
	return "paused for longer than max_paused"
}

func (m *Manager) isPaused(r *record) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return r.Paused
}

func (m *Manager) snapshotOf(r *record) Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	return r.snapshot()
}

// lockPause serializes the pauses and resumes of r.
func (r *record) lockPause(ctx context.Context) error {
	select {
	case r.pmu <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *record) unlockPause() { <-r.pmu }

// pauseGate lets the operations on a sandbox in together, and a pause or a
// resume in alone: close waits for the operations inside to leave and
// holds new ones off until open.
type pauseGate struct {
	mu      sync.Mutex
	in      int           // operations inside
	closed  bool          // a pause or resume waits or is inside
	changed chan struct{} // closed (and forgotten) when in drops to 0 or the gate opens
}

// tryEnter lets an operation in unless the gate is closed.
func (g *pauseGate) tryEnter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.in++
	return true
}

// enter waits for the gate to be open and lets an operation in.
func (g *pauseGate) enter(ctx context.Context) error {
	g.mu.Lock()
	for g.closed {
		ch := g.waitChange()
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		g.mu.Lock()
	}
	g.in++
	g.mu.Unlock()
	return nil
}

func (g *pauseGate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.in--; g.in == 0 {
		g.notify()
	}
}

// close holds new operations off and waits for those inside to leave; on
// ctx's end it opens again and returns ctx's error. Its callers are
// serialized (lockPause).
func (g *pauseGate) close(ctx context.Context) error {
	g.mu.Lock()
	g.closed = true
	for g.in > 0 {
		ch := g.waitChange()
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			g.open()
			return ctx.Err()
		}
		g.mu.Lock()
	}
	g.mu.Unlock()
	return nil
}

// open lets operations in again.
func (g *pauseGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = false
	g.notify()
}

func (g *pauseGate) waitChange() chan struct{} {
	if g.changed == nil {
		g.changed = make(chan struct{})
	}
	return g.changed
}

func (g *pauseGate) notify() {
	if g.changed != nil {
		close(g.changed)
		g.changed = nil
	}
}
