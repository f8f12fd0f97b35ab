package lifecycle

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// recoveryWorkers bounds the destroys recovery runs at once.
const recoveryWorkers = 4

// RecoveryReport says what start-up recovery (or gc) did.
type RecoveryReport struct {
	// Adopted: journaled sandboxes re-adopted (expiring, lease valid,
	// backend has them).
	Adopted int
	// Destroyed: journaled sandboxes destroyed (connection-bound,
	// half-made, expired, or gone from the backend).
	Destroyed int
	// Swept: sandboxes the backend had that the journal did not know.
	Swept int
	// Failed: destroys that failed; the reaper retries them.
	Failed int
	// AdoptFailed: kept sandboxes the backend could not adopt; they are
	// quarantined (kept, retried in the background), not destroyed.
	AdoptFailed int
	// Pending: recovery's destroys not yet done. With
	// Config.RecoverWithin, Recover may return before they are (every
	// sandbox's fate decided, kept ones adopted, victims claimed): they go
	// on while the daemon serves, and Stats' report counts them as they
	// end.
	Pending int
	// MovedAside names where an unreadable journal was moved, if it was.
	MovedAside string
	// Duration is how long Recover took (until it returned).
	Duration time.Duration
	// Actions lists what was (or, in a dry run, would be) done.
	Actions []Action
}

// Action is one recovery decision.
type Action struct {
	Sandbox string
	Do      string // "adopt", "quarantine", "destroy" or "sweep"
	Reason  string
	Owner   string
}

// recoveryDecision decides one journaled sandbox's fate after a restart. It
// is pure, so it is table-tested. alive says whether the backend still has
// the sandbox.
func recoveryDecision(jr journalRecord, alive bool, now time.Time) (adopt bool, reason string) {
	switch {
	case jr.State == StatePooled && now.Before(jr.ExpiresAt) && alive:
		return true, "warm-pool member, still valid and the backend has it"
	case jr.State == StatePooled:
		return false, "warm-pool member expired or gone from the backend"
	case jr.State == StateCreating && jr.ConnBound:
		// Its "ready" is never journaled (Create): half-made or not, its
		// connection ended with the daemon.
		return false, "connection-bound (journaled as creating: made, or half-made when the daemon stopped during create): its connection ended with the daemon"
	case jr.State == StateCreating:
		return false, "half-made: the daemon stopped during create"
	case jr.State == StateDestroying:
		return false, "the daemon stopped during destroy"
	case jr.State != StateReady && jr.State != StateQuarantined:
		return false, fmt.Sprintf("unknown state %q", jr.State)
	case jr.ConnBound:
		return false, "connection-bound: its connection ended with the daemon"
	case !now.Before(jr.ExpiresAt):
		return false, "expired"
	case !alive:
		return false, "the backend no longer has it"
	}
	return true, "lease valid and the backend has it"
}

// sweepDecision decides whether a sandbox the backend lists (so it carries
// this daemon's marker) must be swept: only when no record knows it. A
// record is written before the backend is asked to create anything, so
// there is no window in which a sandbox being created lacks one, and no
// creation grace is needed.
func sweepDecision(known bool) bool { return !known }

// Recover re-adopts or destroys every journaled sandbox, then sweeps what
// the backend has that the journal does not know. It runs before the
// daemon serves. With dryRun it only reports what it would do. With
// Config.RecoverWithin, destroys (of victims and orphans alike) still
// running that long after it began go on after it returns; see
// RecoveryReport.Pending.
func (m *Manager) Recover(ctx context.Context, dryRun bool) (RecoveryReport, error) {
	start := time.Now()
	var rep RecoveryReport
	var records []journalRecord
	if m.journal != nil {
		var err error
		if records, err = m.journal.All(); err != nil {
			return rep, fmt.Errorf("reading the journal: %w", err)
		}
	}
	listed, listErr := m.be.List(ctx)
	alive := make(map[string]bool, len(listed))
	for _, id := range listed {
		alive[id] = true
	}
	if listErr != nil {
		m.log.Error("the backend cannot list its sandboxes; adopting valid records unverified and skipping the sweep", "error", listErr)
	}

	now := m.cfg.Now()
	known := make(map[string]bool, len(records))
	var victims, kept []*record
	keptWhy := map[string]string{}
	for _, jr := range records {
		known[jr.ID] = true
		adopt, reason := recoveryDecision(jr, alive[jr.ID] || listErr != nil, now)
		if m.cfg.DestroyAll {
			adopt, reason = false, "gc --all: every sandbox is destroyed"
		}
		r := fromJournal(jr)
		if adopt {
			kept = append(kept, r)
			keptWhy[r.ID] = reason
			continue
		}
		rep.Actions = append(rep.Actions, Action{jr.ID, "destroy", reason, jr.Owner})
		victims = append(victims, r)
	}
	// With RecoverWithin the kept sandboxes are adopted after Recover
	// returns, if it comes to that: each is in memory at once, its gate
	// (record.adopted) open until the backend adopted it, and every use or
	// destroy of it waits for the gate first.
	lazy := m.cfg.RecoverWithin > 0 && !dryRun && !m.cfg.SkipAdopt
	if lazy {
		for _, r := range kept {
			r.LastUsed = now // the idle clock restarts with the daemon
			r.adopted = make(chan struct{})
			rep.Actions = append(rep.Actions, Action{r.ID, "adopt", keptWhy[r.ID], r.Owner})
			m.mu.Lock()
			m.boxes[r.ID] = r
			m.mu.Unlock()
		}
	}
	// Each kept sandbox is adopted by the backend (its disk mounted, its
	// cgroup made); one that cannot be is quarantined, never destroyed.
	adoptErrs := make([]error, len(kept))
	if !dryRun && !m.cfg.SkipAdopt && !lazy {
		var wg sync.WaitGroup
		sem := make(chan struct{}, recoveryWorkers)
		for i, r := range kept {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				adoptErrs[i] = m.adoptRecord(r)
			}()
		}
		wg.Wait()
	}
	for i, r := range kept {
		if lazy {
			break
		}
		switch err := adoptErrs[i]; adoptDecision(err) {
		case adoptGone:
			m.log.Warn("the backend cannot adopt a journaled sandbox: it is gone; destroying its record", "sandbox", r.ID, "owner", r.Owner, "error", err)
			rep.Actions = append(rep.Actions, Action{r.ID, "destroy", "the backend cannot adopt it: " + err.Error(), r.Owner})
			victims = append(victims, r) // claimed for destroy below
			continue
		case adoptQuarantine:
			rep.AdoptFailed++
			m.log.Error("the backend cannot adopt a journaled sandbox; it is quarantined (kept, retried in the background)", "sandbox", r.ID, "owner", r.Owner, "error", err)
			rep.Actions = append(rep.Actions, Action{r.ID, "quarantine", err.Error(), r.Owner})
			m.quarantine(r, err)
		default:
			rep.Adopted++
			rep.Actions = append(rep.Actions, Action{r.ID, "adopt", keptWhy[r.ID], r.Owner})
		}
		if !dryRun {
			r.LastUsed = now // the idle clock restarts with the daemon
			m.mu.Lock()
			m.boxes[r.ID] = r
			m.mu.Unlock()
		}
	}
	nDestroy := len(victims)
	if listErr == nil {
		for _, id := range listed {
			m.mu.Lock()
			_, inMemory := m.boxes[id]
			m.mu.Unlock()
			if sweepDecision(known[id] || inMemory) {
				rep.Actions = append(rep.Actions, Action{id, "sweep", "the journal does not know it", ""})
				victims = append(victims, newRecord(Sandbox{ID: id, CreatedAt: now}))
			}
		}
	}
	if dryRun {
		rep.Destroyed, rep.Swept = nDestroy, len(victims)-nDestroy
		rep.Duration = time.Since(start)
		return rep, listErr
	}

	// Every victim is in memory and claimed before anything serves: no
	// client can use one (lookup wants ready), destroy one (it is claimed)
	// or reuse its id, and each counts against the host's quota until it
	// is gone (its uid's and owner's no longer: countsForItsUID).
	for _, r := range victims {
		m.mu.Lock()
		m.boxes[r.ID] = r
		m.claimForDestroy(r) // nobody else knows it yet: always claimed
		r.recovering = true
		m.mu.Unlock()
	}
	sort.Slice(rep.Actions, func(i, j int) bool { return rep.Actions[i].Sandbox < rep.Actions[j].Sandbox })
	rep.Pending = len(victims)
	if lazy {
		rep.Pending += len(kept)
	}
	m.publishRecovery(&rep)
	// The adopts (with RecoverWithin) and destroys run on their own;
	// Recover waits for them, up to Config.RecoverWithin after it began
	// when that is set.
	// The background work reads only what is fixed by now: rep is
	// Recover's own, rewritten below once the budget is up.
	pending := rep.Pending
	finished := make(chan struct{})
	m.reaperWG.Add(1)
	go func() {
		defer m.reaperWG.Done()
		defer close(finished)
		began := time.Now()
		if lazy {
			m.adoptKept(kept, now)
		}
		m.destroyVictims(victims, nDestroy, func(i int, err error) {
			m.mu.Lock()
			defer m.mu.Unlock()
			m.recovery.Pending--
			tally(&m.recovery, i < nDestroy, err)
		})
		m.failpoint(FailRecoveryBackgroundDone)
		if pending > 0 {
			m.mu.Lock()
			left := m.recovery.Pending
			m.mu.Unlock()
			m.log.Info("recovery's background work done", "adopts", len(kept), "destroys", len(victims), "took", time.Since(began), "not_started", left)
		}
	}()
	var budget <-chan time.Time
	if m.cfg.RecoverWithin > 0 {
		t := time.NewTimer(max(time.Until(start.Add(m.cfg.RecoverWithin)), 0))
		defer t.Stop()
		budget = t.C
	}
	select {
	case <-finished:
	case <-budget:
	}
	m.mu.Lock()
	if m.recovery.Pending == 0 {
		m.recovery.Duration = time.Since(start)
	} else {
		m.recovery.Duration = time.Since(start)
		m.log.Info("recovery decided and adopted; its remaining destroys go on in the background while the daemon serves", "pending", m.recovery.Pending)
	}
	actions := rep.Actions
	rep = m.recovery
	rep.Actions = actions
	m.mu.Unlock()
	return rep, listErr
}

// adoptKept adopts the kept sandboxes Recover left to the background,
// recoveryWorkers at a time, and opens each one's gate once its fate is
// applied: adopted, quarantined, or (gone from the backend) destroyed.
// Once the manager closes it adopts no more; their gates open unadopted
// (the next start adopts them; their records are as journaled).
func (m *Manager) adoptKept(kept []*record, now time.Time) {
	sem := make(chan struct{}, recoveryWorkers)
	var wg sync.WaitGroup
	var elsewhere []chan struct{}
	defer func() {
		wg.Wait()
		for _, ch := range elsewhere {
			<-ch
		}
	}()
	for i, r := range kept {
		stopped := false
		select {
		case <-m.stop:
			stopped = true
		default:
			select {
			case sem <- struct{}{}:
			case <-m.stop:
				stopped = true
			}
		}
		if stopped {
			m.mu.Lock()
			for _, left := range kept[i:] {
				if left.adopted != nil && !left.adoptTaken {
					close(left.adopted)
					left.adopted = nil
				}
			}
			m.mu.Unlock()
			return
		}
		if taken, ch := m.takeAdopt(r); !taken {
			// A client that needed it first adopts it (awaitAdopted): the
			// queue's work is done when that adopt is.
			<-sem
			if ch != nil {
				elsewhere = append(elsewhere, ch)
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			m.adoptRecovered(r)
		}()
	}
}

// takeAdopt claims r's pending background adopt for the caller, which
// then runs it (adoptRecovered). Not taken, ch is the adopt's done channel
// (nil: none is pending).
func (m *Manager) takeAdopt(r *record) (taken bool, ch chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r.adopted == nil || r.adoptTaken {
		return false, r.adopted
	}
	r.adoptTaken = true
	return true, r.adopted
}

// adoptRecovered adopts r, which recovery kept, and settles its fate
// from the backend's answer; the caller took the adopt (takeAdopt).
func (m *Manager) adoptRecovered(r *record) {
	err := m.adoptRecord(r)
	log := m.log.With("sandbox", r.ID, "owner", r.Owner)
	m.mu.Lock()
	m.recovery.Pending--
	gone := false
	switch adoptDecision(err) {
	case adoptGone:
		log.Warn("the backend cannot adopt a journaled sandbox: it is gone; destroying its record", "error", err)
		gone = m.claimForDestroy(r) // unless a client or the reaper got it first
		if gone {
			r.recovering = true
		}
	case adoptQuarantine:
		m.recovery.AdoptFailed++
		log.Error("the backend cannot adopt a journaled sandbox; it is quarantined (kept, retried in the background)", "error", err)
		if !r.claimed {
			m.quarantine(r, err)
		}
	default:
		m.recovery.Adopted++
	}
	close(r.adopted)
	r.adopted = nil
	m.mu.Unlock()
	if gone {
		err := m.destroyNow(r, "recovery", log)
		m.mu.Lock()
		if err != nil {
			r.recovering = false
		}
		tally(&m.recovery, true, err)
		m.mu.Unlock()
	}
}

// awaitAdopted waits until r, which a recovery left to adopt in the
// background, is adopted (or its adoption will not happen): a use or a
// destroy must not reach the backend before its Adopt. An adopt that
// recovery's queue has not begun is done here and now, so a client's first
// use after a restart waits for its own sandbox's adopt, not for the
// thousands queued before it. m.mu must not be held. The wait is bounded
// by the adopt's own timeout.
func (m *Manager) awaitAdopted(r *record) {
	var ch chan struct{}
	select {
	case <-m.stop:
		// Stopping: the queue starts no more adopts and lets go of the
		// ones it will not do.
		m.mu.Lock()
		ch = r.adopted
		m.mu.Unlock()
	default:
		var taken bool
		if taken, ch = m.takeAdopt(r); taken {
			m.adoptRecovered(r)
			return
		}
	}
	if ch != nil {
		<-ch
	}
}

// tally counts one recovery destroy: a journaled victim (or else a swept
// orphan) destroyed, or failed.
func tally(rep *RecoveryReport, journaled bool, err error) {
	switch {
	case err != nil:
		rep.Failed++
	case journaled:
		rep.Destroyed++
	default:
		rep.Swept++
	}
}

// publishRecovery makes rep (without its actions) what Stats reports,
// and gives rep the moved-aside journal noted before.
func (m *Manager) publishRecovery(rep *RecoveryReport) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rep.MovedAside = m.recovery.MovedAside
	m.recovery = *rep
	m.recovery.Actions = nil
}

// destroyVictims destroys recovery's claimed victims, recoveryWorkers at a
// time; the first nDestroy are journaled sandboxes, the rest swept orphans.
// done is called once for each destroy that ran. Once the manager closes it
// starts no more: those not started stay claimed, and journaled as they
// were, so the next start destroys them.
func (m *Manager) destroyVictims(victims []*record, nDestroy int, done func(i int, err error)) {
	sem := make(chan struct{}, recoveryWorkers)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i, r := range victims {
		select {
		case <-m.stop:
			return
		default:
		}
		select {
		case sem <- struct{}{}:
		case <-m.stop:
			return
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			reason := "recovery"
			if i >= nDestroy {
				reason = "orphan sweep"
			}
			err := m.destroyNow(r, reason, m.log.With("sandbox", r.ID, "owner", r.Owner))
			if err != nil {
				// Left for the reaper's retries, in sight as any failed
				// destroy is.
				m.mu.Lock()
				r.recovering = false
				m.mu.Unlock()
			}
			done(i, err)
		}()
	}
}

// NoteJournalMovedAside records, for health, that the journal was
// unreadable and moved aside at start.
func (m *Manager) NoteJournalMovedAside(path string) {
	m.mu.Lock()
	m.recovery.MovedAside = path
	m.mu.Unlock()
}

// Sweep destroys, while the daemon runs, what the backend has that no
// record knows (a gc by hand). With dryRun it only lists them.
func (m *Manager) Sweep(ctx context.Context, dryRun bool) ([]string, error) {
	if rel, ok := m.be.(backend.StaleReleaser); ok {
		// Disks a dead daemon's namespace still holds keep sandboxes
		// quarantined: release them, then adopt those at once.
		released, held, err := rel.ReleaseStale(ctx, dryRun)
		if err != nil {
			m.log.Warn("some stale sandbox disks could not be released", "error", err)
		}
		if len(released) > 0 || len(held) > 0 {
			m.log.Info("stale sandbox disks", "released", released, "still_held", held, "dry_run", dryRun)
		}
		if len(released) > 0 && !dryRun {
			m.mu.Lock()
			for _, id := range released {
				if r := m.boxes[id]; r != nil && r.State == StateQuarantined {
					r.adoptRetryAt = time.Time{}
				}
			}
			m.mu.Unlock()
			m.RetryQuarantined()
		}
	}
	listed, err := m.be.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the backend's sandboxes: %w", err)
	}
	var out []string
	var firstErr error
	for _, id := range listed {
		m.mu.Lock()
		_, known := m.boxes[id]
		var r *record
		if sweepDecision(known) && !dryRun {
			r = newRecord(Sandbox{ID: id, CreatedAt: m.cfg.Now()})
			m.boxes[id] = r
			m.claimForDestroy(r)
		}
		m.mu.Unlock()
		if !sweepDecision(known) {
			continue
		}
		out = append(out, id)
		if r != nil {
			if err := m.destroyNow(r, "orphan sweep (gc)", m.log.With("sandbox", id)); err != nil && firstErr == nil {
				firstErr = err
			}
		}
	}
	return out, firstErr
}
