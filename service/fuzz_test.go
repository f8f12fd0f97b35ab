package service

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// memBackend is an in-memory backend: it runs nothing, so the fuzzer spends
// its time in argument decoding and validation, which is what it is after.
// Every error it returns wraps one of the backend's sentinels.
type memBackend struct {
	mu    sync.Mutex
	files map[string]map[string][]byte // sandbox -> path -> data
}

func newMemBackend() *memBackend { return &memBackend{files: map[string]map[string][]byte{}} }

func (b *memBackend) Name() string { return "mem" }

func (b *memBackend) Create(ctx context.Context, id string, spec backend.Spec) (backend.Info, error) {
	if !backend.ValidID(id) {
		return backend.Info{}, fmt.Errorf("%w: bad id", backend.ErrInvalidArgument)
	}
	if len(spec.AllowEgressTo) > 0 || len(spec.AllowEgressToCIDRs) > 0 || (spec.BlockNetwork != nil && !*spec.BlockNetwork) {
		return backend.Info{}, fmt.Errorf("%w: no network here", backend.ErrSpecUnenforceable)
	}
	if spec.Resources.DiskBytes > 1<<40 || spec.Resources.CPUs > 64 {
		return backend.Info{}, fmt.Errorf("%w: more disk or CPUs than allowed here", backend.ErrSpecUnenforceable)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.files[id] = map[string][]byte{}
	return backend.Info{Workdir: "/workspace", Network: "none"}, nil
}

func (b *memBackend) sandbox(id string) (map[string][]byte, error) {
	f, ok := b.files[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s", backend.ErrNotFound, id)
	}
	return f, nil
}

func checkPath(p string) error {
	if p == "" || strings.ContainsRune(p, 0) || strings.Contains(p, "..") || len(p) > 4096 {
		return fmt.Errorf("%w: %q", backend.ErrBadPath, p)
	}
	return nil
}

func (b *memBackend) Exec(ctx context.Context, id string, req backend.ExecRequest) (backend.ExecResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := b.sandbox(id); err != nil {
		return backend.ExecResult{}, err
	}
	if (req.Command == "") == (len(req.Argv) == 0) || req.Timeout <= 0 {
		return backend.ExecResult{}, fmt.Errorf("%w: command", backend.ErrInvalidArgument)
	}
	if req.Command == "oom" {
		return backend.ExecResult{ExitCode: 137, OOMKilled: true, OOMKills: 1, AppliedTimeout: req.Timeout}, nil
	}
	return backend.ExecResult{Stdout: []byte(req.Command), AppliedTimeout: req.Timeout}, nil
}

func (b *memBackend) ReadFile(ctx context.Context, id, path string, maxBytes int64) ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f, err := b.sandbox(id)
	if err != nil {
		return nil, err
	}
	if err := checkPath(path); err != nil {
		return nil, err
	}
	data, ok := f[path]
	if !ok {
		return nil, fmt.Errorf("%w: %q", backend.ErrPathNotFound, path)
	}
	if int64(len(data)) > maxBytes {
		return nil, &backend.FileTooLargeError{Path: path, Size: int64(len(data)), MaxBytes: maxBytes}
	}
	return data, nil
}

func (b *memBackend) WriteFile(ctx context.Context, id, path string, data []byte, mode os.FileMode) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	f, err := b.sandbox(id)
	if err != nil {
		return err
	}
	if err := checkPath(path); err != nil {
		return err
	}
	if len(f) >= 64 {
		return fmt.Errorf("%w: full", backend.ErrUnavailable)
	}
	f[path] = append([]byte(nil), data...)
	return nil
}

func (b *memBackend) ListDirectory(ctx context.Context, id, path string, maxEntries int) ([]backend.DirEntry, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f, err := b.sandbox(id)
	if err != nil {
		return nil, err
	}
	if err := checkPath(path); err != nil {
		return nil, err
	}
	var out []backend.DirEntry
	for p := range f {
		out = append(out, backend.DirEntry{Name: p})
	}
	if len(out) > maxEntries {
		return nil, backend.ErrTooManyEntries
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (b *memBackend) Destroy(ctx context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.files, id)
	return nil
}

func (b *memBackend) List(ctx context.Context) ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ids []string
	for id := range b.files {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

func (b *memBackend) Health(ctx context.Context) error { return nil }

// sandboxPlaceholder in a seed's "sandbox" argument stands for the
// sandbox the fuzz target keeps alive.
const sandboxPlaceholder = "@"

var knownCodes = map[string]bool{
	ipc.CodeBadRequest: true, ipc.CodeUnsupported: true, ipc.CodeUnknownOp: true, ipc.CodeNotFound: true,
	ipc.CodeBadPath: true, ipc.CodePathNotFound: true, ipc.CodeIsDirectory: true, ipc.CodeNotDirectory: true,
	ipc.CodeFileTooLarge: true, ipc.CodeTooManyEntries: true, ipc.CodeQuotaExceeded: true, ipc.CodeOwnerMismatch: true,
	ipc.CodeHeldByOther: true, ipc.CodeSpecUnenforceable: true, ipc.CodeBackendUnavail: true, ipc.CodeShuttingDown: true,
	ipc.CodeUnauthorized: true,
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
	seed(ipc.OpRenew, map[string]any{"sandbox": sb, "ttl_s": 30})
	seed(ipc.OpAttach, map[string]any{"sandbox": sb, "owner": "dag/run", "holder": "task-1"})
	seed(ipc.OpRelease, map[string]any{"sandbox": sb, "holder": "task-1"})
	seed(ipc.OpReadTags, map[string]any{"sandbox": sb})
	seed(ipc.OpWriteTags, map[string]any{"sandbox": sb, "tags": map[string]string{"airflow_holder": "t", "k": "v", "airflow_expires_at": "99"}})
	seed(ipc.OpList, map[string]any{"owner": "dag/run"})
	seed(ipc.OpDestroyRun, map[string]any{"owner": "nobody/none"})
	seed(ipc.OpGC, map[string]any{"dry_run": true})
	seed(ipc.OpDestroy, map[string]any{"sandbox": "sc-0000000000000000"})
	seed("no_such_op", map[string]any{"x": 1})

	m, err := lifecycle.New(lifecycle.Config{Backend: newMemBackend(), MaxPerHost: 8, MaxPerUID: 8, MaxPerOwner: 4, IdleTimeout: -1})
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
			keep = res.(map[string]any)["sandbox"].(string)
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
