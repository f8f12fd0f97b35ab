package ipc

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// envelopeWithList is a request whose args hold one list of n copies of
// item, encoded by hand (msgpack would take a while to build 16 M values).
func envelopeWithList(n int, item []byte) []byte {
	b := []byte{0x84, 0xa1, 'v', 0x01, 0xa2, 'i', 'd', 0x01, 0xa2, 'o', 'p', 0xa4, 'e', 'c', 'h', 'o', 0xa4, 'a', 'r', 'g', 's', 0x81, 0xa1, 'a', 0xdd}
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	return append(b, bytes.Repeat(item, n)...)
}

// allocated is what f allocates on the heap, garbage included.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// The frame: 15 MiB of empty arrays decoded into 16 M Go slices
// (~670 MiB). The item budget refuses it before anything is made for it.
func TestDecodeRefusesMoreItemsThanTheFrameJustifies(t *testing.T) {
	body := envelopeWithList(15<<20, []byte{0x90})
	var e *Error
	alloc := allocated(func() { _, e = DecodeRequest(body) })
	require.NotNil(t, e, "a frame of 15 M empty arrays must be refused")
	assert.Equal(t, CodeBadRequest, e.Code)
	assert.Contains(t, e.Message, "more msgpack items than its size allows")
	assert.EqualValues(t, MaxItemsPerFrame, e.Details["max_items"])
	assert.Less(t, alloc, uint64(1<<20), "refusing it allocates next to nothing")

	// Just within the budget, the same shape decodes.
	_, e = DecodeRequest(envelopeWithList(400, []byte{0x90}))
	assert.Nil(t, e, "400 empty arrays in a 430-byte frame are within its budget (256 + 215)")
}

// What decoding any frame allocates stays within what the server charges
// for it, for the shapes that cost the most per byte.
func TestDecodeCostWithinBound(t *testing.T) {
	shapes := map[string][]byte{
		"empty array":      {0x90},
		"empty map":        {0x80},
		"one-entry map":    {0x81, 0xa0, 0xc0},
		"nil":              {0xc0},
		"empty string":     {0xa0},
		"empty binary":     {0xc4, 0x00},
		"float64":          append([]byte{0xcb}, make([]byte, 8)...),
		"uint64":           append([]byte{0xcf, 0xff}, make([]byte, 7)...),
		"array of one nil": {0x91, 0xc0},
		"map of one map":   {0x81, 0xa0, 0x80},
		"31-byte string":   append([]byte{0xbf}, make([]byte, 31)...),
	}
	for name, item := range shapes {
		for _, size := range []int{100, 4 << 10, 256 << 10, 4 << 20} {
			count := size / len(item)
			body := envelopeWithList(count, item)
			var e *Error
			alloc := allocated(func() { _, e = DecodeRequest(body) })
			bound := RequestCost(len(body)) - SmallResponseBytes - int64(len(body)) // the body itself is the rest
			assert.LessOrEqual(t, int64(alloc), bound, "%s ×%d (%d bytes, refused: %v)", name, count, len(body), e != nil)
		}
	}
}

func TestBudget(t *testing.T) {
	b := NewBudget(10)
	assert.True(t, b.TryAcquire(6))
	assert.False(t, b.TryAcquire(5))
	assert.Error(t, b.Acquire(context.Background(), 11), "more than the whole budget")
	got := make(chan error, 1)
	go func() { got <- b.Acquire(context.Background(), 5) }()
	select {
	case <-got:
		t.Fatal("acquired bytes that are taken")
	case <-time.After(50 * time.Millisecond):
	}
	b.Release(6)
	require.NoError(t, <-got)
	assert.EqualValues(t, 5, b.InUse())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, b.Acquire(ctx, 6), context.DeadlineExceeded)
	b.Release(5)
	assert.EqualValues(t, 0, b.InUse())
}

// budgetHandler answers "big" with args.n bytes after reserving room for
// them, counting how many results exist at once; "hold" sleeps args.ms
// with its args held, noting when each hold starts and ends.
type budgetHandler struct {
	testHandler
	live, peak atomic.Int64
	mu         sync.Mutex
	holds      []string
}

func (h *budgetHandler) note(s string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.holds = append(h.holds, s)
}

func (h *budgetHandler) Handle(ctx context.Context, peer *Peer, req *Request) (any, error) {
	switch req.Op {
	case "big":
		n := req.Args.Int("n", 0, 0, 1<<30)
		if err := req.ReserveResponse(ctx, 2*n+1024); err != nil {
			return nil, err
		}
		live := h.live.Add(1)
		for p := h.peak.Load(); live > p && !h.peak.CompareAndSwap(p, live); p = h.peak.Load() {
		}
		defer h.live.Add(-1)
		return map[string]any{"data": make([]byte, n)}, nil
	case "hold":
		ms := req.Args.Int("ms", 0, 0, 60000)
		h.note(fmt.Sprintf("start %d", ms))
		defer h.note(fmt.Sprintf("end %d", ms))
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
		case <-ctx.Done():
		}
		return map[string]any{}, nil
	}
	return h.testHandler.Handle(ctx, peer, req)
}

// The second case: pipelined reads of a large file on a connection
// that never reads its responses. Results wait for room instead of piling
// up; the connection is closed, with a reason in the log, once a write
// cannot finish; and everything it held is given back.
func TestResponsesBoundedForAClientThatNeverReads(t *testing.T) {
	const n = 1 << 20
	h := &budgetHandler{}
	log := &syncBuffer{}
	s, path := startServer(t, ServerConfig{Handler: h, Logger: hclog.New(&hclog.LoggerOptions{Output: log}),
		MaxFrame: 2 * n, MaxConnResponseBytes: 5 * n, WriteTimeout: 300 * time.Millisecond})
	c := rawConn(t, path)
	for i := range 64 {
		sendReq(t, c, i+1, "big", map[string]any{"n": n})
	}
	assert.Eventually(t, func() bool { return strings.Contains(log.String(), "is the client reading its responses?") },
		10*time.Second, 10*time.Millisecond, "the connection is closed with its reason")
	assert.LessOrEqual(t, h.peak.Load(), int64(2), "at most two 1 MiB results (2 MiB reserved each) fit a 5 MiB connection budget")
	assert.Eventually(t, func() bool { req, resp := s.Held(); return req == 0 && resp == 0 }, 10*time.Second, 10*time.Millisecond,
		"the closed connection gave back everything it held")

	// Others are served meanwhile and after.
	c2 := rawConn(t, path)
	sendReq(t, c2, 1, "big", map[string]any{"n": n})
	assert.Equal(t, true, readResp(t, c2)["ok"])
}

// The request budget: a frame that does not fit waits, unread, until the
// requests ahead of it have been answered.
func TestRequestBudgetMakesFramesWait(t *testing.T) {
	pad := strings.Repeat("x", 1<<20)
	frame := mp(t, map[string]any{"v": 1, "id": 1, "op": "hold", "args": map[string]any{"ms": 400, "pad": pad}})
	h := &budgetHandler{}
	// The largest frame's cost is the least the budget can be; make it
	// hold one of these frames, not two.
	s, path := startServer(t, ServerConfig{Handler: h, MaxFrame: len(frame), MaxRequestBytes: RequestCost(len(frame))})
	c1 := rawConn(t, path)
	require.NoError(t, WriteFrame(c1, frame, DefaultMaxFrame))
	require.Eventually(t, func() bool { req, _ := s.Held(); return req > 0 }, 5*time.Second, time.Millisecond)
	c2 := rawConn(t, path)
	sendReq(t, c2, 1, "hold", map[string]any{"ms": 0, "pad": pad})
	// The order the handler saw, not the order two readers happen to be
	// scheduled in: the waiting frame is handled only after the held one
	// was answered (its budget comes back once its response is written).
	var wg sync.WaitGroup
	for _, c := range []net.Conn{c1, c2} {
		wg.Add(1)
		go func() { defer wg.Done(); readResp(t, c) }()
	}
	wg.Wait()
	h.mu.Lock()
	holds := slices.Clone(h.holds)
	h.mu.Unlock()
	assert.Equal(t, []string{"start 400", "end 400", "start 0", "end 0"}, holds, "the second frame was read only once the first was answered")
	assert.Eventually(t, func() bool { req, _ := s.Held(); return req == 0 }, 5*time.Second, time.Millisecond)
}

func TestServerMaxConnsPerUID(t *testing.T) {
	_, path := startServer(t, ServerConfig{MaxConns: 10, MaxConnsPerUID: 2})
	var conns []net.Conn
	for range 2 {
		c := rawConn(t, path)
		sendReq(t, c, 1, "echo", nil)
		assert.Equal(t, true, readResp(t, c)["ok"])
		conns = append(conns, c)
	}
	c3 := rawConn(t, path)
	m := readResp(t, c3)
	assert.Equal(t, CodeBusy, errCode(m))
	assert.EqualValues(t, 2, m["error"].(map[string]any)["max_connections_per_uid"])
	// A slot freed is a slot again.
	conns[0].Close()
	assert.Eventually(t, func() bool {
		c, err := Dial(context.Background(), path)
		if err != nil {
			return false
		}
		defer c.Close()
		return c.Call(context.Background(), "echo", nil, nil) == nil
	}, 5*time.Second, 20*time.Millisecond)
	assert.Equal(t, 2, DefaultMaxConnsPerUID(3), "three quarters, rounded down")
	assert.Equal(t, 3072, DefaultMaxConnsPerUID(DefaultMaxConns))
}

func TestFirstFrameDeadline(t *testing.T) {
	_, path := startServer(t, ServerConfig{FirstFrameTimeout: 200 * time.Millisecond})
	silent := rawConn(t, path)
	spoke := rawConn(t, path)
	sendReq(t, spoke, 1, "echo", nil)
	readResp(t, spoke)

	m := readResp(t, silent)
	assert.Equal(t, CodeBadRequest, errCode(m))
	assert.Contains(t, fmt.Sprint(m), "no request within 200ms of connecting")
	_, err := ReadFrame(silent, DefaultMaxFrame)
	assert.Error(t, err, "closed")

	// A connection that has spoken may stay idle.
	time.Sleep(500 * time.Millisecond)
	sendReq(t, spoke, 2, "echo", nil)
	assert.Equal(t, true, readResp(t, spoke)["ok"])
}

var _ = msgpack.Marshal
