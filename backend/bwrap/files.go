package bwrap

import (
	"context"
	"fmt"
	"os"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap/bwwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
)

// writeTempPrefix names WriteFile's temporary files.
const writeTempPrefix = hostfs.TempPrefix

// openArea resolves p and opens its area of sb's files (hostfs.OpenArea).
func openArea(sb *sandbox, p string) (*os.Root, string, error) {
	return hostfs.OpenArea(sb.dataDir(), sb.id, p)
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
	_, done, err := sb.begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	if b.viaCaps && sb.own {
		// A non-root daemon reaches the guest's files as the guest's uid
		// (it cannot override their permissions) and what it creates is
		// then the guest's: the whole operation runs on this goroutine's
		// thread with the sandbox's filesystem ids (privilege.go).
		restore, err := lockFSIDs(sb.uid, sb.gid)
		if err != nil {
			done()
			return nil, nil, fmt.Errorf("%w: cannot take the host uid of sandbox %s: %v", backend.ErrUnavailable, id, err)
		}
		return sb, func() { restore(); done() }, nil
	}
	return sb, done, nil
}

// ReadFile returns the file at p as the sandbox sees it: any path of its
// own view (relative ones start at /workspace), opened inside the sandbox
// as its guest (opener.go) and read by the daemon through the descriptor,
// bounded as hostfs.ReadOpened reads: a regular file's size is checked
// before reading and never more than maxBytes+1 bytes are read, so a file
// growing meanwhile, a /proc file or an endless device (/dev/zero) returns
// *backend.FileTooLargeError. FIFOs, sockets and block devices are refused.
func (b *Backend) ReadFile(ctx context.Context, id, p string, maxBytes int64) ([]byte, error) {
	if maxBytes < 0 {
		return nil, fmt.Errorf("%w: maxBytes %d is negative", backend.ErrInvalidArgument, maxBytes)
	}
	var data []byte
	err := b.inGuest(ctx, id, p, bwwire.OpenRead, func(f *os.File) (err error) {
		data, err = hostfs.ReadOpened(f, p, maxBytes)
		return err
	})
	return data, err
}

// WriteFile writes data to p, which must lie in /workspace or /tmp (the
// sandbox's own storage, under its disk cap), creating missing parent directories (0755).
// The data goes to a temporary file in the same directory that is then
// renamed over p, so a symlink at p is replaced, never written through, and a
// reader never sees half a file. mode 0 means 0644; only permission bits are
// used. The file and every directory created are owned by the sandbox's
// uid so the guest can change them.
func (b *Backend) WriteFile(ctx context.Context, id, p string, data []byte, mode os.FileMode) (err error) {
	return b.inArea(ctx, id, p, func(sb *sandbox, root *os.Root, rel string) error {
		return hostfs.Write(root, rel, p, data, mode, hostfs.Owner{UID: sb.uid, GID: sb.gid})
	})
}

// ListDirectory lists the directory at p as the sandbox sees it (opened
// there as ReadFile opens a file), sorted by name. IsDir comes from the
// entry's own type, so a symlink to a directory is reported as not a
// directory. More than maxEntries entries returns ErrTooManyEntries without
// reading the rest.
func (b *Backend) ListDirectory(ctx context.Context, id, p string, maxEntries int) ([]backend.DirEntry, error) {
	if maxEntries <= 0 {
		return nil, fmt.Errorf("%w: maxEntries must be positive, got %d", backend.ErrInvalidArgument, maxEntries)
	}
	var entries []backend.DirEntry
	err := b.inGuest(ctx, id, p, bwwire.OpenList, func(f *os.File) (err error) {
		entries, err = hostfs.ListOpened(f, p, maxEntries)
		return err
	})
	return entries, err
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
