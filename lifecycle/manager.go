package lifecycle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
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
)

// Config configures a Manager. Zero values take the defaults above; a
// negative IdleTimeout disables it.
type Config struct {
	Backend backend.Backend
	Logger  hclog.Logger
	// ConnGrace is how long a connection-bound sandbox outlives its
	// connection, so a client that reconnects can claim it back by id.
	ConnGrace time.Duration
	// MaxLifetime caps every sandbox's life, whatever its kind.
	MaxLifetime time.Duration
	// DefaultTTL is the life of an owned sandbox created without ttl_s.
	DefaultTTL time.Duration
	// IdleTimeout destroys a sandbox that ran nothing for this long
	// (0 = MaxLifetime, i.e. off).
	IdleTimeout    time.Duration
	ReapInterval   time.Duration
	CreateTimeout  time.Duration
	DestroyTimeout time.Duration
	MaxPerHost     int
	MaxPerUID      int
	MaxPerOwner    int
	MaxCmdsPerHost int
	// Now is the clock (tests may replace it).
	Now func() time.Time
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
)

// Sandbox is a snapshot of one sandbox's record.
type Sandbox struct {
	ID        string
	UID       uint32
	Owner     string
	Holder    string
	Labels    map[string]string
	Workdir   string
	Network   string
	State     State
	CreatedAt time.Time
	ExpiresAt time.Time
	LastUsed  time.Time
	// ConnBound sandboxes die with their connection.
	ConnBound bool
	ConnID    uint64
}

// record is a sandbox's live state; guarded by Manager.mu except where noted.
type record struct {
	Sandbox
	disconnectedAt time.Time     // zero while its connection lives
	cmd            chan struct{} // one command at a time (a 1-slot semaphore)
	running        int           // commands and file ops in progress
}

// Manager owns every sandbox of one daemon.
type Manager struct {
	cfg Config
	be  backend.Backend
	log hclog.Logger

	mu      sync.Mutex
	boxes   map[string]*record
	closing bool

	hostCmds chan struct{} // concurrent commands across the host

	stop     chan struct{}
	reaperWG sync.WaitGroup
	opsWG    sync.WaitGroup // creates and destroys in progress
}

// New returns a manager; call Start to run its reaper.
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
	if cfg.DefaultTTL > cfg.MaxLifetime {
		cfg.DefaultTTL = cfg.MaxLifetime
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	return &Manager{
		cfg:      cfg,
		be:       cfg.Backend,
		log:      cfg.Logger,
		boxes:    map[string]*record{},
		hostCmds: make(chan struct{}, cfg.MaxCmdsPerHost),
		stop:     make(chan struct{}),
	}, nil
}

// Config returns the effective configuration (defaults applied).
func (m *Manager) Config() Config { return m.cfg }

// Backend returns the backend the manager drives.
func (m *Manager) Backend() backend.Backend { return m.be }

// Start runs the reaper until Close.
func (m *Manager) Start() {
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
				m.Reap(context.Background())
			}
		}
	}()
}

// NewID returns a fresh sandbox id: "sc-" and 16 hex digits.
func NewID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return "sc-" + hex.EncodeToString(b[:])
}

// Bounds on what a client may attach to a sandbox.
const (
	MaxOwnerLen  = 512
	MaxLabels    = 16
	MaxLabelKey  = 64
	MaxLabelVal  = 256
	MaxHolderLen = 512
)

func validText(s string, max int) bool {
	return len(s) <= max && utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// Create provisions a sandbox for caller. Quotas are checked and the
// record reserved before the backend is asked, so a refused create leaves
// nothing behind; a failed one is cleaned up before returning.
func (m *Manager) Create(ctx context.Context, c Caller, req CreateRequest) (Sandbox, error) {
	if !validText(req.Owner, MaxOwnerLen) {
		return Sandbox{}, fmt.Errorf("%w: owner must be valid UTF-8 of at most %d bytes", ErrInvalid, MaxOwnerLen)
	}
	if len(req.Labels) > MaxLabels {
		return Sandbox{}, fmt.Errorf("%w: at most %d labels", ErrInvalid, MaxLabels)
	}
	for k, v := range req.Labels {
		if k == "" || !validText(k, MaxLabelKey) || !validText(v, MaxLabelVal) {
			return Sandbox{}, fmt.Errorf("%w: label %q: keys of 1-%d bytes and values of at most %d bytes, UTF-8", ErrInvalid, k, MaxLabelKey, MaxLabelVal)
		}
	}
	if req.TTL < 0 {
		return Sandbox{}, fmt.Errorf("%w: ttl must be positive", ErrInvalid)
	}

	now := m.cfg.Now()
	rec := &record{cmd: make(chan struct{}, 1)}
	rec.ID = NewID()
	rec.UID = c.UID
	rec.Owner = req.Owner
	rec.Labels = cloneMap(req.Labels)
	rec.State = StateCreating
	rec.CreatedAt = now
	rec.LastUsed = now
	rec.ConnBound = req.Owner == "" && req.TTL == 0
	rec.ConnID = c.ConnID
	life := m.cfg.MaxLifetime
	if !rec.ConnBound {
		life = req.TTL
		if life == 0 {
			life = m.cfg.DefaultTTL
		}
		life = min(life, m.cfg.MaxLifetime)
	}
	rec.ExpiresAt = now.Add(life)

	if err := m.reserve(rec); err != nil {
		return Sandbox{}, err
	}
	log := m.log.With("sandbox", rec.ID, "uid", c.UID, "pid", c.PID, "owner", rec.Owner)

	// The backend work is detached from the request: a client that hangs
	// up mid-create must not leave a half-made sandbox, and the cleanup
	// below must run whatever happened to ctx.
	m.opsWG.Add(1)
	defer m.opsWG.Done()
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CreateTimeout)
	defer cancel()
	info, err := m.be.Create(bctx, rec.ID, req.Spec)
	if err != nil {
		log.Warn("create failed", "error", err)
		m.destroyBackend(rec.ID, log)
		m.forget(rec.ID)
		return Sandbox{}, err
	}

	m.mu.Lock()
	rec.Workdir = info.Workdir
	rec.Network = info.Network
	rec.State = StateReady
	closing := m.closing
	snap := rec.snapshot()
	m.mu.Unlock()
	if closing || ctx.Err() != nil {
		// Shutdown began, or the client left, while we were creating:
		// nobody will ever use this sandbox.
		log.Info("destroying sandbox created for a client that is gone")
		m.destroyBackend(rec.ID, log)
		m.forget(rec.ID)
		if closing {
			return Sandbox{}, ErrShuttingDown
		}
		return Sandbox{}, ctx.Err()
	}
	log.Info("sandbox created", "conn_bound", snap.ConnBound, "expires_at", snap.ExpiresAt.Format(time.RFC3339))
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
	case perUID >= m.cfg.MaxPerUID:
		return &QuotaError{Scope: "uid", Limit: m.cfg.MaxPerUID}
	case rec.Owner != "" && perOwner >= m.cfg.MaxPerOwner:
		return &QuotaError{Scope: "owner", Limit: m.cfg.MaxPerOwner}
	}
	m.boxes[rec.ID] = rec
	return nil
}

func (m *Manager) forget(id string) {
	m.mu.Lock()
	delete(m.boxes, id)
	m.mu.Unlock()
}

func (r *record) snapshot() Sandbox {
	s := r.Sandbox
	s.Labels = cloneMap(r.Labels)
	return s
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

// lookup finds a ready sandbox that c may use, and claims a
// connection-bound sandbox back for c's connection if its own connection
// is gone. Another uid's sandbox is ErrNotFound, as if it did not exist.
func (m *Manager) lookup(c Caller, id string) (*record, error) {
	r, ok := m.boxes[id]
	if !ok || r.State != StateReady || r.UID != c.UID {
		return nil, fmt.Errorf("%w: no sandbox %q (destroyed, expired, or never created by this user); create a new one", backend.ErrNotFound, id)
	}
	if r.ConnBound && !r.disconnectedAt.IsZero() && c.ConnID != 0 {
		r.ConnID = c.ConnID
		r.disconnectedAt = time.Time{}
		m.log.Info("connection-bound sandbox claimed by a new connection", "sandbox", id, "conn", c.ConnID)
	}
	return r, nil
}

// use marks the start of an operation on a sandbox; the returned func
// marks its end. It refuses expired sandboxes.
func (m *Manager) use(c Caller, id string) (*record, func(), error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing {
		return nil, nil, ErrShuttingDown
	}
	r, err := m.lookup(c, id)
	if err != nil {
		return nil, nil, err
	}
	now := m.cfg.Now()
	if !now.Before(r.ExpiresAt) {
		return nil, nil, fmt.Errorf("%w: sandbox %q expired at %s; create a new one", backend.ErrNotFound, id, r.ExpiresAt.Format(time.RFC3339))
	}
	r.running++
	r.LastUsed = now
	return r, func() {
		m.mu.Lock()
		r.running--
		r.LastUsed = m.cfg.Now()
		m.mu.Unlock()
	}, nil
}

// Exec runs one command. Commands in one sandbox run one at a time (a
// second waits for the first, bounded by ctx); the budget is cut to what
// is left of the sandbox's life, and AppliedTimeout says so.
func (m *Manager) Exec(ctx context.Context, c Caller, id string, req backend.ExecRequest) (backend.ExecResult, error) {
	r, done, err := m.use(c, id)
	if err != nil {
		return backend.ExecResult{}, err
	}
	defer done()
	select {
	case r.cmd <- struct{}{}:
	case <-ctx.Done():
		return backend.ExecResult{}, ctx.Err()
	}
	defer func() { <-r.cmd }()
	select {
	case m.hostCmds <- struct{}{}:
	default:
		return backend.ExecResult{}, &QuotaError{Scope: "commands_per_host", Limit: m.cfg.MaxCmdsPerHost}
	}
	defer func() { <-m.hostCmds }()

	m.mu.Lock()
	left := r.ExpiresAt.Sub(m.cfg.Now())
	m.mu.Unlock()
	if left < req.Timeout {
		req.Timeout = max(left, time.Millisecond)
	}
	res, err := m.be.Exec(ctx, id, req)
	if err == nil && res.SandboxTerminated {
		// The backend destroyed the sandbox to stop the command: drop it.
		m.mu.Lock()
		delete(m.boxes, id)
		m.mu.Unlock()
	}
	m.mu.Lock()
	_, still := m.boxes[id]
	m.mu.Unlock()
	if err == nil && !still {
		// Destroyed (by the client, the reaper or shutdown) while the
		// command ran.
		res.SandboxTerminated = true
	}
	return res, err
}

// ReadFile reads a file from a sandbox.
func (m *Manager) ReadFile(ctx context.Context, c Caller, id, path string, maxBytes int64) ([]byte, error) {
	_, done, err := m.use(c, id)
	if err != nil {
		return nil, err
	}
	defer done()
	return m.be.ReadFile(ctx, id, path, maxBytes)
}

// WriteFile writes a file into a sandbox.
func (m *Manager) WriteFile(ctx context.Context, c Caller, id, path string, data []byte, mode os.FileMode) error {
	_, done, err := m.use(c, id)
	if err != nil {
		return err
	}
	defer done()
	return m.be.WriteFile(ctx, id, path, data, mode)
}

// ListDirectory lists a directory of a sandbox.
func (m *Manager) ListDirectory(ctx context.Context, c Caller, id, path string, maxEntries int) ([]backend.DirEntry, error) {
	_, done, err := m.use(c, id)
	if err != nil {
		return nil, err
	}
	defer done()
	return m.be.ListDirectory(ctx, id, path, maxEntries)
}

// Destroy destroys a sandbox. It is idempotent: a sandbox that does not
// exist (or belongs to another uid, for a non-admin) is success, and
// reveals nothing. The backend work runs detached from ctx.
func (m *Manager) Destroy(ctx context.Context, c Caller, id string) error {
	m.mu.Lock()
	r, ok := m.boxes[id]
	if !ok || (!c.Admin && r.UID != c.UID) || r.State == StateCreating {
		m.mu.Unlock()
		return nil
	}
	if r.State == StateDestroying {
		m.mu.Unlock()
		return nil
	}
	r.State = StateDestroying
	m.mu.Unlock()
	log := m.log.With("sandbox", id, "uid", c.UID, "pid", c.PID, "owner", r.Owner)
	m.opsWG.Add(1)
	defer m.opsWG.Done()
	if err := m.destroyBackend(id, log); err != nil {
		m.mu.Lock()
		r.State = StateReady // the reaper retries an expired one; the client may retry
		m.mu.Unlock()
		return err
	}
	m.forget(id)
	log.Info("sandbox destroyed", "reason", "client request")
	return nil
}

// destroyBackend asks the backend to destroy id, detached from any request
// and bounded by DestroyTimeout.
func (m *Manager) destroyBackend(id string, log hclog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.DestroyTimeout)
	defer cancel()
	if err := m.be.Destroy(ctx, id); err != nil {
		log.Error("backend failed to destroy sandbox", "error", err)
		return err
	}
	return nil
}

// List returns the sandboxes caller may see (an admin sees all), oldest
// first, optionally only those of one owner.
func (m *Manager) List(c Caller, owner string) []Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Sandbox, 0, len(m.boxes))
	for _, r := range m.boxes {
		if (c.Admin || r.UID == c.UID) && (owner == "" || r.Owner == owner) {
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
}

// Stats returns live counts.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := Stats{Sandboxes: len(m.boxes), Commands: len(m.hostCmds)}
	for _, r := range m.boxes {
		if r.State == StateCreating {
			s.Creating++
		}
	}
	return s
}

// reapReason says why a sandbox must go now, or "" if it may stay. It is a
// pure function of the record and the clock so it can be table-tested.
func reapReason(s Sandbox, disconnectedAt time.Time, running int, now time.Time, connGrace, idle time.Duration) string {
	switch {
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

// Reap destroys every sandbox whose time is up. Failures stay for the next
// round (the backend's destroy is idempotent).
func (m *Manager) Reap(ctx context.Context) int {
	now := m.cfg.Now()
	type victim struct {
		id, reason string
		r          *record
	}
	var victims []victim
	m.mu.Lock()
	for id, r := range m.boxes {
		if why := reapReason(r.Sandbox, r.disconnectedAt, r.running, now, m.cfg.ConnGrace, m.cfg.IdleTimeout); why != "" {
			r.State = StateDestroying
			victims = append(victims, victim{id, why, r})
		}
	}
	m.mu.Unlock()
	n := 0
	for _, v := range victims {
		log := m.log.With("sandbox", v.id, "owner", v.r.Owner, "uid", v.r.UID)
		if err := m.destroyBackend(v.id, log); err != nil {
			m.mu.Lock()
			v.r.State = StateReady
			m.mu.Unlock()
			continue
		}
		m.forget(v.id)
		log.Info("sandbox destroyed", "reason", v.reason)
		n++
	}
	return n
}

// Sweep destroys every sandbox the backend has that this manager does not
// know: what a previous daemon left behind when it died. It runs before the
// daemon serves, and returns how many it removed.
func (m *Manager) Sweep(ctx context.Context) (int, error) {
	ids, err := m.be.List(ctx)
	if err != nil {
		return 0, fmt.Errorf("listing the backend's sandboxes: %w", err)
	}
	n := 0
	var errs []error
	for _, id := range ids {
		m.mu.Lock()
		_, known := m.boxes[id]
		m.mu.Unlock()
		if known {
			continue
		}
		log := m.log.With("sandbox", id)
		if err := m.destroyBackend(id, log); err != nil {
			errs = append(errs, err)
			continue
		}
		log.Info("orphan sandbox swept")
		n++
	}
	return n, errors.Join(errs...)
}

// Close stops the reaper and refuses new work, waits for creates and
// destroys in flight, then destroys every sandbox (until the crash-safe
// journal lands nothing survives a restart, so nothing may outlive the
// daemon either). ctx bounds the whole.
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
	var ids []string
	for id, r := range m.boxes {
		if r.State != StateCreating {
			ids = append(ids, id)
		}
	}
	m.mu.Unlock()
	var errs []error
	for _, id := range ids {
		log := m.log.With("sandbox", id)
		if err := m.destroyBackend(id, log); err != nil {
			errs = append(errs, err)
			continue
		}
		m.forget(id)
		log.Info("sandbox destroyed", "reason", "daemon shutdown")
	}
	return errors.Join(errs...)
}
