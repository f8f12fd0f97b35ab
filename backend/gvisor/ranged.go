package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
)

var _ backend.RangedFiles = (*Backend)(nil)

// guestOnlyError turns a "not found" for what is a guest-only FIFO or
// socket (gVisor keeps them in its own memory) into the bad_path a backend
// gives for a special file, as ReadFile does.
func (b *Backend) guestOnlyError(ctx context.Context, sb *sandbox, p string, err error) error {
	if errors.Is(err, backend.ErrPathNotFound) {
		if kind, ok := b.guestOnly(ctx, sb, p); ok {
			return fmt.Errorf("%w: %s is a %s that exists only inside the sandbox (gVisor keeps FIFOs and sockets in its own memory), not a regular file; use run_command for it", backend.ErrBadPath, backend.ShortName(p), kind)
		}
	}
	return err
}

// ReadFileRange implements backend.RangedFiles for any regular file of
// the sandbox's view, read inside it as ReadFile reads.
func (b *Backend) ReadFileRange(ctx context.Context, id, p string, offset, length int64) ([]byte, int64, error) {
	if offset < 0 || length < 0 {
		return nil, 0, fmt.Errorf("%w: offset %d and length %d must not be negative", backend.ErrInvalidArgument, offset, length)
	}
	data, d, err := b.inGuest(ctx, id, p, gvwire.FileRequest{Op: gvwire.FileRange, Offset: offset, N: length}, length)
	if errors.Is(err, errNoGuest) {
		var size int64
		err = b.inTerminated(ctx, id, p, func(root *os.Root, rel string) (err error) {
			data, size, err = hostfs.ReadRange(root, rel, p, offset, length)
			return err
		})
		return data, size, err
	}
	if err != nil {
		return nil, 0, err
	}
	return data, d.Size, nil
}

// WriteFileAt implements backend.RangedFiles, confined as WriteFile is.
func (b *Backend) WriteFileAt(ctx context.Context, id, p string, data []byte, offset int64) (int64, error) {
	var size int64
	err := b.inArea(ctx, id, p, func(sb *sandbox, root *os.Root, rel string) (err error) {
		size, err = hostfs.WriteAt(root, rel, p, data, offset)
		return b.guestOnlyError(ctx, sb, p, err)
	})
	return size, err
}
