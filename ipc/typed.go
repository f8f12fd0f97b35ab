package ipc

import (
	"context"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// The client's typed methods: one per op, with ipc/api's request and
// result types, so a Go caller never spells a key of the wire.

func call[R any](ctx context.Context, c *Client, op string, req any) (R, error) {
	var res R
	err := c.Call(ctx, op, req, &res)
	return res, err
}

// Hello negotiates the protocol and returns the daemon's limits.
func (c *Client) Hello(ctx context.Context, req api.HelloRequest) (api.HelloResult, error) {
	return call[api.HelloResult](ctx, c, OpHello, req)
}

// Health reports the daemon's and the backend's state.
func (c *Client) Health(ctx context.Context) (api.HealthResult, error) {
	return call[api.HealthResult](ctx, c, OpHealth, nil)
}

// Create makes a sandbox.
func (c *Client) Create(ctx context.Context, req api.CreateRequest) (api.CreateResult, error) {
	return call[api.CreateResult](ctx, c, OpCreate, req)
}

// RunCommand runs one command in a sandbox.
func (c *Client) RunCommand(ctx context.Context, req api.RunCommandRequest) (api.RunCommandResult, error) {
	return call[api.RunCommandResult](ctx, c, OpRunCommand, req)
}

// ReadFile reads a file of a sandbox.
func (c *Client) ReadFile(ctx context.Context, req api.ReadFileRequest) (api.ReadFileResult, error) {
	return call[api.ReadFileResult](ctx, c, OpReadFile, req)
}

// WriteFile writes a file into a sandbox.
func (c *Client) WriteFile(ctx context.Context, req api.WriteFileRequest) (api.WriteFileResult, error) {
	return call[api.WriteFileResult](ctx, c, OpWriteFile, req)
}

// ListDirectory lists a directory of a sandbox.
func (c *Client) ListDirectory(ctx context.Context, req api.ListDirectoryRequest) (api.ListDirectoryResult, error) {
	return call[api.ListDirectoryResult](ctx, c, OpListDirectory, req)
}

// Destroy destroys a sandbox (idempotent).
func (c *Client) Destroy(ctx context.Context, sandbox string) error {
	_, err := call[api.DestroyResult](ctx, c, OpDestroy, api.SandboxRequest{Sandbox: sandbox})
	return err
}

// List lists the sandboxes the peer may see, optionally of one owner.
func (c *Client) List(ctx context.Context, owner string) (api.ListResult, error) {
	return call[api.ListResult](ctx, c, OpList, api.ListRequest{Owner: owner})
}

// Renew extends an expiring sandbox's life.
func (c *Client) Renew(ctx context.Context, req api.RenewRequest) (api.RenewResult, error) {
	return call[api.RenewResult](ctx, c, OpRenew, req)
}

// Attach claims a sandbox of owner for holder.
func (c *Client) Attach(ctx context.Context, req api.AttachRequest) (api.AttachResult, error) {
	return call[api.AttachResult](ctx, c, OpAttach, req)
}

// Release gives up holder's claim.
func (c *Client) Release(ctx context.Context, req api.ReleaseRequest) (api.ReleaseResult, error) {
	return call[api.ReleaseResult](ctx, c, OpRelease, req)
}

// ReadTags returns a sandbox's tags.
func (c *Client) ReadTags(ctx context.Context, sandbox string) (api.TagsResult, error) {
	return call[api.TagsResult](ctx, c, OpReadTags, api.SandboxRequest{Sandbox: sandbox})
}

// WriteTags writes tags of a sandbox.
func (c *Client) WriteTags(ctx context.Context, req api.WriteTagsRequest) (api.TagsResult, error) {
	return call[api.TagsResult](ctx, c, OpWriteTags, req)
}

// DestroyRun destroys every sandbox of owner the peer may destroy.
func (c *Client) DestroyRun(ctx context.Context, owner string) (api.DestroyRunResult, error) {
	return call[api.DestroyRunResult](ctx, c, OpDestroyRun, api.DestroyRunRequest{Owner: owner})
}

// GC sweeps orphans and reaps now (admins only).
func (c *Client) GC(ctx context.Context, req api.GCRequest) (api.GCResult, error) {
	return call[api.GCResult](ctx, c, OpGC, req)
}

// ImageList lists the images a create may name.
func (c *Client) ImageList(ctx context.Context) (api.ImageListResult, error) {
	return call[api.ImageListResult](ctx, c, OpImageLs, nil)
}

// ImageInspect describes one image.
func (c *Client) ImageInspect(ctx context.Context, name string) (api.ImageInspectResult, error) {
	return call[api.ImageInspectResult](ctx, c, OpImageInspect, api.ImageRequest{Name: name})
}

// ImageRemove removes an image (admins only).
func (c *Client) ImageRemove(ctx context.Context, name string) (api.ImageRemoveResult, error) {
	return call[api.ImageRemoveResult](ctx, c, OpImageRm, api.ImageRequest{Name: name})
}

// StartCommand starts a durable process (or finds it by its name).
func (c *Client) StartCommand(ctx context.Context, req api.StartCommandRequest) (api.StartCommandResult, error) {
	return call[api.StartCommandResult](ctx, c, OpStartCommand, req)
}

// ReadOutput reads one stream of a durable process from an offset.
func (c *Client) ReadOutput(ctx context.Context, req api.ReadOutputRequest) (api.ReadOutputResult, error) {
	return call[api.ReadOutputResult](ctx, c, OpReadOutput, req)
}

// WaitProcess waits for a durable process's end, up to req.TimeoutS.
func (c *Client) WaitProcess(ctx context.Context, req api.WaitProcessRequest) (api.ProcessInfo, error) {
	return call[api.ProcessInfo](ctx, c, OpWaitProcess, req)
}

// SignalProcess sends a signal to a durable process's group.
func (c *Client) SignalProcess(ctx context.Context, req api.SignalProcessRequest) error {
	_, err := call[api.SignalProcessResult](ctx, c, OpSignalProcess, req)
	return err
}

// ListProcesses lists a sandbox's durable processes.
func (c *Client) ListProcesses(ctx context.Context, sandbox string) (api.ListProcessesResult, error) {
	return call[api.ListProcessesResult](ctx, c, OpListProcesses, api.SandboxRequest{Sandbox: sandbox})
}

// RunCode runs a cell of Python in one of a sandbox's code contexts.
func (c *Client) RunCode(ctx context.Context, req api.RunCodeRequest) (api.RunCodeResult, error) {
	return call[api.RunCodeResult](ctx, c, OpRunCode, req)
}

// ListContexts lists a sandbox's code contexts.
func (c *Client) ListContexts(ctx context.Context, sandbox string) (api.ListContextsResult, error) {
	return call[api.ListContextsResult](ctx, c, OpListContexts, api.SandboxRequest{Sandbox: sandbox})
}

// RestartContext ends a code context's state; its next cell starts afresh.
func (c *Client) RestartContext(ctx context.Context, req api.ContextRequest) error {
	_, err := call[api.ContextResult](ctx, c, OpRestartContext, req)
	return err
}

// DeleteContext ends a code context.
func (c *Client) DeleteContext(ctx context.Context, req api.ContextRequest) error {
	_, err := call[api.ContextResult](ctx, c, OpDeleteContext, req)
	return err
}
