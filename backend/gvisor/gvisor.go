// Package gvisor is the backend that runs every sandbox in a gVisor
// sandbox (runsc): the guest's system calls are served by gVisor's
// user-space kernel (the sentry), not by the host's, so a bug in the host
// kernel reachable from an unprivileged process is not reachable from the
// guest. It needs no KVM: the systrap platform runs on any Linux host.
//
// It owns the directory it is given (Config.Dir): one subdirectory per
// sandbox holding the guest's /workspace and /tmp, spec.json and the OCI
// bundle runsc boots; runsc's own state (--root) in Dir/.runsc; and a
// read-only root filesystem shared by every sandbox in Dir/.rootfs (the
// host's /usr bound in read-only, a synthetic /etc, mount points), as the
// bubblewrap backend shows its guests the host.
//
// One runsc sandbox per sandbox, booted by Create and kept: its only
// process is an init of ours (sandbox-sidecar-init or the daemon's own executable, bound in
// read-only; see InitMain) that starts every command, so a command costs a
// fork and an exec inside gVisor rather than a `runsc exec`. The daemon and
// init talk over the container's stdio, two FIFOs (gvwire). Init kills
// everything a command started when the command ends, but the durable
// processes (procs.go); the files and /tmp persist between commands. A
// sandbox's gVisor sandbox outlives the daemon, and a restarted daemon
// re-attaches to its init (reattach.go). A paused sandbox is a runsc
// checkpoint in its directory and no runsc process (pause.go).
//
// File operations run on the host through os.Root, on the directories
// bound into the guest with gVisor's shared file access, so either side
// sees the other's writes at once.
package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc/initexe"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/procstore"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/registry"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/statedir"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/cgroup"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

// Name is the backend's name as reported to clients.
const Name = "gvisor"

// Platforms runsc can be told to use.
const (
	PlatformSystrap = "systrap"
	PlatformPtrace  = "ptrace"
	PlatformKVM     = "kvm"

	// Values of Config.SystrapFastPath.
	FastPathAuto = "auto"
	FastPathOn   = "on"
	FastPathOff  = "off"
	// fastPathFlag turns systrap's spinning off (runsc since 2025).
	fastPathFlag = "--systrap-disable-fast-path"
)

// Defaults for the zero fields of Config.
const (
	DefaultKillGrace = 2 * time.Second
	DefaultExecGrace = 5 * time.Second
)

// Named bounds on the backend's own waits.
const (
	// bootTimeout bounds `runsc run -detach` and init's ready frame.
	bootTimeout = 30 * time.Second
	// cliTimeout bounds every other runsc command (list, delete, kill).
	cliTimeout = 15 * time.Second
	// cliOutputBytes caps what is kept of a runsc command's output.
	cliOutputBytes = 64 << 10
	// killAnswer bounds how long init has to report a command it was told
	// to kill before the daemon gives up on the sandbox.
	killAnswer = 5 * time.Second
	// sendTimeout bounds handing init one request.
	sendTimeout = 10 * time.Second
	// specVersion is the version of persistedSpec written by this code.
	specVersion = 1
	// healthCacheTTL is how long a successful trial sandbox vouches for
	// the host.
	healthCacheTTL = 30 * time.Second
	// kvmTrialTimeout bounds the trial boot on the kvm platform at start
	// (trialKVM); a working kvm platform boots in well under a second.
	kvmTrialTimeout = 10 * time.Second
	// logTailBytes is how much of a sandbox's runsc log errors quote.
	logTailBytes = 2 << 10
)

// Layout of Dir and Dir/<id>.
const (
	runscRootName = ".runsc"  // runsc --root
	rootfsName    = ".rootfs" // the shared read-only root
	probePrefix   = ".probe-" // Health's trial sandboxes; never a valid id
	workDirName   = hostfs.WorkDirName
	tmpDirName    = hostfs.TmpDirName
	bundleName    = "bundle"
	logName       = "runsc.log"
)

// Network values reported in backend.Info.
const networkNone = "none"

// Config configures a Backend.
type Config struct {
	// Dir is the backend's state directory; sandbox <id> lives in Dir/<id>.
	Dir string
	// RunscPath is the runsc binary; empty means "runsc" on PATH.
	RunscPath string
	// InitPath is the executable bound read-only into every sandbox as its
	// init; empty means the daemon's own (os.Executable). It must be a
	// build of this same source. Tests point it at a static build of the
	// daemon (the race-enabled test binary is dynamically linked).
	InitPath string
	// Platform is runsc's --platform (default systrap).
	Platform string
	// ExtraFlags are added to every runsc command line before the
	// subcommand (e.g. "--debug-log=/var/log/runsc/").
	ExtraFlags []string
	// SystrapFastPath is FastPathAuto (the default, ""), FastPathOn or
	// FastPathOff: whether systrap may spin instead of sleeping in its
	// hand-offs between the guest's threads and the sentry (runsc's own
	// controller decides when it does), or never does
	// (--systrap-disable-fast-path). Auto is off on a host with two CPUs
	// or fewer, where the spinning takes the CPU the command, its init and
	// the daemon need (docs/benchmarks.md, "gVisor: where a command's time
	// goes"), and runsc's choice otherwise.
	SystrapFastPath string
	// BufferedRestoreReads makes runsc read a checkpoint's memory through
	// the host's page cache when it restores a sandbox. By default it
	// reads around it (O_DIRECT, where the state directory's filesystem
	// takes it): on a local disk the pages then load with less of the CPU
	// the restore itself needs (a resume ~50 ms faster on the test VM);
	// on a disk of low throughput (a network block device), where a
	// checkpoint just written is faster read back from the cache, set it.
	BufferedRestoreReads bool
	// KillGrace is how long a command has between the SIGTERM and the
	// SIGKILL its init sends at its budget (default DefaultKillGrace).
	KillGrace time.Duration
	// ExecGrace is the time beyond a command's Timeout+KillGrace after which
	// the daemon has init kill it (default DefaultExecGrace).
	ExecGrace time.Duration
	// Limits are every sandbox's limits, and the most a spec may ask for.
	// The rlimits (OpenFiles, FileSizeBytes) are set through the OCI spec;
	// MemoryBytes, PIDs, CPUs and CPUWeight need Cgroups. Disk caps are not
	// enforced by this backend (DiskBytes is ignored and reported off, and a
	// spec asking for one is refused).
	Limits limits.Limits
	// Cgroups gives every sandbox a cgroup of its own with the memory,
	// process and CPU limits of Limits, holding its runsc sandbox and gofer.
	// Nil: those limits are not enforced and a spec asking for one is
	// refused.
	Cgroups *cgroup.Manager
	// Egress serves the network of sandboxes whose spec names
	// allow_egress_to or allow_egress_to_cidrs (network "allowlist"; see
	// egress.go). Nil: such specs are refused with ErrSpecUnenforceable.
	Egress *egress.Egress
	// Processes bounds each sandbox's durable processes (procstore).
	Processes procstore.Limits
	// Code configures code contexts: the modules their interpreter
	// preloads, and how many a sandbox may have.
	Code backend.CodeConfig
	// MaxCheckpointBytes caps the checkpoint a paused sandbox keeps on
	// disk (its guest's memory; pause.go): a larger one is not kept and
	// the pause refused (default DefaultMaxCheckpointBytes).
	MaxCheckpointBytes int64
	// Failpoint, when set, is called at the named points (the Fail*
	// constants) so crash tests can stop the daemon exactly there: one
	// may end the calling goroutine (runtime.Goexit), whose deferred
	// calls then only unlock what this process holds in memory.
	// Production leaves it nil.
	Failpoint func(name string)
	// Logger receives the backend's logs; nil discards them.
	Logger hclog.Logger
}

// Backend implements backend.Backend with gVisor.
type Backend struct {
	cfg     Config
	runsc   string
	version string // runsc --version, first line
	exe     string // the sandboxes' init (InitPath or the daemon's executable), bound into every sandbox
	static  bool   // exe is statically linked (initexe.Static)
	// noFastPath: every runsc command line gets fastPathFlag
	// (Config.SystrapFastPath, resolved by New).
	noFastPath bool
	// imageMu orders the making and removing of the images' mount-point
	// roots; imageHolds counts, by root, the creates using one (guarded
	// by imageMu).
	imageMu    sync.Mutex
	imageHolds map[string]int
	log        hclog.Logger

	reg *registry.Registry[*sandbox]

	healthMu     sync.Mutex
	healthyUntil time.Time

	// watcher wakes the reads and waits of durable processes (procs.go).
	watcher procstore.Watcher
}

var _ backend.Backend = (*Backend)(nil)

// New validates cfg, finds runsc and checks that it runs, makes Dir and the
// shared root, and removes every runsc sandbox a previous daemon left in
// Dir but those whose init lives on, for their sandboxes' loads to
// re-attach to. It boots no sandbox; Health does.
func New(cfg Config) (*Backend, error) {
	var err error
	if cfg.Dir, err = backend.CheckStateDir("gvisor", cfg.Dir); err != nil {
		return nil, err
	}
	if err := backend.DefaultGraces("gvisor", &cfg.KillGrace, &cfg.ExecGrace, DefaultKillGrace, DefaultExecGrace); err != nil {
		return nil, err
	}
	switch cfg.Platform {
	case "":
		cfg.Platform = PlatformSystrap
	case PlatformSystrap, PlatformPtrace, PlatformKVM:
	default:
		return nil, fmt.Errorf("gvisor backend: unknown platform %q; use systrap (the default, no KVM needed), ptrace, or kvm where the host allows it", cfg.Platform)
	}
	switch cfg.SystrapFastPath {
	case "":
		cfg.SystrapFastPath = FastPathAuto
	case FastPathAuto, FastPathOn, FastPathOff:
	default:
		return nil, fmt.Errorf("gvisor backend: systrap_fast_path %q: use auto (the default), on or off", cfg.SystrapFastPath)
	}
	for _, f := range cfg.ExtraFlags {
		if !strings.HasPrefix(f, "--") {
			return nil, fmt.Errorf("gvisor backend: extra runsc flag %q must start with --", f)
		}
		for _, owned := range []string{"--root", "--platform", "--network", "--gso"} {
			if f == owned || strings.HasPrefix(f, owned+"=") {
				return nil, fmt.Errorf("gvisor backend: extra runsc flag %q sets something the backend decides itself (%s); drop it", f, owned)
			}
		}
		if f == fastPathFlag || strings.HasPrefix(f, fastPathFlag+"=") {
			return nil, fmt.Errorf("gvisor backend: extra runsc flag %q: set gvisor.systrap_fast_path (auto, on or off) instead", f)
		}
	}
	if err := cfg.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("gvisor backend: %w", err)
	}
	switch {
	case cfg.MaxCheckpointBytes == 0:
		cfg.MaxCheckpointBytes = DefaultMaxCheckpointBytes
	case cfg.MaxCheckpointBytes < 0:
		return nil, fmt.Errorf("gvisor backend: max_checkpoint_bytes %d is negative", cfg.MaxCheckpointBytes)
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: the gvisor backend needs the daemon to run as root (runsc sets up namespaces, a chroot and cgroups for every sandbox); see docs/operations.md (gVisor)", backend.ErrUnavailable)
	}
	if cfg.Platform == PlatformKVM {
		if err := KVMUsable("/dev/kvm"); err != nil {
			return nil, fmt.Errorf("%w: gvisor.platform kvm needs a working KVM, and this host has none (%v); use systrap, which needs no KVM", backend.ErrUnavailable, err)
		}
	}
	bin, err := findRunsc(cfg.RunscPath)
	if err != nil {
		return nil, err
	}
	exe := cfg.InitPath
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("gvisor backend: cannot find the daemon's own executable, which every sandbox runs as its init: %w", err)
		}
	}
	static, err := staticExecutable(exe)
	if err != nil {
		return nil, fmt.Errorf("gvisor backend: the sandboxes' init: %w", err)
	}
	if !static {
		cfg.Logger.Info("the sandboxes' init is dynamically linked: it needs the host's loader and C library, so it runs only in sandboxes whose root is the host's; build the daemon with CGO_ENABLED=0 -buildmode=exe for one that runs anywhere", "init", exe)
	}
	b := &Backend{cfg: cfg, runsc: bin, exe: exe, static: static, log: cfg.Logger, imageHolds: map[string]int{}}
	b.reg = registry.New(registry.Hooks[*sandbox]{
		Load: b.load,
		Usable: func(sb *sandbox) error {
			if _, err := os.Stat(sb.workDir()); err != nil {
				return backend.NotFound(sb.id)
			}
			return nil
		},
		Exists: func(sb *sandbox) bool { _, err := os.Lstat(sb.dir); return err == nil },
		Forget: b.forget,
		Placeholder: func(id string) *sandbox {
			return newSandbox(id, b.sandboxDir(id), persistedSpec{}, limits.Limits{})
		},
	})
	if b.version, err = b.runscVersion(context.Background()); err != nil {
		return nil, err
	}
	if b.noFastPath, err = b.resolveFastPath(runtime.NumCPU()); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("gvisor backend: cannot create state directory %s: %w", cfg.Dir, err)
	}
	if err := os.Chmod(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("gvisor backend: cannot set mode 0700 on %s: %w", cfg.Dir, err)
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, runscRootName), 0o700); err != nil {
		return nil, fmt.Errorf("gvisor backend: %w", err)
	}
	if err := makeRootfs(filepath.Join(cfg.Dir, rootfsName), "/"); err != nil {
		return nil, fmt.Errorf("gvisor backend: cannot make the sandboxes' root filesystem: %w", err)
	}
	// No sandbox of this process runs yet: every runsc sandbox in our root
	// was left by a previous daemon. Those whose init lives are kept for
	// their sandbox's load to re-attach to (reattach.go), or for the
	// lifecycle's sweep to destroy; the rest are removed.
	live := b.liveContainers(context.Background())
	if n := b.sweepRunsc(context.Background(), live); n > 0 {
		b.log.Warn("removed runsc sandboxes left by a previous daemon", "count", n)
	}
	if len(live) > 0 {
		b.log.Info("runsc sandboxes a previous daemon left run on, to be re-attached", "count", len(live))
	}
	// And the processes of a boot it was killed in, which runsc never
	// listed (killRunscStrays).
	b.killRunscStraysBut(b.bundlesOf(live))
	b.sweepCgroups(live)
	if probes, _ := filepath.Glob(filepath.Join(cfg.Dir, probePrefix+"*")); len(probes) > 0 {
		for _, p := range probes {
			_ = statedir.RemoveAll(p)
		}
	}
	if cfg.Platform == PlatformKVM {
		if err := b.trialKVM(); err != nil {
			_ = b.Close()
			return nil, err
		}
	}
	b.log.Info("gvisor backend ready", "runsc", bin, "version", b.version, "platform", cfg.Platform)
	return b, nil
}

// trialKVM boots a trial sandbox on the kvm platform before the backend
// serves: a host can open /dev/kvm and make a VM (KVMUsable) and still not
// run gVisor's guest (a paravirtualised or nested KVM without the CPU's
// virtualisation extensions; on such a host runsc's boot hangs once it
// starts its first vCPU). Without the trial every create would wait out the
// boot timeout and fail; with it the daemon refuses to start and says why.
func (b *Backend) trialKVM() error {
	ctx, cancel := context.WithTimeout(context.Background(), kvmTrialTimeout)
	defer cancel()
	start := time.Now()
	if err := b.probe(ctx); err != nil {
		why := fmt.Sprintf("a trial sandbox on runsc's kvm platform failed (%v)", err)
		if ctx.Err() != nil {
			why = fmt.Sprintf("a trial sandbox on runsc's kvm platform did not run /bin/true within %s (on a KVM without the CPU's virtualisation extensions, as a paravirtualised or nested one may be, runsc hangs at its first vCPU)", kvmTrialTimeout)
		}
		return fmt.Errorf("%w: gvisor.platform kvm: /dev/kvm makes a VM here, but %s; use platform systrap, which needs no KVM", backend.ErrUnavailable, why)
	}
	b.log.Info("kvm platform trial sandbox ran", "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// staticExecutable reports whether the executable at path is statically
// linked (initexe.Static).
func staticExecutable(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	return initexe.Static(f)
}

// StaticInit reports whether the sandboxes' init is statically linked, so
// that it runs in a root without the host's loader and C library (an
// image). A backend whose init is not refuses such roots.
func (b *Backend) StaticInit() bool { return b.static }

var _ backend.StaticInitReporter = (*Backend)(nil)

func findRunsc(configured string) (string, error) {
	const hint = "install gVisor's runsc (docs/operations.md, gVisor)"
	if configured == "" {
		p, err := exec.LookPath("runsc")
		if err != nil {
			return "", fmt.Errorf("%w: runsc is not on PATH; %s or set gvisor.runsc_path: %v", backend.ErrUnavailable, hint, err)
		}
		return p, nil
	}
	if !filepath.IsAbs(configured) {
		return "", fmt.Errorf("%w: gvisor.runsc_path %q must be an absolute path", backend.ErrUnavailable, configured)
	}
	fi, err := os.Stat(configured)
	if err != nil {
		return "", fmt.Errorf("%w: runsc binary %s: %v; %s or fix gvisor.runsc_path", backend.ErrUnavailable, configured, err, hint)
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("%w: %s is not an executable file; %s or fix gvisor.runsc_path", backend.ErrUnavailable, configured, hint)
	}
	return configured, nil
}

// runscVersion runs `runsc --version` and returns its first line's
// version ("v0.0.0-20250205023644-9414b50a5633", or a release's date).
func (b *Backend) runscVersion(ctx context.Context) (string, error) {
	out, err := b.cli(ctx, cliTimeout, "--version")
	if err != nil {
		return "", fmt.Errorf("%w: %s --version failed (%v); is it a working runsc binary?", backend.ErrUnavailable, b.runsc, err)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	v, ok := strings.CutPrefix(strings.TrimSpace(line), "runsc version ")
	if !ok || v == "" {
		return "", fmt.Errorf("%w: %s --version printed %q, not a runsc version; is it runsc?", backend.ErrUnavailable, b.runsc, backend.ShortName(line))
	}
	return v, nil
}

// Describe implements backend.Describer: health reports the runsc binary,
// its version, the platform and whether systrap's fast path is off.
func (b *Backend) Describe() map[string]string {
	d := map[string]string{"runsc": b.runsc, "runsc_version": b.version, "platform": b.cfg.Platform}
	switch {
	case b.cfg.Platform != PlatformSystrap:
	case b.noFastPath:
		d["systrap_fast_path"] = FastPathOff
	default:
		d["systrap_fast_path"] = "runsc's choice"
	}
	return d
}

// wantFastPathOff says whether a systrap sandbox gets fastPathFlag:
// setting is Config.SystrapFastPath, ncpu the CPUs the daemon may use.
func wantFastPathOff(setting, platform string, ncpu int) bool {
	if platform != PlatformSystrap {
		return false
	}
	return setting == FastPathOff || setting == FastPathAuto && ncpu <= 2
}

// resolveFastPath decides noFastPath. The flag is recent: a runsc that
// does not know it is refused when the operator asked for off, and left
// to its own controller under auto.
func (b *Backend) resolveFastPath(ncpu int) (bool, error) {
	if !wantFastPathOff(b.cfg.SystrapFastPath, b.cfg.Platform, ncpu) {
		return false, nil
	}
	// The backend's flags, this one and --version: a runsc that does not
	// know the flag fails to parse its command line.
	if _, err := b.cli(context.Background(), cliTimeout, fastPathFlag, "--version"); err != nil {
		if b.cfg.SystrapFastPath == FastPathOff {
			return false, fmt.Errorf("%w: gvisor.systrap_fast_path off: %s does not know %s (%v); install a current runsc or set it to auto", backend.ErrUnavailable, b.runsc, fastPathFlag, err)
		}
		b.log.Info("this runsc has no "+fastPathFlag+": systrap's fast path stays runsc's choice", "cpus", ncpu)
		return false, nil
	}
	return true, nil
}

// kvmCreateVM is the KVM_CREATE_VM ioctl (_IO(KVMIO, 0x01)).
const kvmCreateVM = 0xAE01

// KVMUsable reports whether this host lets the daemon make a KVM virtual
// machine, which runsc's kvm platform needs: /dev/kvm opens and
// KVM_CREATE_VM succeeds. That /dev/kvm exists proves nothing (a container
// may have the node without access, a nested host may refuse the VM).
func KVMUsable(device string) error {
	f, err := os.OpenFile(device, os.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", device, err)
	}
	defer f.Close()
	vm, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), kvmCreateVM, 0)
	if errno != 0 {
		return fmt.Errorf("KVM_CREATE_VM on %s: %w", device, errno)
	}
	_ = syscall.Close(int(vm))
	return nil
}

// Name reports "gvisor".
func (b *Backend) Name() string { return Name }

// runscRoot is runsc's --root: its state of this backend's sandboxes.
func (b *Backend) runscRoot() string { return filepath.Join(b.cfg.Dir, runscRootName) }

// globalFlags are the runsc flags before every subcommand.
func (b *Backend) globalFlags() []string {
	f := []string{
		"--root=" + b.runscRoot(),
		"--platform=" + b.cfg.Platform,
		"--network=none",
		// The root is read-only and ours; no overlay over it.
		"--overlay2=none",
		// The workspace and /tmp are changed from the host (file
		// operations) while the guest uses them: gVisor must not cache
		// them as if it owned them exclusively.
		"--file-access-mounts=shared",
		// The daemon owns the sandboxes' cgroups: runsc would otherwise
		// make one per container at the top of the hierarchy and move the
		// sentry and gofer there, out of the group they were born in.
		"--ignore-cgroups",
	}
	if b.noFastPath {
		f = append(f, fastPathFlag)
	}
	return append(f, b.cfg.ExtraFlags...)
}

// cli runs one runsc command to completion within limit and returns its
// output (stdout and stderr, bounded).
func (b *Backend) cli(ctx context.Context, limit time.Duration, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	if len(args) == 0 || args[0] != "--version" {
		args = append(b.globalFlags(), args...)
	}
	cmd := exec.CommandContext(ctx, b.runsc, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	var out boundedBuffer
	out.limit = cliOutputBytes
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if err != nil {
		if ctx.Err() != nil {
			return out.Bytes(), fmt.Errorf("runsc %s did not finish within %v", args[len(args)-1], limit)
		}
		return out.Bytes(), fmt.Errorf("%w: %s", err, bytes.TrimSpace(out.Bytes()))
	}
	return out.Bytes(), nil
}

// boundedBuffer keeps the first limit bytes written to it.
type boundedBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	limit int
}

func (w *boundedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if room := w.limit - w.buf.Len(); room > 0 {
		w.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (w *boundedBuffer) Bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.buf.Bytes())
}

// Health checks that runsc still runs and, at most once per
// healthCacheTTL while it keeps succeeding, that it boots a trial sandbox
// and runs a command in it.
func (b *Backend) Health(ctx context.Context) error {
	if _, err := os.Stat(b.cfg.Dir); err != nil {
		return fmt.Errorf("%w: state directory %s: %v; restart the daemon to recreate it", backend.ErrUnavailable, b.cfg.Dir, err)
	}
	if _, err := b.runscVersion(ctx); err != nil {
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

// probe boots a trial sandbox, runs /bin/true in it and removes it.
func (b *Backend) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, bootTimeout+cliTimeout)
	defer cancel()
	dir, err := os.MkdirTemp(b.cfg.Dir, probePrefix)
	if err != nil {
		return fmt.Errorf("%w: a trial sandbox cannot be made in %s: %v", backend.ErrUnavailable, b.cfg.Dir, err)
	}
	name := filepath.Base(dir)
	sb := newSandbox(name, dir, persistedSpec{Version: specVersion, Network: networkNone}, b.cfg.Limits)
	defer func() {
		b.stopInit(sb)
		_, _ = b.cli(context.Background(), cliTimeout, "delete", "--force", sb.containerID())
		_ = b.removeCgroup(sb)
		_ = statedir.RemoveAll(dir)
	}()
	if err := b.prepareDirs(sb); err != nil {
		return fmt.Errorf("%w: a trial sandbox: %v", backend.ErrUnavailable, err)
	}
	res, err := b.execIn(ctx, ctx, sb, backend.ExecRequest{Argv: []string{"/bin/true"}, Timeout: 10 * time.Second, MaxOutputBytes: 1024})
	switch {
	case err != nil:
		return fmt.Errorf("%w: a trial sandbox failed: %v", backend.ErrUnavailable, err)
	case res.ExitCode != 0 || res.SandboxTerminated:
		return fmt.Errorf("%w: a trial sandbox ran /bin/true with exit %d (terminated %v): %s", backend.ErrUnavailable, res.ExitCode, res.SandboxTerminated, bytes.TrimSpace(res.Stderr))
	}
	return nil
}

// persistedSpec is spec.json: what a restarted daemon needs to keep running
// commands in a sandbox it finds on disk.
type persistedSpec struct {
	Version   int               `json:"version"`
	Network   string            `json:"network"`
	Env       map[string]string `json:"env,omitempty"`
	Resources backend.Resources `json:"resources,omitempty"`
	// Image is the image the sandbox runs on; absent: the host image.
	Image *imageSpec `json:"image,omitempty"`
	// AllowEgressTo and AllowEgressToCIDRs are the allow-lists of a
	// sandbox with network "allowlist".
	AllowEgressTo      []string `json:"allow_egress_to,omitempty"`
	AllowEgressToCIDRs []string `json:"allow_egress_to_cidrs,omitempty"`
}

// SpecVersion implements registry.Versioned.
func (p *persistedSpec) SpecVersion() int { return p.Version }

func (b *Backend) sandboxDir(id string) string { return filepath.Join(b.cfg.Dir, id) }

// lookup returns sandbox id, loading it from disk when this process has
// not seen it yet (a restarted daemon re-adopting its sandboxes).
func (b *Backend) lookup(id string) (*sandbox, error) { return b.reg.Lookup(id) }

// Adopt takes sandbox id back after a restart: its settings load, within
// limits this daemon enforces, and its workspace is there. Its init, when
// its gVisor sandbox outlived the previous daemon, is re-attached
// (reattach.go); otherwise a fresh one, in a fresh cgroup, boots with its
// next command.
func (b *Backend) Adopt(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sandbox %s was not adopted: %w", id, err)
	}
	_, err := b.lookup(id)
	return err
}

// load makes the state of a sandbox found on disk (registry.Hooks.Load).
func (b *Backend) load(id string) (*sandbox, error) {
	var spec persistedSpec
	if err := registry.LoadSpec(b.sandboxDir(id), id, specVersion, &spec); err != nil {
		return nil, err
	}
	switch spec.Network {
	case networkNone:
	case networkAllowlist:
		if _, err := b.egressPolicy(spec.AllowEgressTo, spec.AllowEgressToCIDRs); err != nil {
			return nil, fmt.Errorf("sandbox %q has egress allow-lists this daemon cannot serve now (%w); destroy it and create a new one", id, err)
		}
	default:
		return nil, fmt.Errorf("%w: sandbox %q has unknown network %q in its settings; destroy it and create a new one", backend.ErrNotFound, id, spec.Network)
	}
	if err := backend.ValidateEnv(spec.Env, "the sandbox's"); err != nil {
		return nil, fmt.Errorf("sandbox %s has bad settings on disk (%w); destroy it and create a new one", id, err)
	}
	lim, err := b.effectiveLimits(spec.Resources)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s was created with limits this daemon no longer enforces (%w); destroy it and create a new one", id, err)
	}
	if spec.Image != nil {
		if _, err := b.checkImage(backend.Image{Name: spec.Image.Name, Digest: spec.Image.Digest, Root: spec.Image.Root}); err != nil {
			return nil, fmt.Errorf("sandbox %s runs on image %s: %w", id, backend.ShortName(spec.Image.Name), err)
		}
		if _, err := b.imageRootfs(spec.Image); err != nil {
			return nil, err
		}
	}
	sb := newSandbox(id, b.sandboxDir(id), spec, lim)
	if _, err := os.Stat(sb.workDir()); err != nil {
		return nil, backend.NotFound(id)
	}
	// What a pause or a resume cut short left (pause.go), then the init a
	// previous daemon left, with the durable processes it runs
	// (reattach.go). With a checkpoint in place, a live init means a
	// resume restored it: the checkpoint goes. Without one, the sandbox
	// is paused and its processes live in the checkpoint.
	checkpointed := b.loadPause(sb)
	sb.init = b.adoptLiveInit(sb, checkpointed)
	switch {
	case checkpointed && sb.init != nil:
		// A resume restored it; its checkpoint goes once the sentry has
		// read all of it (a restore loads in the background).
		if err := b.restoreLoaded(context.Background(), sb); err != nil {
			b.log.With("sandbox", sb.id).Warn("cannot tell whether a resumed sandbox's memory was loaded from its checkpoint; the checkpoint stays until its next pause", "error", err)
		} else {
			b.dropCheckpoint(sb)
		}
	case checkpointed:
		sb.paused = true
	}
	return sb, nil
}

// forget stops what is left of a sandbox whose directory vanished (its
// operations are already cancelled).
func (b *Backend) forget(sb *sandbox) {
	b.stopInit(sb)
	_, _ = b.cli(context.Background(), cliTimeout, "delete", "--force", sb.containerID())
	b.log.With("sandbox", sb.id).Warn("the sandbox's directory was removed behind the daemon's back; its gVisor sandbox is stopped")
}

// Create makes Dir/<id> with an empty workspace and /tmp, records the spec
// and boots the sandbox's gVisor sandbox with its init. Its network is none,
// or with allow-lists the daemon's egress path (egress.go).
func (b *Backend) Create(ctx context.Context, id string, spec backend.Spec) (backend.Info, error) {
	mem, err := memoryOfImage(spec.Image)
	if err != nil {
		return backend.Info{}, err
	}
	return b.create(ctx, id, spec, mem)
}

// create is Create, or with mem a sandbox restored from a memory fork's
// checkpoint instead of booted (fork.go).
func (b *Backend) create(ctx context.Context, id string, spec backend.Spec, mem *memorySeed) (_ backend.Info, err error) {
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
	if mem != nil && network == networkAllowlist {
		return backend.Info{}, fmt.Errorf("%w: a sandbox restored from memory has the network its checkpoint was taken with, and an egress allow-list is not one a checkpoint can carry; create it without allow_egress_to, or from a snapshot without memory", backend.ErrUnsupported)
	}
	img, err := b.checkImage(spec.Image)
	if err != nil {
		return backend.Info{}, err
	}
	if img != nil {
		release, err := b.holdImageRootfs(img)
		if err != nil {
			return backend.Info{}, err
		}
		defer release()
	}
	if err := backend.ValidateEnv(spec.Env, "the sandbox's"); err != nil {
		return backend.Info{}, err
	}
	lim, err := b.effectiveLimits(spec.Resources)
	if err != nil {
		return backend.Info{}, err
	}
	log := b.log.With("sandbox", id)

	if b.reg.KnownAndPresent(id) {
		return backend.Info{}, fmt.Errorf("sandbox %q already exists or is being destroyed; destroy it first or choose another id: %w", id, fs.ErrExist)
	}
	dir := b.sandboxDir(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return backend.Info{}, fmt.Errorf("sandbox %q already exists; destroy it first or choose another id: %w", id, err)
		}
		return backend.Info{}, fmt.Errorf("create sandbox %s: %w; check that the state directory is writable", id, err)
	}
	saved := persistedSpec{Version: specVersion, Network: network, Env: maps.Clone(spec.Env), Resources: spec.Resources, Image: img}
	if network == networkAllowlist {
		saved.AllowEgressTo, saved.AllowEgressToCIDRs = slices.Clone(spec.AllowEgressTo), slices.Clone(spec.AllowEgressToCIDRs)
	}
	sb := newSandbox(id, dir, saved, lim)
	defer func() {
		if err != nil {
			b.stopInit(sb)
			_, _ = b.cli(context.Background(), cliTimeout, "delete", "--force", sb.containerID())
			if rmErr := b.removeCgroup(sb); rmErr != nil {
				log.Error("cannot remove the cgroup of a half-made sandbox", "error", rmErr)
			}
			if rmErr := statedir.RemoveAll(dir); rmErr != nil {
				log.Error("cannot remove half-made sandbox", "error", rmErr)
			}
		}
	}()
	if err := b.prepareDirs(sb); err != nil {
		return backend.Info{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if err := b.seed(ctx, sb, spec); err != nil {
		return backend.Info{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if mem != nil {
		if err := b.seedMemory(ctx, sb, mem); err != nil {
			return backend.Info{}, fmt.Errorf("create sandbox %s: %w", id, err)
		}
	}
	if err := registry.SaveSpec(dir, saved); err != nil {
		return backend.Info{}, fmt.Errorf("create sandbox %s: save its settings: %w", id, err)
	}
	if err := b.reg.Created(id, sb); err != nil {
		return backend.Info{}, err
	}
	// An operation may have loaded these same settings first: boot the
	// state the registry holds.
	if held, err := b.reg.Lookup(id); err == nil {
		sb = held
	}
	// Boot now: a sandbox that cannot boot fails its Create, not its first
	// command. Registered first, so a Destroy meanwhile stops the boot.
	if mem != nil {
		err = b.restoreFork(ctx, sb, mem)
	} else if _, err = b.acquireInit(ctx, sb); err == nil {
		sb.releaseInit()
	}
	if err != nil {
		b.reg.Done(id, sb)
		return backend.Info{}, err
	}
	log.Info("sandbox created", "network", network, "env_vars", len(spec.Env), "image", spec.Image.DisplayName())
	return backend.Info{Workdir: guestWorkspace, Network: network}, nil
}

// prepareDirs makes the guest's directories and the OCI bundle of sb.
func (b *Backend) prepareDirs(sb *sandbox) error {
	for _, p := range []string{sb.workDir(), sb.tmpDir()} {
		if err := os.Mkdir(p, 0o700); err != nil {
			return err
		}
		if err := os.Lchown(p, guestUID, guestGID); err != nil {
			return err
		}
	}
	// The daemon's and root's inside the sandbox (procs.go).
	if err := os.Mkdir(sb.procsDir(), 0o700); err != nil {
		return err
	}
	return b.writeBundle(sb)
}

// Destroy stops the sandbox's running commands and its gVisor sandbox,
// waits (boundedly) for its operations and removes Dir/<id>. It is
// idempotent, and an id that is not a valid id succeeds without touching
// any path.
func (b *Backend) Destroy(ctx context.Context, id string) error {
	if !backend.ValidID(id) {
		return nil
	}
	sb, ok := b.reg.Destroying(id)
	log := b.log.With("sandbox", id)

	sb.ops.CancelAll()
	b.stopInit(sb)
	var err error
	if out, derr := b.cli(context.WithoutCancel(ctx), cliTimeout, "delete", "--force", sb.containerID()); derr != nil && !notExist(out) {
		err = fmt.Errorf("runsc delete: %w", derr)
	} else {
		b.removeStaleControlSockets(sb.containerID()) // the host's directories too
	}
	// The cgroup by name: a sandbox never used by this process has none in
	// memory, yet may have one on the host.
	err = errors.Join(err, b.removeCgroup(sb))
	if !sb.ops.Wait(ctx, registry.DestroyWait) {
		log.Warn("operations in flight did not all end in time; removing the files anyway", "waited_up_to", registry.DestroyWait)
	}
	if err == nil {
		err = statedir.RemoveAll(sb.dir)
	}
	b.reg.Done(id, sb)
	if err != nil {
		return fmt.Errorf("destroy sandbox %s: its commands are stopped but it could not all be removed (%w); call destroy again to retry", id, err)
	}
	if ok {
		log.Info("sandbox destroyed")
	}
	return nil
}

// notExist reports whether runsc's output says the container is unknown.
func notExist(out []byte) bool {
	return bytes.Contains(out, []byte("does not exist")) || bytes.Contains(out, []byte("no such file or directory"))
}

// List returns the ids of the sandboxes in Dir, complete or not, and of
// every runsc sandbox in the backend's runsc root: the state directory and
// runsc's own listing are both sources.
func (b *Backend) List(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ids, err := statedir.SandboxIDs(b.cfg.Dir)
	if err != nil {
		return nil, err
	}
	listed, err := b.runscList(ctx)
	if err != nil {
		return nil, err
	}
	for _, id := range listed {
		if backend.ValidID(id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

// runscList returns the ids runsc lists in the backend's root.
func (b *Backend) runscList(ctx context.Context) ([]string, error) {
	out, err := b.cli(ctx, cliTimeout, "list", "--quiet")
	if err != nil {
		return nil, fmt.Errorf("%w: runsc list: %v", backend.ErrUnavailable, err)
	}
	var ids []string
	for _, line := range strings.Split(string(out), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			ids = append(ids, line)
		}
	}
	return ids, nil
}

// sweepRunsc force-deletes every runsc sandbox in the root but those in
// keep, and returns how many it removed.
func (b *Backend) sweepRunsc(ctx context.Context, keep map[string]bool) int {
	ids, err := b.runscList(ctx)
	if err != nil {
		b.log.Warn("cannot list runsc sandboxes to remove leftovers", "error", err)
		return 0
	}
	n := 0
	for _, id := range ids {
		if keep[id] {
			continue
		}
		if out, err := b.cli(ctx, cliTimeout, "delete", "--force", id); err != nil && !notExist(out) {
			b.log.Warn("cannot remove a leftover runsc sandbox", "container", id, "error", err)
			continue
		}
		n++
	}
	return n
}

// Close lets go of every sandbox's gVisor sandbox without stopping it
// (detachInit): a daemon stopped for a restart or an upgrade leaves the
// sandboxes' inits and durable processes running, and the next daemon on
// the same directory re-attaches to them (reattach.go). What cannot be
// re-attached is stopped.
func (b *Backend) Close() error {
	live := map[string]bool{}
	for _, sb := range b.reg.All() {
		sb.ops.CancelAll()
		if b.detachInit(sb) {
			live[sb.containerID()] = true
		}
	}
	b.sweepRunsc(context.Background(), live)
	b.sweepCgroups(live)
	if len(live) == 0 {
		unmountNullNetNS(b.runscRoot())
	}
	return nil
}

// unmountNullNetNS removes the bind mounts of the empty network namespace
// that runsc (since 2025) pins at null-netns in its root and shares among
// its sandboxes' gofers. runsc leaves it mounted; the root cannot be
// removed (EBUSY) until it is gone. Concurrent runsc invocations may stack
// several mounts there, so it unmounts until none is left. Older runsc
// versions make none: the first unmount fails and nothing happens.
func unmountNullNetNS(root string) {
	p := filepath.Join(root, "null-netns")
	for i := 0; i < 64 && unix.Unmount(p, unix.MNT_DETACH) == nil; i++ {
	}
}
