package service

import (
	"context"
	"fmt"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// The code contexts' ops (docs/protocol.md, "Code contexts").

// runCodeReservation: run_command's for the two streams, and the results
// (kept within max_output_bytes: their decoded values, the copy the result
// carries and its encoding, base64 and JSON on the way in).
func runCodeReservation(maxOutputBytes int) int64 {
	return runCommandReservation(maxOutputBytes) + 4*int64(maxOutputBytes)
}

// codeOutputCap is run_code's cap on max_output_bytes: three fifths of
// run_command's (maxOutputBytes), so that a cell's three outputs reserve
// no more than a command's two, and every configuration that holds a
// command's response holds a cell's.
func codeOutputCap(maxOutputBytes int) int {
	return int(int64(maxOutputBytes) * 6 / 10)
}

func (s *Service) runCode(ctx context.Context, c lifecycle.Caller, r *ipc.Request, w api.RunCodeRequest, a *audit) (any, error) {
	req := backend.CodeRequest{Context: w.Context, Code: w.Code}
	if req.Context == "" {
		req.Context = backend.DefaultContext
	}
	if !validContextName(req.Context) {
		return nil, ipc.Errorf(ipc.CodeBadRequest, `argument "context" must be 1 to 64 letters, digits, '.', '_' or '-', got %q`, truncateRunes(req.Context, 80))
	}
	timeout := s.lim.DefaultTimeout
	if w.TimeoutS > 0 {
		timeout = seconds(w.TimeoutS)
	}
	req.Timeout = min(timeout, s.lim.MaxTimeout)
	cellCap := codeOutputCap(s.lim.MaxOutputBytes)
	req.MaxOutputBytes = min(deref(w.MaxOutputBytes, s.lim.DefaultOutputBytes), cellCap)
	send := ipc.Events(ctx)
	if w.Stream && send == nil {
		return nil, ipc.Errorf(ipc.CodeBadRequest, `"stream" needs a connection that can carry events`)
	}
	if err := r.ReserveResponse(ctx, runCodeReservation(req.MaxOutputBytes)); err != nil {
		return nil, err
	}
	a.sandbox(w.Sandbox)
	a.add("context", req.Context, "code", truncateRunes(w.Code, 200))
	var out *outputStream
	if w.Stream {
		if err := r.ReserveResponse(ctx, streamWindowBytes); err != nil {
			return nil, err
		}
		out = startStream(ctx, send)
		req.Output = out.output
	}
	res, err := s.m.RunCode(ctx, c, w.Sandbox, req)
	var dropOut, dropErr int64
	if out != nil {
		dropOut, dropErr = out.finish()
	}
	if err != nil {
		return nil, err
	}
	a.add("execution_count", res.ExecutionCount, "reason", res.Reason(), "results", len(res.Results), "cell_duration_ms", res.Duration.Milliseconds())
	result := api.RunCodeResult{
		Stdout: nonNil(res.Stdout), Stderr: nonNil(res.Stderr), StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
		Results: make([]api.Bundle, len(res.Results)), ResultsTruncated: res.ResultsTruncated,
		ExecutionCount: res.ExecutionCount, DurationS: res.Duration.Seconds(),
		TimedOut: res.TimedOut, ContextLost: res.ContextLost, OOMKilled: res.OOMKilled, Reason: res.Reason(),
	}
	for i, b := range res.Results {
		result.Results[i] = api.Bundle(b)
	}
	if e := res.Error; e != nil {
		result.Error = &api.CodeError{Name: e.Name, Value: e.Value, Traceback: nonNilList(e.Traceback)}
	}
	if out != nil {
		result.StdoutStreamDropped, result.StderrStreamDropped = &dropOut, &dropErr
	}
	return result, nil
}

func (s *Service) listContexts(ctx context.Context, c lifecycle.Caller, r api.SandboxRequest, a *audit) (any, error) {
	a.sandbox(r.Sandbox)
	list, err := s.m.ListContexts(ctx, c, r.Sandbox)
	if err != nil {
		return nil, err
	}
	out := make([]api.ContextInfo, len(list))
	for i, x := range list {
		out[i] = api.ContextInfo{Context: x.Name, Running: x.Running, ExecutionCount: x.ExecutionCount}
	}
	return api.ListContextsResult{Contexts: out}, nil
}

// endContext serves delete_context and restart_context (end, the
// manager's DeleteContext or RestartContext): either ends the context's
// process and state; a restarted one stays, fresh.
func (s *Service) endContext(ctx context.Context, c lifecycle.Caller, r api.ContextRequest, a *audit,
	end func(ctx context.Context, c lifecycle.Caller, id, name string) error) (any, error) {
	if !validContextName(r.Context) {
		return nil, fmt.Errorf("%w: %q", backend.ErrContextNotFound, truncateRunes(r.Context, 80))
	}
	a.sandbox(r.Sandbox)
	a.add("context", r.Context)
	return api.ContextResult{}, end(ctx, c, r.Sandbox, r.Context)
}

func validContextName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
