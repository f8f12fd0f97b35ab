package bwrap

// Snapshots and forks (backend.Snapshotter, backend.Forker): a sandbox's
// files handed over with its processes frozen in its cgroup, and new
// sandboxes made as copies of one. A sandbox made from an image that
// holds a workspace or a tmp (a snapshot) starts with copies of them
// (seed, in Create).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/resources"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/seed"
)

// Failpoints of snapshots and forks.
const (
	// FailSnapshotHeld: the sandbox's processes are frozen (where they
	// can be) and its files are about to be handed over.
	FailSnapshotHeld = "bwrap-snapshot-held"
	// FailForkCopied: a fork's new sandboxes are all made, the source
	// still frozen.
	FailForkCopied = "bwrap-fork-copied"
)

var (
	_ backend.Snapshotter = (*Backend)(nil)
	_ backend.Forker      = (*Backend)(nil)
)

// seed gives a sandbox being created its seed: the spec's (a fork's
// source), or its image's workspace and tmp. Its directories exist and
// nothing runs in it yet.
func (b *Backend) seed(ctx context.Context, sb *sandbox, spec backend.Spec) error {
	s := spec.Seed
	if s.IsZero() {
		s = spec.Image.Seed()
	}
	if s.IsZero() {
		return nil
	}
	return seed.Copy(ctx, s, sb.workDir(), sb.tmpDir(), hostfs.Owner{UID: sb.uid, GID: sb.gid}, b.writerAs(sb))
}

// readerAs is how the daemon reads sb's files: as itself when it may
// (root), else with sb's filesystem ids (privilege.go); nil for the first.
func (b *Backend) readerAs(sb *sandbox) func(func() error) error {
	if b.viaCaps && sb.own {
		return func(fn func() error) error { return b.asOwner(sb, fn) }
	}
	return nil
}

// writerAs is how the daemon makes sb's files: nil when it can chown
// them (root), else made as sb's uid.
func (b *Backend) writerAs(sb *sandbox) func(func() error) error { return b.readerAs(sb) }

// hold freezes sb's processes for a copy of its files (resources.Hold).
func (b *Backend) hold(ctx context.Context, sb *sandbox) (release func(), frozen bool) {
	return resources.Hold(ctx, sb.cg, filepath.Join(sb.dir, resources.HeldMarker), b.log.With("sandbox", sb.id))
}

// thawLeftHeld thaws sb's cgroup (by its name: a sandbox being loaded
// has none in memory yet) if a daemon that died held it: its processes
// outlived that daemon, frozen.
func (b *Backend) thawLeftHeld(sb *sandbox) {
	marker := filepath.Join(sb.dir, resources.HeldMarker)
	if _, err := os.Lstat(marker); err != nil {
		return
	}
	cg := sb.cg
	if cg == nil && b.cfg.Cgroups != nil {
		cg, _ = b.cfg.Cgroups.Open(sb.cgroupName())
	}
	if ok, err := resources.ThawLeftHeld(cg, marker); err != nil {
		b.log.Error("cannot thaw a sandbox a previous daemon left frozen mid-snapshot", "sandbox", sb.id, "error", err)
	} else if ok {
		b.log.Warn("thawed a sandbox a previous daemon left frozen mid-snapshot", "sandbox", sb.id)
	}
}

// SnapshotFiles implements backend.Snapshotter.
func (b *Backend) SnapshotFiles(ctx context.Context, id string, opts backend.SnapshotOptions, fn func(backend.SandboxFiles) error) error {
	if opts.Memory {
		return fmt.Errorf("%w: the bwrap backend keeps a sandbox's files, not its processes' memory; snapshot without memory", backend.ErrUnsupported)
	}
	sb, err := b.lookup(id)
	if err != nil {
		return err
	}
	ctx, done, err := sb.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	release, frozen := b.hold(ctx, sb)
	defer release()
	b.failpoint(FailSnapshotHeld)
	return fn(backend.SandboxFiles{Workspace: sb.workDir(), Tmp: sb.tmpDir(), ReadAs: b.readerAs(sb), Frozen: frozen})
}

// specOf is the spec a sandbox was created with, from its settings: what
// a fork of it is created with.
func specOf(s persistedSpec) backend.Spec {
	spec := backend.Spec{Env: s.Env, Resources: s.Resources}
	switch s.Network {
	case networkHost:
		open := false
		spec.BlockNetwork = &open
	case networkAllowlist:
		spec.AllowEgressTo, spec.AllowEgressToCIDRs = s.AllowEgressTo, s.AllowEgressToCIDRs
	}
	if s.Image != nil {
		spec.Image = backend.Image{Name: s.Image.Name, Digest: s.Image.Digest, Root: s.Image.Root, Env: s.Image.Env}
	}
	return spec
}

// Fork implements backend.Forker: each new sandbox is created as Create
// makes any (a uid of its own, its disk, its cgroup, its init started),
// with the source's settings and its files as the seed, the source frozen
// from before the first copy to after the last.
func (b *Backend) Fork(ctx context.Context, id string, newIDs []string, opts backend.SnapshotOptions) (_ backend.ForkResult, err error) {
	if opts.Memory {
		return backend.ForkResult{}, fmt.Errorf("%w: the bwrap backend forks a sandbox's files, not its processes' memory", backend.ErrUnsupported)
	}
	src, err := b.lookup(id)
	if err != nil {
		return backend.ForkResult{}, err
	}
	ctx, done, err := src.begin(ctx)
	if err != nil {
		return backend.ForkResult{}, err
	}
	defer done()
	saved, err := b.loadSpec(id)
	if err != nil {
		return backend.ForkResult{}, err
	}
	spec := specOf(saved)
	spec.Seed = backend.Seed{Workspace: src.workDir(), Tmp: src.tmpDir(), ReadAs: b.readerAs(src), KeepModes: true}
	release, frozen := b.hold(ctx, src)
	defer release()
	infos, err := backend.CreateEach(ctx, b, newIDs, spec, func(nid string, derr error) {
		b.log.Error("cannot remove a sandbox of a failed fork", "sandbox", nid, "error", derr)
	})
	if err != nil {
		return backend.ForkResult{}, fmt.Errorf("fork of sandbox %s: %w", id, err)
	}
	res := backend.ForkResult{Infos: infos, Frozen: frozen}
	b.failpoint(FailForkCopied)
	b.log.Info("sandbox forked", "sandbox", id, "forks", newIDs, "frozen", frozen)
	return res, nil
}
