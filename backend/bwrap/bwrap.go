// Package bwrap is the backend that runs sandboxes with bubblewrap.
//
// It owns the directory it is given (Config.Dir): one subdirectory per
// sandbox holding the guest's /workspace, its private /tmp and spec.json, the
// environment and network the sandbox was created with; and each sandbox's
// init, a small process that lives in the sandbox's namespaces from its
// first command to its destruction and starts every command there, so a
// command costs a fork and an exec rather than a bubblewrap. Init is this
// daemon's own executable run again (see InitMain); it kills everything a
// command started when the command ends, so no guest process outlives the
// command that started it: only the files and /tmp persist between commands.
//
// It never runs anything through a shell on the host, never passes the
// daemon's environment or a path outside the sandbox's directory to a guest,
// and never follows a guest-made symlink out of the sandbox: file operations
// run on the host through os.Root. It does not decide when sandboxes are made
// or removed; the lifecycle package does.
package bwrap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc/initexe"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/procstore"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/registry"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/statedir"
	"github.com/sandbox-sidecar/sandbox-sidecar/capture"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/cgroup"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/disk"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/hostids"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/seccomp"
)

// Defaults for the zero fields of Config.
const (
	// DefaultKillGrace is how long a timed-out command has between SIGTERM
	// and SIGKILL inside the sandbox.
	DefaultKillGrace = 2 * time.Second
	// DefaultExecGrace is how long past its timeout plus KillGrace a command
	// may run before the daemon kills bwrap itself.
	DefaultExecGrace = 5 * time.Second
)

// Named bounds on the backend's own waits.
const (
	// versionTimeout bounds "bwrap --version" in Health.
	versionTimeout = 2 * time.Second
	// probeTimeout bounds the trial sandbox Health starts.
	probeTimeout = 10 * time.Second
	// healthCacheTTL is how long a successful trial sandbox vouches for
	// the host; failures are not cached, so recovery shows at once.
	healthCacheTTL = 30 * time.Second
	// probeOutputBytes caps what Health keeps of bwrap's messages.
	probeOutputBytes = 4 << 10
)

// Name is the backend's name as reported to clients.
const Name = "bwrap"

// Config configures a Backend.
type Config struct {
	// Processes bounds each sandbox's durable processes (procstore).
	Processes procstore.Limits
	// Code configures code contexts: the modules their interpreter
	// preloads, per image, and how many a sandbox may have.
	Code CodeConfig
	// Dir is the backend's state directory; sandbox <id> lives in Dir/<id>.
	// It is created mode 0700, or 0711 when sandboxes run as other uids
	// (SandboxUID or UIDRange) so they can traverse it to their workspace;
	// its parent (the daemon's state directory) is then made 0711 too, for
	// the same reason.
	Dir string
	// BwrapPath is the bubblewrap binary; empty means "bwrap" on PATH.
	BwrapPath string
	// InitPath is the executable every sandbox's bwrap runs as its init;
	// empty means the daemon's own (/proc/self/exe), which is what a
	// packaged daemon uses. It must be a build of this same source (init
	// and daemon speak one protocol version, checked at start). Tests point
	// it at a static build of the daemon (the race-enabled test binary is
	// dynamically linked). Opened once, at New.
	InitPath string
	// UIDRange, when not empty, gives every new sandbox a host uid of its
	// own from this range, and the same number as its gid: bwrap starts with
	// those credentials and no supplementary groups, in an unprivileged user
	// namespace, and everything the guest may modify on the host (its
	// workspace, its /tmp, files WriteFile creates) is owned by that uid.
	// No two live sandboxes share one (the uid is recorded in the sandbox's
	// spec.json and re-reserved from there at New), and New refuses a range
	// holding an account or a subordinate id range of AccountFiles (see
	// hostids.CheckFree). It needs the daemon to be root, or to hold
	// CAP_SETUID, CAP_SETGID and CAP_KILL (a non-root daemon: see
	// privilege.go).
	UIDRange hostids.Range
	// AccountFiles are the databases UIDRange is checked against; zero
	// fields mean the host's (hostids.HostFiles).
	AccountFiles hostids.Files
	// SandboxUID and SandboxGID are the host ids of sandboxes without a uid
	// of their own: every sandbox when UIDRange is empty, and those made
	// before it was set (a spec.json without a uid: they keep the ids they
	// were made with). -1 runs them as the daemon's own ids. Any other value
	// needs the daemon to be root (65534/65534 was the old default; every
	// sandbox then shares that uid with whatever else on the host runs as
	// nobody). 0 is refused: it is almost always a forgotten field, and it
	// would make every guest file root's.
	SandboxUID, SandboxGID int
	// KillGrace is how long a command has between the SIGTERM and the
	// SIGKILL its init sends at its budget (default DefaultKillGrace).
	KillGrace time.Duration
	// ExecGrace is the time beyond a command's Timeout+KillGrace after which
	// the daemon SIGKILLs bwrap itself (default DefaultExecGrace).
	ExecGrace time.Duration
	// ShareHostNetwork lets a sandbox created with BlockNetwork=false share
	// the host's network namespace. Off by default: without it such specs are
	// refused, since this backend has no way to filter egress.
	ShareHostNetwork bool
	// Egress serves the network of sandboxes whose spec names
	// allow_egress_to or allow_egress_to_cidrs (network "allowlist"). Nil:
	// such specs are refused with ErrSpecUnenforceable.
	Egress *egress.Egress
	// Limits are every sandbox's limits, and the most a spec may ask for
	// (backend.Spec.Resources asks for less). Zero fields mean no limit.
	// The rlimits (OpenFiles, FileSizeBytes, and always a zero core size)
	// are set by each sandbox's init, which every command inherits;
	// MemoryBytes, PIDs, CPUs and CPUWeight need Cgroups; DiskBytes and
	// DiskInodes need DiskCaps. Give limits.Defaults() unless configured
	// otherwise.
	Limits limits.Limits
	// Cgroups gives every sandbox a control group of its own, made by this
	// manager, with the memory, process and CPU limits of Limits; every
	// process of the sandbox is born in it or moved there before it runs
	// guest code. Nil: those limits are not enforced (New logs it) and a
	// spec asking for one is refused.
	Cgroups *cgroup.Manager
	// DiskCaps gives every sandbox with a DiskBytes limit a filesystem of
	// its own for /workspace and /tmp (a sparse ext4 image, loop-mounted:
	// the daemon must be root). False: disk is not capped per sandbox and a
	// spec asking for a cap is refused.
	DiskCaps bool
	// Logger receives the backend's logs; nil discards them.
	Logger hclog.Logger
	// Failpoint, when set, is called at the named points (the Fail*
	// constants) so race and crash tests can stop the daemon, or order
	// two goroutines, exactly there. Production leaves it nil.
	Failpoint func(name string)
}

// Failpoints: moments where a race or a crash leaves distinct state.
const (
	// FailExecSending: the command's pipes and status socket are made,
	// init is about to be handed them.
	FailExecSending = "bwrap-exec-sending"
	// FailExecHandedOver: init has the command, converse has not begun
	// reading its status.
	FailExecHandedOver = "bwrap-exec-handed-over"
	// FailConverseKillArmed: converse, cancelled, has set the deadline of
	// its kill request and is about to read.
	FailConverseKillArmed = "bwrap-converse-kill-armed"
	// FailConverseWake / FailConverseWoken: the cancellation's wake-up is
	// about to move / has moved the status socket's read deadline.
	FailConverseWake  = "bwrap-converse-wake"
	FailConverseWoken = "bwrap-converse-woken"
	// FailDiskFormatting: mkfs.ext4 runs for a new sandbox's disk.
	FailDiskFormatting = "bwrap-disk-formatting"
	// FailCreateStarting: Create has begun the new sandbox's init start
	// (startSoon) and is about to write its settings.
	FailCreateStarting = "bwrap-create-starting"
	// FailStartSoon / FailStartSoonEnded: the background start of a new
	// sandbox's init holds its init lock and is about to start it / has
	// ended, well or not, and let the lock go.
	FailStartSoon      = "bwrap-start-soon"
	FailStartSoonEnded = "bwrap-start-soon-ended"
	// FailStartSoonCancelled: that start found itself cancelled before it
	// began, and spawns nothing.
	FailStartSoonCancelled = "bwrap-start-soon-cancelled"
	// FailStartSoonQueued: that start waits for one of the backend's
	// start slots (startSlots), every one being in use.
	FailStartSoonQueued = "bwrap-start-soon-queued"
	// FailCreateSaved: Create has written the new sandbox's settings and
	// not yet recorded it as known (an operation may load it first).
	FailCreateSaved = "bwrap-create-saved"
	// FailInitSpawned: the bwrap of a sandbox's init runs; its first
	// process is neither in its cgroup nor let go (on cgroup v1 it waits
	// at the --block-fd gate).
	FailInitSpawned = "bwrap-init-spawned"
	// FailStartStopping: a Create that failed after startSoon has
	// cancelled the start and is about to wait for it.
	FailStartStopping = "bwrap-start-stopping"
	// FailWarmRunning: Warm has handed init its warm-up command and holds
	// the init's lock; it has not read init's answer.
	FailWarmRunning = "bwrap-warm-running"
)

func (b *Backend) failpoint(name string) {
	if b.cfg.Failpoint != nil {
		b.cfg.Failpoint(name)
	}
}

// CodeConfig configures a sandbox's code contexts.
type CodeConfig = backend.CodeConfig

// Backend implements backend.Backend with bubblewrap.
type Backend struct {
	cfg       Config
	bwrap     string
	exe       *os.File // the daemon's executable, which every sandbox's bwrap runs as init
	static    bool     // exe is statically linked (initexe.Static)
	log       hclog.Logger
	rootLinks []string // bwrap options recreating /bin, /lib, ... from the host
	// testRoot, set by tests only, replaces the guest's root (the host's
	// /usr and rootLinks) with a bind of this directory.
	testRoot string

	// uids hands out the sandboxes' own host uids (nil without UIDRange);
	// viaCaps says the daemon is not root and uses CAP_SETUID/CAP_SETGID
	// for them (privilege.go).
	uids    *hostids.Allocator
	viaCaps bool

	// disks makes the disks of sandboxes with a cap (nil without DiskCaps).
	disks *disk.Templates
	// startSlots bounds the background starts of new sandboxes' inits
	// running at once (startSoon): a burst of creates answers at once and
	// queues its starts here, holding nothing, instead of spawning
	// hundreds of bwraps that hold ~10 descriptors each while they fight
	// for the CPUs.
	startSlots chan struct{}

	boxes *registry.Registry[*sandbox] // known sandboxes, loaded lazily from Dir
	// watcher wakes reads that wait for a durable process's output.
	watcher procstore.Watcher
	// started holds the directories of the sandboxes whose init this
	// process started and has not stopped: a load of such a sandbox (a
	// loader racing its Create) never re-attaches to it (reattach.go).
	started sync.Map
	mu      sync.Mutex
	uidOf   map[string]uint32 // guarded by mu: the own uid of each sandbox in Dir that has one

	healthMu     sync.Mutex
	healthyUntil time.Time
}

var _ backend.Backend = (*Backend)(nil)

// New validates cfg, creates cfg.Dir and finds bwrap. It does not start a
// sandbox; Health does.
func New(cfg Config) (*Backend, error) {
	var err error
	if cfg.Dir, err = backend.CheckStateDir("bwrap", cfg.Dir); err != nil {
		return nil, err
	}
	if err := checkIDs(cfg.SandboxUID, cfg.SandboxGID); err != nil {
		return nil, err
	}
	if err := backend.DefaultGraces("bwrap", &cfg.KillGrace, &cfg.ExecGrace, DefaultKillGrace, DefaultExecGrace); err != nil {
		return nil, err
	}
	if err := cfg.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("bwrap backend: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	cfg.Limits = clampToOwnHardLimits(cfg.Limits, cfg.Logger)

	bin, err := findBwrap(cfg.BwrapPath)
	if err != nil {
		return nil, err
	}
	// Every sandbox runs under the guest's system-call filter; a kernel
	// that cannot load one gets no sandboxes rather than unfiltered ones.
	if err := seccomp.Supported(); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrUnavailable, err)
	}
	if _, err := seccomp.Bytes(seccomp.Guest()); err != nil {
		return nil, fmt.Errorf("bwrap backend: cannot build the sandboxes' seccomp filter: %w", err)
	}

	var uids *hostids.Allocator
	viaCaps := false
	if cfg.UIDRange.Size > 0 {
		if viaCaps, err = checkUIDPrivilege(); err != nil {
			return nil, err
		}
		files := cfg.AccountFiles
		if files == (hostids.Files{}) {
			files = hostids.HostFiles
		}
		if err := hostids.CheckFree(cfg.UIDRange, files, uint32(os.Geteuid()), uint32(os.Getegid())); err != nil {
			return nil, fmt.Errorf("bwrap backend: %w", err)
		}
		if uids, err = hostids.NewAllocator(cfg.UIDRange); err != nil {
			return nil, fmt.Errorf("bwrap backend: %w", err)
		}
		if viaCaps {
			if err := dropAmbientCaps(); err != nil {
				return nil, err
			}
		}
	}
	// Any uid of the range stands for all of them below: none owns the
	// directories or the executable, nor is in their group.
	otherUID, otherGID := cfg.SandboxUID, cfg.SandboxGID
	if uids != nil {
		otherUID, otherGID = int(cfg.UIDRange.First), int(cfg.UIDRange.First)
	}

	mode := os.FileMode(0o700)
	if otherUID >= 0 {
		mode = 0o711
	}
	if err := os.MkdirAll(cfg.Dir, mode); err != nil {
		return nil, fmt.Errorf("bwrap backend: cannot create state directory %s; check its parent's permissions: %w", cfg.Dir, err)
	}
	// MkdirAll leaves an existing directory's mode alone; enforce ours.
	if err := os.Chmod(cfg.Dir, mode); err != nil {
		return nil, fmt.Errorf("bwrap backend: cannot set mode %v on %s: %w", mode, cfg.Dir, err)
	}
	if otherUID >= 0 {
		// bwrap runs as the sandbox's uid and must reach each workspace to
		// bind it: others may search (not list) the directories above.
		parent := filepath.Dir(cfg.Dir)
		if err := os.Chmod(parent, 0o711); err != nil {
			return nil, fmt.Errorf("bwrap backend: cannot let the sandboxes' uids through %s (mode 0711): %w", parent, err)
		}
		if err := checkReachable(parent, otherUID, otherGID); err != nil {
			return nil, err
		}
	}

	exe, err := initExecutable(cfg.InitPath, otherUID, otherGID)
	if err != nil {
		return nil, fmt.Errorf("bwrap backend: cannot prepare the daemon's own executable to run as the sandboxes' init: %w", err)
	}
	static, err := initexe.Static(exe)
	if err != nil {
		exe.Close()
		return nil, fmt.Errorf("bwrap backend: the sandboxes' init: %w", err)
	}
	if !static {
		cfg.Logger.Info("the sandboxes' init is dynamically linked: it needs the host's loader and C library, so it runs only in sandboxes whose root is the host's; build the daemon with CGO_ENABLED=0 -buildmode=exe for one that runs anywhere", "init", exe.Name())
	}
	b := &Backend{
		cfg:       cfg,
		bwrap:     bin,
		exe:       exe,
		static:    static,
		log:       cfg.Logger,
		rootLinks: hostRootLinks("/"),
		uids:      uids,
		viaCaps:   viaCaps,
		uidOf:     make(map[string]uint32),
		// Two per CPU: a start is mostly waiting on the kernel (clone,
		// mounts, exec), so one per CPU would leave CPUs idle.
		startSlots: make(chan struct{}, max(2, 2*runtime.GOMAXPROCS(0))),
	}
	b.boxes = registry.New(b.registryHooks())
	b.logLimits()
	// The sandboxes a previous daemon left keep their uids: none may be
	// handed to a new sandbox while they exist.
	b.reserveExistingUIDs()
	// No command of this backend runs yet, so every process still carrying
	// the marker of one of its sandboxes was left by a previous daemon: a
	// ready init, with its sandbox's processes, that the sandbox's next use
	// re-attaches to (reattach.go) or its destroy kills; or what a start
	// the daemon died during left, a stray, killed now.
	if strays := b.strayStarts(b.findMarked(cfg.Dir, true)); len(strays) > 0 {
		b.log.Warn("killing sandbox processes a previous daemon left half started", "count", killMarked(strays))
	}
	// Nor does any sandbox of this process have a cgroup yet.
	b.sweepCgroups()
	// And no trial sandbox of Health is in use: remove what a daemon that
	// died during one left.
	if probes, _ := filepath.Glob(filepath.Join(cfg.Dir, probeDirPrefix+"*")); len(probes) > 0 {
		for _, p := range probes {
			_ = statedir.RemoveAll(p)
		}
	}
	if cfg.DiskCaps {
		// Every disk of one shape is a copy of one formatted once per
		// daemon (disk.Templates).
		if b.disks, err = disk.NewTemplates(filepath.Join(cfg.Dir, diskTemplatesDir)); err != nil {
			exe.Close()
			return nil, fmt.Errorf("bwrap backend: %w; check the state directory's permissions", err)
		}
	}
	return b, nil
}

// clampToOwnHardLimits lowers the rlimits in l that exceed the daemon's
// own hard limits: bwrap inherits those, and nothing in a sandbox may raise
// them, so the sandbox gets the daemon's (stricter) limit instead of failing
// to start.
func clampToOwnHardLimits(l limits.Limits, log hclog.Logger) limits.Limits {
	for _, f := range []struct {
		resource int
		name     string
		value    *uint64
	}{
		{unix.RLIMIT_NOFILE, "open files", &l.OpenFiles},
		{unix.RLIMIT_FSIZE, "file size", &l.FileSizeBytes},
	} {
		var own unix.Rlimit
		if err := unix.Getrlimit(f.resource, &own); err != nil || own.Max == unix.RLIM_INFINITY {
			continue
		}
		if *f.value > own.Max {
			log.Warn("a sandbox rlimit exceeds the daemon's own hard limit; sandboxes get the daemon's", "limit", f.name, "configured", *f.value, "applied", own.Max)
			*f.value = own.Max
		}
	}
	return l
}

func checkIDs(uid, gid int) error {
	switch {
	case uid == -1 && gid == -1:
		return nil
	case uid == 0 || gid == 0:
		return errors.New("bwrap backend: SandboxUID/SandboxGID 0 is not allowed; use -1 to run sandboxes as the daemon's own ids, or an unprivileged pair such as 65534/65534")
	case uid < 0 || gid < 0:
		return fmt.Errorf("bwrap backend: SandboxUID %d and SandboxGID %d must both be -1 or both be unprivileged ids", uid, gid)
	case os.Geteuid() != 0:
		return fmt.Errorf("bwrap backend: SandboxUID %d needs the daemon to run as root; use -1 to run sandboxes as the daemon's own ids (or UIDRange for a uid of their own)", uid)
	}
	return nil
}

func findBwrap(configured string) (string, error) {
	const hint = "install bubblewrap: apt-get install bubblewrap"
	if configured == "" {
		p, err := exec.LookPath("bwrap")
		if err != nil {
			return "", fmt.Errorf("%w: bwrap is not on PATH; %s: %v", backend.ErrUnavailable, hint, err)
		}
		return p, nil
	}
	fi, err := os.Stat(configured)
	if err != nil {
		return "", fmt.Errorf("%w: bwrap binary %s: %v; %s or fix BwrapPath", backend.ErrUnavailable, configured, err, hint)
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("%w: %s is not an executable file; %s or fix BwrapPath", backend.ErrUnavailable, configured, hint)
	}
	return configured, nil
}

// checkReachable verifies that uid/gid may search every directory from dir
// up to /, since bwrap running as that uid must resolve the workspace path.
func checkReachable(dir string, uid, gid int) error {
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("bwrap backend: cannot check %s: %w", p, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok && !canSearch(fi.Mode().Perm(), int(st.Uid), int(st.Gid), uid, gid) {
			return fmt.Errorf("bwrap backend: sandbox uid %d cannot reach the state directory: %s is mode %v, owner %d:%d; let others search it (chmod o+x %s) or put Dir elsewhere",
				uid, p, fi.Mode().Perm(), st.Uid, st.Gid, p)
		}
		if p == "/" || p == "." {
			return nil
		}
	}
}

// canSearch reports whether uid/gid has the x bit of a file: search for a
// directory, execute for a program.
func canSearch(perm os.FileMode, ownerUID, ownerGID, uid, gid int) bool {
	switch {
	case ownerUID == uid:
		return perm&0o100 != 0
	case ownerGID == gid:
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}

// hostRootLinks returns bwrap options recreating the host's top-level
// library and binary directories: a symlink where the host has one (Debian's
// merged /usr: /bin -> usr/bin), a read-only bind where it has a directory.
func hostRootLinks(root string) []string {
	var opts []string
	for _, name := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
		host := filepath.Join(root, name)
		fi, err := os.Lstat(host)
		switch {
		case err != nil:
			continue
		case fi.Mode()&os.ModeSymlink != 0:
			if target, err := os.Readlink(host); err == nil {
				opts = append(opts, "--symlink", target, "/"+name)
			}
		case fi.IsDir():
			opts = append(opts, "--ro-bind", host, "/"+name)
		}
	}
	return opts
}

// Name reports "bwrap".
func (b *Backend) Name() string { return Name }

// Health checks that bwrap runs ("bwrap --version" within versionTimeout)
// and, at most once per healthCacheTTL while it keeps succeeding, that it can
// really build a sandbox with the credentials sandboxes use (user namespaces
// enabled, the state directory reachable, the daemon's executable runnable
// as init) and run a command in it.
func (b *Backend) Health(ctx context.Context) error {
	if _, err := os.Stat(b.cfg.Dir); err != nil {
		return fmt.Errorf("%w: state directory %s: %v; restart the daemon to recreate it", backend.ErrUnavailable, b.cfg.Dir, err)
	}
	if err := b.runCheck(ctx, versionTimeout, "bwrap --version", []string{"--version"}); err != nil {
		return err
	}

	b.healthMu.Lock()
	defer b.healthMu.Unlock()
	if time.Now().Before(b.healthyUntil) {
		return nil
	}
	if err := b.probe(ctx); err != nil {
		return err
	}
	b.healthyUntil = time.Now().Add(healthCacheTTL)
	return nil
}

// probeDirPrefix names the trial sandboxes Health makes in Dir. A leading
// dot is never a valid id, so List and recovery never see one.
const probeDirPrefix = ".probe-"

// probe makes a trial sandbox, starts its init, runs /bin/true through it
// and removes it all, within probeTimeout.
func (b *Backend) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	fail := func(err error) error {
		if errors.Is(err, backend.ErrUnavailable) {
			return err
		}
		return fmt.Errorf("%w: a trial sandbox failed: %v", backend.ErrUnavailable, err)
	}
	dir, err := os.MkdirTemp(b.cfg.Dir, probeDirPrefix)
	if err != nil {
		return fail(fmt.Errorf("cannot create it in %s: %w", b.cfg.Dir, err))
	}
	spec := persistedSpec{Version: specVersion, Network: networkNone}
	if b.uids != nil {
		// A uid of the range like any sandbox's, so the trial shows it
		// works; returned once the trial's files are gone.
		uid, err := b.uids.Allocate()
		if err != nil {
			return fail(err)
		}
		spec.UID = &uid
	}
	sb := newSandbox(filepath.Base(dir), dir, spec, b.cfg.Limits)
	b.setIDs(sb, spec)
	defer func() {
		if b.removeSandboxFiles(sb) == nil && spec.UID != nil {
			b.uids.Release(*spec.UID)
		}
	}()
	if err := b.prepareSandboxDir(sb); err != nil {
		return fail(err)
	}
	for _, name := range []string{workDirName, tmpDirName} {
		if err := b.makeGuestDir(sb, filepath.Join(dir, name)); err != nil {
			return fail(err)
		}
	}
	// Under the same cgroup limits as a sandbox: the trial also shows
	// that the host still gives sandboxes their groups.
	if err := b.makeCgroup(ctx, sb); err != nil {
		return fail(err)
	}
	defer func() { _ = b.removeCgroup(sb) }()
	defer b.killInit(sb)
	ip, err := b.acquireInit(ctx, sb, time.Now().Add(probeTimeout))
	if err != nil {
		return fail(err)
	}
	env, _ := mergeEnv(nil, nil)
	res, err := b.execInit(ctx, ctx, sb, ip, backend.ExecRequest{MaxOutputBytes: probeOutputBytes}, []string{"/bin/true"}, env, guestWorkspace, 5*time.Second)
	switch {
	case err != nil:
		return fail(err)
	case res.ExitCode != 0 || res.TimedOut || res.SandboxTerminated:
		return fail(fmt.Errorf("/bin/true in it: exit %d, timed out %v, terminated %v, stderr %q", res.ExitCode, res.TimedOut, res.SandboxTerminated, firstLine(res.Stderr)))
	}
	return nil
}

func (b *Backend) runCheck(ctx context.Context, limit time.Duration, what string, args []string) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := b.command(nil, args)
	res, err := capture.Run(ctx, cmd, capture.Options{Timeout: limit, KillGrace: outerKillGrace, MaxOutputBytes: probeOutputBytes})
	if err == nil && res.ExitCode == 0 && !res.TimedOut {
		return nil
	}
	detail := strings.TrimSpace(string(res.Stderr))
	switch {
	case err != nil:
		detail = err.Error()
	case res.TimedOut:
		detail = fmt.Sprintf("no answer within %v", limit)
	case detail == "":
		detail = fmt.Sprintf("exit status %d", res.ExitCode)
	}
	return fmt.Errorf("%w: %s failed: %s; check that bubblewrap works for uid %s and that unprivileged user namespaces are enabled (sysctl user.max_user_namespaces > 0, kernel.apparmor_restrict_unprivileged_userns=0)",
		backend.ErrUnavailable, what, detail, b.runsAs())
}

// command returns an exec.Cmd for bwrap with an environment holding only
// the marker of sandbox sb's directory (nil: none, and the ids of
// sandboxes without their own), run from /, with the sandbox's host
// credentials unless it runs as the daemon's own.
func (b *Backend) command(sb *sandbox, args []string) *exec.Cmd {
	cmd := exec.Command(b.bwrap, args...)
	cmd.Env = []string{}
	uid, gid := b.cfg.SandboxUID, b.cfg.SandboxGID
	if sb != nil {
		cmd.Env = []string{markerEnv + "=" + marker(sb.dir)}
		uid, gid = sb.uid, sb.gid
	}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	if uid >= 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{
			Uid:    uint32(uid),
			Gid:    uint32(gid),
			Groups: []uint32{},
		}
	}
	return cmd
}

// StaticInit reports whether the sandboxes' init is statically linked, so
// that it runs in a root without the host's loader and C library (an
// image). A backend whose init is not refuses such roots.
func (b *Backend) StaticInit() bool { return b.static }

var _ backend.StaticInitReporter = (*Backend)(nil)

// initExecutable returns the daemon's running executable (or path, when
// set), for bwrap to run as each sandbox's init through an inherited
// descriptor: no path of the
// host needs to be visible in the sandbox or reachable by its uid (the
// binary may sit in a 0700 directory), and a package upgrade that replaces
// the file on disk does not put a different version in the sandboxes.
// When the sandbox uid cannot execute the file itself (its mode, or a
// noexec mount), it is copied once into a sealed memfd instead.
func initExecutable(path string, sandboxUID, sandboxGID int) (*os.File, error) {
	if path == "" {
		path = "/proc/self/exe"
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	uid, gid := sandboxUID, sandboxGID
	if uid < 0 {
		uid, gid = os.Geteuid(), os.Getegid()
	}
	var fs unix.Statfs_t
	st, ok := fi.Sys().(*syscall.Stat_t)
	if ok && unix.Fstatfs(int(f.Fd()), &fs) == nil && fs.Flags&unix.ST_NOEXEC == 0 &&
		(uid == 0 && fi.Mode().Perm()&0o111 != 0 || canSearch(fi.Mode().Perm(), int(st.Uid), int(st.Gid), uid, gid)) {
		return f, nil
	}
	defer f.Close()
	return sealedCopy(f, "sandbox-sidecar-init")
}

// sealedCopy copies f into a memfd that can no longer change.
func sealedCopy(f *os.File, name string) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	m := os.NewFile(uintptr(fd), name)
	if _, err := io.Copy(m, f); err != nil {
		m.Close()
		return nil, err
	}
	if err := m.Chmod(0o555); err != nil {
		m.Close()
		return nil, err
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(m.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		m.Close()
		return nil, fmt.Errorf("seal: %w", err)
	}
	return m, nil
}

func (b *Backend) runsAs() string {
	if b.uids != nil {
		return fmt.Sprintf("%s (the sandbox range)", b.cfg.UIDRange)
	}
	if b.cfg.SandboxUID >= 0 {
		return fmt.Sprint(b.cfg.SandboxUID)
	}
	return fmt.Sprintf("%d (the daemon's)", os.Geteuid())
}
