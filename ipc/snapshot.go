package ipc

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// Snapshots, forks and image exports (docs/protocol.md).
const (
	OpSnapshot         = "snapshot"
	OpFork             = "fork"
	OpImageExportBegin = "image_export_begin"
	OpImageExportData  = "image_export_data"
	OpImageExportEnd   = "image_export_end"
)

// CodeNoSpace: the host's disk is full; nothing was kept of what the op
// was making. Retrying once space is freed helps.
const CodeNoSpace = "no_space"

// Snapshot makes a sandbox's files an image of the daemon's store.
func (c *Client) Snapshot(ctx context.Context, req api.SnapshotRequest) (api.SnapshotResult, error) {
	return call[api.SnapshotResult](ctx, c, OpSnapshot, req)
}

// Fork makes new sandboxes as copies of one.
func (c *Client) Fork(ctx context.Context, req api.ForkRequest) (api.ForkResult, error) {
	return call[api.ForkResult](ctx, c, OpFork, req)
}

// ExportImage writes image name of the daemon's store to w as one
// uncompressed tar layer (admins only): image_export_begin, then
// image_export_data until the daemon says eof, then image_export_end. It
// returns the image's description. A failure part-way ends the export.
func (c *Client) ExportImage(ctx context.Context, name string, w io.Writer) (api.ImageInfo, error) {
	var begin api.ImageExportBeginResult
	if err := c.Call(ctx, OpImageExportBegin, api.ImageExportBeginRequest{Name: name}, &begin); err != nil {
		return api.ImageInfo{}, err
	}
	end := func() (int64, error) {
		var res api.ImageExportEndResult
		err := c.Call(context.WithoutCancel(ctx), OpImageExportEnd, api.ImageExportEndRequest{Export: begin.Export}, &res)
		return res.SentBytes, err
	}
	var offset int64
	for {
		var piece api.ImageExportDataResult
		if err := c.Call(ctx, OpImageExportData, api.ImageExportDataRequest{Export: begin.Export, Offset: offset}, &piece); err != nil {
			var we *Error
			if !errors.As(err, &we) || we.Code != CodeNotFound {
				_, _ = end()
			}
			return api.ImageInfo{}, err
		}
		if _, err := w.Write(piece.Data); err != nil {
			_, _ = end()
			return api.ImageInfo{}, err
		}
		offset += int64(len(piece.Data))
		if piece.EOF {
			break
		}
		if len(piece.Data) == 0 {
			_, _ = end()
			return api.ImageInfo{}, fmt.Errorf("the daemon sent an empty piece of image %s before its end", name)
		}
	}
	sent, err := end()
	if err != nil {
		return api.ImageInfo{}, err
	}
	if sent != offset {
		return api.ImageInfo{}, fmt.Errorf("the daemon says it sent %d bytes of image %s, %d arrived", sent, name, offset)
	}
	return begin.Image, nil
}
