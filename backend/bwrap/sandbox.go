package bwrap

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/registry"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/statedir"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/cgroup"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/disk"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

// Layout of Dir/<id>.
const (
	workDirName = hostfs.WorkDirName // bound at /workspace
	tmpDirName  = hostfs.TmpDirName  // bound at /tmp
	specName    = registry.SpecName  // persistedSpec
)

// Network values reported in backend.Info.
const (
	networkNone = "none"
	networkHost = "host"
	// networkAllowlist: see egress.go.
)

// specVersion is the version of persistedSpec written by this code.
const specVersion = 1

// errSandboxDestroyed is the cancellation cause Destroy gives running
// commands, so Exec can tell "destroyed under you" from "request cancelled".
var errSandboxDestroyed = registry.ErrDestroyed

// persistedSpec is spec.json: what a restarted daemon needs to keep running
// commands in a sandbox it finds on disk.
type persistedSpec struct {
	Version int               `json:"version"`
	Network string            `json:"network"`
	Env     map[string]string `json:"env,omitempty"`
	// Resources is what the spec asked for; the sandbox's limits are
	// worked out again from it and the daemon's at every start.
	Resources backend.Resources `json:"resources,omitempty"`
	// Disk says /workspace and /tmp live on the sandbox's own filesystem
	// (disk.img mounted on vol/).
	Disk bool `json:"disk,omitempty"`
	// UID is the sandbox's own host uid (and gid), from Config.UIDRange.
	// Absent in a sandbox made without one (before the range existed): it
	// runs as Config.SandboxUID/SandboxGID, as it always did.
	UID *uint32 `json:"uid,omitempty"`
	// AllowEgressTo and AllowEgressToCIDRs are the allow-lists of a
	// sandbox with network "allowlist".
	AllowEgressTo      []string `json:"allow_egress_to,omitempty"`
	AllowEgressToCIDRs []string `json:"allow_egress_to_cidrs,omitempty"`
	// Image is the image the sandbox runs on; absent: the host image.
	Image *imageSpec `json:"image,omitempty"`
}

func (s persistedSpec) SpecVersion() int { return s.Version }

// sandbox is the in-memory state of one sandbox: its settings, the
// operations in flight, so Destroy can stop them and wait for them, and its
// init.
type sandbox struct {
	id, dir   string
	env       map[string]string
	network   string
	resources backend.Resources
	limits    limits.Limits  // effective: the daemon's, lowered by the spec
	disk      bool           // work/ and tmp/ are on the sandbox's own filesystem
	cg        *cgroup.Cgroup // nil without cgroups; set before init starts
	// uid and gid are the host ids its processes run as and its files
	// belong to; -1 for the daemon's own. own says they are the sandbox's
	// alone (from the range), not shared.
	uid, gid int
	own      bool
	// egressTo and egressCIDRs are the allow-lists of network "allowlist".
	egressTo, egressCIDRs []string
	// image is the image its root comes from; nil: the host's.
	// imageOpts are the bwrap options building that root
	// (imageRootOptions), read once when the sandbox is made or adopted.
	image     *imageSpec
	imageOpts []string

	ops registry.Ops // the operations in flight, so Destroy can stop them

	// initMu guards the init. Create starts one in the background
	// (startSoon), holding initMu until that start ends; otherwise there
	// is none until Warm or the first command of this process starts one
	// (a sandbox re-adopted after a restart, whose init died with the
	// previous daemon, or one whose first start failed). initGone means it died or
	// was killed in this process: the sandbox is terminated for good, and
	// goneReported that an Exec has told its caller so.
	initMu       sync.Mutex
	init         *initProc
	initGone     bool
	goneReported bool
	// paused: its cgroup is frozen (pause.go); reattach: it was found so
	// at its load, and an init a previous daemon left in it is
	// re-attached at the resume. Guarded by initMu.
	paused, reattach bool
}

func newSandbox(id, dir string, spec persistedSpec, lim limits.Limits) *sandbox {
	return &sandbox{id: id, dir: dir, env: spec.Env, network: spec.Network, resources: spec.Resources,
		limits: lim, disk: spec.Disk, uid: -1, gid: -1, image: spec.Image, ops: registry.Ops{ID: id},
		egressTo: spec.AllowEgressTo, egressCIDRs: spec.AllowEgressToCIDRs}
}

// setIDs gives sb the host ids its settings say: its own, or those of
// sandboxes without one.
func (b *Backend) setIDs(sb *sandbox, spec persistedSpec) {
	if spec.UID != nil {
		sb.uid, sb.gid, sb.own = int(*spec.UID), int(*spec.UID), true
		return
	}
	sb.uid, sb.gid = b.cfg.SandboxUID, b.cfg.SandboxGID
}

// Ops are the sandbox's operations in flight (registry.Sandbox).
func (sb *sandbox) Ops() *registry.Ops { return &sb.ops }

// dataDir holds work/ and tmp/: the sandbox's directory, or the mount of
// its own filesystem.
func (sb *sandbox) dataDir() string {
	if sb.disk {
		return filepath.Join(sb.dir, diskMountName)
	}
	return sb.dir
}
func (sb *sandbox) workDir() string { return filepath.Join(sb.dataDir(), workDirName) }
func (sb *sandbox) tmpDir() string  { return filepath.Join(sb.dataDir(), tmpDirName) }

// begin registers one operation (registry.Ops.Begin).
func (sb *sandbox) begin(ctx context.Context) (context.Context, func(), error) {
	return sb.ops.Begin(ctx)
}

func (b *Backend) sandboxDir(id string) string { return filepath.Join(b.cfg.Dir, id) }

// lookup returns the sandbox id, loading it from disk when this process
// has not seen it yet (a restarted daemon re-adopting its sandboxes).
func (b *Backend) lookup(id string) (*sandbox, error) { return b.boxes.Lookup(id) }

// registryHooks are what the backend's registry needs to know of its
// sandboxes.
func (b *Backend) registryHooks() registry.Hooks[*sandbox] {
	return registry.Hooks[*sandbox]{
		Load: b.load,
		// A workspace that cannot be reached is gone, unless the
		// sandbox has a disk of its own: then it is damaged (kept and
		// reported, never a silent not found).
		Usable: func(sb *sandbox) error {
			_, err := os.Stat(sb.workDir())
			if err == nil {
				return nil
			}
			if derr := sb.damaged(err); derr != nil {
				return derr
			}
			return backend.NotFound(sb.id)
		},
		Exists: func(sb *sandbox) bool {
			_, err := os.Lstat(sb.dir)
			return err == nil
		},
		// The directory vanished behind the daemon's back: stop its init
		// and everything in it.
		Forget: func(sb *sandbox) {
			b.killInit(sb)
			b.log.With("sandbox", sb.id).Warn("the sandbox's directory was removed behind the daemon's back; its processes are stopped")
		},
		// A sandbox this process never loaded: its uid, if it has one of
		// its own, is what New reserved for it.
		Placeholder: func(id string) *sandbox {
			sb := newSandbox(id, b.sandboxDir(id), persistedSpec{}, limits.Limits{})
			b.mu.Lock()
			if uid, has := b.uidOf[id]; has {
				sb.uid, sb.gid, sb.own = int(uid), int(uid), true
			}
			b.mu.Unlock()
			return sb
		},
	}
}

// load makes the state of sandbox id from its directory.
func (b *Backend) load(id string) (*sandbox, error) {
	spec, err := b.loadSpec(id)
	if err != nil {
		return nil, err
	}
	lim, err := b.effectiveLimits(spec.Resources)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s was created with limits this daemon no longer enforces (%w); destroy it and create a new one", id, err)
	}
	if spec.Disk && !b.cfg.DiskCaps {
		return nil, fmt.Errorf("%w: sandbox %q has a disk of its own, which this daemon cannot mount (disk caps are off); destroy it and create a new one", backend.ErrSpecUnenforceable, id)
	}
	if spec.Image != nil {
		if _, err := b.checkImage(backend.Image{Name: spec.Image.Name, Root: spec.Image.Root}); err != nil {
			return nil, fmt.Errorf("sandbox %s runs on image %s: %w", id, backend.ShortName(spec.Image.Name), err)
		}
	}
	if spec.UID != nil {
		b.mu.Lock()
		err := b.checkAdoptedUID(id, *spec.UID)
		b.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
	sb := newSandbox(id, b.sandboxDir(id), spec, lim)
	b.setIDs(sb, spec)
	if err := sb.readImageRoot(); err != nil {
		return nil, err
	}
	// Paused by a previous daemon: kept paused, its init left alone.
	if paused, err := b.loadPaused(sb); paused || err != nil {
		if err != nil {
			return nil, err
		}
		return sb, nil
	}
	// Re-adopted (the daemon restarted, or the host rebooted): its init
	// may still run, with its processes (reattach.go); otherwise mount its
	// disk again and give it a fresh cgroup.
	ip := b.adoptLiveInit(sb)
	if ip == nil {
		if err := b.mountDisk(sb); err != nil {
			return nil, err
		}
	}
	if _, err := os.Stat(sb.workDir()); err != nil {
		if ip != nil {
			b.stopInit(ip)
		}
		if derr := sb.damaged(err); derr != nil {
			// Recovery quarantines it with this reason, which health
			// reports.
			return nil, derr
		}
		return nil, backend.NotFound(id)
	}
	if ip == nil {
		if err := b.makeCgroup(context.Background(), sb); err != nil {
			return nil, err
		}
		b.thawLeftHeld(sb) // its frozen processes went with the old group
	}
	sb.init = ip
	return sb, nil
}

// adoptLiveInit re-attaches to sb's init if a previous daemon left one
// running, with what it needs of this daemon: its disk mounted here too
// and its cgroup (as the init left them; its limits are the sandbox's).
// An init it cannot keep (an egress allow-list, whose user-space network
// died with the daemon that served it; a disk or cgroup it cannot reach;
// another version's) is killed, with its processes, and nil returned: the
// sandbox then starts afresh, as before durable processes.
func (b *Backend) adoptLiveInit(sb *sandbox) *initProc {
	if _, ours := b.started.Load(sb.dir); ours {
		// This process's own start (a load racing the sandbox's Create):
		// that start's owner stops it (TestBwrapCreateLosingToALoaderStopsItsStart).
		return nil
	}
	log := b.log.With("sandbox", sb.id)
	// Frozen by a daemon that died mid-snapshot: its init could not answer.
	b.thawLeftHeld(sb)
	ip, err := b.adoptInit(sb)
	if err != nil {
		log.Warn("the init a previous daemon left cannot be re-attached; it is replaced and its processes end", "error", err)
		b.killStrays(sb.dir)
		return nil
	}
	if ip == nil {
		return nil
	}
	drop := func(why string, err error) *initProc {
		log.Warn("the init a previous daemon left cannot be kept ("+why+"); it is replaced and its processes end", "error", err)
		b.stopInit(ip)
		b.killStrays(sb.dir)
		return nil
	}
	if sb.network == networkAllowlist {
		return drop("its egress allow-list was served by the daemon that died", nil)
	}
	if sb.disk {
		if mounted, err := disk.Mounted(sb.dataDir()); err != nil || !mounted {
			if err := disk.MountAttached(filepath.Join(sb.dir, diskImageName), sb.dataDir()); err != nil {
				return drop("its disk", err)
			}
		}
	}
	if b.cfg.Cgroups != nil {
		cg, err := b.cfg.Cgroups.Open(sb.cgroupName())
		if err != nil {
			return drop("its cgroup", err)
		}
		sb.cg = cg
		ip.oom = &oomCounter{cg: cg}
	}
	// A start the previous daemon recorded but died before init took (or
	// answered): the record has no keeper, and would read as running for
	// ever. Init refuses a late start of a record given an end here.
	ctx, cancel := context.WithTimeout(context.Background(), procAnswerTimeout)
	running, err := runningKeepers(ctx, ip)
	cancel()
	if err != nil {
		return drop("it did not list its processes", err)
	}
	if n, err := b.store(sb).Unstarted(running); err != nil {
		log.Warn("cannot end the processes whose start the previous daemon left half done", "error", err)
	} else if n > 0 {
		log.Warn("ended processes whose start the previous daemon left half done (it died mid-start)", "count", n)
	}
	log.Info("re-attached to the sandbox's init, which outlived the previous daemon")
	return ip
}

// EndProcesses implements backend.ProcessEnder: every process carrying
// sandbox id's marker (its bwrap and init, and so all its processes) is
// killed; its files stay.
func (b *Backend) EndProcesses(ctx context.Context, id string) error {
	if backend.ValidID(id) {
		b.killStrays(b.sandboxDir(id))
	}
	return nil
}

// killStrays kills every process still carrying sandbox dir's marker.
func (b *Backend) killStrays(dir string) {
	if strays := b.findMarked(dir, false); len(strays) > 0 {
		killMarked(strays)
	}
}

func (b *Backend) loadSpec(id string) (persistedSpec, error) {
	var spec persistedSpec
	if err := registry.LoadSpec(b.sandboxDir(id), id, specVersion, &spec); err != nil {
		return spec, err
	}
	switch spec.Network {
	case networkNone:
	case networkHost:
		if !b.cfg.ShareHostNetwork {
			return spec, fmt.Errorf("%w: sandbox %q was created with the host's network, which this daemon no longer allows; destroy it and create a new one", backend.ErrSpecUnenforceable, id)
		}
	case networkAllowlist:
		if _, err := b.egressPolicy(spec.AllowEgressTo, spec.AllowEgressToCIDRs); err != nil {
			return spec, fmt.Errorf("sandbox %q has egress allow-lists this daemon cannot serve now (%w); destroy it and create a new one", id, err)
		}
	default:
		return spec, fmt.Errorf("%w: sandbox %q has unknown network %q in its settings; destroy it and create a new one", backend.ErrNotFound, id, spec.Network)
	}
	if err := backend.ValidateEnv(spec.Env, "the sandbox's"); err != nil {
		return spec, fmt.Errorf("sandbox %s has bad settings on disk (%w); destroy it and create a new one", id, err)
	}
	return spec, nil
}

// Create makes Dir/<id> with an empty workspace and /tmp and records the
// spec. It refuses egress allow-lists (there is no egress filter) and, unless
// the operator set ShareHostNetwork, BlockNetwork=false.
func (b *Backend) Create(ctx context.Context, id string, spec backend.Spec) (_ backend.Info, err error) {
	if !backend.ValidID(id) {
		return backend.Info{}, fmt.Errorf("%w: sandbox id %q is not a valid id (lowercase letters, digits and '-', at most 63)", backend.ErrInvalidArgument, id)
	}
	if err := ctx.Err(); err != nil {
		return backend.Info{}, fmt.Errorf("sandbox %s was not created: %w", id, err)
	}
	network, err := b.networkFor(spec)
	if err != nil {
		return backend.Info{}, err
	}
	if err := backend.ValidateEnv(spec.Env, "the sandbox's"); err != nil {
		return backend.Info{}, err
	}
	lim, err := b.effectiveLimits(spec.Resources)
	if err != nil {
		return backend.Info{}, err
	}
	img, err := b.checkImage(spec.Image)
	if err != nil {
		return backend.Info{}, err
	}
	log := b.log.With("sandbox", id)

	dir := b.sandboxDir(id)
	if b.boxes.KnownAndPresent(id) {
		return backend.Info{}, fmt.Errorf("sandbox %q already exists or is being destroyed; destroy it first or choose another id: %w", id, fs.ErrExist)
	}
	saved := persistedSpec{Version: specVersion, Network: network, Env: maps.Clone(spec.Env), Resources: spec.Resources,
		Disk: b.cfg.DiskCaps && lim.DiskBytes > 0, Image: img}
	if network == networkAllowlist {
		saved.AllowEgressTo, saved.AllowEgressToCIDRs = slices.Clone(spec.AllowEgressTo), slices.Clone(spec.AllowEgressToCIDRs)
	}
	if b.uids != nil {
		uid, err := b.uids.Allocate()
		if err != nil {
			return backend.Info{}, fmt.Errorf("%w: sandbox %s was not created: %v", backend.ErrUnavailable, id, err)
		}
		saved.UID = &uid
	}
	sb := newSandbox(id, dir, saved, lim)
	b.setIDs(sb, saved)
	if err := sb.readImageRoot(); err != nil {
		b.freeUID(saved.UID)
		return backend.Info{}, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		b.freeUID(saved.UID)
		if errors.Is(err, fs.ErrExist) {
			return backend.Info{}, fmt.Errorf("sandbox %q already exists; destroy it first or choose another id: %w", id, err)
		}
		return backend.Info{}, fmt.Errorf("create sandbox %s: %w; check that the state directory is writable", id, err)
	}
	if saved.UID != nil {
		b.mu.Lock()
		b.uidOf[id] = *saved.UID
		b.mu.Unlock()
	}
	var stopStart func() // set once the init's start has begun
	defer func() {
		if err != nil {
			if stopStart != nil {
				stopStart()
			}
			if rmErr := b.removeCgroup(sb); rmErr != nil {
				log.Error("cannot remove the cgroup of a half-made sandbox", "error", rmErr)
			}
			if rmErr := unmountDisk(dir); rmErr != nil {
				log.Error("cannot unmount the disk of a half-made sandbox", "error", rmErr)
			}
			if rmErr := b.removeSandboxFiles(sb); rmErr != nil {
				// Its uid stays reserved: files of it remain.
				log.Error("cannot remove half-made sandbox", "error", rmErr)
			} else {
				b.releaseUID(id, saved.UID)
			}
		}
	}()
	// The directory carries the sandbox's uid (as its group) before
	// anything of the guest exists, so a restart finds the uid even if
	// spec.json was never written.
	if err := b.prepareSandboxDir(sb); err != nil {
		return backend.Info{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if err := b.makeDisk(ctx, sb); err != nil {
		return backend.Info{}, err
	}
	for _, p := range []string{sb.workDir(), sb.tmpDir()} {
		if err := b.makeGuestDir(sb, p); err != nil {
			return backend.Info{}, fmt.Errorf("create sandbox %s: %w", id, err)
		}
	}
	if err := b.seed(ctx, sb, spec); err != nil {
		return backend.Info{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if err := b.makeCgroup(ctx, sb); err != nil {
		return backend.Info{}, err
	}
	// Everything the init runs in exists: start it now, while the
	// settings are written and synced and the create answers, instead of
	// at the first command (docs/design.md, "Create starts the init").
	stopStart = b.startSoon(sb)
	b.failpoint(FailCreateStarting)
	if err := registry.SaveSpec(dir, saved); err != nil {
		return backend.Info{}, fmt.Errorf("create sandbox %s: save its settings: %w", id, err)
	}

	b.failpoint(FailCreateSaved)
	if err := b.boxes.Created(id, sb); err != nil {
		return backend.Info{}, err
	}
	if !b.boxes.Holds(id, sb) {
		// An operation loaded the sandbox from its settings first, and
		// its copy is the one kept: that copy starts its own init.
		stopStart()
	}
	log.Info("sandbox created", "network", network, "env_vars", len(spec.Env), "memory_bytes", lim.MemoryBytes,
		"pids", lim.PIDs, "cpus", lim.CPUs, "disk_bytes", saved.Disk && lim.DiskBytes > 0, "host_uid", sb.uid, "image", spec.Image.DisplayName())
	info := backend.Info{Workdir: guestWorkspace, Network: network}
	if saved.UID != nil {
		info.HostUID = *saved.UID
	}
	return info, nil
}

func (b *Backend) networkFor(spec backend.Spec) (string, error) {
	if len(spec.AllowEgressTo) > 0 || len(spec.AllowEgressToCIDRs) > 0 {
		if _, err := b.egressPolicy(spec.AllowEgressTo, spec.AllowEgressToCIDRs); err != nil {
			return "", err
		}
		return networkAllowlist, nil
	}
	if spec.BlockNetwork != nil && !*spec.BlockNetwork {
		if !b.cfg.ShareHostNetwork {
			return "", fmt.Errorf("%w: block_network=false needs the host's network, which this daemon does not allow; keep block_network=true, or an operator can allow it with the daemon's --bwrap-share-host-network flag (bwrap.share_host_network in the config; the sandbox then shares every interface of the host)", backend.ErrSpecUnenforceable)
		}
		return networkHost, nil
	}
	return networkNone, nil
}

// makeGuestDir makes a directory the guest owns: mode 0700 and, when the
// sandbox runs as a uid other than the daemon's, owned by it.
func (b *Backend) makeGuestDir(sb *sandbox, path string) error {
	if b.viaCaps && sb.own {
		// No CAP_CHOWN: made as the sandbox's uid, so owned by it. Its
		// parent is the sandbox's directory, whose group (the sandbox's
		// gid) may write there only while this runs.
		parent := filepath.Dir(path)
		if err := os.Chmod(parent, ownSandboxDirMode|0o020); err != nil {
			return err
		}
		err := b.asOwner(sb, func() error { return os.Mkdir(path, 0o700) })
		return errors.Join(err, os.Chmod(parent, ownSandboxDirMode))
	}
	if err := os.Mkdir(path, 0o700); err != nil {
		return err
	}
	if sb.uid >= 0 {
		return os.Lchown(path, sb.uid, sb.gid)
	}
	return nil
}

// Destroy kills the sandbox's running commands, waits (boundedly) for them
// and removes Dir/<id>. It is idempotent, and an id that is not a valid id
// succeeds without touching any path. The files are removed even when ctx
// has ended: ctx only shortens the wait for running commands, which are
// already killed by then.
func (b *Backend) Destroy(ctx context.Context, id string) error {
	if !backend.ValidID(id) {
		return nil
	}
	sb, ok := b.boxes.Destroying(id)

	log := b.log.With("sandbox", id)
	// Cancel first, so a command in flight reads its init's death as the
	// destroy it is; then kill init, which as pid 1 takes every process of
	// the sandbox with it.
	sb.ops.CancelAll()
	b.endPause(sb)
	b.killInit(sb)
	if !sb.ops.Wait(ctx, registry.DestroyWait) {
		log.Warn("running commands did not all end in time; removing the files anyway", "waited_up_to", registry.DestroyWait)
	}
	if strays := b.findMarked(sb.dir, false); len(strays) > 0 {
		log.Warn("killed processes of the sandbox that outlived their command", "count", killMarked(strays))
	}
	// The cgroup by name, not sb.cg: a sandbox never used by this
	// process has none in memory, yet may have one on the host.
	err := b.removeCgroup(sb)
	if uerr := unmountDisk(sb.dir); uerr != nil {
		err = errors.Join(err, fmt.Errorf("unmount its disk: %w", uerr))
	} else if rerr := b.removeSandboxFiles(sb); rerr != nil {
		err = errors.Join(err, rerr)
	}

	b.boxes.Done(id, sb)
	b.mu.Lock()
	uid, hadUID := b.uidOf[id]
	if err == nil && hadUID {
		// Only now that no file and no process of it is left.
		delete(b.uidOf, id)
	}
	b.mu.Unlock()
	if err == nil && hadUID && b.uids != nil {
		b.uids.Release(uid)
	}
	if err != nil {
		return fmt.Errorf("destroy sandbox %s: its commands are stopped but its files could not all be removed (%w); call destroy again to retry", id, err)
	}
	if ok {
		log.Info("sandbox destroyed")
	}
	return nil
}

// List returns the ids of the sandboxes in Dir, complete or not: every
// subdirectory whose name is a valid id was made by this backend.
func (b *Backend) List(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return statedir.SandboxIDs(b.cfg.Dir)
}
