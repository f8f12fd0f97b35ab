package service

import (
	"context"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// The pause ops (docs/protocol.md, "pause and resume").

// statePaused is a paused sandbox's state on the wire: the lifecycle
// keeps it ready (Sandbox.Paused), since it serves every use, resumed
// first.
const statePaused = "paused"

// wireState is a sandbox's state as list and the pause ops report it.
func wireState(sb lifecycle.Sandbox) string {
	if sb.State == lifecycle.StateReady && sb.Paused {
		return statePaused
	}
	return string(sb.State)
}

func (s *Service) pause(ctx context.Context, c lifecycle.Caller, r api.SandboxRequest, a *audit) (any, error) {
	a.sandbox(r.Sandbox)
	sb, err := s.m.Pause(ctx, c, r.Sandbox)
	if err != nil {
		return nil, err
	}
	a.add("memory_released", sb.MemoryReleased)
	return pauseResult(sb), nil
}

func (s *Service) resume(ctx context.Context, c lifecycle.Caller, r api.SandboxRequest, a *audit) (any, error) {
	a.sandbox(r.Sandbox)
	sb, err := s.m.Resume(ctx, c, r.Sandbox)
	if err != nil {
		return nil, err
	}
	return pauseResult(sb), nil
}

func pauseResult(sb lifecycle.Sandbox) api.PauseResult {
	res := api.PauseResult{Sandbox: sb.ID, State: wireState(sb), MemoryReleased: sb.MemoryReleased,
		ExpiresAt: unixSeconds(sb.ExpiresAt), RemainingS: max(time.Until(sb.ExpiresAt).Seconds(), 0)}
	if sb.Paused {
		res.PausedAt = unixSeconds(sb.PausedAt)
	}
	return res
}
