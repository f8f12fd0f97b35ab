package bwrap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap/bwwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/procstore"
)

// Durable processes (backend.Processes): a sandbox's processes live in
// its directory's procs/ (procstore), and its init runs each under a keeper
// (backend/agent). The daemon talks to init only to start and signal them;
// their output and ends it reads from the files the keepers write.

var _ backend.Processes = (*Backend)(nil)

// procsDir is where sandbox dir's processes live.
func procsDir(dir string) string { return filepath.Join(dir, "procs") }

func (b *Backend) store(sb *sandbox) *procstore.Store {
	return procstore.New(procsDir(sb.dir), b.cfg.Processes, &b.watcher)
}

// StartProcess implements backend.Processes.
func (b *Backend) StartProcess(ctx context.Context, id string, req backend.ProcessRequest) (backend.ProcessInfo, error) {
	sb, err := b.lookup(id)
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	argv, cwd, err := backend.CheckProcessRequest(req, guestWorkspace)
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	if req.Command != "" && sb.image != nil && !sb.image.Shell {
		return backend.ProcessInfo{}, fmt.Errorf("%w: sandbox %s runs on image %s, which has no %s to run a command string; give the command as an argv", backend.ErrNoShell, id, backend.ShortName(sb.image.Name), backend.ShellPath)
	}
	env, err := backend.MergeEnv(sb.baseEnv(), sb.env, req.Env)
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	opCtx, done, err := sb.begin(ctx)
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	defer done()
	var grace time.Duration
	if req.Timeout > 0 {
		grace = b.cfg.KillGrace
	}
	spec := procstore.StartSpec{Name: req.Name, Command: req.Command, Argv: req.Argv, Stdin: req.Stdin,
		Request: agent.Request{Argv: argv, Env: env, Cwd: cwd, Timeout: req.Timeout, KillGrace: grace}}
	if sb.cg != nil {
		if f, err := os.Open(sb.cg.OOMCounterPath()); err == nil {
			spec.OOM = f
		}
	}
	return b.store(sb).Start(opCtx, &bwAgent{b: b, sb: sb}, spec)
}

// ReadOutput implements backend.Processes.
func (b *Backend) ReadOutput(ctx context.Context, id, proc string, stderr bool, offset int64, maxBytes int, wait time.Duration) (backend.OutputRead, error) {
	sb, err := b.lookup(id)
	if err != nil {
		return backend.OutputRead{}, err
	}
	opCtx, done, err := sb.begin(ctx)
	if err != nil {
		return backend.OutputRead{}, err
	}
	defer done()
	return b.store(sb).Read(opCtx, &bwAgent{b: b, sb: sb}, proc, stderr, offset, maxBytes, wait)
}

// WaitProcess implements backend.Processes.
func (b *Backend) WaitProcess(ctx context.Context, id, proc string, wait time.Duration) (backend.ProcessInfo, error) {
	sb, err := b.lookup(id)
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	opCtx, done, err := sb.begin(ctx)
	if err != nil {
		return backend.ProcessInfo{}, err
	}
	defer done()
	return b.store(sb).Wait(opCtx, &bwAgent{b: b, sb: sb}, proc, wait)
}

// SignalProcess implements backend.Processes.
func (b *Backend) SignalProcess(ctx context.Context, id, proc string, sig syscall.Signal) error {
	sb, err := b.lookup(id)
	if err != nil {
		return err
	}
	opCtx, done, err := sb.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	return b.store(sb).Signal(opCtx, &bwAgent{b: b, sb: sb}, proc, sig)
}

// ListProcesses implements backend.Processes.
func (b *Backend) ListProcesses(ctx context.Context, id string) ([]backend.ProcessInfo, error) {
	sb, err := b.lookup(id)
	if err != nil {
		return nil, err
	}
	return b.store(sb).List((&bwAgent{b: b, sb: sb}).AgentAlive())
}

// bwAgent is a sandbox's init as procstore's Agent.
type bwAgent struct {
	b  *Backend
	sb *sandbox
}

// procAnswerTimeout bounds init's answer to a process's start (a keeper's
// exec and its first steps) or signal.
const procAnswerTimeout = 10 * time.Second

// liveInit returns sb's init, starting it when this process has none, for
// an operation that does not run a command (it does not mark it busy).
func (b *Backend) liveInit(ctx context.Context, sb *sandbox) (*initProc, error) {
	sb.lockInit(ctx)
	defer sb.initMu.Unlock()
	if ip := sb.init; ip != nil && !ip.alive() {
		b.log.With("sandbox", sb.id).Warn("the sandbox's init died; the sandbox is terminated", "stderr", ip.stderrTail())
		b.stopInit(ip)
		sb.init, sb.initGone = nil, true
	}
	switch {
	case sb.paused:
		return nil, sb.errPaused()
	case sb.initGone:
		return nil, fmt.Errorf("%w: sandbox %q was terminated (its init process died); destroy it and create a new one", backend.ErrNotFound, sb.id)
	case sb.init == nil:
		ip, err := b.startInit(ctx, sb, time.Now().Add(initStartTimeout))
		if err != nil {
			return nil, err
		}
		sb.init = ip
	}
	return sb.init, nil
}

// AgentAlive implements procstore.Agent: the sandbox's init runs (this
// process started it, and it has not died), or is paused with the
// sandbox, not yet re-attached (pause.go).
func (a *bwAgent) AgentAlive() bool {
	a.sb.initMu.Lock()
	defer a.sb.initMu.Unlock()
	return a.sb.init != nil && a.sb.init.alive() || a.sb.reattach
}

// StartKeeper implements procstore.Agent.
func (a *bwAgent) StartKeeper(ctx context.Context, req agent.Request, f procstore.Files) (int, error) {
	ip, err := a.b.liveInit(ctx, a.sb)
	if err != nil {
		return 0, err
	}
	status, statusInit, err := seqpacketPair("sandbox-proc-status")
	if err != nil {
		return 0, fmt.Errorf("%w: start a process in sandbox %s: %v; the daemon may be out of file descriptors", backend.ErrUnavailable, a.sb.id, err)
	}
	defer status.Close()
	defer statusInit.Close()
	payload := req.Encode()
	fds := []int{int(statusInit.Fd())}
	m := bwwire.Msg{Kind: bwwire.MsgProcStart, A: uint32(len(payload))}
	if len(payload) > bwwire.MaxInlineRequest {
		mem, err := memFile("sandbox-proc-request", "")
		if err != nil {
			return 0, fmt.Errorf("%w: start a process in sandbox %s: %v", backend.ErrUnavailable, a.sb.id, err)
		}
		defer mem.Close()
		if _, err := mem.Write(payload); err != nil {
			return 0, fmt.Errorf("%w: start a process in sandbox %s: %v", backend.ErrUnavailable, a.sb.id, err)
		}
		fds, payload, m.A = append(fds, int(mem.Fd())), nil, 0
	}
	for _, x := range []*os.File{f.Stdin, f.Stdout, f.Stderr, f.Exit} {
		fds = append(fds, int(x.Fd()))
	}
	if f.OOM != nil {
		fds, m.C = append(fds, int(f.OOM.Fd())), 1
	}
	deadline := time.Now().Add(procAnswerTimeout)
	if err := ip.sendMsg(m, payload, fds, deadline); err != nil {
		return 0, fmt.Errorf("%w: cannot hand sandbox %s's init a process: %v", backend.ErrUnavailable, a.sb.id, err)
	}
	statusInit.Close()
	answer, err := readAnswer(ctx, status, deadline)
	if err != nil {
		return 0, fmt.Errorf("%w: sandbox %s's init did not say whether the process started: %v", backend.ErrUnavailable, a.sb.id, err)
	}
	switch answer.Kind {
	case bwwire.MsgStarted:
		return int(answer.A), nil
	case bwwire.MsgFailed:
		switch syscall.Errno(answer.A) {
		case syscall.EAGAIN:
			return 0, &backend.ProcessQuotaError{Limit: a.b.cfg.Processes.MaxRunning}
		case syscall.ESTALE:
			return 0, fmt.Errorf("%w: process %s's start was given up (a restarted daemon found it half done); start it again", backend.ErrUnavailable, req.ID)
		}
		return 0, fmt.Errorf("%w: sandbox %s's init could not start the process: %v", backend.ErrUnavailable, a.sb.id, syscall.Errno(answer.A))
	}
	return 0, fmt.Errorf("%w: sandbox %s's init answered a process's start with a message of kind %d", backend.ErrUnavailable, a.sb.id, answer.Kind)
}

// SignalKeeper implements procstore.Agent.
func (a *bwAgent) SignalKeeper(ctx context.Context, proc string, sig syscall.Signal) error {
	a.sb.initMu.Lock()
	ip, paused := a.sb.init, a.sb.paused
	a.sb.initMu.Unlock()
	if paused {
		return a.sb.errPaused()
	}
	if ip == nil || !ip.alive() {
		return fmt.Errorf("%w: process %s's sandbox has no agent running", backend.ErrProcessEnded, proc)
	}
	reply, replyInit, err := seqpacketPair("sandbox-proc-reply")
	if err != nil {
		return fmt.Errorf("%w: signal a process in sandbox %s: %v", backend.ErrUnavailable, a.sb.id, err)
	}
	defer reply.Close()
	defer replyInit.Close()
	deadline := time.Now().Add(procAnswerTimeout)
	if err := ip.sendMsg(bwwire.Msg{Kind: bwwire.MsgProcSignal, A: uint32(len(proc)), B: uint32(sig)}, []byte(proc), []int{int(replyInit.Fd())}, deadline); err != nil {
		return fmt.Errorf("%w: cannot reach sandbox %s's init: %v", backend.ErrUnavailable, a.sb.id, err)
	}
	replyInit.Close()
	answer, err := readAnswer(ctx, reply, deadline)
	switch {
	case err != nil:
		return fmt.Errorf("%w: sandbox %s's init did not answer a signal: %v", backend.ErrUnavailable, a.sb.id, err)
	case answer.Kind != bwwire.MsgProcDone:
		return fmt.Errorf("%w: sandbox %s's init answered a signal with a message of kind %d", backend.ErrUnavailable, a.sb.id, answer.Kind)
	case answer.A == bwwire.ProcUnknown:
		return fmt.Errorf("%w: process %s is ending; there is nothing to signal", backend.ErrProcessEnded, proc)
	}
	return nil
}

// runningKeepers asks ip which processes' keepers run in it.
func runningKeepers(ctx context.Context, ip *initProc) ([]string, error) {
	reply, replyInit, err := seqpacketPair("sandbox-proc-reply")
	if err != nil {
		return nil, err
	}
	defer reply.Close()
	defer replyInit.Close()
	deadline := time.Now().Add(procAnswerTimeout)
	if err := ip.sendMsg(bwwire.Msg{Kind: bwwire.MsgProcList}, nil, []int{int(replyInit.Fd())}, deadline); err != nil {
		return nil, err
	}
	replyInit.Close()
	answer, body, err := readAnswerBody(ctx, reply, deadline)
	switch {
	case err != nil:
		return nil, err
	case answer.Kind != bwwire.MsgProcDone || int(answer.B) != len(body):
		return nil, fmt.Errorf("init answered a list with a message of kind %d and %d of %d bytes", answer.Kind, len(body), answer.B)
	case len(body) == 0:
		return nil, nil
	}
	return strings.Split(string(body), "\n"), nil
}

// readAnswer reads init's one-message answer on sock (a socket of its
// own), until deadline or ctx ends.
func readAnswer(ctx context.Context, sock *os.File, deadline time.Time) (bwwire.Msg, error) {
	m, _, err := readAnswerBody(ctx, sock, deadline)
	return m, err
}

// readAnswerBody is readAnswer with what follows the message (a list's
// ids).
func readAnswerBody(ctx context.Context, sock *os.File, deadline time.Time) (bwwire.Msg, []byte, error) {
	stop := context.AfterFunc(ctx, func() { _ = sock.SetReadDeadline(time.Now()) })
	defer stop()
	if err := sock.SetReadDeadline(deadline); err != nil {
		return bwwire.Msg{}, nil, err
	}
	buf := make([]byte, bwwire.MsgSize+bwwire.MaxProcList)
	n, err := sock.Read(buf)
	switch {
	case ctx.Err() != nil:
		return bwwire.Msg{}, nil, ctx.Err()
	case errors.Is(err, os.ErrDeadlineExceeded):
		return bwwire.Msg{}, nil, fmt.Errorf("no answer within %v", procAnswerTimeout)
	case err != nil:
		return bwwire.Msg{}, nil, err
	case n < bwwire.MsgSize:
		return bwwire.Msg{}, nil, errors.New("init closed the socket without an answer (it died, or refused the request)")
	}
	m, err := bwwire.DecodeMsg(buf[:bwwire.MsgSize])
	return m, buf[bwwire.MsgSize:n], err
}

// sendMsg sends init m (its first value set by the caller) with payload
// and fds, as sendKind does.
func (ip *initProc) sendMsg(m bwwire.Msg, payload []byte, fds []int, deadline time.Time) error {
	return ip.sendEncoded(append(m.Encode(), payload...), fds, deadline, nil)
}
