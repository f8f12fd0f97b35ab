package bwrap

import (
	"context"
	"fmt"
	"os"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap/bwwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
)

var _ backend.RangedFiles = (*Backend)(nil)

// ReadFileRange implements backend.RangedFiles for any regular file of
// the sandbox's view, opened there as ReadFile opens it.
func (b *Backend) ReadFileRange(ctx context.Context, id, p string, offset, length int64) ([]byte, int64, error) {
	if offset < 0 || length < 0 {
		return nil, 0, fmt.Errorf("%w: offset %d and length %d must not be negative", backend.ErrInvalidArgument, offset, length)
	}
	var data []byte
	var size int64
	err := b.inGuest(ctx, id, p, bwwire.OpenRead, func(f *os.File) (err error) {
		data, size, err = hostfs.ReadRangeOpened(f, p, offset, length)
		return err
	})
	return data, size, err
}

// WriteFileAt implements backend.RangedFiles, confined to /workspace and
// /tmp as WriteFile is.
func (b *Backend) WriteFileAt(ctx context.Context, id, p string, data []byte, offset int64) (int64, error) {
	var size int64
	err := b.inArea(ctx, id, p, func(sb *sandbox, root *os.Root, rel string) (err error) {
		size, err = hostfs.WriteAt(root, rel, p, data, offset)
		return err
	})
	return size, err
}
