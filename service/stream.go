package service

import (
	"context"
	"errors"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/capture"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
)

const (
	// streamWindowBytes is the most of a command's output the daemon holds
	// for a stream consumer that reads slower than the command writes;
	// past it output is dropped from the stream (still kept in the final
	// tail, and counted). A fixed window: what a client that stops reading
	// costs the daemon.
	streamWindowBytes = 1 << 20
	// streamFlushGrace is how long, after the command ended, the daemon
	// keeps sending what the window holds before it drops the rest and
	// answers.
	streamFlushGrace = 5 * time.Second
)

// outputStream sends a command's output as stdout/stderr events while it
// runs, through a capture.Window so the command never waits for the client.
type outputStream struct {
	w    *capture.Window
	done chan struct{}
}

func startStream(ctx context.Context, send ipc.EventSender) *outputStream {
	o := &outputStream{w: capture.NewWindow(streamWindowBytes), done: make(chan struct{})}
	go func() {
		defer close(o.done)
		for {
			stream, data, ok := o.w.Next(ctx)
			if !ok {
				return
			}
			switch err := send(stream.String(), data); {
			case err == nil:
			case errors.Is(err, ipc.ErrEventDropped):
				o.w.Lost(stream, len(data)) // this chunk only; the stream goes on
			default:
				o.w.Lost(stream, len(data))
				o.w.Discard() // the connection is gone: nobody to send to
				return
			}
		}
	}()
	return o
}

// output is the command's ExecRequest.Output.
func (o *outputStream) output(stderr bool, p []byte) {
	s := capture.Stdout
	if stderr {
		s = capture.Stderr
	}
	o.w.Write(s, p)
}

// finish sends what is left (for at most streamFlushGrace) and returns the
// bytes of each stream that never reached the client.
func (o *outputStream) finish() (stdout, stderr int64) {
	o.w.Close()
	t := time.NewTimer(streamFlushGrace)
	defer t.Stop()
	select {
	case <-o.done:
	case <-t.C:
		o.w.Discard()
		<-o.done // at most one send in flight, bounded by the write timeout
	}
	return o.w.Dropped()
}
