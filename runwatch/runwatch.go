// Package runwatch ends the sandboxes of finished Airflow DAG runs. It asks
// Airflow's REST API for the state of each run that owns a sandbox on this
// host and destroys the run's sandboxes once the run is over (success or
// failed), instead of leaving them to their TTL.
//
// Why the daemon asks, rather than Airflow telling it: Airflow's DAG-run
// listener hooks (on_dag_run_success/failed) fire in the scheduler's
// process, which is not on the worker hosts whose daemons hold the
// sandboxes, and the destroy_run op reaches only the caller's own uid on
// its own host. Worker-side task hooks fire on the right host but at the
// end of a task, not of the run. So each daemon polls for the runs it
// knows, with a read-only API credential of its own.
//
// It owns the polling only: bounded (one request at a time, a minimum gap
// between requests, a timeout and a size cap on each, at most MaxRuns runs
// a round, exponential backoff while the API fails) and conservative: only
// an explicit "success" or "failed" ends a run's sandboxes; a missing run
// (404), an unknown state or any error leaves them to their TTL.
package runwatch

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// Defaults for Config's zero values.
const (
	DefaultInterval       = time.Minute
	DefaultRequestTimeout = 10 * time.Second
	DefaultRequestGap     = 200 * time.Millisecond
	DefaultMaxRuns        = 64
	DefaultMaxBackoff     = 15 * time.Minute
	// maxBody bounds one API response; a DAG run is a few hundred bytes.
	maxBody = 256 << 10
	// maxCredential bounds the credential file.
	maxCredential = 4 << 10
	// DefaultRunPath is Airflow 3's (REST API v2); Airflow 2's is
	// /api/v1/dags/{dag_id}/dagRuns/{run_id}.
	DefaultRunPath = "/api/v2/dags/{dag_id}/dagRuns/{run_id}"
)

// Auth schemes for the credential file.
const (
	AuthBearer = "bearer" // the file holds a token (Airflow 3: a JWT from /auth/token)
	AuthBasic  = "basic"  // the file holds user:password (Airflow 2's basic_auth backend)
)

// Manager is what the watcher needs of lifecycle.Manager.
type Manager interface {
	List(c lifecycle.Caller, owner string) []lifecycle.Sandbox
	DestroyRun(ctx context.Context, c lifecycle.Caller, owner string) ([]string, error)
}

// Config configures a Watcher.
type Config struct {
	Manager Manager
	Logger  hclog.Logger
	// BaseURL is the Airflow API server, e.g. "http://airflow-api-server:8080".
	BaseURL string
	// RunPath is the run's path below BaseURL, {dag_id} and {run_id}
	// replaced (path-escaped).
	RunPath string
	// CredentialFile holds the credential, read before every round (so a
	// rotated token is picked up); Auth says which kind.
	CredentialFile string
	Auth           string
	Interval       time.Duration
	RequestTimeout time.Duration
	// RequestGap is the least time between two requests.
	RequestGap time.Duration
	MaxRuns    int
	MaxBackoff time.Duration
	// Client is the HTTP client (tests may replace it); nil: a plain one.
	Client *http.Client
}

// Validate checks what can be checked without side effects.
func (c Config) Validate() error {
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("api_url %q: give the Airflow API server's http(s) URL, e.g. \"http://airflow-api-server:8080\"", c.BaseURL)
	}
	if c.CredentialFile == "" {
		return errors.New("credential_file is required with api_url: a read-only credential of the daemon's own")
	}
	switch c.Auth {
	case "", AuthBearer, AuthBasic:
	default:
		return fmt.Errorf("auth %q: give bearer (the file holds a token) or basic (user:password)", c.Auth)
	}
	p := c.RunPath
	if p == "" {
		p = DefaultRunPath
	}
	if !strings.HasPrefix(p, "/") || !strings.Contains(p, "{dag_id}") || !strings.Contains(p, "{run_id}") {
		return fmt.Errorf("run_path %q: an absolute path with {dag_id} and {run_id}", p)
	}
	return nil
}

// Watcher polls Airflow for the runs that own sandboxes here.
type Watcher struct {
	cfg    Config
	log    hclog.Logger
	stop   chan struct{}
	ctx    context.Context // cancelled by Close: ends a request in flight
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New returns a watcher; Start runs it until Close.
func New(cfg Config) (*Watcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.Interval, DefaultInterval)
	def(&cfg.RequestTimeout, DefaultRequestTimeout)
	def(&cfg.RequestGap, DefaultRequestGap)
	def(&cfg.MaxBackoff, DefaultMaxBackoff)
	if cfg.MaxRuns <= 0 {
		cfg.MaxRuns = DefaultMaxRuns
	}
	if cfg.RunPath == "" {
		cfg.RunPath = DefaultRunPath
	}
	if cfg.Auth == "" {
		cfg.Auth = AuthBearer
	}
	if cfg.Client == nil {
		// No redirects: a credential is never sent anywhere but BaseURL.
		cfg.Client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	cfg.BaseURL = strings.TrimRight(cfg.BaseURL, "/")
	ctx, cancel := context.WithCancel(context.Background())
	return &Watcher{cfg: cfg, log: cfg.Logger, stop: make(chan struct{}), ctx: ctx, cancel: cancel}, nil
}

// Start polls every Interval (longer while the API fails) until Close.
func (w *Watcher) Start() {
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		fails := 0
		for {
			wait := w.cfg.Interval
			if _, err := w.Round(w.ctx); err != nil && w.ctx.Err() == nil {
				fails++
				wait = backoff(w.cfg.Interval, w.cfg.MaxBackoff, fails)
				w.log.Warn("asking Airflow for run states failed; backing off", "error", err, "retry_in", wait)
			} else {
				fails = 0
			}
			t := time.NewTimer(wait)
			select {
			case <-w.stop:
				t.Stop()
				return
			case <-t.C:
			}
		}
	}()
}

// Close stops the watcher: a request in flight is cancelled, and Close
// returns once the round it was part of has given up.
func (w *Watcher) Close() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.cancel()
	w.wg.Wait()
}

func backoff(base, maxWait time.Duration, fails int) time.Duration {
	d := base
	for i := 0; i < fails && d < maxWait; i++ {
		d *= 2
	}
	return min(d, maxWait)
}

// Run is one DAG run owning sandboxes here.
type Run struct {
	DagID, RunID string
	Owner        string
}

// RunOf says which DAG run a sandbox belongs to: its dag_id and run_id
// labels (what the Airflow backend sets), else its owner written
// "DAG_ID/RUN_ID" (a dag_id has no "/"). ok is false for a sandbox of no
// run.
func RunOf(s lifecycle.Sandbox) (Run, bool) {
	if s.Owner == "" {
		return Run{}, false
	}
	if d, r := s.Labels["dag_id"], s.Labels["run_id"]; d != "" && r != "" {
		return Run{DagID: d, RunID: r, Owner: s.Owner}, true
	}
	d, r, ok := strings.Cut(s.Owner, "/")
	if !ok || d == "" || r == "" {
		return Run{}, false
	}
	return Run{DagID: d, RunID: r, Owner: s.Owner}, true
}

// finished says whether a run in state has ended: only Airflow's terminal
// DAG-run states count.
func finished(state string) bool { return state == "success" || state == "failed" }

// Report is what one round did.
type Report struct {
	Asked     int
	Finished  []string // owners whose sandboxes were destroyed
	Destroyed int
}

var errAuth = errors.New("the API refused the credential")

// Round asks once for every run owning a sandbox here (at most MaxRuns,
// oldest first) and destroys the sandboxes of the finished ones. It
// returns an error when the API could not be asked at all (no credential,
// every request failed), so the caller backs off.
func (w *Watcher) Round(ctx context.Context) (Report, error) {
	var rep Report
	admin := lifecycle.Caller{Admin: true}
	seen := map[string]bool{}
	var runs []Run
	for _, s := range w.cfg.Manager.List(admin, "") { // oldest first
		if s.State != lifecycle.StateReady {
			continue
		}
		if r, ok := RunOf(s); ok && !seen[r.Owner] {
			seen[r.Owner] = true
			runs = append(runs, r)
		}
	}
	if len(runs) > w.cfg.MaxRuns {
		w.log.Debug("more runs than one round asks for; the rest wait for the next", "runs", len(runs), "max", w.cfg.MaxRuns)
		runs = runs[:w.cfg.MaxRuns]
	}
	if len(runs) == 0 {
		return rep, nil
	}
	auth, err := w.credential()
	if err != nil {
		return rep, err
	}
	var failures int
	var lastErr error
	for i, r := range runs {
		if i > 0 {
			t := time.NewTimer(w.cfg.RequestGap)
			select {
			case <-w.stop:
				t.Stop()
				return rep, nil
			case <-ctx.Done():
				t.Stop()
				return rep, ctx.Err()
			case <-t.C:
			}
		}
		rep.Asked++
		state, err := w.state(ctx, r, auth)
		if err != nil {
			failures++
			lastErr = err
			if errors.Is(err, errAuth) {
				break // every other request would be refused too
			}
			continue
		}
		if !finished(state) {
			continue
		}
		ids, err := w.cfg.Manager.DestroyRun(ctx, admin, r.Owner)
		w.log.Info("DAG run finished; destroyed its sandboxes", "dag_id", r.DagID, "run_id", r.RunID, "state", state, "sandboxes", ids, "error", err)
		rep.Finished = append(rep.Finished, r.Owner)
		rep.Destroyed += len(ids)
	}
	sort.Strings(rep.Finished)
	if failures > 0 && failures == rep.Asked {
		return rep, lastErr
	}
	if lastErr != nil {
		w.log.Warn("some run states could not be read; their sandboxes wait for the next round", "failed", failures, "asked", rep.Asked, "error", lastErr)
	}
	return rep, nil
}

// credential reads the credential file into an Authorization header.
func (w *Watcher) credential() (string, error) {
	f, err := os.Open(w.cfg.CredentialFile)
	if err != nil {
		return "", fmt.Errorf("reading the Airflow API credential: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCredential+1))
	if err != nil {
		return "", fmt.Errorf("reading the Airflow API credential: %w", err)
	}
	if len(b) > maxCredential {
		return "", fmt.Errorf("the Airflow API credential file %s is larger than %d bytes", w.cfg.CredentialFile, maxCredential)
	}
	c := strings.TrimSpace(string(b))
	if c == "" || strings.ContainsAny(c, "\r\n") {
		return "", fmt.Errorf("the Airflow API credential file %s must hold one line", w.cfg.CredentialFile)
	}
	if w.cfg.Auth == AuthBasic {
		if !strings.Contains(c, ":") {
			return "", fmt.Errorf("the Airflow API credential file %s must hold user:password (auth = basic)", w.cfg.CredentialFile)
		}
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(c)), nil
	}
	return "Bearer " + c, nil
}

// state asks the API for one run's state.
func (w *Watcher) state(ctx context.Context, r Run, auth string) (string, error) {
	p := strings.NewReplacer("{dag_id}", url.PathEscape(r.DagID), "{run_id}", url.PathEscape(r.RunID)).Replace(w.cfg.RunPath)
	ctx, cancel := context.WithTimeout(ctx, w.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.cfg.BaseURL+p, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", auth)
	req.Header.Set("Accept", "application/json")
	resp, err := w.cfg.Client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return "", err
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return "", fmt.Errorf("%w (HTTP %d): check the credential file and that its user may read DAG runs", errAuth, resp.StatusCode)
	case resp.StatusCode == http.StatusNotFound:
		// A deleted run, or a wrong URL: never a reason to destroy.
		w.log.Debug("DAG run not found; leaving its sandboxes to their TTL", "dag_id", r.DagID, "run_id", r.RunID)
		return "", nil
	case resp.StatusCode != http.StatusOK:
		return "", fmt.Errorf("GET %s: HTTP %d", p, resp.StatusCode)
	case len(body) > maxBody:
		return "", fmt.Errorf("GET %s: the response is larger than %d bytes", p, maxBody)
	}
	var run struct {
		State string `json:"state"`
	}
	if err := json.Unmarshal(body, &run); err != nil {
		return "", fmt.Errorf("GET %s: not a DAG run: %v", p, err)
	}
	return run.State, nil
}
