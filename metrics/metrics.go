// Package metrics exposes the daemon's Prometheus metrics. It owns the
// metric names, their labels and the HTTP handler that serves them; it
// never serves the RPC socket and never decides anything. The rest of the
// daemon reaches it through two small seams: lifecycle.Observer (creates,
// destroys, commands, the pool) and WrapHandler (every RPC request), plus
// read-only state sampled at scrape time (Sources).
//
// Labels come only from small fixed sets (backend, state, source, outcome,
// op, code, scope, reason): never a sandbox id, an owner, a uid or a path,
// so the number of series stays bounded whatever clients do. Reasons are
// passed through a cap (maxReasons) as a last line of defence.
package metrics

import (
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

const namespace = "sandbox_sidecar"

// Buckets, in seconds. Creates: a bwrap sandbox takes tens of
// milliseconds, a pool claim less, a microVM seconds (a first image pull,
// minutes). Commands: from a quick `true` to the hour max_timeout allows.
var (
	createBuckets  = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	commandBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
)

// maxReasons bounds the distinct values of a reason label; past it a new
// reason is counted as "other".
const maxReasons = 32

// Sources are what the metrics sample at scrape time. Any may be nil.
type Sources struct {
	// Backend names the backend ("bwrap", "sbx"): the backend label.
	Backend string
	// Version is the daemon's version (sandbox_sidecar_build_info).
	Version string
	// Sandboxes lists every sandbox (an admin's view).
	Sandboxes func() []lifecycle.Sandbox
	// PoolTarget is lifecycle.pool_size.
	PoolTarget int
	// Connections counts the RPC connections open now.
	Connections func() int
	// Recovery is the last start-up recovery's report.
	Recovery func() lifecycle.RecoveryReport
	// JournalPath is the journal's file; its size is reported.
	JournalPath string
	// Egress counts what the egress path refused, dropped and did not
	// audit since the daemon started (nil, or ok false: egress is off).
	Egress func() (c EgressCounts, ok bool)
	// Processes sums the sandboxes' durable processes now (nil, or ok
	// false: the backend has none). It is called once per scrape and must
	// bound its own cost (lifecycle.Manager.ProcessStats does).
	Processes func() (st lifecycle.ProcessStats, ok bool)
}

// EgressCounts are the egress path's counters (sandbox/egress Stats),
// summed over every sandbox.
type EgressCounts struct {
	Refused         uint64 // connections and UDP flows not relayed (refused, or their dial failed)
	DNSDropped      uint64 // UDP DNS queries dropped unanswered, the sandbox's lookups in flight at the bound
	AuditSuppressed uint64 // audit lines not written, past a sandbox's audit budget
}

// Metrics holds every metric of one daemon, in a registry of its own (no
// global state: tests make as many as they like).
type Metrics struct {
	reg *prometheus.Registry

	creates        *prometheus.CounterVec
	createFailures *prometheus.CounterVec
	createSeconds  *prometheus.HistogramVec
	firstCommand   *prometheus.HistogramVec
	destroys       *prometheus.CounterVec
	destroyFails   *prometheus.CounterVec
	commandSeconds *prometheus.HistogramVec
	oomKills       prometheus.Counter
	procsStarted   prometheus.Counter
	poolClaims     *prometheus.CounterVec
	quotaRefusals  *prometheus.CounterVec
	rpcRequests    *prometheus.CounterVec
	rpcErrors      *prometheus.CounterVec
	rpcSeconds     *prometheus.HistogramVec

	sampled *sampled

	reasonsMu sync.Mutex
	reasons   map[string]string // raw reason -> label value
}

// New makes the metrics. Until Bind gives them their sources, the sampled
// ones (sandboxes, connections, ...) are not reported.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), reasons: map[string]string{}, sampled: &sampled{}}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
		m.reg.MustRegister(c)
		return c
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: buckets}, labels)
		m.reg.MustRegister(h)
		return h
	}
	m.creates = counter("creates_total", "Sandboxes handed to clients, by how they were made (cold: by the backend; pool: claimed from the warm pool).", "source")
	m.createFailures = counter("create_failures_total", "Creates the quotas let through that produced no sandbox, by reason.", "reason")
	m.createSeconds = histogram("create_duration_seconds", "Time from a create's start to the sandbox handed over, by source.", createBuckets, "source")
	m.firstCommand = histogram("first_command_duration_seconds", "Duration of the first command run in each sandbox, by how the sandbox was made.", commandBuckets, "source")
	m.destroys = counter("destroys_total", "Sandboxes destroyed, by reason (client_request, expired, idle, connection_closed, destroy_run, daemon_shutdown, recovery, ...).", "reason")
	m.destroyFails = counter("destroy_failures_total", "Destroys the backend failed (the reaper retries them), by reason.", "reason")
	m.commandSeconds = histogram("command_duration_seconds", "Duration of commands, by outcome (exited, timed_out, oom_killed, sandbox_terminated, error).", commandBuckets, "outcome")
	m.oomKills = prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "oom_kills_total", Help: "Processes of sandboxes the kernel's OOM killer killed during commands."})
	m.reg.MustRegister(m.oomKills)
	m.procsStarted = prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "processes_started_total", Help: "Durable processes started (start_command)."})
	m.reg.MustRegister(m.procsStarted)
	m.poolClaims = counter("pool_claims_total", "Creates the warm pool could serve, by result (hit: a ready member was claimed; miss: none was ready).", "result")
	m.quotaRefusals = counter("quota_refusals_total", "Requests refused with quota_exceeded, by scope (host, uid, owner, commands_per_sandbox, commands_per_host, ...).", "scope")
	m.rpcRequests = counter("rpc_requests_total", "RPC requests answered, by op and code (ok for success).", "op", "code")
	m.rpcErrors = counter("rpc_errors_total", "RPC requests answered with an error, by op and code.", "op", "code")
	m.rpcSeconds = histogram("rpc_duration_seconds", "Time to answer an RPC request, by op.", commandBuckets, "op")
	for _, s := range []string{lifecycle.SourceCold, lifecycle.SourcePool, lifecycle.SourceFork} {
		m.creates.WithLabelValues(s)
	}
	for _, r := range []string{"hit", "miss"} {
		m.poolClaims.WithLabelValues(r)
	}
	m.reg.MustRegister(m.sampled)
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Bind gives the metrics what they sample at scrape time, once the daemon
// has it (the manager and the RPC server exist after the observer is
// needed).
func (m *Metrics) Bind(src Sources) {
	if m == nil {
		return
	}
	m.sampled.mu.Lock()
	m.sampled.src = &src
	m.sampled.mu.Unlock()
}

// Handler serves the exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{MaxRequestsInFlight: 4, Timeout: 10 * time.Second})
}

// Registry is the registry the metrics live in.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

var notLabel = regexp.MustCompile(`[^a-z0-9]+`)

// reason turns a lifecycle reason ("client gone during create", "orphan
// sweep (gc)") into a label value ("client_gone_during_create",
// "orphan_sweep_gc"), at most maxReasons distinct ones.
func (m *Metrics) reason(raw string) string {
	m.reasonsMu.Lock()
	defer m.reasonsMu.Unlock()
	if v, ok := m.reasons[raw]; ok {
		return v
	}
	v := "other"
	if len(m.reasons) < maxReasons {
		v = strings.Trim(notLabel.ReplaceAllString(strings.ToLower(raw), "_"), "_")
		if v == "" {
			v = "other"
		}
		m.reasons[raw] = v
	}
	return v
}

// Observer returns the lifecycle.Observer that feeds these metrics; nil
// metrics (metrics off) give a nil observer.
func (m *Metrics) Observer() lifecycle.Observer {
	if m == nil {
		return nil
	}
	return observer{m}
}

type observer struct{ m *Metrics }

func (o observer) Created(source string, took time.Duration) {
	o.m.creates.WithLabelValues(source).Inc()
	o.m.createSeconds.WithLabelValues(source).Observe(took.Seconds())
}

func (o observer) CreateFailed(reason string) {
	o.m.createFailures.WithLabelValues(o.m.reason(reason)).Inc()
}

func (o observer) PoolClaim(hit bool) {
	r := "miss"
	if hit {
		r = "hit"
	}
	o.m.poolClaims.WithLabelValues(r).Inc()
}

func (o observer) Destroyed(reason string) { o.m.destroys.WithLabelValues(o.m.reason(reason)).Inc() }

func (o observer) DestroyFailed(reason string) {
	o.m.destroyFails.WithLabelValues(o.m.reason(reason)).Inc()
}

func (o observer) CommandDone(outcome string, took time.Duration, first bool, source string, oomKills uint64) {
	o.m.commandSeconds.WithLabelValues(o.m.reason(outcome)).Observe(took.Seconds())
	if first {
		o.m.firstCommand.WithLabelValues(source).Observe(took.Seconds())
	}
	if oomKills > 0 {
		o.m.oomKills.Add(float64(oomKills))
	}
}

func (o observer) ProcessStarted() { o.m.procsStarted.Inc() }

// sampled are the metrics read from the daemon's state at scrape time.
type sampled struct {
	mu  sync.Mutex
	src *Sources
}

var (
	descSandboxes = prometheus.NewDesc(namespace+"_sandboxes", "Sandboxes on this host now, by backend and state (creating, ready, pooled, destroying).", []string{"backend", "state"}, nil)
	descPoolSize  = prometheus.NewDesc(namespace+"_pool_size", "Ready sandboxes waiting in the warm pool now.", nil, nil)
	descPoolTgt   = prometheus.NewDesc(namespace+"_pool_target", "The warm pool's configured size (lifecycle.pool_size).", nil, nil)
	descConns     = prometheus.NewDesc(namespace+"_connections", "RPC connections open now.", nil, nil)
	descRecovery  = prometheus.NewDesc(namespace+"_recovery_sandboxes", "What the last start-up recovery did, by result (adopted, destroyed, swept, failed).", []string{"result"}, nil)
	descJournal   = prometheus.NewDesc(namespace+"_journal_bytes", "Size of the journal file.", nil, nil)
	descBuild     = prometheus.NewDesc(namespace+"_build_info", "Always 1; the daemon's version and backend as labels.", []string{"version", "backend"}, nil)

	descEgressRefused    = prometheus.NewDesc(namespace+"_egress_refusals_total", "Connections and UDP flows of sandboxes the egress path did not relay (refused by the policy or a bound, or their dial failed), audit line written or not.", nil, nil)
	descEgressDNSDropped = prometheus.NewDesc(namespace+"_egress_dns_dropped_total", "UDP DNS queries of sandboxes dropped unanswered: the sandbox had as many lookups in flight as it may (the client retries).", nil, nil)
	descEgressSuppressed = prometheus.NewDesc(namespace+"_egress_audit_suppressed_total", "Egress audit lines not written: past the sandbox's audit budget (docs/operations.md, Egress); a summary line tells each run of them.", nil, nil)

	descProcsRunning   = prometheus.NewDesc(namespace+"_processes_running", "Durable processes (start_command) running now.", nil, nil)
	descProcsEnded     = prometheus.NewDesc(namespace+"_processes_ended", "Ended durable processes whose records the sandboxes keep now (processes.max_ended each; they go with their sandbox), by reason (exited, killed, timed_out, oom_killed, sandbox_terminated).", []string{"reason"}, nil)
	descProcLogDropped = prometheus.NewDesc(namespace+"_process_log_dropped_bytes", "Bytes the kept durable processes wrote that their logs no longer hold (past processes.log_bytes per stream, the oldest bytes are dropped).", nil, nil)
	descProcsUnsampled = prometheus.NewDesc(namespace+"_processes_unsampled_sandboxes", "Sandboxes with durable processes this scrape did not look at (past its bound): the process metrics leave them out.", nil, nil)
)

// processReasons are the reasons a durable process ends with, reported
// even when none did; any other (a newer backend's) is counted as other.
var processReasons = []string{"exited", "killed", "timed_out", "oom_killed", "sandbox_terminated"}

// states are reported even when empty, so a query sees 0, not nothing.
var states = []lifecycle.State{lifecycle.StateCreating, lifecycle.StateReady, lifecycle.StatePooled, lifecycle.StateDestroying}

func (s *sampled) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSandboxes, descPoolSize, descPoolTgt, descConns, descRecovery, descJournal, descBuild,
		descEgressRefused, descEgressDNSDropped, descEgressSuppressed,
		descProcsRunning, descProcsEnded, descProcLogDropped, descProcsUnsampled} {
		ch <- d
	}
}

func (s *sampled) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	src := s.src
	s.mu.Unlock()
	if src == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(descBuild, prometheus.GaugeValue, 1, src.Version, src.Backend)
	if src.Sandboxes != nil {
		counts := map[lifecycle.State]int{}
		for _, sb := range src.Sandboxes() {
			counts[sb.State]++
		}
		for _, st := range states {
			ch <- prometheus.MustNewConstMetric(descSandboxes, prometheus.GaugeValue, float64(counts[st]), src.Backend, string(st))
		}
		ch <- prometheus.MustNewConstMetric(descPoolSize, prometheus.GaugeValue, float64(counts[lifecycle.StatePooled]))
	}
	ch <- prometheus.MustNewConstMetric(descPoolTgt, prometheus.GaugeValue, float64(src.PoolTarget))
	if src.Connections != nil {
		ch <- prometheus.MustNewConstMetric(descConns, prometheus.GaugeValue, float64(src.Connections()))
	}
	if src.Recovery != nil {
		r := src.Recovery()
		for result, n := range map[string]int{"adopted": r.Adopted, "destroyed": r.Destroyed, "swept": r.Swept, "failed": r.Failed} {
			ch <- prometheus.MustNewConstMetric(descRecovery, prometheus.GaugeValue, float64(n), result)
		}
	}
	if src.JournalPath != "" {
		if fi, err := os.Stat(src.JournalPath); err == nil {
			ch <- prometheus.MustNewConstMetric(descJournal, prometheus.GaugeValue, float64(fi.Size()))
		}
	}
	if src.Egress != nil {
		if c, ok := src.Egress(); ok {
			ch <- prometheus.MustNewConstMetric(descEgressRefused, prometheus.CounterValue, float64(c.Refused))
			ch <- prometheus.MustNewConstMetric(descEgressDNSDropped, prometheus.CounterValue, float64(c.DNSDropped))
			ch <- prometheus.MustNewConstMetric(descEgressSuppressed, prometheus.CounterValue, float64(c.AuditSuppressed))
		}
	}
	if src.Processes != nil {
		if st, ok := src.Processes(); ok {
			collectProcesses(ch, st)
		}
	}
}

func collectProcesses(ch chan<- prometheus.Metric, st lifecycle.ProcessStats) {
	ch <- prometheus.MustNewConstMetric(descProcsRunning, prometheus.GaugeValue, float64(st.Running))
	other := 0
	for reason, n := range st.Ended {
		if !slices.Contains(processReasons, reason) {
			other += n
		}
	}
	for _, reason := range processReasons {
		ch <- prometheus.MustNewConstMetric(descProcsEnded, prometheus.GaugeValue, float64(st.Ended[reason]), reason)
	}
	if other > 0 {
		ch <- prometheus.MustNewConstMetric(descProcsEnded, prometheus.GaugeValue, float64(other), "other")
	}
	ch <- prometheus.MustNewConstMetric(descProcLogDropped, prometheus.GaugeValue, float64(st.LogBytesDropped))
	ch <- prometheus.MustNewConstMetric(descProcsUnsampled, prometheus.GaugeValue, float64(st.Skipped))
}
