package lifecycle

import (
	"context"
	"fmt"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// Code contexts (backend.CodeRunner): a cell is a command as far as the
// quotas go (one at a time per sandbox, and per uid and host), and its
// budget is cut to what is left of the sandbox's life.

func (m *Manager) coder() (backend.CodeRunner, error) {
	cr, ok := m.be.(backend.CodeRunner)
	if !ok {
		return nil, fmt.Errorf("%w: the %s backend has no code contexts; run python3 with run_command", backend.ErrUnsupported, m.be.Name())
	}
	return cr, nil
}

// RunCode runs one cell in a sandbox's code context.
func (m *Manager) RunCode(ctx context.Context, c Caller, id string, req backend.CodeRequest) (backend.CodeResult, error) {
	cr, err := m.coder()
	if err != nil {
		return backend.CodeResult{}, err
	}
	r, done, err := m.use(ctx, c, id)
	if err != nil {
		return backend.CodeResult{}, err
	}
	defer done()
	release, err := m.takeCommandSlot(c, r)
	if err != nil {
		return backend.CodeResult{}, err
	}
	defer release()
	m.mu.Lock()
	left := r.ExpiresAt.Sub(m.cfg.Now())
	req.Env = r.withEnv(req.Env)
	m.mu.Unlock()
	if req.Timeout > left {
		req.Timeout = max(left, time.Millisecond)
	}
	return cr.RunCode(ctx, id, req)
}

// ListContexts lists a sandbox's code contexts.
func (m *Manager) ListContexts(ctx context.Context, c Caller, id string) ([]backend.ContextInfo, error) {
	return through(m, ctx, c, id, m.coder, func(cr backend.CodeRunner) ([]backend.ContextInfo, error) {
		return cr.ListContexts(ctx, id)
	})
}

// DeleteContext ends one of a sandbox's code contexts.
func (m *Manager) DeleteContext(ctx context.Context, c Caller, id, name string) error {
	_, err := through(m, ctx, c, id, m.coder, func(cr backend.CodeRunner) (struct{}, error) {
		return struct{}{}, cr.DeleteContext(ctx, id, name)
	})
	return err
}

// RestartContext ends one of a sandbox's code contexts' state and keeps
// the context, fresh.
func (m *Manager) RestartContext(ctx context.Context, c Caller, id, name string) error {
	_, err := through(m, ctx, c, id, m.coder, func(cr backend.CodeRunner) (struct{}, error) {
		return struct{}{}, cr.RestartContext(ctx, id, name)
	})
	return err
}
