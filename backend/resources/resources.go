// Package resources is the per-sandbox resource handling the bubblewrap and
// gVisor backends share: the limits one sandbox gets from the daemon's and
// its spec's, and the life of its cgroup (made, replaced, removed, swept)
// under the daemon's cgroup manager.
package resources

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/cgroup"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

// CgroupWait bounds killing and removing one sandbox's cgroup.
const CgroupWait = 10 * time.Second

// Enforced is what a backend can enforce on this host.
type Enforced struct {
	// Cgroups: memory, CPUs and processes (a cgroup manager is configured).
	Cgroups bool
	// Disk: a disk cap of the sandbox's own.
	Disk bool
	// Who names the backend in the error for a limit it cannot enforce
	// ("the gvisor backend"); empty leaves it unnamed. The backends differ
	// here on purpose: gVisor never enforces a disk cap, so its error says
	// the backend is the reason, not the host.
	Who string
	// DropDisk: the daemon's disk limits are dropped from what the sandbox
	// gets (so reported off, never silently applied), as the gVisor
	// backend, which enforces none, wants; the bubblewrap backend keeps
	// them whether or not it has DiskCaps.
	DropDisk bool
}

// Effective is what one sandbox gets: the daemon's limits, lowered where
// its spec asked for less. It refuses more than the daemon allows and a
// limit this host cannot enforce, with ErrSpecUnenforceable, and so is a
// result limits.Validate refuses.
func Effective(daemon limits.Limits, r backend.Resources, can Enforced) (limits.Limits, error) {
	l := daemon
	where := "on this host"
	if can.Who != "" {
		where = "by " + can.Who + " on this host"
	}
	var errs []error
	lower := func(name string, asked, ceiling float64, enforced bool, set func()) {
		switch {
		case asked == 0:
		case asked < 0:
			errs = append(errs, fmt.Errorf("%s %v is negative", name, asked))
		case !enforced:
			errs = append(errs, fmt.Errorf("%s cannot be limited %s (see the daemon's health: limits)", name, where))
		case ceiling > 0 && asked > ceiling:
			errs = append(errs, fmt.Errorf("%s %v exceeds the daemon's maximum %v", name, asked, ceiling))
		default:
			set()
		}
	}
	lower("memory_bytes", float64(r.MemoryBytes), float64(l.MemoryBytes), can.Cgroups, func() { l.MemoryBytes = r.MemoryBytes })
	lower("cpus", r.CPUs, l.CPUs, can.Cgroups, func() { l.CPUs = r.CPUs })
	lower("pids", float64(r.PIDs), float64(l.PIDs), can.Cgroups, func() { l.PIDs = r.PIDs })
	lower("disk_bytes", float64(r.DiskBytes), float64(l.DiskBytes), can.Disk, func() { l.DiskBytes = r.DiskBytes })
	if err := errors.Join(errs...); err != nil {
		return l, fmt.Errorf("%w: %v; ask for less, or leave the field out to get the daemon's default", backend.ErrSpecUnenforceable, err)
	}
	if can.DropDisk {
		l.DiskBytes, l.DiskInodes = 0, 0
	}
	if err := l.Validate(); err != nil {
		return l, fmt.Errorf("%w: %v", backend.ErrSpecUnenforceable, err)
	}
	return l, nil
}

// CgroupLimits is the part of l a cgroup enforces.
func CgroupLimits(l limits.Limits) cgroup.Limits {
	return cgroup.Limits{MemoryBytes: l.MemoryBytes, PIDs: l.PIDs, CPUs: l.CPUs, CPUWeight: l.CPUWeight}
}

// MakeCgroup gives sandbox id a fresh cgroup name with limits l, replacing
// any group of that name a previous daemon left (its processes are
// killed). Without a manager (m nil) it returns nil, nil.
func MakeCgroup(ctx context.Context, m *cgroup.Manager, name, id string, l limits.Limits) (*cgroup.Cgroup, error) {
	if m == nil {
		return nil, nil
	}
	cg, err := m.Create(name, CgroupLimits(l))
	if errors.Is(err, fs.ErrExist) {
		rctx, cancel := context.WithTimeout(ctx, CgroupWait)
		rmErr := m.Remove(rctx, name)
		cancel()
		if rmErr != nil {
			return nil, fmt.Errorf("%w: a stale cgroup of sandbox %s cannot be removed: %v", backend.ErrUnavailable, id, rmErr)
		}
		cg, err = m.Create(name, CgroupLimits(l))
	}
	if err != nil {
		return nil, fmt.Errorf("%w: cannot give sandbox %s its cgroup: %v", backend.ErrUnavailable, id, err)
	}
	return cg, nil
}

// RemoveCgroup kills whatever is left in sandbox id's cgroup name and
// removes it, within CgroupWait. Without a manager it does nothing.
func RemoveCgroup(m *cgroup.Manager, name, id string) error {
	if m == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), CgroupWait)
	defer cancel()
	if err := m.Remove(ctx, name); err != nil {
		return fmt.Errorf("remove the cgroup of sandbox %s: %w", id, err)
	}
	return nil
}

// SweepCgroups removes every sandbox cgroup under the manager's base but
// those keep names (nil: none) and returns how many it removed. A backend
// calls it when no sandbox of this process runs, so each group was left by
// a daemon that died and whatever still runs in it is a stray. Failures
// are logged to log.
func SweepCgroups(m *cgroup.Manager, log hclog.Logger, keep func(name string) bool) int {
	if m == nil {
		return 0
	}
	names, err := m.List()
	if err != nil {
		log.Warn("cannot list sandbox cgroups left by a previous daemon", "error", err)
		return 0
	}
	if keep != nil {
		names = slices.DeleteFunc(names, keep)
	}
	ctx, cancel := context.WithTimeout(context.Background(), CgroupWait)
	defer cancel()
	// A few at a time: after a crash with thousands of sandboxes this is
	// most of a start's work (each group killed and removed in every
	// hierarchy), and the kernel's share of it runs on every core.
	var removed atomic.Int64
	var wg sync.WaitGroup
	next := make(chan string)
	for range min(sweepWorkers, len(names)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range next {
				if err := m.Remove(ctx, name); err != nil {
					log.Warn("cannot remove a sandbox cgroup left by a previous daemon", "cgroup", name, "error", err)
					continue
				}
				removed.Add(1)
			}
		}()
	}
	for _, name := range names {
		next <- name
	}
	close(next)
	wg.Wait()
	return int(removed.Load())
}

// sweepWorkers bounds the cgroups SweepCgroups removes at once.
const sweepWorkers = 4

// EgressPolicy checks a spec's allow-lists for a daemon whose egress path
// is e (nil: not enabled): ErrSpecUnenforceable without one, naming the
// unit drop-ins that enable it (dropIns), ErrInvalidArgument for a bad
// list.
func EgressPolicy(e *egress.Egress, names, cidrs []string, dropIns string) (egress.Policy, error) {
	if e == nil {
		return egress.Policy{}, fmt.Errorf("%w: egress filtering is not enabled on this daemon, so it cannot limit a sandbox to allow_egress_to or allow_egress_to_cidrs; drop them (the sandbox then has no network), or an operator can enable it ([egress] enabled = true in the config, and %s; see docs/operations.md)", backend.ErrSpecUnenforceable, dropIns)
	}
	p, err := egress.ParsePolicy(names, cidrs)
	if err != nil {
		return p, fmt.Errorf("%w: %v", backend.ErrInvalidArgument, err)
	}
	return p, nil
}
