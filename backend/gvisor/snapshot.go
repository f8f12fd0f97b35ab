package gvisor

// Snapshots and forks (backend.Snapshotter, backend.Forker): a sandbox's
// files (host directories bound into its gVisor sandbox) handed over with
// every task of its gVisor kernel stopped (`runsc pause`, which the
// sentry does itself: the cgroup freezer, stopping the sentry and its
// systrap stubs from outside, left the next guest process to die of
// SIGSEGV or SIGKILL after the thaw), and new sandboxes made as copies
// of one. A sandbox made from an image that holds a workspace or
// a tmp (a snapshot) starts with copies of them (seed, in Create).
// A fork with memory restores the source's runsc checkpoint into each
// copy; a snapshot with memory hands it over with the files (fork.go).

import (
	"context"
	"fmt"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/registry"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/seed"
)

var (
	_ backend.Snapshotter = (*Backend)(nil)
	_ backend.Forker      = (*Backend)(nil)
)

// seed gives a sandbox being created its seed (the spec's, or its
// image's workspace and tmp), owned by the guest's uid, before it boots.
func (b *Backend) seed(ctx context.Context, sb *sandbox, spec backend.Spec) error {
	s := spec.Seed
	if s.IsZero() {
		s = spec.Image.Seed()
	}
	if s.IsZero() {
		return nil
	}
	return seed.Copy(ctx, s, sb.workDir(), sb.tmpDir(), hostfs.Owner{UID: guestUID, GID: guestGID}, nil)
}

// hold stops every task of sb's gVisor sandbox, if it runs, for a copy of
// its files; release lets them go on. A sandbox not booted (re-adopted,
// no command since) runs nothing: frozen is false, and nothing writes.
// A daemon that dies meanwhile leaves the gVisor sandbox stopped, which
// the next one resumes when it loads the sandbox (loadPause). A paused
// sandbox (a checkpoint, pause.go) runs nothing either.
func (b *Backend) hold(ctx context.Context, sb *sandbox) (release func(), frozen bool) {
	noop := func() {}
	sb.initMu.Lock()
	booted, paused := sb.init != nil && !sb.gone, sb.paused
	sb.initMu.Unlock()
	if paused {
		return noop, true // its checkpoint: nothing of it runs
	}
	if !booted {
		return noop, false
	}
	log := b.log.With("sandbox", sb.id)
	if out, err := b.cli(ctx, cliTimeout, "pause", sb.containerID()); err != nil {
		log.Warn("cannot pause the gVisor sandbox; its files are copied as they are", "error", err, "output", string(out))
		return noop, false
	}
	return func() {
		if out, err := b.cli(context.WithoutCancel(ctx), cliTimeout, "resume", sb.containerID()); err != nil {
			log.Error("cannot resume the gVisor sandbox after copying its files; its processes stay stopped until its destroy", "error", err, "output", string(out))
		}
	}, true
}

// SnapshotFiles implements backend.Snapshotter.
func (b *Backend) SnapshotFiles(ctx context.Context, id string, opts backend.SnapshotOptions, fn func(backend.SandboxFiles) error) error {
	if opts.Memory {
		return b.snapshotWithMemory(ctx, id, fn)
	}
	sb, err := b.lookup(id)
	if err != nil {
		return err
	}
	ctx, done, err := sb.ops.Begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	release, frozen := b.hold(ctx, sb)
	defer release()
	return fn(backend.SandboxFiles{Workspace: sb.workDir(), Tmp: sb.tmpDir(), Frozen: frozen})
}

// specOf is the spec a sandbox was created with, from its settings.
func specOf(s persistedSpec) backend.Spec {
	spec := backend.Spec{Env: s.Env, Resources: s.Resources}
	if s.Network == networkAllowlist {
		spec.AllowEgressTo, spec.AllowEgressToCIDRs = s.AllowEgressTo, s.AllowEgressToCIDRs
	}
	if s.Image != nil {
		spec.Image = backend.Image{Name: s.Image.Name, Digest: s.Image.Digest, Root: s.Image.Root, Env: s.Image.Env}
	}
	return spec
}

// Fork implements backend.Forker: each new sandbox is created (and booted)
// as Create makes any, with the source's settings and its files as the
// seed, the source's gVisor sandbox frozen until the last is made.
func (b *Backend) Fork(ctx context.Context, id string, newIDs []string, opts backend.SnapshotOptions) (_ backend.ForkResult, err error) {
	if opts.Memory {
		return b.forkWithMemory(ctx, id, newIDs)
	}
	src, err := b.lookup(id)
	if err != nil {
		return backend.ForkResult{}, err
	}
	ctx, done, err := src.ops.Begin(ctx)
	if err != nil {
		return backend.ForkResult{}, err
	}
	defer done()
	var saved persistedSpec
	if err := registry.LoadSpec(b.sandboxDir(id), id, specVersion, &saved); err != nil {
		return backend.ForkResult{}, err
	}
	spec := specOf(saved)
	spec.Seed = backend.Seed{Workspace: src.workDir(), Tmp: src.tmpDir(), KeepModes: true}
	release, frozen := b.hold(ctx, src)
	defer release()
	infos, err := backend.CreateEach(ctx, b, newIDs, spec, func(nid string, derr error) {
		b.log.Error("cannot remove a sandbox of a failed fork", "sandbox", nid, "error", derr)
	})
	if err != nil {
		return backend.ForkResult{}, fmt.Errorf("fork of sandbox %s: %w", id, err)
	}
	res := backend.ForkResult{Infos: infos, Frozen: frozen}
	b.log.Info("sandbox forked", "sandbox", id, "forks", newIDs, "frozen", frozen)
	return res, nil
}
