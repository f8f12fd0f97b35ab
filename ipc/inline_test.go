package ipc

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/internal/handoff"
)

// inlineHandler is testHandler plus "hold", which runs inline until
// released: it reports what it saw on seen, releases the connection when
// args.release says so, and returns when gate is closed (or its request
// ends). "audited" answers at once and leaves an AfterResponse that waits
// for gate.
type inlineHandler struct {
	testHandler
	gate   chan struct{} // closed by open
	once   sync.Once
	seen   chan holdSeen
	mu     sync.Mutex
	events []string
}

type holdSeen struct {
	inline bool
	fd     int
}

// startInline starts a server of a new inlineHandler whose gate opens at
// the end of the test at the latest, before the server's shutdown, so that
// a failing test does not leave a handler waiting.
func startInline(t *testing.T) (*inlineHandler, *Server, string) {
	h := &inlineHandler{gate: make(chan struct{}), seen: make(chan holdSeen, 8)}
	s, path := startServer(t, ServerConfig{Handler: h})
	t.Cleanup(h.open)
	return h, s, path
}

func (h *inlineHandler) open() { h.once.Do(func() { close(h.gate) }) }

func (h *inlineHandler) InlineUntilRelease(req *Request) bool {
	return req.Op == "hold" || req.Op == "release-late"
}

func (h *inlineHandler) note(e string) {
	h.mu.Lock()
	h.events = append(h.events, e)
	h.mu.Unlock()
}

func (h *inlineHandler) Handle(ctx context.Context, peer *Peer, req *Request) (any, error) {
	switch req.Op {
	case "hold":
		hc := handoff.From(ctx)
		h.seen <- holdSeen{inline: hc != nil, fd: hc.FD()}
		if req.Args.Bool("release", false) {
			handoff.Release(ctx)
		}
		select {
		case <-h.gate:
			return map[string]any{"held": true}, nil
		case <-ctx.Done():
			h.note("hold cancelled")
			return nil, Errorf(CodeShuttingDown, "cancelled")
		}
	case "release-late":
		// Released only once the gate opens, then reports whether its
		// context was already cancelled as Release returned.
		h.seen <- holdSeen{inline: handoff.From(ctx) != nil}
		<-h.gate
		handoff.Release(ctx)
		h.note(fmt.Sprintf("cancelled at release: %v", ctx.Err() != nil))
		return map[string]any{}, nil
	case "audited":
		req.AfterResponse(func() {
			<-h.gate
			h.note("audited's after-response")
		})
		return map[string]any{}, nil
	}
	return h.testHandler.Handle(ctx, peer, req)
}

func holdCall(cl *Client, release bool) chan callResult {
	return goCallArgs(cl, context.Background(), "hold", map[string]any{"release": release})
}

func echoCall(cl *Client) chan callResult { return goCall(cl, context.Background(), "echo") }

// within waits up to 10 s for a call's error.
func within(t *testing.T, ch chan callResult) error {
	t.Helper()
	return waitResult(t, ch).err
}

// A request run inline has its connection's descriptor in its context;
// once it releases the connection, the connection's next request is
// served while it still runs.
func TestInlineRequestReleasesItsConnection(t *testing.T) {
	h, _, path := startInline(t)
	cl, err := Dial(context.Background(), path)
	require.NoError(t, err)
	defer cl.Close()

	held := holdCall(cl, true)
	seen := <-h.seen
	assert.True(t, seen.inline, "alone on its connection, it runs inline")
	assert.GreaterOrEqual(t, seen.fd, 0)
	require.NoError(t, within(t, echoCall(cl)), "served while the released request still runs")
	select {
	case r := <-held:
		t.Fatalf("hold returned before its gate opened: %v", r.err)
	default:
	}
	h.open()
	require.NoError(t, within(t, held))

	// Released or not, the connection goes on: a request that never
	// released it leaves its reader reading on where it was.
	require.NoError(t, within(t, holdCall(cl, false)))
	<-h.seen
	require.NoError(t, within(t, holdCall(cl, true)))
	<-h.seen
	require.NoError(t, within(t, echoCall(cl)))
	h.mu.Lock()
	assert.Empty(t, h.events)
	h.mu.Unlock()
}

// Until it releases it, nothing more of the connection is read: a second
// request waits for the first.
func TestInlineRequestHoldsItsConnectionUntilReleased(t *testing.T) {
	h, _, path := startInline(t)
	cl, err := Dial(context.Background(), path)
	require.NoError(t, err)
	defer cl.Close()

	held := holdCall(cl, false)
	require.True(t, (<-h.seen).inline)
	echo := echoCall(cl)
	select {
	case r := <-echo:
		t.Fatalf("echo answered while the inline request held the connection: %v", r.err)
	case <-time.After(100 * time.Millisecond):
	}
	h.open()
	require.NoError(t, within(t, held))
	require.NoError(t, within(t, echo))
}

// A request is run inline only when nothing else of its connection is in
// flight.
func TestInlineOnlyWhenAloneOnTheConnection(t *testing.T) {
	h, _, path := startInline(t)
	h.open()
	c := rawConn(t, path)
	sendReq(t, c, 1, "sleep", map[string]any{"ms": 60000}) // until the connection closes
	sendReq(t, c, 2, "hold", nil)
	assert.False(t, (<-h.seen).inline, "a sleep is in flight")
	assert.EqualValues(t, 2, readResp(t, c)["id"])
	c.Close()
	c2 := rawConn(t, path)
	sendReq(t, c2, 1, "hold", nil)
	assert.True(t, (<-h.seen).inline, "alone on its own connection")
	assert.Equal(t, true, readResp(t, c2)["ok"])
}

// A client that hangs up while its released request runs has that request
// cancelled, and the connection is closed down once, after it ends.
func TestHangUpCancelsAReleasedInlineRequest(t *testing.T) {
	h, s, path := startInline(t)
	c := rawConn(t, path)
	sendReq(t, c, 1, "hold", map[string]any{"release": true})
	require.True(t, (<-h.seen).inline)
	require.NoError(t, c.Close())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.Shutdown(ctx), "nothing is left in flight")
	h.mu.Lock()
	assert.Equal(t, []string{"hold cancelled"}, h.events)
	h.mu.Unlock()
	h.testHandler.mu.Lock()
	assert.Len(t, h.testHandler.disconnected, 1)
	h.testHandler.mu.Unlock()
}

// AfterResponse runs once the response is out, and before the next
// response of the connection is written.
func TestAfterResponseRunsAfterTheResponseAndBeforeTheNext(t *testing.T) {
	h, _, path := startInline(t)
	cl, err := Dial(context.Background(), path)
	require.NoError(t, err)
	defer cl.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, cl.Call(ctx, "audited", nil, nil), "answered while its after-response work waits")
	echo := echoCall(cl)
	select {
	case r := <-echo:
		t.Fatalf("the next response was written before the first's after-response work ran: %v", r.err)
	case <-time.After(100 * time.Millisecond):
	}
	h.open()
	require.NoError(t, within(t, echo))
	h.mu.Lock()
	assert.Equal(t, []string{"audited's after-response"}, h.events)
	h.mu.Unlock()
}

// A request released after its client hung up sees its context cancelled
// as Release returns: what the new reader does on reading the end is done
// before it starts (the bwrap backend releases at its hot wait, and its
// next step judges the context).
func TestReleaseAfterAHangUpCancelsAtOnce(t *testing.T) {
	h, s, path := startInline(t)
	c := rawConn(t, path)
	sendReq(t, c, 1, "release-late", nil)
	require.True(t, (<-h.seen).inline)
	require.NoError(t, c.Close())
	h.open()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.Shutdown(ctx))
	h.mu.Lock()
	assert.Equal(t, []string{"cancelled at release: true"}, h.events)
	h.mu.Unlock()
}
