package gvisor

// Pause (backend.Pauser): a paused sandbox is a runsc checkpoint in its
// directory (Dir/<id>/checkpoint) and no runsc process at all: its sentry
// and gofer end, so its memory goes back to the host. A resume restores
// the checkpoint (`runsc restore`) with the same bundle: init, the
// durable processes it keeps and their memory go on where they were, and
// the daemon re-attaches to the restored init as it does to one a previous
// daemon left (reattach.go).
//
// A pause is all or nothing. The guest's tasks are stopped by runsc itself
// (`runsc pause`, the sentry's own stop: the cgroup freezer, stopping the
// sentry from outside, killed guest processes after the thaw), then
// checkpointed with --leave-running into checkpoint.new: a failed or
// oversized checkpoint (a full disk, more than MaxCheckpointBytes) is
// removed and the same sentry resumed, nothing lost. Only a complete
// checkpoint, synced, is renamed into place; that rename is the pause's
// commit, and the sentry is ended after it. A resume removes the
// checkpoint only once the restored init answered and the sentry has
// read all of it: runsc restores in the background (the guest runs while
// its memory's pages are still being read from the checkpoint, first
// those it touches), and the checkpoint is dropped after `runsc wait
// --restore` says the load is complete (settleRestore). A load that
// fails ends the gVisor sandbox (gVisor kills it): the sandbox is then
// paused again, its checkpoint intact. A pause waits for the previous
// resume's load.
//
// A daemon killed in between leaves a state its successor reads when it
// loads the sandbox (loadPause): a checkpoint in place means paused,
// unless a live init answers (a resume that had restored it); a sentry
// that runsc says is paused without a checkpoint in place is resumed (a
// pause cut short, or a snapshot's hold); a partial checkpoint is removed.
//
// The checkpoint is the guest's memory: guest-controlled data. Its size on
// disk is bounded by MaxCheckpointBytes (checked before it is kept) and,
// while it is written, by the guest's memory (limits.memory_bytes with
// cgroups), after a check that the state directory's filesystem has room
// for what the sandbox's cgroup holds. Only runsc reads it back, into the
// sandbox it was taken of.
//
// Sandboxes with an egress allow-list are not paused: their network is a
// TUN device the daemon serves, which a checkpoint cannot carry.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/statedir"
)

var _ backend.Pauser = (*Backend)(nil)

// A paused sandbox's checkpoint in Dir/<id>: in place, being written, and
// being removed after a restore.
const (
	checkpointName    = "checkpoint"
	checkpointNewName = "checkpoint.new"
	checkpointOldName = "checkpoint.old"
)

// DefaultMaxCheckpointBytes is Config.MaxCheckpointBytes's default.
const DefaultMaxCheckpointBytes = 8 << 30

// Bounds of a pause and a resume.
const (
	// checkpointTimeout bounds `runsc checkpoint` (a GiB of memory takes
	// a few seconds here).
	checkpointTimeout = 2 * time.Minute
	// spaceReserve is the room a checkpoint leaves on the state
	// directory's filesystem beyond its own estimated size.
	spaceReserve = 64 << 20
	// restoreLoadTimeout bounds the wait for a background restore's
	// load of the guest's memory (the checkpoint's read, as
	// checkpointTimeout its write).
	restoreLoadTimeout = checkpointTimeout
	// settleDelay is how long after a resume its checkpoint's drop starts
	// (settleRestore).
	settleDelay = 250 * time.Millisecond
)

// Failpoints of a pause and a resume (Config.Failpoint).
const (
	// FailPauseWritten: the checkpoint is written and synced, not in
	// place; the sentry runs, stopped by runsc.
	FailPauseWritten = "gvisor-pause-written"
	// FailPauseCheckpointed: the checkpoint is complete and in place; the
	// sentry still runs, stopped by runsc.
	FailPauseCheckpointed = "gvisor-pause-checkpointed"
	// FailResumeRestored: the sandbox is restored and its init answered;
	// the checkpoint is still in place.
	FailResumeRestored = "gvisor-resume-restored"
	// FailResumeLoaded: runsc says the restore has loaded the guest's
	// memory; the checkpoint is still in place. It runs in the goroutine
	// that drops the checkpoint, after Resume returned.
	FailResumeLoaded = "gvisor-resume-loaded"
)

func (sb *sandbox) checkpointDir() string    { return filepath.Join(sb.dir, checkpointName) }
func (sb *sandbox) checkpointNewDir() string { return filepath.Join(sb.dir, checkpointNewName) }
func (sb *sandbox) checkpointOldDir() string { return filepath.Join(sb.dir, checkpointOldName) }

// errPaused is the answer to an operation that needs sb's init while it
// is a checkpoint on disk.
func (sb *sandbox) errPaused() error {
	return fmt.Errorf("%w: sandbox %s is paused; resume it first", backend.ErrPaused, sb.id)
}

func (b *Backend) failpoint(name string) {
	if b.cfg.Failpoint != nil {
		b.cfg.Failpoint(name)
	}
}

// CanPause implements backend.Pauser: runsc checkpoints and restores on
// every platform the backend runs.
func (b *Backend) CanPause() error { return nil }

// Pause implements backend.Pauser: sb checkpointed, its sentry and gofer
// ended. A sandbox that runs a command (or its warm-up) is refused as
// busy.
func (b *Backend) Pause(ctx context.Context, id string) (backend.PauseInfo, error) {
	sb, err := b.lookup(id)
	if err != nil {
		return backend.PauseInfo{}, err
	}
	if sb.network == networkAllowlist {
		return backend.PauseInfo{}, fmt.Errorf("%w: sandbox %s has an egress allow-list, whose network (a device the daemon serves) a gVisor checkpoint cannot carry; keep it running, or snapshot its files", backend.ErrUnsupported, id)
	}
	opCtx, done, err := sb.ops.Begin(ctx)
	if err != nil {
		return backend.PauseInfo{}, err
	}
	defer done()
	select {
	case <-sb.initSlot:
	default:
		return backend.PauseInfo{}, fmt.Errorf("%w: sandbox %s runs a command; pause it once the command ended", backend.ErrBusy, id)
	}
	defer sb.releaseInit()
	if err := sb.awaitSettled(opCtx); err != nil {
		return backend.PauseInfo{}, err
	}
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	if sb.paused {
		return backend.PauseInfo{MemoryReleased: true}, nil
	}
	if c := sb.init; sb.gone || c != nil && !c.alive() {
		return backend.PauseInfo{}, fmt.Errorf("%w: sandbox %q was terminated (its gVisor sandbox died); destroy it and create a new one", backend.ErrNotFound, id)
	}
	if sb.init == nil {
		// Re-adopted and not used since (its init was lost): boot one,
		// so that a paused sandbox is always a checkpoint.
		if sb.init, err = b.boot(opCtx, sb); err != nil {
			return backend.PauseInfo{}, err
		}
	}
	start := time.Now()
	size, err := b.checkpoint(opCtx, sb)
	if err != nil {
		return backend.PauseInfo{}, err
	}
	b.failpoint(FailPauseCheckpointed)
	// Committed: the sandbox is its checkpoint. Its sentry and gofer end.
	sb.init.close()
	sb.init, sb.paused = nil, true
	b.endSentry(sb)
	b.log.With("sandbox", id).Info("sandbox paused: checkpointed, its gVisor sandbox ended", "took", time.Since(start), "checkpoint_bytes", size)
	return backend.PauseInfo{MemoryReleased: true}, nil
}

// endSentry stops sb's runsc sandbox (its sentry and gofer) and removes
// its cgroup: what it held of the host's memory goes back. The caller
// holds sb.initMu, or has sb to itself (load).
func (b *Backend) endSentry(sb *sandbox) {
	log := b.log.With("sandbox", sb.id)
	if out, err := b.cli(context.Background(), cliTimeout, "delete", "--force", sb.containerID()); err != nil && !notExist(out) {
		log.Error("cannot end the gVisor sandbox of a paused sandbox; its resume deletes it", "error", err)
	} else {
		sb.runscGone = true
	}
	b.killRunscStrays(sb.bundleDir())
	if sb.runscGone {
		b.removeStaleControlSockets(sb.containerID())
	}
	if err := b.removeCgroup(sb); err != nil {
		log.Warn("cannot remove the cgroup of a paused sandbox; its resume replaces it", "error", err)
	}
	sb.cg = nil
}

// checkpoint writes sb's checkpoint into place, its tasks stopped by
// runsc, and returns its size. On any error nothing of it is kept and the
// sandbox runs on as it was.
func (b *Backend) checkpoint(ctx context.Context, sb *sandbox) (int64, error) {
	tmp := sb.checkpointNewDir()
	if err := statedir.RemoveAll(tmp); err != nil {
		return 0, fmt.Errorf("%w: sandbox %s: a previous checkpoint's leftover cannot be removed: %v", backend.ErrUnavailable, sb.id, err)
	}
	if err := b.roomForCheckpoint(sb); err != nil {
		return 0, err
	}
	if out, err := b.cli(ctx, cliTimeout, "pause", sb.containerID()); err != nil {
		return 0, fmt.Errorf("%w: cannot stop sandbox %s's tasks for its checkpoint (it runs on as it was): %v: %s", backend.ErrUnavailable, sb.id, err, out)
	}
	// Not deferred: a crash test's failpoint ends the goroutine (as a
	// kill -9 ends the daemon) without this cleanup.
	undo := func(err error) (int64, error) {
		_ = statedir.RemoveAll(tmp)
		if out, rerr := b.cli(context.WithoutCancel(ctx), cliTimeout, "resume", sb.containerID()); rerr != nil {
			b.log.With("sandbox", sb.id).Error("cannot resume the gVisor sandbox after a failed checkpoint; its processes stay stopped until its destroy", "error", rerr, "output", string(out))
		}
		return 0, err
	}
	out, err := b.cli(ctx, checkpointTimeout, "checkpoint", "--leave-running", "--image-path", tmp, sb.containerID())
	if err != nil {
		if isNoSpace(out) {
			return undo(fmt.Errorf("%w: the checkpoint of sandbox %s did not fit on the host's disk (it runs on as it was): %s", backend.ErrNoSpace, sb.id, lastLine(out)))
		}
		return undo(fmt.Errorf("%w: runsc could not checkpoint sandbox %s (it runs on as it was): %v", backend.ErrUnavailable, sb.id, err))
	}
	size, err := syncedSize(tmp)
	switch {
	case errors.Is(err, unix.ENOSPC):
		return undo(fmt.Errorf("%w: the checkpoint of sandbox %s did not fit on the host's disk (it runs on as it was)", backend.ErrNoSpace, sb.id))
	case err != nil:
		return undo(fmt.Errorf("%w: the checkpoint of sandbox %s cannot be kept (it runs on as it was): %v", backend.ErrUnavailable, sb.id, err))
	case size > b.cfg.MaxCheckpointBytes:
		return undo(fmt.Errorf("%w: sandbox %s's checkpoint is %d bytes, more than gvisor.max_checkpoint_bytes (%d) allows; it runs on as it was (free memory in it, or raise the cap)", backend.ErrNoSpace, sb.id, size, b.cfg.MaxCheckpointBytes))
	}
	b.failpoint(FailPauseWritten)
	// A previous resume's checkpoint that its load's end did not drop
	// (settleRestore could not tell) is stale: the sentry read all of it
	// before this checkpoint was written.
	b.dropCheckpoint(sb)
	if err := os.Rename(tmp, sb.checkpointDir()); err != nil {
		return undo(fmt.Errorf("%w: the checkpoint of sandbox %s cannot be put in place (it runs on as it was): %v", backend.ErrUnavailable, sb.id, err))
	}
	if err := syncDir(sb.dir); err != nil {
		_ = os.Rename(sb.checkpointDir(), tmp)
		return undo(fmt.Errorf("%w: the checkpoint of sandbox %s cannot be made durable (it runs on as it was): %v", backend.ErrUnavailable, sb.id, err))
	}
	return size, nil
}

// roomForCheckpoint refuses a checkpoint the state directory's filesystem
// has no room for: at most what the sandbox's cgroup holds (its memory,
// the sentry's included), and a reserve. Without a cgroup only the
// reserve is checked; a checkpoint that fills the disk fails and is
// removed all the same.
func (b *Backend) roomForCheckpoint(sb *sandbox) error {
	var need uint64 = spaceReserve
	if sb.cg != nil {
		if st, err := sb.cg.Stats(); err == nil {
			need += uint64(st.MemoryBytes)
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(sb.dir, &st); err != nil {
		return nil // not knowing is no reason to refuse
	}
	if free := st.Bavail * uint64(st.Bsize); free < need {
		return fmt.Errorf("%w: the state directory has %d bytes free, and sandbox %s's checkpoint needs up to %d; it runs on as it was", backend.ErrNoSpace, free, sb.id, need)
	}
	return nil
}

// isNoSpace reports whether runsc's output says the disk was full.
func isNoSpace(out []byte) bool {
	return strings.Contains(string(out), "no space left on device")
}

// lastLine is the last non-empty line of runsc's output, bounded.
func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return backend.ShortName(lines[len(lines)-1])
}

// syncedSize fsyncs every file of the checkpoint directory dir (runsc
// writes them without) and the directory, and returns their total size.
// A checkpoint holds a few regular files and nothing else.
func syncedSize(dir string) (int64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, e := range entries {
		if !e.Type().IsRegular() {
			return 0, fmt.Errorf("the checkpoint holds %s, which is not a regular file", e.Name())
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return 0, err
		}
		fi, err := f.Stat()
		if err == nil {
			total += fi.Size()
			err = f.Sync()
		}
		f.Close()
		if err != nil {
			return 0, err
		}
	}
	return total, syncDir(dir)
}

// Resume implements backend.Pauser: sb restored from its checkpoint, its
// init re-attached, the checkpoint removed.
func (b *Backend) Resume(ctx context.Context, id string) error {
	sb, err := b.lookup(id)
	if err != nil {
		return err
	}
	opCtx, done, err := sb.ops.Begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	select {
	case <-sb.initSlot:
	case <-opCtx.Done():
		return opCtx.Err()
	}
	defer sb.releaseInit()
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	if !sb.paused {
		return nil
	}
	start := time.Now()
	c, err := b.start(opCtx, sb, sb.checkpointDir())
	if err != nil {
		return fmt.Errorf("sandbox %s stays paused: %w", id, err)
	}
	sb.init, sb.gone, sb.goneReported = c, false, false
	b.failpoint(FailResumeRestored)
	sb.paused = false
	sb.settled = b.settleRestore(sb, c)
	b.log.With("sandbox", id).Info("sandbox resumed: restored from its checkpoint", "took", time.Since(start))
	return nil
}

// awaitSettled waits, until ctx ends, for the end of the load of sb's
// last resume (settleRestore).
func (sb *sandbox) awaitSettled(ctx context.Context) error {
	sb.initMu.Lock()
	settled := sb.settled
	sb.initMu.Unlock()
	if settled == nil {
		return nil
	}
	select {
	case <-settled:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// restoreLoaded waits until the sentry of sb, restored in the background,
// has loaded all of the guest's memory from its checkpoint (at once when
// it has): runsc is done with the checkpoint's files. An error means the
// load failed (gVisor then kills the sandbox), or runsc could not say.
func (b *Backend) restoreLoaded(ctx context.Context, sb *sandbox) error {
	out, err := b.cli(ctx, restoreLoadTimeout, "wait", "--restore", sb.containerID())
	if err != nil {
		return fmt.Errorf("%v: %s", err, lastLine(out))
	}
	return nil
}

// settleRestore drops, in the background, the checkpoint of sb, just
// resumed with init c, once its restore has loaded the guest's memory
// from it; it returns a channel closed when that is settled. A load that
// failed ended the restored gVisor sandbox: sb is paused again, its
// checkpoint kept, as a daemon that restarted then would find it (load).
// Destroy and Close stop the wait and leave the checkpoint: the next
// daemon settles it when it loads the sandbox.
func (b *Backend) settleRestore(sb *sandbox, c *initConn) chan struct{} {
	settled := make(chan struct{})
	ctx, done, err := sb.ops.Begin(context.Background())
	if err != nil {
		close(settled)
		return settled
	}
	go func() {
		defer close(settled)
		defer done()
		// Not at once: a runsc process's start (tens of ms of CPU) would
		// take the CPU from the command that resumed the sandbox.
		if !sleepCtx(ctx, settleDelay) {
			return
		}
		err := b.restoreLoaded(ctx, sb)
		switch {
		case ctx.Err() != nil:
		case err == nil:
			b.failpoint(FailResumeLoaded)
			b.dropCheckpoint(sb)
		default:
			b.restoreFailed(sb, c, err)
		}
	}()
	return settled
}

// restoreFailed makes sb paused again after its restore failed to load the
// guest's memory (err), once its restored init c is gone (gVisor kills
// the sandbox). Commands that ran in it meanwhile read sandbox_terminated.
// A restored init that lives on keeps the checkpoint until the next pause
// replaces it: runsc could not say whether the load ended.
func (b *Backend) restoreFailed(sb *sandbox, c *initConn, err error) {
	log := b.log.With("sandbox", sb.id)
	t := time.NewTimer(reattachTimeout)
	select {
	case <-c.dead:
	case <-t.C:
	}
	t.Stop()
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	if c.alive() || sb.paused || sb.init != c && (sb.init != nil || !sb.gone) {
		log.Warn("cannot tell whether a resumed sandbox's memory was loaded from its checkpoint; the checkpoint stays until its next pause", "error", err)
		return
	}
	if sb.init == c {
		c.close()
	}
	sb.init, sb.paused, sb.gone, sb.goneReported = nil, true, false, false
	b.endSentry(sb)
	log.Error("a resumed sandbox's memory could not be loaded from its checkpoint: it is paused again, as it was", "error", err, "log", c.logTail())
}

// dropCheckpoint removes the checkpoint of a sandbox that runs again.
func (b *Backend) dropCheckpoint(sb *sandbox) {
	if err := os.Rename(sb.checkpointDir(), sb.checkpointOldDir()); errors.Is(err, fs.ErrNotExist) {
		return
	} else if err != nil {
		b.log.With("sandbox", sb.id).Warn("cannot remove the checkpoint of a resumed sandbox", "error", err)
		return
	}
	_ = syncDir(sb.dir)
	if err := statedir.RemoveAll(sb.checkpointOldDir()); err != nil {
		b.log.With("sandbox", sb.id).Warn("cannot remove the checkpoint of a resumed sandbox", "error", err)
	}
}

// Paused implements backend.Pauser. A paused gVisor sandbox is a
// checkpoint on disk, its sentry ended: its memory is given back.
func (b *Backend) Paused(ctx context.Context, id string) (*backend.PauseInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sb, err := b.lookup(id)
	if err != nil {
		return nil, err
	}
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	if !sb.paused {
		return nil, nil
	}
	return &backend.PauseInfo{MemoryReleased: true}, nil
}

// checkpointPagesName is the file of a checkpoint that holds the guest's
// memory (runsc's name).
const checkpointPagesName = "pages.img"

// directReads reports whether runsc may read the guest's memory of the
// checkpoint in dir with O_DIRECT (`restore --direct`,
// Config.BufferedRestoreReads), which its filesystem may refuse (EINVAL:
// tmpfs before Linux 6.6, some FUSE and network filesystems).
func directReads(dir string) bool {
	fd, err := unix.Open(filepath.Join(dir, checkpointPagesName), unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

// attachRestored makes the attach handshake with the init of a sandbox
// just restored, through c's fresh FIFOs, by deadline.
func (b *Backend) attachRestored(ctx context.Context, sb *sandbox, c *initConn, deadline time.Time) error {
	nonce := make([]byte, gvwire.NonceSize)
	_, _ = rand.Read(nonce)
	if err := c.send(gvwire.KindAttach, nonce); err != nil {
		return fmt.Errorf("%w: the restored init of sandbox %s cannot be written to: %v: %s", backend.ErrUnavailable, sb.id, err, c.logTail())
	}
	stop := context.AfterFunc(ctx, func() { _ = c.fromInit.SetReadDeadline(time.Now()) })
	pending, err := skipToAttached(c.fromInit, nonce, deadline)
	stop()
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("the restore of sandbox %s was stopped: %w", sb.id, ctx.Err())
		}
		return fmt.Errorf("%w: the restored init of sandbox %s did not answer: %v: %s", backend.ErrUnavailable, sb.id, err, c.logTail())
	}
	c.pending = pending
	return c.fromInit.SetReadDeadline(time.Time{})
}

// runscStatus is what `runsc state` says of sb's runsc sandbox ("running",
// "paused", ...), or "" when runsc has none.
func (b *Backend) runscStatus(sb *sandbox) string {
	out, err := b.cli(context.Background(), cliTimeout, "state", sb.containerID())
	if err != nil {
		return ""
	}
	var st struct {
		Status string `json:"status"`
	}
	if json.Unmarshal(out, &st) != nil {
		return ""
	}
	return st.Status
}

// loadPause settles what a previous daemon left of a pause or a resume of
// sb (load calls it before it re-attaches to an init) and reports whether
// sb is paused: its checkpoint in place. A checkpoint being written or
// removed goes; a sentry runsc stopped is ended when the checkpoint is in
// place (the pause had committed) and resumed otherwise.
func (b *Backend) loadPause(sb *sandbox) (checkpointed bool) {
	log := b.log.With("sandbox", sb.id)
	forks, _ := filepath.Glob(filepath.Join(sb.dir, forkCheckpointPrefix+"*"))
	for _, p := range append(forks, sb.checkpointNewDir(), sb.checkpointOldDir()) {
		if err := statedir.RemoveAll(p); err != nil {
			log.Warn("cannot remove a checkpoint's leftover", "path", p, "error", err)
		}
	}
	_, err := os.Lstat(sb.checkpointDir())
	checkpointed = err == nil
	if b.runscStatus(sb) == "paused" {
		if checkpointed {
			log.Info("finishing a pause a previous daemon committed: its gVisor sandbox ends")
			b.endSentry(sb)
		} else if out, err := b.cli(context.Background(), cliTimeout, "resume", sb.containerID()); err != nil {
			log.Warn("cannot resume a gVisor sandbox a previous daemon left stopped", "error", err, "output", string(out))
		} else {
			log.Info("resumed a gVisor sandbox a previous daemon left stopped (a pause or a snapshot cut short)")
		}
	}
	return checkpointed
}

// syncDir fsyncs directory dir, making the renames in it durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
