package lifecycle

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/internal/handoff"
)

// InlineExec reports whether Exec may run on the goroutine that read its
// request (see backend.InlineExecer): Exec releases the connection before
// it waits itself (for a recovery still adopting the sandbox, use; to
// destroy a sandbox the backend gave up on).
func (m *Manager) InlineExec() bool {
	_, ok := m.be.(backend.InlineExecer)
	return ok
}

// Exec runs one command. Commands in one sandbox run one at a time: a
// second one while the first runs is refused with a QuotaError
// (commands_per_sandbox), never queued, so no call waits an unbounded time
// for another. The budget is cut to what is left of the sandbox's life, and
// AppliedTimeout says so.
func (m *Manager) Exec(ctx context.Context, c Caller, id string, req backend.ExecRequest) (backend.ExecResult, error) {
	r, done, err := m.use(ctx, c, id)
	if err != nil {
		return backend.ExecResult{}, err
	}
	defer done()
	release, err := m.takeCommandSlot(c, r)
	if err != nil {
		return backend.ExecResult{}, err
	}
	defer release()

	m.mu.Lock()
	first, source := r.commands == 0 && r.source != "", r.source
	r.commands++
	m.lastCommand = time.Now()
	left := r.ExpiresAt.Sub(m.cfg.Now())
	req.Env = r.withEnv(req.Env)
	m.mu.Unlock()
	if left < req.Timeout {
		req.Timeout = max(left, time.Millisecond)
	}
	start := time.Now()
	res, err := m.be.Exec(ctx, id, req)
	if err != nil {
		m.obs.CommandDone("error", time.Since(start), first, source, 0)
		return res, err
	}
	took := time.Since(start)
	m.mu.Lock()
	m.lastCommand = time.Now()
	still := m.boxes[id] == r && r.State == StateReady
	// The backend gave up on the sandbox to stop the command: destroy it,
	// unless the reaper or a client claimed it first.
	claimed := still && res.SandboxTerminated && m.claimForDestroy(r)
	m.mu.Unlock()
	switch {
	case claimed:
		handoff.Release(ctx) // a destroy waits
		m.failpoint(FailExecTerminated)
		m.destroyNow(r, "terminated by the backend", m.log.With("sandbox", id))
	case !still:
		// Destroyed (by the client, the reaper or shutdown) meanwhile.
		res.SandboxTerminated = true
	}
	m.obs.CommandDone(res.Reason(), took, first, source, res.OOMKills)
	return res, nil
}

// takeCommandSlot takes the slots one command (or cell) holds while it
// runs: its sandbox's one, one of its uid's and one of the host's; or
// refuses with the QuotaError of the first that is full.
func (m *Manager) takeCommandSlot(c Caller, r *record) (release func(), err error) {
	select {
	case r.cmd <- struct{}{}:
	default:
		return nil, &QuotaError{Scope: "commands_per_sandbox", Limit: 1}
	}
	if err := m.takeUIDCmd(c.UID); err != nil {
		<-r.cmd
		return nil, err
	}
	select {
	case m.hostCmds <- struct{}{}:
	default:
		m.giveUIDCmd(c.UID)
		<-r.cmd
		return nil, &QuotaError{Scope: "commands_per_host", Limit: m.cfg.MaxCmdsPerHost}
	}
	return func() {
		<-m.hostCmds
		m.giveUIDCmd(c.UID)
		<-r.cmd
	}, nil
}

// takeUIDCmd takes one of uid's command slots, or refuses with
// commands_per_uid: one uid running commands in all its sandboxes must
// not leave another uid without a host slot.
func (m *Manager) takeUIDCmd(uid uint32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.uidCmds[uid] >= m.cfg.MaxCmdsPerUID {
		return &QuotaError{Scope: "commands_per_uid", Limit: m.cfg.MaxCmdsPerUID}
	}
	m.uidCmds[uid]++
	return nil
}

func (m *Manager) giveUIDCmd(uid uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.uidCmds[uid]--; m.uidCmds[uid] <= 0 {
		delete(m.uidCmds, uid)
	}
}

// ReadFile reads a file from a sandbox.
func (m *Manager) ReadFile(ctx context.Context, c Caller, id, path string, maxBytes int64) ([]byte, error) {
	_, done, err := m.use(ctx, c, id)
	if err != nil {
		return nil, err
	}
	defer done()
	return m.be.ReadFile(ctx, id, path, maxBytes)
}

// WriteFile writes a file into a sandbox.
func (m *Manager) WriteFile(ctx context.Context, c Caller, id, path string, data []byte, mode os.FileMode) error {
	_, done, err := m.use(ctx, c, id)
	if err != nil {
		return err
	}
	defer done()
	return m.be.WriteFile(ctx, id, path, data, mode)
}

// ranged is the backend's piecewise file operations, or an error saying
// this backend has none.
func (m *Manager) ranged() (backend.RangedFiles, error) {
	rb, ok := m.be.(backend.RangedFiles)
	if !ok {
		return nil, fmt.Errorf("%w: the %s backend cannot move a file in pieces (offset, length, append); read or write it whole", backend.ErrInvalidArgument, m.be.Name())
	}
	return rb, nil
}

// ReadFileRange reads up to length bytes of a sandbox's file from offset,
// and the file's size.
func (m *Manager) ReadFileRange(ctx context.Context, c Caller, id, path string, offset, length int64) ([]byte, int64, error) {
	rb, err := m.ranged()
	if err != nil {
		return nil, 0, err
	}
	_, done, err := m.use(ctx, c, id)
	if err != nil {
		return nil, 0, err
	}
	defer done()
	return rb.ReadFileRange(ctx, id, path, offset, length)
}

// WriteFileAt writes data into a sandbox's existing file at offset (its end
// when negative) and returns the file's size after.
func (m *Manager) WriteFileAt(ctx context.Context, c Caller, id, path string, data []byte, offset int64) (int64, error) {
	rb, err := m.ranged()
	if err != nil {
		return 0, err
	}
	_, done, err := m.use(ctx, c, id)
	if err != nil {
		return 0, err
	}
	defer done()
	return rb.WriteFileAt(ctx, id, path, data, offset)
}

// ListDirectory lists a directory of a sandbox.
func (m *Manager) ListDirectory(ctx context.Context, c Caller, id, path string, maxEntries int) ([]backend.DirEntry, error) {
	_, done, err := m.use(ctx, c, id)
	if err != nil {
		return nil, err
	}
	defer done()
	return m.be.ListDirectory(ctx, id, path, maxEntries)
}
