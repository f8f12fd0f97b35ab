// Package hostback is a backend for tests. Its sandboxes are directories of
// the host and its commands host processes, under GNU timeout, with no
// isolation whatever: never give it to a daemon that serves anyone.
//
// It exists so that everything above the backend (lifecycle's quotas,
// leases, tags, reaper and recovery; the service's validation and error
// mapping) can be tested on a machine without bubblewrap, against a
// backend that really runs commands and really keeps files, and that
// passes the same conformance suite (backend/backendtest) as bwrap and sbx.
// It is built on the same skeleton (backend/registry, backend/hostfs,
// backend.Classify) as they are, which is also what a new backend starts
// from.
//
// A test may script a command instead of running it (Config.Script), kill a
// sandbox the way a crash would (Kill), and count Destroy calls (Destroys).
package hostback

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/registry"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/statedir"
	"github.com/sandbox-sidecar/sandbox-sidecar/capture"
)

// Name is the backend's name.
const Name = "host"

// Defaults.
const (
	DefaultKillGrace = time.Second
	DefaultExecGrace = 2 * time.Second
)

const (
	workDirName = "work"
	specVersion = 1
	timeoutPath = "/usr/bin/timeout"
	// network is what Info reports: a host process has the host's.
	network = "host"
)

// Script decides a command instead of running it; handled false runs it.
type Script func(ctx context.Context, id string, req backend.ExecRequest) (res backend.ExecResult, err error, handled bool)

// Config configures a Backend.
type Config struct {
	// Dir holds one directory per sandbox; it is created.
	Dir string
	// KillGrace is GNU timeout's --kill-after (default DefaultKillGrace).
	KillGrace time.Duration
	// ExecGrace is how long past its timeout and KillGrace a command may
	// run before the backend kills it from outside (default
	// DefaultExecGrace).
	ExecGrace time.Duration
	// Script, when set, is asked first about every command, after the
	// request was validated and while it counts as an operation in flight
	// (so Destroy cancels its ctx).
	Script Script
}

// Backend implements backend.Backend on the host.
type Backend struct {
	cfg   Config
	boxes *registry.Registry[*sandbox]

	mu       sync.Mutex
	destroys map[string]int
}

var _ backend.Backend = (*Backend)(nil)

type persistedSpec struct {
	Version int               `json:"version"`
	Env     map[string]string `json:"env,omitempty"`
}

func (s persistedSpec) SpecVersion() int { return s.Version }

type sandbox struct {
	id, dir string
	env     map[string]string
	ops     registry.Ops

	mu     sync.Mutex
	killed bool // Kill ran: the sandbox is terminated
}

func (sb *sandbox) Ops() *registry.Ops { return &sb.ops }
func (sb *sandbox) workDir() string    { return filepath.Join(sb.dir, workDirName) }

func (sb *sandbox) isKilled() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.killed
}

// New makes the backend; cfg.Dir must be absolute.
func New(cfg Config) (*Backend, error) {
	if !filepath.IsAbs(cfg.Dir) {
		return nil, fmt.Errorf("hostback: Dir %q must be an absolute path", cfg.Dir)
	}
	if cfg.KillGrace <= 0 {
		cfg.KillGrace = DefaultKillGrace
	}
	if cfg.ExecGrace <= 0 {
		cfg.ExecGrace = DefaultExecGrace
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("hostback: %w", err)
	}
	b := &Backend{cfg: cfg, destroys: map[string]int{}}
	b.boxes = registry.New(registry.Hooks[*sandbox]{
		Load: b.load,
		Usable: func(sb *sandbox) error {
			if _, err := os.Stat(sb.workDir()); err != nil {
				return backend.NotFound(sb.id)
			}
			return nil
		},
		Exists: func(sb *sandbox) bool {
			_, err := os.Lstat(sb.dir)
			return err == nil
		},
		Placeholder: func(id string) *sandbox { return b.newSandbox(id, persistedSpec{}) },
	})
	return b, nil
}

func (b *Backend) newSandbox(id string, spec persistedSpec) *sandbox {
	return &sandbox{id: id, dir: filepath.Join(b.cfg.Dir, id), env: spec.Env, ops: registry.Ops{ID: id}}
}

func (b *Backend) load(id string) (*sandbox, error) {
	var spec persistedSpec
	if err := registry.LoadSpec(filepath.Join(b.cfg.Dir, id), id, specVersion, &spec); err != nil {
		return nil, err
	}
	sb := b.newSandbox(id, spec)
	if _, err := os.Stat(sb.workDir()); err != nil {
		return nil, backend.NotFound(id)
	}
	return sb, nil
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return Name }

// Create makes the sandbox's directory. It refuses what it cannot enforce,
// which is everything a spec may ask of the network or of resources: its
// commands are host processes.
func (b *Backend) Create(ctx context.Context, id string, spec backend.Spec) (backend.Info, error) {
	if !backend.ValidID(id) {
		return backend.Info{}, fmt.Errorf("%w: sandbox id %q is not a valid id", backend.ErrInvalidArgument, id)
	}
	if err := ctx.Err(); err != nil {
		return backend.Info{}, fmt.Errorf("sandbox %s was not created: %w", id, err)
	}
	switch {
	case spec.BlockNetwork != nil, len(spec.AllowEgressTo) > 0, len(spec.AllowEgressToCIDRs) > 0:
		return backend.Info{}, fmt.Errorf("%w: the host test backend runs commands on the host, with its network; it cannot block or filter it", backend.ErrSpecUnenforceable)
	case !spec.Resources.IsZero():
		return backend.Info{}, fmt.Errorf("%w: the host test backend enforces no resources", backend.ErrSpecUnenforceable)
	}
	if err := backend.ValidateEnv(spec.Env, "the sandbox's"); err != nil {
		return backend.Info{}, err
	}
	if b.boxes.KnownAndPresent(id) {
		return backend.Info{}, fmt.Errorf("sandbox %q already exists or is being destroyed: %w", id, fs.ErrExist)
	}
	saved := persistedSpec{Version: specVersion, Env: maps.Clone(spec.Env)}
	sb := b.newSandbox(id, saved)
	if err := os.Mkdir(sb.dir, 0o700); err != nil {
		return backend.Info{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	err := os.Mkdir(sb.workDir(), 0o700)
	if err == nil {
		err = b.seed(ctx, sb, spec)
	}
	if err == nil {
		err = registry.SaveSpec(sb.dir, saved)
	}
	if err == nil {
		err = b.boxes.Created(id, sb)
	}
	if err != nil {
		_ = statedir.RemoveAll(sb.dir)
		return backend.Info{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	return backend.Info{Workdir: sb.workDir(), Network: network}, nil
}

// Exec runs the command with /bin/sh (or its argv) under GNU timeout in the
// sandbox's directory, with PATH, HOME, LANG, the sandbox's env and the
// request's, and nothing of the test process's environment.
func (b *Backend) Exec(ctx context.Context, id string, req backend.ExecRequest) (backend.ExecResult, error) {
	sb, err := b.boxes.Lookup(id)
	if err != nil {
		return backend.ExecResult{}, err
	}
	if sb.isKilled() {
		return backend.ExecResult{}, fmt.Errorf("%w: sandbox %q was terminated; destroy it and create a new one", backend.ErrNotFound, id)
	}
	argv, cwd, err := backend.CheckExecRequest(req, sb.workDir())
	if err != nil {
		return backend.ExecResult{}, err
	}
	env, err := backend.MergeEnv(map[string]string{"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": sb.workDir(), "LANG": "C.UTF-8"}, sb.env, req.Env)
	if err != nil {
		return backend.ExecResult{}, err
	}
	applied := backend.GuestTimeout(req.Timeout)
	killAfter := backend.GuestTimeout(b.cfg.KillGrace)
	opCtx, done, err := sb.ops.Begin(ctx)
	if err != nil {
		return backend.ExecResult{}, err
	}
	defer done()
	if b.cfg.Script != nil {
		if res, err, ok := b.cfg.Script(opCtx, id, req); ok {
			return res, err
		}
	}

	cmd := exec.Command(timeoutPath, append([]string{"--kill-after=" + backend.TimeoutSeconds(killAfter), "--", backend.TimeoutSeconds(applied)}, argv...)...)
	cmd.Dir, cmd.Env = cwd, env
	res, runErr := capture.Run(opCtx, cmd, capture.Options{
		Timeout: applied + killAfter + b.cfg.ExecGrace, MaxOutputBytes: req.MaxOutputBytes, Stdin: req.Stdin,
		Output: backend.OutputFunc(req.Output),
	})
	out := backend.ExecResult{
		ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr,
		StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
		AppliedTimeout: applied, Duration: res.Duration,
	}
	destroyed := registry.Destroyed(opCtx)
	backend.Classify(backend.Facts{ExitCode: res.ExitCode, Elapsed: res.Duration, Applied: applied, KillAfter: killAfter,
		OuterFired: res.TimedOut, Ended: true, Terminated: destroyed || sb.isKilled()}).Apply(&out)
	switch {
	case runErr == nil, out.SandboxTerminated:
		return out, nil
	case ctx.Err() != nil:
		return out, fmt.Errorf("command in sandbox %s was killed because the request ended: %w", id, ctx.Err())
	}
	return out, fmt.Errorf("%w: %v", backend.ErrUnavailable, runErr)
}

// Kill terminates sandbox id as a crash would: its running commands end
// (SandboxTerminated) and later ones fail with ErrNotFound until Destroy.
func (b *Backend) Kill(id string) error {
	sb, err := b.boxes.Lookup(id)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	sb.killed = true
	sb.mu.Unlock()
	return nil
}

// resolve maps p onto the directory a file operation reaches, and the path
// relative to it: the sandbox's workdir (where a relative path starts), or
// /tmp, which its commands share with the host's.
func resolve(sb *sandbox, p string) (dir, rel string, err error) {
	const confined = "file operations are confined to the sandbox's workdir and /tmp"
	switch {
	case p == "":
		return "", "", fmt.Errorf("%w: the path is empty; %s", backend.ErrBadPath, confined)
	case strings.IndexByte(p, 0) >= 0:
		return "", "", fmt.Errorf("%w: the path contains a NUL byte; %s", backend.ErrBadPath, confined)
	case len(p) > backend.MaxGuestPathLen:
		return "", "", fmt.Errorf("%w: the path is %d bytes long, more than the %d allowed", backend.ErrBadPath, len(p), backend.MaxGuestPathLen)
	}
	clean := p
	if !path.IsAbs(clean) {
		clean = sb.workDir() + "/" + clean
	}
	clean = path.Clean(clean)
	for _, area := range []string{sb.workDir(), "/tmp"} {
		if clean == area {
			return area, ".", nil
		}
		if rel, ok := strings.CutPrefix(clean, area+"/"); ok {
			return area, rel, nil
		}
	}
	return "", "", fmt.Errorf("%w: %s is outside the sandbox's files; %s", backend.ErrBadPath, backend.ShortName(p), confined)
}

// fileOp starts a file operation on p: the sandbox's directory as a root
// and p relative to it. done ends it.
func (b *Backend) fileOp(ctx context.Context, id, p string) (root *os.Root, rel string, done func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, "", nil, err
	}
	sb, err := b.boxes.Lookup(id)
	if err != nil {
		return nil, "", nil, err
	}
	dir, rel, err := resolve(sb, p)
	if err != nil {
		return nil, "", nil, err
	}
	_, end, err := sb.ops.Begin(ctx)
	if err != nil {
		return nil, "", nil, err
	}
	if root, err = os.OpenRoot(dir); err != nil {
		end()
		if errors.Is(err, fs.ErrNotExist) {
			return nil, "", nil, backend.NotFound(id)
		}
		return nil, "", nil, err
	}
	return root, rel, func() { root.Close(); end() }, nil
}

// ReadFile implements backend.Backend.
func (b *Backend) ReadFile(ctx context.Context, id, p string, maxBytes int64) ([]byte, error) {
	if maxBytes < 0 {
		return nil, fmt.Errorf("%w: maxBytes %d is negative", backend.ErrInvalidArgument, maxBytes)
	}
	root, rel, done, err := b.fileOp(ctx, id, p)
	if err != nil {
		return nil, err
	}
	defer done()
	return hostfs.Read(root, rel, p, maxBytes)
}

// WriteFile implements backend.Backend.
func (b *Backend) WriteFile(ctx context.Context, id, p string, data []byte, mode os.FileMode) error {
	root, rel, done, err := b.fileOp(ctx, id, p)
	if err != nil {
		return err
	}
	defer done()
	return hostfs.Write(root, rel, p, data, mode, hostfs.Owner{UID: -1, GID: -1})
}

// ListDirectory implements backend.Backend.
func (b *Backend) ListDirectory(ctx context.Context, id, p string, maxEntries int) ([]backend.DirEntry, error) {
	if maxEntries <= 0 {
		return nil, fmt.Errorf("%w: maxEntries must be positive, got %d", backend.ErrInvalidArgument, maxEntries)
	}
	root, rel, done, err := b.fileOp(ctx, id, p)
	if err != nil {
		return nil, err
	}
	defer done()
	return hostfs.List(root, rel, p, maxEntries)
}

// Destroy stops the sandbox's operations and removes its directory.
func (b *Backend) Destroy(ctx context.Context, id string) error {
	if !backend.ValidID(id) {
		return nil
	}
	b.mu.Lock()
	b.destroys[id]++
	b.mu.Unlock()
	sb, _ := b.boxes.Destroying(id)
	defer b.boxes.Done(id, sb)
	sb.ops.Stop(ctx, registry.DestroyWait)
	if err := statedir.RemoveAll(sb.dir); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", id, err)
	}
	return nil
}

// Destroys counts the Destroy calls for id.
func (b *Backend) Destroys(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.destroys[id]
}

// List implements backend.Backend.
// Adopt takes sandbox id back after a restart: its settings load and its
// workspace is there (nothing else outlives a process here).
func (b *Backend) Adopt(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sandbox %s was not adopted: %w", id, err)
	}
	_, err := b.boxes.Lookup(id)
	return err
}

func (b *Backend) List(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(b.cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrUnavailable, err)
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && backend.ValidID(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// Health reports whether GNU timeout is there to run commands under.
func (b *Backend) Health(ctx context.Context) error {
	if _, err := os.Stat(timeoutPath); err != nil {
		return fmt.Errorf("%w: %s: %v", backend.ErrUnavailable, timeoutPath, err)
	}
	return nil
}

var _ backend.RangedFiles = (*Backend)(nil)

// ReadFileRange implements backend.RangedFiles.
func (b *Backend) ReadFileRange(ctx context.Context, id, p string, offset, length int64) ([]byte, int64, error) {
	root, rel, done, err := b.fileOp(ctx, id, p)
	if err != nil {
		return nil, 0, err
	}
	defer done()
	return hostfs.ReadRange(root, rel, p, offset, length)
}

// WriteFileAt implements backend.RangedFiles.
func (b *Backend) WriteFileAt(ctx context.Context, id, p string, data []byte, offset int64) (int64, error) {
	root, rel, done, err := b.fileOp(ctx, id, p)
	if err != nil {
		return 0, err
	}
	defer done()
	return hostfs.WriteAt(root, rel, p, data, offset)
}
