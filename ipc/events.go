package ipc

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/sandbox-sidecar/sandbox-sidecar/internal/handoff"
)

// EventSender sends one event frame ({"v","id","event","data"}) for the
// request being handled, before its final response. It blocks while the
// peer is not reading, up to the server's write timeout, after which the
// connection is closed and it returns an error: a caller that must not
// stall (a command's output) puts a bounded buffer in front of it
// (capture.Window).
type EventSender func(event string, data []byte) error

type eventsKey struct{}

// Events returns the EventSender of the request ctx belongs to, or nil
// outside a request the server is handling.
func Events(ctx context.Context) EventSender {
	s, _ := ctx.Value(eventsKey{}).(EventSender)
	return s
}

// WithEvents returns ctx carrying send, for handlers driven other than by
// Server (tests).
func WithEvents(ctx context.Context, send EventSender) context.Context {
	return context.WithValue(ctx, eventsKey{}, send)
}

var errConnBroken = errors.New("the connection is closed")

// ErrEventDropped is an EventSender's answer when the event could not have
// room in the response budgets in time: that event was not sent, and the
// connection is still up.
var ErrEventDropped = errors.New("no room in the response budget for the event; it was not sent")

// sendEvent writes one event frame for request id. Its bytes are taken
// from the connection's and the server's response budgets while it is
// written, as every response's are; when they cannot be had within the
// write timeout the event is not sent (the caller drops it) and the
// connection stays up for the final response.
func (c *conn) sendEvent(ctx context.Context, id uint64, event string, data []byte) error {
	if c.broken.Load() {
		return errConnBroken
	}
	body, err := marshal(Event{V: ProtocolVersion, ID: id, Event: event, Data: data})
	if err != nil {
		return err
	}
	if len(body) > c.s.cfg.MaxFrame {
		return fmt.Errorf("an event of %d bytes exceeds the %d-byte frame limit", len(body), c.s.cfg.MaxFrame)
	}
	frame := AppendFrame(make([]byte, 0, headerSize+len(body)), body)
	if err := c.acquireResponse(ctx, int64(len(frame)), handoff.From(ctx).Release); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return ErrEventDropped
	}
	defer c.releaseResponse(int64(len(frame)))
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if err := c.write(frame, handoff.From(ctx).Release); err != nil {
		c.broken.Store(true)
		c.log.Debug("event write failed; closing connection", "error", err)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			c.log.Warn("closing connection: a streamed event could not be written within the write timeout (is the client reading?)",
				"id", id, "bytes", len(frame), "write_timeout", c.s.cfg.WriteTimeout)
		}
		c.nc.Close()
		return err
	}
	return nil
}
