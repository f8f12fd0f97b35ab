package service

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// Defaults for Limits' zero values.
const (
	DefaultMaxOutputBytes     = 4 << 20
	DefaultOutputBytes        = 1 << 20
	DefaultMaxFileBytes       = 8 << 20
	DefaultMaxTimeout         = time.Hour
	DefaultTimeout            = 2 * time.Minute
	DefaultMaxListEntries     = 10000
	DefaultHealthCheckTimeout = 5 * time.Second
)

// Features lists what this daemon speaks beyond version 1 as first
// published; hello reports it, so a client can tell before it asks.
// "create_resources": create takes resources; "images": create takes
// image, and the image ops exist.
var Features = []string{"create_resources", "images"}

// features is what this daemon's hello says it speaks: Features, and
// "processes" (start_command and the ops on durable processes) when its
// backend runs them.
func (s *Service) features() []string {
	out := slices.Clone(Features)
	if _, ok := s.m.Backend().(backend.Processes); ok {
		out = append(out, "processes")
	}
	if _, ok := s.m.Backend().(backend.CodeRunner); ok {
		out = append(out, "code")
	}
	if s.snapshots() {
		out = append(out, "snapshots")
	}
	if s.m.CanPause() {
		out = append(out, "pause")
	}
	return out
}

// Limits bound what one request may ask for.
type Limits struct {
	// MaxOutputBytes caps max_output_bytes (per stream).
	MaxOutputBytes int
	// DefaultOutputBytes applies when a request gives no max_output_bytes.
	DefaultOutputBytes int
	// MaxFileBytes caps read_file's max_bytes and write_file's data.
	MaxFileBytes int64
	// MaxTimeout caps timeout_s; DefaultTimeout applies when none is given.
	MaxTimeout     time.Duration
	DefaultTimeout time.Duration
	MaxListEntries int
	// MaxFrame is the ipc frame limit, reported by hello.
	MaxFrame int
}

func (l *Limits) setDefaults() {
	if l.MaxOutputBytes <= 0 {
		l.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if l.DefaultOutputBytes <= 0 {
		l.DefaultOutputBytes = DefaultOutputBytes
	}
	l.DefaultOutputBytes = min(l.DefaultOutputBytes, l.MaxOutputBytes)
	if l.MaxFileBytes <= 0 {
		l.MaxFileBytes = DefaultMaxFileBytes
	}
	if l.MaxTimeout <= 0 {
		l.MaxTimeout = DefaultMaxTimeout
	}
	if l.DefaultTimeout <= 0 {
		l.DefaultTimeout = DefaultTimeout
	}
	l.DefaultTimeout = min(l.DefaultTimeout, l.MaxTimeout)
	if l.MaxListEntries <= 0 {
		l.MaxListEntries = DefaultMaxListEntries
	}
	if l.MaxFrame <= 0 {
		l.MaxFrame = ipc.DefaultMaxFrame
	}
}

// Config configures a Service.
type Config struct {
	Manager *lifecycle.Manager
	Policy  *Policy
	Limits  Limits
	// Logger receives the audit trail (one line per request) and errors.
	Logger  hclog.Logger
	Version string
	// Node names this host; hello reports it so that a client can tell a
	// handle made on another host (sandboxes live on one host).
	Node string
	// Images imports and removes images (nil: no store; image_import
	// and image_rm are refused). The manager lists and resolves them.
	Images ImageStore
}

// backendHealthTTL is how long one backend health check answers for: a
// check may start a process (bwrap), and health is polled by probes.
const backendHealthTTL = 5 * time.Second

// memoryReportTTL is how long one reading of the memory in force answers
// for: it reads several cgroup files (on cgroup v1 one per sandbox), and
// health is the liveness probe, polled often and served inline.
const memoryReportTTL = time.Second

// Service implements ipc.Handler and ipc.ConnObserver.
type Service struct {
	m       *lifecycle.Manager
	policy  *Policy
	lim     Limits
	log     hclog.Logger
	version string
	node    string
	started time.Time

	healthMu    sync.Mutex // held by the one caller refreshing the check
	healthCache atomic.Pointer[backendHealth]
	memoryCache atomic.Pointer[memoryReading] // health's memory section, read-only once stored

	// limits is the backend's LimitsInForce, read once at New (it does not
	// change while the daemon runs) and shared, read-only, by every health.
	limits map[string]string
	// backendInfo is the backend's Describe, fixed at start; shared
	// read-only like limits.
	backendInfo map[string]string

	images ImageStore
	up     uploads // the streamed imports in progress
	ex     exports // the image exports in progress
}

type backendHealth struct {
	err error
	at  time.Time
}

type memoryReading struct {
	report *api.MemoryReport // nil: the backend reports none
	at     time.Time
}

// New returns a Service.
func New(cfg Config) *Service {
	cfg.Limits.setDefaults()
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Policy == nil {
		cfg.Policy = &Policy{}
	}
	s := &Service{m: cfg.Manager, policy: cfg.Policy, lim: cfg.Limits, log: cfg.Logger, version: cfg.Version, node: cfg.Node, started: time.Now(),
		images: cfg.Images}
	if lr, ok := cfg.Manager.Backend().(backend.LimitReporter); ok {
		s.limits = maps.Clone(lr.LimitsInForce())
	}
	if d, ok := cfg.Manager.Backend().(backend.Describer); ok {
		s.backendInfo = maps.Clone(d.Describe())
	}
	return s
}

// Limits returns the effective limits.
func (s *Service) Limits() Limits { return s.lim }

// Disconnected implements ipc.ConnObserver.
func (s *Service) Disconnected(peer *ipc.Peer) {
	s.abortUploadsOf(peer.ConnID)
	s.endExportsOf(peer.ConnID)
	s.m.Disconnected(peer.ConnID)
}

// audit carries what one request's audit line says.
type audit struct {
	m  *lifecycle.Manager
	kv []any
}

func (a *audit) add(kv ...any) { a.kv = append(a.kv, kv...) }

// sandbox notes the sandbox a request is about, with its owner, holder and
// labels as they are before the op (a destroy removes them).
func (a *audit) sandbox(id string) {
	a.add("sandbox", id)
	if sb, ok := a.m.Describe(id); ok {
		a.add("owner", sb.Owner, "holder", sb.Holder, "labels", sb.Labels, "sandbox_uid", sb.UID)
	}
}

// Handle implements ipc.Handler.
func (s *Service) Handle(ctx context.Context, peer *ipc.Peer, req *ipc.Request) (any, error) {
	start := time.Now()
	c := lifecycle.Caller{UID: peer.UID, PID: peer.PID, ConnID: peer.ConnID, Admin: s.policy.IsAdmin(peer)}
	a := &audit{m: s.m}
	result, err := s.dispatch(ctx, c, peer, req, a)
	var e *ipc.Error
	if err != nil {
		e = s.toWire(err)
	}
	kv := append([]any{"op", req.Op, "id", req.ID, "peer_uid", peer.UID, "peer_pid", peer.PID, "conn", peer.ConnID,
		"duration_ms", float64(time.Since(start).Microseconds()) / 1000}, a.kv...)
	logAudit := s.log.Info
	switch {
	case e == nil:
		if req.Op == ipc.OpHealth || req.Op == ipc.OpHello {
			logAudit = nil
		}
	case e.Code == ipc.CodeInternal:
		kv, logAudit = append(kv, "code", e.Code, "error", err.Error()), s.log.Error
	default:
		kv = append(kv, "code", e.Code, "refused", e.Message)
	}
	if logAudit != nil {
		// Written once the response is: the client does not wait for it.
		req.AfterResponse(func() { logAudit("audit", kv...) })
	}
	if e != nil {
		return nil, e
	}
	return result, nil
}

func (s *Service) dispatch(ctx context.Context, c lifecycle.Caller, peer *ipc.Peer, req *ipc.Request, a *audit) (any, error) {
	args := &req.Args
	switch req.Op {
	case ipc.OpHello:
		return with(args, func(r api.HelloRequest) (any, error) { return s.hello(c, peer, r) })
	case ipc.OpHealth:
		return with(args, func(api.NoArgs) (any, error) { return s.healthFor(ctx, c), nil })
	case ipc.OpCreate:
		return with(args, func(r api.CreateRequest) (any, error) { return s.create(ctx, c, r, a) })
	case ipc.OpRunCommand:
		return with(args, func(r api.RunCommandRequest) (any, error) { return s.runCommand(ctx, c, req, r, a) })
	case ipc.OpReadFile:
		return with(args, func(r api.ReadFileRequest) (any, error) { return s.readFile(ctx, c, req, r, a) })
	case ipc.OpWriteFile:
		return with(args, func(r api.WriteFileRequest) (any, error) { return s.writeFile(ctx, c, r, a) })
	case ipc.OpListDirectory:
		return with(args, func(r api.ListDirectoryRequest) (any, error) { return s.listDirectory(ctx, c, req, r, a) })
	case ipc.OpDestroy:
		return with(args, func(r api.SandboxRequest) (any, error) {
			a.sandbox(r.Sandbox)
			return api.DestroyResult{}, s.m.Destroy(ctx, c, r.Sandbox)
		})
	case ipc.OpList:
		return with(args, func(r api.ListRequest) (any, error) { return s.list(c, r), nil })
	case ipc.OpRenew:
		return with(args, func(r api.RenewRequest) (any, error) { return s.renew(ctx, c, r, a) })
	case ipc.OpAttach:
		return with(args, func(r api.AttachRequest) (any, error) { return s.attach(ctx, c, r, a) })
	case ipc.OpRelease:
		return with(args, func(r api.ReleaseRequest) (any, error) { return s.release(ctx, c, r, a) })
	case ipc.OpReadTags:
		return with(args, func(r api.SandboxRequest) (any, error) { return s.readTags(ctx, c, r, a) })
	case ipc.OpWriteTags:
		return with(args, func(r api.WriteTagsRequest) (any, error) { return s.writeTags(ctx, c, r, a) })
	case ipc.OpDestroyRun:
		return with(args, func(r api.DestroyRunRequest) (any, error) { return s.destroyRun(ctx, c, r, a) })
	case ipc.OpGC:
		return with(args, func(r api.GCRequest) (any, error) { return s.gc(ctx, c, r, a) })
	case ipc.OpImageLs:
		return with(args, func(api.NoArgs) (any, error) { return s.imageLs() })
	case ipc.OpImageInspect:
		return with(args, func(r api.ImageRequest) (any, error) { return s.imageInspect(r, a) })
	case ipc.OpImageRm:
		return with(args, func(r api.ImageRequest) (any, error) { return s.imageRm(c, r, a) })
	case ipc.OpImageImportBegin:
		return with(args, func(r api.ImageImportBeginRequest) (any, error) { return s.imageImportBegin(c, peer, r, a) })
	case ipc.OpImageImportData:
		return with(args, func(r api.ImageImportDataRequest) (any, error) { return s.imageImportData(ctx, c, peer, r) })
	case ipc.OpImageImportEnd:
		return with(args, func(r api.ImageImportEndRequest) (any, error) { return s.imageImportEnd(ctx, c, peer, r, a) })
	case ipc.OpStartCommand:
		return with(args, func(r api.StartCommandRequest) (any, error) { return s.startCommand(ctx, c, r, a) })
	case ipc.OpReadOutput:
		return with(args, func(r api.ReadOutputRequest) (any, error) { return s.readOutput(ctx, c, req, r, a) })
	case ipc.OpWaitProcess:
		return with(args, func(r api.WaitProcessRequest) (any, error) { return s.waitProcess(ctx, c, r, a) })
	case ipc.OpSignalProcess:
		return with(args, func(r api.SignalProcessRequest) (any, error) { return s.signalProcess(ctx, c, r, a) })
	case ipc.OpListProcesses:
		return with(args, func(r api.SandboxRequest) (any, error) { return s.listProcesses(ctx, c, r, a) })
	case ipc.OpRunCode:
		return with(args, func(r api.RunCodeRequest) (any, error) { return s.runCode(ctx, c, req, r, a) })
	case ipc.OpListContexts:
		return with(args, func(r api.SandboxRequest) (any, error) { return s.listContexts(ctx, c, r, a) })
	case ipc.OpDeleteContext:
		return with(args, func(r api.ContextRequest) (any, error) { return s.endContext(ctx, c, r, a, s.m.DeleteContext) })
	case ipc.OpRestartContext:
		return with(args, func(r api.ContextRequest) (any, error) { return s.endContext(ctx, c, r, a, s.m.RestartContext) })
	case ipc.OpPause:
		return with(args, func(r api.SandboxRequest) (any, error) { return s.pause(ctx, c, r, a) })
	case ipc.OpResume:
		return with(args, func(r api.SandboxRequest) (any, error) { return s.resume(ctx, c, r, a) })
	}
	if res, err, ok := s.dispatchSnapshots(ctx, c, peer, req, a); ok {
		return res, err
	}
	return nil, ipc.Errorf(ipc.CodeUnknownOp, "unknown op %q; see docs/protocol.md for the ops this daemon speaks", req.Op)
}

// with decodes a request's arguments into its ipc/api type, once, and
// hands it to the op's handler; a request that does not decode is refused
// with Decode's bad_request before the handler sees it.
func with[R any](args *ipc.Args, handle func(R) (any, error)) (any, error) {
	var r R
	if err := ipc.Decode(args, &r); err != nil {
		return nil, err
	}
	return handle(r)
}

func (s *Service) hello(c lifecycle.Caller, peer *ipc.Peer, r api.HelloRequest) (any, error) {
	if r.Versions != nil && !slices.Contains(r.Versions, ipc.ProtocolVersion) {
		return nil, ipc.Errorf(ipc.CodeUnsupported, "none of the offered protocol versions %v is spoken here; this daemon speaks version %d", r.Versions, ipc.ProtocolVersion).
			With("versions", []int{ipc.ProtocolVersion})
	}
	return api.HelloResult{
		Version:       ipc.ProtocolVersion,
		ServerVersion: s.version,
		Backend:       s.m.Backend().Name(),
		Node:          s.node,
		Admin:         c.Admin,
		Features:      s.features(),
		Peer:          api.Peer{UID: peer.UID, GID: peer.GID, PID: peer.PID},
		Limits: api.HelloLimits{
			MaxFrameBytes:      s.lim.MaxFrame,
			MaxOutputBytes:     s.lim.MaxOutputBytes,
			DefaultOutputBytes: s.lim.DefaultOutputBytes,
			MaxFileBytes:       s.lim.MaxFileBytes,
			MaxTimeoutS:        s.lim.MaxTimeout.Seconds(),
			DefaultTimeoutS:    s.lim.DefaultTimeout.Seconds(),
			MaxListEntries:     s.lim.MaxListEntries,
		},
		Images:       s.m.ImageNames(),
		DefaultImage: s.m.DefaultImage(),
	}, nil
}

// HealthReport is the health op's result.
type HealthReport = api.HealthResult

// memoryReport is the backend's memory bound, if it has one, as read at
// most memoryReportTTL ago. Callers share the report: never modify it.
func (s *Service) memoryReport() *api.MemoryReport {
	if c := s.memoryCache.Load(); c != nil && time.Since(c.at) < memoryReportTTL {
		return c.report
	}
	r := s.readMemory()
	s.memoryCache.Store(&memoryReading{report: r, at: time.Now()})
	return r
}

// readMemory reads the backend's memory bound now.
func (s *Service) readMemory() *api.MemoryReport {
	mr, ok := s.m.Backend().(backend.MemoryReporter)
	if !ok {
		return nil
	}
	hm, err := mr.MemoryInForce()
	if err != nil {
		return nil
	}
	r := &api.MemoryReport{HostBytes: hm.HostBytes, LimitBytes: hm.LimitBytes, UsedBytes: hm.UsedBytes,
		PerSandboxBytes: hm.PerSandboxBytes, MaxSandboxes: s.m.Config().MaxPerHost}
	if hm.PerSandboxBytes > 0 {
		room := hm.LimitBytes
		if room == 0 || (hm.HostBytes > 0 && hm.HostBytes < room) {
			room = hm.HostBytes
		}
		r.FitsSandboxes = room / hm.PerSandboxBytes
	}
	return r
}

// RecoveryReport is what start-up recovery did, as health reports it.
type RecoveryReport = api.RecoveryReport

// Health checks the backend and reports live counts.
func (s *Service) Health(ctx context.Context) HealthReport {
	st := s.m.Stats()
	r := HealthReport{Status: "ok", Version: s.version, Backend: s.m.Backend().Name(),
		Sandboxes: st.Sandboxes, Commands: st.Commands, UptimeSeconds: time.Since(s.started).Seconds(),
		PendingDestroy: st.PendingDestroy, Pooled: st.Pooled, Paused: st.Paused,
		Recovery: RecoveryReport{Adopted: st.Recovery.Adopted, Destroyed: st.Recovery.Destroyed, Swept: st.Recovery.Swept,
			Failed: st.Recovery.Failed, AdoptFailed: st.Recovery.AdoptFailed, Pending: st.Recovery.Pending, MovedAside: st.Recovery.MovedAside, DurationS: st.Recovery.Duration.Seconds()},
		Limits: s.limits, BackendInfo: s.backendInfo, Memory: s.memoryReport(), Images: s.m.ImageNames()}
	if err := s.backendHealth(ctx); err != nil {
		r.Status = "degraded"
		r.BackendError = err.Error()
	}
	if st.PendingDestroy > 0 {
		// Sandboxes the backend failed to destroy are still alive: an
		// operator should look.
		r.Status = "degraded"
	}
	for _, q := range st.Quarantined {
		r.Quarantined = append(r.Quarantined, api.QuarantinedSandbox{Sandbox: q.ID, UID: q.UID, Owner: q.Owner, Reason: q.Quarantine, GaveUp: q.QuarantineGaveUp})
		r.Status = "degraded"
	}
	if pr, ok := s.m.Backend().(backend.ProblemReporter); ok {
		problems := pr.Problems()
		for _, id := range slices.Sorted(maps.Keys(problems)) {
			r.Damaged = append(r.Damaged, api.DamagedSandbox{Sandbox: id, Problem: problems[id]})
			r.Status = "degraded"
		}
	}
	return r
}

// healthFor is Health as caller c may see it: the quarantined and damaged
// sandboxes of other uids are left out for a non-admin (their status still
// counts), as every op hides another uid's sandboxes.
func (s *Service) healthFor(ctx context.Context, c lifecycle.Caller) HealthReport {
	r := s.Health(ctx)
	if c.Admin {
		return r
	}
	var q []api.QuarantinedSandbox
	for _, x := range r.Quarantined {
		if x.UID == c.UID {
			q = append(q, x)
		}
	}
	var d []api.DamagedSandbox
	for _, x := range r.Damaged {
		if sb, ok := s.m.Describe(x.Sandbox); ok && sb.UID == c.UID {
			d = append(d, x)
		}
	}
	r.Quarantined, r.Damaged = q, d
	return r
}

// backendHealth returns the backend's health, checking it at most once per
// backendHealthTTL; while one caller refreshes a stale result the others
// get the previous one rather than queueing behind the check.
func (s *Service) backendHealth(ctx context.Context) error {
	cached := s.healthCache.Load()
	if cached != nil && time.Since(cached.at) < backendHealthTTL {
		return cached.err
	}
	if cached != nil {
		// Stale: refresh in the background and answer with what we have,
		// so health never waits for a backend check.
		if s.healthMu.TryLock() {
			go func() {
				defer s.healthMu.Unlock()
				s.checkBackend(context.WithoutCancel(ctx))
			}()
		}
		return cached.err
	}
	s.healthMu.Lock() // nobody has a result yet: wait for the first
	defer s.healthMu.Unlock()
	if c := s.healthCache.Load(); c != nil && c != cached && time.Since(c.at) < backendHealthTTL {
		return c.err
	}
	return s.checkBackend(ctx)
}

// checkBackend runs the backend's health check and caches its result.
func (s *Service) checkBackend(ctx context.Context) error {
	hctx, cancel := context.WithTimeout(ctx, DefaultHealthCheckTimeout)
	defer cancel()
	err := s.m.Backend().Health(hctx)
	s.healthCache.Store(&backendHealth{err: err, at: time.Now()})
	return err
}

// Inline implements ipc.Inliner: hello and health never block (health
// answers from a cached backend check), so they are served on the
// connection's reader goroutine.
func (s *Service) Inline(op string) bool {
	if op != ipc.OpHello && op != ipc.OpHealth {
		return false
	}
	// The very first health waits for a backend check: not inline.
	return op == ipc.OpHello || s.healthCache.Load() != nil
}

// InlineUntilRelease implements ipc.ReleaseInliner: a run_command that
// does not ask about streaming its output starts on the connection's
// reader goroutine when the backend's Exec releases the connection before
// it waits (backend.InlineExecer); nothing before Exec on its path waits,
// but for room in the response budget, which releases it too
// (ipc.ReserveResponse).
func (s *Service) InlineUntilRelease(req *ipc.Request) bool {
	return req.Op == ipc.OpRunCommand && !req.Args.Has("stream") && s.m.InlineExec()
}

func (s *Service) create(ctx context.Context, c lifecycle.Caller, r api.CreateRequest, a *audit) (any, error) {
	var req lifecycle.CreateRequest
	if sp := r.Spec; sp != nil {
		req.Spec.Env = sp.Env
		req.Spec.BlockNetwork = sp.BlockNetwork
		req.Spec.AllowEgressTo = sp.AllowEgressTo
		req.Spec.AllowEgressToCIDRs = sp.AllowEgressToCIDRs
		req.Owner = sp.Owner
	}
	req.Image = r.Image
	if res := r.Resources; res != nil {
		req.Spec.Resources = backend.Resources{MemoryBytes: res.MemoryBytes, CPUs: res.CPUs, PIDs: res.PIDs, DiskBytes: res.DiskBytes}
	}
	req.Labels = r.Labels
	req.TTL = seconds(r.TTLS)
	a.add("owner", req.Owner, "labels", req.Labels, "image", req.Image)
	if res := req.Spec.Resources; !res.IsZero() {
		a.add("resources", resourcesMap(res))
	}
	sb, err := s.m.Create(ctx, c, req)
	if err != nil {
		return nil, err
	}
	a.add("sandbox", sb.ID, "conn_bound", sb.ConnBound)
	return api.CreateResult{
		Sandbox:   sb.ID,
		Workdir:   sb.Workdir,
		Network:   sb.Network,
		ExpiresAt: unixSeconds(sb.ExpiresAt),
		ConnBound: sb.ConnBound,
		Image:     sb.Image,
	}, nil
}

// resourcesMap is resources in the audit trail (api.Resources on the wire): the
// keys asked for, without the zero ones.
func resourcesMap(r backend.Resources) map[string]any {
	m := map[string]any{}
	if r.MemoryBytes != 0 {
		m["memory_bytes"] = r.MemoryBytes
	}
	if r.CPUs != 0 {
		m["cpus"] = r.CPUs
	}
	if r.PIDs != 0 {
		m["pids"] = r.PIDs
	}
	if r.DiskBytes != 0 {
		m["disk_bytes"] = r.DiskBytes
	}
	return m
}

// execRequest is the backend's request for a command as run_command
// asks for it: exactly one of command and argv; timeout_s and
// max_output_bytes within the daemon's limits, their defaults when left
// out.
func (s *Service) execRequest(command string, argv []string, env map[string]string, cwd string, stdin []byte, timeoutS float64, maxOut *int) (backend.ExecRequest, error) {
	req := backend.ExecRequest{Command: command, Argv: argv, Env: env, Cwd: cwd, Stdin: stdin}
	switch {
	case command != "" && argv != nil:
		return req, ipc.Errorf(ipc.CodeBadRequest, `give either "command" or "argv", not both`)
	case command == "" && argv == nil:
		return req, ipc.Errorf(ipc.CodeBadRequest, `argument "command" (a shell string) or "argv" (a list of strings) is required`)
	}
	timeout := s.lim.DefaultTimeout
	if timeoutS > 0 {
		timeout = seconds(timeoutS)
	}
	req.Timeout = min(timeout, s.lim.MaxTimeout)
	req.MaxOutputBytes = min(deref(maxOut, s.lim.DefaultOutputBytes), s.lim.MaxOutputBytes)
	return req, nil
}

func (s *Service) runCommand(ctx context.Context, c lifecycle.Caller, r *ipc.Request, w api.RunCommandRequest, a *audit) (any, error) {
	id := w.Sandbox
	req, err := s.execRequest(w.Command, w.Argv, w.Env, w.Cwd, w.Stdin, w.TimeoutS, w.MaxOutputBytes)
	if err != nil {
		return nil, err
	}
	send := ipc.Events(ctx)
	if w.Stream && send == nil {
		return nil, ipc.Errorf(ipc.CodeBadRequest, `"stream" needs a connection that can carry events`)
	}
	if err := r.ReserveResponse(ctx, runCommandReservation(req.MaxOutputBytes)); err != nil {
		return nil, err
	}

	cmdText := req.Command
	if cmdText == "" {
		cmdText = fmt.Sprintf("%q", req.Argv)
	}
	a.sandbox(id)
	a.add("command", truncateRunes(cmdText, 200))
	var out *outputStream
	if w.Stream {
		// The window is response memory too: reserved like the output.
		if err := r.ReserveResponse(ctx, streamWindowBytes); err != nil {
			return nil, err
		}
		out = startStream(ctx, send)
		req.Output = out.output
	}
	res, err := s.m.Exec(ctx, c, id, req)
	var dropOut, dropErr int64
	if out != nil {
		dropOut, dropErr = out.finish()
		a.add("stream_dropped_bytes", dropOut+dropErr)
	}
	if err != nil {
		return nil, err
	}
	a.add("exit_code", res.ExitCode, "reason", res.Reason(), "timed_out", res.TimedOut, "sandbox_terminated", res.SandboxTerminated,
		"oom_killed", res.OOMKilled, "oom_kills", res.OOMKills, "command_duration_ms", res.Duration.Milliseconds())
	result := api.RunCommandResult{
		ExitCode:          res.ExitCode,
		Stdout:            nonNil(res.Stdout),
		Stderr:            nonNil(res.Stderr),
		TimedOut:          res.TimedOut,
		StdoutTruncated:   res.StdoutTruncated,
		StderrTruncated:   res.StderrTruncated,
		SandboxTerminated: res.SandboxTerminated,
		OOMKilled:         res.OOMKilled,
		OOMKills:          res.OOMKills,
		Reason:            res.Reason(),
		AppliedTimeoutS:   res.AppliedTimeout.Seconds(),
		DurationS:         res.Duration.Seconds(),
	}
	if out != nil {
		result.StdoutStreamDropped, result.StderrStreamDropped = &dropOut, &dropErr
	}
	return result, nil
}

func (s *Service) readFile(ctx context.Context, c lifecycle.Caller, req *ipc.Request, r api.ReadFileRequest, a *audit) (any, error) {
	id, path := r.Sandbox, r.Path
	ranged := r.Offset != nil || r.Length != nil
	if ranged && r.MaxBytes != nil {
		return nil, ipc.Errorf(ipc.CodeBadRequest, "max_bytes bounds a whole read and offset/length a ranged one; give one or the other")
	}
	maxBytes, offset, length := deref(r.MaxBytes, s.lim.MaxFileBytes), deref(r.Offset, 0), deref(r.Length, s.lim.MaxFileBytes)
	a.sandbox(id)
	a.add("path", truncateRunes(path, 200))
	if ranged {
		// One piece of a file of any size: at most max_file_bytes, so a
		// response fits a frame and the daemon holds one piece at a time.
		length = min(length, s.lim.MaxFileBytes)
		if err := req.ReserveResponse(ctx, readFileReservation(length)); err != nil {
			return nil, err
		}
		a.add("offset", offset, "length", length)
		data, size, err := s.m.ReadFileRange(ctx, c, id, path, offset, length)
		if err != nil {
			return nil, err
		}
		a.add("bytes", len(data))
		eof := offset+int64(len(data)) >= size
		return api.ReadFileResult{Data: nonNil(data), SizeBytes: size, Offset: &offset, EOF: &eof}, nil
	}
	maxBytes = min(maxBytes, s.lim.MaxFileBytes)
	if err := req.ReserveResponse(ctx, readFileReservation(maxBytes)); err != nil {
		return nil, err
	}
	data, err := s.m.ReadFile(ctx, c, id, path, maxBytes)
	if err != nil {
		return nil, err
	}
	a.add("bytes", len(data))
	return api.ReadFileResult{Data: nonNil(data), SizeBytes: int64(len(data))}, nil
}

func (s *Service) writeFile(ctx context.Context, c lifecycle.Caller, r api.WriteFileRequest, a *audit) (any, error) {
	id, path, data := r.Sandbox, r.Path, r.Data
	ranged := r.Append || r.Offset != nil
	switch {
	case r.Append && r.Offset != nil:
		return nil, ipc.Errorf(ipc.CodeBadRequest, "append writes at the end and offset at a given place; give one or the other")
	case ranged && r.Mode != nil:
		return nil, ipc.Errorf(ipc.CodeBadRequest, "mode applies to a whole write_file that makes the file; a write with append or offset keeps the file's mode")
	}
	mode, offset := deref(r.Mode, 0o644), deref(r.Offset, -1)
	if int64(len(data)) > s.lim.MaxFileBytes {
		return nil, ipc.Errorf(ipc.CodeFileTooLarge, "%d bytes is more than the %d this daemon accepts in one write_file", len(data), s.lim.MaxFileBytes).
			With("size_bytes", len(data)).With("max_bytes", s.lim.MaxFileBytes)
	}
	a.sandbox(id)
	a.add("path", truncateRunes(path, 200), "bytes", len(data))
	if ranged {
		a.add("offset", offset)
		size, err := s.m.WriteFileAt(ctx, c, id, path, data, offset)
		if err != nil {
			return nil, err
		}
		return api.WriteFileResult{BytesWritten: len(data), SizeBytes: size}, nil
	}
	if err := s.m.WriteFile(ctx, c, id, path, data, os.FileMode(mode)); err != nil {
		return nil, err
	}
	return api.WriteFileResult{BytesWritten: len(data)}, nil
}

func (s *Service) listDirectory(ctx context.Context, c lifecycle.Caller, req *ipc.Request, r api.ListDirectoryRequest, a *audit) (any, error) {
	id, path := r.Sandbox, r.Path
	if err := req.ReserveResponse(ctx, listDirectoryReservation(s.lim.MaxListEntries)); err != nil {
		return nil, err
	}
	a.sandbox(id)
	a.add("path", truncateRunes(path, 200))
	entries, err := s.m.ListDirectory(ctx, c, id, path, s.lim.MaxListEntries)
	if err != nil {
		return nil, err
	}
	out := make([]api.DirEntry, len(entries))
	for i, e := range entries {
		// api.Name sends a name that is not UTF-8 as bytes, so that a
		// strict msgpack decoder does not choke on it.
		out[i] = api.DirEntry{Name: api.Name(e.Name), IsDir: e.IsDir}
	}
	return api.ListDirectoryResult{Entries: out}, nil
}

func (s *Service) list(c lifecycle.Caller, r api.ListRequest) api.ListResult {
	owner := r.Owner
	now := time.Now()
	boxes := s.m.List(c, owner)
	out := make([]api.SandboxInfo, len(boxes))
	for i, b := range boxes {
		r := b.Resources
		out[i] = api.SandboxInfo{
			Sandbox:    b.ID,
			UID:        b.UID,
			Owner:      b.Owner,
			Holder:     b.Holder,
			Labels:     nonNilMap(b.Labels),
			State:      wireState(b),
			Workdir:    b.Workdir,
			Network:    b.Network,
			ConnBound:  b.ConnBound,
			CreatedAt:  unixSeconds(b.CreatedAt),
			ExpiresAt:  unixSeconds(b.ExpiresAt),
			LastUsed:   unixSeconds(b.LastUsed),
			RemainingS: max(b.ExpiresAt.Sub(now).Seconds(), 0),
			Tags:       b.TagMap(),
			Resources:  api.Resources{MemoryBytes: r.MemoryBytes, CPUs: r.CPUs, PIDs: r.PIDs, DiskBytes: r.DiskBytes},
			Image:      b.Image,
		}
		if b.State == lifecycle.StateQuarantined {
			out[i].Quarantine = b.Quarantine
		}
		if b.Paused {
			out[i].PausedAt = unixSeconds(b.PausedAt)
		}
	}
	return api.ListResult{Sandboxes: out}
}

// toWire maps a domain error to its stable code.
func (s *Service) toWire(err error) *ipc.Error {
	var we *ipc.Error
	if errors.As(err, &we) {
		return we
	}
	var tooLarge *backend.FileTooLargeError
	if errors.As(err, &tooLarge) {
		return ipc.Errorf(ipc.CodeFileTooLarge, "%v; read less (max_bytes) or use run_command to look at part of it", err).
			With("size_bytes", tooLarge.Size).With("max_bytes", tooLarge.MaxBytes)
	}
	var quota *lifecycle.QuotaError
	if errors.As(err, &quota) {
		we := ipc.Errorf(ipc.CodeQuotaExceeded, "%v; destroy sandboxes you no longer need, or ask the operator to raise the limit", err).
			With("limit", quota.Limit).With("scope", quota.Scope)
		if quota.Scope == "host" {
			we = we.With("destroying", quota.Destroying)
		}
		return we
	}
	var mismatch *lifecycle.OwnerMismatchError
	if errors.As(err, &mismatch) {
		return ipc.Errorf(ipc.CodeOwnerMismatch, "%v", err).With("owner", mismatch.Owner)
	}
	var held *lifecycle.HeldByOtherError
	if errors.As(err, &held) {
		return ipc.Errorf(ipc.CodeHeldByOther, "%v", err).With("holder", held.Holder)
	}
	var noImage *backend.ImageNotFoundError
	if errors.As(err, &noImage) {
		return ipc.Errorf(ipc.CodeImageNotFound, "%v", err).With("images", noImage.Known)
	}
	var ctxQuota *backend.ContextQuotaError
	if errors.As(err, &ctxQuota) {
		return ipc.Errorf(ipc.CodeQuotaExceeded, "%v", err).With("limit", ctxQuota.Limit).With("scope", "contexts_per_sandbox")
	}
	var procQuota *backend.ProcessQuotaError
	if errors.As(err, &procQuota) {
		return ipc.Errorf(ipc.CodeQuotaExceeded, "%v", err).With("limit", procQuota.Limit).With("scope", "processes_per_sandbox")
	}
	var inUse *backend.ImageInUseError
	if errors.As(err, &inUse) {
		return ipc.Errorf(ipc.CodeImageInUse, "%v", err).With("sandboxes", nonNilList(inUse.Sandboxes)).With("pool", inUse.Pool)
	}
	codes := []struct {
		target error
		code   string
	}{
		{backend.ErrNotFound, ipc.CodeNotFound},
		{backend.ErrSpecUnenforceable, ipc.CodeSpecUnenforceable},
		{backend.ErrBadPath, ipc.CodeBadPath},
		{backend.ErrPathNotFound, ipc.CodePathNotFound},
		{backend.ErrIsDirectory, ipc.CodeIsDirectory},
		{backend.ErrNotDirectory, ipc.CodeNotDirectory},
		{backend.ErrTooManyEntries, ipc.CodeTooManyEntries},
		{backend.ErrInvalidArgument, ipc.CodeBadRequest},
		{backend.ErrUnavailable, ipc.CodeBackendUnavail},
		{backend.ErrImageNotFound, ipc.CodeImageNotFound},
		{backend.ErrImageInUse, ipc.CodeImageInUse},
		{backend.ErrImageExists, ipc.CodeImageExists},
		{backend.ErrBadImage, ipc.CodeBadImage},
		{backend.ErrImageTooLarge, ipc.CodeImageTooLarge},
		{backend.ErrNoShell, ipc.CodeNoShell},
		{backend.ErrProcessNotFound, ipc.CodeProcessNotFound},
		{backend.ErrProcessEnded, ipc.CodeProcessEnded},
		{backend.ErrUnsupported, ipc.CodeNotSupported},
		{backend.ErrNoPython, ipc.CodeNoPython},
		{backend.ErrNoSpace, ipc.CodeNoSpace},
		{backend.ErrContextNotFound, ipc.CodeContextNotFound},
		{backend.ErrContextBusy, ipc.CodeContextBusy},
		{backend.ErrBusy, ipc.CodeBusy},
		{backend.ErrPaused, ipc.CodeBusy},
		{lifecycle.ErrInvalid, ipc.CodeBadRequest},
		{lifecycle.ErrShuttingDown, ipc.CodeShuttingDown},
		{lifecycle.ErrJournal, ipc.CodeInternal},
	}
	for _, c := range codes {
		if errors.Is(err, c.target) {
			return &ipc.Error{Code: c.code, Message: err.Error()}
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return ipc.Errorf(ipc.CodeShuttingDown, "the request was cancelled (connection closed or daemon shutting down)")
	}
	return ipc.AsError(err)
}

// deref is *p, or def when p is nil (an argument left out).
func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

func seconds(f float64) time.Duration {
	if f >= math.MaxInt64/float64(time.Second) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(f * float64(time.Second))
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixMilli()) / 1000 }

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func nonNilList(l []string) []string {
	if l == nil {
		return []string{}
	}
	return l
}

func nonNilMap(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func truncateRunes(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}
