package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/cgroup"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

// Per-sandbox memory, process and CPU limits: a cgroup of the daemon's
// cgroup manager per sandbox (the same as the bubblewrap backend's), into
// which `runsc run` is started, so runsc's sandbox (the sentry) and gofer,
// forked by it, are born there. runsc runs with --ignore-cgroups: left to
// itself it makes a cgroup per container at the top of each hierarchy
// (named after the container, even without a cgroupsPath in the spec) and
// moves the sentry and gofer there. The guest's processes live
// inside the sentry, so the host's OOM killer can only kill the sentry (or
// the gofer): a sandbox past its memory limit dies whole, and its command
// reports sandbox_terminated with oom_killed set.

// cgroupWait bounds killing and removing one sandbox's cgroup.
const cgroupWait = 10 * time.Second

// effectiveLimits is what one sandbox gets: the daemon's limits, lowered
// where its spec asked for less. It refuses more than the daemon allows,
// a limit this host cannot enforce, and any disk cap.
func (b *Backend) effectiveLimits(r backend.Resources) (limits.Limits, error) {
	l := b.cfg.Limits
	var errs []error
	lower := func(name string, asked, ceiling float64, enforced bool, set func()) {
		switch {
		case asked == 0:
		case asked < 0:
			errs = append(errs, fmt.Errorf("%s %v is negative", name, asked))
		case !enforced:
			errs = append(errs, fmt.Errorf("%s cannot be limited by the gvisor backend on this host (see the daemon's health: limits)", name))
		case ceiling > 0 && asked > ceiling:
			errs = append(errs, fmt.Errorf("%s %v exceeds the daemon's maximum %v", name, asked, ceiling))
		default:
			set()
		}
	}
	cg := b.cfg.Cgroups != nil
	lower("memory_bytes", float64(r.MemoryBytes), float64(l.MemoryBytes), cg, func() { l.MemoryBytes = r.MemoryBytes })
	lower("cpus", r.CPUs, l.CPUs, cg, func() { l.CPUs = r.CPUs })
	lower("pids", float64(r.PIDs), float64(l.PIDs), cg, func() { l.PIDs = r.PIDs })
	lower("disk_bytes", float64(r.DiskBytes), float64(l.DiskBytes), false, nil)
	if err := errors.Join(errs...); err != nil {
		return l, fmt.Errorf("%w: %v; ask for less, or leave the field out to get the daemon's default", backend.ErrSpecUnenforceable, err)
	}
	// Disk caps are not enforced by this backend: the daemon's disk limit
	// is reported off, never silently applied.
	l.DiskBytes, l.DiskInodes = 0, 0
	if err := l.Validate(); err != nil {
		return l, fmt.Errorf("%w: %v", backend.ErrSpecUnenforceable, err)
	}
	return l, nil
}

// makeCgroup gives sb a fresh cgroup with its limits, replacing one of that
// name a previous daemon left. Without a manager it does nothing.
func (b *Backend) makeCgroup(ctx context.Context, sb *sandbox) error {
	if b.cfg.Cgroups == nil {
		return nil
	}
	l := cgroup.Limits{MemoryBytes: sb.limits.MemoryBytes, PIDs: sb.limits.PIDs, CPUs: sb.limits.CPUs, CPUWeight: sb.limits.CPUWeight}
	name := sb.containerID()
	cg, err := b.cfg.Cgroups.Create(name, l)
	if errors.Is(err, fs.ErrExist) {
		rctx, cancel := context.WithTimeout(ctx, cgroupWait)
		rmErr := b.cfg.Cgroups.Remove(rctx, name)
		cancel()
		if rmErr != nil {
			return fmt.Errorf("%w: a stale cgroup of sandbox %s cannot be removed: %v", backend.ErrUnavailable, sb.id, rmErr)
		}
		cg, err = b.cfg.Cgroups.Create(name, l)
	}
	if err != nil {
		return fmt.Errorf("%w: cannot give sandbox %s its cgroup: %v", backend.ErrUnavailable, sb.id, err)
	}
	sb.cg = cg
	return nil
}

// removeCgroup kills whatever is left in sb's cgroup and removes it.
func (b *Backend) removeCgroup(sb *sandbox) error {
	if b.cfg.Cgroups == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), cgroupWait)
	defer cancel()
	if err := b.cfg.Cgroups.Remove(ctx, sb.containerID()); err != nil && !errors.Is(err, cgroup.ErrNotFound) {
		return fmt.Errorf("remove the cgroup of sandbox %s: %w", sb.id, err)
	}
	return nil
}

// sweepCgroups removes every sandbox cgroup under the manager's base: New
// calls it once no sandbox of this process runs.
func (b *Backend) sweepCgroups() {
	if b.cfg.Cgroups == nil {
		return
	}
	names, err := b.cfg.Cgroups.List()
	if err != nil {
		b.log.Warn("cannot list sandbox cgroups left by a previous daemon", "error", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cgroupWait)
	defer cancel()
	for _, name := range names {
		if err := b.cfg.Cgroups.Remove(ctx, name); err != nil {
			b.log.Warn("cannot remove a sandbox cgroup left by a previous daemon", "cgroup", name, "error", err)
		}
	}
}

// placed starts cmd inside sb's cgroup: on v2 it is born there
// (CLONE_INTO_CGROUP); on v1 a shell holds it at a pipe until its pid has
// been moved in, then execs it. Every process runsc forks inherits the
// group. Without a cgroup it just starts cmd.
func (b *Backend) placed(sb *sandbox, cmd *exec.Cmd) (release func() error, err error) {
	noop := func() error { return nil }
	if sb.cg == nil {
		return noop, cmd.Start()
	}
	if fd, err := sb.cg.FD(); err == nil {
		defer fd.Close()
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(fd.Fd())
		return noop, cmd.Start()
	}
	gateR, gateW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer gateR.Close()
	first := 3 + len(cmd.ExtraFiles)
	cmd.ExtraFiles = append(cmd.ExtraFiles, gateR)
	script := "read -r _ <&" + strconv.Itoa(first) + "; exec " + strconv.Itoa(first) + "<&-; exec \"$0\" \"$@\""
	cmd.Args = append([]string{"/bin/sh", "-c", script, cmd.Path}, cmd.Args[1:]...)
	cmd.Path = "/bin/sh"
	if err := cmd.Start(); err != nil {
		gateW.Close()
		return nil, err
	}
	if err := sb.cg.Add(cmd.Process.Pid); err != nil {
		gateW.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("cannot move runsc into the sandbox's cgroup: %w", err)
	}
	return func() error {
		defer gateW.Close()
		_, err := gateW.Write([]byte("go\n"))
		return err
	}, nil
}

// oomKills reads sb's cgroup OOM-kill counter (0 without one).
func (sb *sandbox) oomKills() uint64 {
	if sb.cg == nil {
		return 0
	}
	n, _ := sb.cg.OOMKills()
	return n
}

// LimitsInForce names the mechanism enforcing each limit.
func (b *Backend) LimitsInForce() map[string]string {
	l := b.cfg.Limits
	mech := func(configured, on bool, how string) string {
		switch {
		case !configured:
			return "none"
		case !on:
			return "off"
		}
		return how
	}
	cg := "off"
	if b.cfg.Cgroups != nil {
		cg = "cgroup v" + strconv.Itoa(int(b.cfg.Cgroups.Version()))
	}
	on := b.cfg.Cgroups != nil
	return map[string]string{
		"memory":     mech(l.MemoryBytes > 0, on, cg),
		"pids":       mech(l.PIDs > 0, on, cg),
		"cpu":        mech(l.CPUs > 0 || l.CPUWeight > 0, on, cg),
		"disk":       mech(l.DiskBytes > 0, false, ""),
		"open_files": mech(l.OpenFiles > 0, true, "rlimit"),
		"file_size":  mech(l.FileSizeBytes > 0, true, "rlimit"),
		"syscalls":   "gvisor",
	}
}
