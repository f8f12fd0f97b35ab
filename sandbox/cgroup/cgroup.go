// Package cgroup gives each sandbox a control group of its own: a memory
// limit whose breach kills the guest (and is counted, so a result can say
// "oom_killed"), a cap on processes (a fork bomb stays inside), a CPU quota
// and weight, a way to stop every process of the group and let it go on
// (the freezer: freeze.go), and a way to kill everything in the group and
// remove it.
//
// It speaks both hierarchies. cgroup v2 is used when the memory, pids and cpu
// controllers are available there: sandboxes live in a subtree the daemon
// owns (its own cgroup when systemd gave it one with Delegate=yes, or a
// directory under the v2 root when it runs as root without one). Otherwise,
// on hosts that still mount those controllers through cgroup v1 (hybrid
// layouts), one directory per sandbox is made in each of the memory, pids and
// cpu hierarchies. A limit that neither can enforce is refused, never
// silently dropped.
//
// It owns only the directories it creates under its base (named by the
// caller, e.g. "sandbox-sidecar"), never moves a process it was not handed
// (except the daemon itself, once, into Options.SupervisorLeaf of a
// delegated v2 subtree),
// and knows nothing of bubblewrap or the daemon.
package cgroup

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Version is the cgroup hierarchy in use.
type Version int

const (
	V1 Version = 1
	V2 Version = 2
)

func (v Version) String() string { return fmt.Sprintf("cgroup v%d", int(v)) }

// Controllers every sandbox cgroup needs.
var requiredControllers = []string{"memory", "pids", "cpu"}

// Named bounds on waits.
const (
	// killWait bounds how long Kill waits for the group to empty.
	killWait = 5 * time.Second
	// pollEvery is how often Kill and Destroy look again.
	pollEvery = 10 * time.Millisecond
	// maxControlFile caps what is read of one control file.
	maxControlFile = 64 << 10
	// DefaultCPUPeriod is the CFS period used with a CPU quota.
	DefaultCPUPeriod = 100 * time.Millisecond
)

// Sentinel errors; check with errors.Is.
var (
	// ErrUnavailable: this host cannot give sandboxes cgroups with the
	// requested limits (no hierarchy with the controllers, not writable).
	ErrUnavailable = errors.New("cgroups unavailable")
	// ErrNotFound: no such sandbox cgroup.
	ErrNotFound = errors.New("cgroup not found")
)

// Limits are what one sandbox may use. Zero fields mean "no limit".
type Limits struct {
	// MemoryBytes caps the group's memory (anonymous, page cache, tmpfs it
	// wrote, kernel memory). Past it the kernel's OOM killer kills a process
	// of the group. Swap is capped at zero where the kernel accounts it, so
	// the limit cannot be dodged by swapping.
	MemoryBytes int64
	// PIDs caps the number of processes and threads in the group.
	PIDs int64
	// CPUs is a quota in cores (1.5 = one and a half CPUs' time per period).
	CPUs float64
	// CPUWeight is the relative share under contention, 1..10000 (100 is
	// the default; v1 gets cpu.shares = weight*1024/100).
	CPUWeight int
}

func (l Limits) validate() error {
	switch {
	case l.MemoryBytes < 0, l.PIDs < 0, l.CPUs < 0, math.IsNaN(l.CPUs), math.IsInf(l.CPUs, 0):
		return fmt.Errorf("cgroup limits must not be negative or non-finite: %+v", l)
	case l.MemoryBytes > 0 && l.MemoryBytes < 4<<20:
		return fmt.Errorf("a memory limit of %d bytes is too small to start a process; give at least 4 MiB", l.MemoryBytes)
	case l.CPUWeight != 0 && (l.CPUWeight < 1 || l.CPUWeight > 10000):
		return fmt.Errorf("cpu weight %d is outside 1..10000", l.CPUWeight)
	case l.CPUs > 0 && l.CPUs*float64(DefaultCPUPeriod.Microseconds()) < 1000:
		return fmt.Errorf("a CPU quota of %v cores is below the kernel's 1ms minimum per period", l.CPUs)
	}
	return nil
}

// Options say where sandbox cgroups go.
type Options struct {
	// Base names the directory holding every sandbox cgroup (e.g.
	// "sandbox-sidecar"), created under the parent chosen by Root.
	Base string
	// UnderRoot puts Base directly under the hierarchy's root (needs root)
	// instead of under the daemon's own cgroup. Under the daemon's own
	// cgroup is the delegated layout (systemd Delegate=yes); it also keeps
	// sandboxes within whatever limits the daemon itself runs under.
	UnderRoot bool
	// Force selects a version instead of detecting it (tests).
	Force Version
	// SupervisorLeaf, for the delegated layout on cgroup v2 (not
	// UnderRoot; systemd's Delegate=yes), names a leaf of the daemon's own
	// cgroup that New first moves the daemon's processes into: a v2 cgroup
	// that holds processes cannot also enable controllers for its children.
	// Give it only in the daemon, whose cgroup is its own.
	SupervisorLeaf string

	// BaseMemoryBytes caps the memory of every sandbox group together: the
	// base's own limit (v2 memory.max, v1 memory.limit_in_bytes of the
	// memory controller's base, swap capped alike where the kernel accounts
	// it). Per-sandbox limits alone promise the sum of them, which can be
	// more than the host has (64 sandboxes of 1 GiB on a 24 GiB host); past
	// this one the kernel reclaims and then OOM-kills inside the sandboxes,
	// never outside them. New applies it; 0 leaves the base's limit as it
	// is (a fresh base has none; an offline sweep must not lift a running
	// daemon's). See BaseMemory.
	BaseMemoryBytes int64

	// Paths, injectable for tests: where /proc/self/mountinfo and
	// /proc/self/cgroup are read from.
	MountInfo, SelfCgroup string

	// Controllers replaces the controllers every group needs (memory,
	// pids, cpu) when not nil. Only for tests on hosts whose v2 hierarchy
	// has none of them: a manager with fewer cannot enforce the limits of
	// the ones it lacks (Create refuses them).
	Controllers []string
}

func (o Options) required() []string {
	if o.Controllers != nil {
		return o.Controllers
	}
	return requiredControllers
}

// Manager makes sandbox cgroups in one place. Safe for concurrent use on
// different names.
type Manager struct {
	version     Version
	controllers []string
	baseMemory  int64 // Options.BaseMemoryBytes
	// v2: the directory under which sandbox cgroups are made.
	v2Base string
	// v1: that directory in each controller's hierarchy.
	v1Base map[string]string
	// mountPoints are where the host's cgroup hierarchies are mounted.
	mountPoints map[string]bool

	// anchorMu guards anchored: the v1 freezer's anchor group is made
	// and frozen (freeze.go).
	anchorMu sync.Mutex
	anchored bool
}

// Version reports which hierarchy the manager uses.
func (m *Manager) Version() Version { return m.version }

// Dirs returns the base directories (one for v2; one per controller for v1).
func (m *Manager) Dirs() []string {
	if m.version == V2 {
		return []string{m.v2Base}
	}
	return sortedValues(m.v1Base)
}

// mount is one cgroup mount of the host, from mountinfo.
type mount struct {
	point       string
	root        string // the part of the hierarchy mounted there
	v2          bool
	controllers []string // v1: from the super options
}

// layout is what Detect learnt about the host, kept apart from the I/O so
// that the decision is a pure function.
type layout struct {
	mounts []mount
	own    map[string]string // controller (or "" for v2) -> own cgroup path
	v2Ctrl []string          // controllers available in the v2 hierarchy at the base's parent
}

// New finds a usable hierarchy and creates the base directory in it. It
// moves no process, except the daemon's own into opts.SupervisorLeaf when
// that is given for a delegated v2 subtree.
func New(opts Options) (*Manager, error) {
	if !validName().MatchString(opts.Base) {
		return nil, fmt.Errorf("cgroup base %q must be a plain name (letters, digits, '.', '_', '-')", opts.Base)
	}
	if opts.SupervisorLeaf != "" && (!validName().MatchString(opts.SupervisorLeaf) || opts.SupervisorLeaf == opts.Base) {
		return nil, fmt.Errorf("cgroup leaf %q must be a plain name other than the base's", opts.SupervisorLeaf)
	}
	if opts.BaseMemoryBytes < 0 || (opts.BaseMemoryBytes > 0 && opts.BaseMemoryBytes < 4<<20) {
		return nil, fmt.Errorf("a memory limit for every sandbox together of %d bytes is too small; give at least 4 MiB, or 0 for none", opts.BaseMemoryBytes)
	}
	lay, err := readLayout(opts)
	if err != nil {
		return nil, err
	}
	m, err := plan(lay, opts)
	if err != nil {
		return nil, err
	}
	m.mountPoints = map[string]bool{}
	for _, mt := range lay.mounts {
		m.mountPoints[mt.point] = true
	}
	if m.version == V2 && opts.SupervisorLeaf != "" && !opts.UnderRoot && lay.own[""] != "/" {
		if err := m.moveSupervisor(opts.SupervisorLeaf); err != nil {
			return nil, err
		}
	}
	if opts.BaseMemoryBytes > 0 && !slices.Contains(m.controllers, "memory") {
		return nil, fmt.Errorf("%w: a memory limit for every sandbox together needs the memory controller", ErrUnavailable)
	}
	m.baseMemory = opts.BaseMemoryBytes
	if m.version == V2 {
		if err := m.prepareV2Base(); err != nil {
			return nil, err
		}
	} else {
		for c, dir := range m.v1Base {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				if c == freezer {
					// Optional: without it sandboxes cannot be paused,
					// and nothing else is lost (CanFreeze says so).
					delete(m.v1Base, c)
					continue
				}
				return nil, fmt.Errorf("%w: cannot create %s for the %s controller: %v; run the daemon as root or give it a delegated cgroup", ErrUnavailable, dir, c, err)
			}
		}
	}
	if err := m.applyBaseMemory(); err != nil {
		return nil, err
	}
	return m, nil
}

// memoryBase is the base directory whose memory files bound every sandbox
// together, or "" when the manager has no memory controller.
func (m *Manager) memoryBase() string {
	if !slices.Contains(m.controllers, "memory") {
		return ""
	}
	if m.version == V2 {
		return m.v2Base
	}
	return m.v1Base["memory"]
}

// applyBaseMemory writes the base's memory limit, if there is one.
func (m *Manager) applyBaseMemory() error {
	dir := m.memoryBase()
	if dir == "" || m.baseMemory == 0 {
		return nil
	}
	limit := strconv.FormatInt(m.baseMemory, 10)
	if m.version == V2 {
		if err := writeFile(filepath.Join(dir, "memory.max"), limit); err != nil {
			return fmt.Errorf("%w: cannot set %s/memory.max to %s (the memory of every sandbox together): %v", ErrUnavailable, dir, limit, err)
		}
		if err := writeFile(filepath.Join(dir, "memory.swap.max"), "0"); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: cannot set %s/memory.swap.max to 0: %v", ErrUnavailable, dir, err)
		}
		return nil
	}
	// v1 accounts children in their parent only with use_hierarchy, which
	// kernels since 5.10 always have; older ones take it while the base has
	// no children yet.
	_ = writeFile(filepath.Join(dir, "memory.use_hierarchy"), "1")
	// memory+swap must never be below memory: lowering writes memory
	// first, raising memsw first; try one order, then the other.
	mem, memsw := filepath.Join(dir, "memory.limit_in_bytes"), filepath.Join(dir, "memory.memsw.limit_in_bytes")
	err := writeFile(mem, limit)
	if err == nil {
		if err := writeFile(memsw, limit); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: cannot set %s to %s: %v", ErrUnavailable, memsw, limit, err)
		}
		return nil
	}
	if werr := writeFile(memsw, limit); werr == nil {
		err = writeFile(mem, limit)
	}
	if err != nil {
		return fmt.Errorf("%w: cannot set %s to %s (the memory of every sandbox together; lower than what they use now?): %v", ErrUnavailable, mem, limit, err)
	}
	return nil
}

// BaseMemory is what every sandbox group together may use and uses.
type BaseMemory struct {
	// LimitBytes is the base's limit (Options.BaseMemoryBytes); 0: none.
	LimitBytes int64
	// UsedBytes is the memory charged to every sandbox together now, page
	// cache and tmpfs included.
	UsedBytes int64
	// OOMKills counts processes of the live sandbox groups the kernel
	// killed for a lack of memory, their own limits' kills included (v2
	// memory.events of the base; v1 the groups' memory.oom_control summed).
	OOMKills uint64
}

// BaseMemory reads the base's memory limit and use. Without a memory
// controller it returns an error wrapping ErrUnavailable.
func (m *Manager) BaseMemory() (BaseMemory, error) {
	dir := m.memoryBase()
	if dir == "" {
		return BaseMemory{}, fmt.Errorf("%w: no memory controller", ErrUnavailable)
	}
	var b BaseMemory
	var err error
	limitFile, usedFile, events, oomKey := "memory.max", "memory.current", "memory.events", "oom_kill"
	if m.version == V1 {
		limitFile, usedFile, events = "memory.limit_in_bytes", "memory.usage_in_bytes", "memory.oom_control"
	}
	if b.LimitBytes, err = readInt(filepath.Join(dir, limitFile)); err != nil {
		return b, err
	}
	if b.LimitBytes >= v1Unlimited {
		b.LimitBytes = 0 // "max", or v1's page-rounded "no limit"
	}
	if b.UsedBytes, err = readInt(filepath.Join(dir, usedFile)); err != nil {
		return b, err
	}
	b.OOMKills = readKeyed(filepath.Join(dir, events))[oomKey]
	if m.version == V1 {
		// v1 counts a kill in the victim's own group only: add the
		// sandbox groups' counts.
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.IsDir() && validName().MatchString(e.Name()) {
				b.OOMKills += readKeyed(filepath.Join(dir, e.Name(), events))[oomKey]
			}
		}
	}
	return b, nil
}

// v1Unlimited: v1 reports "no limit" as the largest page-aligned int64
// (9223372036854771712), v2 as "max" (read as math.MaxInt64).
const v1Unlimited = math.MaxInt64 &^ (1<<12 - 1)

// HostMemoryBytes is the host's memory (MemTotal of /proc/meminfo), for a
// default share of it.
func HostMemoryBytes() (int64, error) { return memTotal("/proc/meminfo") }

func memTotal(p string) (int64, error) {
	b, err := readBounded(p)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: MemTotal %q: %w", p, rest, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("%s has no MemTotal line", p)
}

// plan chooses the version and the base directories.
func plan(lay layout, opts Options) (*Manager, error) {
	var v2 *mount
	v1 := map[string]*mount{}
	for i := range lay.mounts {
		mt := &lay.mounts[i]
		if mt.v2 {
			if v2 == nil {
				v2 = mt
			}
			continue
		}
		for _, c := range mt.controllers {
			if _, seen := v1[c]; !seen {
				v1[c] = mt
			}
		}
	}
	required := opts.required()
	v2Usable := v2 != nil && containsAll(lay.v2Ctrl, required)
	v1Usable := len(required) > 0
	for _, c := range required {
		if v1[c] == nil {
			v1Usable = false
		}
	}
	version := opts.Force
	switch {
	case version == V2 && v2 == nil, version == V1 && !v1Usable:
		return nil, fmt.Errorf("%w: %v was asked for but is not mounted with the %s controllers", ErrUnavailable, version, strings.Join(required, ", "))
	case version != 0:
	case v2Usable:
		version = V2
	case v1Usable:
		version = V1
	default:
		return nil, fmt.Errorf("%w: neither cgroup v2 (controllers %v) nor cgroup v1 mounts the %s controllers; mount them, or enable them in the parent's cgroup.subtree_control",
			ErrUnavailable, lay.v2Ctrl, strings.Join(required, ", "))
	}
	m := &Manager{version: version, controllers: required}
	if version == V2 {
		parent := "/"
		if !opts.UnderRoot {
			parent = lay.own[""]
		}
		dir, err := onDisk(*v2, parent)
		if err != nil {
			return nil, err
		}
		m.v2Base = filepath.Join(dir, opts.Base)
		return m, nil
	}
	m.v1Base = map[string]string{}
	for _, c := range required {
		parent := "/"
		if !opts.UnderRoot {
			parent = lay.own[c]
			if parent == "" {
				parent = "/"
			}
		}
		dir, err := onDisk(*v1[c], parent)
		if err != nil {
			return nil, err
		}
		m.v1Base[c] = filepath.Join(dir, opts.Base)
	}
	// The freezer, where v1 mounts it, comes along without being required:
	// a group with it can be paused (Freeze) and held still (Hold);
	// without it, CanFreeze says so.
	if mt := v1[freezer]; mt != nil && m.v1Base[freezer] == "" {
		parent := "/"
		if p := lay.own[freezer]; !opts.UnderRoot && p != "" {
			parent = p
		}
		if dir, err := onDisk(*mt, parent); err == nil {
			m.v1Base[freezer] = filepath.Join(dir, opts.Base)
		}
	}
	return m, nil
}

// onDisk maps a cgroup path (as /proc/self/cgroup writes it) to a directory
// under the mount, which may show only part of the hierarchy.
func onDisk(mt mount, cgPath string) (string, error) {
	rel, err := filepath.Rel(mt.root, cgPath)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("%w: cgroup %s is outside what is mounted at %s (%s); run the daemon where its cgroup is visible", ErrUnavailable, cgPath, mt.point, mt.root)
	}
	return filepath.Join(mt.point, rel), nil
}

func readLayout(opts Options) (layout, error) {
	mi, sc := opts.MountInfo, opts.SelfCgroup
	if mi == "" {
		mi = "/proc/self/mountinfo"
	}
	if sc == "" {
		sc = "/proc/self/cgroup"
	}
	var lay layout
	mounts, err := parseMountInfo(mi)
	if err != nil {
		return lay, err
	}
	lay.mounts = mounts
	own, err := parseSelfCgroup(sc)
	if err != nil {
		return lay, err
	}
	lay.own = own
	for _, mt := range mounts {
		if !mt.v2 {
			continue
		}
		parent := "/"
		if !opts.UnderRoot && own[""] != "" {
			parent = own[""]
		}
		if dir, err := onDisk(mt, parent); err == nil {
			lay.v2Ctrl = readControllers(filepath.Join(dir, "cgroup.controllers"))
		}
		break
	}
	return lay, nil
}

func parseMountInfo(p string) ([]mount, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	defer f.Close()
	infos, err := mountinfo.GetMountsFromReader(f, mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %v", ErrUnavailable, p, err)
	}
	out := make([]mount, 0, len(infos))
	for _, info := range infos {
		out = append(out, mountOf(info))
	}
	return out, nil
}

// mountOf is one cgroup mount: a v1 hierarchy's controllers are the names
// among its superblock options ("rw,memory").
func mountOf(info *mountinfo.Info) mount {
	mt := mount{root: info.Root, point: info.Mountpoint, v2: info.FSType == "cgroup2"}
	if mt.v2 {
		return mt
	}
	for _, o := range strings.Split(info.VFSOptions, ",") {
		switch o {
		case "", "rw", "ro", "relatime", "noatime", "nosuid", "nodev", "noexec", "clone_children", "xattr", "nsdelegate":
		default:
			if !strings.Contains(o, "=") {
				mt.controllers = append(mt.controllers, o)
			}
		}
	}
	return mt
}

// parseSelfCgroup reads /proc/self/cgroup: "4:memory:/a/b", "0::/c".
// The v2 entry is keyed "".
func parseSelfCgroup(p string) (map[string]string, error) {
	b, err := readBounded(p)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out, nil
}

func readControllers(p string) []string {
	b, err := readBounded(p)
	if err != nil {
		return nil
	}
	return strings.Fields(string(b))
}

// moveSupervisor moves every process of the daemon's own cgroup (the
// base's parent) into its leaf, so the parent may enable controllers.
func (m *Manager) moveSupervisor(leafName string) error {
	own := filepath.Dir(m.v2Base)
	procs, err := readPIDs(filepath.Join(own, "cgroup.procs"))
	if err != nil || len(procs) == 0 {
		return err
	}
	leaf := filepath.Join(own, leafName)
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%w: cannot create %s: %v; is the service started with Delegate=yes?", ErrUnavailable, leaf, err)
	}
	for _, pid := range procs {
		if err := writeFile(filepath.Join(leaf, "cgroup.procs"), strconv.Itoa(pid)); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("%w: cannot move process %d into %s: %v", ErrUnavailable, pid, leaf, err)
		}
	}
	return nil
}

// prepareV2Base creates the base and enables the controllers for it and
// for its children.
func (m *Manager) prepareV2Base() error {
	parent := filepath.Dir(m.v2Base)
	enable := ""
	if len(m.controllers) > 0 {
		enable = "+" + strings.Join(m.controllers, " +")
	}
	if err := m.enable(parent, enable); err != nil {
		return fmt.Errorf("%w: cannot enable %s in %s: %v; the cgroup must be delegated to the daemon (systemd Delegate=yes) and hold no processes itself (see Options.SupervisorLeaf)",
			ErrUnavailable, enable, parent, err)
	}
	if err := os.Mkdir(m.v2Base, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%w: cannot create %s: %v", ErrUnavailable, m.v2Base, err)
	}
	if err := m.enable(m.v2Base, enable); err != nil {
		return fmt.Errorf("%w: cannot enable %s in %s: %v", ErrUnavailable, enable, m.v2Base, err)
	}
	return nil
}

func (m *Manager) enable(dir, controllers string) error {
	if controllers == "" {
		return nil
	}
	return writeFile(filepath.Join(dir, "cgroup.subtree_control"), controllers)
}

// validName is what a sandbox or base name may look like: it becomes a
// directory name. Compiled on first use, not at start: its bounded
// repetition makes it 0.2 ms of every process that links this package,
// a sandbox's init among them (docs/benchmarks-history.md, "A create and
// its first command").
var validName = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
})

// Cgroup is one sandbox's group.
type Cgroup struct {
	name    string
	version Version
	dir     string            // v2
	dirs    map[string]string // v1: controller -> directory
	m       *Manager          // the manager that made or opened it
}

// Name returns the sandbox name the group was made for.
func (c *Cgroup) Name() string { return c.name }

// Dirs returns the group's directories.
func (c *Cgroup) Dirs() []string {
	if c.version == V2 {
		return []string{c.dir}
	}
	return sortedValues(c.dirs)
}

func (m *Manager) cgroupFor(name string) (*Cgroup, error) {
	if !validName().MatchString(name) {
		return nil, fmt.Errorf("cgroup name %q must be a plain name (letters, digits, '.', '_', '-')", name)
	}
	c := &Cgroup{name: name, version: m.version, m: m}
	if m.version == V2 {
		c.dir = filepath.Join(m.v2Base, name)
		return c, nil
	}
	c.dirs = map[string]string{}
	for ctrl, base := range m.v1Base {
		c.dirs[ctrl] = filepath.Join(base, name)
	}
	return c, nil
}

// Create makes the group for name with limits l. A limit the host cannot
// enforce (a control file missing or refused) is an error wrapping
// ErrUnavailable, and nothing is left behind. An existing group of that
// name is an error wrapping fs.ErrExist.
func (m *Manager) Create(name string, l Limits) (_ *Cgroup, err error) {
	if err := l.validate(); err != nil {
		return nil, err
	}
	c, err := m.cgroupFor(name)
	if err != nil {
		return nil, err
	}
	var made []string // only what this call created is removed on failure
	defer func() {
		if err != nil {
			for _, d := range made {
				_ = unix.Rmdir(d)
			}
		}
	}()
	for _, d := range c.Dirs() {
		err := os.Mkdir(d, 0o755)
		if errors.Is(err, fs.ErrNotExist) {
			// The base is gone (removed behind the daemon's back): make
			// it again, as New did.
			if rerr := m.remakeBase(filepath.Dir(d)); rerr != nil {
				return nil, rerr
			}
			err = os.Mkdir(d, 0o755)
		}
		if err == nil {
			made = append(made, d)
		} else {
			if errors.Is(err, fs.ErrExist) {
				return nil, fmt.Errorf("cgroup %s already exists; remove it first: %w", d, err)
			}
			return nil, fmt.Errorf("%w: cannot create %s: %v", ErrUnavailable, d, err)
		}
	}
	for _, w := range c.limitWrites(l) {
		if err := writeFile(w.path, w.value); err != nil {
			if w.optional && errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("%w: cannot set %s to %s: %v; %s", ErrUnavailable, w.path, w.value, err, limitWriteHint(err))
		}
	}
	return c, nil
}

// limitWriteHint says what to do about a limit that could not be written.
// Out of descriptors is the daemon's own state, not the host's cgroups:
// each live sandbox holds a few of them (its init's sockets, its OOM
// counter).
func limitWriteHint(err error) string {
	if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
		return "the daemon is out of file descriptors: raise its limit (LimitNOFILE= in its systemd unit) or lower max_sandboxes"
	}
	return "this host cannot enforce that limit"
}

// remakeBase recreates a base directory that disappeared.
func (m *Manager) remakeBase(base string) error {
	if m.version == V2 {
		if err := m.prepareV2Base(); err != nil {
			return err
		}
		return m.applyBaseMemory() // the limit went with the directory
	}
	if err := os.Mkdir(base, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%w: cannot recreate %s: %v", ErrUnavailable, base, err)
	}
	if base == m.memoryBase() {
		return m.applyBaseMemory()
	}
	return nil
}

// Open returns the existing group for name (a restarted daemon finding its
// sandboxes again).
func (m *Manager) Open(name string) (*Cgroup, error) {
	c, err := m.cgroupFor(name)
	if err != nil {
		return nil, err
	}
	for _, d := range c.Dirs() {
		if _, err := os.Stat(d); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrNotFound, d, err)
		}
	}
	return c, nil
}

// List returns the names of every group under the base, in any of the
// hierarchies, for the orphan sweep.
func (m *Manager) List() ([]string, error) {
	seen := map[string]bool{}
	for _, base := range m.Dirs() {
		entries, err := os.ReadDir(base)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		for _, e := range entries {
			if e.IsDir() && validName().MatchString(e.Name()) {
				seen[e.Name()] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// Remove kills everything in the group name and removes it; a group that
// does not exist (in some or all hierarchies) is success.
func (m *Manager) Remove(ctx context.Context, name string) error {
	c, err := m.cgroupFor(name)
	if err != nil {
		return err
	}
	return c.Destroy(ctx)
}

type write struct {
	path, value string
	optional    bool // skip when the file does not exist (e.g. swap accounting off)
}

func (c *Cgroup) limitWrites(l Limits) []write {
	var w []write
	period := DefaultCPUPeriod.Microseconds()
	if c.version == V2 {
		if l.MemoryBytes > 0 {
			w = append(w, write{path: filepath.Join(c.dir, "memory.max"), value: strconv.FormatInt(l.MemoryBytes, 10)},
				write{path: filepath.Join(c.dir, "memory.swap.max"), value: "0", optional: true})
		}
		if l.PIDs > 0 {
			w = append(w, write{path: filepath.Join(c.dir, "pids.max"), value: strconv.FormatInt(l.PIDs, 10)})
		}
		if l.CPUs > 0 {
			w = append(w, write{path: filepath.Join(c.dir, "cpu.max"), value: fmt.Sprintf("%d %d", int64(l.CPUs*float64(period)), period)})
		}
		if l.CPUWeight > 0 {
			w = append(w, write{path: filepath.Join(c.dir, "cpu.weight"), value: strconv.Itoa(l.CPUWeight)})
		}
		return w
	}
	mem, pids, cpu := c.dirs["memory"], c.dirs["pids"], c.dirs["cpu"]
	if l.MemoryBytes > 0 {
		// memsw must stay >= the memory limit: set memory first.
		w = append(w, write{path: filepath.Join(mem, "memory.limit_in_bytes"), value: strconv.FormatInt(l.MemoryBytes, 10)},
			write{path: filepath.Join(mem, "memory.memsw.limit_in_bytes"), value: strconv.FormatInt(l.MemoryBytes, 10), optional: true},
			write{path: filepath.Join(mem, "memory.swappiness"), value: "0", optional: true})
	}
	if l.PIDs > 0 {
		w = append(w, write{path: filepath.Join(pids, "pids.max"), value: strconv.FormatInt(l.PIDs, 10)})
	}
	if l.CPUs > 0 {
		w = append(w, write{path: filepath.Join(cpu, "cpu.cfs_period_us"), value: strconv.FormatInt(period, 10)},
			write{path: filepath.Join(cpu, "cpu.cfs_quota_us"), value: strconv.FormatInt(int64(l.CPUs*float64(period)), 10)})
	}
	if l.CPUWeight > 0 {
		w = append(w, write{path: filepath.Join(cpu, "cpu.shares"), value: strconv.Itoa(max(2, l.CPUWeight*1024/100))})
	}
	return w
}

// Add moves process pid (all its threads) into the group. Its children
// from then on are born inside. A process that forks before it is moved
// leaves those children outside: move a process before it runs anything
// untrusted (see the package's integration notes: bubblewrap's --block-fd,
// or CLONE_INTO_CGROUP with FD on v2).
func (c *Cgroup) Add(pid int) error {
	for _, d := range c.Dirs() {
		if err := writeFile(filepath.Join(d, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("move process %d into %s: %w", pid, d, err)
		}
	}
	return nil
}

// FD opens the v2 group's directory, for exec.Cmd's
// SysProcAttr{UseCgroupFD: true, CgroupFD: fd}: the child is then born in
// the group (clone3 with CLONE_INTO_CGROUP), with no window outside it. On
// v1 there is no such thing and it returns an error.
func (c *Cgroup) FD() (*os.File, error) {
	if c.version != V2 {
		return nil, fmt.Errorf("%w: starting a process inside a group is only possible with cgroup v2; use Add", ErrUnavailable)
	}
	return os.OpenFile(c.dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// PIDs lists the processes in the group.
func (c *Cgroup) PIDs() ([]int, error) {
	d := c.dir
	if c.version == V1 {
		d = c.dirs["pids"]
	}
	return readPIDs(filepath.Join(d, "cgroup.procs"))
}

// Stats are a group's current use and the events that ended processes.
type Stats struct {
	MemoryBytes     int64
	MemoryPeakBytes int64 // 0 when the kernel does not report it
	PIDs            int64
	// OOMKills counts processes the kernel killed for the memory limit.
	OOMKills uint64
	// MemoryLimitHits counts allocations that ran into the limit (v2
	// memory.events "max", v1 memory.failcnt); some end in reclaim, not a
	// kill.
	MemoryLimitHits uint64
	// PIDsLimitHits counts forks refused by pids.max (pids.events "max").
	PIDsLimitHits uint64
}

// Stats reads the group's counters. Fields a kernel does not offer stay 0.
func (c *Cgroup) Stats() (Stats, error) {
	var s Stats
	var err error
	if c.version == V2 {
		if s.MemoryBytes, err = readInt(filepath.Join(c.dir, "memory.current")); err != nil {
			return s, err
		}
		s.MemoryPeakBytes, _ = readInt(filepath.Join(c.dir, "memory.peak"))
		s.PIDs, _ = readInt(filepath.Join(c.dir, "pids.current"))
		ev := readKeyed(filepath.Join(c.dir, "memory.events"))
		s.OOMKills, s.MemoryLimitHits = ev["oom_kill"], ev["max"]
		s.PIDsLimitHits = readKeyed(filepath.Join(c.dir, "pids.events"))["max"]
		return s, nil
	}
	mem, pids := c.dirs["memory"], c.dirs["pids"]
	if s.MemoryBytes, err = readInt(filepath.Join(mem, "memory.usage_in_bytes")); err != nil {
		return s, err
	}
	s.MemoryPeakBytes, _ = readInt(filepath.Join(mem, "memory.max_usage_in_bytes"))
	s.PIDs, _ = readInt(filepath.Join(pids, "pids.current"))
	s.OOMKills = readKeyed(filepath.Join(mem, "memory.oom_control"))["oom_kill"]
	if fc, err := readInt(filepath.Join(mem, "memory.failcnt")); err == nil {
		s.MemoryLimitHits = uint64(fc)
	}
	s.PIDsLimitHits = readKeyed(filepath.Join(pids, "pids.events"))["max"]
	return s, nil
}

// OOMKills is Stats().OOMKills, read from its one control file: compare it
// before and after a command to tell whether the kernel killed something of
// it for memory.
func (c *Cgroup) OOMKills() (uint64, error) {
	o, err := c.OpenOOMCounter()
	if err != nil {
		return 0, err
	}
	defer o.Close()
	return o.Read()
}

// OOMCounterPath is the control file that counts the group's OOM kills
// (an "oom_kill N" line on either version).
func (c *Cgroup) OOMCounterPath() string { return c.oomCounterPath() }

// oomCounterPath is the control file that counts the group's OOM kills.
func (c *Cgroup) oomCounterPath() string {
	if c.version == V1 {
		return filepath.Join(c.dirs["memory"], "memory.oom_control")
	}
	return filepath.Join(c.dir, "memory.events")
}

// OOMCounter is the group's OOM-kill counter file held open, so that a
// command's counts before and after cost a read each: opening a control
// file (a path walk and kernfs's open and release) costs several times
// what reading it does. A read starts again at the file's beginning, where
// the kernel makes the file's contents anew. Close it when done; it is not
// for concurrent use.
type OOMCounter struct {
	fd   int
	path string
	buf  []byte
}

// OpenOOMCounter opens the group's OOM-kill counter.
func (c *Cgroup) OpenOOMCounter() (*OOMCounter, error) {
	p := c.oomCounterPath()
	fd, err := openControl(p)
	if err != nil {
		return nil, err
	}
	return &OOMCounter{fd: fd, path: p}, nil
}

// Read returns the count of OOM kills in the group so far (Stats' OOMKills).
func (o *OOMCounter) Read() (uint64, error) {
	if o.buf == nil {
		o.buf = make([]byte, 512)
	}
	// A control file's whole text comes in one read when it fits: a
	// short read is all of it, with no second read to see the end.
	n, err := unix.Pread(o.fd, o.buf, 0)
	for errors.Is(err, unix.EINTR) {
		n, err = unix.Pread(o.fd, o.buf, 0)
	}
	switch {
	case err != nil:
		return 0, &fs.PathError{Op: "read", Path: o.path, Err: err}
	case n == len(o.buf):
		if n, err = preadAll(o.fd, o.path, &o.buf); err != nil {
			return 0, err
		}
	}
	return keyed(o.buf[:n], "oom_kill"), nil
}

// keyed is parseKeyed(b)[key], without the map.
func keyed(b []byte, key string) uint64 {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		k, v, ok := bytes.Cut(bytes.TrimSpace(line), []byte(" "))
		if ok && string(k) == key {
			n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return 0
}

// Close closes the counter.
func (o *OOMCounter) Close() error { return unix.Close(o.fd) }

// Kill SIGKILLs every process in the group and waits (at most killWait,
// or until ctx ends) for the group to be empty. v2 uses cgroup.kill, which
// the kernel applies atomically to the whole group, forks in flight
// included; otherwise (v1, kernels before 5.14) the processes are killed
// one by one, again and again until none is left: each one is opened as a
// pidfd and checked to still be in the group before it is signalled, so a
// recycled pid is never hit.
func (c *Cgroup) Kill(ctx context.Context) error {
	if c.version == V2 {
		err := writeFile(filepath.Join(c.dir, "cgroup.kill"), "1")
		switch {
		case err == nil:
		case errors.Is(err, fs.ErrNotExist) && dirExists(c.dir):
			// Before 5.14: fall through to the loop.
		case errors.Is(err, fs.ErrNotExist):
			return nil
		default:
			return fmt.Errorf("kill cgroup %s: %w", c.dir, err)
		}
	}
	thawed := false
	deadline := time.Now().Add(killWait)
	for {
		pids, err := c.PIDs()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			c.killIfMember(pid)
		}
		if !thawed {
			// A frozen process (a pause, a hold a crashed daemon left)
			// dies of its SIGKILL only once thawed (cgroup v1's freezer;
			// v2 lets it through): thawed after the signal, it runs none
			// of its own code before it dies.
			thawed = true
			c.thawIfFrozen()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s still holds %d processes %v after %v of SIGKILL (stuck in the kernel?)", c.Name(), len(pids), pids[:min(len(pids), 8)], killWait)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kill cgroup %s: %w", c.Name(), ctx.Err())
		case <-time.After(pollEvery):
		}
	}
}

// killIfMember signals pid only if the process behind it is still in this
// group once a pidfd pins it.
func (c *Cgroup) killIfMember(pid int) {
	pfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // gone
	}
	defer unix.Close(pfd)
	if !c.holds(pid) {
		return
	}
	_ = unix.PidfdSendSignal(pfd, unix.SIGKILL, nil, 0)
}

// holds reports whether /proc/pid/cgroup places pid in this group.
func (c *Cgroup) holds(pid int) bool {
	b, err := readBounded(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false
	}
	for _, d := range c.Dirs() {
		// The group's path relative to its mount is a suffix of its
		// directory; /proc/pid/cgroup lines end in that path.
		for _, line := range strings.Split(string(b), "\n") {
			parts := strings.SplitN(line, ":", 3)
			if len(parts) == 3 && parts[2] != "/" && strings.HasSuffix(d, parts[2]) && path.Base(parts[2]) == c.name {
				return true
			}
		}
	}
	return false
}

// Destroy kills everything in the group and removes its directories. A
// group already gone is success. It is bounded by killWait plus the time
// the kernel takes to release an emptied group (retried until ctx ends or
// killWait again).
func (c *Cgroup) Destroy(ctx context.Context) error {
	if err := c.Kill(ctx); err != nil {
		return err
	}
	deadline := time.Now().Add(killWait)
	for _, d := range c.Dirs() {
		for {
			err := unix.Rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
				return fmt.Errorf("remove cgroup %s: %w", d, err)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("remove cgroup %s: %w", d, ctx.Err())
			case <-time.After(pollEvery):
			}
		}
	}
	return nil
}

// File helpers. Control files are small; reads are bounded anyway.

// readBounded reads control file p, at most maxControlFile bytes of it.
// It reads with plain system calls rather than through an os.File: a
// control file is read around every command (the OOM counter), and an
// os.File of one is registered with the runtime's poller (kernfs files
// are pollable) and taken out again at its close, which cost more than
// the read.
func readBounded(p string) ([]byte, error) {
	fd, err := openControl(p)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 512)
	n, err := preadAll(fd, p, &buf)
	return buf[:n], err
}

// openControl opens control file p for reading, close-on-exec.
func openControl(p string) (int, error) {
	for {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return -1, &fs.PathError{Op: "open", Path: p, Err: err}
		}
		return fd, nil
	}
}

// preadAll reads fd (control file p) from its beginning to its end, at
// most maxControlFile bytes, into *buf, growing it as needed, and returns
// how many bytes it read.
func preadAll(fd int, p string, buf *[]byte) (int, error) {
	n := 0
	for n < maxControlFile {
		if n == len(*buf) {
			*buf = append(*buf, make([]byte, len(*buf))...)
		}
		got, err := unix.Pread(fd, (*buf)[n:min(len(*buf), maxControlFile)], int64(n))
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return n, &fs.PathError{Op: "read", Path: p, Err: err}
		case got == 0:
			return n, nil
		}
		n += got
	}
	return n, nil
}

func readInt(p string) (int64, error) {
	b, err := readBounded(p)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return math.MaxInt64, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

// readKeyed reads "key value" lines (memory.events, memory.oom_control).
func readKeyed(p string) map[string]uint64 {
	b, _ := readBounded(p)
	return parseKeyed(b)
}

func parseKeyed(b []byte) map[string]uint64 {
	out := map[string]uint64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			out[k] = n
		}
	}
	return out
}

func readPIDs(p string) ([]int, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if pid, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil {
			out = append(out, pid)
		}
	}
	return out, sc.Err()
}

// writeFile writes one value to a control file: one write(2), no create,
// no truncate (cgroupfs files exist or the feature does not).
func writeFile(p, value string) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func dirExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

func sortedValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}
