package lifecycle

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"time"

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
	// DefaultMaxProcsPerHost bounds the durable processes running at once
	// on the host; per uid the same share applies as for commands.
	DefaultMaxProcsPerHost = 256
	// A claim's refill of the warm pool waits for the host to have run no
	// command for DefaultPoolRefillQuiet (an agent's commands come back to
	// back, then it thinks), at most DefaultPoolRefillMaxDelay.
	DefaultPoolRefillQuiet    = 50 * time.Millisecond
	DefaultPoolRefillMaxDelay = time.Second
	// The per-uid command limit defaults to this share of the host's
	// (DefaultMaxCmdsPerUID), so that one uid cannot take every command
	// slot while a single-uid host (every Airflow task as one user) loses
	// little.
	defaultCmdsPerUIDNum, defaultCmdsPerUIDDen = 3, 4
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
	// MaxCmdsPerUID caps the commands one uid may run at once (0:
	// DefaultMaxCmdsPerUID of MaxCmdsPerHost); it is never above
	// MaxCmdsPerHost.
	MaxCmdsPerUID int
	// MaxProcsPerHost and MaxProcsPerUID cap the durable processes
	// running at once (0: DefaultMaxProcsPerHost, and the same share of
	// it per uid as for commands). A sandbox's own bound is its backend's.
	MaxProcsPerHost, MaxProcsPerUID int
	// PoolSize is how many ready sandboxes of DefaultImage to keep for
	// creates that a plain sandbox can serve (0: no pool).
	PoolSize int
	// PoolRefillQuiet and PoolRefillMaxDelay: after a create took a pool
	// member, its replacement waits until no command has started or ended
	// for PoolRefillQuiet, at most PoolRefillMaxDelay, unless the pool is
	// then empty (refillDelay).
	PoolRefillQuiet    time.Duration
	PoolRefillMaxDelay time.Duration
	// Images are the images the operator imported (nil: only the
	// built-in backend.HostImage); DefaultImage is the image of a create
	// that names none ("": host); ImagePools is the pool size of other
	// images (an entry for DefaultImage overrides PoolSize).
	Images       Images
	DefaultImage string
	ImagePools   map[string]int
	// Now is the clock (tests may replace it).
	Now func() time.Time
	// Failpoint, when set, is called at named points of create and destroy
	// (see the failpoint constants) so crash tests can stop the daemon
	// exactly there. Production leaves it nil.
	Failpoint func(name string)
	// Observer is told of creates, destroys and commands (metrics); nil:
	// nobody.
	Observer Observer
	// SkipAdopt makes Recover decide and destroy without asking the backend
	// to adopt what it keeps: offline gc, which serves nothing (a disk it
	// mounted would stay on the host).
	SkipAdopt bool
	// DestroyAll makes Recover destroy every sandbox, kept or not (offline
	// `gc --all`: the processes kept sandboxes still run end too).
	DestroyAll bool
	// QuarantineRetryFor bounds how long a quarantined sandbox is retried
	// (default DefaultQuarantineRetryFor); it is then reported failed.
	QuarantineRetryFor time.Duration
	// MaxPaused, when positive, bounds how long a sandbox may stay
	// paused: one paused longer is destroyed by the reaper. Zero: a paused
	// sandbox lives as long as its lease (its TTL, its run, MaxLifetime),
	// as a running one does; the idle timeout never applies to it.
	MaxPaused time.Duration
	// RecoverWithin, when positive, bounds how long Recover takes,
	// counted from when it began, once every sandbox's fate is decided:
	// the kept sandboxes are adopted, and the victims destroyed, in the
	// background, and Recover returns when all is done or the time is up
	// (the daemon serves meanwhile; a use of a sandbox not yet adopted
	// waits for its adopt). Zero adopts and destroys everything before
	// Recover returns (offline gc).
	RecoverWithin time.Duration
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
	// FailRecoveryBackgroundDone: recovery's background adopts and
	// destroys are done; Recover may have returned long before.
	FailRecoveryBackgroundDone = "recovery-background-done"
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
	// Image names the image to run on ("": Config.DefaultImage); Create
	// resolves it into Spec.Image.
	Image  string
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
	// StateQuarantined: kept after a restart, but the backend could not
	// adopt it (its disk still held by a dead daemon's mount, ...): it
	// serves nothing, is retried in the background and is destroyed only
	// when asked or expired. Never journaled: the journal says ready, and
	// the next start tries to adopt it again.
	StateQuarantined State = "quarantined"
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
	// Image is the name of the image the sandbox runs on
	// (backend.HostImage for the built-in), ImageDigest its digest.
	Image       string
	ImageDigest string
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
	// Quarantine says why the backend could not adopt a quarantined
	// sandbox; QuarantineGaveUp that the background retries stopped.
	Quarantine       string
	QuarantineGaveUp bool
	// Paused: a ready sandbox whose processes the backend stopped
	// (pause.go), since PausedAt; MemoryReleased that the backend gave
	// its memory back to the host too.
	Paused         bool
	PausedAt       time.Time
	MemoryReleased bool
}

// record is a sandbox's live state, guarded by Manager.mu; jmu orders its
// journal writes.
type record struct {
	Sandbox
	disconnectedAt time.Time     // zero while its connection lives
	cmd            chan struct{} // one command at a time (a 1-slot semaphore)
	source         string        // SourceCold or SourcePool if this daemon made it ("" if adopted)
	commands       int           // commands started (for the observer's first command)
	running        int           // commands and file ops in progress
	destroyFails   int           // failed destroy attempts
	claimed        bool          // a destroy is under way (claimForDestroy)
	recovering     bool          // a victim of start-up recovery, not yet destroyed: hidden from List
	adopted        chan struct{} // non-nil while recovery's background adopt of it is pending; closed when done
	adoptTaken     bool          // that adopt has begun (in recovery's queue, or for a client that needs it: awaitAdopted)
	retryAt        time.Time     // when the reaper retries a failed destroy
	adoptTries     int           // failed adopts of a quarantined sandbox
	adoptRetryAt   time.Time     // when its next adopt is tried
	quarantinedAt  time.Time
	// warm: a pool member whose backend.Warmer part runs (always, for a
	// backend without one). A member this daemon made is warm before it is
	// pooled; one recovery re-adopted is not until the pool filler warms
	// it (its init died with the previous daemon). warming: the filler is
	// at it.
	warm, warming bool
	// gate orders operations against a pause or resume; pmu (a 1-slot
	// semaphore) lets one pause or resume at a time (pause.go).
	gate pauseGate
	pmu  chan struct{}

	jmu     sync.Mutex
	deleted bool // the journal record is gone; never write it again
}

func newRecord(s Sandbox) *record {
	return &record{Sandbox: s, cmd: make(chan struct{}, 1), pmu: make(chan struct{}, 1)}
}

// Manager owns every sandbox of one daemon.
type Manager struct {
	cfg     Config
	be      backend.Backend
	journal *Journal
	log     hclog.Logger
	obs     Observer

	mu      sync.Mutex
	boxes   map[string]*record
	closing bool

	hostCmds chan struct{}  // concurrent commands across the host
	uidCmds  map[uint32]int // concurrent commands per uid; guarded by mu
	// procs is how many durable processes each sandbox ran when last
	// counted (a start adds one; guarded by mu): an upper bound, since
	// processes end without telling; counted again when a bound is met.
	// Its keys are the sandboxes known to keep process records (0 once
	// they all ended), which ProcessStats reads.
	procs map[string]int

	stop     chan struct{}
	reaperWG sync.WaitGroup
	opsWG    sync.WaitGroup // creates and destroys in progress

	recovery RecoveryReport

	poolKick chan struct{} // wakes the pool filler
	// lastClaim is when a create last took a pool member, of image
	// lastClaimImage; lastCommand when a command last started or ended
	// on the host. The pool filler waits for the host to be quiet after a
	// claim (refillDelay). Guarded by mu.
	lastClaim      time.Time
	lastClaimImage string
	lastCommand    time.Time

	// removingImages are the images an image rm is removing: no create
	// may take them meanwhile. Guarded by mu.
	removingImages map[string]bool

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
	def(&cfg.QuarantineRetryFor, DefaultQuarantineRetryFor)
	def(&cfg.PoolRefillQuiet, DefaultPoolRefillQuiet)
	def(&cfg.PoolRefillMaxDelay, DefaultPoolRefillMaxDelay)
	defInt(&cfg.MaxPerHost, DefaultMaxPerHost)
	defInt(&cfg.MaxPerUID, DefaultMaxPerUID)
	defInt(&cfg.MaxPerOwner, DefaultMaxPerOwner)
	defInt(&cfg.MaxCmdsPerHost, DefaultMaxCmdsPerHost)
	defInt(&cfg.MaxCmdsPerUID, DefaultMaxCmdsPerUID(cfg.MaxCmdsPerHost))
	cfg.MaxCmdsPerUID = min(cfg.MaxCmdsPerUID, cfg.MaxCmdsPerHost)
	defInt(&cfg.MaxProcsPerHost, DefaultMaxProcsPerHost)
	defInt(&cfg.MaxProcsPerUID, DefaultMaxCmdsPerUID(cfg.MaxProcsPerHost))
	cfg.MaxProcsPerUID = min(cfg.MaxProcsPerUID, cfg.MaxProcsPerHost)
	cfg.DefaultTTL = min(cfg.DefaultTTL, cfg.MaxLifetime)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	return &Manager{
		obs:      cfg.Observer,
		cfg:      cfg,
		be:       cfg.Backend,
		journal:  cfg.Journal,
		log:      cfg.Logger,
		boxes:    map[string]*record{},
		hostCmds: make(chan struct{}, cfg.MaxCmdsPerHost),
		uidCmds:  map[uint32]int{},
		procs:    map[string]int{},
		stop:     make(chan struct{}),
		poolKick: make(chan struct{}, 1),

		removingImages: map[string]bool{},
	}, nil
}

// DefaultMaxCmdsPerUID is the per-uid command limit for a host limit of
// perHost: three quarters of it, at least one.
func DefaultMaxCmdsPerUID(perHost int) int {
	return max(1, perHost*defaultCmdsPerUIDNum/defaultCmdsPerUIDDen)
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
	m.reaperWG.Add(1)
	go func() {
		defer m.reaperWG.Done()
		m.retryQuarantined()
	}()
	// What the backend derived from images a crash left removed from the
	// store but not from the backend.
	m.reaperWG.Add(1)
	go func() {
		defer m.reaperWG.Done()
		m.pruneImageState()
	}()
	// Pool members recovery kept beyond what is configured now (a smaller
	// pool, or none, for their image) go.
	m.reaperWG.Add(1)
	go func() {
		defer m.reaperWG.Done()
		m.trimPool()
	}()
	if len(m.poolSizes()) > 0 {
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

// Stats are live counts for health and status lines.
type Stats struct {
	Sandboxes int
	Creating  int
	Commands  int
	// PendingDestroy counts sandboxes whose destroy failed and is being
	// retried.
	PendingDestroy int
	// Pooled counts ready sandboxes waiting in the warm pool.
	Pooled int
	// Paused counts paused sandboxes.
	Paused int
	// Quarantined lists the sandboxes the backend could not adopt.
	Quarantined []Sandbox
	Recovery    RecoveryReport
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
		case r.State == StateReady && r.Paused:
			s.Paused++
		case r.State == StateQuarantined:
			s.Quarantined = append(s.Quarantined, r.snapshot())
		}
	}
	sort.Slice(s.Quarantined, func(i, j int) bool { return s.Quarantined[i].ID < s.Quarantined[j].ID })
	return s
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
	var doomed []string // recovery's victims whose destroy did not run
	for _, r := range m.boxes {
		if r.recovering {
			doomed = append(doomed, r.ID)
			continue
		}
		if (r.State == StateReady || r.State == StatePooled) && (r.ConnBound || m.journal == nil) && m.claimForDestroy(r) {
			victims = append(victims, r)
		}
	}
	m.mu.Unlock()
	if pe, ok := m.be.(backend.ProcessEnder); ok {
		// Their files and records wait for the next start; what they run
		// must not (a kept sandbox's processes outlive the daemon).
		for _, id := range doomed {
			if err := pe.EndProcesses(ctx, id); err != nil {
				m.log.Warn("cannot end the processes of a sandbox recovery doomed", "sandbox", id, "error", err)
			}
		}
	}
	var errs []error
	for _, r := range victims {
		if err := m.destroyNow(r, "daemon shutdown", m.log.With("sandbox", r.ID, "owner", r.Owner)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
