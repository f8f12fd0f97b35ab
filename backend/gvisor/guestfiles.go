package gvisor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
)

// guestFileTimeout bounds one file op on the guest's view: booting the
// sandbox when it has no init yet is bounded apart (bootTimeout), this is
// the open inside and the bytes through the stream.
const guestFileTimeout = time.Minute

// errNoGuest: the sandbox is terminated, so nothing can open a path as its
// guest; its workspace and /tmp are still on the host until Destroy.
var errNoGuest = errors.New("the sandbox is terminated")

// fileWait is the file op waiting for its answer; readLoop fills it.
type fileWait struct {
	seq   uint32
	limit int64 // the most data bytes the op may bring
	data  []byte
	over  bool // init sent more than limit: a protocol error
	done  chan gvwire.FileDone
}

// fileFrame hands a file data or done frame to the op it answers; a frame
// for no op (one that timed out) is dropped.
func (c *initConn) fileFrame(kind byte, p []byte) error {
	if kind == gvwire.KindFileData {
		if len(p) < 4 {
			return fmt.Errorf("%w: file data of %d bytes", gvwire.ErrBadFrame, len(p))
		}
		seq := binary.LittleEndian.Uint32(p)
		c.mu.Lock()
		if w := c.fop; w != nil && w.seq == seq {
			if int64(len(w.data))+int64(len(p)-4) > w.limit {
				w.over = true
			} else {
				w.data = append(w.data, p[4:]...)
			}
		}
		c.mu.Unlock()
		return nil
	}
	d, err := gvwire.DecodeFileDone(p)
	if err != nil {
		return err
	}
	c.mu.Lock()
	if w := c.fop; w != nil && w.seq == d.Seq {
		c.fop = nil
		w.done <- d
	}
	c.mu.Unlock()
	return nil
}

// fileOp sends req and waits for its answer: the data (at most limit
// bytes) and how it ended.
func (c *initConn) fileOp(ctx context.Context, req gvwire.FileRequest, limit int64) ([]byte, gvwire.FileDone, error) {
	c.fileMu.Lock()
	defer c.fileMu.Unlock()
	c.fileSeq++
	req.Seq = c.fileSeq
	w := &fileWait{seq: req.Seq, limit: limit, done: make(chan gvwire.FileDone, 1)}
	c.mu.Lock()
	c.fop = w
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.fop == w {
			c.fop = nil
		}
		c.mu.Unlock()
	}()
	if err := c.send(gvwire.KindFileOp, req.Encode()); err != nil {
		return nil, gvwire.FileDone{}, err
	}
	t := time.NewTimer(guestFileTimeout)
	defer t.Stop()
	select {
	case d := <-w.done:
		c.mu.Lock()
		data, over := w.data, w.over
		c.mu.Unlock()
		if over {
			return nil, gvwire.FileDone{}, fmt.Errorf("%w: init sent more than the %d bytes asked for", gvwire.ErrBadFrame, limit)
		}
		return data, d, nil
	case <-c.dead:
		return nil, gvwire.FileDone{}, errInitGone
	case <-t.C:
		return nil, gvwire.FileDone{}, fmt.Errorf("the sandbox did not answer within %v", guestFileTimeout)
	case <-ctx.Done():
		return nil, gvwire.FileDone{}, ctx.Err()
	}
}

// initForFiles returns sb's running init for a file op, booting the
// sandbox when this process has none yet; it does not take the init for a
// command (file ops run beside one) and leaves telling a command about a
// dead init to Exec.
func (b *Backend) initForFiles(ctx context.Context, sb *sandbox) (*initConn, error) {
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	switch {
	case sb.gone, sb.init != nil && !sb.init.alive():
		return nil, errNoGuest
	case sb.paused:
		return nil, sb.errPaused()
	case sb.init == nil:
		c, err := b.boot(ctx, sb)
		if err != nil {
			return nil, err
		}
		sb.init = c
	}
	return sb.init, nil
}

// inGuest runs one file op on p of sandbox id as its guest sees it,
// bringing at most limit bytes. errNoGuest means the sandbox is
// terminated: the caller may read its workspace and /tmp on the host.
func (b *Backend) inGuest(ctx context.Context, id, p string, req gvwire.FileRequest, limit int64) ([]byte, gvwire.FileDone, error) {
	if err := ctx.Err(); err != nil {
		return nil, gvwire.FileDone{}, err
	}
	guest, err := hostfs.GuestPath(p)
	if err != nil {
		return nil, gvwire.FileDone{}, err
	}
	req.Path = guest
	sb, err := b.lookup(id)
	if err != nil {
		return nil, gvwire.FileDone{}, err
	}
	opCtx, done, err := sb.ops.Begin(ctx)
	if err != nil {
		return nil, gvwire.FileDone{}, err
	}
	defer done()
	c, err := b.initForFiles(opCtx, sb)
	if err != nil {
		return nil, gvwire.FileDone{}, err
	}
	data, d, err := c.fileOp(opCtx, req, limit)
	switch {
	case err == nil:
	case opCtx.Err() != nil && ctx.Err() == nil:
		return nil, gvwire.FileDone{}, backend.NotFound(id) // destroyed meanwhile
	case ctx.Err() != nil:
		return nil, gvwire.FileDone{}, fmt.Errorf("reading %s in sandbox %s was stopped: %w", backend.ShortName(p), id, ctx.Err())
	case errors.Is(err, errInitGone):
		return nil, gvwire.FileDone{}, errNoGuest
	default:
		return nil, gvwire.FileDone{}, fmt.Errorf("%w: sandbox %s could not serve %s: %v; retry, or use run_command", backend.ErrUnavailable, id, backend.ShortName(p), err)
	}
	if err := doneError(p, d, req.N); err != nil {
		return nil, d, err
	}
	return data, d, nil
}

// doneError is the error a done frame reports for p, nil for success.
func doneError(p string, d gvwire.FileDone, n int64) error {
	switch d.Code {
	case gvwire.FileOK:
		return nil
	case gvwire.FileErrno:
		return hostfs.GuestError(p, gvwire.ErrnoOf(d.Errno))
	case gvwire.FileTooLarge:
		return &backend.FileTooLargeError{Path: p, Size: d.Size, MaxBytes: n}
	}
	if s, ok := gvwire.CodeSentinels[d.Code]; ok {
		return fmt.Errorf("%w: %s", s, d.Text)
	}
	return fmt.Errorf("%w: %s", backend.ErrUnavailable, d.Text)
}
