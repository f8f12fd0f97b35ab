package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/cellres"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/proclog"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/registry"
	"github.com/sandbox-sidecar/sandbox-sidecar/capture"
)

// Code contexts (backend.CodeRunner): the sandbox's init runs each cell in
// its context (backend/agent's Contexts, as bwrap's init does: a fork of a
// zygote that preloaded the image's modules, the guest's, under the
// sentry). A cell travels in a code frame on init's stream and its three
// streams come back in cell output frames, then its status
// (gvwire/codewire.go): the daemon keeps the tails of stdout and stderr
// and reads the results through cellres, bounded as bwrap's are. Cells run
// beside a command, as durable processes do; the lifecycle counts a cell
// as a command.

var _ backend.CodeRunner = (*Backend)(nil)

// Bounds of a cell's waits.
const (
	// cellStartTimeout bounds the wait for a cell's start: the zygote's
	// first start and its preloads (an import of pandas takes seconds
	// under gVisor), and the fork of its context.
	cellStartTimeout = 60 * time.Second
	// cellDrainGrace bounds the reading of a cell's results once it
	// ended (they came before its end: this is the decoding of the last).
	cellDrainGrace = 2 * time.Second
)

// errCellAbandoned ends the reading of a cell's results whose RunCode has
// returned.
var errCellAbandoned = errors.New("the cell's caller is gone")

// cellWait is one cell's share of init's stream.
type cellWait struct {
	stdout, stderr *capture.Buffer
	// output, when set, also gets the output as it arrives (the request's
	// Output: it never blocks).
	output  func(stderr bool, p []byte)
	results *io.PipeWriter
	status  chan gvwire.CellStatus // started, then ended or failed
	reader  *io.PipeReader
}

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
	env, err := backend.MergeEnv(sb.baseEnvOf(), sb.env, req.Env)
	if err != nil {
		return backend.CodeResult{}, err
	}
	image := backend.HostImage
	if sb.image != nil {
		image = sb.image.Name
	}
	grace := b.cfg.KillGrace
	payload := agent.CellRequest{Context: req.Context, Code: []byte(req.Code), Env: env, Preload: b.cfg.Code.PreloadFor(image),
		Timeout: req.Timeout, Grace: grace, MaxContexts: uint32(b.cfg.Code.MaxContexts)}.Encode()
	if len(payload) > agent.MaxCellRequest {
		return backend.CodeResult{}, fmt.Errorf("%w: the cell and its environment are %d bytes, more than the %d a cell may be", backend.ErrInvalidArgument, len(payload), agent.MaxCellRequest)
	}
	opCtx, done, err := sb.ops.Begin(ctx)
	if err != nil {
		return backend.CodeResult{}, err
	}
	defer done()
	c, err := b.initForProcs(opCtx, sb)
	if err != nil {
		return backend.CodeResult{}, err
	}
	log := b.log.With("sandbox", sb.id, "context", req.Context)

	maxOut := req.MaxOutputBytes
	if maxOut == 0 {
		maxOut = capture.DefaultMaxOutputBytes
	}
	pr, pw := io.Pipe()
	w := &cellWait{stdout: capture.NewTail(maxOut), stderr: capture.NewTail(maxOut), output: req.Output,
		results: pw, reader: pr, status: make(chan gvwire.CellStatus, 2)}
	seq := c.addCell(w)
	defer c.dropCell(seq)
	// The results are read as they come, in the background: init's
	// stream is never held up for long, and what is kept is bounded
	// (cellres).
	read := make(chan cellres.Results, 1)
	go func() { read <- cellres.Read(pr, max(req.MaxOutputBytes, 1)) }()

	oomBefore := sb.oomKills()
	start := time.Now()
	res := func() backend.CodeResult {
		c.mu.Lock() // no output after this: dropCell follows
		defer c.mu.Unlock()
		return backend.CodeResult{Stdout: w.stdout.Bytes(), Stderr: w.stderr.Bytes(),
			StdoutTruncated: w.stdout.Truncated(), StderrTruncated: w.stderr.Truncated(), Duration: time.Since(start)}
	}
	if err := c.send(gvwire.KindCode, gvwire.Code{Seq: seq, Request: payload}.Encode()); err != nil {
		return backend.CodeResult{}, fmt.Errorf("%w: cannot hand sandbox %s's init a cell: %v", backend.ErrUnavailable, sb.id, err)
	}
	outer := start.Add(req.Timeout + grace + b.cfg.ExecGrace)
	if req.Timeout == 0 {
		outer = start.Add(backend.MaxTimeout)
	}
	deadline := time.NewTimer(time.Until(earliest(outer, start.Add(cellStartTimeout))))
	defer deadline.Stop()
	var end gvwire.CellStatus
	for end.What == 0 {
		select {
		case s := <-w.status:
			switch s.What {
			case gvwire.CellStarted:
				deadline.Reset(time.Until(outer))
			case gvwire.CellEnded:
				end = s
			case gvwire.CellFailed:
				limit := b.cfg.Code.MaxContexts
				if limit <= 0 {
					limit = agent.DefaultMaxContexts
				}
				return res(), backend.CellFailure(syscall.Errno(s.A), s.Reason, limit)
			}
		case <-c.dead:
			r := res()
			sb.initMu.Lock()
			detached := sb.detached
			sb.initMu.Unlock()
			if detached {
				return r, fmt.Errorf("%w: the daemon let go of sandbox %s during the cell (it is stopping); the context lives on", backend.ErrUnavailable, sb.id)
			}
			// The sandbox died (init's stream ends only with it), and
			// every context with it: past its cgroup's hard limit (the
			// headroom above the sandbox's, memory.go), the host's OOM
			// killer may end the whole sentry.
			r.ContextLost = true
			if after := sb.oomKills(); after > oomBefore {
				r.OOMKills, r.OOMKilled = after-oomBefore, true
			}
			if !registry.Destroyed(opCtx) {
				b.terminate(sb, c, fmt.Sprintf("its gVisor sandbox died during a cell (%v)", c.deadErr))
			}
			log.Info("a cell ended with its sandbox", "oom_kills", r.OOMKills)
			return r, nil
		case <-opCtx.Done():
			r := res()
			if registry.Destroyed(opCtx) {
				r.ContextLost = true
				return r, nil
			}
			// A request that went away leaves the cell to its budget: its
			// output goes nowhere.
			return r, fmt.Errorf("the cell's request ended (it runs on to its budget): %w", ctx.Err())
		case <-deadline.C:
			// The cell outlived every bound (or never started): its
			// context is ended with it.
			_ = b.deleteContext(context.WithoutCancel(ctx), sb, req.Context)
			return res(), fmt.Errorf("%w: the cell outlived its timeout, the kill grace and the daemon's own grace (or did not start within %v); its context was ended", backend.ErrUnavailable, cellStartTimeout)
		}
	}
	// Every byte of its results came before its end.
	_ = pw.Close()
	var r cellres.Results
	select {
	case r = <-read:
	case <-time.After(cellDrainGrace):
		_ = pr.CloseWithError(errCellAbandoned)
		r = <-read
	}
	out := res()
	out.Results, out.ResultsTruncated, out.Error, out.ExecutionCount = r.Bundles, r.Truncated, r.Error, r.Count
	if end.Count > 0 {
		// The agent's count is the truth: a cell can write its own
		// results stream (a forged "done" frame), not the agent's count.
		out.ExecutionCount = int(end.Count)
	}
	if r.Malformed != nil {
		log.Warn("a cell's results stream was malformed; what came before is kept", "error", r.Malformed)
		out.ResultsTruncated = true
	}
	out.TimedOut = end.D != proclog.TimedNo
	out.ContextLost = end.A == 1
	if !r.Done && !out.ContextLost {
		// The cell ended in its context without its last frame (it closed
		// or broke its own results stream): what it said may be missing.
		out.ResultsTruncated = true
	}
	if out.ContextLost {
		out.OOMKills = sb.oomKills() - oomBefore
		out.OOMKilled = out.OOMKills > 0 && end.D != proclog.TimedKill && oomLike(end)
		log.Info("a cell's context was lost", "how", end.B, "code", end.C, "timed", end.D, "oom_kills", out.OOMKills)
	}
	return out, nil
}

// warmCode starts sandbox sb's zygote when its image's contexts preload
// modules (the operator's sign that code runs there), so that a pool
// member's first run_code costs a fork, not the interpreter's start and
// its imports (seconds for pandas under gVisor); it waits until the
// zygote is ready. A zygote that cannot start is logged and left for the
// first cell to report (no python3 in the image: no_python); the member
// stays warm for commands.
func (b *Backend) warmCode(ctx context.Context, sb *sandbox) {
	image := backend.HostImage
	if sb.image != nil {
		image = sb.image.Name
	}
	preload := b.cfg.Code.PreloadFor(image)
	if preload == "" {
		return
	}
	log := b.log.With("sandbox", sb.id)
	c := sb.liveInit()
	if c == nil {
		return
	}
	env, err := backend.MergeEnv(sb.baseEnvOf(), sb.env, nil)
	if err != nil {
		log.Warn("the code zygote was not started ahead", "error", err)
		return
	}
	payload := agent.CellRequest{Env: env, Preload: preload, MaxContexts: uint32(b.cfg.Code.MaxContexts)}.Encode()
	if len(payload) > agent.MaxCellRequest {
		log.Warn("the code zygote was not started ahead: the sandbox's environment is too large", "bytes", len(payload))
		return
	}
	start := time.Now()
	ans, err := c.procCallWithin(ctx, gvwire.KindCodeWarm, func(seq uint32) []byte {
		return gvwire.Code{Seq: seq, Request: payload}.Encode()
	}, cellStartTimeout)
	switch {
	case err != nil:
		log.Warn("the code zygote was not started ahead", "error", err)
	case ans.Errno != 0:
		log.Warn("the code zygote could not start; run_code in this sandbox will say why", "reason", string(ans.Body))
	default:
		log.Debug("the code zygote is ready", "preload", preload, "took", time.Since(start))
	}
}

// oomLike reports whether a lost context's end is one the host's OOM
// killer makes on gVisor: a SIGKILL, the exit gVisor gives a process
// whose address space (a systrap stub) the killer took (stubLostStatus),
// or a context gone before the zygote said how.
func oomLike(end gvwire.CellStatus) bool {
	switch end.B {
	case proclog.EndKilled:
		return end.C == uint32(syscall.SIGKILL)
	case proclog.EndExited:
		return end.C == stubLostStatus
	}
	return end.B == proclog.EndLost
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// addCell registers w for init's frames of a new cell and returns its
// sequence number.
func (c *initConn) addCell(w *cellWait) uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cells == nil {
		c.cells = map[uint32]*cellWait{}
	}
	c.cellSeq++
	c.cells[c.cellSeq] = w
	return c.cellSeq
}

// dropCell forgets cell seq: what init still sends of it is dropped, and
// a results write in flight returns.
func (c *initConn) dropCell(seq uint32) {
	c.mu.Lock()
	w := c.cells[seq]
	delete(c.cells, seq)
	c.mu.Unlock()
	if w != nil {
		_ = w.reader.CloseWithError(errCellAbandoned)
	}
}

// cellOutput hands a cell output frame to its cell: stdout and stderr to
// their tails (under mu, as a command's), the results to their reader,
// which reads on whatever the cell sends (cellres), outside mu.
func (c *initConn) cellOutput(p []byte) error {
	o, err := gvwire.DecodeCellOutput(p)
	if err != nil {
		return err
	}
	c.mu.Lock()
	w := c.cells[o.Seq]
	if w == nil || o.Stream == gvwire.CellResults {
		c.mu.Unlock()
		if w != nil {
			_, _ = w.results.Write(o.Data)
		}
		return nil
	}
	defer c.mu.Unlock()
	stderr := o.Stream == gvwire.CellStderr
	buf := w.stdout
	if stderr {
		buf = w.stderr
	}
	_, _ = buf.Write(o.Data)
	if w.output != nil {
		w.output(stderr, o.Data)
	}
	return nil
}

// cellStatus hands a cell status frame to its cell.
func (c *initConn) cellStatus(p []byte) error {
	s, err := gvwire.DecodeCellStatus(p)
	if err != nil {
		return err
	}
	c.mu.Lock()
	w := c.cells[s.Seq]
	c.mu.Unlock()
	if w != nil {
		select {
		case w.status <- s:
		default: // more than a cell's two: init is confused, but harmless
		}
	}
	return nil
}

// ListContexts implements backend.CodeRunner.
func (b *Backend) ListContexts(ctx context.Context, id string) ([]backend.ContextInfo, error) {
	sb, err := b.lookup(id)
	if err != nil {
		return nil, err
	}
	c := sb.liveInit()
	if c == nil {
		return nil, nil // no init: no context
	}
	ans, err := c.procCall(ctx, gvwire.KindContextList, func(seq uint32) []byte { return gvwire.U32s(seq) })
	if err != nil {
		return nil, fmt.Errorf("%w: sandbox %s's init did not list its contexts: %v", backend.ErrUnavailable, sb.id, err)
	}
	var out []backend.ContextInfo
	for _, x := range agent.ParseContextList(ans.Body) {
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
	return b.endContext(ctx, sb, gvwire.KindContextRestart, name)
}

func (b *Backend) deleteContext(ctx context.Context, sb *sandbox, name string) error {
	return b.endContext(ctx, sb, gvwire.KindContextDelete, name)
}

// endContext asks init to delete or restart (kind) context name.
func (b *Backend) endContext(ctx context.Context, sb *sandbox, kind byte, name string) error {
	c := sb.liveInit()
	if c == nil {
		return fmt.Errorf("%w: %s", backend.ErrContextNotFound, name)
	}
	ans, err := c.procCall(ctx, kind, func(seq uint32) []byte {
		return gvwire.ContextDelete{Seq: seq, Name: name}.Encode()
	})
	switch {
	case err != nil:
		return fmt.Errorf("%w: sandbox %s's init did not answer a context's delete or restart: %v", backend.ErrUnavailable, sb.id, err)
	case ans.Errno != 0:
		return fmt.Errorf("%w: %s", backend.ErrContextNotFound, name)
	}
	return nil
}

// liveInit is sb's init when this process talks to one that lives, else
// nil.
func (sb *sandbox) liveInit() *initConn {
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	if sb.gone || sb.init == nil || !sb.init.alive() {
		return nil
	}
	return sb.init
}
