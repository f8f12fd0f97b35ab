package cgroup

// Holding a group still: every process of it stopped by the freezer
// (freeze.go) for the moment a caller needs the group's files unchanging
// (a snapshot, a fork), then let go.

import (
	"context"
	"fmt"
)

// Hold freezes every process of the group and waits until they are all
// stopped (bounded by ctx and freezeWait; past either the group is thawed
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
	if asked, err := c.Freezing(); err != nil {
		return nil, fmt.Errorf("hold cgroup %s: %w", c.name, err)
	} else if asked {
		return func() error { return nil }, nil
	}
	c.m.anchorFreezer()
	release, err = freezeRounds(ctx, c.freezerOps(ctl, frozen), c.version)
	if err != nil {
		return nil, fmt.Errorf("hold cgroup %s: %w", c.name, err)
	}
	return release, nil
}
