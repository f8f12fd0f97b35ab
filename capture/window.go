package capture

import (
	"context"
	"sync"
)

// Stream names one of a command's output streams.
type Stream int

const (
	Stdout Stream = iota
	Stderr
)

func (s Stream) String() string {
	if s == Stderr {
		return "stderr"
	}
	return "stdout"
}

// OutputFunc receives a chunk of a command's output as it is read. p is
// only valid during the call.
type OutputFunc func(stream Stream, p []byte)

// Window carries a command's output to a consumer that may be slower than
// the command (a client reading a stream over a socket). It holds at most
// its limit of bytes not yet taken: Write never blocks, and what does not
// fit is dropped and counted, so a client that stops reading costs the
// daemon the window and nothing more, and the command runs at capture
// speed whatever the consumer does. Consecutive writes to one stream are
// coalesced, so the consumer gets few large chunks rather than many small
// ones.
//
// A Window is safe for one or more writers (the two drains) and one
// consumer.
type Window struct {
	mu      sync.Mutex
	limit   int
	held    int
	chunks  []chunk
	dropped [2]int64
	total   [2]int64
	closed  bool
	wake    chan struct{}
}

type chunk struct {
	stream Stream
	data   []byte
}

// maxChunk bounds one chunk handed to the consumer (one event frame).
const maxChunk = 64 << 10

// NewWindow returns a Window holding at most limit bytes (at least one
// chunk's worth).
func NewWindow(limit int) *Window {
	return &Window{limit: max(limit, maxChunk), wake: make(chan struct{}, 1)}
}

// Write keeps what fits and counts the rest as dropped. It implements
// OutputFunc.
func (w *Window) Write(stream Stream, p []byte) {
	w.mu.Lock()
	w.total[stream&1] += int64(len(p))
	if w.closed {
		w.dropped[stream&1] += int64(len(p))
		w.mu.Unlock()
		return
	}
	room := w.limit - w.held
	keep := p[:min(len(p), max(room, 0))]
	w.dropped[stream&1] += int64(len(p) - len(keep))
	for len(keep) > 0 {
		n := len(w.chunks)
		if n > 0 && w.chunks[n-1].stream == stream && len(w.chunks[n-1].data) < maxChunk {
			last := &w.chunks[n-1]
			k := min(len(keep), maxChunk-len(last.data))
			last.data = append(last.data, keep[:k]...)
			keep = keep[k:]
			w.held += k
			continue
		}
		k := min(len(keep), maxChunk)
		w.chunks = append(w.chunks, chunk{stream: stream, data: append(make([]byte, 0, min(maxChunk, max(k, 4096))), keep[:k]...)})
		keep = keep[k:]
		w.held += k
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Close says no more output will come; Next returns what is left, then
// ok false.
func (w *Window) Close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Next waits for output and returns the oldest chunk (at most 64 KiB of one
// stream), or ok false once the Window is closed and empty or ctx ended.
func (w *Window) Next(ctx context.Context) (stream Stream, data []byte, ok bool) {
	for {
		w.mu.Lock()
		if len(w.chunks) > 0 {
			c := w.chunks[0]
			w.chunks[0] = chunk{}
			w.chunks = w.chunks[1:]
			w.held -= len(c.data)
			w.mu.Unlock()
			return c.stream, c.data, true
		}
		closed := w.closed
		w.mu.Unlock()
		if closed {
			return 0, nil, false
		}
		select {
		case <-w.wake:
		case <-ctx.Done():
			return 0, nil, false
		}
	}
}

// Dropped returns the bytes of each stream that did not fit the window.
func (w *Window) Dropped() (stdout, stderr int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.dropped[Stdout], w.dropped[Stderr]
}

// Lost counts n bytes of stream as dropped after Next handed them out (the
// consumer could not deliver them).
func (w *Window) Lost(stream Stream, n int) {
	w.mu.Lock()
	w.dropped[stream&1] += int64(n)
	w.mu.Unlock()
}

// Discard drops what is held (counting it) and everything written from
// now on: the consumer has gone.
func (w *Window) Discard() {
	w.mu.Lock()
	for _, c := range w.chunks {
		w.dropped[c.stream&1] += int64(len(c.data))
	}
	w.chunks, w.held, w.closed = nil, 0, true
	w.mu.Unlock()
}
