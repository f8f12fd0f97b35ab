package gvisor

// Forks with memory (backend.Forker with SnapshotOptions.Memory): the
// source's runsc checkpoint restored into each new sandbox, so its init,
// durable processes and their memory go on in every copy. The source's
// tasks are stopped by runsc from its checkpoint until the last copy's
// files are made, so the files each copy starts with are those its
// restored processes last saw; then it runs on (a paused source is its
// checkpoint already, and stays paused). Each copy has its own directory,
// cgroup and init FIFOs; its procs/ is a copy of the source's (the
// restored keepers open their logs again by path).
//
// What is reseeded: a restored sandbox's sentry is a new process, so the
// guest kernel's random source (getrandom, /dev/urandom), which gVisor
// draws from the host at each read, differs in every copy, and so do the
// address-space layouts of the processes started after. What a process
// keeps in its own memory (Python's random module, numpy's generator, a
// TLS library's pool) is a copy of the source's: the guest can tell it
// was restored, and reseed, by RestoredMarker, a file the daemon writes
// into the copy's /tmp before the restore (/tmp/.sandbox-restored: JSON
// with the source's id and when).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/registry"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/statedir"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/fscopy"
)

// RestoredMarker is the file, in a restored copy's /tmp, that tells its
// guest it was restored from another sandbox's memory.
const RestoredMarker = ".sandbox-restored"

// forkCheckpointPrefix names a memory fork's checkpoint in the source's
// directory while its copies are made.
const forkCheckpointPrefix = "checkpoint.fork-"

// memorySeed is what a memory fork's copy is restored from.
type memorySeed struct {
	checkpoint string // the source's runsc checkpoint
	procs      string // the source's procs/, as of the checkpoint
	source     string // the source's id
}

// restored is RestoredMarker's content.
type restored struct {
	From       string  `json:"from"`
	RestoredAt float64 `json:"restored_at"`
}

// seedMemory gives sb, being created, the source's processes' records and
// the restored marker.
func (b *Backend) seedMemory(ctx context.Context, sb *sandbox, mem *memorySeed) error {
	// The daemon's files (the keepers' logs and records), root's in the
	// guest: copied with the same care, and their modes.
	if err := fscopy.Copy(ctx, mem.procs, sb.procsDir(), fscopy.Options{UID: 0, GID: 0}); err != nil {
		return fmt.Errorf("copying the durable processes' records: %w", err)
	}
	data, err := json.Marshal(restored{From: mem.source, RestoredAt: float64(time.Now().UnixMicro()) / 1e6})
	if err != nil {
		return err
	}
	p := filepath.Join(sb.tmpDir(), RestoredMarker)
	_ = os.Remove(p) // the source's own, if it was a copy too
	if err := os.WriteFile(p, append(data, '\n'), 0o444); err != nil {
		return err
	}
	// Whatever the daemon's umask (the packaged unit's 0077 left it
	// root's alone, and the guest could not read it).
	return os.Chmod(p, 0o444)
}

// restoreFork boots sb, just created, from mem's checkpoint, and waits
// until the restore has loaded the guest's memory from it: the
// checkpoint (a fork's, removed when the fork ends; a paused source's,
// which its resume drops; an image's) is not the copy's to keep.
func (b *Backend) restoreFork(ctx context.Context, sb *sandbox, mem *memorySeed) error {
	select {
	case <-sb.initSlot:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer sb.releaseInit()
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	c, err := b.start(ctx, sb, mem.checkpoint)
	if err != nil {
		return err
	}
	sb.init = c
	if err := b.restoreLoaded(ctx, sb); err != nil {
		return fmt.Errorf("%w: the memory of sandbox %s could not be loaded from its checkpoint: %v", backend.ErrUnavailable, sb.id, err)
	}
	return nil
}

// forkWithMemory implements Fork with SnapshotOptions.Memory.
func (b *Backend) forkWithMemory(ctx context.Context, id string, newIDs []string) (_ backend.ForkResult, err error) {
	src, err := b.lookup(id)
	if err != nil {
		return backend.ForkResult{}, err
	}
	if src.network == networkAllowlist {
		return backend.ForkResult{}, fmt.Errorf("%w: sandbox %s has an egress allow-list, whose network a gVisor checkpoint cannot carry; fork it without memory", backend.ErrUnsupported, id)
	}
	ctx, done, err := src.ops.Begin(ctx)
	if err != nil {
		return backend.ForkResult{}, err
	}
	defer done()
	select {
	case <-src.initSlot:
	default:
		return backend.ForkResult{}, fmt.Errorf("%w: sandbox %s runs a command; fork it once the command ended", backend.ErrBusy, id)
	}
	defer src.releaseInit()
	src.initMu.Lock()
	defer src.initMu.Unlock()
	var saved persistedSpec
	if err := registry.LoadSpec(b.sandboxDir(id), id, specVersion, &saved); err != nil {
		return backend.ForkResult{}, err
	}
	spec := specOf(saved)
	spec.Seed = backend.Seed{Workspace: src.workDir(), Tmp: src.tmpDir(), KeepModes: true}
	mem := &memorySeed{checkpoint: src.checkpointDir(), procs: src.procsDir(), source: id}
	if !src.paused {
		if c := src.init; src.gone || c != nil && !c.alive() {
			return backend.ForkResult{}, fmt.Errorf("%w: sandbox %q was terminated (its gVisor sandbox died); destroy it and create a new one", backend.ErrNotFound, id)
		}
		if src.init == nil {
			if src.init, err = b.boot(ctx, src); err != nil {
				return backend.ForkResult{}, err
			}
		}
		nonce := make([]byte, 6)
		_, _ = rand.Read(nonce)
		mem.checkpoint = filepath.Join(src.dir, forkCheckpointPrefix+hex.EncodeToString(nonce))
		resume, err := b.checkpointRunning(ctx, src, mem.checkpoint)
		if err != nil {
			return backend.ForkResult{}, err
		}
		// The source runs on once every copy's files are made.
		defer func() {
			resume()
			_ = statedir.RemoveAll(mem.checkpoint)
		}()
	}
	var made []string
	defer func() {
		if err != nil {
			for _, nid := range made {
				if derr := b.Destroy(context.WithoutCancel(ctx), nid); derr != nil {
					b.log.Error("cannot remove a sandbox of a failed fork", "sandbox", nid, "error", derr)
				}
			}
		}
	}()
	res := backend.ForkResult{Frozen: true}
	for _, nid := range newIDs {
		info, err := b.create(ctx, nid, spec, mem)
		if err != nil {
			return backend.ForkResult{}, fmt.Errorf("fork of sandbox %s with its memory: %w", id, err)
		}
		made = append(made, nid)
		res.Infos = append(res.Infos, info)
	}
	b.log.Info("sandbox forked with its memory", "sandbox", id, "forks", newIDs)
	return res, nil
}

// checkpointRunning checkpoints running sandbox sb into dir, its tasks
// left stopped by runsc: resume lets them go on. On an error nothing of
// the checkpoint is kept and sb runs on.
func (b *Backend) checkpointRunning(ctx context.Context, sb *sandbox, dir string) (resume func(), err error) {
	if err := b.roomForCheckpoint(sb); err != nil {
		return nil, err
	}
	if out, err := b.cli(ctx, cliTimeout, "pause", sb.containerID()); err != nil {
		return nil, fmt.Errorf("%w: cannot stop sandbox %s's tasks for its checkpoint (it runs on as it was): %v: %s", backend.ErrUnavailable, sb.id, err, out)
	}
	resume = func() {
		if out, err := b.cli(context.WithoutCancel(ctx), cliTimeout, "resume", sb.containerID()); err != nil {
			b.log.With("sandbox", sb.id).Error("cannot resume the gVisor sandbox after its checkpoint; its processes stay stopped until its destroy", "error", err, "output", string(out))
		}
	}
	fail := func(err error) (func(), error) {
		_ = statedir.RemoveAll(dir)
		resume()
		return nil, err
	}
	out, err := b.cli(ctx, checkpointTimeout, "checkpoint", "--leave-running", "--image-path", dir, sb.containerID())
	if err != nil {
		if isNoSpace(out) {
			return fail(fmt.Errorf("%w: the checkpoint of sandbox %s did not fit on the host's disk (it runs on as it was): %s", backend.ErrNoSpace, sb.id, lastLine(out)))
		}
		return fail(fmt.Errorf("%w: runsc could not checkpoint sandbox %s (it runs on as it was): %v", backend.ErrUnavailable, sb.id, err))
	}
	if size, err := syncedSize(dir); err != nil || size > b.cfg.MaxCheckpointBytes {
		return fail(fmt.Errorf("%w: sandbox %s's checkpoint (%d bytes) cannot be kept within gvisor.max_checkpoint_bytes (%d): %v", backend.ErrNoSpace, sb.id, size, b.cfg.MaxCheckpointBytes, err))
	}
	return resume, nil
}

// Where a memory snapshot's SandboxFiles.Memory (and so its image's
// Memory) holds the checkpoint and the processes' records.
const (
	memoryCheckpointName = "checkpoint"
	memoryProcsName      = "procs"
)

// memoryOfImage is the memory a sandbox made from im is restored from:
// nil for an image without (a sandbox of it boots).
func memoryOfImage(im backend.Image) (*memorySeed, error) {
	if im.Memory == "" {
		return nil, nil
	}
	if !filepath.IsAbs(im.Memory) {
		return nil, fmt.Errorf("%w: image %s holds memory at %q, not a directory of the store; snapshot again", backend.ErrUnavailable, backend.ShortName(im.Name), im.Memory)
	}
	src := ""
	if im.Origin != nil {
		src = im.Origin.Sandbox
	}
	return &memorySeed{checkpoint: filepath.Join(im.Memory, memoryCheckpointName), procs: filepath.Join(im.Memory, memoryProcsName), source: src}, nil
}

// snapshotWithMemory implements SnapshotFiles with SnapshotOptions.Memory:
// fn gets the files and, in SandboxFiles.Memory, a checkpoint and the
// processes' records taken while every task of the sandbox is stopped by
// runsc (a paused sandbox: its own checkpoint), so the three agree.
//
// Of a sandbox on an imported image too: runsc restores a checkpoint
// into a spec whose root path and mount sources differ from those it was
// taken with, as long as the mounts' destinations, types and options are
// the same (runsc/specutils's restore validation), and the guest's files
// are found again by path. The snapshot's root is its base's root
// hard-linked with the sandbox's workspace and tmp beside it, which a
// sandbox's mounts leave out (guestOwned): a sandbox of the snapshot has
// the same mounts, of the same files, on the snapshot's own root, which
// needs nothing of the base once taken (the base may be removed).
func (b *Backend) snapshotWithMemory(ctx context.Context, id string, fn func(backend.SandboxFiles) error) error {
	sb, err := b.lookup(id)
	if err != nil {
		return err
	}
	if sb.network == networkAllowlist {
		return fmt.Errorf("%w: sandbox %s has an egress allow-list, whose network a gVisor checkpoint cannot carry; snapshot its files without memory", backend.ErrUnsupported, id)
	}
	ctx, done, err := sb.ops.Begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	select {
	case <-sb.initSlot:
	default:
		return fmt.Errorf("%w: sandbox %s runs a command; snapshot it once the command ended", backend.ErrBusy, id)
	}
	defer sb.releaseInit()
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	nonce := make([]byte, 6)
	_, _ = rand.Read(nonce)
	dir := filepath.Join(sb.dir, forkCheckpointPrefix+hex.EncodeToString(nonce))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("%w: sandbox %s: %v", backend.ErrUnavailable, id, err)
	}
	defer statedir.RemoveAll(dir)
	ckpt := filepath.Join(dir, memoryCheckpointName)
	if sb.paused {
		// Its checkpoint, linked (the store copies it).
		if err := linkFiles(sb.checkpointDir(), ckpt); err != nil {
			return fmt.Errorf("%w: the checkpoint of paused sandbox %s: %v", backend.ErrUnavailable, id, err)
		}
	} else {
		if c := sb.init; sb.gone || c != nil && !c.alive() {
			return fmt.Errorf("%w: sandbox %q was terminated (its gVisor sandbox died); destroy it and create a new one", backend.ErrNotFound, id)
		}
		if sb.init == nil {
			if sb.init, err = b.boot(ctx, sb); err != nil {
				return err
			}
		}
		resume, err := b.checkpointRunning(ctx, sb, ckpt)
		if err != nil {
			return err
		}
		defer resume()
	}
	procs := filepath.Join(dir, memoryProcsName)
	if err := os.Mkdir(procs, 0o700); err != nil {
		return fmt.Errorf("%w: %v", backend.ErrUnavailable, err)
	}
	if err := fscopy.Copy(ctx, sb.procsDir(), procs, fscopy.Options{UID: 0, GID: 0}); err != nil {
		return fmt.Errorf("%w: copying sandbox %s's processes' records: %v", backend.ErrUnavailable, id, err)
	}
	return fn(backend.SandboxFiles{Workspace: sb.workDir(), Tmp: sb.tmpDir(), Frozen: true, Memory: dir})
}

// linkFiles hard-links the regular files of directory from into a new
// directory to.
func linkFiles(from, to string) error {
	entries, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	if err := os.Mkdir(to, 0o700); err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			return fmt.Errorf("%s is not a regular file", e.Name())
		}
		if err := os.Link(filepath.Join(from, e.Name()), filepath.Join(to, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
