package lifecycle

// Snapshots and forks: a sandbox's files made an image (the store's work,
// which the caller hands in), and new sandboxes made as copies of one,
// journaled and counted against the quotas as creates are.

import (
	"context"
	"fmt"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// SourceFork is how a fork's sandboxes were made (Observer.Created).
const SourceFork = "fork"

// MaxForkCount bounds the sandboxes one fork makes.
const MaxForkCount = 16

// SnapshotSource is what a snapshot's taker gets: the sandbox's files (held
// still where the backend can), and what it runs on and whose it is, as
// the journal says.
type SnapshotSource struct {
	Files backend.SandboxFiles
	// Sandbox is the sandbox's id; Image and ImageDigest the image it
	// runs on (backend.HostImage, no digest, for the built-in); UID the
	// uid it belongs to.
	Sandbox, Image, ImageDigest string
	UID                         uint32
}

// SnapshotResult is what Snapshot made.
type SnapshotResult struct {
	Image backend.Image
	// Frozen: the sandbox's processes were stopped while its files were
	// copied (backend.SandboxFiles.Frozen).
	Frozen bool
}

// Snapshot hands sandbox id's files to take, which makes them an image
// (the image store's snapshot, wired by the daemon): an operation on the
// sandbox like a file read, which it leaves as it was, whatever take did.
// A backend that cannot is ErrUnsupported.
func (m *Manager) Snapshot(ctx context.Context, c Caller, id string, opts backend.SnapshotOptions, take func(SnapshotSource) (backend.Image, error)) (SnapshotResult, error) {
	sn, ok := m.be.(backend.Snapshotter)
	if !ok {
		return SnapshotResult{}, fmt.Errorf("%w: the %s backend cannot snapshot a sandbox (its files are not the daemon's to copy)", backend.ErrUnsupported, m.be.Name())
	}
	r, done, err := m.useAsIs(ctx, c, id)
	if err != nil {
		return SnapshotResult{}, err
	}
	defer done()
	m.mu.Lock()
	src := SnapshotSource{Sandbox: r.ID, Image: r.Image, ImageDigest: r.ImageDigest, UID: r.UID}
	m.mu.Unlock()
	var res SnapshotResult
	err = sn.SnapshotFiles(ctx, id, opts, func(f backend.SandboxFiles) error {
		src.Files = f
		res.Frozen = f.Frozen
		var err error
		res.Image, err = take(src)
		return err
	})
	if err != nil {
		return SnapshotResult{}, err
	}
	m.log.Info("sandbox snapshot taken", "sandbox", id, "image", res.Image.Name, "digest", res.Image.Digest, "frozen", res.Frozen)
	return res, nil
}

// ForkRequest is what a fork asks.
type ForkRequest struct {
	// Count is how many sandboxes (1..MaxForkCount).
	Count int
	// Owner, when set, is the forks' owner instead of the source's.
	Owner *string
	// TTL, when positive, is the forks' lease instead of the source's
	// (whose end they otherwise share).
	TTL  time.Duration
	Opts backend.SnapshotOptions
}

// ForkResult is what a fork made.
type ForkResult struct {
	Sandboxes []Sandbox
	// Frozen: the source's processes were stopped while its files were
	// copied.
	Frozen bool
}

// Fork makes req.Count sandboxes as copies of sandbox id: its image,
// network, environment and resources, its /workspace and /tmp as they are
// now, each with its own uid, files and lease: the source's owner and
// lease end unless req names others, the source's labels and tags, no
// holder. The quotas are a create's, for all of them at once: a fork that
// does not fit whole makes none and says why. Each is journaled before the
// backend makes it, so a crash meanwhile leaves records recovery destroys;
// the source runs on.
func (m *Manager) Fork(ctx context.Context, c Caller, id string, req ForkRequest) (ForkResult, error) {
	switch {
	case req.Count < 1 || req.Count > MaxForkCount:
		return ForkResult{}, fmt.Errorf("%w: count %d: a fork makes 1 to %d sandboxes", ErrInvalid, req.Count, MaxForkCount)
	case req.Owner != nil && !validText(*req.Owner, MaxOwnerLen):
		return ForkResult{}, fmt.Errorf("%w: owner must be valid UTF-8 of at most %d bytes", ErrInvalid, MaxOwnerLen)
	case req.TTL < 0:
		return ForkResult{}, fmt.Errorf("%w: ttl must be positive", ErrInvalid)
	}
	fk, ok := m.be.(backend.Forker)
	if !ok {
		return ForkResult{}, fmt.Errorf("%w: the %s backend cannot fork a sandbox", backend.ErrUnsupported, m.be.Name())
	}
	start := time.Now()
	src, done, err := m.useAsIs(ctx, c, id)
	if err != nil {
		return ForkResult{}, err
	}
	defer done()

	now := m.cfg.Now()
	m.mu.Lock()
	recs := make([]*record, req.Count)
	ids := make([]string, req.Count)
	for i := range recs {
		s := Sandbox{
			ID: NewID(), UID: src.UID, Owner: src.Owner, Labels: cloneMap(src.Labels), Tags: cloneMap(src.Tags),
			NetSpec: src.NetSpec, Resources: src.Resources, Image: src.Image, ImageDigest: src.ImageDigest,
			Env: cloneMap(src.Env), State: StateCreating, CreatedAt: now, LastUsed: now, ExpiresAt: src.ExpiresAt,
			ConnBound: src.ConnBound, ConnID: c.ConnID,
		}
		if req.Owner != nil {
			s.Owner = *req.Owner
		}
		// Connection-bound like its source only when nothing gave it a
		// lease of its own; then it is the fork's client's.
		s.ConnBound = src.ConnBound && s.Owner == "" && req.TTL == 0
		switch {
		case req.TTL > 0:
			s.ExpiresAt = now.Add(min(req.TTL, m.cfg.MaxLifetime))
		case src.ConnBound && !s.ConnBound:
			// Owned now, by a lease the source never had: a create's.
			s.ExpiresAt = now.Add(min(m.cfg.DefaultTTL, m.cfg.MaxLifetime))
		}
		recs[i], ids[i] = newRecord(s), s.ID
		recs[i].source = SourceFork
	}
	m.mu.Unlock()
	if err := m.reserveAll(recs); err != nil {
		return ForkResult{}, err
	}
	log := m.log.With("sandbox", id, "peer_uid", c.UID, "forks", ids)

	m.opsWG.Add(1)
	defer m.opsWG.Done()
	forgetAll := func() {
		for _, r := range recs {
			m.forget(r)
		}
	}
	for _, r := range recs {
		if err := m.persist(r); err != nil {
			forgetAll()
			log.Error("journal write failed; nothing forked", "error", err)
			return ForkResult{}, fmt.Errorf("%w: %v; check the state directory's disk", ErrJournal, err)
		}
	}
	m.failpoint(FailForkJournaled)
	// Detached, as a create's backend work: a client that hangs up
	// mid-fork must not leave half of it behind.
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CreateTimeout)
	defer cancel()
	res, err := fk.Fork(bctx, id, ids, req.Opts)
	if err == nil && len(res.Infos) != len(ids) {
		err = fmt.Errorf("the backend made %d sandboxes for a fork of %d", len(res.Infos), len(ids))
	}
	if err != nil {
		log.Warn("fork failed", "error", err)
		for _, r := range recs {
			m.obs.CreateFailed(createFailReason(err))
			_ = m.claimAndDestroy(r, "fork failed", log)
		}
		return ForkResult{}, err
	}
	m.mu.Lock()
	for i, r := range recs {
		r.Workdir, r.Network, r.HostUID = res.Infos[i].Workdir, res.Infos[i].Network, res.Infos[i].HostUID
		r.State = StateReady
	}
	closing := m.closing
	m.mu.Unlock()
	for _, r := range recs {
		if r.ConnBound {
			continue // as a create's: recovery destroys it whatever it says
		}
		if err := m.persist(r); err != nil {
			log.Error("journal write failed; destroying the forks", "error", err)
			for _, r := range recs {
				m.obs.CreateFailed(CreateFailJournal)
				_ = m.claimAndDestroy(r, "journal write failed", log)
			}
			return ForkResult{}, fmt.Errorf("%w: %v; check the state directory's disk", ErrJournal, err)
		}
	}
	if closing || ctx.Err() != nil {
		for _, r := range recs {
			_ = m.claimAndDestroy(r, "client gone during fork", log)
		}
		if closing {
			return ForkResult{}, ErrShuttingDown
		}
		return ForkResult{}, ctx.Err()
	}
	out := ForkResult{Frozen: res.Frozen}
	m.mu.Lock()
	for _, r := range recs {
		out.Sandboxes = append(out.Sandboxes, r.snapshot())
	}
	m.mu.Unlock()
	for range recs {
		m.obs.Created(SourceFork, time.Since(start))
	}
	log.Info("sandbox forked", "count", len(recs), "frozen", res.Frozen, "duration", time.Since(start))
	return out, nil
}

// FailForkJournaled: a fork's records are journaled ("creating"), the
// backend not asked.
const FailForkJournaled = "fork-journaled"

// reserveAll checks the quotas for recs together and inserts them all,
// atomically, or none: a fork that does not fit whole is refused with the
// quota it breaks and how many would have fitted.
func (m *Manager) reserveAll(recs []*record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing {
		return ErrShuttingDown
	}
	if err := m.checkImageTaken(recs[0]); err != nil {
		return err
	}
	first := recs[0]
	var perUID, perOwner, destroying int
	for _, r := range m.boxes {
		if r.State == StateDestroying {
			destroying++
		}
		if !r.countsForItsUID() || r.UID != first.UID {
			continue
		}
		perUID++
		if first.Owner != "" && r.Owner == first.Owner {
			perOwner++
		}
	}
	n := len(recs)
	room := func(limit, used int) int { return max(limit-used, 0) }
	var q *QuotaError
	var fits int
	switch {
	case len(m.boxes)+n > m.cfg.MaxPerHost:
		q, fits = &QuotaError{Scope: "host", Limit: m.cfg.MaxPerHost, Destroying: destroying}, room(m.cfg.MaxPerHost, len(m.boxes))
	case perUID+n > m.cfg.MaxPerUID:
		q, fits = &QuotaError{Scope: "uid", Limit: m.cfg.MaxPerUID}, room(m.cfg.MaxPerUID, perUID)
	case first.Owner != "" && perOwner+n > m.cfg.MaxPerOwner:
		q, fits = &QuotaError{Scope: "owner", Limit: m.cfg.MaxPerOwner}, room(m.cfg.MaxPerOwner, perOwner)
	}
	if q != nil {
		return &ForkQuotaError{QuotaError: q, Count: n, Room: fits}
	}
	for _, r := range recs {
		m.boxes[r.ID] = r
	}
	return nil
}

// ForkQuotaError is a fork refused whole by a quota: Room sandboxes would
// have fitted of the Count asked.
type ForkQuotaError struct {
	*QuotaError
	Count, Room int
}

func (e *ForkQuotaError) Error() string {
	return fmt.Sprintf("%v; a fork of %d makes all of them or none, and there is room for %d", e.QuotaError, e.Count, e.Room)
}

func (e *ForkQuotaError) Unwrap() error { return e.QuotaError }

// ImageNamesFor returns the names of the images c may run sandboxes on
// (backend.Image.UsableBy).
func (m *Manager) ImageNamesFor(c Caller) []string {
	var names []string
	for _, im := range m.ImageList() {
		if im.UsableBy(c.UID, c.Admin) {
			names = append(names, im.DisplayName())
		}
	}
	return names
}
