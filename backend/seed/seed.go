// Package seed fills a new sandbox's directories from a backend.Seed (an
// image's files, a snapshot's or a fork's source), for the backends whose
// sandboxes keep their files on the host. It is the daemon's alone: the
// sandbox's init, which links backend/hostfs, never copies a tree.
package seed

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/fscopy"
)

// Copy copies seed s into a new sandbox's work and tmp directories (made
// already, empty), every copy given to owner, or made through writeAs
// (a daemon without CAP_CHOWN makes them as the sandbox's uid; owner is
// then ignored). An image's files (read-only in the store) become
// writable by their owner; a fork's keep their modes (s.KeepModes).
// Errors wrap backend.ErrNoSpace (the disk, or the sandbox's own disk
// cap, is full) or backend.ErrInvalidArgument (an entry that cannot be
// copied, named).
func Copy(ctx context.Context, s backend.Seed, work, tmp string, owner hostfs.Owner, writeAs func(func() error) error) error {
	opt := fscopy.Options{UID: owner.UID, GID: owner.GID, ReadAs: s.ReadAs, WriteAs: writeAs}
	if writeAs != nil {
		opt.UID, opt.GID = -1, -1
	}
	if !s.KeepModes {
		opt.FileMode = func(m fs.FileMode) fs.FileMode { return m.Perm() | 0o200 }
		opt.DirMode = func(m fs.FileMode) fs.FileMode { return m.Perm() | 0o700 }
	}
	for _, d := range []struct{ what, from, into string }{{"/workspace", s.Workspace, work}, {"/tmp", s.Tmp, tmp}} {
		if d.from == "" || d.into == "" {
			continue // nothing to seed, or no such directory of its own
		}
		if err := fscopy.Copy(ctx, d.from, d.into, opt); err != nil {
			return seedErr(d.what, err)
		}
	}
	return nil
}

func seedErr(what string, err error) error {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%w: copying %s: %v; free space on the host (or ask for a larger disk)", backend.ErrNoSpace, what, err)
	case errors.Is(err, fscopy.ErrBadEntry):
		return fmt.Errorf("%w: %s cannot be copied: %v", backend.ErrInvalidArgument, what, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("copying %s: %w", what, err)
	}
	return fmt.Errorf("copying %s: %w", what, err)
}
