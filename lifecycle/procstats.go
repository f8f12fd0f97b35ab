package lifecycle

import (
	"cmp"
	"context"
	"slices"
)

// ProcessStats is what the durable processes of the sandboxes known to
// have some amount to now, for metrics (ProcessStats).
type ProcessStats struct {
	// Running counts the processes running.
	Running int
	// Ended counts the ended processes whose records are kept, by reason
	// (exited, killed, timed_out, oom_killed, sandbox_terminated): a
	// sandbox keeps its last ended ones (processes.max_ended), and they go
	// with it.
	Ended map[string]int
	// LogBytesDropped is how many bytes the kept processes wrote that
	// their logs no longer hold: past a stream's ring (processes.log_bytes)
	// the oldest bytes are dropped.
	LogBytesDropped int64
	// Sandboxes is how many sandboxes were looked at; Skipped how many
	// known to have processes were not (past the bound, or out of time),
	// and are counted in nothing above.
	Sandboxes, Skipped int
}

// ProcessStats sums, over the sandboxes this daemon has started a
// durable process in and not yet destroyed, what the backend lists of
// their processes. logBytes is each stream's ring (processes.log_bytes):
// a stream that took more dropped the difference. At most maxSandboxes
// are looked at, those with the most running processes first, and none
// once ctx is done, so the cost of a call is bounded whatever clients
// ran. ok is false when the backend has no durable processes.
func (m *Manager) ProcessStats(ctx context.Context, logBytes int64, maxSandboxes int) (st ProcessStats, ok bool) {
	pb, err := m.processes()
	if err != nil {
		return ProcessStats{}, false
	}
	type counted struct {
		id string
		n  int
	}
	m.mu.Lock()
	ids := make([]counted, 0, len(m.procs))
	for id, n := range m.procs {
		if m.boxes[id] != nil {
			ids = append(ids, counted{id, n})
		}
	}
	m.mu.Unlock()
	slices.SortFunc(ids, func(a, b counted) int {
		if c := cmp.Compare(b.n, a.n); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	st.Ended = map[string]int{}
	for i, c := range ids {
		if i >= maxSandboxes || ctx.Err() != nil {
			st.Skipped = len(ids) - i
			break
		}
		list, err := pb.ListProcesses(ctx, c.id)
		if err != nil {
			continue // destroyed meanwhile, or its records unreadable
		}
		st.Sandboxes++
		for _, p := range list {
			if p.Running {
				st.Running++
			} else {
				st.Ended[p.Reason]++
			}
			if logBytes > 0 {
				st.LogBytesDropped += max(0, p.StdoutBytes-logBytes) + max(0, p.StderrBytes-logBytes)
			}
		}
	}
	return st, true
}
