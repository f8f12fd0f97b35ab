package backend

// Snapshots and forks: a sandbox's files, held still for a moment, made
// an image of the store (Snapshotter) or copied into new sandboxes
// (Forker); and the seed a new sandbox starts its /workspace and /tmp
// from (Spec.Seed).

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"
)

// ErrNoSpace: the host's disk (the state directory) is full; nothing was
// kept of what the operation was making, and the sandbox is as it was.
// Freeing space and retrying helps.
var ErrNoSpace = errors.New("no space left on the host")

// Directories of an image root that seed a new sandbox (Image.Seed):
// they hold the files a snapshot took from its sandbox.
const (
	SeedWorkspace = "workspace"
	SeedTmp       = "tmp"
)

// Seed is what a new sandbox's /workspace and /tmp start with: copies of
// these host directories, made by Create before anything runs in the
// sandbox (an image's, for a sandbox made from a snapshot; another
// sandbox's, for a fork). The copy treats them as hostile (sandbox/fscopy)
// and gives every file the new sandbox's owner.
type Seed struct {
	// Workspace and Tmp are host directories; "" seeds nothing there.
	Workspace, Tmp string
	// ReadAs, when set, wraps every read of them (fscopy.Options.ReadAs):
	// a daemon without CAP_DAC_READ_SEARCH reads another sandbox's files
	// with that sandbox's filesystem ids.
	ReadAs func(fn func() error) error
	// KeepModes keeps the files' modes as they are (a fork); otherwise
	// every file is made writable by its owner (an image's files are
	// read-only in the store).
	KeepModes bool
}

// IsZero reports whether s seeds nothing.
func (s Seed) IsZero() bool { return s.Workspace == "" && s.Tmp == "" }

// Seed is the seed of a sandbox made from im: its root's workspace and
// tmp, those that are directories (zero for the host image, and for an
// image without them).
func (im Image) Seed() Seed {
	if im.Root == "" {
		return Seed{}
	}
	var s Seed
	if isDir(filepath.Join(im.Root, SeedWorkspace)) {
		s.Workspace = filepath.Join(im.Root, SeedWorkspace)
	}
	if isDir(filepath.Join(im.Root, SeedTmp)) {
		s.Tmp = filepath.Join(im.Root, SeedTmp)
	}
	return s
}

func isDir(p string) bool {
	fi, err := os.Lstat(p)
	return err == nil && fi.IsDir()
}

// RunsOnHost reports whether a sandbox of im runs on the host's root:
// the built-in image, or a snapshot of a sandbox that did (Base
// HostImage), whose root holds only that sandbox's files.
func (im Image) RunsOnHost() bool { return im.IsHost() || im.Base == HostImage }

// ImageOrigin says where a snapshot came from.
type ImageOrigin struct {
	// Sandbox is the sandbox whose files it holds; BaseImage and
	// BaseDigest the image that sandbox ran on.
	Sandbox, BaseImage, BaseDigest string
	// Taken is when it was taken.
	Taken time.Time
	// UID is the uid of the client that took it (nil for one pulled from
	// a registry): only that uid and the daemon's admins may run a
	// sandbox on it or remove it.
	UID *uint32
}

// UsableBy reports whether a client of uid (admin or not) may run
// sandboxes on im: a snapshot a client took is its uid's (its files are
// that uid's sandbox's); every other image is everyone's.
func (im Image) UsableBy(uid uint32, admin bool) bool {
	return admin || im.Origin == nil || im.Origin.UID == nil || *im.Origin.UID == uid
}

// SnapshotOptions say what a snapshot or a fork takes of a sandbox.
type SnapshotOptions struct {
	// Memory asks for its processes and their memory too (gVisor's
	// checkpoint, of a sandbox without egress allow-lists); other
	// backends answer ErrUnsupported.
	Memory bool
}

// SandboxFiles are a sandbox's files as Snapshotter hands them over.
type SandboxFiles struct {
	// Workspace and Tmp are the host directories of its /workspace and
	// /tmp. They are the guest's: hostile, read with sandbox/fscopy.
	Workspace, Tmp string
	// ReadAs wraps every read of them (nil: the daemon reads them as
	// itself); see Seed.ReadAs.
	ReadAs func(fn func() error) error
	// Frozen says every process of the sandbox is stopped while the
	// files are handed over (the cgroup freezer), so no command writes
	// half a file into the copy. Without it (no cgroup of its own, no
	// freezer) the files are copied as they are at each moment.
	Frozen bool
	// Memory, with SnapshotOptions.Memory, is a host directory of the
	// sandbox's processes and their memory as of the files (gVisor: its
	// runsc checkpoint and its processes' records), for the image to
	// keep (Image.Memory). Its content is the guest's memory.
	Memory string
}

// Snapshotter is implemented by backends whose sandboxes' files are host
// directories that can be copied: the snapshot op.
type Snapshotter interface {
	// SnapshotFiles runs fn with sandbox id's files, its processes frozen
	// while fn runs where the backend can freeze them, and thawed after
	// whatever fn did (unless they were frozen before: a paused sandbox
	// stays paused). A crash meanwhile leaves them thawed at the next
	// adopt. opts.Memory is ErrUnsupported where the backend cannot
	// hand over SandboxFiles.Memory.
	SnapshotFiles(ctx context.Context, id string, opts SnapshotOptions, fn func(SandboxFiles) error) error
}

// ForkResult is what Fork made.
type ForkResult struct {
	// Infos are the new sandboxes', in the order of their ids.
	Infos []Info
	// Frozen says the source's processes were frozen while its files
	// were copied (SandboxFiles.Frozen).
	Frozen bool
}

// Forker is implemented by backends that can make new sandboxes as copies
// of one: the fork op.
type Forker interface {
	// Fork creates one sandbox per id of newIDs with sandbox id's spec
	// (its image, network, environment and resources), each with a host
	// uid of its own where the backend gives them, and its /workspace and
	// /tmp copies of id's now (Spec.Seed, id frozen meanwhile where it
	// can be). The source runs on. All or nothing: when one cannot be
	// made, those made are destroyed and the error returned. opts.Memory
	// is ErrUnsupported where the backend cannot copy processes.
	Fork(ctx context.Context, id string, newIDs []string, opts SnapshotOptions) (ForkResult, error)
}

// CreateEach creates one sandbox of b per id with spec, in order: all or
// nothing. When one cannot be made, those made are destroyed (whatever
// ctx says: cleanup is detached), each destroy that fails is handed to
// destroyFailed, and the create's error is returned. The forks of every
// backend are made so.
func CreateEach(ctx context.Context, b Backend, ids []string, spec Spec, destroyFailed func(id string, err error)) ([]Info, error) {
	infos := make([]Info, 0, len(ids))
	for i, id := range ids {
		info, err := b.Create(ctx, id, spec)
		if err != nil {
			for _, made := range ids[:i] {
				if derr := b.Destroy(context.WithoutCancel(ctx), made); derr != nil {
					destroyFailed(made, derr)
				}
			}
			return nil, err
		}
		infos = append(infos, info)
	}
	return infos, nil
}
