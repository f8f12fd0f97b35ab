package service

import (
	"context"
	"fmt"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/procstore"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// The durable processes' ops (docs/protocol.md, "Durable processes").

func (s *Service) startCommand(ctx context.Context, c lifecycle.Caller, r api.StartCommandRequest, a *audit) (any, error) {
	req := backend.ProcessRequest{Name: r.Name, Command: r.Command, Argv: r.Argv, Stdin: r.Stdin, Env: r.Env, Cwd: r.Cwd}
	switch {
	case r.Command != "" && r.Argv != nil:
		return nil, ipc.Errorf(ipc.CodeBadRequest, `give either "command" or "argv", not both`)
	case r.Command == "" && r.Argv == nil:
		return nil, ipc.Errorf(ipc.CodeBadRequest, `argument "command" (a shell string) or "argv" (a list of strings) is required`)
	case r.Name != "" && !backend.ValidProcessName(r.Name):
		return nil, ipc.Errorf(ipc.CodeBadRequest, "argument \"name\" must be 1 to %d letters, digits, '.', '_' or '-', got %q", backend.MaxProcessNameLen, truncateRunes(r.Name, 200))
	}
	if r.TimeoutS > 0 {
		req.Timeout = min(seconds(r.TimeoutS), s.lim.MaxTimeout)
	}
	cmdText := r.Command
	if cmdText == "" {
		cmdText = fmt.Sprintf("%q", r.Argv)
	}
	a.sandbox(r.Sandbox)
	a.add("command", truncateRunes(cmdText, 200), "name", r.Name)
	p, err := s.m.StartProcess(ctx, c, r.Sandbox, req)
	if err != nil {
		return nil, err
	}
	a.add("process", p.ID, "existing", p.Existing)
	return api.StartCommandResult{Process: p.ID, Name: p.Name, Existing: p.Existing, Running: p.Running}, nil
}

// maxProcessWait bounds one wait of read_output or wait_process: a
// follower asks again.
const maxProcessWait = 10 * time.Minute

func (s *Service) readOutput(ctx context.Context, c lifecycle.Caller, req *ipc.Request, r api.ReadOutputRequest, a *audit) (any, error) {
	var stderr bool
	switch r.Stream {
	case "stdout":
	case "stderr":
		stderr = true
	default:
		return nil, ipc.Errorf(ipc.CodeBadRequest, `argument "stream" must be "stdout" or "stderr", got %q`, truncateRunes(r.Stream, 50))
	}
	maxBytes := min(deref(r.MaxBytes, s.lim.DefaultOutputBytes), s.lim.MaxOutputBytes)
	if err := req.ReserveResponse(ctx, readFileReservation(int64(maxBytes))); err != nil {
		return nil, err
	}
	a.sandbox(r.Sandbox)
	a.add("process", r.Process, "stream", r.Stream, "offset", r.Offset)
	out, err := s.m.ReadOutput(ctx, c, r.Sandbox, r.Process, stderr, r.Offset, maxBytes, min(seconds(r.WaitS), maxProcessWait))
	if err != nil {
		return nil, err
	}
	a.add("bytes", len(out.Data))
	res := api.ReadOutputResult{Data: nonNil(out.Data), Offset: out.Offset, Dropped: out.Dropped, NextOffset: out.NextOffset, Running: out.Process.Running}
	if !out.Process.Running {
		res.ExitCode, res.Reason = &out.Process.ExitCode, out.Process.Reason
	}
	return res, nil
}

func (s *Service) waitProcess(ctx context.Context, c lifecycle.Caller, r api.WaitProcessRequest, a *audit) (any, error) {
	a.sandbox(r.Sandbox)
	a.add("process", r.Process)
	p, err := s.m.WaitProcess(ctx, c, r.Sandbox, r.Process, min(seconds(r.TimeoutS), maxProcessWait))
	if err != nil {
		return nil, err
	}
	return processInfo(p), nil
}

func (s *Service) signalProcess(ctx context.Context, c lifecycle.Caller, r api.SignalProcessRequest, a *audit) (any, error) {
	sig, ok := procstore.Signals[r.Signal]
	if !ok {
		return nil, ipc.Errorf(ipc.CodeBadRequest, `argument "signal" must be one of %s, got %q`, procstore.SignalNames(), truncateRunes(r.Signal, 50))
	}
	a.sandbox(r.Sandbox)
	a.add("process", r.Process, "signal", r.Signal)
	if err := s.m.SignalProcess(ctx, c, r.Sandbox, r.Process, sig); err != nil {
		return nil, err
	}
	return api.SignalProcessResult{}, nil
}

func (s *Service) listProcesses(ctx context.Context, c lifecycle.Caller, r api.SandboxRequest, a *audit) (any, error) {
	a.sandbox(r.Sandbox)
	list, err := s.m.ListProcesses(ctx, c, r.Sandbox)
	if err != nil {
		return nil, err
	}
	out := make([]api.ProcessInfo, len(list))
	for i, p := range list {
		out[i] = processInfo(p)
	}
	return api.ListProcessesResult{Processes: out}, nil
}

// processInfo is p on the wire.
func processInfo(p backend.ProcessInfo) api.ProcessInfo {
	out := api.ProcessInfo{Process: p.ID, Name: p.Name, Command: p.Command, Argv: p.Argv, Running: p.Running,
		StartedAt: unixSeconds(p.StartedAt), StdoutBytes: p.StdoutBytes, StderrBytes: p.StderrBytes}
	if !p.Running {
		code := p.ExitCode
		out.ExitCode, out.Reason = &code, p.Reason
		if !p.EndedAt.IsZero() {
			ended := unixSeconds(p.EndedAt)
			out.EndedAt = &ended
		}
	}
	return out
}
