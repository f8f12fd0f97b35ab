package sbx

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// sbx stops a local sandbox a grace after its last session ends (about
// 30 s, configurable since v0.30; sbx-releases#452), and the next sbx exec
// boots it first. A command's budget (its timeout, the kill grace and
// ExecGrace) must not pay for that boot: a boot longer than the budget
// made the command time out, and the backend then removed the microVM it
// took for stuck, with the agent's files. So every sbx exec (a command, a
// file operation, Create's check) is preceded, when the sandbox may have
// stopped, by ensureRunning: sbx ls --json says whether it runs, and a
// sandbox that does not is started by an sbx exec of true under a deadline
// of its own (StartTimeout). A start that fails is an error the caller
// reports; it never removes the sandbox.

// errGone is ensureRunning's answer for a sandbox sbx no longer lists.
var errGone = errors.New("sbx no longer lists the sandbox")

// statusRunning is sbx ls --json's status of a sandbox that runs.
const statusRunning = "running"

// session registers one sbx exec in sb: while it runs the sandbox is
// attached to and does not stop; when it ends the grace starts again. end
// may be called more than once.
func (sb *sandbox) session() (end func()) {
	sb.mu.Lock()
	sb.sessions++
	sb.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			sb.mu.Lock()
			sb.sessions--
			sb.lastUsed = time.Now()
			sb.mu.Unlock()
		})
	}
}

// touch records that sb ran just now (created, or started).
func (sb *sandbox) touch() {
	sb.mu.Lock()
	sb.lastUsed = time.Now()
	sb.mu.Unlock()
}

// surelyRunning reports whether sb cannot have stopped: an sbx exec runs in
// it, or the last one ended less than half of sbx's grace ago.
func (b *Backend) surelyRunning(sb *sandbox) bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.sessions > 0 || (!sb.lastUsed.IsZero() && time.Since(sb.lastUsed) < b.cfg.AutoStopGrace/2)
}

// ensureRunning makes sure sb's microVM runs, starting it when sbx stopped
// it, under StartTimeout. It returns errGone when sbx no longer lists it,
// an error wrapping ctx.Err() when ctx ended, and otherwise an error
// wrapping backend.ErrUnavailable that says the sandbox and its files are
// kept.
func (b *Backend) ensureRunning(ctx context.Context, sb *sandbox) error {
	if b.surelyRunning(sb) {
		return nil
	}
	sb.startMu.Lock() // one start at a time; the others wait for it
	defer sb.startMu.Unlock()
	if b.surelyRunning(sb) {
		return nil
	}
	entries, err := b.listSbx(ctx)
	if err != nil {
		return err
	}
	status, found := "", false
	for _, e := range entries {
		if e.Name == sb.name {
			status, found = e.Status, true
			break
		}
	}
	switch {
	case !found:
		return errGone
	case status == statusRunning:
		sb.touch()
		return nil
	}

	log := b.log.With("sandbox", sb.id)
	log.Info("starting the sandbox's microVM, which sbx stopped", "status", status)
	start := time.Now()
	res, runErr := b.runSbx(ctx, b.cfg.StartTimeout, cliOutputBytes, nil, "exec", "-w", "/", "--", sb.name, "true")
	kept := "the sandbox and its files are kept"
	switch {
	case runErr != nil && ctx.Err() != nil:
		return fmt.Errorf("the request ended while sandbox %s was being started (sbx had stopped it): %w", sb.id, ctx.Err())
	case runErr != nil:
		return fmt.Errorf("%w: sbx could not be run to start sandbox %s (%v); %s", backend.ErrUnavailable, sb.id, runErr, kept)
	case res.TimedOut:
		log.Error("the stopped microVM did not start in time", "limit", b.cfg.StartTimeout)
		return fmt.Errorf("%w: sandbox %s had been stopped by sbx (it stops a microVM a grace after its last session) and did not start within %v; %s: retry, or raise sbx.start_timeout", backend.ErrUnavailable, sb.id, b.cfg.StartTimeout, kept)
	case res.ExitCode != 0:
		if need := operatorNeeded(res); need != nil {
			return fmt.Errorf("sandbox %s could not be started: %w", sb.id, need)
		}
		log.Error("the stopped microVM did not start", "exit_code", res.ExitCode, "stderr", firstLine(res.Stderr))
		return fmt.Errorf("%w: sandbox %s had been stopped by sbx and sbx could not start it (%s); %s: retry, or destroy it and create a new one", backend.ErrUnavailable, sb.id, failure(res, nil, b.cfg.StartTimeout), kept)
	}
	sb.touch()
	log.Info("microVM started", "duration", time.Since(start))
	return nil
}
