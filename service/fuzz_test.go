package service

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostback"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// testBackend is the host test backend (backend/hostback) for the
// service's tests, with what they steer: its commands are scripted (none
// runs, so the fuzzer spends its time in decoding and validation), and it
// takes block_network=true and resources up to what it pretends to allow,
// which the host backend underneath never sees. Every error it returns
// wraps one of the backend's sentinels.
type testBackend struct {
	*hostback.Backend
	maxMemory int64

	mu       sync.Mutex
	result   *backend.ExecResult // every command's, when set
	lastSpec backend.Spec
}

func newTestBackend(tb testing.TB) *testBackend {
	tb.Helper()
	b := &testBackend{maxMemory: 1 << 30}
	hb, err := hostback.New(hostback.Config{Dir: tb.TempDir(), Script: b.script})
	if err != nil {
		tb.Fatal(err)
	}
	b.Backend = hb
	return b
}

// script: the result set by the test, else "oom" is an OOM kill and any
// other command prints itself.
func (b *testBackend) script(ctx context.Context, id string, req backend.ExecRequest) (backend.ExecResult, error, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.result != nil:
		return *b.result, nil, true
	case req.Command == "oom":
		return backend.ExecResult{ExitCode: 137, OOMKilled: true, OOMKills: 1, AppliedTimeout: req.Timeout}, nil, true
	}
	return backend.ExecResult{Stdout: []byte(req.Command + strings.Join(req.Argv, " ")), AppliedTimeout: req.Timeout}, nil, true
}

func (b *testBackend) Create(ctx context.Context, id string, spec backend.Spec) (backend.Info, error) {
	switch r := spec.Resources; {
	case len(spec.AllowEgressTo) > 0 || len(spec.AllowEgressToCIDRs) > 0 || (spec.BlockNetwork != nil && !*spec.BlockNetwork):
		return backend.Info{}, fmt.Errorf("%w: no network here", backend.ErrSpecUnenforceable)
	case r.MemoryBytes > b.maxMemory:
		return backend.Info{}, fmt.Errorf("%w: memory_bytes %d is more than the %d this daemon allows; ask for less", backend.ErrSpecUnenforceable, r.MemoryBytes, b.maxMemory)
	case r.DiskBytes > 1<<40 || r.CPUs > 64:
		return backend.Info{}, fmt.Errorf("%w: more disk or CPUs than allowed here", backend.ErrSpecUnenforceable)
	}
	b.mu.Lock()
	b.lastSpec = spec
	b.mu.Unlock()
	spec.BlockNetwork, spec.Resources = nil, backend.Resources{}
	return b.Backend.Create(ctx, id, spec)
}

// sandboxPlaceholder in a seed's "sandbox" argument stands for the
// sandbox the fuzz target keeps alive.
const sandboxPlaceholder = "@"

var knownCodes = map[string]bool{
	ipc.CodeBadRequest: true, ipc.CodeUnsupported: true, ipc.CodeUnknownOp: true, ipc.CodeNotFound: true,
	ipc.CodeBadPath: true, ipc.CodePathNotFound: true, ipc.CodeIsDirectory: true, ipc.CodeNotDirectory: true,
	ipc.CodeFileTooLarge: true, ipc.CodeTooManyEntries: true, ipc.CodeQuotaExceeded: true, ipc.CodeOwnerMismatch: true,
	ipc.CodeHeldByOther: true, ipc.CodeSpecUnenforceable: true, ipc.CodeBackendUnavail: true, ipc.CodeShuttingDown: true,
	ipc.CodeUnauthorized: true, ipc.CodeImageNotFound: true, ipc.CodeImageInUse: true, ipc.CodeImageExists: true,
	ipc.CodeBusy: true,
}

// FuzzHandle feeds request bodies through the envelope decoder and then
// through Service.Handle, for every op and its arguments, as a peer that is
// root (an admin, the widest path through the code). Whatever comes in,
// Handle must not panic, an error must carry a known code (never internal:
// the backend here fails only with sentinels) and a message, and a result
// must encode into a frame.
func FuzzHandle(f *testing.F) {
	seed := func(op string, args map[string]any) {
		body, err := msgpack.Marshal(map[string]any{"v": 1, "id": 7, "op": op, "args": args})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(body)
	}
	sb := sandboxPlaceholder
	seed(ipc.OpHello, map[string]any{"versions": []int{1}, "client": "fuzz"})
	seed(ipc.OpHealth, nil)
	seed(ipc.OpCreate, map[string]any{"spec": map[string]any{"env": map[string]string{"A": "b"}, "block_network": true, "owner": "dag/run"}, "labels": map[string]string{"task_id": "t"}, "ttl_s": 60.5})
	seed(ipc.OpCreate, map[string]any{"spec": map[string]any{"allow_egress_to": []string{"example.com"}}})
	seed(ipc.OpCreate, map[string]any{"resources": map[string]any{"memory_bytes": 256 << 20, "cpus": 1.5, "pids": 128, "disk_bytes": 1 << 30}, "ttl_s": 60})
	seed(ipc.OpCreate, map[string]any{"resources": map[string]any{"cpus": 2, "memory_bytes": nil}})
	seed(ipc.OpCreate, map[string]any{"resources": map[string]any{"disk_bytes": int64(1) << 41, "cpus": 100}})
	seed(ipc.OpCreate, map[string]any{"resources": map[string]any{"memory_bytes": -1, "pids": 1.5, "cpus": "2", "memory": 1}})
	seed(ipc.OpCreate, map[string]any{"resources": map[string]any{"cpus": math.NaN()}})
	seed(ipc.OpCreate, map[string]any{"resources": map[string]any{"cpus": math.Inf(1), "memory_bytes": uint64(math.MaxUint64)}})
	seed(ipc.OpCreate, map[string]any{"resources": []any{1, 2}})
	seed(ipc.OpRunCommand, map[string]any{"sandbox": sb, "command": "oom"})
	seed(ipc.OpRunCommand, map[string]any{"sandbox": sb, "command": "echo hi", "timeout_s": 1.5, "max_output_bytes": 10, "env": map[string]string{"X": "y"}, "cwd": "/workspace"})
	seed(ipc.OpRunCommand, map[string]any{"sandbox": sb, "argv": []string{"ls", "-l"}, "stdin": []byte{0, 1, 2}, "cwd": []byte("/tmp")})
	seed(ipc.OpRunCommand, map[string]any{"sandbox": sb, "command": "x", "timeout_s": -1})
	seed(ipc.OpWriteFile, map[string]any{"sandbox": sb, "path": "a/b.txt", "data": []byte("hello"), "mode": 0o600})
	seed(ipc.OpReadFile, map[string]any{"sandbox": sb, "path": []byte("a/b.txt"), "max_bytes": 3})
	seed(ipc.OpListDirectory, map[string]any{"sandbox": sb, "path": "."})
	seed(ipc.OpReadFile, map[string]any{"sandbox": sb, "path": "a/b.txt", "offset": 1, "length": 2})
	seed(ipc.OpReadFile, map[string]any{"sandbox": sb, "path": "a/b.txt", "offset": 1, "max_bytes": 2})
	seed(ipc.OpWriteFile, map[string]any{"sandbox": sb, "path": "a/b.txt", "data": []byte("more"), "append": true})
	seed(ipc.OpWriteFile, map[string]any{"sandbox": sb, "path": "a/b.txt", "data": []byte("x"), "offset": 3, "append": false})
	seed(ipc.OpRenew, map[string]any{"sandbox": sb, "ttl_s": 30})
	seed(ipc.OpAttach, map[string]any{"sandbox": sb, "owner": "dag/run", "holder": "task-1"})
	seed(ipc.OpRelease, map[string]any{"sandbox": sb, "holder": "task-1"})
	seed(ipc.OpReadTags, map[string]any{"sandbox": sb})
	seed(ipc.OpWriteTags, map[string]any{"sandbox": sb, "tags": map[string]string{"airflow_holder": "t", "k": "v", "airflow_expires_at": "99"}})
	seed(ipc.OpList, map[string]any{"owner": "dag/run"})
	seed(ipc.OpDestroyRun, map[string]any{"owner": "nobody/none"})
	seed(ipc.OpGC, map[string]any{"dry_run": true})
	seed(ipc.OpDestroy, map[string]any{"sandbox": "sc-0000000000000000"})
	seed(ipc.OpCreate, map[string]any{"image": "host", "ttl_s": 60})
	seed(ipc.OpCreate, map[string]any{"image": "numpy"})
	seed(ipc.OpImageLs, nil)
	seed(ipc.OpImageInspect, map[string]any{"name": "host"})
	seed(ipc.OpImageRm, map[string]any{"name": "numpy"})
	seed(ipc.OpImageImportBegin, map[string]any{"name": "numpy"})
	seed(ipc.OpImageImportData, map[string]any{"upload": "up-0", "offset": 0, "data": []byte("x")})
	seed(ipc.OpImageImportEnd, map[string]any{"upload": "up-0", "abort": true})
	seed("no_such_op", map[string]any{"x": 1})

	m, err := lifecycle.New(lifecycle.Config{Backend: newTestBackend(f), MaxPerHost: 8, MaxPerUID: 8, MaxPerOwner: 4, IdleTimeout: -1})
	if err != nil {
		f.Fatal(err)
	}
	svc := New(Config{Manager: m, Version: "fuzz", Limits: Limits{MaxTimeout: time.Minute}})
	peer := &ipc.Peer{ConnID: 1, UID: 0, GID: 0, PID: 1}
	var keep string // a sandbox kept alive for the placeholder

	f.Fuzz(func(t *testing.T, body []byte) {
		req, e := ipc.DecodeRequest(body)
		if e != nil {
			return // FuzzDecodeFrame in ipc covers the decoder itself
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, ok := m.Describe(keep); !ok {
			res, err := svc.Handle(ctx, peer, &ipc.Request{V: 1, ID: 1, Op: ipc.OpCreate})
			if err != nil {
				// Full of sandboxes the fuzzer created: start over.
				for _, s := range m.List(lifecycle.Caller{UID: 0, Admin: true}, "") {
					_ = m.Destroy(ctx, lifecycle.Caller{UID: 0, Admin: true}, s.ID)
				}
				res, err = svc.Handle(ctx, peer, &ipc.Request{V: 1, ID: 1, Op: ipc.OpCreate})
				if err != nil {
					t.Fatalf("cannot create the kept sandbox: %v", err)
				}
			}
			keep = res.(api.CreateResult).Sandbox
		}
		if args := req.Args.Map(); args != nil && args["sandbox"] == sandboxPlaceholder {
			args["sandbox"] = keep
		}
		res, err := svc.Handle(ctx, peer, &req)
		if err != nil {
			var we *ipc.Error
			if !errors.As(err, &we) {
				t.Fatalf("op %q: error is not an *ipc.Error: %T %v", req.Op, err, err)
			}
			if !knownCodes[we.Code] || we.Message == "" {
				t.Fatalf("op %q: error code %q (message %q) is not one a client can act on", req.Op, we.Code, we.Message)
			}
			return
		}
		if _, err := msgpack.Marshal(res); err != nil {
			t.Fatalf("op %q: result does not encode: %v", req.Op, err)
		}
	})
}
