package bwrap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap/bwwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/cellres"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/proclog"
	"github.com/sandbox-sidecar/sandbox-sidecar/capture"
)

// Code contexts (backend.CodeRunner): the sandbox's init runs each cell in
// its context (backend/agent's Contexts: a fork of a zygote that preloaded
// the image's modules); the daemon makes the cell's stdout and stderr
// pipes and its results stream, reads all three, and hears how the cell
// ended on a status socket.

var _ backend.CodeRunner = (*Backend)(nil)

// RunCode implements backend.CodeRunner.
func (b *Backend) RunCode(ctx context.Context, id string, req backend.CodeRequest) (backend.CodeResult, error) {
	sb, err := b.lookup(id)
	if err != nil {
		return backend.CodeResult{}, err
	}
	if req.Context == "" {
		req.Context = backend.DefaultContext
	}
	if !agent.ValidContextName(req.Context) {
		return backend.CodeResult{}, fmt.Errorf("%w: a context name is 1 to %d letters, digits, '.', '_' or '-', not %q", backend.ErrInvalidArgument, agent.MaxContextName, req.Context)
	}
	env, err := backend.MergeEnv(sb.baseEnv(), sb.env, req.Env)
	if err != nil {
		return backend.CodeResult{}, err
	}
	opCtx, done, err := sb.begin(ctx)
	if err != nil {
		return backend.CodeResult{}, err
	}
	defer done()
	ip, err := b.liveInit(opCtx, sb)
	if err != nil {
		return backend.CodeResult{}, err
	}
	log := b.log.With("sandbox", sb.id, "context", req.Context)

	streams, err := capture.NewStreams(nil, req.MaxOutputBytes)
	if err != nil {
		return backend.CodeResult{}, fmt.Errorf("%w: cannot create pipes for a cell in sandbox %s: %v", backend.ErrUnavailable, sb.id, err)
	}
	streams.SetOutput(backend.OutputFunc(req.Output))
	results, resultsInit, err := streamPair("sandbox-cell-results")
	if err != nil {
		streams.Close()
		return backend.CodeResult{}, fmt.Errorf("%w: prepare a cell for sandbox %s: %v", backend.ErrUnavailable, sb.id, err)
	}
	defer results.Close()
	status, statusInit, err := seqpacketPair("sandbox-cell-status")
	if err != nil {
		streams.Close()
		resultsInit.Close()
		return backend.CodeResult{}, fmt.Errorf("%w: prepare a cell for sandbox %s: %v", backend.ErrUnavailable, sb.id, err)
	}
	defer status.Close()

	applied := req.Timeout
	grace := b.cfg.KillGrace
	image := backend.HostImage
	if sb.image != nil {
		image = sb.image.Name
	}
	payload := bwwire.CodeRequest{Context: req.Context, Code: []byte(req.Code), Env: env, Preload: b.cfg.Code.PreloadFor(image),
		Timeout: applied, Grace: grace, MaxContexts: uint32(b.cfg.Code.MaxContexts)}.Encode()
	child := streams.ChildFDs()
	fds := []int{int(statusInit.Fd()), child[1], child[2], int(resultsInit.Fd())}
	m := bwwire.Msg{Kind: bwwire.MsgCode, A: uint32(len(payload))}
	if len(payload) > bwwire.MaxInlineRequest {
		mem, err := memFile("sandbox-cell-request", "")
		if err == nil {
			defer mem.Close()
			_, err = mem.Write(payload)
		}
		if err != nil {
			streams.Close()
			statusInit.Close()
			resultsInit.Close()
			return backend.CodeResult{}, fmt.Errorf("%w: prepare a cell for sandbox %s: %v", backend.ErrUnavailable, sb.id, err)
		}
		fds, payload, m.A = append(fds, int(mem.Fd())), nil, 0
	}
	oomBefore := ip.oom.read()
	start := time.Now()
	outer := start.Add(applied + grace + b.cfg.ExecGrace)
	if applied == 0 {
		outer = start.Add(backend.MaxTimeout)
	}
	sendErr := ip.sendMsg(m, payload, fds, start.Add(initAnswerTimeout))
	statusInit.Close()
	resultsInit.Close()
	if sendErr != nil {
		streams.Close()
		return backend.CodeResult{}, fmt.Errorf("%w: cannot hand sandbox %s's init a cell: %v", backend.ErrUnavailable, sb.id, sendErr)
	}
	streams.Start()

	// The results stream is read to its end in the background: a context
	// never blocks on it, and what is kept is bounded (cellres).
	read := make(chan cellres.Results, 1)
	go func() { read <- cellres.Read(results, max(req.MaxOutputBytes, 1)) }()

	end, failed, err := b.cellEnd(opCtx, status, outer)
	// One grace, from the cell's end, for its pipes and its results stream
	// alike (a process the cell left may hold either open).
	drained := time.Now().Add(initDrainGrace)
	out := streams.Finish(initDrainGrace)
	res := backend.CodeResult{
		Stdout: out.Stdout, Stderr: out.Stderr, StdoutTruncated: out.StdoutTruncated, StderrTruncated: out.StderrTruncated,
		Duration: time.Since(start),
	}
	if failed != nil {
		_ = results.SetReadDeadline(time.Now())
		<-read
		return res, failed
	}
	if err != nil {
		_ = results.SetReadDeadline(time.Now())
		<-read
		switch {
		case errors.Is(context.Cause(opCtx), errSandboxDestroyed):
			res.ContextLost = true
			return res, nil
		case opCtx.Err() == nil:
			// The cell outlived every bound, or init went away: its
			// context is ended with it. (A request that went away leaves
			// the cell to its budget: its output goes nowhere.)
			_ = b.deleteContext(context.WithoutCancel(ctx), sb, req.Context)
		}
		return res, err
	}
	var r cellres.Results
	wait := time.NewTimer(max(time.Until(drained), 0))
	select {
	case r = <-read:
	case <-wait.C:
		// The context (or a process it left) holds the stream open past
		// the cell's end: what was read is what there is.
		_ = results.SetReadDeadline(time.Now())
		r = <-read
	}
	wait.Stop()
	res.Results, res.ResultsTruncated, res.Error, res.ExecutionCount = r.Bundles, r.Truncated, r.Error, r.Count
	if end.Count > 0 {
		// The agent's count is the truth: a cell can write its own
		// results stream (a forged "done" frame), not the agent's count.
		res.ExecutionCount = end.Count
	}
	if r.Malformed != nil {
		log.Warn("a cell's results stream was malformed; what came before is kept", "error", r.Malformed)
		res.ResultsTruncated = true
	}
	if !r.Done && !end.Lost {
		// The cell ended in its context without its last frame (it closed
		// or broke its own results stream): what it said may be missing.
		res.ResultsTruncated = true
	}
	res.TimedOut = end.Timed != proclog.TimedNo
	res.ContextLost = end.Lost
	if end.Lost {
		res.OOMKills = ip.oom.read() - oomBefore
		res.OOMKilled = res.OOMKills > 0 && end.How == proclog.EndKilled && end.Code == uint32(syscall.SIGKILL) && end.Timed != proclog.TimedKill
		log.Info("a cell's context was lost", "how", end.How, "code", end.Code, "timed", end.Timed, "oom_kills", res.OOMKills)
	}
	return res, nil
}

// streamPair returns a connected pair of SOCK_STREAM sockets: the
// daemon's end (in the runtime's poller, so reads take deadlines) and the
// other, for the sandbox.
func streamPair(name string) (daemonEnd, other *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, err
	}
	return os.NewFile(uintptr(fds[0]), name), os.NewFile(uintptr(fds[1]), name+"-sandbox"), nil
}

// cellEnd reads the cell's status socket until init says how it ended. A
// cell init could not run is failed (its errno mapped to the backend's
// errors); err is the daemon's own giving up (ctx, the outer deadline,
// init gone).
func (b *Backend) cellEnd(ctx context.Context, status *os.File, outer time.Time) (end agent.CellEnd, failed, err error) {
	stop := context.AfterFunc(ctx, func() { _ = status.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, bwwire.MsgSize+1024)
	started := false
	for {
		deadline := outer
		if !started {
			deadline = earliest(outer, time.Now().Add(initAnswerTimeout+30*time.Second)) // a zygote's first start, and its preloads
		}
		_ = status.SetReadDeadline(deadline)
		n, rerr := status.Read(buf)
		switch {
		case ctx.Err() != nil:
			return end, nil, fmt.Errorf("the cell was stopped because the request ended: %w", ctx.Err())
		case errors.Is(rerr, os.ErrDeadlineExceeded):
			return end, nil, fmt.Errorf("%w: the cell outlived its timeout, the kill grace and the daemon's own grace; its context was ended", backend.ErrUnavailable)
		case rerr != nil || n < bwwire.MsgSize:
			return end, nil, fmt.Errorf("%w: the sandbox's init went away during the cell", backend.ErrUnavailable)
		}
		m, derr := bwwire.DecodeMsg(buf[:bwwire.MsgSize])
		if derr != nil {
			return end, nil, fmt.Errorf("%w: the sandbox's init answered a cell with %v", backend.ErrUnavailable, derr)
		}
		switch m.Kind {
		case bwwire.MsgStarted:
			started = true
		case bwwire.MsgCellEnd:
			return agent.CellEnd{Lost: m.A&1 == 1, Count: int(m.A >> 1), How: m.B, Code: m.C & 0xff, Timed: m.C >> 8}, nil, nil
		case bwwire.MsgFailed:
			reason := string(buf[bwwire.MsgSize:n])
			limit := b.cfg.Code.MaxContexts
			if limit <= 0 {
				limit = agent.DefaultMaxContexts
			}
			return end, cellFailure(unix.Errno(m.A), reason, limit), nil
		default:
			return end, nil, fmt.Errorf("%w: the sandbox's init answered a cell with a message of kind %d", backend.ErrUnavailable, m.Kind)
		}
	}
}

// cellFailure is the error of a cell init could not run.
func cellFailure(errno unix.Errno, reason string, limit int) error {
	return backend.CellFailure(errno, reason, limit)
}

// zygoteStartTimeout bounds a zygote's start: the interpreter's and its
// preloaded modules' imports (seconds for pandas on a loaded host).
const zygoteStartTimeout = initAnswerTimeout + 30*time.Second

// warmCode starts sandbox sb's zygote when its image's contexts preload
// modules (the operator's sign that code runs there), so that a pool
// member's first run_code costs a fork, not the interpreter's start and
// its imports; it waits until the zygote is ready. A zygote that cannot
// start is logged and left for the first cell to report (no python3 in
// the image: no_python); the member stays warm for commands. The caller
// holds sb.initMu.
func (b *Backend) warmCode(ctx context.Context, sb *sandbox, ip *initProc) {
	image := backend.HostImage
	if sb.image != nil {
		image = sb.image.Name
	}
	preload := b.cfg.Code.PreloadFor(image)
	if preload == "" {
		return
	}
	log := b.log.With("sandbox", sb.id)
	env, err := backend.MergeEnv(sb.baseEnv(), sb.env, nil)
	if err != nil {
		log.Warn("the code zygote was not started ahead", "error", err)
		return
	}
	payload := bwwire.CodeRequest{Env: env, Preload: preload, MaxContexts: uint32(b.cfg.Code.MaxContexts)}.Encode()
	if len(payload) > bwwire.MaxInlineRequest {
		log.Warn("the code zygote was not started ahead: the sandbox's environment is too large to send inline", "bytes", len(payload))
		return
	}
	start := time.Now()
	body, answer, err := b.askInitBy(ctx, ip, bwwire.Msg{Kind: bwwire.MsgCodeWarm, A: uint32(len(payload))}, payload, start.Add(zygoteStartTimeout))
	switch {
	case err != nil:
		log.Warn("the code zygote was not started ahead", "error", err)
	case answer.A != bwwire.ProcOK:
		log.Warn("the code zygote could not start; run_code in this sandbox will say why", "reason", body)
	default:
		log.Debug("the code zygote is ready", "preload", preload, "took", time.Since(start))
	}
}

// ListContexts implements backend.CodeRunner.
func (b *Backend) ListContexts(ctx context.Context, id string) ([]backend.ContextInfo, error) {
	sb, err := b.lookup(id)
	if err != nil {
		return nil, err
	}
	sb.initMu.Lock()
	ip, paused := sb.init, sb.paused
	sb.initMu.Unlock()
	if paused {
		return nil, sb.errPaused()
	}
	if ip == nil || !ip.alive() {
		return nil, nil // no init: no context
	}
	body, answer, err := b.askInit(ctx, ip, bwwire.Msg{Kind: bwwire.MsgContextList}, nil)
	if err != nil {
		return nil, err
	}
	if answer.A != bwwire.ProcOK {
		return nil, fmt.Errorf("%w: the sandbox's init refused to list its contexts", backend.ErrUnavailable)
	}
	var out []backend.ContextInfo
	for _, x := range agent.ParseContextList([]byte(body)) {
		out = append(out, backend.ContextInfo{Name: x.Name, Running: x.Running, ExecutionCount: x.Count})
	}
	return out, nil
}

// DeleteContext implements backend.CodeRunner.
func (b *Backend) DeleteContext(ctx context.Context, id, name string) error {
	sb, err := b.lookup(id)
	if err != nil {
		return err
	}
	if !agent.ValidContextName(name) {
		return fmt.Errorf("%w: %q", backend.ErrContextNotFound, name)
	}
	return b.deleteContext(ctx, sb, name)
}

// RestartContext implements backend.CodeRunner.
func (b *Backend) RestartContext(ctx context.Context, id, name string) error {
	sb, err := b.lookup(id)
	if err != nil {
		return err
	}
	if !agent.ValidContextName(name) {
		return fmt.Errorf("%w: %q", backend.ErrContextNotFound, name)
	}
	return b.endContext(ctx, sb, bwwire.MsgContextRestart, name)
}

func (b *Backend) deleteContext(ctx context.Context, sb *sandbox, name string) error {
	return b.endContext(ctx, sb, bwwire.MsgContextDelete, name)
}

// endContext asks init to delete or restart (kind) context name.
func (b *Backend) endContext(ctx context.Context, sb *sandbox, kind uint32, name string) error {
	sb.initMu.Lock()
	ip, paused := sb.init, sb.paused
	sb.initMu.Unlock()
	if paused {
		return sb.errPaused()
	}
	if ip == nil || !ip.alive() {
		return fmt.Errorf("%w: %s", backend.ErrContextNotFound, name)
	}
	_, answer, err := b.askInit(ctx, ip, bwwire.Msg{Kind: kind, A: uint32(len(name))}, []byte(name))
	if err != nil {
		return err
	}
	if answer.A == bwwire.ProcUnknown {
		return fmt.Errorf("%w: %s", backend.ErrContextNotFound, name)
	}
	return nil
}

// askInit sends init m with payload and a reply socket and returns its
// proc done answer and the text after it.
func (b *Backend) askInit(ctx context.Context, ip *initProc, m bwwire.Msg, payload []byte) (string, bwwire.Msg, error) {
	return b.askInitBy(ctx, ip, m, payload, time.Now().Add(procAnswerTimeout))
}

// askInitBy is askInit answered by deadline.
func (b *Backend) askInitBy(ctx context.Context, ip *initProc, m bwwire.Msg, payload []byte, deadline time.Time) (string, bwwire.Msg, error) {
	reply, replyInit, err := seqpacketPair("sandbox-init-reply")
	if err != nil {
		return "", bwwire.Msg{}, fmt.Errorf("%w: %v", backend.ErrUnavailable, err)
	}
	defer reply.Close()
	defer replyInit.Close()
	if err := ip.sendMsg(m, payload, []int{int(replyInit.Fd())}, deadline); err != nil {
		return "", bwwire.Msg{}, fmt.Errorf("%w: cannot reach the sandbox's init: %v", backend.ErrUnavailable, err)
	}
	replyInit.Close()
	stop := context.AfterFunc(ctx, func() { _ = reply.SetReadDeadline(time.Now()) })
	defer stop()
	_ = reply.SetReadDeadline(deadline)
	buf := make([]byte, bwwire.MsgSize+bwwire.MaxProcList)
	n, err := reply.Read(buf)
	if err != nil || n < bwwire.MsgSize {
		return "", bwwire.Msg{}, fmt.Errorf("%w: the sandbox's init did not answer", backend.ErrUnavailable)
	}
	answer, err := bwwire.DecodeMsg(buf[:bwwire.MsgSize])
	if err != nil || answer.Kind != bwwire.MsgProcDone {
		return "", bwwire.Msg{}, fmt.Errorf("%w: the sandbox's init answered with %v", backend.ErrUnavailable, err)
	}
	return string(buf[bwwire.MsgSize:n]), answer, nil
}
