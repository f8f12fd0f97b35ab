package ipc

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// DefaultPieceBytes is how much ExportFile and ImportFile move per request:
// well under the frame limit, small enough that other responses on the
// connection do not wait long behind one, and small enough that the
// garbage each piece leaves in the daemon (frame, decoded copy, response)
// keeps its heap small between collections: 100 MiB in 1 MiB pieces raised
// the daemon's peak RSS by 15-20 MiB, in 4 MiB pieces by 40-70 MiB.
const DefaultPieceBytes = 1 << 20

// ErrFileChanged is returned by ExportFile when the file's size changed
// while it was being copied.
var ErrFileChanged = errors.New("the file changed while it was exported")

func (c *Client) readRange(ctx context.Context, sandbox, path string, offset, length int64) (api.ReadFileResult, error) {
	return c.ReadFile(ctx, api.ReadFileRequest{Sandbox: sandbox, Path: path, Offset: &offset, Length: &length})
}

// ExportFile copies the regular file at path in sandbox to w with ranged
// read_file requests of at most piece bytes (DefaultPieceBytes when 0),
// holding one piece at a time, and returns the bytes written. A file
// larger than maxBytes is a file_too_large *Error before anything is
// written; a file whose size changes during the copy is ErrFileChanged
// (file_too_large when it grew past maxBytes). ctx bounds the whole copy.
func (c *Client) ExportFile(ctx context.Context, sandbox, path string, w io.Writer, maxBytes, piece int64) (int64, error) {
	if piece <= 0 {
		piece = DefaultPieceBytes
	}
	first, err := c.readRange(ctx, sandbox, path, 0, 0)
	if err != nil {
		return 0, err
	}
	size := first.SizeBytes
	tooLarge := func(n int64) error {
		return Errorf(CodeFileTooLarge, "%s is %d bytes, more than the %d allowed", path, n, maxBytes).
			With("size_bytes", n).With("max_bytes", maxBytes)
	}
	if size > maxBytes {
		return 0, tooLarge(size)
	}
	var written int64
	for written < size {
		r, err := c.readRange(ctx, sandbox, path, written, min(piece, size-written))
		if err != nil {
			return written, err
		}
		if r.SizeBytes != size || len(r.Data) == 0 {
			if r.SizeBytes > maxBytes {
				return written, tooLarge(r.SizeBytes)
			}
			return written, fmt.Errorf("%w: %s was %d bytes, then %d", ErrFileChanged, path, size, r.SizeBytes)
		}
		n, err := w.Write(r.Data)
		written += int64(n)
		if err != nil {
			return written, err
		}
	}
	// The size again at the end: a file still being appended to is caught
	// even when every piece came back whole.
	last, err := c.readRange(ctx, sandbox, path, 0, 0)
	if err != nil {
		return written, err
	}
	if last.SizeBytes != size {
		if last.SizeBytes > maxBytes {
			return written, tooLarge(last.SizeBytes)
		}
		return written, fmt.Errorf("%w: %s was %d bytes, then %d", ErrFileChanged, path, size, last.SizeBytes)
	}
	return written, nil
}

// ImportFile writes all of r to path in sandbox, creating its parent
// directories, with requests of at most piece bytes (DefaultPieceBytes when
// 0): a whole write_file (which sets mode, 0 meaning 0644) for the first
// piece and appends for the rest. It returns the bytes written. Unlike one
// write_file, a reader in the sandbox may see the file before it is whole.
func (c *Client) ImportFile(ctx context.Context, sandbox, path string, r io.Reader, mode uint32, piece int64) (int64, error) {
	if piece <= 0 {
		piece = DefaultPieceBytes
	}
	if mode == 0 {
		mode = 0o644
	}
	buf := make([]byte, piece)
	var written int64
	for first := true; ; first = false {
		n, rerr := io.ReadFull(r, buf)
		if rerr != nil && rerr != io.EOF && rerr != io.ErrUnexpectedEOF {
			return written, rerr
		}
		if n > 0 || first {
			args := map[string]any{"sandbox": sandbox, "path": path, "data": buf[:n]}
			if first {
				args["mode"] = mode
			} else {
				args["append"] = true
			}
			if err := c.Call(ctx, OpWriteFile, args, nil); err != nil {
				return written, err
			}
			written += int64(n)
		}
		if rerr != nil {
			return written, nil
		}
	}
}
