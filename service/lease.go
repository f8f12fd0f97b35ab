package service

import (
	"context"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// The run-scoped ops: renew, attach/release, tags, destroy_run, gc.

func (s *Service) renew(ctx context.Context, c lifecycle.Caller, r api.RenewRequest, a *audit) (any, error) {
	id := r.Sandbox
	a.sandbox(id)
	sb, err := s.m.Renew(ctx, c, id, seconds(r.TTLS))
	if err != nil {
		return nil, err
	}
	a.add("expires_at", sb.ExpiresAt.Format(time.RFC3339))
	return api.RenewResult{ExpiresAt: unixSeconds(sb.ExpiresAt), RemainingS: max(time.Until(sb.ExpiresAt).Seconds(), 0)}, nil
}

func (s *Service) attach(ctx context.Context, c lifecycle.Caller, r api.AttachRequest, a *audit) (any, error) {
	id, owner, holder := r.Sandbox, r.Owner, r.Holder
	a.sandbox(id)
	a.add("attach_owner", owner, "attach_holder", holder)
	sb, err := s.m.Attach(ctx, c, id, owner, holder)
	if err != nil {
		return nil, err
	}
	return api.AttachResult{
		RemainingS: max(time.Until(sb.ExpiresAt).Seconds(), 0),
		ExpiresAt:  unixSeconds(sb.ExpiresAt),
		Workdir:    sb.Workdir,
		Network:    sb.NetSpec,
		Holder:     sb.Holder,
	}, nil
}

func (s *Service) release(ctx context.Context, c lifecycle.Caller, r api.ReleaseRequest, a *audit) (any, error) {
	id, holder := r.Sandbox, r.Holder
	a.sandbox(id)
	a.add("release_holder", holder)
	released, err := s.m.Release(ctx, c, id, holder)
	if err != nil {
		return nil, err
	}
	a.add("released", released)
	return api.ReleaseResult{Released: released}, nil
}

func (s *Service) readTags(ctx context.Context, c lifecycle.Caller, r api.SandboxRequest, a *audit) (any, error) {
	id := r.Sandbox
	a.sandbox(id)
	tags, err := s.m.ReadTags(ctx, c, id)
	if err != nil {
		return nil, err
	}
	return api.TagsResult{Tags: tags}, nil
}

func (s *Service) writeTags(ctx context.Context, c lifecycle.Caller, r api.WriteTagsRequest, a *audit) (any, error) {
	id, tags := r.Sandbox, r.Tags
	a.sandbox(id)
	a.add("tags", tags)
	out, err := s.m.WriteTags(ctx, c, id, tags)
	if err != nil {
		return nil, err
	}
	return api.TagsResult{Tags: out}, nil
}

func (s *Service) destroyRun(ctx context.Context, c lifecycle.Caller, r api.DestroyRunRequest, a *audit) (any, error) {
	owner := r.Owner
	a.add("owner", owner)
	ids, err := s.m.DestroyRun(ctx, c, owner)
	a.add("destroyed", ids)
	if err != nil {
		return nil, err
	}
	if ids == nil {
		ids = []string{}
	}
	return api.DestroyRunResult{Destroyed: ids}, nil
}

// gc sweeps orphans and reaps expired sandboxes now; admins only.
func (s *Service) gc(ctx context.Context, c lifecycle.Caller, r api.GCRequest, a *audit) (any, error) {
	dryRun := r.DryRun
	if !c.Admin {
		return nil, ipc.Errorf(ipc.CodeUnauthorized, "gc is for admins (root, the daemon's user, or an admin group)")
	}
	swept, err := s.m.Sweep(ctx, dryRun)
	reaped := 0
	if !dryRun {
		reaped = s.m.Reap()
		// And what interrupted imports and image removals left.
		if g, ok := s.images.(interface{ GC() (int, error) }); ok {
			n, gerr := g.GC()
			a.add("image_debris", n)
			if gerr != nil {
				s.log.Warn("the image store's gc failed", "error", gerr)
			}
		}
	}
	a.add("dry_run", dryRun, "swept", swept, "reaped", reaped)
	if err != nil {
		return nil, err
	}
	if swept == nil {
		swept = []string{}
	}
	return api.GCResult{Swept: swept, Reaped: reaped, DryRun: dryRun}, nil
}
