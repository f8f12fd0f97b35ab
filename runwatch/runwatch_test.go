package runwatch

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// newManager is a lifecycle manager on the real bwrap backend.
func newManager(t *testing.T) *lifecycle.Manager {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("needs bubblewrap: %v", err)
		}
		t.Skipf("needs bubblewrap: %v", err)
	}
	dir := filepath.Join(t.TempDir(), "bwrap")
	b, err := bwrap.New(bwrap.Config{Dir: dir, SandboxUID: -1, SandboxGID: -1})
	require.NoError(t, err)
	t.Cleanup(func() { bwrap.KillSandboxes(dir) })
	m, err := lifecycle.New(lifecycle.Config{Backend: b})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = m.Close(ctx)
	})
	return m
}

// airflowStandIn is a stand-in for Airflow's REST API on 127.0.0.1: it
// answers GET /api/v2/dags/{dag_id}/dagRuns/{run_id} from a table, and
// records what it was asked and with which credential.
type airflowStandIn struct {
	*httptest.Server
	mu     sync.Mutex
	states map[string]string // "dag/run" -> state
	status int               // when set, every answer has this status
	asked  []string
	auth   []string
}

func newStandIn(t *testing.T) *airflowStandIn {
	a := &airflowStandIn{states: map[string]string{}}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.auth = append(a.auth, r.Header.Get("Authorization"))
		rest, ok := strings.CutPrefix(r.URL.EscapedPath(), "/api/v2/dags/")
		dag, run, ok2 := strings.Cut(rest, "/dagRuns/")
		if r.Method != http.MethodGet || !ok || !ok2 {
			http.NotFound(w, r)
			return
		}
		key := unescape(t, dag) + "/" + unescape(t, run)
		a.asked = append(a.asked, key)
		if a.status != 0 {
			w.WriteHeader(a.status)
			return
		}
		st, ok := a.states[key]
		if !ok {
			http.Error(w, `{"detail":"DagRun not found"}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"dag_id":"x","dag_run_id":"y","state":"` + st + `","note":null}`))
	}))
	t.Cleanup(a.Close)
	return a
}

func unescape(t *testing.T, s string) string {
	u, err := url.PathUnescape(s)
	require.NoError(t, err)
	return u
}

func (a *airflowStandIn) set(key, state string) {
	a.mu.Lock()
	a.states[key] = state
	a.mu.Unlock()
}

func (a *airflowStandIn) takeAsked() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.asked
	a.asked = nil
	sort.Strings(out)
	return out
}

func credential(t *testing.T, text string) string {
	p := filepath.Join(t.TempDir(), "airflow-token")
	require.NoError(t, os.WriteFile(p, []byte(text), 0o600))
	return p
}

func owners(m *lifecycle.Manager) []string {
	var out []string
	for _, s := range m.List(lifecycle.Caller{Admin: true}, "") {
		out = append(out, s.Owner)
	}
	sort.Strings(out)
	return out
}

func TestRoundDestroysOnlyFinishedRuns(t *testing.T) {
	m := newManager(t)
	api := newStandIn(t)
	ctx := context.Background()
	alice := lifecycle.Caller{UID: 1000, ConnID: 1}
	for _, req := range []lifecycle.CreateRequest{
		{Owner: "etl/manual__2026-12-01T10:00:00+00:00", TTL: time.Hour}, // finished: success
		{Owner: "etl/manual__2026-12-01T10:00:00+00:00", TTL: time.Hour},
		{Owner: "etl/scheduled__1", TTL: time.Hour},                                                          // failed
		{Owner: "etl/running", TTL: time.Hour},                                                               // still running
		{Owner: "gone/run", TTL: time.Hour},                                                                  // 404
		{Owner: "custom-owner", TTL: time.Hour, Labels: map[string]string{"dag_id": "lab", "run_id": "r/1"}}, // by its labels
		{Owner: "no-run-here", TTL: time.Hour},                                                               // not a run's
		{},                                                                                                   // connection-bound, no owner
	} {
		_, err := m.Create(ctx, alice, req)
		require.NoError(t, err)
	}
	api.set("etl/manual__2026-12-01T10:00:00+00:00", "success")
	api.set("etl/scheduled__1", "failed")
	api.set("etl/running", "running")
	api.set("lab/r/1", "queued")

	w, err := New(Config{Manager: m, BaseURL: api.URL, CredentialFile: credential(t, "tok-123\n"), RequestGap: time.Millisecond})
	require.NoError(t, err)
	rep, err := w.Round(ctx)
	require.NoError(t, err)
	assert.Equal(t, 5, rep.Asked)
	assert.Equal(t, []string{"etl/manual__2026-12-01T10:00:00+00:00", "etl/scheduled__1"}, rep.Finished)
	assert.Equal(t, 3, rep.Destroyed)
	assert.Equal(t, []string{"", "custom-owner", "etl/running", "gone/run", "no-run-here"}, owners(m))
	assert.Equal(t, []string{"etl/manual__2026-12-01T10:00:00+00:00", "etl/running", "etl/scheduled__1", "gone/run", "lab/r/1"}, api.takeAsked(),
		"one request per run, path-escaped both ways")
	for _, a := range api.auth {
		assert.Equal(t, "Bearer tok-123", a)
	}

	// The labelled run ends: found by its labels, ended by its owner.
	api.set("lab/r/1", "success")
	rep, err = w.Round(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"custom-owner"}, rep.Finished)
	assert.Equal(t, []string{"", "etl/running", "gone/run", "no-run-here"}, owners(m))
}

func TestAPIFailuresLeaveSandboxesAndBackOff(t *testing.T) {
	m := newManager(t)
	api := newStandIn(t)
	ctx := context.Background()
	_, err := m.Create(ctx, lifecycle.Caller{UID: 1000}, lifecycle.CreateRequest{Owner: "etl/r1", TTL: time.Hour})
	require.NoError(t, err)
	_, err = m.Create(ctx, lifecycle.Caller{UID: 1000}, lifecycle.CreateRequest{Owner: "etl/r2", TTL: time.Hour})
	require.NoError(t, err)
	api.set("etl/r1", "success")
	api.set("etl/r2", "success")

	w, err := New(Config{Manager: m, BaseURL: api.URL, CredentialFile: credential(t, "user:pw"), Auth: AuthBasic, RequestGap: time.Millisecond})
	require.NoError(t, err)

	// A refused credential: one request, not one per run, and an error so
	// the loop backs off.
	api.status = http.StatusForbidden
	_, err = w.Round(ctx)
	require.ErrorIs(t, err, errAuth)
	assert.Len(t, api.takeAsked(), 1)
	// A broken server: every request fails, nothing is destroyed.
	api.status = http.StatusInternalServerError
	_, err = w.Round(ctx)
	require.Error(t, err)
	assert.Len(t, owners(m), 2)

	// A missing credential file is an error before any request.
	w2, err := New(Config{Manager: m, BaseURL: api.URL, CredentialFile: filepath.Join(t.TempDir(), "none")})
	require.NoError(t, err)
	_, err = w2.Round(ctx)
	assert.ErrorContains(t, err, "credential")

	api.status = 0
	rep, err := w.Round(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, rep.Destroyed)
	api.mu.Lock()
	assert.Equal(t, "Basic dXNlcjpwdw==", api.auth[len(api.auth)-1])
	api.mu.Unlock()

	assert.Equal(t, time.Minute, backoff(30*time.Second, 10*time.Minute, 1))
	assert.Equal(t, 10*time.Minute, backoff(30*time.Second, 10*time.Minute, 50))
}

func TestResponsesAreBounded(t *testing.T) {
	m := newManager(t)
	ctx := context.Background()
	_, err := m.Create(ctx, lifecycle.Caller{UID: 1000}, lifecycle.CreateRequest{Owner: "etl/r1", TTL: time.Hour})
	require.NoError(t, err)
	slow := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-slow // never answers within the timeout
	}))
	defer srv.Close()
	defer close(slow)
	w, err := New(Config{Manager: m, BaseURL: srv.URL, RunPath: "/api/v2/dags/{dag_id}/dagRuns/{run_id}", CredentialFile: credential(t, "t"),
		RequestTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	start := time.Now()
	_, err = w.Round(ctx)
	require.Error(t, err)
	assert.Less(t, time.Since(start), 20*time.Second, "the request timeout bounds a round")

	// Close does not wait for a hung API: it cancels the request in flight.
	w, err = New(Config{Manager: m, BaseURL: srv.URL, CredentialFile: credential(t, "t"), Interval: time.Hour, RequestTimeout: time.Hour})
	require.NoError(t, err)
	w.Start()
	time.Sleep(100 * time.Millisecond) // the first round is waiting for its answer
	start = time.Now()
	w.Close()
	assert.Less(t, time.Since(start), 20*time.Second, "Close cancels the request in flight")

	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"state":"success","pad":"` + strings.Repeat("x", maxBody) + `"}`))
	}))
	defer huge.Close()
	w, err = New(Config{Manager: m, BaseURL: huge.URL, CredentialFile: credential(t, "t")})
	require.NoError(t, err)
	_, err = w.Round(ctx)
	assert.ErrorContains(t, err, "larger than")
	assert.Len(t, owners(m), 1, "an oversized answer destroys nothing")
}

func TestConfigValidate(t *testing.T) {
	ok := Config{BaseURL: "http://127.0.0.1:8080", CredentialFile: "/etc/x"}
	assert.NoError(t, ok.Validate())
	for name, c := range map[string]Config{
		"no scheme": {BaseURL: "airflow:8080", CredentialFile: "/x"},
		"ftp":       {BaseURL: "ftp://airflow", CredentialFile: "/x"},
		"no cred":   {BaseURL: "http://airflow"},
		"bad auth":  {BaseURL: "http://airflow", CredentialFile: "/x", Auth: "digest"},
		"bad path":  {BaseURL: "http://airflow", CredentialFile: "/x", RunPath: "/api/v2/dags/{dag_id}"},
		"relative":  {BaseURL: "http://airflow", CredentialFile: "/x", RunPath: "api/{dag_id}/{run_id}"},
	} {
		assert.Error(t, c.Validate(), name)
	}
	for _, c := range []struct {
		s    lifecycle.Sandbox
		want Run
		ok   bool
	}{
		{lifecycle.Sandbox{Owner: "d/r/x"}, Run{"d", "r/x", "d/r/x"}, true},
		{lifecycle.Sandbox{Owner: "o", Labels: map[string]string{"dag_id": "d", "run_id": "r"}}, Run{"d", "r", "o"}, true},
		{lifecycle.Sandbox{Owner: "noslash"}, Run{}, false},
		{lifecycle.Sandbox{Owner: "/r"}, Run{}, false},
		{lifecycle.Sandbox{Labels: map[string]string{"dag_id": "d", "run_id": "r"}}, Run{}, false},
	} {
		got, ok := RunOf(c.s)
		assert.Equal(t, c.ok, ok, "%+v", c.s)
		assert.Equal(t, c.want, got)
	}
}
