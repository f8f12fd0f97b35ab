package lifecycle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// Defaults for Config's zero values.
const (
	DefaultConnGrace      = 10 * time.Second
	DefaultMaxLifetime    = 24 * time.Hour
	DefaultTTL            = time.Hour
	DefaultReapInterval   = 2 * time.Second
	DefaultCreateTimeout  = 2 * time.Minute
	DefaultDestroyTimeout = time.Minute
	DefaultMaxPerHost     = 64
	DefaultMaxPerUID      = 32
	DefaultMaxPerOwner    = 16
	DefaultMaxCmdsPerHost = 32
	// retryBase and retryMax bound the backoff between attempts to
	// destroy a sandbox the backend failed to destroy.
	retryBase = 2 * time.Second
	retryMax  = 5 * time.Minute
)

// Config configures a Manager. Zero values take the defaults above; a
// negative IdleTimeout disables it.
type Config struct {
	Backend backend.Backend
	// Journal makes the manager crash-safe; nil keeps records in memory
	// only (tests, and gc --dry-run).
	Journal *Journal
	Logger  hclog.Logger
	// ConnGrace is how long a connection-bound sandbox outlives its
	// connection, so a client that reconnects can claim it back by id.
	ConnGrace time.Duration
	// MaxLifetime caps every sandbox's life, whatever its kind.
	MaxLifetime time.Duration
	// DefaultTTL is the life of an owned sandbox created without ttl_s.
	DefaultTTL time.Duration
	// IdleTimeout destroys a sandbox that ran nothing for this long
	// (negative: never).
	IdleTimeout    time.Duration
	ReapInterval   time.Duration
	CreateTimeout  time.Duration
	DestroyTimeout time.Duration
	MaxPerHost     int
	MaxPerUID      int
	MaxPerOwner    int
	MaxCmdsPerHost int
	// PoolSize is how many ready sandboxes to keep for creates that a
	// plain sandbox can serve (0: no pool).
	PoolSize int
	// Now is the clock (tests may replace it).
	Now func() time.Time
	// Failpoint, when set, is called at named points of create and destroy
	// (see the failpoint constants) so crash tests can stop the daemon
	// exactly there. Production leaves it nil.
	Failpoint func(name string)
}

// Failpoints: the moments between durable steps where a crash leaves
// distinct state behind.
const (
	FailCreateReserved  = "create-reserved"   // quota taken in memory, nothing written
	FailCreateJournaled = "create-journaled"  // record written, backend not asked
	FailCreateBackend   = "create-backend"    // backend made it, record still "creating"
	FailDestroyJournal  = "destroy-journaled" // marked destroying, backend not asked
	FailDestroyBackend  = "destroy-backend"   // backend destroyed it, record not deleted
	// FailExecTerminated: a command ended with its sandbox, whose destroy
	// is decided but not begun.
	FailExecTerminated = "exec-terminated"
)

func (m *Manager) failpoint(name string) {
	if m.cfg.Failpoint != nil {
		m.cfg.Failpoint(name)
	}
}

// Caller is who asks, as the kernel says.
type Caller struct {
	UID    uint32
	PID    int32
	ConnID uint64
	// Admin callers see and may destroy every sandbox.
	Admin bool
}

// CreateRequest is what a client asks of a new sandbox.
type CreateRequest struct {
	Spec   backend.Spec
	Owner  string
	Labels map[string]string
	// TTL asks for an expiring sandbox; 0 means unstated.
	TTL time.Duration
}

// State of a sandbox.
type State string

const (
	StateCreating   State = "creating"
	StateReady      State = "ready"
	StateDestroying State = "destroying"
	// StatePooled: ready, waiting in the warm pool for a create to claim it.
	StatePooled State = "pooled"
)

// Sandbox is a snapshot of one sandbox's record.
type Sandbox struct {
	ID      string
	UID     uint32
	Owner   string
	Holder  string
	Labels  map[string]string
	Tags    map[string]string
	Workdir string
	Network string
	// NetSpec is the airflow_network tag: the network part of the spec
	// as compact JSON with sorted keys.
	NetSpec   string
	State     State
	CreatedAt time.Time
	ExpiresAt time.Time
	LastUsed  time.Time
	// ConnBound sandboxes die with their connection.
	ConnBound bool
	ConnID    uint64
	// Pooled is set while the sandbox belongs to the warm pool (being
	// made, or waiting to be claimed).
	Pooled bool
	// Env is the spec's environment when the backend did not apply it at
	// create (a sandbox claimed from the pool); Exec adds it.
	Env map[string]string
	// Resources are the limits the create asked for (zero fields: the
	// daemon's defaults). A record of the request only: the backend
	// enforces them and keeps what it needs to go on doing so.
	Resources backend.Resources
	// HostUID is the host uid the sandbox runs as when it is the
	// sandbox's alone (backend.Info.HostUID); 0 when the backend gives
	// none, and in a record journaled before uids were recorded.
	HostUID uint32
}

// record is a sandbox's live state, guarded by Manager.mu; jmu orders its
// journal writes.
type record struct {
	Sandbox
	disconnectedAt time.Time     // zero while its connection lives
	cmd            chan struct{} // one command at a time (a 1-slot semaphore)
	running        int           // commands and file ops in progress
	destroyFails   int           // failed destroy attempts
	claimed        bool          // a destroy is under way (claimForDestroy)
	retryAt        time.Time     // when the reaper retries a failed destroy

	jmu     sync.Mutex
	deleted bool // the journal record is gone; never write it again
}

func newRecord(s Sandbox) *record {
	return &record{Sandbox: s, cmd: make(chan struct{}, 1)}
}

// Manager owns every sandbox of one daemon.
type Manager struct {
	cfg     Config
	be      backend.Backend
	journal *Journal
	log     hclog.Logger

	mu      sync.Mutex
	boxes   map[string]*record
	closing bool

	hostCmds chan struct{} // concurrent commands across the host

	stop     chan struct{}
	reaperWG sync.WaitGroup
	opsWG    sync.WaitGroup // creates and destroys in progress

	recovery RecoveryReport

	poolKick chan struct{} // wakes the pool filler

	reaperTick atomic.Int64 // unix nanos of the reaper's last completed round
}

// New returns a manager; call Recover, then Start.
func New(cfg Config) (*Manager, error) {
	if cfg.Backend == nil {
		return nil, errors.New("lifecycle: no backend")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	defInt := func(n *int, v int) {
		if *n <= 0 {
			*n = v
		}
	}
	def(&cfg.ConnGrace, DefaultConnGrace)
	def(&cfg.MaxLifetime, DefaultMaxLifetime)
	def(&cfg.DefaultTTL, DefaultTTL)
	def(&cfg.ReapInterval, DefaultReapInterval)
	def(&cfg.CreateTimeout, DefaultCreateTimeout)
	def(&cfg.DestroyTimeout, DefaultDestroyTimeout)
	defInt(&cfg.MaxPerHost, DefaultMaxPerHost)
	defInt(&cfg.MaxPerUID, DefaultMaxPerUID)
	defInt(&cfg.MaxPerOwner, DefaultMaxPerOwner)
	defInt(&cfg.MaxCmdsPerHost, DefaultMaxCmdsPerHost)
	cfg.DefaultTTL = min(cfg.DefaultTTL, cfg.MaxLifetime)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	return &Manager{
		cfg:      cfg,
		be:       cfg.Backend,
		journal:  cfg.Journal,
		log:      cfg.Logger,
		boxes:    map[string]*record{},
		hostCmds: make(chan struct{}, cfg.MaxCmdsPerHost),
		stop:     make(chan struct{}),
		poolKick: make(chan struct{}, 1),
	}, nil
}

// Config returns the effective configuration (defaults applied).
func (m *Manager) Config() Config { return m.cfg }

// Backend returns the backend the manager drives.
func (m *Manager) Backend() backend.Backend { return m.be }

// Start runs the reaper until Close.
func (m *Manager) Start() {
	m.reaperTick.Store(time.Now().UnixNano())
	m.reaperWG.Add(1)
	go func() {
		defer m.reaperWG.Done()
		t := time.NewTicker(m.cfg.ReapInterval)
		defer t.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-t.C:
				m.Reap()
				m.reaperTick.Store(time.Now().UnixNano())
			}
		}
	}()
	if m.cfg.PoolSize > 0 {
		m.reaperWG.Add(1)
		go func() {
			defer m.reaperWG.Done()
			m.fillPool()
		}()
	}
}

// ReaperAge says how long ago the reaper last finished a round; a
// watchdog uses it to notice a wedged reaper.
func (m *Manager) ReaperAge() time.Duration {
	return time.Since(time.Unix(0, m.reaperTick.Load()))
}

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
	if sb, ok, err := m.claimPooled(c, req); ok {
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

	if err := m.reserve(rec); err != nil {
		return Sandbox{}, err
	}
	log := m.log.With("sandbox", rec.ID, "peer_uid", c.UID, "peer_pid", c.PID, "owner", rec.Owner)

	m.opsWG.Add(1)
	defer m.opsWG.Done()
	m.failpoint(FailCreateReserved)
	if err := m.persist(rec); err != nil {
		m.forget(rec)
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
	if err := m.persist(rec); err != nil {
		log.Error("journal write failed; destroying the new sandbox", "error", err)
		m.claimAndDestroy(rec, "journal write failed", log)
		return Sandbox{}, fmt.Errorf("%w: %v; check the state directory's disk", ErrJournal, err)
	}
	if closing || ctx.Err() != nil {
		// Shutdown began, or the client left, while we were creating:
		// nobody will ever use this sandbox.
		m.claimAndDestroy(rec, "client gone during create", log)
		if closing {
			return Sandbox{}, ErrShuttingDown
		}
		return Sandbox{}, ctx.Err()
	}
	m.mu.Lock()
	snap := rec.snapshot()
	m.mu.Unlock()
	log.Info("sandbox created", "conn_bound", snap.ConnBound, "expires_at", snap.ExpiresAt.Format(time.RFC3339), "labels", snap.Labels, "host_uid", snap.HostUID)
	return snap, nil
}

// reserve checks quotas and inserts rec, atomically.
func (m *Manager) reserve(rec *record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing {
		return ErrShuttingDown
	}
	var perUID, perOwner int
	for _, r := range m.boxes {
		if r.Pooled {
			continue // the pool's sandboxes count against the host only
		}
		if r.UID == rec.UID {
			perUID++
		}
		if rec.Owner != "" && r.Owner == rec.Owner {
			perOwner++
		}
	}
	switch {
	case len(m.boxes) >= m.cfg.MaxPerHost:
		return &QuotaError{Scope: "host", Limit: m.cfg.MaxPerHost}
	case rec.Pooled:
	case perUID >= m.cfg.MaxPerUID:
		return &QuotaError{Scope: "uid", Limit: m.cfg.MaxPerUID}
	case rec.Owner != "" && perOwner >= m.cfg.MaxPerOwner:
		return &QuotaError{Scope: "owner", Limit: m.cfg.MaxPerOwner}
	}
	m.boxes[rec.ID] = rec
	return nil
}

// persist writes rec's current state to the journal. Writes of one record
// are ordered by rec.jmu and each takes its snapshot under that lock, so
// the last write always carries the newest state; a deleted record is
// never written again.
func (m *Manager) persist(rec *record) error {
	if m.journal == nil {
		return nil
	}
	rec.jmu.Lock()
	defer rec.jmu.Unlock()
	if rec.deleted {
		return nil
	}
	m.mu.Lock()
	jr := rec.journalRecord()
	m.mu.Unlock()
	return m.journal.Put(jr)
}

// unjournal deletes rec's journal record.
func (m *Manager) unjournal(rec *record) error {
	rec.jmu.Lock()
	defer rec.jmu.Unlock()
	rec.deleted = true
	if m.journal == nil {
		return nil
	}
	return m.journal.Delete(rec.ID)
}

// forget drops rec from memory and from the journal.
func (m *Manager) forget(rec *record) {
	m.mu.Lock()
	if m.boxes[rec.ID] == rec {
		delete(m.boxes, rec.ID)
	}
	m.mu.Unlock()
	if err := m.unjournal(rec); err != nil {
		m.log.Error("journal delete failed; the next start will destroy the sandbox again (harmless)", "sandbox", rec.ID, "error", err)
	}
}

func (r *record) snapshot() Sandbox {
	s := r.Sandbox
	s.Labels = cloneMap(r.Labels)
	s.Tags = cloneMap(r.Tags)
	s.Env = cloneMap(r.Env)
	return s
}

func (r *record) journalRecord() journalRecord {
	return journalRecord{
		ID: r.ID, UID: r.UID, Owner: r.Owner, Holder: r.Holder,
		Labels: cloneMap(r.Labels), Tags: cloneMap(r.Tags),
		Network: r.Network, NetSpec: r.NetSpec, Workdir: r.Workdir,
		State: r.State, ConnBound: r.ConnBound, Pooled: r.Pooled, Env: cloneMap(r.Env),
		Resources: journalResources(r.Resources), HostUID: r.HostUID,
		CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt, LastUsed: r.LastUsed,
	}
}

func fromJournal(jr journalRecord) *record {
	return newRecord(Sandbox{
		ID: jr.ID, UID: jr.UID, Owner: jr.Owner, Holder: jr.Holder,
		Labels: jr.Labels, Tags: jr.Tags, Network: jr.Network, NetSpec: jr.NetSpec,
		Workdir: jr.Workdir, State: jr.State, ConnBound: jr.ConnBound, Pooled: jr.Pooled, Env: jr.Env,
		Resources: backend.Resources(jr.Resources), HostUID: jr.HostUID,
		CreatedAt: jr.CreatedAt, ExpiresAt: jr.ExpiresAt, LastUsed: jr.LastUsed,
	})
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// notFound is the one answer for "no such sandbox for you".
func notFound(id string) error {
	return fmt.Errorf("%w: no sandbox %q (destroyed, expired, or never created by this user); create a new one", backend.ErrNotFound, id)
}

// lookup finds a ready sandbox that c may use, and claims a
// connection-bound sandbox back for c's connection if its own connection
// is gone. Another uid's sandbox is not found, as if it did not exist.
// m.mu must be held.
func (m *Manager) lookup(c Caller, id string) (*record, error) {
	if m.closing {
		return nil, ErrShuttingDown
	}
	r, ok := m.boxes[id]
	if !ok || r.State != StateReady || r.UID != c.UID {
		return nil, notFound(id)
	}
	if !m.cfg.Now().Before(r.ExpiresAt) {
		return nil, fmt.Errorf("%w: sandbox %q expired at %s; create a new one", backend.ErrNotFound, id, r.ExpiresAt.Format(time.RFC3339))
	}
	if r.ConnBound && !r.disconnectedAt.IsZero() && m.cfg.Now().Sub(r.disconnectedAt) >= m.cfg.ConnGrace {
		// Its grace is over; the reaper just has not come round yet.
		return nil, notFound(id)
	}
	if r.ConnBound && !r.disconnectedAt.IsZero() && c.ConnID != 0 {
		r.ConnID = c.ConnID
		r.disconnectedAt = time.Time{}
		m.log.Info("connection-bound sandbox claimed by a new connection", "sandbox", id, "conn", c.ConnID)
	}
	return r, nil
}

// use marks the start of an operation on a sandbox; the returned func
// marks its end.
func (m *Manager) use(c Caller, id string) (*record, func(), error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.lookup(c, id)
	if err != nil {
		return nil, nil, err
	}
	r.running++
	r.LastUsed = m.cfg.Now()
	return r, func() {
		m.mu.Lock()
		r.running--
		r.LastUsed = m.cfg.Now()
		m.mu.Unlock()
	}, nil
}

// Describe returns a sandbox's record without any access check, for the
// audit trail.
func (m *Manager) Describe(id string) (Sandbox, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.boxes[id]
	if !ok {
		return Sandbox{}, false
	}
	return r.snapshot(), true
}

// Destroy destroys a sandbox. It is idempotent: a sandbox that does not
// exist (or belongs to another uid, for a non-admin) is success and
// reveals nothing. The backend work runs detached from ctx.
func (m *Manager) Destroy(ctx context.Context, c Caller, id string) error {
	m.mu.Lock()
	if m.closing {
		m.mu.Unlock()
		return ErrShuttingDown
	}
	r, ok := m.boxes[id]
	if !ok || (!c.Admin && (r.UID != c.UID || r.Pooled)) || (r.State != StateReady && r.State != StatePooled) || !m.claimForDestroy(r) {
		m.mu.Unlock()
		// A sandbox still being created is destroyed by its creator's
		// cleanup if needed; one already being destroyed needs nothing.
		return nil
	}
	m.mu.Unlock()
	log := m.log.With("sandbox", id, "peer_uid", c.UID, "peer_pid", c.PID, "owner", r.Owner, "holder", r.Holder)
	return m.destroyNow(r, "client request", log)
}

// claimForDestroy is the only way into StateDestroying: it makes rec's
// destroy the caller's and reports whether it did. Whoever wants a sandbox
// gone (a client, destroy_run, the reaper, shutdown, a command that ended
// with its sandbox, a failed create, recovery) claims it first, under m.mu,
// and only the one that got it calls destroyNow; the others leave it
// alone. A failed destroy gives the claim back, for the reaper's retry.
// m.mu must be held.
func (m *Manager) claimForDestroy(rec *record) bool {
	if rec.claimed {
		return false
	}
	rec.claimed = true
	rec.State = StateDestroying
	return true
}

// claimAndDestroy claims rec and, if that succeeded, destroys it; a
// sandbox someone else is already destroying is left to them.
func (m *Manager) claimAndDestroy(rec *record, reason string, log hclog.Logger) error {
	m.mu.Lock()
	claimed := m.claimForDestroy(rec)
	m.mu.Unlock()
	if !claimed {
		return nil
	}
	return m.destroyNow(rec, reason, log)
}

// destroyNow destroys rec, which the caller claimed (claimForDestroy):
// journal it as destroying, ask the backend (detached, bounded), then
// forget it. On failure the record stays, marked for the reaper to retry
// with backoff.
func (m *Manager) destroyNow(rec *record, reason string, log hclog.Logger) error {
	m.opsWG.Add(1)
	defer m.opsWG.Done()
	if err := m.persist(rec); err != nil {
		log.Error("journal write failed; destroying anyway", "error", err)
	}
	m.failpoint(FailDestroyJournal)
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.DestroyTimeout)
	defer cancel()
	err := m.be.Destroy(ctx, rec.ID)
	m.failpoint(FailDestroyBackend)
	if err != nil {
		m.mu.Lock()
		rec.destroyFails++
		rec.claimed = false // the reaper's to retry
		rec.retryAt = m.cfg.Now().Add(backoff(rec.destroyFails))
		retry := rec.retryAt
		m.mu.Unlock()
		log.Error("backend failed to destroy sandbox; will retry", "reason", reason, "error", err, "attempt", rec.destroyFails, "retry_at", retry.Format(time.RFC3339))
		return err
	}
	m.forget(rec)
	log.Info("sandbox destroyed", "reason", reason)
	return nil
}

// backoff is the wait before destroy attempt n+1.
func backoff(n int) time.Duration {
	d := retryBase
	for i := 1; i < n && d < retryMax; i++ {
		d *= 2
	}
	return min(d, retryMax)
}

// List returns the sandboxes caller may see (an admin sees all), oldest
// first, optionally only those of one owner.
func (m *Manager) List(c Caller, owner string) []Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Sandbox, 0, len(m.boxes))
	for _, r := range m.boxes {
		if (c.Admin || (r.UID == c.UID && !r.Pooled)) && (owner == "" || r.Owner == owner) {
			out = append(out, r.snapshot())
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Disconnected notes that a connection ended: its connection-bound
// sandboxes start their grace period.
func (m *Manager) Disconnected(connID uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.cfg.Now()
	for _, r := range m.boxes {
		if r.ConnBound && r.ConnID == connID && r.disconnectedAt.IsZero() {
			r.disconnectedAt = now
		}
	}
}

// Stats are live counts for health and status lines.
type Stats struct {
	Sandboxes int
	Creating  int
	Commands  int
	// PendingDestroy counts sandboxes whose destroy failed and is being
	// retried.
	PendingDestroy int
	// Pooled counts ready sandboxes waiting in the warm pool.
	Pooled   int
	Recovery RecoveryReport
}

// Stats returns live counts.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := Stats{Sandboxes: len(m.boxes), Commands: len(m.hostCmds), Recovery: m.recovery}
	for _, r := range m.boxes {
		switch {
		case r.State == StateCreating:
			s.Creating++
		case r.State == StateDestroying && r.destroyFails > 0:
			s.PendingDestroy++
		case r.State == StatePooled:
			s.Pooled++
		}
	}
	return s
}

// reapReason says why a sandbox must go now, or "" if it may stay. It is a
// pure function of the record and the clock so it can be table-tested.
func reapReason(s Sandbox, disconnectedAt time.Time, running int, now time.Time, connGrace, idle time.Duration) string {
	switch {
	case s.State == StatePooled && !now.Before(s.ExpiresAt):
		return "pool member expired"
	case s.State != StateReady:
		return ""
	case !now.Before(s.ExpiresAt):
		return "expired"
	case s.ConnBound && !disconnectedAt.IsZero() && now.Sub(disconnectedAt) >= connGrace:
		return "connection closed"
	case idle > 0 && running == 0 && now.Sub(s.LastUsed) >= idle:
		return "idle"
	}
	return ""
}

// Reap destroys every sandbox whose time is up and retries failed
// destroys whose backoff has passed. It returns how many it destroyed.
func (m *Manager) Reap() int {
	now := m.cfg.Now()
	type victim struct {
		r      *record
		reason string
	}
	var victims []victim
	m.mu.Lock()
	for _, r := range m.boxes {
		switch {
		case r.State == StateDestroying && r.destroyFails > 0 && !now.Before(r.retryAt):
			if m.claimForDestroy(r) {
				victims = append(victims, victim{r, "retrying failed destroy"})
			}
		default:
			if why := reapReason(r.Sandbox, r.disconnectedAt, r.running, now, m.cfg.ConnGrace, m.cfg.IdleTimeout); why != "" && m.claimForDestroy(r) {
				victims = append(victims, victim{r, why})
			}
		}
	}
	m.mu.Unlock()
	n := 0
	for _, v := range victims {
		log := m.log.With("sandbox", v.r.ID, "owner", v.r.Owner, "holder", v.r.Holder, "uid", v.r.UID)
		if m.destroyNow(v.r, v.reason, log) == nil {
			n++
		}
	}
	return n
}

// Close stops the reaper, refuses new work, waits (bounded by ctx) for
// creates and destroys in flight, and destroys every connection-bound
// sandbox: their clients cannot outlive the daemon's connections. Expiring
// sandboxes stay, journaled, for the next start to re-adopt; without a
// journal they are destroyed too, since nothing could re-adopt them.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	if m.closing {
		m.mu.Unlock()
		return nil
	}
	m.closing = true
	m.mu.Unlock()
	close(m.stop)
	m.reaperWG.Wait()

	waited := make(chan struct{})
	go func() { m.opsWG.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-ctx.Done():
	}

	m.mu.Lock()
	var victims []*record
	for _, r := range m.boxes {
		if (r.State == StateReady || r.State == StatePooled) && (r.ConnBound || m.journal == nil) && m.claimForDestroy(r) {
			victims = append(victims, r)
		}
	}
	m.mu.Unlock()
	var errs []error
	for _, r := range victims {
		if err := m.destroyNow(r, "daemon shutdown", m.log.With("sandbox", r.ID, "owner", r.Owner)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
