package lifecycle

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// Durable processes (backend.Processes): the manager checks who may use
// the sandbox, as for every op, and bounds the processes running per uid
// and per host; the backend bounds them per sandbox and keeps them.

// processes is the backend's durable processes, or an error saying it has
// none.
func (m *Manager) processes() (backend.Processes, error) {
	p, ok := m.be.(backend.Processes)
	if !ok {
		return nil, fmt.Errorf("%w: the %s backend cannot run a process that outlives its call; run it with run_command", backend.ErrUnsupported, m.be.Name())
	}
	return p, nil
}

// StartProcess starts a durable process in sandbox id.
func (m *Manager) StartProcess(ctx context.Context, c Caller, id string, req backend.ProcessRequest) (backend.ProcessInfo, error) {
	pb, err := m.processes()
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	r, done, err := m.use(ctx, c, id)
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	defer done()
	if err := m.roomForProcess(ctx, pb, r.UID); err != nil {
		return backend.ProcessInfo{}, err
	}
	m.mu.Lock()
	req.Env = r.withEnv(req.Env)
	m.mu.Unlock()
	p, err := pb.StartProcess(ctx, id, req)
	if err == nil && !p.Existing {
		m.mu.Lock()
		m.procs[id]++
		m.mu.Unlock()
		m.obs.ProcessStarted()
	}
	return p, err
}

// roomForProcess refuses a start when uid, or the host, runs as many
// durable processes as it may. The counts kept are upper bounds (a process
// ends without telling the manager): met, they are counted again from the
// backend before anything is refused.
func (m *Manager) roomForProcess(ctx context.Context, pb backend.Processes, uid uint32) error {
	full := func() (scope string, limit int) {
		m.mu.Lock()
		defer m.mu.Unlock()
		host, mine := 0, 0
		for id, n := range m.procs {
			host += n
			if r := m.boxes[id]; r != nil && r.UID == uid {
				mine += n
			}
		}
		switch {
		case mine >= m.cfg.MaxProcsPerUID:
			return "processes_per_uid", m.cfg.MaxProcsPerUID
		case host >= m.cfg.MaxProcsPerHost:
			return "processes_per_host", m.cfg.MaxProcsPerHost
		}
		return "", 0
	}
	if scope, _ := full(); scope == "" {
		return nil
	}
	m.recountProcesses(ctx, pb)
	if scope, limit := full(); scope != "" {
		return &QuotaError{Scope: scope, Limit: limit}
	}
	return nil
}

// recountProcesses counts the running processes of every sandbox the
// counts say has some.
func (m *Manager) recountProcesses(ctx context.Context, pb backend.Processes) {
	m.mu.Lock()
	ids := make([]string, 0, len(m.procs))
	for id := range m.procs {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	for _, id := range ids {
		list, err := pb.ListProcesses(ctx, id)
		n := 0
		for _, p := range list {
			if p.Running {
				n++
			}
		}
		m.mu.Lock()
		// A sandbox whose processes all ended stays, at 0, while it keeps
		// their records: ProcessStats reads them.
		if err != nil || len(list) == 0 || m.boxes[id] == nil {
			delete(m.procs, id)
		} else {
			m.procs[id] = n
		}
		m.mu.Unlock()
	}
}

// countAdoptedProcesses counts the processes of id, just adopted, that
// outlived the previous daemon, so the per-uid and host bounds (and the
// metrics) include them: without it a restarted daemon would let each
// uid start its whole quota again on top of what still runs.
func (m *Manager) countAdoptedProcesses(ctx context.Context, id string) {
	pb, ok := m.be.(backend.Processes)
	if !ok {
		return
	}
	list, err := pb.ListProcesses(ctx, id)
	if err != nil || len(list) == 0 {
		return
	}
	n := 0
	for _, p := range list {
		if p.Running {
			n++
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.boxes[id] != nil {
		m.procs[id] = n
	}
}

// forgetProcesses drops a destroyed sandbox's count; m.mu is held.
func (m *Manager) forgetProcesses(id string) {
	delete(m.procs, id)
}

// ReadOutput reads one stream of a durable process.
func (m *Manager) ReadOutput(ctx context.Context, c Caller, id, proc string, stderr bool, offset int64, maxBytes int, wait time.Duration) (backend.OutputRead, error) {
	pb, err := m.processes()
	if err != nil {
		return backend.OutputRead{}, err
	}
	_, done, err := m.useResumed(ctx, c, id)
	if err != nil {
		return backend.OutputRead{}, err
	}
	defer done()
	return pb.ReadOutput(ctx, id, proc, stderr, offset, maxBytes, wait)
}

// WaitProcess waits up to wait for a durable process's end.
func (m *Manager) WaitProcess(ctx context.Context, c Caller, id, proc string, wait time.Duration) (backend.ProcessInfo, error) {
	pb, err := m.processes()
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	_, done, err := m.useResumed(ctx, c, id)
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	defer done()
	return pb.WaitProcess(ctx, id, proc, wait)
}

// SignalProcess sends sig to a durable process's group.
func (m *Manager) SignalProcess(ctx context.Context, c Caller, id, proc string, sig syscall.Signal) error {
	_, err := through(m, ctx, c, id, m.processes, func(pb backend.Processes) (struct{}, error) {
		return struct{}{}, pb.SignalProcess(ctx, id, proc, sig)
	})
	return err
}

// ListProcesses lists a sandbox's durable processes.
func (m *Manager) ListProcesses(ctx context.Context, c Caller, id string) ([]backend.ProcessInfo, error) {
	return through(m, ctx, c, id, m.processes, func(pb backend.Processes) ([]backend.ProcessInfo, error) {
		return pb.ListProcesses(ctx, id)
	})
}
