package service

import (
	"context"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// The run-scoped ops: renew, attach/release, tags, destroy_run, gc.

func (s *Service) renew(ctx context.Context, c lifecycle.Caller, args *ipc.Args, a *audit) (any, error) {
	id := args.String("sandbox", true)
	ttl := args.Float("ttl_s", 0)
	if args.Err() == nil && ttl <= 0 {
		args.Failf(`argument "ttl_s" is required and must be greater than 0`)
	}
	if err := args.Done("argument"); err != nil {
		return nil, err
	}
	a.sandbox(id)
	sb, err := s.m.Renew(ctx, c, id, seconds(ttl))
	if err != nil {
		return nil, err
	}
	a.add("expires_at", sb.ExpiresAt.Format(time.RFC3339))
	return api.RenewResult{ExpiresAt: unixSeconds(sb.ExpiresAt), RemainingS: max(time.Until(sb.ExpiresAt).Seconds(), 0)}, nil
}

func (s *Service) attach(ctx context.Context, c lifecycle.Caller, args *ipc.Args, a *audit) (any, error) {
	id := args.String("sandbox", true)
	owner := args.String("owner", true)
	holder := args.String("holder", true)
	if err := args.Done("argument"); err != nil {
		return nil, err
	}
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

func (s *Service) release(ctx context.Context, c lifecycle.Caller, args *ipc.Args, a *audit) (any, error) {
	id := args.String("sandbox", true)
	holder := args.String("holder", true)
	if err := args.Done("argument"); err != nil {
		return nil, err
	}
	a.sandbox(id)
	a.add("release_holder", holder)
	released, err := s.m.Release(ctx, c, id, holder)
	if err != nil {
		return nil, err
	}
	a.add("released", released)
	return api.ReleaseResult{Released: released}, nil
}

func (s *Service) readTags(ctx context.Context, c lifecycle.Caller, args *ipc.Args, a *audit) (any, error) {
	id := args.String("sandbox", true)
	if err := args.Done("argument"); err != nil {
		return nil, err
	}
	a.sandbox(id)
	tags, err := s.m.ReadTags(ctx, c, id)
	if err != nil {
		return nil, err
	}
	return api.TagsResult{Tags: tags}, nil
}

func (s *Service) writeTags(ctx context.Context, c lifecycle.Caller, args *ipc.Args, a *audit) (any, error) {
	id := args.String("sandbox", true)
	tags := args.StringMap("tags", lifecycle.MaxTags)
	if args.Err() == nil && tags == nil {
		args.Failf(`argument "tags" (a map of strings) is required`)
	}
	if err := args.Done("argument"); err != nil {
		return nil, err
	}
	a.sandbox(id)
	a.add("tags", tags)
	out, err := s.m.WriteTags(ctx, c, id, tags)
	if err != nil {
		return nil, err
	}
	return api.TagsResult{Tags: out}, nil
}

func (s *Service) destroyRun(ctx context.Context, c lifecycle.Caller, args *ipc.Args, a *audit) (any, error) {
	owner := args.String("owner", true)
	if err := args.Done("argument"); err != nil {
		return nil, err
	}
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
func (s *Service) gc(ctx context.Context, c lifecycle.Caller, args *ipc.Args, a *audit) (any, error) {
	dryRun := args.Bool("dry_run", false)
	if err := args.Done("argument"); err != nil {
		return nil, err
	}
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
