package ipc

import (
	"context"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// Pause stops every process of a sandbox until it is used or resumed.
func (c *Client) Pause(ctx context.Context, sandbox string) (api.PauseResult, error) {
	return call[api.PauseResult](ctx, c, OpPause, api.SandboxRequest{Sandbox: sandbox})
}

// Resume lets a paused sandbox's processes run again.
func (c *Client) Resume(ctx context.Context, sandbox string) (api.PauseResult, error) {
	return call[api.PauseResult](ctx, c, OpResume, api.SandboxRequest{Sandbox: sandbox})
}
