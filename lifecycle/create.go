package lifecycle

// Creating a sandbox: ids, the checks on what a create may ask, the
// quotas it must fit, and the order of its durable steps.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// NewID returns a fresh sandbox id: "sc-" and 16 hex digits.
func NewID() string {
	var b [8]byte
	rand.Read(b[:]) // never fails on Linux (crypto/rand panics otherwise)
	return "sc-" + hex.EncodeToString(b[:])
}

// Bounds on what a client may attach to a sandbox.
const (
	MaxOwnerLen  = 512
	MaxHolderLen = 512
	MaxLabels    = 16
	MaxLabelKey  = 64
	MaxLabelVal  = 256
	MaxTags      = 32
	MaxTagKey    = 64
	MaxTagVal    = 1024
)

func validText(s string, max int) bool {
	return len(s) <= max && utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

func checkMap(what string, m map[string]string, maxN, maxKey, maxVal int) error {
	if len(m) > maxN {
		return fmt.Errorf("%w: at most %d %s", ErrInvalid, maxN, what)
	}
	for k, v := range m {
		if k == "" || !validText(k, maxKey) || !validText(v, maxVal) {
			return fmt.Errorf("%w: %s %q: keys of 1-%d bytes and values of at most %d bytes, UTF-8 without NUL", ErrInvalid, what, k, maxKey, maxVal)
		}
	}
	return nil
}

// netSpecJSON renders the airflow_network tag: compact JSON, sorted keys.
func netSpecJSON(s backend.Spec) string {
	block := true
	if s.BlockNetwork != nil {
		block = *s.BlockNetwork
	}
	hosts, cidrs := s.AllowEgressTo, s.AllowEgressToCIDRs
	if hosts == nil {
		hosts = []string{}
	}
	if cidrs == nil {
		cidrs = []string{}
	}
	// encoding/json writes map keys sorted.
	b, _ := json.Marshal(map[string]any{"allow_egress_to": hosts, "allow_egress_to_cidrs": cidrs, "block_network": block})
	return string(b)
}

// Create provisions a sandbox for caller. Quotas are checked and the
// record reserved (in memory and in the journal) before the backend is
// asked, so a refused create leaves nothing behind and a crash mid-create
// leaves a record that recovery destroys; a failed create is cleaned up
// before returning, whatever happened to ctx.
func (m *Manager) Create(ctx context.Context, c Caller, req CreateRequest) (Sandbox, error) {
	if !validText(req.Owner, MaxOwnerLen) {
		return Sandbox{}, fmt.Errorf("%w: owner must be valid UTF-8 of at most %d bytes", ErrInvalid, MaxOwnerLen)
	}
	if err := checkMap("labels", req.Labels, MaxLabels, MaxLabelKey, MaxLabelVal); err != nil {
		return Sandbox{}, err
	}
	if req.TTL < 0 {
		return Sandbox{}, fmt.Errorf("%w: ttl must be positive", ErrInvalid)
	}
	img, err := m.ResolveImage(req.Image)
	if err != nil {
		return Sandbox{}, err
	}
	if !img.UsableBy(c.UID, c.Admin) {
		// Another uid's snapshot holds that uid's files.
		return Sandbox{}, &backend.ImageNotFoundError{Name: req.Image, Known: m.ImageNamesFor(c)}
	}
	req.Image, req.Spec.Image = img.DisplayName(), img
	start := time.Now()
	sb, ok, err := m.claimPooled(c, req)
	if m.poolSize(req.Image) > 0 && poolable(req.Spec) && (!ok || err == nil) {
		m.obs.PoolClaim(ok)
	}
	if ok {
		if err == nil {
			m.obs.Created(SourcePool, time.Since(start))
		}
		return sb, err
	}

	now := m.cfg.Now()
	s := Sandbox{
		ID:        NewID(),
		UID:       c.UID,
		Owner:     req.Owner,
		Labels:    cloneMap(req.Labels),
		NetSpec:   netSpecJSON(req.Spec),
		Resources: req.Spec.Resources,
		Image:     req.Image,
		State:     StateCreating,
		CreatedAt: now,
		LastUsed:  now,
		ConnBound: req.Owner == "" && req.TTL == 0,
		ConnID:    c.ConnID,
	}
	life := m.cfg.MaxLifetime
	if !s.ConnBound {
		life = req.TTL
		if life == 0 {
			life = m.cfg.DefaultTTL
		}
		life = min(life, m.cfg.MaxLifetime)
	}
	s.ExpiresAt = now.Add(life)
	rec := newRecord(s)
	rec.source = SourceCold

	rec.ImageDigest = img.Digest
	if err := m.reserve(rec); err != nil {
		return Sandbox{}, err
	}
	log := m.log.With("sandbox", rec.ID, "peer_uid", c.UID, "peer_pid", c.PID, "owner", rec.Owner, "image", rec.Image)
	// The record now holds the image against an image rm; one that
	// finished between the resolve and the reserve has removed it.
	if _, err := m.ResolveImage(req.Image); err != nil {
		m.forget(rec)
		return Sandbox{}, err
	}

	m.opsWG.Add(1)
	defer m.opsWG.Done()
	m.failpoint(FailCreateReserved)
	if err := m.persist(rec); err != nil {
		m.forget(rec)
		m.obs.CreateFailed(CreateFailJournal)
		log.Error("journal write failed; sandbox not created", "error", err)
		return Sandbox{}, fmt.Errorf("%w: %v; check the state directory's disk", ErrJournal, err)
	}
	m.failpoint(FailCreateJournaled)
	// The backend work is detached from the request: a client that hangs
	// up mid-create must not leave a half-made sandbox behind.
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CreateTimeout)
	defer cancel()
	info, err := m.be.Create(bctx, rec.ID, req.Spec)
	m.failpoint(FailCreateBackend)
	if err != nil {
		log.Warn("create failed", "error", err)
		m.obs.CreateFailed(createFailReason(err))
		m.claimAndDestroy(rec, "create failed", log)
		return Sandbox{}, err
	}

	m.mu.Lock()
	rec.Workdir = info.Workdir
	rec.Network = info.Network
	rec.HostUID = info.HostUID
	rec.State = StateReady
	closing := m.closing
	m.mu.Unlock()
	// A connection-bound sandbox dies with the daemon whatever its record
	// says (recovery destroys its "creating" record as it would a
	// connection-bound "ready" one), so its "ready" is not journaled: the
	// create answers without the commit (two fdatasyncs) in its way, and
	// no commit of it competes with the sandbox's first command. A later
	// change of it (an attach, tags) journals it whole.
	if !rec.ConnBound {
		if err := m.persist(rec); err != nil {
			log.Error("journal write failed; destroying the new sandbox", "error", err)
			m.obs.CreateFailed(CreateFailJournal)
			m.claimAndDestroy(rec, "journal write failed", log)
			return Sandbox{}, fmt.Errorf("%w: %v; check the state directory's disk", ErrJournal, err)
		}
	}
	if closing || ctx.Err() != nil {
		// Shutdown began, or the client left, while we were creating:
		// nobody will ever use this sandbox.
		m.claimAndDestroy(rec, "client gone during create", log)
		if closing {
			m.obs.CreateFailed(CreateFailShutdown)
			return Sandbox{}, ErrShuttingDown
		}
		m.obs.CreateFailed(CreateFailClientGone)
		return Sandbox{}, ctx.Err()
	}
	m.mu.Lock()
	snap := rec.snapshot()
	m.mu.Unlock()
	m.obs.Created(SourceCold, time.Since(start))
	log.Info("sandbox created", "conn_bound", snap.ConnBound, "expires_at", snap.ExpiresAt.Format(time.RFC3339), "labels", snap.Labels, "host_uid", snap.HostUID)
	return snap, nil
}

// countsForItsUID reports whether r counts against its uid's and its
// owner's quotas. A pool member (nobody's yet) does not, nor does a
// sandbox being destroyed: its user can no longer use it, and a destroy of
// it has returned (or returns at once), so the user's next create must not
// be refused for it. Both still count against the host's max_sandboxes
// until the backend has removed them: they hold its cgroups, disks and
// uids.
func (r *record) countsForItsUID() bool { return !r.Pooled && r.State != StateDestroying }

// reserve checks quotas and inserts rec, atomically.
func (m *Manager) reserve(rec *record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing {
		return ErrShuttingDown
	}
	if err := m.checkImageTaken(rec); err != nil {
		return err
	}
	var perUID, perOwner, destroying int
	for _, r := range m.boxes {
		if r.State == StateDestroying {
			destroying++
		}
		if !r.countsForItsUID() || r.UID != rec.UID {
			continue
		}
		perUID++
		// Owners are scoped inside a uid: another uid naming the same run
		// neither sees this uid's sandboxes nor spends its quota.
		if rec.Owner != "" && r.Owner == rec.Owner {
			perOwner++
		}
	}
	switch {
	case len(m.boxes) >= m.cfg.MaxPerHost:
		return &QuotaError{Scope: "host", Limit: m.cfg.MaxPerHost, Destroying: destroying}
	case rec.Pooled:
	case perUID >= m.cfg.MaxPerUID:
		return &QuotaError{Scope: "uid", Limit: m.cfg.MaxPerUID}
	case rec.Owner != "" && perOwner >= m.cfg.MaxPerOwner:
		return &QuotaError{Scope: "owner", Limit: m.cfg.MaxPerOwner}
	}
	m.boxes[rec.ID] = rec
	return nil
}
