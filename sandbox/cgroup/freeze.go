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
// host mounts one (plan), and CanFreeze says whether it could.
//
// Two callers, one way to freeze (freezeRounds): Freeze for as long as the
// caller wants (a paused sandbox, which outlives the daemon: the kernel
// keeps a group frozen whoever froze it), Hold for a moment (hold.go: a
// snapshot's copy).

// freezer is cgroup v1's freezer, an optional controller: a group is made
// there too when it is mounted and the daemon may write there, and a host
// without it only cannot freeze.
const freezer = "freezer"

// ErrNoFreezer: the group has no freezer (cgroup v1 without a freezer
// hierarchy the daemon may write to, or a v2 kernel before 5.2).
var ErrNoFreezer = errors.New("no cgroup freezer")

// Bounds of a freeze.
const (
	// freezeWait bounds how long a freeze waits for every process of the
	// group to stop. A process in an uninterruptible sleep the freezer
	// cannot interrupt (a hung network filesystem) keeps a group freezing
	// for as long as that lasts: the freeze is undone and refused instead.
	freezeWait = 5 * time.Second
	// freezePoll is how often it looks; the first look is at once.
	freezePoll = time.Millisecond
	// freezeFirstRound and freezeLastRound bound one v1 freeze round (see
	// freezeRounds): it doubles from the first to the last.
	freezeFirstRound = 10 * time.Millisecond
	freezeLastRound  = 640 * time.Millisecond
)

// CanFreeze reports whether the manager's groups can be frozen: nil, or
// an error wrapping ErrNoFreezer that says why not.
func (m *Manager) CanFreeze() error {
	if m.version == V2 {
		if _, err := os.Stat(filepath.Join(m.v2Base, "cgroup.freeze")); err != nil {
			return fmt.Errorf("%w: %s has no cgroup.freeze (a kernel before 5.2)", ErrNoFreezer, m.v2Base)
		}
		return nil
	}
	if _, ok := m.v1Base[freezer]; !ok {
		return fmt.Errorf("%w: cgroup v1 without a freezer hierarchy the daemon may write to (mount the freezer controller, as /sys/fs/cgroup/freezer)", ErrNoFreezer)
	}
	return nil
}

// freezeAnchor names an empty group of cgroup v1's freezer hierarchy, under
// the base, that stays frozen once a group was: its leading '.' keeps it
// out of List. The v1 freezer turns a kernel-wide static branch on when
// the first group of the host freezes and off when the last one thaws,
// which patches the kernel's text on every CPU: 10-18 ms of a pause or a
// resume (the write alone) on a busy 2-vCPU host, against 30 µs while any
// other group is frozen. The anchor keeps the branch on, so only the
// daemon's first freeze pays it; Release removes it.
const freezeAnchor = ".freeze-anchor"

// anchorFreezer makes and freezes the manager's anchor, once (a failure is
// tried again at the next freeze: the anchor only saves time).
func (m *Manager) anchorFreezer() {
	if m == nil || m.version != V1 {
		return
	}
	m.anchorMu.Lock()
	defer m.anchorMu.Unlock()
	base, ok := m.v1Base[freezer]
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
	if base, ok := m.v1Base[freezer]; ok {
		_ = unix.Rmdir(filepath.Join(base, freezeAnchor))
	}
	m.anchored = false
}

// Freeze stops every process of the group and returns once all of them
// are stopped, or, when they are not within freezeWait (or ctx ends),
// thaws the group again and returns an error: a group is never left half
// frozen. Freezing a frozen group succeeds. Unlike Hold's, the freeze
// stays until Thaw, a daemon's death included. A removed group is
// ErrNotFound.
func (c *Cgroup) Freeze(ctx context.Context) error {
	ctl, frozen, err := c.freezerFiles()
	if err != nil {
		return err
	}
	c.m.anchorFreezer()
	if _, err := freezeRounds(ctx, c.freezerOps(ctl, frozen), c.version); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: freeze cgroup %s: %v", ErrNotFound, c.name, err)
		}
		return fmt.Errorf("freeze cgroup %s: %w; it was thawed again", c.name, err)
	}
	return nil
}

// freezerOps is what freezeRounds needs of a group's freezer.
type freezerOps struct {
	write  func(freeze bool) error
	frozen func() (bool, error)
}

func (c *Cgroup) freezerOps(ctl string, frozen func() (bool, error)) freezerOps {
	return freezerOps{
		write:  func(freeze bool) error { return writeFile(ctl, c.freezeValue(freeze)) },
		frozen: frozen,
	}
}

// freezeRounds freezes until frozen, bounded by ctx and freezeWait; the
// group is thawed again on every error. release thaws it. On v1 a round
// that does not finish is thawed and tried again: a process caught by the
// freeze between its vfork and its wait for the child is never counted
// frozen there (v2 counts it), so that freeze would stay FREEZING for
// good. Thawed, it waits properly and the next round takes it. Rounds grow
// so a big group under load still finishes one.
func freezeRounds(ctx context.Context, f freezerOps, v Version) (release func() error, err error) {
	thaw := func() error { return f.write(false) }
	deadline := time.Now().Add(freezeWait)
	round := freezeFirstRound
	for {
		if err := f.write(true); err != nil {
			return nil, errors.Join(err, thaw())
		}
		roundEnd := time.Now().Add(round)
		for {
			done, err := f.frozen()
			if err == nil && done {
				return thaw, nil
			}
			if err == nil && time.Now().After(deadline) {
				err = fmt.Errorf("its processes did not all stop within %v (one is in an uninterruptible wait?)", freezeWait)
			}
			if err == nil {
				err = ctx.Err()
			}
			if err != nil {
				return nil, errors.Join(err, thaw())
			}
			if v != V2 && time.Now().After(roundEnd) {
				break
			}
			time.Sleep(freezePoll)
		}
		if err := thaw(); err != nil {
			return nil, fmt.Errorf("thaw between rounds: %w", err)
		}
		time.Sleep(freezePoll)
		round = min(2*round, freezeLastRound)
	}
}

// Thaw lets every process of the group run again (a resume, a hold a
// crashed daemon left). Thawing a group that is not frozen succeeds; a
// removed group is ErrNotFound.
func (c *Cgroup) Thaw() error {
	ctl, _, err := c.freezerFiles()
	if err != nil {
		return err
	}
	if err := writeFile(ctl, c.freezeValue(false)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: %s: %v", ErrNotFound, ctl, err)
		}
		return fmt.Errorf("thaw cgroup %s: %w", c.name, err)
	}
	return nil
}

// Freezing reports whether the group is frozen or being frozen: what was
// last asked of it, which the kernel keeps whoever asked (a daemon that
// died right after its write included), where Frozen says whether every
// process has stopped yet. A group without a freezer is not; a removed
// group is ErrNotFound.
func (c *Cgroup) Freezing() (bool, error) {
	ctl, _, err := c.freezerFiles()
	if errors.Is(err, ErrNoFreezer) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	b, err := readBounded(ctl)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("%w: %s: %v", ErrNotFound, ctl, err)
		}
		return false, err
	}
	return strings.TrimSpace(string(b)) != c.freezeValue(false), nil
}

// Frozen reports whether the group's processes are all stopped (paused or
// held); false for a group without a freezer.
func (c *Cgroup) Frozen() (bool, error) {
	_, frozen, err := c.freezerFiles()
	if errors.Is(err, ErrNoFreezer) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return frozen()
}

// thawIfFrozen thaws the group if it is frozen or being frozen (a kill's:
// errors are left to the kill's own wait).
func (c *Cgroup) thawIfFrozen() {
	if freezing, err := c.Freezing(); err == nil && freezing {
		_ = c.Thaw()
	}
}

func (c *Cgroup) freezeValue(freeze bool) string {
	switch {
	case c.version == V2 && freeze:
		return "1"
	case c.version == V2:
		return "0"
	case freeze:
		return "FROZEN"
	}
	return "THAWED"
}

// freezerFiles returns the control file to write and a function that
// reads whether the group is frozen now: v2's cgroup.events says "frozen
// 1", v1's freezer.state "FROZEN" (it says "FREEZING" until then).
func (c *Cgroup) freezerFiles() (ctl string, frozen func() (bool, error), err error) {
	if c.version == V2 {
		ctl = filepath.Join(c.dir, "cgroup.freeze")
		events := filepath.Join(c.dir, "cgroup.events")
		return ctl, func() (bool, error) {
			b, err := readBounded(events)
			if err != nil {
				return false, err
			}
			return parseKeyed(b)["frozen"] == 1, nil
		}, nil
	}
	d, ok := c.dirs[freezer]
	if !ok {
		return "", nil, ErrNoFreezer
	}
	ctl = filepath.Join(d, "freezer.state")
	return ctl, func() (bool, error) {
		b, err := readBounded(ctl)
		if err != nil {
			return false, err
		}
		return strings.TrimSpace(string(b)) == "FROZEN", nil
	}, nil
}
