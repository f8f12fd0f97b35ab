package ipc

import (
	"context"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// scriptedDaemon is the far end of a client's connection, driven by the
// test frame by frame: it reads requests and writes exactly the bytes the
// test asks for, when it asks.
type scriptedDaemon struct {
	t  *testing.T
	nc net.Conn
}

func newScriptedPair(t *testing.T) (*Client, *scriptedDaemon) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		nc, err := net.FileConn(f)
		require.NoError(t, err)
		return nc
	}
	cl := newClient(conn(fds[0]), DefaultMaxFrame)
	d := &scriptedDaemon{t: t, nc: conn(fds[1])}
	t.Cleanup(func() { cl.Close(); d.nc.Close() })
	return cl, d
}

// request reads the next request and returns its id and op.
func (d *scriptedDaemon) request() (uint64, string) {
	d.t.Helper()
	d.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	body, err := ReadFrame(d.nc, DefaultMaxFrame)
	require.NoError(d.t, err)
	var m struct {
		ID uint64 `msgpack:"id"`
		Op string `msgpack:"op"`
	}
	require.NoError(d.t, msgpack.Unmarshal(body, &m))
	return m.ID, m.Op
}

func (d *scriptedDaemon) frame(v map[string]any) []byte {
	b, err := msgpack.Marshal(v)
	require.NoError(d.t, err)
	return AppendFrame(nil, b)
}

func (d *scriptedDaemon) answer(id uint64, result any) []byte {
	return d.frame(map[string]any{"v": 1, "id": id, "ok": true, "result": result})
}

func (d *scriptedDaemon) write(b []byte) {
	d.t.Helper()
	_, err := d.nc.Write(b)
	require.NoError(d.t, err)
}

type callResult struct {
	out map[string]any
	err error
}

func goCall(cl *Client, ctx context.Context, op string) chan callResult {
	return goCallArgs(cl, ctx, op, nil)
}

func goCallArgs(cl *Client, ctx context.Context, op string, args map[string]any) chan callResult {
	ch := make(chan callResult, 1)
	go func() {
		var out map[string]any
		err := cl.Call(ctx, op, args, &out)
		ch <- callResult{out, err}
	}()
	return ch
}

func waitResult(t *testing.T, ch chan callResult) callResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("call did not return")
		return callResult{}
	}
}

// readerRole reports whether some goroutine owns the reader role.
func (c *Client) readerRole() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reading
}

// A call alone on the connection reads its own answer; when it is done
// nobody holds the reader role, so the next one does the same.
func TestClientInlineCallsLeaveNoReader(t *testing.T) {
	cl, d := newScriptedPair(t)
	for i := range 3 {
		res := goCall(cl, context.Background(), "health")
		id, op := d.request()
		assert.Equal(t, "health", op)
		assert.True(t, cl.readerRole())
		d.write(d.answer(id, map[string]any{"n": i}))
		r := waitResult(t, res)
		require.NoError(t, r.err)
		assert.EqualValues(t, i, r.out["n"])
		assert.False(t, cl.readerRole(), "no reader left behind after a lone call")
	}
}

// A cancelled inline reader stops in the middle of a frame; the frame is
// not lost: the reader that takes over (here: the next call's) reads the
// rest of it and the stream stays in step.
func TestClientCancelMidFrameKeepsTheStream(t *testing.T) {
	cl, d := newScriptedPair(t)
	ctx, cancel := context.WithCancel(context.Background())
	first := goCall(cl, ctx, "slow")
	id1, _ := d.request()
	late := d.answer(id1, map[string]any{"late": true})
	d.write(late[:3]) // part of the length prefix
	time.Sleep(20 * time.Millisecond)
	cancel()
	r := waitResult(t, first)
	assert.ErrorIs(t, r.err, context.Canceled)
	assert.False(t, cl.readerRole())

	second := goCall(cl, context.Background(), "health")
	id2, _ := d.request()
	d.write(late[3:]) // the abandoned answer's rest: read and dropped
	d.write(d.answer(id2, map[string]any{"second": true}))
	r = waitResult(t, second)
	require.NoError(t, r.err)
	assert.Equal(t, true, r.out["second"])
}

// The same with the cut inside the body, and a call that was waiting on
// the cancelled reader: the reader goroutine that takes over finishes the
// frame and delivers the waiting call's answer.
func TestClientCancelledReaderHandsOverToWaitingCall(t *testing.T) {
	cl, d := newScriptedPair(t)
	ctx, cancel := context.WithCancel(context.Background())
	first := goCall(cl, ctx, "slow")
	id1, _ := d.request()
	second := goCall(cl, context.Background(), "health")
	id2, _ := d.request()
	ans2 := d.answer(id2, map[string]any{"second": true})
	d.write(ans2[:len(ans2)-2])
	time.Sleep(20 * time.Millisecond)
	cancel()
	assert.ErrorIs(t, waitResult(t, first).err, context.Canceled)
	assert.True(t, cl.readerRole(), "a call is waiting: someone must read")
	d.write(ans2[len(ans2)-2:])
	r := waitResult(t, second)
	require.NoError(t, r.err)
	assert.Equal(t, true, r.out["second"])
	d.write(d.answer(id1, nil)) // the abandoned call's answer comes late
	require.Eventually(t, func() bool { return !cl.readerRole() }, 10*time.Second, time.Millisecond)
}

// Calls that overlap: answers in any order reach their callers, whichever
// goroutine reads them, and the reader role ends when the last is answered.
func TestClientOverlappingCallsAnswersOutOfOrder(t *testing.T) {
	cl, d := newScriptedPair(t)
	a := goCall(cl, context.Background(), "a")
	idA, _ := d.request()
	b := goCall(cl, context.Background(), "b")
	idB, _ := d.request()
	c := goCall(cl, context.Background(), "c")
	idC, _ := d.request()
	d.write(d.answer(idB, map[string]any{"who": "b"}))
	rb := waitResult(t, b)
	require.NoError(t, rb.err)
	assert.Equal(t, "b", rb.out["who"])
	d.write(d.answer(idA, map[string]any{"who": "a"})) // the inline reader's own: c still waits
	ra := waitResult(t, a)
	require.NoError(t, ra.err)
	assert.Equal(t, "a", ra.out["who"])
	assert.True(t, cl.readerRole(), "c waits: the role went to a reader goroutine")
	d.write(d.answer(idC, map[string]any{"who": "c"}))
	rc := waitResult(t, c)
	require.NoError(t, rc.err)
	assert.Equal(t, "c", rc.out["who"])
	require.Eventually(t, func() bool { return !cl.readerRole() }, 10*time.Second, time.Millisecond)
}

// Events of a streamed call reach its listener when the call reads them
// itself, in order, before its result.
func TestClientInlineStreamEvents(t *testing.T) {
	cl, d := newScriptedPair(t)
	var mu sync.Mutex
	var got []string
	done := make(chan error, 1)
	go func() {
		done <- cl.CallStream(context.Background(), "run", nil, nil, func(ev string, data []byte) {
			mu.Lock()
			got = append(got, ev+":"+string(data))
			mu.Unlock()
		})
	}()
	id, _ := d.request()
	d.write(d.frame(map[string]any{"v": 1, "id": id, "event": "stdout", "data": []byte("a")}))
	d.write(d.frame(map[string]any{"v": 1, "id": id, "event": "stderr", "data": []byte("b")}))
	d.write(d.answer(id, map[string]any{}))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("stream call did not return")
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"stdout:a", "stderr:b"}, got)
}

// A daemon that refuses an idle connection (its reason frame, then
// hang-up) is heard by the next call, which fails with that reason.
func TestClientIdleRefusalReachesNextCall(t *testing.T) {
	cl, d := newScriptedPair(t)
	d.write(d.frame(map[string]any{"v": 1, "id": 0, "ok": false, "error": map[string]any{"code": CodeBusy, "message": "too many connections"}}))
	d.nc.Close()
	err := cl.Call(context.Background(), "health", nil, nil)
	assert.True(t, IsCode(err, CodeBusy), "got %v", err)
	select {
	case <-cl.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after the refusal")
	}
	assert.True(t, IsCode(cl.Call(context.Background(), "health", nil, nil), CodeBusy))
}

// A deadline that ends while the call reads inline returns at once.
func TestClientInlineDeadline(t *testing.T) {
	cl, d := newScriptedPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	res := goCall(cl, ctx, "slow")
	d.request()
	assert.ErrorIs(t, waitResult(t, res).err, context.DeadlineExceeded)
	// The connection still works.
	res = goCall(cl, context.Background(), "health")
	id, _ := d.request()
	d.write(d.answer(id, map[string]any{"ok": 1}))
	require.NoError(t, waitResult(t, res).err)
}
