package bwrap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/resources"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/cgroup"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/disk"
)

// Pause (backend.Pauser): a sandbox's cgroup frozen. Every process of the
// sandbox is in it (its bwrap, its init, its commands, durable processes
// and code contexts, the opener), so the kernel stops them all where they
// are and they use no CPU until thawed; their memory stays where it is.
// The kernel keeps a group frozen whoever froze it, so a paused sandbox
// outlives its daemon: the next daemon finds its group frozen when it
// loads the sandbox (loadPaused), keeps it paused without touching its
// init (a frozen init cannot answer the re-attach), and re-attaches to the
// init at the resume.

var _ backend.Pauser = (*Backend)(nil)

// FailResumeThawed: a resume thawed the sandbox's group, and has not
// re-attached to an init a previous daemon left in it.
const FailResumeThawed = "bwrap-resume-thawed"

// CanPause implements backend.Pauser: only sandboxes with a cgroup of
// their own, on a host whose cgroups can freeze, can be paused.
func (b *Backend) CanPause() error {
	if b.cfg.Cgroups == nil {
		return fmt.Errorf("%w: the bwrap backend pauses a sandbox by freezing its cgroup, and this daemon runs without sandbox cgroups (limits.cgroups off, or not root nor given a delegated cgroup); see docs/operations.md, Paused sandboxes", backend.ErrUnsupported)
	}
	if err := b.cfg.Cgroups.CanFreeze(); err != nil {
		return fmt.Errorf("%w: %v; see docs/operations.md, Paused sandboxes", backend.ErrUnsupported, err)
	}
	return nil
}

// errPaused is the answer to an operation that needs sb's processes while
// they are frozen.
func (sb *sandbox) errPaused() error {
	return fmt.Errorf("%w: sandbox %s is paused; resume it first", backend.ErrPaused, sb.id)
}

// Pause implements backend.Pauser. It waits for an init's start under way
// (it holds the init's lock while it freezes), and refuses a sandbox whose
// init runs a command or its warm-up.
func (b *Backend) Pause(ctx context.Context, id string) (backend.PauseInfo, error) {
	if err := b.CanPause(); err != nil {
		return backend.PauseInfo{}, err
	}
	sb, err := b.lookup(id)
	if err != nil {
		return backend.PauseInfo{}, err
	}
	opCtx, done, err := sb.begin(ctx)
	if err != nil {
		return backend.PauseInfo{}, err
	}
	defer done()
	sb.lockInit(opCtx)
	defer sb.initMu.Unlock()
	switch {
	case sb.paused:
		return backend.PauseInfo{}, nil
	case sb.initGone:
		return backend.PauseInfo{}, fmt.Errorf("%w: sandbox %q was terminated (its init process died); destroy it and create a new one", backend.ErrNotFound, id)
	case sb.init != nil && sb.init.busy:
		return backend.PauseInfo{}, fmt.Errorf("%w: sandbox %s runs a command; pause it once the command ended", backend.ErrBusy, id)
	case sb.cg == nil:
		return backend.PauseInfo{}, fmt.Errorf("%w: sandbox %s has no cgroup to freeze", backend.ErrUnavailable, id)
	}
	start := time.Now()
	if err := sb.cg.Freeze(opCtx); err != nil {
		return backend.PauseInfo{}, fmt.Errorf("%w: cannot pause sandbox %s (it runs on as it was): %v", backend.ErrUnavailable, id, err)
	}
	sb.paused = true
	b.log.With("sandbox", id).Info("sandbox paused", "took", time.Since(start))
	return backend.PauseInfo{}, nil
}

// Resume implements backend.Pauser. A sandbox a previous daemon paused has
// its init re-attached once it runs again (as at any load); an init that
// cannot be kept is replaced, as then, and its processes end.
func (b *Backend) Resume(ctx context.Context, id string) error {
	sb, err := b.lookup(id)
	if err != nil {
		return err
	}
	opCtx, done, err := sb.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	sb.lockInit(opCtx)
	defer sb.initMu.Unlock()
	if !sb.paused {
		return nil
	}
	start := time.Now()
	if err := sb.cg.Thaw(); err != nil {
		return fmt.Errorf("%w: cannot resume sandbox %s (it stays paused): %v", backend.ErrUnavailable, id, err)
	}
	sb.paused = false
	b.failpoint(FailResumeThawed)
	if sb.reattach {
		sb.reattach = false
		sb.init = b.adoptLiveInit(sb)
		if sb.init == nil {
			// None could be kept (or none was there): a fresh group for
			// the next start, as for any sandbox loaded without a live
			// init, which ends whatever is left in the old one.
			if err := b.makeCgroup(opCtx, sb); err != nil {
				return err
			}
		}
	}
	b.log.With("sandbox", id).Info("sandbox resumed", "took", time.Since(start))
	return nil
}

// Paused implements backend.Pauser: what this process found when it
// loaded the sandbox (its group frozen or not) and did since. A frozen
// sandbox keeps its memory.
func (b *Backend) Paused(ctx context.Context, id string) (*backend.PauseInfo, error) {
	sb, err := b.lookup(id)
	if err != nil {
		return nil, err
	}
	sb.lockInit(ctx)
	defer sb.initMu.Unlock()
	if !sb.paused {
		return nil, nil
	}
	return &backend.PauseInfo{}, nil
}

// loadPaused takes a sandbox being loaded as it is when its cgroup is
// frozen (a previous daemon paused it): paused, its group kept, its disk
// mounted here too (the frozen processes hold it in the previous daemon's
// mount namespace), and its init left alone until the resume. It reports
// whether it did.
func (b *Backend) loadPaused(sb *sandbox) (bool, error) {
	if b.cfg.Cgroups == nil {
		return false, nil
	}
	if _, err := os.Lstat(filepath.Join(sb.dir, resources.HeldMarker)); err == nil {
		// Frozen by a snapshot a dead daemon did not finish, not paused:
		// thawed as the load goes on (thawLeftHeld). A snapshot never
		// marks a paused sandbox held.
		return false, nil
	}
	cg, err := b.cfg.Cgroups.Open(sb.cgroupName())
	if err != nil {
		return false, nil
	}
	frozen, err := cg.Freezing()
	if err != nil || !frozen {
		return false, nil
	}
	if sb.disk {
		if mounted, err := disk.Mounted(sb.dataDir()); err != nil || !mounted {
			if err := disk.MountAttached(filepath.Join(sb.dir, diskImageName), sb.dataDir()); err != nil {
				return false, fmt.Errorf("%w: sandbox %s is paused, and its disk cannot be mounted here: %v", backend.ErrUnavailable, sb.id, err)
			}
		}
	}
	sb.cg, sb.paused, sb.reattach = cg, true, true
	b.log.With("sandbox", sb.id).Info("the sandbox is paused (its cgroup is frozen): kept so until it is resumed")
	return true, nil
}

// endPause kills, and so thaws, every process of sb's group if it is
// frozen, before a destroy stops its init: a frozen process dies of its
// SIGKILL only once thawed (cgroup v1), and the init's stop would wait for
// it. A pause under way ends first (it holds the init's lock, and the
// destroy cancelled it).
func (b *Backend) endPause(sb *sandbox) {
	if b.cfg.Cgroups == nil {
		return
	}
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	cg, err := b.cfg.Cgroups.Open(sb.cgroupName())
	if err != nil {
		return
	}
	if frozen, err := cg.Freezing(); err != nil || !frozen {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cgroupWait)
	defer cancel()
	if err := cg.Kill(ctx); err != nil && !errors.Is(err, cgroup.ErrNotFound) {
		b.log.With("sandbox", sb.id).Warn("cannot kill the processes of a paused sandbox being destroyed", "error", err)
	}
	sb.paused, sb.reattach = false, false
}

// frozenGroup reports whether the sandbox cgroup name is frozen: Close
// keeps such a group (a paused sandbox) whether or not this process loaded
// its sandbox.
func (b *Backend) frozenGroup(name string) bool {
	cg, err := b.cfg.Cgroups.Open(name)
	if err != nil {
		return false
	}
	frozen, err := cg.Freezing()
	return err == nil && frozen
}
