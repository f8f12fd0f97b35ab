package lifecycle

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// The warm pool keeps, for each image with a pool size (Config.PoolSize for
// the default image, Config.ImagePools for others), that many plain
// sandboxes of the image made ahead of time,
// so that a create a plain sandbox can serve costs a claim (a journal write)
// instead of the backend's create (for a microVM, seconds). Pool members are
// journaled like any sandbox (state "pooled"), count against the host quota
// but no uid's or owner's until claimed, are visible only to admins, and are
// handed to exactly one create: the claim happens under the manager's lock.

// poolable reports whether a sandbox made with an empty spec can serve
// spec: the same network (none), no egress rules, and the daemon's default
// limits (a pool member's memory, CPU, process and disk limits were set
// when it was made). Env is fine: it is recorded at claim and added to
// every command.
func poolable(spec backend.Spec) bool {
	return (spec.BlockNetwork == nil || *spec.BlockNetwork) && len(spec.AllowEgressTo) == 0 && len(spec.AllowEgressToCIDRs) == 0 &&
		spec.Resources.IsZero()
}

// claimPooled turns a pool member into caller's sandbox. ok is false when
// the pool cannot serve the request (none ready, or the spec needs more).
func (m *Manager) claimPooled(c Caller, req CreateRequest) (sb Sandbox, ok bool, err error) {
	if m.poolSize(req.Image) <= 0 || !poolable(req.Spec) {
		return Sandbox{}, false, nil
	}
	if err := backend.ValidateEnv(req.Spec.Env, "the sandbox's"); err != nil {
		return Sandbox{}, true, err
	}
	if ec, ok := m.be.(backend.EnvChecker); ok {
		if err := ec.CheckEnv(req.Spec.Env); err != nil {
			return Sandbox{}, true, err
		}
	}
	m.mu.Lock()
	if m.closing {
		m.mu.Unlock()
		return Sandbox{}, true, ErrShuttingDown
	}
	var pooled []*record
	var perUID, perOwner int
	for _, r := range m.boxes {
		switch {
		case r.State == StatePooled && r.Image == req.Image:
			pooled = append(pooled, r)
		case !r.countsForItsUID():
		default:
			if r.UID != c.UID {
				continue
			}
			perUID++
			if req.Owner != "" && r.Owner == req.Owner { // owners are scoped inside a uid
				perOwner++
			}
		}
	}
	switch {
	case len(pooled) == 0:
		m.mu.Unlock()
		return Sandbox{}, false, nil
	case perUID >= m.cfg.MaxPerUID:
		m.mu.Unlock()
		return Sandbox{}, true, &QuotaError{Scope: "uid", Limit: m.cfg.MaxPerUID}
	case req.Owner != "" && perOwner >= m.cfg.MaxPerOwner:
		m.mu.Unlock()
		return Sandbox{}, true, &QuotaError{Scope: "owner", Limit: m.cfg.MaxPerOwner}
	}
	// A warm member first (one recovery re-adopted may not be yet), then
	// the oldest, so members do not age out unused.
	sort.Slice(pooled, func(i, j int) bool {
		if pooled[i].warm != pooled[j].warm {
			return pooled[i].warm
		}
		return pooled[i].CreatedAt.Before(pooled[j].CreatedAt)
	})
	r := pooled[0]
	now := m.cfg.Now()
	r.UID = c.UID
	r.Owner = req.Owner
	r.Labels = cloneMap(req.Labels)
	r.Env = cloneMap(req.Spec.Env)
	r.NetSpec = netSpecJSON(req.Spec)
	r.Pooled = false
	r.State = StateReady
	r.source = SourcePool
	r.ConnBound = req.Owner == "" && req.TTL == 0
	r.ConnID = c.ConnID
	r.CreatedAt = now // its life as the caller's sandbox starts now
	r.LastUsed = now
	life := m.cfg.MaxLifetime
	if !r.ConnBound {
		life = req.TTL
		if life == 0 {
			life = m.cfg.DefaultTTL
		}
		life = min(life, m.cfg.MaxLifetime)
	}
	r.ExpiresAt = now.Add(life)
	m.lastClaim, m.lastClaimImage = time.Now(), req.Image
	m.mu.Unlock()
	m.kickPool()

	log := m.log.With("sandbox", r.ID, "peer_uid", c.UID, "peer_pid", c.PID, "owner", r.Owner)
	if err := m.persist(r); err != nil {
		log.Error("journal write failed; destroying the claimed sandbox", "error", err)
		m.claimAndDestroy(r, "journal write failed", log)
		return Sandbox{}, true, fmt.Errorf("%w: %v; check the state directory's disk", ErrJournal, err)
	}
	m.mu.Lock()
	sb = r.snapshot()
	m.mu.Unlock()
	log.Info("sandbox created", "from_pool", true, "conn_bound", sb.ConnBound, "expires_at", sb.ExpiresAt.Format(time.RFC3339), "labels", sb.Labels)
	return sb, true, nil
}

func (m *Manager) kickPool() {
	select {
	case m.poolKick <- struct{}{}:
	default:
	}
}

// refillDelay is how long the pool filler waits before it replaces the
// members claims took, the last at claimed: until the host has run no
// command (the last started or ended at lastCommand) for quiet since that
// claim, and at most maxDelay after it; not at all when the claimed
// image's pool is empty (the next create of it would be a cold one, which
// costs more than a refill beside a sandbox's first commands) or when no
// claim is pending (claimed is zero or long past).
//
// Making a member (its directories, disk and cgroup, its init's start and
// warm-up) is tens of milliseconds of work on the CPUs that the claimed
// sandbox's first commands need: started at the claim, it ran beside them,
// and the first ten or so commands of a sandbox from the pool took twice
// as long as later ones (docs/design.md, "A pool member is ready to run").
func refillDelay(now, claimed, lastCommand time.Time, empty bool, quiet, maxDelay time.Duration) time.Duration {
	if empty || claimed.IsZero() {
		return 0
	}
	quietSince := claimed
	if lastCommand.After(quietSince) {
		quietSince = lastCommand
	}
	wait := min(quietSince.Add(quiet).Sub(now), claimed.Add(maxDelay).Sub(now))
	return max(wait, 0)
}

// awaitRefill waits until refillDelay says the pool may be refilled. It
// reports false when the manager is closing.
func (m *Manager) awaitRefill() bool {
	for {
		m.mu.Lock()
		empty := true
		for _, r := range m.boxes {
			if r.State == StatePooled && r.Image == m.lastClaimImage {
				empty = false
				break
			}
		}
		wait := refillDelay(time.Now(), m.lastClaim, m.lastCommand, empty, m.cfg.PoolRefillQuiet, m.cfg.PoolRefillMaxDelay)
		m.mu.Unlock()
		if wait <= 0 {
			return true
		}
		t := time.NewTimer(wait)
		select {
		case <-m.stop:
			t.Stop()
			return false
		case <-m.poolKick:
			// Another claim: its pool may be empty now.
			t.Stop()
		case <-t.C:
		}
	}
}

// fillPool keeps the pool at PoolSize until Close, backing off when the
// backend fails. After a claim it waits for the host to be quiet first
// (awaitRefill).
func (m *Manager) fillPool() {
	var fails int
	for {
		wait := m.cfg.ReapInterval
		if !m.awaitRefill() {
			return
		}
		if err := m.topUpPool(); err != nil {
			fails++
			wait = backoff(fails)
			m.log.Error("warm pool refill failed; backing off", "error", err, "retry_in", wait)
		} else {
			fails = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-m.stop:
			t.Stop()
			return
		case <-m.poolKick:
			t.Stop()
		case <-t.C:
		}
	}
}

// topUpPool creates pool members until every image's pool is full. An
// image that is not imported (yet) is skipped: an operator may import it
// while the daemon runs.
func (m *Manager) topUpPool() error {
	m.warmAdopted()
	sizes := m.poolSizes()
	names := slices.Sorted(maps.Keys(sizes))
	for _, name := range names {
		img, err := m.ResolveImage(name)
		if err != nil {
			m.log.Debug("warm pool of an image not imported: not filled", "image", name, "error", err)
			continue
		}
		for {
			m.mu.Lock()
			n := 0
			for _, r := range m.boxes {
				if r.Pooled && r.Image == name {
					n++
				}
			}
			closing := m.closing
			m.mu.Unlock()
			if closing || n >= sizes[name] {
				break
			}
			if err := m.createPooled(img); err != nil {
				return err
			}
		}
	}
	return nil
}

// createPooled makes one pool member of image img, journaled before the
// backend is asked, like any create.
func (m *Manager) createPooled(img backend.Image) error {
	now := m.cfg.Now()
	rec := newRecord(Sandbox{
		ID: NewID(), State: StateCreating, Pooled: true, NetSpec: netSpecJSON(backend.Spec{}),
		Image: img.DisplayName(), ImageDigest: img.Digest,
		CreatedAt: now, LastUsed: now, ExpiresAt: now.Add(m.cfg.MaxLifetime),
	})
	if err := m.reserve(rec); err != nil {
		return err
	}
	m.opsWG.Add(1)
	defer m.opsWG.Done()
	log := m.log.With("sandbox", rec.ID, "pool", true, "image", rec.Image)
	if err := m.persist(rec); err != nil {
		m.forget(rec)
		return fmt.Errorf("%w: %v", ErrJournal, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.CreateTimeout)
	defer cancel()
	info, err := m.be.Create(ctx, rec.ID, backend.Spec{Image: img})
	if err == nil {
		// Ready to run, not just made: its first command must not pay
		// for starting the sandbox's init.
		if w, ok := m.be.(backend.Warmer); ok {
			err = w.Warm(ctx, rec.ID)
		}
	}
	if err != nil {
		m.obs.CreateFailed(CreateFailPool)
		m.claimAndDestroy(rec, "pool create failed", log)
		return err
	}
	m.mu.Lock()
	rec.Workdir, rec.Network, rec.HostUID, rec.State = info.Workdir, info.Network, info.HostUID, StatePooled
	rec.warm = true
	m.mu.Unlock()
	if err := m.persist(rec); err != nil {
		m.claimAndDestroy(rec, "journal write failed", log)
		return fmt.Errorf("%w: %v", ErrJournal, err)
	}
	log.Debug("warm pool member ready")
	return nil
}

// warmAdopted warms the pool members that are not (those recovery
// re-adopted: their inits died with the previous daemon), one at a time
// on the pool filler, before it makes new ones: off the serving path, and
// bounded by CreateTimeout each (the backend bounds its own start more
// tightly). Recovery decides and adopts first; a member still being
// adopted in the background is waited for. A member that cannot be warmed
// cannot serve: it is destroyed (the filler replaces it), unless a create
// claimed it meanwhile, whose first command then learns what is wrong as
// it would after any command. Without a backend.Warmer every member is
// warm.
func (m *Manager) warmAdopted() {
	w, ok := m.be.(backend.Warmer)
	m.mu.Lock()
	var cold []*record
	for _, r := range m.boxes {
		if r.State != StatePooled || r.warm || r.warming || r.claimed {
			continue
		}
		if !ok {
			r.warm = true
			continue
		}
		r.warming = true
		cold = append(cold, r)
	}
	// The oldest first: claims take those first. Sorted under m.mu: a
	// claim rewrites a member's CreatedAt.
	sort.Slice(cold, func(i, j int) bool { return cold[i].CreatedAt.Before(cold[j].CreatedAt) })
	m.mu.Unlock()
	for i, r := range cold {
		m.mu.Lock()
		stop := m.closing
		if stop {
			for _, left := range cold[i:] {
				left.warming = false
			}
		}
		m.mu.Unlock()
		if stop {
			return
		}
		m.awaitAdopted(r) // never Warm before the backend adopted it
		m.mu.Lock()
		pooled := r.State == StatePooled && !r.claimed
		m.mu.Unlock()
		var err error
		if pooled {
			ctx, cancel := context.WithTimeout(context.Background(), m.cfg.CreateTimeout)
			err = w.Warm(ctx, r.ID)
			cancel()
		}
		log := m.log.With("sandbox", r.ID, "pool", true, "image", r.Image)
		m.mu.Lock()
		r.warming = false
		r.warm = pooled && err == nil
		destroy := pooled && err != nil && r.State == StatePooled && m.claimForDestroy(r)
		m.mu.Unlock()
		switch {
		case destroy:
			log.Warn("a re-adopted warm pool member could not be warmed; destroying it", "error", err)
			_ = m.destroyNow(r, "pool member could not be warmed", log)
		case err != nil:
			log.Warn("a re-adopted pool member could not be warmed before a create claimed it", "error", err)
		case pooled:
			log.Debug("re-adopted warm pool member warmed")
		}
	}
}

// trimPool destroys the ready pool members beyond their image's pool size,
// the newest first: after a restart with a smaller pool of an image (or
// none), recovery kept members nobody wants, and they would hold the image
// against an rm.
func (m *Manager) trimPool() {
	sizes := m.poolSizes()
	m.mu.Lock()
	byImage := map[string][]*record{}
	for _, r := range m.boxes {
		if r.State == StatePooled {
			byImage[r.Image] = append(byImage[r.Image], r)
		}
	}
	var extra []*record
	for name, rs := range byImage {
		sort.Slice(rs, func(i, j int) bool { return rs[i].CreatedAt.After(rs[j].CreatedAt) })
		for _, r := range rs[:max(len(rs)-sizes[name], 0)] {
			if m.claimForDestroy(r) {
				extra = append(extra, r)
			}
		}
	}
	m.mu.Unlock()
	for _, r := range extra {
		log := m.log.With("sandbox", r.ID, "pool", true, "image", r.Image)
		if err := m.destroyNow(r, "its image's pool is smaller now", log); err != nil {
			log.Warn("destroying a pool member beyond its image's pool size failed; the reaper retries", "error", err)
		}
	}
}
