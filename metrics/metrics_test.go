package metrics

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
	"github.com/sandbox-sidecar/sandbox-sidecar/metrics/metricstest"
)

// handlerFunc is an ipc.Handler made of a function: the tests' stand-in
// for the service, so the wrapper is tested alone.
type handlerFunc func(req *ipc.Request) (any, error)

func (f handlerFunc) Handle(_ context.Context, _ *ipc.Peer, req *ipc.Request) (any, error) {
	return f(req)
}

func serveOnLoopback(t *testing.T, m *Metrics) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := m.Serve(l)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s.Addr().String()
}

func TestScrapeShowsWhatWasObserved(t *testing.T) {
	m := New()
	addr := serveOnLoopback(t, m)

	// Before Bind: the event metrics are there, the sampled ones not yet.
	fams := metricstest.Scrape(t, addr)
	v, ok := metricstest.Value(fams, "sandbox_sidecar_creates_total", "source", "cold")
	assert.True(t, ok)
	assert.Zero(t, v)
	_, ok = metricstest.Value(fams, "sandbox_sidecar_sandboxes", "backend", "bwrap", "state", "ready")
	assert.False(t, ok)

	journal := filepath.Join(t.TempDir(), "journal.db")
	require.NoError(t, os.WriteFile(journal, make([]byte, 12345), 0o600))
	m.Bind(Sources{
		Backend: "bwrap", Version: "1.2.3", PoolTarget: 2, JournalPath: journal,
		Sandboxes: func() []lifecycle.Sandbox {
			return []lifecycle.Sandbox{{ID: "a", State: lifecycle.StateReady}, {ID: "b", State: lifecycle.StateReady}, {ID: "c", State: lifecycle.StatePooled}}
		},
		Connections: func() int { return 7 },
		Recovery:    func() lifecycle.RecoveryReport { return lifecycle.RecoveryReport{Adopted: 3, Swept: 1} },
		Egress: func() (EgressCounts, bool) {
			return EgressCounts{Refused: 936, DNSDropped: 4, AuditSuppressed: 700}, true
		},
		Processes: func() (lifecycle.ProcessStats, bool) {
			return lifecycle.ProcessStats{Running: 5, Ended: map[string]int{"exited": 9, "oom_killed": 1, "a newer reason": 2},
				LogBytesDropped: 1 << 33, Sandboxes: 3, Skipped: 4}, true
		},
	})
	o := m.Observer()
	o.Created(lifecycle.SourceCold, 30*time.Millisecond)
	o.Created(lifecycle.SourcePool, time.Millisecond)
	o.Created(lifecycle.SourcePool, time.Millisecond)
	o.CreateFailed(lifecycle.CreateFailBackend)
	o.PoolClaim(true)
	o.PoolClaim(false)
	o.Destroyed("client request")
	o.Destroyed("orphan sweep (gc)")
	o.DestroyFailed("expired")
	o.CommandDone("exited", 20*time.Millisecond, true, lifecycle.SourcePool, 0)
	o.CommandDone("oom_killed", 2*time.Second, false, lifecycle.SourceCold, 2)
	o.CommandDone("timed_out", time.Minute, false, lifecycle.SourceCold, 0)
	o.ProcessStarted()
	o.ProcessStarted()

	h := m.WrapHandler(handlerFunc(func(req *ipc.Request) (any, error) {
		switch req.Op {
		case ipc.OpCreate:
			return nil, ipc.Errorf(ipc.CodeQuotaExceeded, "too many").With("scope", "uid").With("limit", 1)
		case ipc.OpDestroy:
			return nil, fmt.Errorf("an error that is not an *ipc.Error")
		}
		return map[string]any{}, nil
	}))
	for _, op := range []string{ipc.OpHello, ipc.OpHello, ipc.OpCreate, ipc.OpDestroy, "no-such-op-1", "no-such-op-2"} {
		_, _ = h.Handle(context.Background(), &ipc.Peer{}, &ipc.Request{Op: op})
	}

	fams = metricstest.Scrape(t, addr)
	for _, c := range []struct {
		fam    string
		labels []string
		want   float64
	}{
		{"sandbox_sidecar_sandboxes", []string{"backend", "bwrap", "state", "ready"}, 2},
		{"sandbox_sidecar_sandboxes", []string{"backend", "bwrap", "state", "pooled"}, 1},
		{"sandbox_sidecar_sandboxes", []string{"backend", "bwrap", "state", "creating"}, 0},
		{"sandbox_sidecar_pool_size", nil, 1},
		{"sandbox_sidecar_pool_target", nil, 2},
		{"sandbox_sidecar_connections", nil, 7},
		{"sandbox_sidecar_recovery_sandboxes", []string{"result", "adopted"}, 3},
		{"sandbox_sidecar_recovery_sandboxes", []string{"result", "swept"}, 1},
		{"sandbox_sidecar_recovery_sandboxes", []string{"result", "failed"}, 0},
		{"sandbox_sidecar_journal_bytes", nil, 12345},
		{"sandbox_sidecar_build_info", []string{"version", "1.2.3", "backend", "bwrap"}, 1},
		{"sandbox_sidecar_creates_total", []string{"source", "cold"}, 1},
		{"sandbox_sidecar_creates_total", []string{"source", "pool"}, 2},
		{"sandbox_sidecar_create_duration_seconds", []string{"source", "pool"}, 2},
		{"sandbox_sidecar_create_failures_total", []string{"reason", "backend"}, 1},
		{"sandbox_sidecar_pool_claims_total", []string{"result", "hit"}, 1},
		{"sandbox_sidecar_pool_claims_total", []string{"result", "miss"}, 1},
		{"sandbox_sidecar_destroys_total", []string{"reason", "client_request"}, 1},
		{"sandbox_sidecar_destroys_total", []string{"reason", "orphan_sweep_gc"}, 1},
		{"sandbox_sidecar_destroy_failures_total", []string{"reason", "expired"}, 1},
		{"sandbox_sidecar_command_duration_seconds", []string{"outcome", "oom_killed"}, 1},
		{"sandbox_sidecar_command_duration_seconds", []string{"outcome", "timed_out"}, 1},
		{"sandbox_sidecar_first_command_duration_seconds", []string{"source", "pool"}, 1},
		{"sandbox_sidecar_oom_kills_total", nil, 2},
		{"sandbox_sidecar_quota_refusals_total", []string{"scope", "uid"}, 1},
		{"sandbox_sidecar_rpc_requests_total", []string{"op", "hello", "code", "ok"}, 2},
		{"sandbox_sidecar_rpc_requests_total", []string{"op", "create", "code", "quota_exceeded"}, 1},
		{"sandbox_sidecar_rpc_errors_total", []string{"op", "create", "code", "quota_exceeded"}, 1},
		{"sandbox_sidecar_rpc_errors_total", []string{"op", "destroy", "code", "internal"}, 1},
		{"sandbox_sidecar_rpc_requests_total", []string{"op", "unknown", "code", "ok"}, 2},
		{"sandbox_sidecar_rpc_duration_seconds", []string{"op", "hello"}, 2},
		{"sandbox_sidecar_egress_refusals_total", nil, 936},
		{"sandbox_sidecar_egress_dns_dropped_total", nil, 4},
		{"sandbox_sidecar_egress_audit_suppressed_total", nil, 700},
		{"sandbox_sidecar_processes_started_total", nil, 2},
		{"sandbox_sidecar_processes_running", nil, 5},
		{"sandbox_sidecar_processes_ended", []string{"reason", "exited"}, 9},
		{"sandbox_sidecar_processes_ended", []string{"reason", "oom_killed"}, 1},
		{"sandbox_sidecar_processes_ended", []string{"reason", "killed"}, 0},
		{"sandbox_sidecar_processes_ended", []string{"reason", "timed_out"}, 0},
		{"sandbox_sidecar_processes_ended", []string{"reason", "sandbox_terminated"}, 0},
		{"sandbox_sidecar_processes_ended", []string{"reason", "other"}, 2},
		{"sandbox_sidecar_process_log_dropped_bytes", nil, 1 << 33},
		{"sandbox_sidecar_processes_unsampled_sandboxes", nil, 4},
	} {
		got, ok := metricstest.Value(fams, c.fam, c.labels...)
		if assert.True(t, ok, "%s%v is missing", c.fam, c.labels) {
			assert.Equal(t, c.want, got, "%s%v", c.fam, c.labels)
		}
	}
	// Histograms keep their buckets; the first command took 20ms.
	h1 := fams["sandbox_sidecar_first_command_duration_seconds"].GetMetric()[0].GetHistogram()
	assert.InDelta(t, 0.02, h1.GetSampleSum(), 1e-9)
	assert.NotEmpty(t, h1.GetBucket())
	// The Go runtime and the process are there too.
	assert.Contains(t, fams, "go_goroutines")
	assert.Contains(t, fams, "process_resident_memory_bytes")

	// Egress off, no durable processes: no series of either at all.
	m.Bind(Sources{Backend: "sbx", Egress: func() (EgressCounts, bool) { return EgressCounts{}, false },
		Processes: func() (lifecycle.ProcessStats, bool) { return lifecycle.ProcessStats{}, false }})
	fams = metricstest.Scrape(t, addr)
	assert.NotContains(t, fams, "sandbox_sidecar_egress_refusals_total")
	assert.NotContains(t, fams, "sandbox_sidecar_processes_running")
	assert.NotContains(t, fams, "sandbox_sidecar_processes_ended")
}

func TestLabelsStayBounded(t *testing.T) {
	m := New()
	o := m.Observer()
	for i := range 500 {
		o.Destroyed(fmt.Sprintf("reason %d", i))
	}
	h := m.WrapHandler(handlerFunc(func(*ipc.Request) (any, error) {
		return nil, &ipc.Error{Code: "Not A Code!", Message: "x"}
	}))
	for i := range 500 {
		_, _ = h.Handle(context.Background(), &ipc.Peer{}, &ipc.Request{Op: fmt.Sprintf("op-%d", i)})
	}
	fams := metricstest.Scrape(t, serveOnLoopback(t, m))
	assert.Len(t, fams["sandbox_sidecar_destroys_total"].GetMetric(), maxReasons+1, "every reason past the cap is other")
	v, _ := metricstest.Value(fams, "sandbox_sidecar_destroys_total", "reason", "other")
	assert.Equal(t, float64(500-maxReasons), v)
	assert.Len(t, fams["sandbox_sidecar_rpc_requests_total"].GetMetric(), 1)
	v, _ = metricstest.Value(fams, "sandbox_sidecar_rpc_requests_total", "op", "unknown", "code", "other")
	assert.Equal(t, 500.0, v)
}

func TestOnlyMetricsIsServed(t *testing.T) {
	addr := serveOnLoopback(t, New())
	c := &http.Client{Timeout: 10 * time.Second}
	for path, want := range map[string]int{"/": 404, "/debug/pprof/": 404, "/metrics": 200} {
		resp, err := c.Get("http://" + addr + path)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, want, resp.StatusCode, path)
	}
	resp, err := c.Post("http://"+addr+"/metrics", "text/plain", nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}

func TestCheckAddr(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:9464", "[::1]:9464", "localhost:9464", "0.0.0.0:9464", "10.1.2.3:80", "127.0.0.1:0"} {
		assert.NoError(t, CheckAddr(ok), ok)
	}
	for _, bad := range []string{":9464", "9464", "127.0.0.1", "example.com:9464", "127.0.0.1:http-alt-nope", "[::1]"} {
		assert.Error(t, CheckAddr(bad), bad)
	}
	assert.True(t, IsLoopback("127.0.0.1:1"))
	assert.True(t, IsLoopback("[::1]:1"))
	assert.True(t, IsLoopback("localhost:1"))
	assert.False(t, IsLoopback("0.0.0.0:1"))
	assert.False(t, IsLoopback("10.0.0.1:1"))
}

func TestNilMetricsAreOff(t *testing.T) {
	var m *Metrics
	assert.Nil(t, m.Observer())
	h := handlerFunc(func(*ipc.Request) (any, error) { return nil, nil })
	assert.NotNil(t, m.WrapHandler(h))
	m.Bind(Sources{}) // no panic
}

// Every op of the wire is counted by its name, the image and process ops
// as much as the first ones.
func TestEveryOpIsALabel(t *testing.T) {
	m := New()
	h := m.WrapHandler(handlerFunc(func(*ipc.Request) (any, error) { return nil, nil }))
	for op := range api.Requests {
		_, _ = h.Handle(context.Background(), &ipc.Peer{}, &ipc.Request{Op: op})
	}
	fams := metricstest.Scrape(t, serveOnLoopback(t, m))
	for _, op := range []string{ipc.OpStartCommand, ipc.OpReadOutput, ipc.OpWaitProcess, ipc.OpSignalProcess, ipc.OpListProcesses, ipc.OpImageLs, ipc.OpRunCommand} {
		v, ok := metricstest.Value(fams, "sandbox_sidecar_rpc_requests_total", "op", op, "code", "ok")
		assert.True(t, ok, op)
		assert.Equal(t, 1.0, v, op)
	}
	_, ok := metricstest.Value(fams, "sandbox_sidecar_rpc_requests_total", "op", "unknown", "code", "ok")
	assert.False(t, ok, "no op of the wire is unknown")
}

// Every metric of the daemon is in docs/operations.md's table.
func TestEveryMetricIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	m := New()
	m.Bind(Sources{Backend: "bwrap", JournalPath: "/dev/null",
		Sandboxes:   func() []lifecycle.Sandbox { return nil },
		Connections: func() int { return 0 },
		Recovery:    func() lifecycle.RecoveryReport { return lifecycle.RecoveryReport{} },
		Egress:      func() (EgressCounts, bool) { return EgressCounts{}, true },
		Processes:   func() (lifecycle.ProcessStats, bool) { return lifecycle.ProcessStats{}, true },
	})
	o := m.Observer()
	o.CreateFailed("x")
	o.Destroyed("x")
	o.DestroyFailed("x")
	o.CommandDone("exited", time.Millisecond, true, lifecycle.SourceCold, 0)
	_, _ = m.WrapHandler(handlerFunc(func(*ipc.Request) (any, error) {
		return nil, ipc.Errorf(ipc.CodeQuotaExceeded, "x").With("scope", "host")
	})).Handle(context.Background(), &ipc.Peer{}, &ipc.Request{Op: ipc.OpCreate})
	fams, err := m.Registry().Gather()
	require.NoError(t, err)
	n := 0
	for _, f := range fams {
		if name := f.GetName(); strings.HasPrefix(name, "sandbox_sidecar_") {
			n++
			assert.Contains(t, string(doc), "| `"+name+"` |", "docs/operations.md's metrics table")
		}
	}
	assert.Greater(t, n, 25)
}
