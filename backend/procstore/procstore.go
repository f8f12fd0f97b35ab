// Package procstore is the daemon's side of durable processes, shared by
// the backends whose sandboxes run the agent (backend/agent): a sandbox's
// processes as a directory on the host, one subdirectory per process with
// its record (meta.json, written by the daemon before the process is
// started), its two logs and its exit file (written by the process's
// keeper through descriptors the daemon made, proclog). The daemon only
// reads what the keeper writes, so a process's output and end are there
// whether or not a daemon was up when they happened, and a read costs the
// daemon what it asks for, never what the process wrote.
//
// A backend gives each sandbox a Store and implements Agent over its
// sandbox's init; the Store does the rest of backend.Processes.
package procstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/proclog"
)

// Defaults for Limits' zero values.
const (
	DefaultLogBytes   = 64 << 20
	DefaultMaxRunning = 16
	DefaultMaxEnded   = 64
)

// Limits bound one sandbox's processes.
type Limits struct {
	// LogBytes is each stream's ring: the last LogBytes of it are kept.
	LogBytes int64
	// MaxRunning bounds the processes running at once; a start past it is
	// refused. MaxEnded bounds the records of ended processes kept: the
	// oldest ended ones are dropped first.
	MaxRunning, MaxEnded int
}

func (l Limits) withDefaults() Limits {
	if l.LogBytes <= 0 {
		l.LogBytes = DefaultLogBytes
	}
	l.LogBytes = max(l.LogBytes, proclog.MinCap)
	if l.MaxRunning <= 0 {
		l.MaxRunning = DefaultMaxRunning
	}
	if l.MaxEnded <= 0 {
		l.MaxEnded = DefaultMaxEnded
	}
	return l
}

// MaxDiskBytes is what one sandbox's logs may take on disk at most.
func (l Limits) MaxDiskBytes() int64 {
	l = l.withDefaults()
	return int64(l.MaxRunning+l.MaxEnded) * 2 * (l.LogBytes + proclog.HeaderSize)
}

// Agent is what a sandbox's in-sandbox agent does for its Store.
type Agent interface {
	// StartKeeper hands the agent a process's request and files (which
	// it may close once handed over) and returns once the agent says the
	// process started (its pid in the sandbox) or ended at once (0: its
	// exit record says how).
	StartKeeper(ctx context.Context, req agent.Request, f Files) (pid int, err error)
	// SignalKeeper asks the process's keeper to signal its group;
	// backend.ErrProcessEnded when no keeper of that id runs.
	SignalKeeper(ctx context.Context, proc string, sig syscall.Signal) error
	// AgentAlive reports whether the agent runs: when it does not, no
	// process of the sandbox does either.
	AgentAlive() bool
}

// Files are the descriptors a keeper gets.
type Files struct {
	Stdin, Stdout, Stderr, Exit *os.File
	// OOM is the sandbox's OOM-kill counter, or nil.
	OOM *os.File
}

// Close closes every file of f.
func (f Files) Close() {
	for _, x := range []*os.File{f.Stdin, f.Stdout, f.Stderr, f.Exit, f.OOM} {
		if x != nil {
			_ = x.Close()
		}
	}
}

// Store is one sandbox's processes on the host, under Dir.
type Store struct {
	dir string
	lim Limits
	w   *Watcher
	mu  sync.Mutex // one start (and its prune) at a time
	// afterState, set by tests only, runs in Read between its look at the
	// process's state and its read of the log.
	afterState func()
}

// New returns the store of the sandbox whose processes live under dir
// (made on the first start); w wakes waiting reads (nil: they poll).
func New(dir string, lim Limits, w *Watcher) *Store {
	return &Store{dir: dir, lim: lim.withDefaults(), w: w}
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// meta is a process's record as the daemon wrote it before the start.
type meta struct {
	ID        string   `json:"id"`
	Name      string   `json:"name,omitempty"`
	Command   string   `json:"command,omitempty"`
	Argv      []string `json:"argv,omitempty"`
	StartedNS int64    `json:"started_ns"`
}

const (
	metaFile   = "meta.json"
	stdoutFile = "stdout"
	stderrFile = "stderr"
	exitFile   = "exit"
	// maxMetaBytes bounds a record read back (a command of a few MiB at
	// most, as the request that made it).
	maxMetaBytes = 8 << 20
)

// StartSpec is one start as the backend prepared it.
type StartSpec struct {
	Name    string
	Command string
	Argv    []string
	// Request is what the keeper runs; Start sets its ID.
	Request agent.Request
	Stdin   []byte
	// OOM is the sandbox's OOM-kill counter (the Store closes it), or nil.
	OOM *os.File
}

// Start records the process, then has ag start it. A name already taken
// returns that process with Existing set, and starts nothing.
func (s *Store) Start(ctx context.Context, ag Agent, sp StartSpec) (backend.ProcessInfo, error) {
	defer func() {
		if sp.OOM != nil {
			sp.OOM.Close()
		}
	}()
	if sp.Name != "" && !backend.ValidProcessName(sp.Name) {
		return backend.ProcessInfo{}, fmt.Errorf("%w: a process name is 1 to %d letters, digits, '.', '_' or '-', not %q", backend.ErrInvalidArgument, backend.MaxProcessNameLen, sp.Name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return backend.ProcessInfo{}, fmt.Errorf("%w: cannot make the processes' directory: %v", backend.ErrUnavailable, err)
	}
	all, err := s.list(ag.AgentAlive())
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	running := 0
	for _, p := range all {
		if sp.Name != "" && p.Name == sp.Name {
			p.Existing = true
			return p, nil
		}
		if p.Running {
			running++
		}
	}
	if running >= s.lim.MaxRunning {
		return backend.ProcessInfo{}, &backend.ProcessQuotaError{Limit: s.lim.MaxRunning}
	}
	s.prune(all, s.lim.MaxEnded-1)

	var b [6]byte
	_, _ = rand.Read(b[:])
	id := "p-" + hex.EncodeToString(b[:])
	m := meta{ID: id, Name: sp.Name, Command: sp.Command, Argv: sp.Argv, StartedNS: time.Now().UnixNano()}
	files, err := s.create(m)
	if err != nil {
		return backend.ProcessInfo{}, fmt.Errorf("%w: cannot record the process: %v; check the state directory's disk", backend.ErrUnavailable, err)
	}
	files.OOM, sp.OOM = sp.OOM, nil
	if files.Stdin, err = stdinFile(sp.Stdin); err != nil {
		files.Close()
		s.remove(id)
		return backend.ProcessInfo{}, fmt.Errorf("%w: cannot hold the process's stdin: %v", backend.ErrUnavailable, err)
	}
	req := sp.Request
	req.ID = id
	// Not the caller's cancellation: once the agent has the request it
	// starts the process whether or not anyone waits for the answer, and
	// a record removed under a running keeper would hide it (and, on
	// gVisor, leave the sandbox a path its sentry holds that is gone, so
	// no checkpoint of it could be restored). The agents bound the wait.
	_, err = ag.StartKeeper(context.WithoutCancel(ctx), req, files)
	files.Close()
	if err != nil {
		// Never started: no record of it is kept.
		s.remove(id)
		return backend.ProcessInfo{}, err
	}
	return s.Info(id, ag.AgentAlive())
}

// create writes the process's record and makes its files.
func (s *Store) create(m meta) (Files, error) {
	dir := filepath.Join(s.dir, m.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return Files{}, err
	}
	b, err := json.Marshal(m)
	if err == nil {
		err = writeSynced(filepath.Join(dir, metaFile), b)
	}
	if err != nil {
		os.RemoveAll(dir)
		return Files{}, err
	}
	var f Files
	open := func(name string) *os.File {
		if err != nil {
			return nil
		}
		var x *os.File
		x, err = os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
		return x
	}
	f.Stdout, f.Stderr, f.Exit = open(stdoutFile), open(stderrFile), open(exitFile)
	if err == nil {
		err = proclog.Create(f.Stdout, s.lim.LogBytes)
	}
	if err == nil {
		err = proclog.Create(f.Stderr, s.lim.LogBytes)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		f.Close()
		os.RemoveAll(dir)
		return Files{}, err
	}
	return f, nil
}

// stdinFile is a process's stdin: data in a memfd, or /dev/null.
func stdinFile(data []byte) (*os.File, error) {
	if len(data) == 0 {
		return os.Open(os.DevNull)
	}
	fd, err := unix.MemfdCreate("sandbox-process-stdin", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "stdin")
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func (s *Store) remove(id string) { _ = os.RemoveAll(filepath.Join(s.dir, id)) }

// prune drops the oldest ended records until at most keep are left.
func (s *Store) prune(all []backend.ProcessInfo, keep int) {
	var ended []backend.ProcessInfo
	for _, p := range all {
		if !p.Running {
			ended = append(ended, p)
		}
	}
	if len(ended) <= keep {
		return
	}
	slices.SortFunc(ended, func(a, b backend.ProcessInfo) int { return a.EndedAt.Compare(b.EndedAt) })
	for _, p := range ended[:len(ended)-max(keep, 0)] {
		s.remove(p.ID)
	}
}

// Info describes process id; alive says whether the sandbox's agent runs
// (a process without an exit record is running only then).
func (s *Store) Info(id string, alive bool) (backend.ProcessInfo, error) {
	if !agent.ValidID(id) {
		return backend.ProcessInfo{}, fmt.Errorf("%w: %q", backend.ErrProcessNotFound, id)
	}
	dir := filepath.Join(s.dir, id)
	b, err := readBounded(filepath.Join(dir, metaFile), maxMetaBytes)
	if errors.Is(err, os.ErrNotExist) {
		return backend.ProcessInfo{}, fmt.Errorf("%w: %s (never started here, or dropped: a sandbox keeps the records of its last %d ended processes)", backend.ErrProcessNotFound, id, s.lim.MaxEnded)
	}
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	var m meta
	if err := json.Unmarshal(b, &m); err != nil || m.ID != id {
		return backend.ProcessInfo{}, fmt.Errorf("%w: process %s's record is damaged", backend.ErrUnavailable, id)
	}
	p := backend.ProcessInfo{ID: id, Name: m.Name, Command: m.Command, Argv: m.Argv, StartedAt: time.Unix(0, m.StartedNS)}
	x, xerr := readExit(filepath.Join(dir, exitFile))
	switch {
	case xerr == nil:
		p.ExitCode, p.Reason = x.ExitCode(), x.Reason()
		p.EndedAt = time.Unix(0, x.EndedNS)
		if x.How == proclog.EndLost {
			p.EndedAt = time.Time{} // its keeper died: when the process did is not known
		}
	case !errors.Is(xerr, proclog.ErrNoExit):
		return backend.ProcessInfo{}, fmt.Errorf("%w: process %s's exit record is damaged: %v", backend.ErrUnavailable, id, xerr)
	case alive:
		p.Running = true
	default:
		// Its agent is gone, and every process of the sandbox with it.
		p.ExitCode, p.Reason = 137, "sandbox_terminated"
	}
	p.StdoutBytes, p.StderrBytes = written(filepath.Join(dir, stdoutFile)), written(filepath.Join(dir, stderrFile))
	return p, nil
}

// written is how many bytes a log has taken (0 when it cannot be read).
func written(path string) int64 {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return 0
	}
	defer f.Close()
	r, err := proclog.ReadAt(f, 0, 0)
	if err != nil {
		return 0
	}
	return r.Written
}

// List describes every process the store keeps, oldest first.
func (s *Store) List(alive bool) ([]backend.ProcessInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	all, err := s.list(alive)
	if err != nil {
		return nil, err
	}
	if len(all) > s.lim.MaxEnded+s.lim.MaxRunning {
		s.prune(all, s.lim.MaxEnded)
		return s.list(alive)
	}
	return all, nil
}

func (s *Store) list(alive bool) ([]backend.ProcessInfo, error) {
	ents, err := os.ReadDir(s.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: cannot list the sandbox's processes: %v", backend.ErrUnavailable, err)
	}
	var out []backend.ProcessInfo
	for _, e := range ents {
		if !e.IsDir() || !agent.ValidID(e.Name()) {
			continue
		}
		p, err := s.Info(e.Name(), alive)
		if err != nil {
			continue // half-made (a crash mid-start) or gone meanwhile
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b backend.ProcessInfo) int { return a.StartedAt.Compare(b.StartedAt) })
	return out, nil
}

// AgentReplaced records, for every process without an exit record, that
// it ended with its agent (EndAgentLost: sandbox_terminated): a backend
// calls it before it starts a sandbox's agent anew, so the old agent is
// known dead, and so is everything it ran. Without it such a process would
// read as running under the new agent.
func (s *Store) AgentReplaced() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ents, err := os.ReadDir(s.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if !e.IsDir() || !agent.ValidID(e.Name()) {
			continue
		}
		path := filepath.Join(s.dir, e.Name(), exitFile)
		if _, err := readExit(path); !errors.Is(err, proclog.ErrNoExit) {
			continue
		}
		f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW, 0)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, proclog.WriteExit(f, proclog.Exit{How: proclog.EndAgentLost, EndedNS: time.Now().UnixNano()}), f.Close())
	}
	return errors.Join(errs...)
}

// Unstarted records, for every process without an exit record whose id
// is not in running (the ids of the processes whose keepers the live
// agent runs), that it ended without a known exit (EndLost): its start
// was recorded here, and the daemon that recorded it died before the
// agent took it. Without it such a process would read as running for as
// long as the agent lives. It returns how many it ended.
func (s *Store) Unstarted(running []string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ents, err := os.ReadDir(s.dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, e := range ents {
		if !e.IsDir() || !agent.ValidID(e.Name()) || slices.Contains(running, e.Name()) {
			continue
		}
		path := filepath.Join(s.dir, e.Name(), exitFile)
		if _, err := readExit(path); !errors.Is(err, proclog.ErrNoExit) {
			continue
		}
		f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW, 0)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, proclog.WriteExit(f, proclog.Exit{How: proclog.EndLost, EndedNS: time.Now().UnixNano()}), f.Close())
		n++
	}
	return n, errors.Join(errs...)
}

// Read reads one stream of process id from offset, waiting up to wait for
// bytes or the process's end when there are none yet and it runs.
func (s *Store) Read(ctx context.Context, ag Agent, id string, stderr bool, offset int64, maxBytes int, wait time.Duration) (backend.OutputRead, error) {
	if offset < 0 {
		return backend.OutputRead{}, fmt.Errorf("%w: offset %d is negative", backend.ErrInvalidArgument, offset)
	}
	if _, err := s.Info(id, true); err != nil {
		return backend.OutputRead{}, err
	}
	dir := filepath.Join(s.dir, id)
	name := stdoutFile
	if stderr {
		name = stderrFile
	}
	deadline := time.Now().Add(wait)
	for {
		var ch <-chan struct{}
		unsubscribe := func() {}
		if wait > 0 && s.w != nil {
			ch, unsubscribe = s.w.Subscribe(dir)
		}
		// The state before the bytes: a process that writes and ends
		// between the two is then reported running with what it wrote,
		// and the next read finds its end; read the other way round, it
		// would be reported ended with its last bytes unread, and a
		// follower stops short of them.
		p, err := s.Info(id, ag.AgentAlive())
		if err != nil {
			unsubscribe()
			return backend.OutputRead{}, err
		}
		if s.afterState != nil {
			s.afterState()
		}
		r, err := s.readOnce(filepath.Join(dir, name), offset, maxBytes)
		if err != nil {
			unsubscribe()
			return backend.OutputRead{}, err
		}
		out := backend.OutputRead{Data: r.Data, Offset: r.Offset, Dropped: r.Dropped, NextOffset: r.Offset + int64(len(r.Data)), Process: p}
		if len(r.Data) > 0 || r.Dropped > 0 || !p.Running || !time.Now().Before(deadline) || ctx.Err() != nil {
			unsubscribe()
			return out, nil
		}
		Wait(ctx, ch, deadline)
		unsubscribe()
	}
}

func (s *Store) readOnce(path string, offset int64, maxBytes int) (proclog.Read, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return proclog.Read{}, fmt.Errorf("%w: the process's log cannot be read: %v", backend.ErrUnavailable, err)
	}
	defer f.Close()
	r, err := proclog.ReadAt(f, offset, maxBytes)
	if err != nil {
		return proclog.Read{}, fmt.Errorf("%w: the process's log cannot be read: %v", backend.ErrUnavailable, err)
	}
	return r, nil
}

// Wait waits up to wait for process id to end and describes it.
func (s *Store) Wait(ctx context.Context, ag Agent, id string, wait time.Duration) (backend.ProcessInfo, error) {
	deadline := time.Now().Add(wait)
	dir := filepath.Join(s.dir, id)
	for {
		var ch <-chan struct{}
		unsubscribe := func() {}
		if wait > 0 && s.w != nil {
			ch, unsubscribe = s.w.Subscribe(dir)
		}
		p, err := s.Info(id, ag.AgentAlive())
		if err != nil || !p.Running || !time.Now().Before(deadline) || ctx.Err() != nil {
			unsubscribe()
			return p, err
		}
		Wait(ctx, ch, deadline)
		unsubscribe()
	}
}

// Signal sends sig to process id's group.
func (s *Store) Signal(ctx context.Context, ag Agent, id string, sig syscall.Signal) error {
	p, err := s.Info(id, ag.AgentAlive())
	if err != nil {
		return err
	}
	if !p.Running {
		return fmt.Errorf("%w: process %s ended (%s, exit code %d); there is nothing to signal", backend.ErrProcessEnded, id, p.Reason, p.ExitCode)
	}
	return ag.SignalKeeper(ctx, id, sig)
}

// readExit reads an exit file.
func readExit(path string) (proclog.Exit, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return proclog.Exit{}, err
	}
	defer f.Close()
	return proclog.ReadExit(f)
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && int64(len(b)) > limit {
		err = fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return b, err
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return err
	}
	return syncParent(dir)
}

func syncParent(dir string) error {
	d, err := os.Open(filepath.Dir(dir))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Signals are the signals a client may send a process, by name.
var Signals = map[string]syscall.Signal{
	"TERM": syscall.SIGTERM, "KILL": syscall.SIGKILL, "INT": syscall.SIGINT,
	"HUP": syscall.SIGHUP, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2,
}

// SignalNames lists Signals' names, for messages.
func SignalNames() string {
	names := make([]string, 0, len(Signals))
	for n := range Signals {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
