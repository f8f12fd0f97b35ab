package bwrap

import (
	"context"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
)

var _ backend.RangedFiles = (*Backend)(nil)

// ReadFileRange implements backend.RangedFiles, confined as ReadFile is.
func (b *Backend) ReadFileRange(ctx context.Context, id, p string, offset, length int64) ([]byte, int64, error) {
	sb, done, err := b.fileOp(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	defer done()
	root, rel, err := openArea(sb, p)
	if err != nil {
		return nil, 0, err
	}
	defer root.Close()
	return hostfs.ReadRange(root, rel, p, offset, length)
}

// WriteFileAt implements backend.RangedFiles, confined as WriteFile is.
func (b *Backend) WriteFileAt(ctx context.Context, id, p string, data []byte, offset int64) (int64, error) {
	sb, done, err := b.fileOp(ctx, id)
	if err != nil {
		return 0, err
	}
	defer done()
	root, rel, err := openArea(sb, p)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	return hostfs.WriteAt(root, rel, p, data, offset)
}
