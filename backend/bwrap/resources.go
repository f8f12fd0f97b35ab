package bwrap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/resources"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/cgroup"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/disk"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

// Per-sandbox resources: a cgroup (memory, processes, CPU) made when the
// sandbox is created and re-made when a restarted daemon re-adopts it, into
// which every bwrap of the sandbox is started; and, with DiskCaps, a
// filesystem of its own holding /workspace and /tmp.

// Layout of a capped sandbox: Dir/<id>/disk.img mounted on Dir/<id>/vol,
// which holds work/ and tmp/.
const (
	diskImageName = "disk.img"
	// diskTemplatesDir, in Dir, holds the formatted images new disks are
	// copied from; never a valid sandbox id.
	diskTemplatesDir = ".disk-templates"
	diskMountName    = "vol"
)

// Named bounds.
const (
	// cgroupWait bounds killing and removing one sandbox's cgroup.
	cgroupWait = resources.CgroupWait
	// diskCreateTimeout bounds making and formatting one sandbox's image.
	diskCreateTimeout = 60 * time.Second
)

// probeCgroupPrefix names the trial sandbox's cgroup: a '.' is never in a
// sandbox id, so it cannot collide with one.
const probeCgroupPrefix = "probe."

// effectiveLimits is what one sandbox gets (resources.Effective).
func (b *Backend) effectiveLimits(r backend.Resources) (limits.Limits, error) {
	return resources.Effective(b.cfg.Limits, r, resources.Enforced{Cgroups: b.cfg.Cgroups != nil, Disk: b.cfg.DiskCaps})
}

// makeCgroup gives sb a fresh cgroup with its limits (resources.MakeCgroup).
func (b *Backend) makeCgroup(ctx context.Context, sb *sandbox) error {
	cg, err := resources.MakeCgroup(ctx, b.cfg.Cgroups, sb.cgroupName(), sb.id, sb.limits)
	if err != nil {
		return err
	}
	sb.cg = cg
	return nil
}

// removeCgroup kills whatever is left in sb's cgroup and removes it.
func (b *Backend) removeCgroup(sb *sandbox) error {
	return resources.RemoveCgroup(b.cfg.Cgroups, sb.cgroupName(), sb.id)
}

// sweepCgroups removes the sandbox cgroups under the manager's base that
// belong to no sandbox directory: New calls it before any sandbox of this
// process runs, so each one was left by a daemon that died, and whatever
// still runs in it is a stray. The group of a sandbox that still exists is
// left for its next use or its destroy, which replace or remove it (and
// kill what it holds; the marker scan in New already killed every process
// a dead daemon started): after a crash with thousands of sandboxes,
// removing them all here, each in every cgroup v1 hierarchy under the
// kernel's one cgroup lock, was most of the time before the daemon served.
func (b *Backend) sweepCgroups() {
	sandboxes := map[string]bool{}
	if entries, err := os.ReadDir(b.cfg.Dir); err == nil {
		for _, e := range entries {
			if e.IsDir() && backend.ValidID(e.Name()) {
				sandboxes[e.Name()] = true
			}
		}
	}
	if removed := resources.SweepCgroups(b.cfg.Cgroups, b.log, func(name string) bool { return sandboxes[name] }); removed > 0 {
		b.log.Info("removed sandbox cgroups left by a previous daemon", "count", removed)
	}
}

// placement puts a bwrap command into sb's cgroup. On cgroup v2 the
// process is born there (clone3 with CLONE_INTO_CGROUP), and so its
// cgroup namespace is rooted at the sandbox's own group. On v1 bwrap is held
// at --block-fd until its sandbox's first process is moved in. The caller
// calls prepare before starting cmd, started right after, and close in
// every case, once bwrap is dead or running on its own.
type placement struct {
	cg   *cgroup.Cgroup
	fd   *os.File
	gate *limits.Gate
}

func (sb *sandbox) placement() *placement { return &placement{cg: sb.cg} }

// prepare readies cmd, a bwrap whose ExtraFiles are set: on v1 it adds the
// gate's descriptors after them and its options first on the command line.
func (p *placement) prepare(cmd *exec.Cmd) error {
	if p.cg == nil {
		return nil
	}
	if fd, err := p.cg.FD(); err == nil {
		p.fd = fd
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(fd.Fd())
		return nil
	}
	g, err := limits.NewGate()
	if err != nil {
		return err
	}
	p.gate = g
	first := 3 + len(cmd.ExtraFiles)
	cmd.ExtraFiles = append(cmd.ExtraFiles, g.Files()...)
	cmd.Args = append(append([]string{cmd.Args[0]}, g.Args(first, first+1)...), cmd.Args[1:]...)
	return nil
}

// started finishes the placement once cmd runs: on v1, moves bwrap's
// child into the group and lets it go on. An error means the sandbox's
// process is outside its group: the caller kills bwrap.
func (p *placement) started() error {
	if p.gate == nil {
		return nil
	}
	pid, err := p.gate.ChildPID()
	if err != nil {
		return err
	}
	if err := p.cg.Add(pid); err != nil {
		return err
	}
	return p.gate.Release()
}

func (p *placement) close() {
	if p.fd != nil {
		p.fd.Close()
	}
	if p.gate != nil {
		p.gate.Close()
	}
}

// oomCounter is sb's cgroup OOM-kill counter, read before and after every
// command. The sandbox's init holds it (initProc.oom), opened at the first
// read and closed when the init is stopped, so that a command costs two
// reads and no open: opening a control file (a path walk, kernfs's open and
// release) is what a read costs several times over. One that cannot be
// opened is read by path instead (and counts 0 when that fails too).
// Without a cgroup it counts nothing. A read and the close may come from
// different goroutines (Destroy stops an init while its command ends).
type oomCounter struct {
	cg *cgroup.Cgroup // nil: no cgroup

	mu     sync.Mutex
	f      *cgroup.OOMCounter
	closed bool
}

func (o *oomCounter) read() uint64 {
	if o == nil || o.cg == nil {
		return 0
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.f == nil && !o.closed {
		o.f, _ = o.cg.OpenOOMCounter()
	}
	var n uint64
	if o.f != nil {
		n, _ = o.f.Read()
	} else {
		n, _ = o.cg.OOMKills()
	}
	return n
}

func (o *oomCounter) close() {
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	if o.f != nil {
		_ = o.f.Close()
		o.f = nil
	}
}

// classify sets res's verdict from f, adding what sb's OOM-kill counter
// says now (oom) against oomBefore (read just before the command) when the
// sandbox has a cgroup. Every command's end goes through it.
func (b *Backend) classify(res *backend.ExecResult, f backend.Facts, oom *oomCounter, oomBefore uint64) {
	f.KillAfter = backend.GuestTimeout(b.cfg.KillGrace)
	if oom != nil && oom.cg != nil {
		f.OOMCounted, f.OOMBefore, f.OOMAfter = true, oomBefore, oom.read()
	}
	backend.Classify(f).Apply(res)
}

// makeDisk gives a new sandbox with a disk cap its filesystem, mounted on
// dir/vol; work/ and tmp/ are then made inside it by the caller.
func (b *Backend) makeDisk(ctx context.Context, sb *sandbox) error {
	if !sb.disk {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, diskCreateTimeout)
	defer cancel()
	img := filepath.Join(sb.dir, diskImageName)
	o := disk.Options{Size: sb.limits.DiskBytes, Inodes: sb.limits.DiskInodes, UID: -1, GID: -1}
	if b.cfg.Failpoint != nil {
		o.Formatting = func(int) { b.failpoint(FailDiskFormatting) }
	}
	if err := b.disks.Create(ctx, img, o); err != nil {
		return fmt.Errorf("%w: cannot make the disk of sandbox %s: %v", backend.ErrUnavailable, sb.id, err)
	}
	if err := os.Mkdir(sb.dataDir(), 0o755); err != nil {
		return err
	}
	return b.mountDisk(sb)
}

// mountDisk mounts sb's image unless it already is (a restarted daemon,
// or a reboot, re-adopting the sandbox).
func (b *Backend) mountDisk(sb *sandbox) error {
	if !sb.disk {
		return nil
	}
	mounted, err := disk.Mounted(sb.dataDir())
	if err != nil {
		return fmt.Errorf("%w: cannot tell whether the disk of sandbox %s is mounted: %v", backend.ErrUnavailable, sb.id, err)
	}
	if mounted {
		return nil
	}
	err = disk.Mount(filepath.Join(sb.dir, diskImageName), sb.dataDir())
	switch {
	case errors.Is(err, disk.ErrAttached):
		return fmt.Errorf("%w: the disk of sandbox %s is still attached by a previous daemon's mount, kept alive by a process that outlived it (%v); it is mounted once that is gone, or after `sandbox-sidecar gc` releases it", backend.ErrHeldElsewhere, sb.id, err)
	case err != nil:
		return fmt.Errorf("%w: cannot mount the disk of sandbox %s: %v", backend.ErrUnavailable, sb.id, err)
	}
	return nil
}

// Adopt takes sandbox id back after a restart: its settings load, its disk
// is mounted (never when its image is still attached anywhere: that is
// ErrHeldElsewhere), its workspace is there and it has a fresh cgroup. Its
// init starts with its first command. Adopting an adopted sandbox only
// checks it.
func (b *Backend) Adopt(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sandbox %s was not adopted: %w", id, err)
	}
	_, err := b.lookup(id)
	return err
}

// damaged checks a sandbox whose workspace cannot be reached: a sandbox
// with a disk of its own whose disk is unmounted or broken is damaged
// (kept, reported), never silently not found.
func (sb *sandbox) damaged(statErr error) error {
	if !sb.disk {
		return nil
	}
	mounted, err := disk.Mounted(sb.dataDir())
	switch {
	case err != nil:
		return fmt.Errorf("%w: sandbox %s: cannot tell whether its disk is mounted (%v)", backend.ErrDamaged, sb.id, err)
	case !mounted:
		return fmt.Errorf("%w: sandbox %s: its disk is no longer mounted (unmounted behind the daemon's back); an operator should look before destroying it", backend.ErrDamaged, sb.id)
	}
	why := disk.Damage(sb.dataDir())
	if why == "" {
		why = fmt.Sprintf("its workspace cannot be reached on its disk (%v)", statErr)
	}
	return fmt.Errorf("%w: sandbox %s: %s; its files are kept for an operator to look at, destroy it to start again", backend.ErrDamaged, sb.id, why)
}

// Problems names every known sandbox whose disk is damaged (filesystem
// errors, read-only after one, unmounted), for health.
func (b *Backend) Problems() map[string]string {
	if !b.cfg.DiskCaps {
		return nil
	}
	var out map[string]string
	for _, sb := range b.boxes.All() {
		if !sb.disk || sb.Ops().Destroying() {
			continue
		}
		why := ""
		if mounted, err := disk.Mounted(sb.dataDir()); err != nil || !mounted {
			why = "its disk is not mounted"
		} else {
			why = disk.Damage(sb.dataDir())
		}
		if why != "" {
			if out == nil {
				out = map[string]string{}
			}
			out[sb.id] = why
		}
	}
	return out
}

// ReleaseStale detaches, from the mount namespaces of processes that
// outlived a daemon killed with -9, the disks of this backend's sandboxes
// that this process has not mounted itself; a quarantined sandbox can then
// be adopted. It returns the sandboxes released and those still held (a
// process still has a file open on the disk).
func (b *Backend) ReleaseStale(ctx context.Context, dryRun bool) (released, held []string, err error) {
	if !b.cfg.DiskCaps {
		return nil, nil, nil
	}
	ids, err := b.List(ctx)
	if err != nil {
		return nil, nil, err
	}
	var errs []error
	for _, id := range ids {
		dir := b.sandboxDir(id)
		img, vol := filepath.Join(dir, diskImageName), filepath.Join(dir, diskMountName)
		if mounted, merr := disk.Mounted(vol); merr != nil || mounted {
			continue // ours, in use
		}
		loops, aerr := disk.Attached(img)
		if aerr != nil {
			errs = append(errs, aerr)
			continue
		}
		if len(loops) == 0 {
			continue
		}
		if dryRun {
			released = append(released, id)
			continue
		}
		left, rerr := disk.ReleaseStale(ctx, img, vol)
		if rerr != nil {
			errs = append(errs, rerr)
		}
		if len(left) > 0 {
			held = append(held, id)
			b.log.Warn("a sandbox's disk is still attached after its stale mounts were released; a process still has a file open on it", "sandbox", id, "devices", len(left))
			continue
		}
		released = append(released, id)
		b.log.Info("released a sandbox disk held by a previous daemon's mount namespace", "sandbox", id)
	}
	return released, held, errors.Join(errs...)
}

// unmountDisk unmounts dir/vol if it is a mount (whatever the settings
// say: a half-made sandbox may have no spec.json yet).
func unmountDisk(dir string) error {
	vol := filepath.Join(dir, diskMountName)
	mounted, err := disk.Mounted(vol)
	if err != nil || !mounted {
		return err
	}
	return disk.Unmount(vol)
}

// cgroupName is the sandbox's id, or for Health's trial sandbox (whose
// directory starts with a '.') a name no id can have.
func (sb *sandbox) cgroupName() string {
	base := filepath.Base(sb.dir)
	if rest, ok := strings.CutPrefix(base, probeDirPrefix); ok {
		return probeCgroupPrefix + rest
	}
	return base
}

// logLimits says once, at start, what is enforced and what is not.
func (b *Backend) logLimits() {
	in := b.LimitsInForce()
	l := b.cfg.Limits
	args := []any{"memory_bytes", l.MemoryBytes, "pids", l.PIDs, "cpus", l.CPUs, "disk_bytes", l.DiskBytes,
		"open_files", l.OpenFiles, "file_size_bytes", l.FileSizeBytes}
	for _, k := range []string{"memory", "pids", "cpu", "disk"} {
		args = append(args, "enforced_"+k, in[k])
	}
	var off []string
	for _, k := range []string{"memory", "pids", "cpu", "disk"} {
		if in[k] == "off" {
			off = append(off, k)
		}
	}
	if len(off) > 0 {
		b.log.Warn("some sandbox limits are not enforced on this host: "+strings.Join(off, ", ")+"; see docs/operations.md (Resource limits)", args...)
		return
	}
	b.log.Info("sandbox limits", args...)
}

// LimitsInForce names the mechanism enforcing each limit on this host, or
// "off" (not enforced) or "none" (configured without a limit).
func (b *Backend) LimitsInForce() map[string]string {
	l := b.cfg.Limits
	mech := func(configured bool, on bool, how string) string {
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
	return map[string]string{
		"memory":     mech(l.MemoryBytes > 0, b.cfg.Cgroups != nil, cg),
		"pids":       mech(l.PIDs > 0, b.cfg.Cgroups != nil, cg),
		"cpu":        mech(l.CPUs > 0 || l.CPUWeight > 0, b.cfg.Cgroups != nil, cg),
		"disk":       mech(l.DiskBytes > 0, b.cfg.DiskCaps, "ext4 image"),
		"open_files": mech(l.OpenFiles > 0, true, "rlimit"),
		"file_size":  mech(l.FileSizeBytes > 0, true, "rlimit"),
		"syscalls":   "seccomp",
	}
}

// MemoryInForce implements backend.MemoryReporter: the limit and use of
// the cgroup every sandbox's group sits under. Without cgroups it returns
// an error wrapping backend.ErrUnavailable.
func (b *Backend) MemoryInForce() (backend.HostMemory, error) {
	if b.cfg.Cgroups == nil {
		return backend.HostMemory{}, fmt.Errorf("%w: no sandbox cgroups", backend.ErrUnavailable)
	}
	bm, err := b.cfg.Cgroups.BaseMemory()
	if err != nil {
		return backend.HostMemory{}, err
	}
	total, err := cgroup.HostMemoryBytes()
	if err != nil {
		return backend.HostMemory{}, err
	}
	return backend.HostMemory{HostBytes: total, LimitBytes: bm.LimitBytes, UsedBytes: bm.UsedBytes, PerSandboxBytes: b.cfg.Limits.MemoryBytes}, nil
}

// Close is for a daemon that stops: it stops every sandbox's init (they
// would die with the daemon anyway), removes every sandbox cgroup and
// unmounts every sandbox's disk, so a stopped daemon leaves nothing on the
// host but its state directory. The sandboxes' files stay; a daemon started
// on the same directory re-adopts them (mounting their disks and making
// their groups again). The backend must not be used afterwards.
func (b *Backend) Close() error {
	live := map[string]bool{} // the cgroups of sandboxes whose init goes on
	for _, sb := range b.boxes.All() {
		sb.ops.CancelAll()
		if b.detachInit(sb) {
			live[sb.cgroupName()] = true
		}
	}
	var errs []error
	if b.cfg.Cgroups != nil {
		names, err := b.cfg.Cgroups.List()
		errs = append(errs, err)
		ctx, cancel := context.WithTimeout(context.Background(), cgroupWait)
		defer cancel()
		for _, name := range names {
			// A paused sandbox's group stays frozen, with its processes,
			// for the next daemon.
			if !live[name] && !b.frozenGroup(name) {
				errs = append(errs, b.cfg.Cgroups.Remove(ctx, name))
			}
		}
	}
	if b.cfg.DiskCaps {
		ids, err := b.List(context.Background())
		errs = append(errs, err)
		for _, id := range ids {
			errs = append(errs, unmountDisk(b.sandboxDir(id)))
		}
	}
	return errors.Join(errs...)
}
