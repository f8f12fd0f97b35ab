package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/resources"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/cgroup"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

// Per-sandbox memory, process and CPU limits: a cgroup of the daemon's
// cgroup manager per sandbox (the same as the bubblewrap backend's), into
// which `runsc run` is started, so runsc's sandbox (the sentry) and gofer,
// forked by it, are born there. runsc runs with --ignore-cgroups: left to
// itself it makes a cgroup per container at the top of each hierarchy
// (named after the container, even without a cgroupsPath in the spec) and
// moves the sentry and gofer there. The guest's processes live inside
// the sentry, but on systrap (and ptrace) each guest address space is also
// a host stub process in the group. At the sandbox's memory limit the
// daemon has init kill the guest's largest process (memory.go); the
// group's hard limit is a headroom above it, where the host's OOM killer
// takes the sentry (the sandbox dies whole: sandbox_terminated with
// oom_killed) or one stub (that guest process ends; classify).

// effectiveLimits is what one sandbox gets (resources.Effective): it
// refuses any disk cap, and the daemon's disk limit is reported off, never
// silently applied, as this backend enforces none.
func (b *Backend) effectiveLimits(r backend.Resources) (limits.Limits, error) {
	return resources.Effective(b.cfg.Limits, r, resources.Enforced{Cgroups: b.cfg.Cgroups != nil, Disk: false, Who: "the gvisor backend", DropDisk: true})
}

// makeCgroup gives sb a fresh cgroup with its limits (resources.MakeCgroup).
func (b *Backend) makeCgroup(ctx context.Context, sb *sandbox) error {
	cg, err := resources.MakeCgroup(ctx, b.cfg.Cgroups, sb.containerID(), sb.id, sb.limits)
	if err != nil {
		return err
	}
	sb.cg = cg
	return nil
}

// removeCgroup kills whatever is left in sb's cgroup and removes it. Unlike
// the bubblewrap backend's, a group that is not found is success here.
func (b *Backend) removeCgroup(sb *sandbox) error {
	if err := resources.RemoveCgroup(b.cfg.Cgroups, sb.containerID(), sb.id); err != nil && !errors.Is(err, cgroup.ErrNotFound) {
		return err
	}
	return nil
}

// sweepCgroups removes every sandbox cgroup under the manager's base but
// those of the runsc sandboxes in live (by container name, which is the
// cgroup's): New calls it once no sandbox of this process runs, Close once
// none does but those it leaves running.
func (b *Backend) sweepCgroups(live map[string]bool) {
	resources.SweepCgroups(b.cfg.Cgroups, b.log, func(name string) bool { return live[name] })
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

// stubLostStatus is the exit status gVisor gives a guest process whose
// address space it lost. On the systrap and ptrace platforms every guest
// address space is a host "stub" process in the sandbox's cgroup, and the
// host's OOM killer may pick one instead of the sentry: the sentry then
// ends the guest process with EPERM ("systrap corrupted memory: subprocess
// died" in its log), a plain exit 1 rather than a signal.
const stubLostStatus = 1

// classify decides why a command that ended by itself ended
// (backend.Classify), from init's report in res and the sandbox's OOM
// counter. A guest process that exits stubLostStatus while the counter
// rose lost its address space to the OOM killer, and is reported as the
// kernel's kill it was: oom_killed, 137. One that survived a kill (of a
// child) with any other status keeps its own, with oom_kills counted.
func (b *Backend) classify(sb *sandbox, res *backend.ExecResult, outerFired, guestTimedOut bool, oomBefore uint64) {
	f := backend.Facts{ExitCode: res.ExitCode, Elapsed: res.Duration, Applied: res.AppliedTimeout,
		KillAfter: backend.GuestTimeout(b.cfg.KillGrace), OuterFired: outerFired, GuestTimedOut: guestTimedOut, Ended: true}
	if sb.cg != nil {
		f.OOMCounted, f.OOMBefore, f.OOMAfter = true, oomBefore, sb.oomKills()
		if f.OOMAfter > f.OOMBefore && f.ExitCode == stubLostStatus {
			f.ExitCode = backend.ExitKilled
		}
	}
	o := backend.Classify(f)
	o.Apply(res)
	if o.OOMKilled {
		res.ExitCode = backend.ExitKilled
	}
}

// oomKills is sb's count of OOM kills: its cgroup's OOM-kill counter and
// the guest processes the daemon killed at its memory limit (memory.go);
// 0 without a cgroup.
func (sb *sandbox) oomKills() uint64 {
	if sb.cg == nil {
		return 0
	}
	n, _ := sb.cg.OOMKills()
	return n + sb.reclaims.Load()
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
