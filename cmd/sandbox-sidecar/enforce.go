package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/cgroup"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/disk"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress"
)

// How the daemon finds the mechanisms behind [limits]: a cgroup manager for
// memory, pids and CPU, and loop-mounted filesystems for disk caps.
//
// Where sandbox cgroups go:
//
//  1. The daemon is a systemd service with Delegate=yes (it was started by
//     systemd itself, and its own cgroup is delegated to it): the daemon
//     moves into <service>/supervisor (a cgroup v2 parent may not hold
//     processes and enable controllers for its children at once) and
//     sandboxes go under <service>/sandboxes. They stay within the unit's
//     MemoryMax=/TasksMax=, and die with the unit.
//  2. Otherwise, as root: a directory of its own at the top of the
//     hierarchy, "sandbox-sidecar" for the default state directory and
//     "sandbox-sidecar-<hash of the state directory>" for any other, so that
//     daemons with different state directories never see (and never sweep)
//     each other's sandboxes.
//  3. Otherwise nothing: a process that is neither root nor delegated a
//     subtree may not make cgroups.
//
// cgroup.New picks cgroup v2 when its hierarchy has the memory, pids and
// cpu controllers, and the v1 hierarchies on hosts that still mount those
// controllers there.

const (
	// systemStateDir is the root daemon's (and the packaged service's)
	// state directory; its daemon's cgroups are named plainly.
	systemStateDir = "/var/lib/sandbox-sidecar"
	// cgroupBaseName is the top-level cgroup of the default daemon.
	cgroupBaseName = "sandbox-sidecar"
	// delegatedBase and supervisorLeaf are the two children of a delegated
	// service cgroup: the sandboxes and the daemon itself.
	delegatedBase  = "sandboxes"
	supervisorLeaf = "supervisor"
)

// host is what the placement decision looks at, injectable for tests.
type host struct {
	euid int
	pid  int
	// getenv reads the environment (INVOCATION_ID, SYSTEMD_EXEC_PID).
	getenv func(string) string
	// mountInfo and selfCgroup replace /proc/self/mountinfo and
	// /proc/self/cgroup when set.
	mountInfo, selfCgroup string
	// diskCheck is disk.Check.
	diskCheck func() error
}

func realHost() host {
	return host{euid: os.Geteuid(), pid: os.Getpid(), getenv: os.Getenv, diskCheck: disk.Check}
}

func (h host) options(base string, underRoot bool) cgroup.Options {
	return cgroup.Options{Base: base, UnderRoot: underRoot, MountInfo: h.mountInfo, SelfCgroup: h.selfCgroup}
}

// cgroupBase names the top-level cgroup of a root daemon with stateDir.
func cgroupBase(stateDir string) string {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		abs = filepath.Clean(stateDir)
	}
	if abs == systemStateDir {
		return cgroupBaseName
	}
	sum := sha256.Sum256([]byte(abs))
	return cgroupBaseName + "-" + hex.EncodeToString(sum[:4])
}

// placement is one place the sandbox cgroups may go.
type placement struct {
	what    string // for the log
	prepare bool   // move the daemon into supervisorLeaf first
	opts    cgroup.Options
}

// placements lists where sandbox cgroups may go, best first; when there is
// nowhere, the reasons say why.
func placements(h host, stateDir string) ([]placement, []string) {
	var out []placement
	var why []string
	if dir, err := delegatedCgroup(h); err == nil {
		out = append(out, placement{what: "delegated by systemd (" + dir + ")", prepare: true, opts: h.options(delegatedBase, false)})
	} else {
		why = append(why, err.Error())
	}
	if h.euid == 0 {
		out = append(out, placement{what: "as root, at the top of the hierarchy", opts: h.options(cgroupBase(stateDir), true)})
	} else {
		why = append(why, fmt.Sprintf("the daemon does not run as root (uid %d)", h.euid))
	}
	return out, why
}

// errNotDelegated says why the daemon's own cgroup is not a delegated one.
var errNotDelegated = errors.New("not a systemd service with Delegate=yes")

// delegatedCgroup returns the directory of the daemon's own cgroup v2 when
// systemd started the daemon as a service and delegated that cgroup to it
// (Delegate=yes): systemd marks it with the trusted.delegate (or
// user.delegate) attribute, and for a service with User= gives the
// directory to that user.
func delegatedCgroup(h host) (string, error) {
	if h.getenv("INVOCATION_ID") == "" {
		return "", fmt.Errorf("%w: not started by systemd", errNotDelegated)
	}
	if h.getenv("SYSTEMD_EXEC_PID") != strconv.Itoa(h.pid) {
		return "", fmt.Errorf("%w: started under a systemd service, but not as its main process", errNotDelegated)
	}
	own, dir, err := cgroup.OwnV2Dir(h.options("", false))
	switch {
	case own == "" || own == "/":
		return "", fmt.Errorf("%w: the daemon has no cgroup v2 of its own", errNotDelegated)
	case err != nil:
		return "", fmt.Errorf("%w: %v", errNotDelegated, err)
	}
	if !delegated(dir, h.euid) {
		return "", fmt.Errorf("%w: its cgroup %s is not delegated to it", errNotDelegated, dir)
	}
	if procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err != nil {
		return "", fmt.Errorf("%w: %v", errNotDelegated, err)
	} else if others := strings.Fields(string(procs)); len(others) > 1 || (len(others) == 1 && others[0] != strconv.Itoa(h.pid)) {
		// Preparing the subtree moves every process of the cgroup: only
		// ever the daemon's own.
		return "", fmt.Errorf("%w: its cgroup %s holds other processes too", errNotDelegated, dir)
	}
	return dir, nil
}

// delegated reports whether systemd delegated dir: the attribute it sets
// (readable by root), or, for a service with User=, the directory and its
// cgroup.procs being writable by the daemon.
func delegated(dir string, euid int) bool {
	for _, attr := range []string{"trusted.delegate", "user.delegate"} {
		buf := make([]byte, 8)
		if n, err := unix.Getxattr(dir, attr, buf); err == nil && string(buf[:n]) == "1" {
			return true
		}
	}
	return euid != 0 && unix.Access(dir, unix.W_OK) == nil && unix.Access(filepath.Join(dir, "cgroup.procs"), unix.W_OK) == nil
}

// enforcement is what the daemon can use to enforce [limits] on this host,
// for the bwrap backend.
type enforcement struct {
	cgroups  *cgroup.Manager
	diskCaps bool
	// egress is the daemon's egress path once newBackend made it (nil:
	// off), for the metrics.
	egress *egress.Egress
}

// release gives back the sandbox cgroups no process is left in (the next
// start makes new ones for the sandboxes it re-adopts) and the base
// directories when nothing is left in them; it never kills anything.
func (e *enforcement) release(log hclog.Logger) {
	if e == nil || e.cgroups == nil {
		return
	}
	if err := e.cgroups.Release(); err != nil {
		log.Warn("cannot remove the sandbox cgroup directories", "error", err)
	}
}

// defaultHostMemoryPercent is the share of the host's memory every sandbox
// together may use when limits.host_memory is 0: the rest is the daemon's,
// the Airflow worker's and the host's own.
const defaultHostMemoryPercent = 75

// hostMemoryLimit is the memory every sandbox together may use: the
// configured limits.host_memory, or defaultHostMemoryPercent of the host's,
// never below one sandbox's own limit.
func hostMemoryLimit(lim LimitsSection, hostBytes func() (int64, error)) (int64, error) {
	if lim.HostMemory > 0 {
		return int64(lim.HostMemory), nil
	}
	total, err := hostBytes()
	if err != nil {
		return 0, fmt.Errorf("cannot read the host's memory for limits.host_memory's default (%w); set limits.host_memory", err)
	}
	return max(total*defaultHostMemoryPercent/100&^(1<<20-1), int64(lim.Memory)), nil // whole MiB
}

// newCgroups makes the cgroup manager for serve, by limits.cgroups:
// auto warns and returns nil when the host cannot give sandboxes cgroups,
// required returns the error, off does not try.
func newCgroups(h host, lim LimitsSection, stateDir string, log hclog.Logger) (*cgroup.Manager, error) {
	if lim.Cgroups == enforceOff {
		log.Info("per-sandbox memory, pids and CPU limits are off (limits.cgroups = off)")
		return nil, nil
	}
	hostMem, err := hostMemoryLimit(lim, cgroup.HostMemoryBytes)
	if err != nil {
		return nil, err
	}
	cands, why := placements(h, stateDir)
	for _, p := range cands {
		p.opts.BaseMemoryBytes = hostMem
		m, err := tryPlacement(h, p)
		if err == nil {
			log.Info("sandbox cgroups", "version", m.Version().String(), "placement", p.what, "dirs", strings.Join(m.Dirs(), " "),
				"all_sandboxes_memory_bytes", hostMem)
			return m, nil
		}
		why = append(why, p.what+": "+err.Error())
	}
	msg := fmt.Sprintf("per-sandbox memory, pids and CPU limits (limits.memory, limits.pids, limits.cpus, limits.cpu_weight) are NOT enforced: this daemon cannot make cgroups (%s). "+
		"Run it as root, or as a systemd service with Delegate=yes (the packaged sandbox-sidecar.service has it) on a host whose cgroup v2 has the memory, pids and cpu controllers; "+
		"or set limits.cgroups = \"off\"", strings.Join(why, "; "))
	if lim.Cgroups == enforceRequired {
		return nil, errors.New(msg + " (limits.cgroups = required)")
	}
	log.Warn(msg)
	return nil, nil
}

// tryPlacement makes a manager at p.
func tryPlacement(h host, p placement) (*cgroup.Manager, error) {
	opts := p.opts
	if p.prepare {
		opts.SupervisorLeaf = supervisorLeaf
	}
	m, err := cgroup.New(opts)
	if err != nil {
		return nil, err
	}
	if d, top := m.BaseAtHierarchyTop(); top && !p.opts.UnderRoot {
		// A delegated service whose cgroup has no place in a v1 hierarchy
		// would put its sandboxes at that hierarchy's top, under a name
		// every such daemon shares: not its own.
		_ = m.Release()
		return nil, fmt.Errorf("%w: the service has no cgroup of its own in the hierarchy mounted at %s", cgroup.ErrUnavailable, filepath.Dir(d))
	}
	return m, nil
}

// useDiskCaps decides, by limits.disk_caps, whether sandboxes get a
// filesystem of their own: auto when the daemon is root, the host can
// loop-mount (disk.Check) and there is a cap to enforce.
func useDiskCaps(h host, lim LimitsSection, log hclog.Logger) (bool, error) {
	switch {
	case lim.DiskCaps == enforceOff:
		log.Info("per-sandbox disk caps are off (limits.disk_caps = off)")
		return false, nil
	case lim.Disk == 0:
		log.Info("per-sandbox disk caps are off (limits.disk = 0)")
		return false, nil
	}
	err := h.diskCheck()
	if err == nil && h.euid != 0 {
		err = fmt.Errorf("%w: loop-mounting needs root", disk.ErrUnavailable)
	}
	if err == nil {
		return true, nil
	}
	msg := fmt.Sprintf("per-sandbox disk caps (limits.disk, limits.disk_inodes) are NOT enforced: %v. "+
		"They need the daemon to run as root, with e2fsprogs (mkfs.ext4) and the loop driver; or set limits.disk_caps = \"off\"", err)
	if lim.DiskCaps == enforceRequired {
		return false, errors.New(msg + " (limits.disk_caps = required)")
	}
	log.Warn(msg)
	return false, nil
}

// setupEnforcement finds what serve can enforce. Only the bwrap backend
// uses it (sbx sandboxes are microVMs with their own memory and CPUs).
func setupEnforcement(h host, cfg Config, log hclog.Logger) (*enforcement, error) {
	e := &enforcement{}
	if cfg.Server.Backend != "bwrap" && cfg.Server.Backend != "gvisor" {
		return e, nil
	}
	var err error
	if e.cgroups, err = newCgroups(h, cfg.Limits, cfg.Server.StateDir, log); err != nil {
		return nil, err
	}
	if cfg.Server.Backend == "gvisor" {
		// No disk caps: the gvisor backend reports them off.
		return e, nil
	}
	if e.diskCaps, err = useDiskCaps(h, cfg.Limits, log); err != nil {
		e.release(log)
		return nil, err
	}
	// The backend logs the limits in force.
	return e, nil
}

// gcEnforcement is what the offline sweep needs: the root daemon's cgroups,
// whose leftovers the backend removes (a delegated service's die with the
// service), and disk caps as serve would have them. It never moves the
// process, warns or fails.
func gcEnforcement(h host, cfg Config, dryRun bool, log hclog.Logger) *enforcement {
	e := &enforcement{}
	if cfg.Server.Backend != "bwrap" && cfg.Server.Backend != "gvisor" {
		return e
	}
	// The backend removes every cgroup under the base when it starts: not
	// in a dry run.
	if cfg.Limits.Cgroups != enforceOff && h.euid == 0 && !dryRun {
		m, err := cgroup.New(h.options(cgroupBase(cfg.Server.StateDir), true))
		if err != nil {
			log.Debug("no sandbox cgroups to sweep", "error", err)
		}
		e.cgroups = m
	}
	e.diskCaps = cfg.Server.Backend == "bwrap" && cfg.Limits.DiskCaps != enforceOff && h.euid == 0 && h.diskCheck() == nil
	return e
}
