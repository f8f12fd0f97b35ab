package ipc

import (
	"context"
	"errors"
	"io"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// ImportImage streams the archive r to the daemon as image name (admins
// only): image_import_begin, one image_import_data per piece of at most
// the daemon's max_chunk_bytes, then image_import_end, which returns once
// the daemon's store has verified and unpacked it. A failure part-way
// aborts the upload, so the daemon keeps nothing of it.
func (c *Client) ImportImage(ctx context.Context, r io.Reader, name string) (api.ImageImportEndResult, error) {
	var begin api.ImageImportBeginResult
	if err := c.Call(ctx, OpImageImportBegin, api.ImageImportBeginRequest{Name: name}, &begin); err != nil {
		return api.ImageImportEndResult{}, err
	}
	fail := func(err error) (api.ImageImportEndResult, error) {
		var we *Error
		if !errors.As(err, &we) || we.Code != CodeNotFound {
			// Best effort: the daemon also aborts it when the
			// connection closes, or after a minute without data.
			_ = c.Call(context.WithoutCancel(ctx), OpImageImportEnd, api.ImageImportEndRequest{Upload: begin.Upload, Abort: true}, nil)
		}
		return api.ImageImportEndResult{}, err
	}
	buf := make([]byte, max(begin.MaxChunkBytes, 1))
	var offset int64
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			var res api.ImageImportDataResult
			if err := c.Call(ctx, OpImageImportData, api.ImageImportDataRequest{Upload: begin.Upload, Offset: offset, Data: buf[:n]}, &res); err != nil {
				return fail(err)
			}
			offset += int64(n)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return fail(rerr)
		}
	}
	var end api.ImageImportEndResult
	if err := c.Call(ctx, OpImageImportEnd, api.ImageImportEndRequest{Upload: begin.Upload}, &end); err != nil {
		return api.ImageImportEndResult{}, err
	}
	return end, nil
}
