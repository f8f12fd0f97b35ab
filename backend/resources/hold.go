package resources

import (
	"context"
	"errors"
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/cgroup"
)

// HeldMarker is the file, in a sandbox's directory, that says its cgroup
// is held (Hold): a daemon that dies meanwhile leaves it, and the next
// one thaws the group (ThawLeftHeld) before anything else.
const HeldMarker = ".held"

// Hold freezes the processes of a sandbox's cgroup cg while its files are
// copied (a snapshot, a fork), with marker written first. A sandbox
// without a cgroup or a freezer, or one whose processes do not all stop in
// time, is not held: frozen is false, the copy takes the files as they are
// at each moment, and the caller says so. release thaws it (unless it was
// frozen before: a pause) and removes the marker.
func Hold(ctx context.Context, cg *cgroup.Cgroup, marker string, log hclog.Logger) (release func(), frozen bool) {
	noop := func() {}
	if cg == nil {
		return noop, false
	}
	if paused, err := cg.Freezing(); err == nil && paused {
		// Paused: frozen already, and it stays so after the copy. No
		// marker, which would have the next daemon thaw it.
		return noop, true
	}
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		log.Warn("cannot mark the sandbox held; its files are copied without freezing it", "error", err)
		return noop, false
	}
	thaw, err := cg.Hold(ctx)
	if err != nil {
		_ = os.Remove(marker)
		if !errors.Is(err, cgroup.ErrNoFreezer) {
			log.Warn("cannot freeze the sandbox; its files are copied as they are", "error", err)
		}
		return noop, false
	}
	return func() {
		if err := thaw(); err != nil {
			log.Error("cannot thaw the sandbox after copying its files; its processes stay stopped until the next daemon start or its destroy", "error", err)
			return
		}
		_ = os.Remove(marker)
	}, true
}

// ThawLeftHeld thaws cg when marker says a daemon that died held it, and
// removes the marker; it reports whether it did.
func ThawLeftHeld(cg *cgroup.Cgroup, marker string) (bool, error) {
	if _, err := os.Lstat(marker); err != nil {
		return false, nil
	}
	if cg != nil {
		if err := cg.Thaw(); err != nil && !errors.Is(err, cgroup.ErrNoFreezer) {
			return false, err
		}
	}
	return true, os.Remove(marker)
}
