package hostback

import (
	"context"
	"fmt"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/seed"
)

// Snapshots and forks of host directories: the workspace alone (a host
// sandbox's /tmp is the host's), never frozen (its commands are host
// processes in no cgroup of their own).

var (
	_ backend.Snapshotter = (*Backend)(nil)
	_ backend.Forker      = (*Backend)(nil)
)

func (b *Backend) seed(ctx context.Context, sb *sandbox, spec backend.Spec) error {
	s := spec.Seed
	if s.IsZero() {
		s = spec.Image.Seed()
	}
	return seed.Copy(ctx, s, sb.workDir(), "", hostfs.Owner{UID: -1, GID: -1}, nil)
}

// SnapshotFiles implements backend.Snapshotter.
func (b *Backend) SnapshotFiles(ctx context.Context, id string, opts backend.SnapshotOptions, fn func(backend.SandboxFiles) error) error {
	if opts.Memory {
		return fmt.Errorf("%w: the host test backend keeps no memory", backend.ErrUnsupported)
	}
	sb, err := b.boxes.Lookup(id)
	if err != nil {
		return err
	}
	_, done, err := sb.ops.Begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	return fn(backend.SandboxFiles{Workspace: sb.workDir()})
}

// Fork implements backend.Forker.
func (b *Backend) Fork(ctx context.Context, id string, newIDs []string, opts backend.SnapshotOptions) (_ backend.ForkResult, err error) {
	if opts.Memory {
		return backend.ForkResult{}, fmt.Errorf("%w: the host test backend keeps no memory", backend.ErrUnsupported)
	}
	src, err := b.boxes.Lookup(id)
	if err != nil {
		return backend.ForkResult{}, err
	}
	ctx, done, err := src.ops.Begin(ctx)
	if err != nil {
		return backend.ForkResult{}, err
	}
	defer done()
	spec := backend.Spec{Env: src.env, Seed: backend.Seed{Workspace: src.workDir(), KeepModes: true}}
	var res backend.ForkResult
	for _, nid := range newIDs {
		info, err := b.Create(ctx, nid, spec)
		if err != nil {
			for _, made := range newIDs[:len(res.Infos)] {
				_ = b.Destroy(context.WithoutCancel(ctx), made)
			}
			return backend.ForkResult{}, fmt.Errorf("fork of sandbox %s: %w", id, err)
		}
		res.Infos = append(res.Infos, info)
	}
	return res, nil
}
