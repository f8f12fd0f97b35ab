package e2e

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
)

// TestFinishedRunsEndTheirSandboxes: the real daemon, asked to watch a
// stand-in of Airflow's REST API on 127.0.0.1, destroys the sandboxes of a
// run once the API says it succeeded, and keeps those of a running one.
func TestFinishedRunsEndTheirSandboxes(t *testing.T) {
	var mu sync.Mutex
	states := map[string]string{"etl/run_a": "running", "etl/run_b": "running"}
	var auth []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, _ := strings.CutPrefix(r.URL.EscapedPath(), "/api/v2/dags/")
		dag, run, _ := strings.Cut(rest, "/dagRuns/")
		d, _ := url.PathUnescape(dag)
		rn, _ := url.PathUnescape(run)
		mu.Lock()
		defer mu.Unlock()
		auth = append(auth, r.Header.Get("Authorization"))
		st, ok := states[d+"/"+rn]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"dag_id":"` + d + `","dag_run_id":"` + rn + `","state":"` + st + `"}`))
	}))
	defer api.Close()
	cred := filepath.Join(t.TempDir(), "airflow-token")
	require.NoError(t, os.WriteFile(cred, []byte("read-only-token\n"), 0o600))

	d := startDaemon(t, "", "--airflow-api-url", api.URL, "--airflow-credential-file", cred, "--airflow-poll-interval", "200ms")
	assert.Contains(t, d.Logs(), "ending the sandboxes of finished DAG runs")
	c := d.client(t)
	a := create(t, c, map[string]any{"spec": map[string]any{"owner": "etl/run_a"}, "ttl_s": 600, "labels": map[string]any{"dag_id": "etl", "run_id": "run_a"}})
	b := create(t, c, map[string]any{"spec": map[string]any{"owner": "etl/run_b"}, "ttl_s": 600})
	listed := func() map[string]bool {
		out := map[string]bool{}
		for _, s := range call(t, c, ipc.OpList, nil)["sandboxes"].([]any) {
			out[s.(map[string]any)["sandbox"].(string)] = true
		}
		return out
	}
	// A few rounds while both run: nothing happens.
	time.Sleep(600 * time.Millisecond)
	assert.Equal(t, map[string]bool{a: true, b: true}, listed())

	mu.Lock()
	states["etl/run_a"] = "success"
	mu.Unlock()
	require.Eventually(t, func() bool { l := listed(); return !l[a] && l[b] }, 20*time.Second, 100*time.Millisecond,
		"run_a's sandbox goes, run_b's stays\n%s", d.Logs())
	// The sandbox leaves the list before the destroy's log lines are
	// written (the backend's goes first): wait for them.
	assert.Eventually(t, func() bool {
		l := d.Logs()
		return strings.Contains(l, "DAG run finished; destroyed its sandboxes") && strings.Contains(l, `"reason":"destroy_run"`)
	}, 10*time.Second, 50*time.Millisecond, "the destroy is logged with its reason\n%s", d.Logs())
	mu.Lock()
	for _, h := range auth {
		assert.Equal(t, "Bearer read-only-token", h)
	}
	mu.Unlock()
	assert.Equal(t, 0, run(t, c, b, "true").ExitCode, "the running run's sandbox still works")
}

// TestRunWatchConfigRefusals: a watcher without a credential, or with a
// URL that is not http(s), stops serve before it starts.
func TestRunWatchConfigRefusals(t *testing.T) {
	requireHost(t)
	d := &daemon{t: t}
	for _, args := range [][]string{
		{"--airflow-api-url", "http://127.0.0.1:1"},
		{"--airflow-api-url", "airflow:8080", "--airflow-credential-file", "/etc/hostname"},
		{"--airflow-api-url", "http://127.0.0.1:1", "--airflow-credential-file", "/etc/hostname", "--airflow-poll-interval", "1ms"},
	} {
		_, stderr, code := d.cli(t, append([]string{"serve", "--config", "/dev/null", "--socket", t.TempDir() + "/s.sock", "--state-dir", t.TempDir()}, args...)...)
		assert.Equal(t, 2, code, "%v", args)
		assert.Contains(t, stderr, "airflow", "%v", args)
	}
}
