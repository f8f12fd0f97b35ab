package ipc

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultMaxFrame is the default largest frame body either side accepts.
const DefaultMaxFrame = 16 << 20

// headerSize is the length prefix: a big-endian uint32.
const headerSize = 4

var (
	// ErrFrameTooLarge: the length prefix announced more than the maximum.
	ErrFrameTooLarge = errors.New("frame too large")
	// ErrEmptyFrame: the length prefix was zero.
	ErrEmptyFrame = errors.New("zero-length frame")
)

// ReadHeader reads a frame's length prefix and checks it against max.
func ReadHeader(r io.Reader, max int) (int, error) {
	var hdr [headerSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	switch {
	case n == 0:
		return 0, ErrEmptyFrame
	case uint64(n) > uint64(max):
		return int(n), fmt.Errorf("%w: %d bytes announced, at most %d accepted", ErrFrameTooLarge, n, max)
	}
	return int(n), nil
}

// ReadBody reads exactly n bytes of frame body. A short read is
// io.ErrUnexpectedEOF: the frame was truncated.
func ReadBody(r io.Reader, n int) ([]byte, error) {
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return body, nil
}

// ReadFrame reads one whole frame of at most max bytes.
func ReadFrame(r io.Reader, max int) ([]byte, error) {
	n, err := ReadHeader(r, max)
	if err != nil {
		return nil, err
	}
	return ReadBody(r, n)
}

// AppendFrame appends body with its length prefix to dst.
func AppendFrame(dst, body []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(body)))
	return append(dst, body...)
}

// WriteFrame writes body as one frame in a single Write call, so frames from
// concurrent writers never interleave when the caller serializes writes.
func WriteFrame(w io.Writer, body []byte, max int) error {
	frame, err := newFrame(body, max)
	if err != nil {
		return err
	}
	_, err = w.Write(frame)
	return err
}

// newFrame is body as a frame, if it is at most max bytes.
func newFrame(body []byte, max int) ([]byte, error) {
	if len(body) > max {
		return nil, fmt.Errorf("%w: %d bytes to send, at most %d allowed", ErrFrameTooLarge, len(body), max)
	}
	return AppendFrame(make([]byte, 0, headerSize+len(body)), body), nil
}

// writeWithin writes frame to nc: at once when the socket has room for it
// (writeNow), otherwise the rest under deadline (zero: none), after
// beforeWait (if set) ran. A deadline it armed is cleared after a write that
// succeeded, so that writeNow's next attempt never meets it expired.
func writeWithin(nc net.Conn, raw syscall.RawConn, frame []byte, deadline time.Time, beforeWait func()) error {
	rest, err := writeNow(raw, frame)
	if err != nil || len(rest) == 0 {
		return err
	}
	if beforeWait != nil {
		beforeWait()
	}
	nc.SetWriteDeadline(deadline)
	_, err = nc.Write(rest)
	if err == nil && !deadline.IsZero() {
		nc.SetWriteDeadline(time.Time{})
	}
	return err
}

// writeNow writes what of frame the socket behind raw has room for, in one
// non-blocking write, and returns the rest: a frame that fits goes out with
// no deadline armed (arming one is a runtime timer, whose arming can wake
// another of the runtime's threads, on every frame). The caller writes the
// rest through the net.Conn, under a deadline. A nil raw, or a descriptor
// not ready for it (a stale deadline), writes nothing; an error is one the
// net.Conn's write would have met too.
func writeNow(raw syscall.RawConn, frame []byte) (rest []byte, err error) {
	if raw == nil {
		return frame, nil
	}
	n, werr := 0, error(nil)
	if err := raw.Write(func(fd uintptr) bool {
		n, werr = unix.Write(int(fd), frame)
		return true // one attempt: never wait here
	}); err != nil {
		return frame, nil
	}
	switch {
	case werr == nil:
		return frame[n:], nil
	case errors.Is(werr, unix.EAGAIN), errors.Is(werr, unix.EINTR):
		return frame, nil
	}
	return nil, werr
}

// frameReader reads frames one after another and keeps a frame it could
// only partly read (a read deadline ended the read): the next call goes on
// where the last one stopped, so a reader can be woken mid-frame (a
// cancelled call) without losing its place in the stream.
type frameReader struct {
	br   *bufio.Reader
	max  int
	hdr  [headerSize]byte
	hdrN int
	body []byte // allocated once the header is complete
	bodN int
}

// next returns the next whole frame's body. A timeout leaves the partial
// frame for the next call; any other error is final for the stream.
func (f *frameReader) next() ([]byte, error) {
	for f.hdrN < headerSize {
		n, err := f.br.Read(f.hdr[f.hdrN:])
		f.hdrN += n
		if err != nil {
			if errors.Is(err, io.EOF) && f.hdrN > 0 {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	if f.body == nil {
		n := binary.BigEndian.Uint32(f.hdr[:])
		switch {
		case n == 0:
			return nil, ErrEmptyFrame
		case uint64(n) > uint64(f.max):
			return nil, fmt.Errorf("%w: %d bytes announced, at most %d accepted", ErrFrameTooLarge, n, f.max)
		}
		f.body = make([]byte, n)
	}
	for f.bodN < len(f.body) {
		n, err := f.br.Read(f.body[f.bodN:])
		f.bodN += n
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	body := f.body
	f.hdrN, f.body, f.bodN = 0, nil, 0
	return body, nil
}
