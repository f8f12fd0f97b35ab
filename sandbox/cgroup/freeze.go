package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Freezing: every process of a group stopped by the kernel (no CPU, no
// signal handled but a fatal one on v2) until it is thawed, and nothing
// else about them changed: their memory, descriptors and timers stay.
// cgroup v2 has it in every group (cgroup.freeze, kernel 5.2 and later);
// cgroup v1 has it as a controller of its own (freezer.state), mounted or
// not: the manager makes each group in the freezer hierarchy too when the
// host mounts one, and CanFreeze says whether it could.

// freezerController is cgroup v1's freezer, an optional controller: a
// group is made there too when it is mounted and the daemon may write
// there, and a host without it only cannot pause.
const freezerController = "freezer"

// freezeWait bounds how long Freeze waits for every process of a group
// to stop. A process in an uninterruptible sleep the freezer cannot
// interrupt (a hung network filesystem) keeps a group freezing for as
// long as that lasts: the freeze is undone and refused instead.
const freezeWait = 5 * time.Second

// freezePoll is how often Freeze looks again; the first look is at once.
const freezePoll = 500 * time.Microsecond

// ErrNoFreezer: this host cannot freeze sandbox groups (cgroup v1 without
// a freezer hierarchy the daemon may write to, or a v2 kernel before 5.2).
var ErrNoFreezer = errors.New("the cgroup freezer is not available")

// planV1Freezer adds the freezer hierarchy to a v1 manager's groups when
// the host mounts it (fz nil: it does not).
func (m *Manager) planV1Freezer(fz *mount, lay layout, opts Options) {
	if fz == nil {
		return
	}
	parent := "/"
	if !opts.UnderRoot && lay.own[freezerController] != "" {
		parent = lay.own[freezerController]
	}
	dir, err := onDisk(*fz, parent)
	if err != nil {
		return
	}
	m.v1Base[freezerController] = filepath.Join(dir, opts.Base)
}

// CanFreeze reports whether the manager's groups can be frozen: nil, or
// an error wrapping ErrNoFreezer that says why not.
func (m *Manager) CanFreeze() error {
	if m.version == V2 {
		if !fileExists(filepath.Join(m.v2Base, "cgroup.freeze")) {
			return fmt.Errorf("%w: %s has no cgroup.freeze (a kernel before 5.2)", ErrNoFreezer, m.v2Base)
		}
		return nil
	}
	if _, ok := m.v1Base[freezerController]; !ok {
		return fmt.Errorf("%w: cgroup v1 without a freezer hierarchy the daemon may write to (mount the freezer controller, as /sys/fs/cgroup/freezer)", ErrNoFreezer)
	}
	return nil
}

// freezeFile is the group's file that freezes it, and what it says of a
// group that is (or is being) frozen and of one that is not.
func (c *Cgroup) freezeFile() (path, frozen, thawed string, err error) {
	if c.version == V2 {
		return filepath.Join(c.dir, "cgroup.freeze"), "1", "0", nil
	}
	d, ok := c.dirs[freezerController]
	if !ok {
		return "", "", "", fmt.Errorf("%w: cgroup v1 without a freezer hierarchy", ErrNoFreezer)
	}
	return filepath.Join(d, "freezer.state"), "FROZEN", "THAWED", nil
}

// freezeAnchor names an empty group of cgroup v1's freezer hierarchy, under
// the base, that stays frozen once a group was: its leading '.' keeps it
// out of List. The v1 freezer turns a kernel-wide static branch on when
// the first group of the host freezes and off when the last one thaws,
// which patches the kernel's text on every CPU: 10-18 ms of a pause or a
// resume (the write alone) on a busy 2-vCPU host, against 30 µs while any
// other group is frozen. The anchor keeps the branch on, so only the
// daemon's first pause pays it; Release removes it.
const freezeAnchor = ".freeze-anchor"

// anchorFreezer makes and freezes the manager's anchor, once (a failure is
// tried again at the next freeze: the anchor only saves time).
func (m *Manager) anchorFreezer() {
	if m == nil || m.version != V1 {
		return
	}
	m.anchorMu.Lock()
	defer m.anchorMu.Unlock()
	base, ok := m.v1Base[freezerController]
	if m.anchored || !ok {
		return
	}
	dir := filepath.Join(base, freezeAnchor)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return
	}
	m.anchored = writeFile(filepath.Join(dir, "freezer.state"), "FROZEN") == nil
}

// releaseAnchor removes the anchor (an empty group: rmdir takes it frozen).
func (m *Manager) releaseAnchor() {
	m.anchorMu.Lock()
	defer m.anchorMu.Unlock()
	if base, ok := m.v1Base[freezerController]; ok {
		_ = unix.Rmdir(filepath.Join(base, freezeAnchor))
	}
	m.anchored = false
}

// Freeze stops every process of the group and returns once all of them
// are stopped, or, when they are not within freezeWait (or ctx ends),
// thaws the group again and returns an error: a group is never left half
// frozen. Freezing a frozen group succeeds.
func (c *Cgroup) Freeze(ctx context.Context) error {
	p, frozen, _, err := c.freezeFile()
	if err != nil {
		return err
	}
	c.m.anchorFreezer()
	if err := writeFile(p, frozen); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: %s: %v", ErrNotFound, p, err)
		}
		return fmt.Errorf("freeze cgroup %s: %w", c.name, err)
	}
	deadline := time.Now().Add(freezeWait)
	for wait := freezePoll; ; wait = min(2*wait, 10*time.Millisecond) {
		done, err := c.freezeDone()
		if err == nil && done {
			return nil
		}
		if err == nil && time.Now().After(deadline) {
			err = fmt.Errorf("not every process stopped within %v (one may be in an uninterruptible sleep)", freezeWait)
		}
		if err == nil && ctx.Err() != nil {
			err = ctx.Err()
		}
		if err != nil {
			if terr := c.Thaw(); terr != nil {
				return fmt.Errorf("freeze cgroup %s: %w; and thawing it again failed: %v", c.name, err, terr)
			}
			return fmt.Errorf("freeze cgroup %s: %w; it was thawed again", c.name, err)
		}
		time.Sleep(wait)
		if c.version == V1 {
			// v1 asks each process to freeze once per write: a process
			// that went to sleep after that ask (a shell's vfork parent
			// waiting for its child, which froze before its exec) sleeps
			// unfrozen and keeps the group FREEZING for ever. Asked
			// again, it freezes where it sleeps. (v2 counts a vfork
			// parent as frozen.)
			_ = writeFile(p, frozen)
		}
	}
}

// freezeDone reports whether every process of the group is stopped: v2's
// cgroup.events says "frozen 1", v1's freezer.state "FROZEN" (it says
// "FREEZING" until then).
func (c *Cgroup) freezeDone() (bool, error) {
	if c.version == V2 {
		b, err := readBounded(filepath.Join(c.dir, "cgroup.events"))
		if err != nil {
			return false, err
		}
		return keyed(b, "frozen") == 1, nil
	}
	b, err := readBounded(filepath.Join(c.dirs[freezerController], "freezer.state"))
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(b)) == "FROZEN", nil
}

// Thaw lets every process of the group run again. Thawing a group that is
// not frozen succeeds.
func (c *Cgroup) Thaw() error {
	p, _, thawed, err := c.freezeFile()
	if err != nil {
		return err
	}
	if err := writeFile(p, thawed); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: %s: %v", ErrNotFound, p, err)
		}
		return fmt.Errorf("thaw cgroup %s: %w", c.name, err)
	}
	return nil
}

// Frozen reports whether the group is frozen or being frozen: what was
// last asked of it, which the kernel keeps whoever asked (a daemon that
// died after its write included). A group without a freezer is not.
func (c *Cgroup) Frozen() (bool, error) {
	p, _, thawed, err := c.freezeFile()
	if errors.Is(err, ErrNoFreezer) {
		return false, nil
	}
	b, err := readBounded(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("%w: %s: %v", ErrNotFound, p, err)
		}
		return false, err
	}
	return strings.TrimSpace(string(b)) != thawed, nil
}

// thawForKill thaws a frozen group whose processes were just sent
// SIGKILL, so that they die; errors are left to the kill's own wait.
func (c *Cgroup) thawForKill() {
	if frozen, err := c.Frozen(); err == nil && frozen {
		_ = c.Thaw()
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
