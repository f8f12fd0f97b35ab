package bwrap

import (
	"context"
	"os"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
)

var _ backend.RangedFiles = (*Backend)(nil)

// ReadFileRange implements backend.RangedFiles, confined as ReadFile is.
func (b *Backend) ReadFileRange(ctx context.Context, id, p string, offset, length int64) ([]byte, int64, error) {
	var data []byte
	var size int64
	err := b.inArea(ctx, id, p, func(sb *sandbox, root *os.Root, rel string) (err error) {
		data, size, err = hostfs.ReadRange(root, rel, p, offset, length)
		return err
	})
	return data, size, err
}

// WriteFileAt implements backend.RangedFiles, confined as WriteFile is.
func (b *Backend) WriteFileAt(ctx context.Context, id, p string, data []byte, offset int64) (int64, error) {
	var size int64
	err := b.inArea(ctx, id, p, func(sb *sandbox, root *os.Root, rel string) (err error) {
		size, err = hostfs.WriteAt(root, rel, p, data, offset)
		return err
	})
	return size, err
}
