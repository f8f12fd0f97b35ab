package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"syscall"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
)

// File operations run on the host (backend/hostfs, confined with os.Root)
// on the sandbox's work/ and tmp/ directories, which are bound into the
// guest with gVisor's shared file access (--file-access-mounts=shared): the
// guest sees a host write at once and the host a guest write, with no cache
// in between. Files the daemon writes belong to the guest uid.

// openArea resolves p and opens its area of sb's files (hostfs.OpenArea).
func openArea(sb *sandbox, p string) (*os.Root, string, error) {
	return hostfs.OpenArea(sb.dir, sb.id, p)
}

// fileOp registers a file operation on sandbox id, so Destroy waits for it.
func (b *Backend) fileOp(ctx context.Context, id string) (*sandbox, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	sb, err := b.lookup(id)
	if err != nil {
		return nil, nil, err
	}
	_, done, err := sb.ops.Begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	return sb, done, nil
}

// ReadFile returns the regular file at p (see hostfs.Read). A path the
// host lacks but the guest has (a FIFO or socket made inside gVisor, which
// exist only in its memory) is refused as such, like any FIFO.
func (b *Backend) ReadFile(ctx context.Context, id, p string, maxBytes int64) ([]byte, error) {
	if maxBytes < 0 {
		return nil, fmt.Errorf("%w: maxBytes %d is negative", backend.ErrInvalidArgument, maxBytes)
	}
	sb, done, err := b.fileOp(ctx, id)
	if err != nil {
		return nil, err
	}
	defer done()
	root, rel, err := openArea(sb, p)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	data, err := hostfs.Read(root, rel, p, maxBytes)
	if errors.Is(err, backend.ErrPathNotFound) {
		if kind, ok := b.guestOnly(ctx, sb, p); ok {
			return nil, fmt.Errorf("%w: %s is a %s that exists only inside the sandbox (gVisor keeps FIFOs and sockets in its own memory), not a regular file; use run_command for it", backend.ErrBadPath, backend.ShortName(p), kind)
		}
	}
	return data, err
}

// WriteFile writes data to p (see hostfs.Write), owned by the guest uid.
func (b *Backend) WriteFile(ctx context.Context, id, p string, data []byte, mode os.FileMode) error {
	sb, done, err := b.fileOp(ctx, id)
	if err != nil {
		return err
	}
	defer done()
	root, rel, err := openArea(sb, p)
	if err != nil {
		return err
	}
	defer root.Close()
	return hostfs.Write(root, rel, p, data, mode, hostfs.Owner{UID: guestUID, GID: guestGID})
}

// ListDirectory lists the directory at p (see hostfs.List). FIFOs and
// sockets made inside gVisor are not in the host's view, so not listed.
func (b *Backend) ListDirectory(ctx context.Context, id, p string, maxEntries int) ([]backend.DirEntry, error) {
	if maxEntries <= 0 {
		return nil, fmt.Errorf("%w: maxEntries must be positive, got %d", backend.ErrInvalidArgument, maxEntries)
	}
	sb, done, err := b.fileOp(ctx, id)
	if err != nil {
		return nil, err
	}
	defer done()
	root, rel, err := openArea(sb, p)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return hostfs.List(root, rel, p, maxEntries)
}

// guestOnly tells, for a path the host's view of the sandbox's files
// lacks, whether the guest has something there all the same, and what.
func (b *Backend) guestOnly(ctx context.Context, sb *sandbox, p string) (string, bool) {
	sb.initMu.Lock()
	c := sb.init
	sb.initMu.Unlock()
	if c == nil || !c.alive() {
		return "", false
	}
	guest := p
	if !path.IsAbs(guest) {
		guest = guestWorkspace + "/" + guest
	}
	typ, errno, err := c.guestLstat(ctx, path.Clean(guest))
	if err != nil || errno != 0 || typ == 0 {
		return "", false
	}
	switch typ {
	case syscall.S_IFIFO:
		return "FIFO", true
	case syscall.S_IFSOCK:
		return "socket", true
	case syscall.S_IFCHR, syscall.S_IFBLK:
		return "device", true
	}
	// A file, directory or symlink the host does not see (yet): report
	// it missing, as the host found it.
	return "", false
}
