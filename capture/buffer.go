package capture

import (
	"bytes"
	"sync"
)

// minGrowth is the smallest allocation a Buffer makes when it first needs
// room, so that a stream of tiny writes does not reallocate on each one.
const minGrowth = 512

// Buffer is an io.Writer that keeps a bounded window of what was written to
// it: either the last limit bytes (tail mode, see NewTail) or the first limit
// bytes (head mode, see NewHead). It never holds more than limit bytes of
// data, whatever is written, and it allocates as it fills, so a small output
// costs a small buffer.
//
// A Buffer is safe for one writer and concurrent or later readers.
type Buffer struct {
	mu    sync.Mutex
	limit int
	head  bool
	// data holds what is kept. In tail mode, once full is set, data has
	// length limit and is a ring whose oldest byte is at start.
	data  []byte
	start int
	full  bool
	total int64
	// afterNewline (tail mode) records whether the last byte dropped from
	// the front of the window was '\n', i.e. the window begins a line.
	afterNewline bool
}

// NewTail returns a Buffer that keeps the last limit bytes written: the end
// of an output is where tracebacks and exit messages are. A limit of zero or
// less keeps nothing.
func NewTail(limit int) *Buffer { return &Buffer{limit: max(limit, 0)} }

// NewHead returns a Buffer that keeps the first limit bytes written and
// drops the rest. A limit of zero or less keeps nothing.
func NewHead(limit int) *Buffer { return &Buffer{limit: max(limit, 0), head: true} }

// Write keeps what fits the window and drops the rest. It always reports
// len(p), nil so that a producer (io.Copy, a drain loop) never stops early
// because output was dropped.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total += int64(len(p))
	if b.limit == 0 || len(p) == 0 {
		return len(p), nil
	}
	if b.head {
		b.writeHead(p)
	} else {
		b.writeTail(p)
	}
	return len(p), nil
}

func (b *Buffer) writeHead(p []byte) {
	room := b.limit - len(b.data)
	if room <= 0 {
		return
	}
	b.appendBounded(p[:min(len(p), room)])
}

func (b *Buffer) writeTail(p []byte) {
	if len(p) >= b.limit {
		// The new window is the last limit bytes of p; everything before
		// it, old data included, is dropped.
		switch {
		case len(p) > b.limit:
			b.afterNewline = p[len(p)-b.limit-1] == '\n'
		case len(b.data) > 0:
			b.afterNewline = b.newest() == '\n'
		}
		if cap(b.data) < b.limit {
			b.data = make([]byte, b.limit)
		}
		b.data = b.data[:b.limit]
		copy(b.data, p[len(p)-b.limit:])
		b.start, b.full = 0, true
		return
	}
	if !b.full {
		room := b.limit - len(b.data)
		if len(p) <= room {
			b.appendBounded(p)
			return
		}
		b.appendBounded(p[:room])
		p = p[room:]
		b.start, b.full = 0, true
	}
	// Ring: overwrite the oldest bytes, which start at b.start.
	for len(p) > 0 {
		k := min(len(p), b.limit-b.start)
		b.afterNewline = b.data[b.start+k-1] == '\n'
		copy(b.data[b.start:b.start+k], p[:k])
		p = p[k:]
		b.start = (b.start + k) % b.limit
	}
}

// appendBounded appends p, which the caller guarantees fits within limit,
// growing the backing array to at most limit bytes.
func (b *Buffer) appendBounded(p []byte) {
	need := len(b.data) + len(p)
	if need > cap(b.data) {
		c := min(max(2*cap(b.data), need, minGrowth), b.limit)
		grown := make([]byte, len(b.data), c)
		copy(grown, b.data)
		b.data = grown
	}
	b.data = append(b.data, p...)
}

// newest returns the most recently kept byte; b.data must not be empty.
func (b *Buffer) newest() byte {
	if b.full {
		return b.data[(b.start+b.limit-1)%b.limit]
	}
	return b.data[len(b.data)-1]
}

// Bytes returns a copy of what is kept, oldest byte first.
//
// In tail mode, when bytes were dropped and the window starts in the middle
// of a line, that partial first line (up to and including the first '\n') is
// removed, as Airflow's own backends do, so the reader never sees half a
// line. When the window holds no '\n' but its last byte (no '\n' at all,
// or one long line and its newline) the raw tail is returned, since dropping
// the partial line would leave nothing. When the window happens to start
// exactly at a line boundary nothing is removed.
func (b *Buffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]byte, len(b.data))
	if b.full {
		n := copy(out, b.data[b.start:])
		copy(out[n:], b.data[:b.start])
	} else {
		copy(out, b.data)
	}
	if !b.head && b.truncated() && !b.afterNewline {
		// Only when something is left: a window that is one long line
		// (progress bars, minified JSON) ending in its '\n' keeps its raw
		// tail rather than coming back empty.
		if i := bytes.IndexByte(out, '\n'); i >= 0 && i+1 < len(out) {
			out = out[i+1:]
		}
	}
	return out
}

// Truncated reports whether any written byte was dropped.
func (b *Buffer) Truncated() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.truncated()
}

func (b *Buffer) truncated() bool { return b.total > int64(b.limit) }

// Total returns how many bytes were written in all, kept or not.
func (b *Buffer) Total() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}
