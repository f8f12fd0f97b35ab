package ipc

import (
	"context"
	"errors"
	"time"
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

// sendEvent writes one event frame for request id.
func (c *conn) sendEvent(id uint64, event string, data []byte) error {
	if c.broken.Load() {
		return errConnBroken
	}
	body, err := marshal(Event{V: ProtocolVersion, ID: id, Event: event, Data: data})
	if err != nil {
		return err
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
	if err := WriteFrame(c.nc, body, c.s.cfg.MaxFrame); err != nil {
		c.broken.Store(true)
		c.log.Debug("event write failed; closing connection", "error", err)
		c.nc.Close()
		return err
	}
	return nil
}
