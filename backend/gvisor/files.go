package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"syscall"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
)

// Writes run on the host (backend/hostfs, confined with os.Root) on the
// sandbox's work/ and tmp/ directories, which are bound into the guest with
// gVisor's shared file access (--file-access-mounts=shared): the guest sees
// a host write at once and the host a guest write, with no cache in
// between. Files the daemon writes belong to the guest uid. Reads and
// listings take any path of the sandbox's own view and are served inside
// it, as its guest (opener.go, guestfiles.go); only a terminated sandbox's
// workspace and /tmp are read on the host.

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

// ReadFile returns the file at p as the sandbox sees it, bounded as
// hostfs.ReadOpened reads (an endless device is too large, never an
// endless read; FIFOs and sockets are refused).
func (b *Backend) ReadFile(ctx context.Context, id, p string, maxBytes int64) ([]byte, error) {
	if maxBytes < 0 {
		return nil, fmt.Errorf("%w: maxBytes %d is negative", backend.ErrInvalidArgument, maxBytes)
	}
	data, _, err := b.inGuest(ctx, id, p, gvwire.FileRequest{Op: gvwire.FileRead, N: maxBytes}, maxBytes)
	if errors.Is(err, errNoGuest) {
		err = b.inTerminated(ctx, id, p, func(root *os.Root, rel string) (err error) {
			data, err = hostfs.Read(root, rel, p, maxBytes)
			return err
		})
	}
	return data, err
}

// WriteFile writes data to p (see hostfs.Write), owned by the guest uid.
func (b *Backend) WriteFile(ctx context.Context, id, p string, data []byte, mode os.FileMode) error {
	return b.inArea(ctx, id, p, func(sb *sandbox, root *os.Root, rel string) error {
		return hostfs.Write(root, rel, p, data, mode, hostfs.Owner{UID: guestUID, GID: guestGID})
	})
}

// ListDirectory lists the directory at p as the sandbox sees it (see
// hostfs.ListOpened).
func (b *Backend) ListDirectory(ctx context.Context, id, p string, maxEntries int) ([]backend.DirEntry, error) {
	if maxEntries <= 0 {
		return nil, fmt.Errorf("%w: maxEntries must be positive, got %d", backend.ErrInvalidArgument, maxEntries)
	}
	data, _, err := b.inGuest(ctx, id, p, gvwire.FileRequest{Op: gvwire.FileList, N: int64(maxEntries)}, gvwire.EntryBytes(maxEntries))
	if errors.Is(err, errNoGuest) {
		var entries []backend.DirEntry
		err = b.inTerminated(ctx, id, p, func(root *os.Root, rel string) (err error) {
			entries, err = hostfs.List(root, rel, p, maxEntries)
			return err
		})
		return entries, err
	}
	if err != nil {
		return nil, err
	}
	entries, err := gvwire.DecodeEntries(data, maxEntries)
	if err != nil {
		return nil, fmt.Errorf("%w: sandbox %s sent a listing of %s that is not one: %v", backend.ErrUnavailable, id, backend.ShortName(p), err)
	}
	return entries, nil
}

// inTerminated runs fn on p of a terminated sandbox, when p lies in its
// workspace or /tmp (still on the host until Destroy, confined as writes
// are); any other path is the sandbox's and gone with it.
func (b *Backend) inTerminated(ctx context.Context, id, p string, fn func(root *os.Root, rel string) error) error {
	if _, err := hostfs.ResolveGuestPath(p); err != nil {
		return fmt.Errorf("%w: sandbox %q was terminated (its gVisor sandbox died): only its /workspace and /tmp can still be read; destroy it and create a new one", backend.ErrNotFound, id)
	}
	return b.inArea(ctx, id, p, func(sb *sandbox, root *os.Root, rel string) error { return fn(root, rel) })
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

// inArea runs fn with the area of sandbox id that holds p open (its root,
// and p relative to it), the file operation tracked until fn returns.
func (b *Backend) inArea(ctx context.Context, id, p string, fn func(sb *sandbox, root *os.Root, rel string) error) error {
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
	return fn(sb, root, rel)
}
