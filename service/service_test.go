package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// reportingBackend also says which limits it enforces, and counts how
// often it was asked.
type reportingBackend struct {
	*testBackend
	limits map[string]string
	asked  atomic.Int32
}

func (b *reportingBackend) LimitsInForce() map[string]string {
	b.asked.Add(1)
	return b.limits
}

type harness struct {
	t     *testing.T
	svc   *Service
	m     *lifecycle.Manager
	be    *testBackend
	audit *bytes.Buffer
	peer  *ipc.Peer
}

func newHarness(t *testing.T, wrap func(*testBackend) backend.Backend) *harness {
	t.Helper()
	be := newTestBackend(t)
	var b backend.Backend = be
	if wrap != nil {
		b = wrap(be)
	}
	m, err := lifecycle.New(lifecycle.Config{Backend: b, IdleTimeout: -1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	var audit bytes.Buffer
	log := hclog.New(&hclog.LoggerOptions{Output: &audit, JSONFormat: true, Level: hclog.Info})
	svc := New(Config{Manager: m, Logger: log, Version: "test", Node: "node-a"})
	return &harness{t: t, svc: svc, m: m, be: be, audit: &audit, peer: &ipc.Peer{ConnID: 1, UID: 1000, GID: 1000, PID: 42}}
}

// call sends op through the wire's own decoding and encoding, as the
// server does, and returns the decoded result or error.
func (h *harness) call(op string, args map[string]any) (map[string]any, *ipc.Error) {
	h.t.Helper()
	body, err := msgpack.Marshal(map[string]any{"v": 1, "id": 9, "op": op, "args": args})
	require.NoError(h.t, err)
	req, derr := ipc.DecodeRequest(body)
	require.Nil(h.t, derr)
	res, herr := h.svc.Handle(context.Background(), h.peer, &req)
	if herr != nil {
		var we *ipc.Error
		require.True(h.t, errors.As(herr, &we), "%T %v", herr, herr)
		return nil, we
	}
	out, err := ipc.EncodeResponse(9, res, nil)
	require.NoError(h.t, err)
	var resp struct {
		Result map[string]any `msgpack:"result"`
	}
	require.NoError(h.t, msgpack.Unmarshal(out, &resp))
	return normalize(resp.Result).(map[string]any), nil
}

// normalize turns every integer of a decoded msgpack value into an int64,
// however the encoder sized it.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normalize(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = normalize(e)
		}
		return x
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case int:
		return int64(x)
	case uint8:
		return int64(x)
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	case uint64:
		return int64(x)
	}
	return v
}

func (h *harness) ok(op string, args map[string]any) map[string]any {
	h.t.Helper()
	res, err := h.call(op, args)
	require.Nil(h.t, err, "%s: %v", op, err)
	return res
}

// lastAudit returns the last audit line for op.
func (h *harness) lastAudit(op string) map[string]any {
	h.t.Helper()
	var last map[string]any
	for _, line := range strings.Split(strings.TrimSpace(h.audit.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["@message"] == "audit" && m["op"] == op {
			last = m
		}
	}
	require.NotNil(h.t, last, "no audit line for %s in:\n%s", op, h.audit.String())
	return last
}

func TestRunCommandSaysWhyItEnded(t *testing.T) {
	h := newHarness(t, nil)
	id := h.ok(ipc.OpCreate, nil)["sandbox"].(string)
	cases := []struct {
		name     string
		res      backend.ExecResult
		reason   string
		oom      bool
		oomKills uint64
	}{
		{"exited", backend.ExecResult{ExitCode: 3}, "exited", false, 0},
		{"a child lost to the OOM killer, the command went on", backend.ExecResult{ExitCode: 1, OOMKills: 2}, "exited", false, 2},
		{"oom killed", backend.ExecResult{ExitCode: 137, OOMKilled: true, OOMKills: 1}, "oom_killed", true, 1},
		{"timed out beats oom", backend.ExecResult{ExitCode: 137, TimedOut: true, OOMKilled: true, OOMKills: 1}, "timed_out", true, 1},
		{"terminated beats all", backend.ExecResult{ExitCode: 137, TimedOut: true, OOMKilled: true, SandboxTerminated: true}, "sandbox_terminated", true, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h.be.mu.Lock()
			h.be.result = &c.res
			h.be.mu.Unlock()
			res := h.ok(ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "x"})
			assert.Equal(t, c.reason, res["reason"])
			assert.Equal(t, c.oom, res["oom_killed"])
			assert.EqualValues(t, c.oomKills, res["oom_kills"])
			assert.EqualValues(t, c.res.ExitCode, res["exit_code"])
			assert.Equal(t, c.res.TimedOut, res["timed_out"])

			line := h.lastAudit(ipc.OpRunCommand)
			assert.Equal(t, c.reason, line["reason"], "the audit line says why the command ended")
			assert.Equal(t, c.oom, line["oom_killed"])
			assert.EqualValues(t, c.oomKills, line["oom_kills"])
		})
	}
}

func TestCreateTakesResources(t *testing.T) {
	h := newHarness(t, nil)
	res := h.ok(ipc.OpCreate, map[string]any{"resources": map[string]any{
		"memory_bytes": int64(256 << 20), "cpus": 1.5, "pids": uint16(128), "disk_bytes": int64(1 << 30)}})
	id := res["sandbox"].(string)
	h.be.mu.Lock()
	got := h.be.lastSpec.Resources
	h.be.mu.Unlock()
	assert.Equal(t, backend.Resources{MemoryBytes: 256 << 20, CPUs: 1.5, PIDs: 128, DiskBytes: 1 << 30}, got)

	line := h.lastAudit(ipc.OpCreate)
	assert.Equal(t, map[string]any{"memory_bytes": float64(256 << 20), "cpus": 1.5, "pids": float64(128), "disk_bytes": float64(1 << 30)}, line["resources"])

	// cpus may be an integer; null is the same as absent.
	h.ok(ipc.OpCreate, map[string]any{"resources": map[string]any{"cpus": 2, "memory_bytes": nil}})
	h.be.mu.Lock()
	got = h.be.lastSpec.Resources
	h.be.mu.Unlock()
	assert.Equal(t, backend.Resources{CPUs: 2}, got)

	// list shows what was asked for; nothing for a sandbox that asked nothing.
	plain := h.ok(ipc.OpCreate, map[string]any{"resources": map[string]any{}})["sandbox"].(string)
	h.be.mu.Lock()
	assert.True(t, h.be.lastSpec.Resources.IsZero())
	h.be.mu.Unlock()
	assert.NotContains(t, h.lastAudit(ipc.OpCreate), "resources", "no resources asked, none audited")
	listed := map[string]any{}
	for _, s := range h.ok(ipc.OpList, nil)["sandboxes"].([]any) {
		s := s.(map[string]any)
		listed[s["sandbox"].(string)] = s["resources"]
	}
	assert.Equal(t, map[string]any{"memory_bytes": int64(256 << 20), "cpus": 1.5, "pids": int64(128), "disk_bytes": int64(1 << 30)}, listed[id])
	assert.Equal(t, map[string]any{}, listed[plain])
}

func TestCreateRefusesMalformedResources(t *testing.T) {
	h := newHarness(t, nil)
	cases := []struct {
		resources any
		want      []string // in the message
	}{
		{"1G", []string{`"resources" must be a map`}},
		{[]any{1}, []string{`"resources" must be a map`}},
		{map[string]any{"memory_bytes": "1G"}, []string{`in "resources"`, `"memory_bytes" must be an integer`}},
		{map[string]any{"memory_bytes": 1.5e9}, []string{`in "resources"`, `"memory_bytes" must be an integer`}},
		{map[string]any{"memory_bytes": -1}, []string{`in "resources"`, `"memory_bytes" must be greater than 0`, "got -1", "leave it out"}},
		{map[string]any{"memory_bytes": 0}, []string{`"memory_bytes" must be greater than 0`, "got 0"}},
		{map[string]any{"memory_bytes": uint64(math.MaxUint64)}, []string{`"memory_bytes" must be an integer`}},
		{map[string]any{"disk_bytes": -5}, []string{`"disk_bytes" must be greater than 0`}},
		{map[string]any{"pids": true}, []string{`"pids" must be an integer`, "got a boolean"}},
		{map[string]any{"pids": 1 << 23}, []string{`"pids" must be greater than 0 and at most 4194304`}},
		{map[string]any{"cpus": math.NaN()}, []string{`"cpus" must be a finite number`}},
		{map[string]any{"cpus": math.Inf(1)}, []string{`"cpus" must be a finite number`}},
		{map[string]any{"cpus": math.Inf(-1)}, []string{`"cpus" must be a finite number`}},
		{map[string]any{"cpus": -0.5}, []string{`"cpus" must be greater than 0`, "got -0.5"}},
		{map[string]any{"cpus": 0}, []string{`"cpus" must be greater than 0`}},
		{map[string]any{"cpus": 1e9}, []string{`"cpus" must be greater than 0 and at most 8192`}},
		{map[string]any{"cpus": "2"}, []string{`"cpus" must be a number`, "got a string"}},
		{map[string]any{"memory": 1 << 30}, []string{`unknown resources field "memory"`, `"resources" takes cpus, disk_bytes, memory_bytes, pids`}},
		{map[string]any{"memory_bytes": 1 << 20, "Cpus": 1}, []string{`unknown resources field "Cpus"`}},
	}
	for _, c := range cases {
		t.Run(fmt.Sprint(c.resources), func(t *testing.T) {
			_, err := h.call(ipc.OpCreate, map[string]any{"resources": c.resources})
			require.NotNil(t, err, "refused")
			assert.Equal(t, ipc.CodeBadRequest, err.Code)
			for _, w := range c.want {
				assert.Contains(t, err.Message, w)
			}
		})
	}
	assert.Empty(t, h.m.List(lifecycle.Caller{UID: 0, Admin: true}, ""), "no refused create made anything")

	// resources beside spec, not inside it.
	_, err := h.call(ipc.OpCreate, map[string]any{"spec": map[string]any{"resources": map[string]any{"cpus": 1}}})
	require.NotNil(t, err)
	assert.Contains(t, err.Message, `unknown spec field "resources"`)
}

func TestResourcesTheBackendCannotEnforce(t *testing.T) {
	h := newHarness(t, nil)
	_, err := h.call(ipc.OpCreate, map[string]any{"resources": map[string]any{"memory_bytes": int64(2 << 30)}})
	require.NotNil(t, err)
	assert.Equal(t, ipc.CodeSpecUnenforceable, err.Code)
	assert.Contains(t, err.Message, "more than the 1073741824 this daemon allows; ask for less")
	assert.Empty(t, h.m.List(lifecycle.Caller{UID: 0, Admin: true}, ""))
	line := h.lastAudit(ipc.OpCreate)
	assert.Equal(t, ipc.CodeSpecUnenforceable, line["code"])
	assert.Equal(t, map[string]any{"memory_bytes": float64(2 << 30)}, line["resources"], "a refusal names what was asked")
}

func TestHelloAnnouncesResources(t *testing.T) {
	h := newHarness(t, nil)
	res := h.ok(ipc.OpHello, nil)
	assert.Contains(t, res["features"], "create_resources")
	assert.Equal(t, "node-a", res["node"], "hello names the host, so a client can tell a handle from another one")
}

func TestHealthReportsTheLimitsInForce(t *testing.T) {
	want := map[string]string{"memory": "cgroup v2", "pids": "cgroup v2", "cpu": "off", "disk": "off", "open_files": "rlimit"}
	var rb *reportingBackend
	h := newHarness(t, func(b *testBackend) backend.Backend {
		rb = &reportingBackend{testBackend: b, limits: map[string]string{}}
		for k, v := range want {
			rb.limits[k] = v
		}
		return rb
	})
	for range 3 {
		res := h.ok(ipc.OpHealth, nil)
		assert.Equal(t, map[string]any{"memory": "cgroup v2", "pids": "cgroup v2", "cpu": "off", "disk": "off", "open_files": "rlimit"}, res["limits"])
	}
	assert.Equal(t, want, h.svc.Health(context.Background()).Limits)
	assert.EqualValues(t, 1, rb.asked.Load(), "asked once, not on every health")
	rb.limits["memory"] = "changed"
	assert.Equal(t, "cgroup v2", h.svc.Health(context.Background()).Limits["memory"], "health keeps its own copy")

	// A backend that does not report limits: no limits key at all.
	plain := newHarness(t, nil)
	res := plain.ok(ipc.OpHealth, nil)
	assert.NotContains(t, res, "limits")
	assert.Equal(t, "ok", res["status"])
}

// damagedBackend reports some sandboxes' data damaged.
type damagedBackend struct {
	*testBackend
	mu       sync.Mutex
	problems map[string]string
}

func (b *damagedBackend) Problems() map[string]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.problems)
}

// A sandbox with damaged data makes health degraded and is named there,
// but only to its own uid (or an admin), as every op hides another uid's
// sandboxes.
func TestHealthReportsDamagedSandboxesToTheirUID(t *testing.T) {
	var db *damagedBackend
	h := newHarness(t, func(b *testBackend) backend.Backend {
		db = &damagedBackend{testBackend: b, problems: map[string]string{}}
		return db
	})
	id := h.ok(ipc.OpCreate, nil)["sandbox"].(string)
	assert.Equal(t, "ok", h.ok(ipc.OpHealth, nil)["status"])
	db.mu.Lock()
	db.problems[id] = "its disk has 3 filesystem errors"
	db.mu.Unlock()

	res := h.ok(ipc.OpHealth, nil)
	assert.Equal(t, "degraded", res["status"])
	assert.Equal(t, []any{map[string]any{"sandbox": id, "problem": "its disk has 3 filesystem errors"}}, res["damaged"])

	other := *h
	other.peer = &ipc.Peer{ConnID: 2, UID: 1001, GID: 1001, PID: 43}
	res = other.ok(ipc.OpHealth, nil)
	assert.Equal(t, "degraded", res["status"], "the host's state is not hidden")
	assert.NotContains(t, res, "damaged", "another uid's sandbox is")
	assert.Len(t, h.svc.Health(context.Background()).Damaged, 1, "the daemon's own view has it")
}

// A backend without durable processes (sbx, the host test backend): hello
// does not offer them, and their ops are refused with not_supported.
func TestProcessesRefusedWhereTheBackendHasNone(t *testing.T) {
	h := newHarness(t, nil)
	hello, err := h.call(ipc.OpHello, nil)
	require.Nil(t, err)
	assert.NotContains(t, hello["features"], "processes")
	created, err := h.call(ipc.OpCreate, nil)
	require.Nil(t, err)
	id := created["sandbox"]
	for op, args := range map[string]map[string]any{
		ipc.OpStartCommand:  {"sandbox": id, "command": "true"},
		ipc.OpListProcesses: {"sandbox": id},
		ipc.OpWaitProcess:   {"sandbox": id, "process": "p-000000000000"},
	} {
		_, err := h.call(op, args)
		require.NotNil(t, err, op)
		assert.Equal(t, ipc.CodeNotSupported, err.Code, op)
	}
}
