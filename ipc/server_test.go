package ipc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// testHandler answers "echo" with its args, "sleep" after args.ms
// milliseconds, when release is closed or when cancelled (it sends on
// started, if set, as it begins), and "boom" by panicking.
type testHandler struct {
	mu           sync.Mutex
	disconnected []uint64
	started      chan struct{}
	release      chan struct{}
}

func (h *testHandler) Handle(ctx context.Context, peer *Peer, req *Request) (any, error) {
	switch req.Op {
	case "echo":
		return map[string]any{"args": req.Args.Map(), "uid": peer.UID}, nil
	case "sleep":
		ms := req.Args.Int("ms", 0, 0, 60000)
		if h.started != nil {
			h.started <- struct{}{}
		}
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
			return map[string]any{"slept": ms}, nil
		case <-h.release:
			return map[string]any{"slept": "released"}, nil
		case <-ctx.Done():
			return nil, Errorf(CodeShuttingDown, "cancelled")
		}
	case "boom":
		panic("boom")
	case "fail":
		return nil, errors.New("secret internal detail")
	}
	return nil, Errorf(CodeUnknownOp, "unknown op %q", req.Op)
}

func (h *testHandler) Disconnected(p *Peer) {
	h.mu.Lock()
	h.disconnected = append(h.disconnected, p.ConnID)
	h.mu.Unlock()
}

func startServer(t *testing.T, cfg ServerConfig) (*Server, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "ipc")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "sock", "s.sock")
	l, err := Listen(ListenConfig{Path: path, Mode: 0o660, GID: -1})
	require.NoError(t, err)
	if cfg.Handler == nil {
		cfg.Handler = &testHandler{}
	}
	s := NewServer(cfg)
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut := make(chan struct{})
		go func() { s.Shutdown(ctx); close(shut) }()
		select {
		case <-shut:
			assert.ErrorIs(t, <-done, ErrServerClosed)
		case <-time.After(15 * time.Second):
			t.Error("Shutdown did not return within 15 s: a connection's goroutine is stuck")
		}
	})
	return s, path
}

func rawConn(t *testing.T, path string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

func readResp(t *testing.T, c net.Conn) map[string]any {
	t.Helper()
	body, err := ReadFrame(c, DefaultMaxFrame)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, msgpack.Unmarshal(body, &m))
	return m
}

func errCode(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func sendReq(t *testing.T, c net.Conn, id int, op string, args map[string]any) {
	t.Helper()
	b, err := msgpack.Marshal(map[string]any{"v": 1, "id": id, "op": op, "args": args})
	require.NoError(t, err)
	require.NoError(t, WriteFrame(c, b, DefaultMaxFrame))
}

func TestServerPipelinesOutOfOrder(t *testing.T) {
	_, path := startServer(t, ServerConfig{})
	c := rawConn(t, path)
	sendReq(t, c, 1, "sleep", map[string]any{"ms": 300})
	sendReq(t, c, 2, "echo", map[string]any{"x": 1})
	first := readResp(t, c)
	second := readResp(t, c)
	assert.EqualValues(t, 2, first["id"], "the quick request overtakes the slow one")
	assert.EqualValues(t, 1, second["id"])
	assert.Equal(t, true, second["ok"])
}

func TestServerBadInputKeepsServing(t *testing.T) {
	_, path := startServer(t, ServerConfig{MaxFrame: 1024})
	c := rawConn(t, path)

	// A zero-length frame: bad_request, and the connection stays usable.
	_, err := c.Write([]byte{0, 0, 0, 0})
	require.NoError(t, err)
	m := readResp(t, c)
	assert.Equal(t, CodeBadRequest, errCode(m))
	assert.EqualValues(t, 0, m["id"])

	// A msgpack array instead of a map.
	b, _ := msgpack.Marshal([]any{1, "x"})
	require.NoError(t, WriteFrame(c, b, 1024))
	assert.Equal(t, CodeBadRequest, errCode(readResp(t, c)))

	// Garbage inside a well-formed frame.
	require.NoError(t, WriteFrame(c, []byte("\xc1not msgpack"), 1024))
	assert.Equal(t, CodeBadRequest, errCode(readResp(t, c)))

	// Unknown op, handler error, panicking handler.
	sendReq(t, c, 5, "nope", nil)
	assert.Equal(t, CodeUnknownOp, errCode(readResp(t, c)))
	sendReq(t, c, 6, "fail", nil)
	m = readResp(t, c)
	assert.Equal(t, CodeInternal, errCode(m))
	assert.NotContains(t, fmt.Sprint(m), "secret")
	sendReq(t, c, 7, "boom", nil)
	assert.Equal(t, CodeInternal, errCode(readResp(t, c)))

	// Still serving on the same connection.
	sendReq(t, c, 8, "echo", nil)
	assert.Equal(t, true, readResp(t, c)["ok"])

	// An oversize length: frame_too_large, then the connection is closed.
	_, err = c.Write(binary.BigEndian.AppendUint32(nil, 1025))
	require.NoError(t, err)
	m = readResp(t, c)
	assert.Equal(t, CodeFrameTooLarge, errCode(m))
	e := m["error"].(map[string]any)
	assert.EqualValues(t, 1024, e["max_frame_bytes"])
	_, err = ReadFrame(c, 1024)
	assert.Error(t, err, "connection closed after frame_too_large")

	// Other clients are unaffected.
	c2 := rawConn(t, path)
	sendReq(t, c2, 1, "echo", nil)
	assert.Equal(t, true, readResp(t, c2)["ok"])
}

func TestServerTruncatedFrame(t *testing.T) {
	_, path := startServer(t, ServerConfig{FrameReadTimeout: 200 * time.Millisecond})
	c := rawConn(t, path)
	_, err := c.Write(append(binary.BigEndian.AppendUint32(nil, 100), "only a bit"...))
	require.NoError(t, err)
	m := readResp(t, c)
	assert.Equal(t, CodeBadRequest, errCode(m))
	assert.Contains(t, m["error"].(map[string]any)["message"], "truncated")
}

func TestServerRefusesUnauthorized(t *testing.T) {
	log := &syncBuffer{}
	_, path := startServer(t, ServerConfig{Logger: hclog.New(&hclog.LoggerOptions{Output: log}), Authorize: func(p *Peer) error {
		return fmt.Errorf("uid %d is not in allowed groups [4242 4343]", p.UID)
	}})
	c := rawConn(t, path)
	m := readResp(t, c)
	assert.Equal(t, CodeUnauthorized, errCode(m))
	msg := m["error"].(map[string]any)["message"].(string)
	assert.Contains(t, msg, fmt.Sprintf("uid %d may not use this daemon", os.Getuid()))
	// The peer is told it is not allowed, never who is: the policy stays
	// in the daemon's log.
	assert.NotContains(t, fmt.Sprint(m), "4242")
	assert.NotContains(t, fmt.Sprint(m), "allowed groups")
	_, err := ReadFrame(c, DefaultMaxFrame)
	assert.Error(t, err)
	assert.Eventually(t, func() bool { return strings.Contains(log.String(), "allowed groups [4242 4343]") }, 5*time.Second, 10*time.Millisecond)
}

// syncBuffer is a log destination the test can read while the server
// writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestServerMaxConns(t *testing.T) {
	_, path := startServer(t, ServerConfig{MaxConns: 1})
	c1 := rawConn(t, path)
	sendReq(t, c1, 1, "echo", nil)
	readResp(t, c1)
	c2 := rawConn(t, path)
	assert.Equal(t, CodeBusy, errCode(readResp(t, c2)))
}

func TestPeerCredentials(t *testing.T) {
	_, path := startServer(t, ServerConfig{})
	cl, err := Dial(context.Background(), path)
	require.NoError(t, err)
	defer cl.Close()
	var res struct {
		UID uint32 `msgpack:"uid"`
	}
	require.NoError(t, cl.Call(context.Background(), "echo", nil, &res))
	assert.EqualValues(t, os.Getuid(), res.UID)
}

func TestClientConcurrentCalls(t *testing.T) {
	_, path := startServer(t, ServerConfig{})
	cl, err := Dial(context.Background(), path)
	require.NoError(t, err)
	defer cl.Close()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var res struct {
				Args map[string]any `msgpack:"args"`
			}
			assert.NoError(t, cl.Call(context.Background(), "echo", map[string]any{"n": i}, &res))
			assert.EqualValues(t, i, res.Args["n"])
		}()
	}
	wg.Wait()
	err = cl.Call(context.Background(), "nope", nil, nil)
	assert.True(t, IsCode(err, CodeUnknownOp))
}

func TestShutdownDrainsThenRefuses(t *testing.T) {
	h := &testHandler{started: make(chan struct{}, 1), release: make(chan struct{})}
	s, path := startServer(t, ServerConfig{Handler: h})
	c := rawConn(t, path)
	sendReq(t, c, 1, "sleep", map[string]any{"ms": 60000})
	<-h.started
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		shut <- s.Shutdown(ctx)
	}()
	for !s.isClosing() {
		time.Sleep(time.Millisecond)
	}
	sendReq(t, c, 2, "echo", nil)
	// The refusal comes first; then the in-flight request is let finish.
	refused := readResp(t, c)
	close(h.release)
	got := map[float64]map[string]any{toF(refused["id"]): refused}
	m := readResp(t, c)
	got[toF(m["id"])] = m
	assert.Equal(t, true, got[1]["ok"], "the in-flight request finished")
	assert.Equal(t, CodeShuttingDown, errCode(got[2]))
	require.NoError(t, <-shut)
	_, err := net.Dial("unix", path)
	assert.Error(t, err, "the socket is gone after shutdown")
	h.mu.Lock()
	assert.Len(t, h.disconnected, 1)
	h.mu.Unlock()
}

func TestShutdownDeadlineCancels(t *testing.T) {
	h := &testHandler{started: make(chan struct{}, 1)}
	s, path := startServer(t, ServerConfig{Handler: h})
	c := rawConn(t, path)
	sendReq(t, c, 1, "sleep", map[string]any{"ms": 60000})
	<-h.started
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	assert.ErrorIs(t, s.Shutdown(ctx), context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second)
}

func toF(v any) float64 {
	switch n := v.(type) {
	case int8:
		return float64(n)
	case uint8:
		return float64(n)
	case int64:
		return float64(n)
	case uint64:
		return float64(n)
	}
	return -1
}

func TestListenStaleAndLive(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "run", "s.sock")
	l, err := Listen(ListenConfig{Path: path, Mode: 0o660, GID: -1})
	require.NoError(t, err)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o660), fi.Mode().Perm())
	di, err := os.Stat(filepath.Dir(path))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o750), di.Mode().Perm())

	// A live socket is not replaced.
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	_, err = Listen(ListenConfig{Path: path, Mode: 0o660, GID: -1})
	assert.ErrorContains(t, err, "another daemon")

	// A stale one (nobody listening) is.
	l.SetUnlinkOnClose(false)
	l.Close()
	_, err = os.Stat(path)
	require.NoError(t, err, "the stale socket file is still there")
	l2, err := Listen(ListenConfig{Path: path, Mode: 0o600, GID: -1})
	require.NoError(t, err)
	l2.Close()

	// A regular file in the way is never removed.
	require.NoError(t, os.WriteFile(path, []byte("x"), 0o600))
	_, err = Listen(ListenConfig{Path: path, Mode: 0o660, GID: -1})
	assert.ErrorContains(t, err, "not a socket")

	// A shared directory is refused.
	_, err = Listen(ListenConfig{Path: filepath.Join(os.TempDir(), "x.sock"), Mode: 0o660, GID: -1})
	assert.ErrorContains(t, err, "shared")
}
