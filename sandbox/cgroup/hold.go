package cgroup

// Holding a group still: every process of it stopped by the freezer for
// the moment a caller needs the group's files unchanging (a snapshot, a
// fork), then let go.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// freezer is the v1 controller Hold uses.
const freezer = "freezer"

// ErrNoFreezer: the group has no freezer (cgroup v1 without the freezer
// controller mounted); Hold cannot stop its processes.
var ErrNoFreezer = errors.New("no cgroup freezer")

// Bounds of a hold.
const (
	// holdWait bounds how long Hold waits for the group to be frozen (a
	// process in an uninterruptible wait delays it).
	holdWait = 5 * time.Second
	// holdPoll is how often it looks.
	holdPoll = time.Millisecond
	// holdFirstRound and holdLastRound bound one v1 freeze round (see
	// Hold): it doubles from the first to the last.
	holdFirstRound = 10 * time.Millisecond
	holdLastRound  = 640 * time.Millisecond
)

// Hold freezes every process of the group and waits until they are all
// stopped (bounded by ctx and holdWait; past either the group is thawed
// again and the error returned). release thaws it. A group that was frozen
// already when Hold was called (a paused sandbox) is left so: its
// release does nothing. ErrNoFreezer when the group has none.
func (c *Cgroup) Hold(ctx context.Context) (release func() error, err error) {
	ctl, frozen, err := c.freezerFiles()
	if err != nil {
		return nil, err
	}
	// Asked to freeze already (paused, or being paused): not ours to
	// thaw, and it may still be on its way.
	if asked, err := readBounded(ctl); err != nil {
		return nil, fmt.Errorf("hold cgroup %s: %w", c.name, err)
	} else if s := strings.TrimSpace(string(asked)); s == "1" || s == "FROZEN" || s == "FREEZING" {
		return func() error { return nil }, nil
	}
	f := freezerOps{
		write:  func(freeze bool) error { return writeFile(ctl, c.freezeValue(freeze)) },
		frozen: frozen,
	}
	release, err = hold(ctx, f, c.version)
	if err != nil {
		return nil, fmt.Errorf("hold cgroup %s: %w", c.name, err)
	}
	return release, nil
}

// freezerOps is what hold needs of a group's freezer.
type freezerOps struct {
	write  func(freeze bool) error
	frozen func() (bool, error)
}

// hold freezes until frozen, bounded by ctx and holdWait; the group is
// thawed again on every error. On v1 a round that does not finish is
// thawed and tried again: a process caught by the freeze between its
// vfork and its wait for the child is never counted frozen there (v2
// counts it), so that freeze would stay FREEZING for good. Thawed, it
// waits properly and the next round takes it. Rounds grow so a big group
// under load still finishes one.
func hold(ctx context.Context, f freezerOps, v Version) (release func() error, err error) {
	thaw := func() error { return f.write(false) }
	deadline := time.Now().Add(holdWait)
	round := holdFirstRound
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
				err = fmt.Errorf("its processes did not all stop within %v (one is in an uninterruptible wait?)", holdWait)
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
			time.Sleep(holdPoll)
		}
		if err := thaw(); err != nil {
			return nil, fmt.Errorf("thaw between rounds: %w", err)
		}
		time.Sleep(holdPoll)
		round = min(2*round, holdLastRound)
	}
}

// Frozen reports whether the group's processes are frozen (held or
// paused); false for a group without a freezer.
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

// thawIfFrozen thaws the group if it is frozen or being frozen.
func (c *Cgroup) thawIfFrozen() {
	ctl, _, err := c.freezerFiles()
	if err != nil {
		return
	}
	if b, err := readBounded(ctl); err == nil {
		if s := strings.TrimSpace(string(b)); s == "1" || s == "FROZEN" || s == "FREEZING" {
			_ = writeFile(ctl, c.freezeValue(false))
		}
	}
}

// Thaw lets every process of the group run again (a hold a crashed
// daemon left).
func (c *Cgroup) Thaw() error {
	ctl, _, err := c.freezerFiles()
	if err != nil {
		return err
	}
	return writeFile(ctl, c.freezeValue(false))
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
// reads whether the group is frozen now.
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
		// FREEZING until every task is stopped.
		return strings.TrimSpace(string(b)) == "FROZEN", nil
	}, nil
}
