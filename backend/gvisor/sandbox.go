package gvisor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/registry"
	"github.com/sandbox-sidecar/sandbox-sidecar/capture"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/cgroup"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

// sandbox is the in-memory state of one sandbox: its settings, the
// operations in flight (so Destroy can stop them and wait for them), and
// its init.
//
// The backend's registry (backend/registry) holds them.
type sandbox struct {
	id, dir string
	env     map[string]string
	limits  limits.Limits
	cg      *cgroup.Cgroup // nil without cgroups; made at each boot
	image   *imageSpec     // the image its root comes from; nil: the host's
	// network is networkNone or networkAllowlist; egressTo and
	// egressCIDRs are the allow-lists of the latter.
	network               string
	egressTo, egressCIDRs []string

	ops registry.Ops

	// initSlot holds the init while no command uses it: one command at a
	// time per sandbox. There is no init until this process boots one (a
	// new sandbox, or one re-adopted after a restart). gone means it died
	// or was stopped in this process: the sandbox is terminated for good,
	// and goneReported that an Exec has told its caller so.
	initSlot     chan struct{}
	initMu       sync.Mutex
	init         *initConn
	gone         bool
	goneReported bool
	// detached: this process let go of the init at its stop, leaving it
	// running for the next daemon (reattach.go).
	detached bool
	// paused: the sandbox is its checkpoint on disk, with no init and no
	// runsc process (pause.go).
	paused bool
	// runscGone: this process saw `runsc delete` end sb's runsc sandbox
	// (a pause's end) and has started none since, so the next start
	// need not delete a stale one first.
	runscGone bool
	// settled, after a resume, is closed once its restore loaded the
	// guest's memory and the checkpoint was dropped, or kept because the
	// load failed (settleRestore). Set under initMu.
	settled chan struct{}
	// reclaims counts the guest processes killed at the sandbox's memory
	// limit (memory.go), which oomKills adds to the kernel's count.
	reclaims atomic.Uint64
}

func newSandbox(id, dir string, spec persistedSpec, lim limits.Limits) *sandbox {
	sb := &sandbox{id: id, dir: dir, env: spec.Env, limits: lim, image: spec.Image, ops: registry.Ops{ID: id}, initSlot: make(chan struct{}, 1),
		network: spec.Network, egressTo: spec.AllowEgressTo, egressCIDRs: spec.AllowEgressToCIDRs}
	sb.initSlot <- struct{}{}
	return sb
}

func (sb *sandbox) workDir() string   { return filepath.Join(sb.dir, workDirName) }
func (sb *sandbox) tmpDir() string    { return filepath.Join(sb.dir, tmpDirName) }
func (sb *sandbox) bundleDir() string { return filepath.Join(sb.dir, bundleName) }

// containerID is the sandbox's name in runsc: its id, or for a trial
// sandbox "probe." and the rest of its directory's name (a '.' is never in
// an id, so List never reports one).
func (sb *sandbox) containerID() string {
	base := filepath.Base(sb.dir)
	if rest, ok := strings.CutPrefix(base, probePrefix); ok {
		return "probe." + rest
	}
	return base
}

// Ops implements registry.Sandbox.
func (sb *sandbox) Ops() *registry.Ops { return &sb.ops }

// initConn is the daemon's side of one running init: the write end of its
// stdin, the read end of its stdout, and the frames read from it.
type initConn struct {
	// toInit and fromInit are the daemon's ends of the FIFOs that are
	// init's stdin and stdout (reattach.go).
	toInit   *os.File
	fromInit *os.File
	// pending is what a re-attach read of init's stream beyond its
	// attached frame: readLoop's first bytes.
	pending []byte
	log     *os.File // runsc's and init's stderr
	// egress is the network of an allowlist sandbox's gVisor sandbox
	// (nil for the others); it ends with the connection.
	egress *egress.Path

	wmu sync.Mutex

	// dead is closed when the stream from init ends (init, or the whole
	// sandbox, died or was stopped); deadErr says how.
	dead    chan struct{}
	deadErr error

	// warm: a command, or Warm's warm-up (warmUp), has run through it;
	// used holding the sandbox's initSlot.
	warm bool

	mu  sync.Mutex
	cur *command // the command frames are for

	// lstatMu lets one lstat request at a time wait for its answer on
	// lstated.
	lstatMu sync.Mutex
	lstated chan [2]uint32

	// fileMu lets one file op at a time wait for its answer; fop (under
	// mu) is that op, which readLoop fills.
	fileMu  sync.Mutex
	fileSeq uint32
	fop     *fileWait

	// procWaits (under mu) are the proc requests waiting for their
	// answers, by sequence number (procs.go).
	procSeq   uint32
	procWaits map[uint32]chan gvwire.ProcAnswer

	// cells (under mu) are the cells running, by sequence number
	// (code.go).
	cellSeq uint32
	cells   map[uint32]*cellWait
}

// command is one command's share of the stream.
type command struct {
	stdout, stderr *capture.Buffer
	// output, when set, also gets the output as it arrives (the request's
	// Output: it never blocks).
	output func(stderr bool, p []byte)
	end    chan frameEnd // exited or failed, once
}

// frameEnd is how init said a command ended.
type frameEnd struct {
	exitCode int
	timedOut bool   // init stopped the command at its budget
	failed   string // the reason the command did not start
}

var errInitGone = errors.New("the sandbox's init is gone")

// errInitDied is what acquireInit returns the first time after init died.
var errInitDied = errors.New("the sandbox's init died")

// readLoop reads init's frames until the stream ends, handing them to the
// current command.
func (c *initConn) readLoop() {
	r := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(c.pending), c.fromInit), gvwire.MaxChunk+gvwire.FrameHeaderSize)
	c.pending = nil
	const allowed = 1<<gvwire.KindStdout | 1<<gvwire.KindStderr | 1<<gvwire.KindExited | 1<<gvwire.KindFailed | 1<<gvwire.KindLstated |
		1<<gvwire.KindFileData | 1<<gvwire.KindFileDone | 1<<gvwire.KindProcAnswer | 1<<gvwire.KindCellOutput | 1<<gvwire.KindCellStatus
	var err error
	for {
		var kind byte
		var payload []byte
		kind, payload, err = gvwire.ReadFrame(r, allowed)
		if err != nil {
			break
		}
		if kind == gvwire.KindLstated {
			if len(payload) != 8 {
				err = fmt.Errorf("%w: lstat answer of %d bytes", gvwire.ErrBadFrame, len(payload))
				break
			}
			select {
			case c.lstated <- [2]uint32{binary.LittleEndian.Uint32(payload), binary.LittleEndian.Uint32(payload[4:])}:
			default: // nobody asked: init is confused, but harmless
			}
			continue
		}
		if kind == gvwire.KindFileData || kind == gvwire.KindFileDone {
			if err = c.fileFrame(kind, payload); err != nil {
				break
			}
			continue
		}
		if kind == gvwire.KindProcAnswer {
			if err = c.procAnswered(payload); err != nil {
				break
			}
			continue
		}
		if kind == gvwire.KindCellOutput || kind == gvwire.KindCellStatus {
			if kind == gvwire.KindCellOutput {
				err = c.cellOutput(payload)
			} else {
				err = c.cellStatus(payload)
			}
			if err != nil {
				break
			}
			continue
		}
		c.mu.Lock()
		cur := c.cur
		switch kind {
		case gvwire.KindStdout, gvwire.KindStderr:
			if cur != nil {
				buf := cur.stdout
				if kind == gvwire.KindStderr {
					buf = cur.stderr
				}
				_, _ = buf.Write(payload)
				if cur.output != nil {
					cur.output(kind == gvwire.KindStderr, payload)
				}
			}
		case gvwire.KindExited, gvwire.KindFailed:
			var e frameEnd
			if kind == gvwire.KindFailed {
				e = frameEnd{exitCode: 1, failed: string(bytes.ToValidUTF8(payload, []byte("?")))}
				if cur != nil {
					_, _ = cur.stderr.Write(payload)
				}
			} else if e.exitCode, e.timedOut, err = gvwire.ExitCode(payload); err != nil {
				break // out of the switch; the loop ends below
			}
			c.cur = nil
			if cur != nil {
				cur.end <- e
			}
		}
		c.mu.Unlock()
		if err != nil {
			break
		}
	}
	if errors.Is(err, io.EOF) || errors.Is(err, os.ErrClosed) {
		err = errInitGone
	}
	c.deadErr = err
	close(c.dead)
	// The sandbox's processes are gone (init's stream ends only when it
	// does): its network goes now, not at the next command or destroy.
	_ = c.egress.Close()
}

func (c *initConn) alive() bool {
	select {
	case <-c.dead:
		return false
	default:
		return true
	}
}

// send writes one frame to init within sendTimeout.
func (c *initConn) send(kind byte, payload []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.toInit.SetWriteDeadline(time.Now().Add(sendTimeout)); err != nil {
		return err
	}
	return gvwire.WriteFrame(c.toInit, kind, payload)
}

// lstatTimeout bounds one lstat request to init.
const lstatTimeout = 5 * time.Second

// guestLstat asks init what the guest sees at path: its file type bits
// (unix.S_IFMT of the mode), or the errno of its lstat.
func (c *initConn) guestLstat(ctx context.Context, path string) (typ uint32, errno unix.Errno, err error) {
	c.lstatMu.Lock()
	defer c.lstatMu.Unlock()
	// Drop a stale answer to a request that timed out.
	select {
	case <-c.lstated:
	default:
	}
	if err := c.send(gvwire.KindLstat, []byte(path)); err != nil {
		return 0, 0, err
	}
	t := time.NewTimer(lstatTimeout)
	defer t.Stop()
	select {
	case a := <-c.lstated:
		return a[0], unix.Errno(a[1]), nil
	case <-c.dead:
		return 0, 0, errInitGone
	case <-t.C:
		return 0, 0, fmt.Errorf("init did not answer within %v", lstatTimeout)
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
}

// logTail returns the end of what runsc and init wrote to stderr.
func (c *initConn) logTail() string {
	if c == nil || c.log == nil {
		return ""
	}
	fi, err := c.log.Stat()
	if err != nil || fi.Size() == 0 {
		return ""
	}
	off := max(fi.Size()-logTailBytes, 0)
	buf := make([]byte, fi.Size()-off)
	n, _ := c.log.ReadAt(buf, off)
	return string(bytes.TrimSpace(bytes.ToValidUTF8(buf[:n], []byte("?"))))
}

func (c *initConn) close() {
	_ = c.toInit.Close()
	_ = c.fromInit.Close()
	if c.log != nil {
		_ = c.log.Close()
	}
	_ = c.egress.Close()
}

// acquireInit takes sb's init for one command, booting the sandbox if this
// process has no init for it yet. It waits for a command in flight to end
// (until ctx does). It fails with errInitDied the first time after init
// died, and with an error wrapping ErrNotFound after that. The caller
// calls releaseInit when done.
func (b *Backend) acquireInit(ctx context.Context, sb *sandbox) (*initConn, error) {
	select {
	case <-sb.initSlot:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	if c := sb.init; c != nil && !c.alive() {
		b.log.With("sandbox", sb.id).Warn("the sandbox's init died; the sandbox is terminated", "error", c.deadErr, "log", c.logTail())
		c.close()
		sb.init, sb.gone = nil, true
	}
	var err error
	switch {
	case sb.gone && !sb.goneReported:
		sb.goneReported = true
		err = errInitDied
	case sb.gone:
		err = fmt.Errorf("%w: sandbox %q was terminated (its gVisor sandbox died); destroy it and create a new one", backend.ErrNotFound, sb.id)
	case sb.paused:
		err = sb.errPaused()
	case sb.init == nil:
		sb.init, err = b.boot(ctx, sb)
	}
	if err != nil {
		sb.initSlot <- struct{}{}
		return nil, err
	}
	return sb.init, nil
}

func (sb *sandbox) releaseInit() { sb.initSlot <- struct{}{} }

// stopInit marks sb terminated and closes the daemon's ends of its init's
// streams. Init outlives that (it waits for a next daemon, reattach.go):
// callers stop the gVisor sandbox with `runsc delete --force`.
func (b *Backend) stopInit(sb *sandbox) {
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	if sb.init != nil {
		sb.init.close()
		sb.init = nil
	}
	sb.gone, sb.goneReported = true, true
}

// terminate stops sb's gVisor sandbox because its init stopped answering;
// the caller reports SandboxTerminated.
func (b *Backend) terminate(sb *sandbox, c *initConn, why string) {
	sb.initMu.Lock()
	if sb.detached {
		// The daemon let go of it as it stopped (detachInit): its init
		// lives on, for the next daemon, and the command's caller is told
		// its sandbox is gone from this one.
		sb.initMu.Unlock()
		return
	}
	if sb.paused {
		// A resume's restore failed to load its memory (settleRestore):
		// the sandbox is its checkpoint again, not terminated.
		sb.initMu.Unlock()
		return
	}
	if sb.init == c && c != nil {
		b.log.With("sandbox", sb.id).Warn("sandbox terminated: "+why, "log", c.logTail())
		c.close()
		sb.init = nil
	}
	sb.gone, sb.goneReported = true, true
	sb.initMu.Unlock()
	_, _ = b.cli(context.Background(), cliTimeout, "delete", "--force", sb.containerID())
}

// boot starts sb's gVisor sandbox with init as its process and waits for
// init's ready frame. A sandbox runsc still has under that name (left by a
// daemon that died) is deleted first.
func (b *Backend) boot(ctx context.Context, sb *sandbox) (*initConn, error) {
	return b.start(ctx, sb, "")
}

// start boots sb's gVisor sandbox afresh (checkpoint ""), or restores it
// from the runsc checkpoint in directory checkpoint (pause.go), whose
// pages the sentry goes on loading after runsc returns (`restore
// --background`: the checkpoint must stay until restoreLoaded): the same
// bundle, the same kind of cgroup and network, fresh FIFOs as init's
// stdin and stdout (runsc hands the restored init the descriptors it was
// started with), and instead of a ready frame the attach handshake a
// re-attaching daemon makes (reattach.go), which the restored init, in
// the middle of its loop, answers.
func (b *Backend) start(ctx context.Context, sb *sandbox, checkpoint string) (_ *initConn, err error) {
	log := b.log.With("sandbox", sb.id)
	// A `runsc delete` is a runsc process (tens of milliseconds, more on a
	// busy host): skipped when this process saw the last one end.
	if !sb.runscGone {
		if out, err := b.cli(ctx, cliTimeout, "delete", "--force", sb.containerID()); err != nil && !notExist(out) {
			return nil, fmt.Errorf("%w: a stale gVisor sandbox of %s cannot be removed: %v", backend.ErrUnavailable, sb.id, err)
		}
	}
	sb.runscGone = false
	// (A sandbox made before durable processes has no procs/ yet.)
	if err := os.MkdirAll(sb.procsDir(), 0o700); err != nil {
		return nil, fmt.Errorf("%w: the processes' directory of sandbox %s: %v", backend.ErrUnavailable, sb.id, err)
	}
	// A restore keeps the bundle its checkpoint was taken with: runsc
	// refuses one whose spec differs but for the mounts' sources.
	if checkpoint == "" {
		if err := b.writeBundle(sb); err != nil {
			return nil, fmt.Errorf("%w: write the OCI bundle of sandbox %s: %v", backend.ErrUnavailable, sb.id, err)
		}
	}
	if err := b.makeCgroup(ctx, sb); err != nil {
		return nil, err
	}
	inR, outW, inW, outR, err := initFIFOs(sb)
	if err != nil {
		return nil, fmt.Errorf("%w: the init streams of sandbox %s: %v", backend.ErrUnavailable, sb.id, err)
	}
	logf, err := os.OpenFile(filepath.Join(sb.dir, logName), os.O_RDWR|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("%w: log of sandbox %s: %v", backend.ErrUnavailable, sb.id, err)
	}
	c := &initConn{toInit: inW, fromInit: outR, log: logf, dead: make(chan struct{}), lstated: make(chan [2]uint32, 1)}
	defer func() {
		if err != nil {
			c.close()
			_, _ = b.cli(context.Background(), cliTimeout, "delete", "--force", sb.containerID())
			// A boot cut short before runsc saved its state leaves
			// processes that delete cannot name.
			b.killRunscStrays(sb.bundleDir())
		}
	}()

	if sb.network == networkAllowlist {
		if c.egress, err = b.startEgress(sb); err != nil {
			inR.Close()
			outW.Close()
			return nil, err
		}
	}

	bctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	// No sentry of this container runs now: a control socket of its name
	// is an earlier one's, left by a sentry that died, and runsc would
	// bind elsewhere, then nowhere (removeStaleControlSockets).
	b.removeStaleControlSockets(sb.containerID())
	args := append(runscNetwork(b.globalFlags(), sb), "run", "--detach", "--bundle", sb.bundleDir(), sb.containerID())
	if checkpoint != "" {
		args = append(runscNetwork(b.globalFlags(), sb), "restore", "--detach", "--background")
		if !b.cfg.BufferedRestoreReads && directReads(checkpoint) {
			args = append(args, "--direct")
		}
		args = append(args, "--bundle", sb.bundleDir(), "--image-path", checkpoint, sb.containerID())
	}
	cmd := exec.CommandContext(bctx, b.runsc, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, logf
	if c.egress != nil {
		cmd.ExtraFiles = []*os.File{c.egress.NS} // descriptor 3: netnsPath in the spec (placed adds its gate after it)
	}
	cmd.WaitDelay = time.Second
	start := time.Now()
	release, runErr := b.placed(sb, cmd)
	if runErr == nil {
		if runErr = release(); runErr != nil {
			_ = cmd.Process.Kill()
		}
		if werr := cmd.Wait(); runErr == nil {
			runErr = werr
		}
	}
	inR.Close()
	outW.Close()
	if runErr != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("the gVisor sandbox of %s was not started: %w", sb.id, ctx.Err())
		}
		return nil, fmt.Errorf("%w: runsc could not start sandbox %s (%v): %s; check `%s --version` and docs/operations.md (gVisor)",
			backend.ErrUnavailable, sb.id, runErr, c.logTail(), b.runsc)
	}
	if checkpoint != "" {
		if err := b.attachRestored(ctx, sb, c, start.Add(bootTimeout)); err != nil {
			return nil, err
		}
		go c.readLoop()
		b.watchMemory(sb, c)
		log.Debug("gVisor sandbox restored", "duration", time.Since(start))
		return c, nil
	}
	if err := outR.SetReadDeadline(start.Add(bootTimeout)); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrUnavailable, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = outR.SetReadDeadline(time.Now()) })
	kind, ready, rerr := gvwire.ReadFrame(outR, 1<<gvwire.KindReady)
	stop()
	switch {
	case rerr == nil && kind == gvwire.KindReady && gvwire.ReadyFrom(ready) == nil:
	case rerr == nil:
		return nil, fmt.Errorf("%w: the init of sandbox %s: %v", backend.ErrUnavailable, sb.id, gvwire.ReadyFrom(ready))
	case ctx.Err() != nil:
		return nil, fmt.Errorf("the gVisor sandbox of %s was not started: %w", sb.id, ctx.Err())
	case errors.Is(rerr, os.ErrDeadlineExceeded):
		return nil, fmt.Errorf("%w: the init of sandbox %s did not start within %v; the host may be overloaded: %s", backend.ErrUnavailable, sb.id, bootTimeout, c.logTail())
	default:
		return nil, fmt.Errorf("%w: the init of sandbox %s did not start (%v): %s", backend.ErrUnavailable, sb.id, rerr, c.logTail())
	}
	if err := outR.SetReadDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrUnavailable, err)
	}
	go c.readLoop()
	b.watchMemory(sb, c)
	log.Debug("gVisor sandbox booted", "duration", time.Since(start))
	return c, nil
}

var _ backend.Warmer = (*Backend)(nil)

// Warm boots sandbox id's gVisor sandbox and init if this process has none
// for it yet (Create boots one; a sandbox re-adopted after a restart has
// none until now), and has it run a command before any client's (warmUp),
// so that its first command costs what any later one does. It waits for a
// command in flight to end, until ctx does; a command that comes during
// the warm-up waits for it likewise. Where the image's code contexts
// preload modules, Warm also starts the sandbox's code zygote and waits
// for its imports (warmCode), so that a pool member's first run_code
// costs a fork.
func (b *Backend) Warm(ctx context.Context, id string) error {
	sb, err := b.lookup(id)
	if err != nil {
		return err
	}
	opCtx, done, err := sb.ops.Begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	c, err := b.acquireInit(opCtx, sb)
	if err != nil {
		if errors.Is(err, errInitDied) {
			return fmt.Errorf("%w: sandbox %q was terminated (its gVisor sandbox died); destroy it and create a new one", backend.ErrNotFound, id)
		}
		return err
	}
	warm := c.warm
	sb.releaseInit()
	if warm {
		return nil
	}
	if err := b.warmUp(ctx, opCtx, sb); err != nil {
		return err
	}
	b.warmCode(opCtx, sb)
	return nil
}

// warmTimeout bounds Warm's warm-up command, which exits at once.
const warmTimeout = 10 * time.Second

// warmUp has sb's init run `true` from the sandbox's PATH or, in a root
// without one, the init's own executable, which exits at once
// (initproc.WarmEnv): what a gVisor sandbox's first command pays once (the
// sentry's first fork and exec, its first walks and loads of the guest's
// loader and C library through the gofer) is then paid before a client's.
// Without it a pool member's first command took twice its later ones
// (docs/design.md, "A pool member is ready to run").
func (b *Backend) warmUp(ctx, opCtx context.Context, sb *sandbox) error {
	for _, argv := range [][]string{{"true"}, {guestInit}} {
		res, err := b.execIn(ctx, opCtx, sb, backend.ExecRequest{Argv: argv, Env: map[string]string{initproc.WarmEnv: "1"}, Timeout: warmTimeout})
		switch {
		case registry.Destroyed(opCtx):
			return backend.NotFound(sb.id)
		case err != nil:
			return err
		case res.SandboxTerminated:
			return fmt.Errorf("%w: sandbox %q was terminated during its warm-up (its gVisor sandbox died); destroy it and create a new one", backend.ErrNotFound, sb.id)
		case res.ExitCode != notFoundStatus:
			return nil
		}
	}
	return nil
}

// notFoundStatus is the exit status init reports for a program that is
// not there (initproc.NotRunnableStatus).
const notFoundStatus = 127
