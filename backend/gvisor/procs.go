package gvisor

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/procstore"
)

// Durable processes (backend.Processes): a sandbox's processes live in
// its directory's procs/ (procstore), which is bound into the sandbox at
// gvwire.GuestProcs, a directory only root reaches there: the guest (uid
// 1000) cannot enter it, init and its keepers (root inside gVisor) can.
// Init runs each process under a keeper (backend/agent) that writes its
// logs and exit record into the files the daemon made there; the daemon
// talks to init only to start and signal them (gvwire's proc frames), and
// reads their output and ends from the host's files. The sentry writes
// them through its gofer with the mounts' shared file access, so the host
// sees every write when it is made and procstore's inotify wakes on it.

var _ backend.Processes = (*Backend)(nil)

// procsName is the directory of a sandbox's processes in Dir/<id>.
const procsName = "procs"

// procAnswerTimeout bounds init's answer to a process's start (a keeper's
// exec and its first steps) or signal.
const procAnswerTimeout = 10 * time.Second

func (sb *sandbox) procsDir() string { return filepath.Join(sb.dir, procsName) }

func (b *Backend) store(sb *sandbox) *procstore.Store {
	return procstore.New(sb.procsDir(), b.cfg.Processes, &b.watcher)
}

// StartProcess implements backend.Processes.
func (b *Backend) StartProcess(ctx context.Context, id string, req backend.ProcessRequest) (backend.ProcessInfo, error) {
	sb, err := b.lookup(id)
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	argv, cwd, err := backend.CheckProcessRequest(req, guestWorkspace)
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	if len(req.Stdin) > gvwire.MaxStdinBytes {
		return backend.ProcessInfo{}, fmt.Errorf("%w: stdin is %d bytes, more than the %d a process may get; write it to a file with write_file instead", backend.ErrInvalidArgument, len(req.Stdin), gvwire.MaxStdinBytes)
	}
	if req.Command != "" && sb.image != nil && !sb.image.Shell {
		return backend.ProcessInfo{}, fmt.Errorf("%w: sandbox %s runs on image %s, which has no %s to run a command string; give the command as an argv", backend.ErrNoShell, id, backend.ShortName(sb.image.Name), backend.ShellPath)
	}
	env, err := backend.MergeEnv(sb.baseEnvOf(), sb.env, req.Env)
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	opCtx, done, err := sb.ops.Begin(ctx)
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	defer done()
	var grace time.Duration
	if req.Timeout > 0 {
		grace = b.cfg.KillGrace
	}
	spec := procstore.StartSpec{Name: req.Name, Command: req.Command, Argv: req.Argv, Stdin: req.Stdin,
		Request: agent.Request{Argv: argv, Env: env, Cwd: cwd, Timeout: req.Timeout, KillGrace: grace, UID: guestUID, GID: guestGID}}
	return b.store(sb).Start(opCtx, &gvAgent{b: b, sb: sb}, spec)
}

// ReadOutput implements backend.Processes.
func (b *Backend) ReadOutput(ctx context.Context, id, proc string, stderr bool, offset int64, maxBytes int, wait time.Duration) (backend.OutputRead, error) {
	sb, err := b.lookup(id)
	if err != nil {
		return backend.OutputRead{}, err
	}
	opCtx, done, err := sb.ops.Begin(ctx)
	if err != nil {
		return backend.OutputRead{}, err
	}
	defer done()
	return b.store(sb).Read(opCtx, &gvAgent{b: b, sb: sb}, proc, stderr, offset, maxBytes, wait)
}

// WaitProcess implements backend.Processes.
func (b *Backend) WaitProcess(ctx context.Context, id, proc string, wait time.Duration) (backend.ProcessInfo, error) {
	sb, err := b.lookup(id)
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	opCtx, done, err := sb.ops.Begin(ctx)
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	defer done()
	return b.store(sb).Wait(opCtx, &gvAgent{b: b, sb: sb}, proc, wait)
}

// SignalProcess implements backend.Processes.
func (b *Backend) SignalProcess(ctx context.Context, id, proc string, sig syscall.Signal) error {
	sb, err := b.lookup(id)
	if err != nil {
		return err
	}
	opCtx, done, err := sb.ops.Begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	return b.store(sb).Signal(opCtx, &gvAgent{b: b, sb: sb}, proc, sig)
}

// ListProcesses implements backend.Processes.
func (b *Backend) ListProcesses(ctx context.Context, id string) ([]backend.ProcessInfo, error) {
	sb, err := b.lookup(id)
	if err != nil {
		return nil, err
	}
	return b.store(sb).List((&gvAgent{b: b, sb: sb}).AgentAlive())
}

// gvAgent is a sandbox's init as procstore's Agent.
type gvAgent struct {
	b  *Backend
	sb *sandbox
}

// AgentAlive implements procstore.Agent: this process talks to the
// sandbox's init, and it has not died; or the sandbox is paused, its init
// and processes in its checkpoint.
func (a *gvAgent) AgentAlive() bool {
	a.sb.initMu.Lock()
	defer a.sb.initMu.Unlock()
	return !a.sb.gone && (a.sb.paused || a.sb.init != nil && a.sb.init.alive())
}

// StartKeeper implements procstore.Agent. The logs and exit file init
// opens by name in the procs directory (f's are the same files); the
// stdin travels in the frame.
func (a *gvAgent) StartKeeper(ctx context.Context, req agent.Request, f procstore.Files) (int, error) {
	stdin, err := io.ReadAll(io.LimitReader(f.Stdin, gvwire.MaxStdinBytes+1))
	if err != nil || len(stdin) > gvwire.MaxStdinBytes {
		return 0, fmt.Errorf("%w: the process's stdin cannot be handed over (%v, %d bytes)", backend.ErrUnavailable, err, len(stdin))
	}
	c, err := a.b.initForProcs(ctx, a.sb)
	if err != nil {
		return 0, err
	}
	ans, err := c.procCall(ctx, gvwire.KindProcStart, func(seq uint32) []byte {
		return gvwire.ProcStart{Seq: seq, Request: req.Encode(), Stdin: stdin}.Encode()
	})
	switch {
	case err != nil:
		return 0, fmt.Errorf("%w: sandbox %s's init did not say whether the process started: %v", backend.ErrUnavailable, a.sb.id, err)
	case ans.Errno == uint32(syscall.EAGAIN):
		return 0, &backend.ProcessQuotaError{Limit: a.b.cfg.Processes.MaxRunning}
	case ans.Errno != 0:
		return 0, fmt.Errorf("%w: sandbox %s's init could not start the process: %v", backend.ErrUnavailable, a.sb.id, syscall.Errno(ans.Errno))
	}
	return int(ans.Value), nil
}

// SignalKeeper implements procstore.Agent.
func (a *gvAgent) SignalKeeper(ctx context.Context, proc string, sig syscall.Signal) error {
	a.sb.initMu.Lock()
	c, paused := a.sb.init, a.sb.paused
	a.sb.initMu.Unlock()
	if paused {
		return a.sb.errPaused()
	}
	if c == nil || !c.alive() {
		return fmt.Errorf("%w: process %s's sandbox has no agent running", backend.ErrProcessEnded, proc)
	}
	ans, err := c.procCall(ctx, gvwire.KindProcSignal, func(seq uint32) []byte {
		return gvwire.ProcSignal{Seq: seq, Signal: uint32(sig), ID: proc}.Encode()
	})
	switch {
	case err != nil:
		return fmt.Errorf("%w: sandbox %s's init did not answer a signal: %v", backend.ErrUnavailable, a.sb.id, err)
	case ans.Errno != 0:
		return fmt.Errorf("%w: process %s is ending; there is nothing to signal", backend.ErrProcessEnded, proc)
	}
	return nil
}

// initForProcs returns sb's running init for a process's start, booting
// the sandbox when this process has none yet; like a file op it does not
// take the init for a command (a process starts beside one).
func (b *Backend) initForProcs(ctx context.Context, sb *sandbox) (*initConn, error) {
	c, err := b.initForFiles(ctx, sb)
	if err == errNoGuest {
		return nil, fmt.Errorf("%w: sandbox %q was terminated (its gVisor sandbox died); destroy it and create a new one", backend.ErrNotFound, sb.id)
	}
	return c, err
}

// procCall sends init a proc request (made by frame with its sequence
// number) and waits, within procAnswerTimeout, for its answer.
func (c *initConn) procCall(ctx context.Context, kind byte, frame func(seq uint32) []byte) (gvwire.ProcAnswer, error) {
	return c.procCallWithin(ctx, kind, frame, procAnswerTimeout)
}

// procCallWithin is procCall answered within timeout.
func (c *initConn) procCallWithin(ctx context.Context, kind byte, frame func(seq uint32) []byte, timeout time.Duration) (gvwire.ProcAnswer, error) {
	ch := make(chan gvwire.ProcAnswer, 1)
	c.mu.Lock()
	c.procSeq++
	seq := c.procSeq
	if c.procWaits == nil {
		c.procWaits = map[uint32]chan gvwire.ProcAnswer{}
	}
	c.procWaits[seq] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.procWaits, seq)
		c.mu.Unlock()
	}()
	if err := c.send(kind, frame(seq)); err != nil {
		return gvwire.ProcAnswer{}, err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case a := <-ch:
		return a, nil
	case <-c.dead:
		return gvwire.ProcAnswer{}, errInitGone
	case <-t.C:
		return gvwire.ProcAnswer{}, fmt.Errorf("no answer within %v", timeout)
	case <-ctx.Done():
		return gvwire.ProcAnswer{}, ctx.Err()
	}
}

// procAnswered hands a proc answer to the request waiting for it; one
// nobody waits for (it timed out) is dropped.
func (c *initConn) procAnswered(p []byte) error {
	a, err := gvwire.DecodeProcAnswer(p)
	if err != nil {
		return err
	}
	c.mu.Lock()
	ch := c.procWaits[a.Seq]
	delete(c.procWaits, a.Seq)
	c.mu.Unlock()
	if ch != nil {
		ch <- a
	}
	return nil
}
