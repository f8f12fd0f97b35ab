package ipc

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/internal/handoff"
)

// Handler serves one request. It returns a result (encoded as the
// response's "result" map) or an error; an error that is not an *Error is
// logged and sent as "internal". ctx is cancelled when the connection closes
// or the server's shutdown deadline passes.
type Handler interface {
	Handle(ctx context.Context, peer *Peer, req *Request) (any, error)
}

// Inliner is optionally implemented by a Handler whose cheap ops (ones
// that never block) may be served on the connection's reader goroutine,
// saving a goroutine hand-off per request.
type Inliner interface {
	Inline(op string) bool
}

// ReleaseInliner is optionally implemented by a Handler some of whose
// requests may start on the connection's reader goroutine and stay there
// until they would wait: such a request, when it is alone on its
// connection, gets a *handoff.Conn in its context, and everything on its
// path that may wait longer than a few milliseconds calls handoff.Release
// first, which starts a new reader goroutine for the connection (until
// then nothing more of it is read: neither a next request nor a hang-up).
// It saves the goroutine hand-off, and the runtime thread that starting a
// goroutine wakes, of every short request (internal/handoff).
type ReleaseInliner interface {
	InlineUntilRelease(req *Request) bool
}

// ConnObserver is optionally implemented by a Handler that needs to know
// when a connection ends (after its last request has finished).
type ConnObserver interface {
	Disconnected(peer *Peer)
}

// readBufferSize is each connection's read buffer.
const readBufferSize = 4 << 10

// Defaults for ServerConfig's zero values.
const (
	DefaultMaxConns          = 4096
	DefaultMaxInFlight       = 64
	DefaultFrameReadTimeout  = 30 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultFirstFrameTimeout = 10 * time.Second
	// DefaultMaxRequestBytes bounds what all requests together hold from
	// the arrival of their frame until their response is written.
	DefaultMaxRequestBytes = 256 << 20
	// DefaultMaxResponseBytes bounds what all responses together hold
	// (reserved by their handler, encoded, not yet written).
	DefaultMaxResponseBytes = 256 << 20
	// DefaultMaxConnResponseBytes is the same per connection: room for
	// the largest response twice over (the data and its encoding), or ten
	// commands at once with the default max_output_bytes.
	DefaultMaxConnResponseBytes = 4 * DefaultMaxFrame
)

// DefaultMaxConnsPerUID is the per-uid share of maxConns: three quarters,
// so that on a host where every client is one uid (an Airflow worker)
// little is lost, and on a shared one a uid cannot take every slot.
func DefaultMaxConnsPerUID(maxConns int) int { return max(1, maxConns*3/4) }

// ServerConfig configures a Server. Zero values take the defaults above.
type ServerConfig struct {
	Handler Handler
	// Authorize decides whether a peer may talk to the server at all. A
	// non-nil error refuses the connection; its text is logged as the
	// reason. The peer is told only that it is not allowed: the policy
	// (who is) is none of its business.
	Authorize func(*Peer) error
	Logger    hclog.Logger
	// MaxFrame bounds a frame body in either direction.
	MaxFrame int
	// MaxConns bounds open connections; the next one gets a busy error
	// frame and is closed.
	MaxConns int
	// MaxConnsPerUID bounds the open connections of one peer uid, refused
	// the same way (default DefaultMaxConnsPerUID(MaxConns)).
	MaxConnsPerUID int
	// FirstFrameTimeout bounds how long a new connection may stay silent:
	// one that has sent no frame by then is closed. A connection that has
	// sent a frame may be idle for as long as it likes.
	FirstFrameTimeout time.Duration
	// MaxRequestBytes bounds the bytes held for requests, all connections
	// together: each frame is charged RequestCost of its length before its
	// body is read, until its response is written. A frame that does not
	// fit waits (its connection is not read meanwhile).
	MaxRequestBytes int64
	// MaxResponseBytes bounds the bytes held for responses not yet
	// written, all connections together; MaxConnResponseBytes the same for
	// one connection. A response waits for room (Request.ReserveResponse,
	// or at most WriteTimeout once encoded: past that the connection is
	// closed, with the reason logged).
	MaxResponseBytes     int64
	MaxConnResponseBytes int64
	// MaxInFlight bounds concurrent requests on one connection; past it
	// the server stops reading that connection until one finishes.
	MaxInFlight int
	// FrameReadTimeout bounds how long a frame's body may take to arrive
	// once its length has been read (an idle connection has no deadline).
	FrameReadTimeout time.Duration
	// WriteTimeout bounds writing one response to a slow reader.
	WriteTimeout time.Duration
}

// Server accepts connections and serves requests on them.
type Server struct {
	cfg ServerConfig
	log hclog.Logger

	// base is the parent of every request context; hardStop cancels it
	// when the shutdown deadline passes.
	base     context.Context
	hardStop context.CancelFunc

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	uidConns  map[uint32]int // open connections per peer uid
	closing   bool

	requests  *Budget // bytes held for requests (RequestCost of each)
	responses *Budget // bytes held for responses not yet written

	nextConnID atomic.Uint64
	inFlight   sync.WaitGroup // requests being handled
	connWG     sync.WaitGroup // connection goroutines
}

// NewServer returns a server; call Serve to start it.
func NewServer(cfg ServerConfig) *Server {
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = DefaultMaxFrame
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.FrameReadTimeout <= 0 {
		cfg.FrameReadTimeout = DefaultFrameReadTimeout
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.MaxConnsPerUID <= 0 {
		cfg.MaxConnsPerUID = DefaultMaxConnsPerUID(cfg.MaxConns)
	}
	if cfg.FirstFrameTimeout <= 0 {
		cfg.FirstFrameTimeout = DefaultFirstFrameTimeout
	}
	// Each budget must hold the largest thing charged to it, or that
	// thing would wait forever.
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	cfg.MaxRequestBytes = max(cfg.MaxRequestBytes, RequestCost(cfg.MaxFrame))
	if cfg.MaxConnResponseBytes <= 0 {
		cfg.MaxConnResponseBytes = DefaultMaxConnResponseBytes
	}
	cfg.MaxConnResponseBytes = max(cfg.MaxConnResponseBytes, int64(cfg.MaxFrame)+headerSize)
	if cfg.MaxResponseBytes <= 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	cfg.MaxResponseBytes = max(cfg.MaxResponseBytes, cfg.MaxConnResponseBytes)
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	base, cancel := context.WithCancel(context.Background())
	return &Server{
		cfg:       cfg,
		log:       cfg.Logger,
		base:      base,
		hardStop:  cancel,
		listeners: map[net.Listener]struct{}{},
		conns:     map[*conn]struct{}{},
		uidConns:  map[uint32]int{},
		requests:  NewBudget(cfg.MaxRequestBytes),
		responses: NewBudget(cfg.MaxResponseBytes),
	}
}

// Held reports the bytes held now against the request and the response
// budgets (for tests and metrics).
func (s *Server) Held() (requests, responses int64) {
	return s.requests.InUse(), s.responses.InUse()
}

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("ipc: server closed")

// Serve accepts connections on l until Shutdown. It always returns a
// non-nil error: ErrServerClosed after Shutdown.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()

	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if s.isClosing() {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) || isTemporary(err) {
				// EMFILE and friends: back off instead of spinning.
				backoff = min(max(backoff*2, 5*time.Millisecond), time.Second)
				s.log.Warn("accept failed; backing off", "error", err, "backoff", backoff)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		uc, ok := c.(*net.UnixConn)
		if !ok {
			c.Close()
			continue
		}
		s.startConn(uc)
	}
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// Conns returns the number of open connections.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// Shutdown stops accepting, lets in-flight requests finish until ctx is
// done, then cancels what is left, closes every connection and waits for
// their goroutines (and ConnObserver calls) to end. Requests that arrive
// during shutdown get shutting_down.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	for l := range s.listeners {
		l.Close()
	}
	s.mu.Unlock()

	drained := make(chan struct{})
	go func() { s.inFlight.Wait(); close(drained) }()
	var err error
	select {
	case <-drained:
	case <-ctx.Done():
		err = ctx.Err()
		s.log.Warn("shutdown deadline passed; cancelling requests still running")
		s.hardStop()
		<-drained
	}
	s.mu.Lock()
	for c := range s.conns {
		c.nc.Close()
	}
	s.mu.Unlock()
	s.connWG.Wait()
	s.hardStop()
	return err
}

// conn is one client connection.
type conn struct {
	s    *Server
	nc   *net.UnixConn
	peer *Peer
	log  hclog.Logger
	ctx  context.Context // cancelled when the connection's reader ends

	// responses bounds what this connection's responses hold until they
	// are written (within the server's budget of the same name).
	responses *Budget

	writeMu sync.Mutex
	raw     syscall.RawConn // nc's descriptor, for writeNow; nil: none
	fd      int             // nc's descriptor number, for a hot wait to watch; -1: unknown
	broken  atomic.Bool     // a write failed; stop using the connection
}

func (s *Server) startConn(nc *net.UnixConn) {
	id := s.nextConnID.Add(1)
	// Who it is first (one getsockopt), so the per-uid limit can count it.
	peer, err := PeerOf(nc)
	if err != nil {
		s.log.Error("connection refused: no peer credentials", "conn", id, "error", err)
		nc.Close()
		return
	}
	peer.ConnID = id
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		nc.Close()
		return
	}
	if len(s.conns) >= s.cfg.MaxConns {
		s.mu.Unlock()
		s.log.Warn("connection refused: too many connections", "conn", id, "peer_uid", peer.UID, "limit", s.cfg.MaxConns)
		refuse(nc, Errorf(CodeBusy, "the daemon already has %d connections open; retry later or raise max_connections", s.cfg.MaxConns), s.cfg)
		return
	}
	if s.uidConns[peer.UID] >= s.cfg.MaxConnsPerUID {
		s.mu.Unlock()
		s.log.Warn("connection refused: too many connections of one uid", "conn", id, "peer_uid", peer.UID, "limit", s.cfg.MaxConnsPerUID)
		refuse(nc, Errorf(CodeBusy, "uid %d already has %d connections open, the most one uid may; close some, or retry later", peer.UID, s.cfg.MaxConnsPerUID).
			With("max_connections_per_uid", s.cfg.MaxConnsPerUID), s.cfg)
		return
	}
	c := &conn{s: s, nc: nc, peer: peer, responses: NewBudget(s.cfg.MaxConnResponseBytes)}
	c.fd = -1
	if raw, err := nc.SyscallConn(); err == nil {
		c.raw = raw
		_ = raw.Control(func(fd uintptr) { c.fd = int(fd) })
	}
	c.log = s.log.With("conn", id, "peer_uid", peer.UID, "peer_pid", peer.PID)
	s.conns[c] = struct{}{}
	s.uidConns[peer.UID]++
	s.connWG.Add(1)
	s.mu.Unlock()

	go func() {
		if s.cfg.Authorize != nil {
			if err := s.cfg.Authorize(peer); err != nil {
				// The reason (the policy) stays in the log.
				c.log.Warn("connection refused", "peer_gid", peer.GID, "reason", err.Error())
				refuse(nc, Errorf(CodeUnauthorized, "uid %d may not use this daemon; ask its operator to let this user in (docs/operations.md, \"Who may connect\")", peer.UID), s.cfg)
				c.unregister()
				return
			}
		}
		c.log.Debug("connection accepted", "peer_gid", peer.GID)
		c.serve()
	}()
}

// hungUp reports whether the peer has shut the connection down with
// nothing left unread in it.
func (c *conn) hungUp() bool {
	fds := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN | unix.POLLRDHUP}}
	if n, err := unix.Poll(fds, 0); err != nil || n == 0 || fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP) == 0 {
		return false
	}
	unread, err := unix.IoctlGetInt(c.fd, unix.SIOCINQ)
	return err == nil && unread == 0
}

// unregister forgets c, once its last goroutine is done with it, and
// closes it.
func (c *conn) unregister() {
	s := c.s
	s.mu.Lock()
	delete(s.conns, c)
	if s.uidConns[c.peer.UID]--; s.uidConns[c.peer.UID] <= 0 {
		delete(s.uidConns, c.peer.UID)
	}
	s.mu.Unlock()
	c.nc.Close()
	s.connWG.Done()
}

// refuse writes one connection-level error frame (id 0) and closes.
func refuse(nc net.Conn, e *Error, cfg ServerConfig) {
	if body, err := EncodeResponse(0, nil, e); err == nil {
		nc.SetWriteDeadline(time.Now().Add(time.Second))
		WriteFrame(nc, body, cfg.MaxFrame)
	}
	nc.Close()
}

// reading is a connection's reader state. It belongs to whichever
// goroutine reads the connection: the connection's own, or, after an
// inline request released the connection (internal/handoff), a new one.
type reading struct {
	ctx    context.Context
	cancel context.CancelFunc
	br     *bufio.Reader
	sem    chan struct{} // one per request in flight
	reqs   sync.WaitGroup
	silent bool // no frame yet
}

func (c *conn) serve() {
	s := c.s
	ctx, cancel := context.WithCancel(s.base)
	c.ctx = ctx
	st := &reading{ctx: ctx, cancel: cancel, sem: make(chan struct{}, s.cfg.MaxInFlight), silent: true,
		// One read syscall usually brings a whole small frame (length and
		// body); 4 KiB per connection keeps idle connections cheap.
		br: bufio.NewReaderSize(c.nc, readBufferSize)}
	// A connection that has sent nothing may not hold its slot for long;
	// one that has sent a frame may stay idle as long as it likes (an agent
	// thinks for minutes between commands).
	c.nc.SetReadDeadline(time.Now().Add(s.cfg.FirstFrameTimeout))
	c.readOn(st)
}

// readOn reads and serves st's connection until it ends, then closes it;
// it returns early, leaving the rest to another goroutine, when an inline
// request released the connection.
func (c *conn) readOn(st *reading) {
	if c.read(st) {
		return
	}
	st.cancel()
	st.reqs.Wait()
	if obs, ok := c.s.cfg.Handler.(ConnObserver); ok {
		obs.Disconnected(c.peer)
	}
	c.log.Debug("connection closed")
	c.unregister()
}

// read serves requests until the connection ends (false) or an inline
// request handed the connection to a new reader (true).
func (c *conn) read(st *reading) (handedOff bool) {
	s := c.s
	ctx, br, sem := st.ctx, st.br, st.sem
	inliner, _ := s.cfg.Handler.(Inliner)
	releaser, _ := s.cfg.Handler.(ReleaseInliner)
	for {
		n, err := ReadHeader(br, s.cfg.MaxFrame)
		if st.silent {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				c.log.Warn("closing a connection that sent nothing", "first_frame_timeout", s.cfg.FirstFrameTimeout)
				c.sendQuick(Errorf(CodeBadRequest, "no request within %s of connecting; connect when there is something to send", s.cfg.FirstFrameTimeout))
				return false
			}
			st.silent = false
			c.nc.SetReadDeadline(time.Time{})
		}
		switch {
		case errors.Is(err, ErrEmptyFrame):
			// The stream is still in step: answer and read on.
			c.send(nil, 0, nil, Errorf(CodeBadRequest, "zero-length frame; a frame holds one msgpack map"))
			continue
		case errors.Is(err, ErrFrameTooLarge):
			c.log.Warn("frame too large; closing connection", "announced", n, "limit", s.cfg.MaxFrame)
			c.send(nil, 0, nil, Errorf(CodeFrameTooLarge, "%v", err).With("max_frame_bytes", s.cfg.MaxFrame))
			return false
		case err != nil:
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				c.log.Debug("read failed; closing connection", "error", err)
			}
			return false
		}
		// The frame is paid for before its body is read: the body, what
		// decoding makes of it, and a small response, until the response
		// is written. A frame that does not fit waits, unread.
		charge := RequestCost(n)
		if !s.requests.TryAcquire(charge) {
			c.log.Debug("waiting for room in the request budget", "bytes", charge, "budget", s.cfg.MaxRequestBytes)
			if s.requests.Acquire(ctx, charge) != nil {
				return false
			}
		}
		// A body the header's read already brought needs no deadline: it
		// is copied from the buffer without a system call. Only one that
		// must still arrive is bounded (arming and clearing a deadline
		// costs a runtime timer, whose arming can wake another thread).
		bounded := br.Buffered() < n
		if bounded {
			c.nc.SetReadDeadline(time.Now().Add(s.cfg.FrameReadTimeout))
		}
		body, err := ReadBody(br, n)
		if bounded {
			c.nc.SetReadDeadline(time.Time{})
		}
		if err != nil {
			s.requests.Release(charge)
			c.log.Warn("truncated frame; closing connection", "announced", n, "error", err)
			c.send(nil, 0, nil, Errorf(CodeBadRequest, "truncated frame: %d bytes announced, fewer arrived", n))
			return false
		}
		req, derr := DecodeRequest(body)
		req.c, req.charge = c, charge
		if derr != nil {
			c.log.Warn("request refused", "id", req.ID, "code", derr.Code, "reason", derr.Message)
			c.send(&req, req.ID, nil, derr)
			c.release(&req)
			continue
		}
		// Alone on the connection, with nothing more already read: a
		// request the handler lets run inline until it would wait.
		alone := len(sem) == 0 && br.Buffered() == 0
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			c.release(&req)
			return false
		}
		// Add to inFlight under the lock that Shutdown takes to set
		// closing, so that no request starts after Shutdown began waiting.
		s.mu.Lock()
		closing := s.closing
		if !closing {
			s.inFlight.Add(1)
		}
		s.mu.Unlock()
		if closing {
			<-sem
			c.send(&req, req.ID, nil, Errorf(CodeShuttingDown, "the daemon is shutting down; retry against its successor"))
			c.release(&req)
			continue
		}
		if inliner != nil && inliner.Inline(req.Op) {
			c.handle(ctx, &req)
			<-sem
			s.inFlight.Done()
			continue
		}
		if releaser != nil && alone && c.fd >= 0 && releaser.InlineUntilRelease(&req) {
			// Run here; the first wait on its path starts a new reader
			// (readOn, on its own goroutine) and this one ends with the
			// request. The request counts in reqs, which that reader waits
			// for before it closes the connection.
			st.reqs.Add(1)
			hc := handoff.New(c.fd, func() {
				if c.hungUp() {
					// What the new reader does when it reads the end,
					// done before this returns: a request released
					// because its client went away sees its context
					// cancelled at once (nothing is lost: an inline
					// request had nothing more read behind it).
					st.cancel()
				}
				go c.readOn(st)
			})
			req.handoff = hc
			c.handle(handoff.With(ctx, hc), &req)
			released := hc.Done()
			<-sem
			st.reqs.Done()
			s.inFlight.Done()
			if released {
				return true
			}
			continue
		}
		st.reqs.Add(1)
		go func(req Request) {
			defer func() { <-sem; st.reqs.Done(); s.inFlight.Done() }()
			c.handle(ctx, &req)
		}(req)
	}
}

func (c *conn) handle(ctx context.Context, req *Request) {
	defer c.runAfter(req)
	defer c.release(req)
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("handler panicked", "op", req.Op, "id", req.ID, "panic", r)
			c.send(req, req.ID, nil, Errorf(CodeInternal, "internal error; the daemon's log has the details"))
		}
	}()
	id := req.ID
	ctx = WithEvents(ctx, func(event string, data []byte) error { return c.sendEvent(ctx, id, event, data) })
	result, err := c.s.cfg.Handler.Handle(ctx, c.peer, req)
	if err != nil {
		e := AsError(err)
		if e.Code == CodeInternal {
			c.log.Error("request failed", "op", req.Op, "id", req.ID, "error", err)
		}
		c.send(req, req.ID, nil, e)
		return
	}
	c.send(req, req.ID, result, nil)
}

// AfterResponse has f run once r's response has been written (or given
// up on), on the goroutine that wrote it and before any later response of
// the connection is written: for work the client need not wait for, such
// as the request's audit line (one fewer write and a log line's formatting
// between a command's end and its result). f must not write to the
// connection. A request that did not come from a Server (a test calling a
// Handler directly) runs f at once.
func (r *Request) AfterResponse(f func()) {
	if r.c == nil {
		f()
		return
	}
	r.after = append(r.after, f)
}

// runAfter runs what req's AfterResponse gave, in order, once; a panic
// in one is logged, not answered (the response is already out).
func (c *conn) runAfter(req *Request) {
	after := req.after
	req.after = nil
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("after-response work panicked", "op", req.Op, "id", req.ID, "panic", r)
		}
	}()
	for _, f := range after {
		f()
	}
}

// release gives back what req held of the server's budgets: its charge
// and its handler's reservations. The response has been written (or never
// will be) by then.
func (c *conn) release(req *Request) {
	c.s.requests.Release(req.charge)
	req.charge = 0
	c.releaseResponse(req.reserved)
	req.reserved = 0
}

// write writes frame to the connection within the write timeout
// (writeWithin), releasing an inline request's connection (beforeWait)
// before it waits. The caller holds writeMu.
func (c *conn) write(frame []byte, beforeWait func()) error {
	return writeWithin(c.nc, c.raw, frame, time.Now().Add(c.s.cfg.WriteTimeout), beforeWait)
}

// releaseConn releases the connection of r, if r runs inline until
// released (internal/handoff); a nil r does nothing.
func (r *Request) releaseConn() {
	if r != nil {
		r.handoff.Release()
	}
}

// ReserveResponse takes n bytes of the connection's and the server's
// response budgets for this request's response, before the handler makes
// what it will answer with (a file's contents, a command's output), so
// that what the daemon holds for responses not yet written stays within
// the configured bounds. It waits while they are taken (at most the
// server's write timeout), then fails with busy. The bytes are given back
// once the response is written. Every response may hold
// SmallResponseBytes without reserving; a handler whose result may be
// larger reserves a bound on it (its data, and as much again for its
// encoding). A sender of several frames for one request (streamed
// output) reserves for each before making it. A request that did not come
// from a Server (a test calling a Handler directly) reserves nothing.
func (r *Request) ReserveResponse(ctx context.Context, n int64) error {
	c := r.c
	if c == nil || n <= 0 {
		return nil
	}
	if n > c.responses.Limit() {
		return Errorf(CodeInternal, "a response of up to %d bytes cannot fit the %d bytes a connection may hold for responses; the operator should raise server.max_response_bytes_per_connection", n, c.responses.Limit())
	}
	if err := c.acquireResponse(ctx, n, r.releaseConn); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return Errorf(CodeBusy, "the daemon is holding as many bytes as it may for responses not yet written (this connection's or all of them); retry later, and read your responses").
			With("max_response_bytes_per_connection", c.responses.Limit()).With("max_response_bytes", c.s.responses.Limit())
	}
	r.reserved += n
	return nil
}

// acquireResponse takes n bytes of the connection's response budget, then
// of the server's, waiting at most the write timeout (beforeWait runs first
// when it has to wait).
func (c *conn) acquireResponse(ctx context.Context, n int64, beforeWait func()) error {
	if c.responses.TryAcquire(n) {
		if c.s.responses.TryAcquire(n) {
			return nil
		}
		c.responses.Release(n)
	}
	beforeWait()
	ctx, cancel := context.WithTimeout(ctx, c.s.cfg.WriteTimeout)
	defer cancel()
	if err := c.responses.Acquire(ctx, n); err != nil {
		return err
	}
	if err := c.s.responses.Acquire(ctx, n); err != nil {
		c.responses.Release(n)
		return err
	}
	return nil
}

func (c *conn) releaseResponse(n int64) {
	if n > 0 {
		c.s.responses.Release(n)
		c.responses.Release(n)
	}
}

// sendQuick writes one connection-level error frame with a short deadline;
// the connection is closed after it.
func (c *conn) sendQuick(e *Error) {
	if frame, err := encodeResponseFrame(0, nil, e); err == nil {
		c.writeMu.Lock()
		c.nc.SetWriteDeadline(time.Now().Add(time.Second))
		c.nc.Write(frame)
		c.writeMu.Unlock()
	}
}

// send writes one response; a response too large for a frame becomes an
// internal error (the handler should have bounded it). req (nil for a
// connection-level error) has paid for SmallResponseBytes and whatever its
// handler reserved; a response larger than that takes the rest of the
// response budgets first, and if it cannot within the write timeout the
// connection is closed.
func (c *conn) send(req *Request, id uint64, result any, e *Error) {
	if c.broken.Load() {
		return
	}
	frame, err := encodeResponseFrame(id, result, e)
	if err == nil && len(frame)-headerSize > c.s.cfg.MaxFrame {
		c.log.Error("response larger than a frame", "id", id, "bytes", len(frame)-headerSize)
		frame, err = encodeResponseFrame(id, nil, Errorf(CodeInternal, "the response would exceed the %d-byte frame limit; ask for less output", c.s.cfg.MaxFrame))
	}
	if err != nil {
		c.log.Error("encoding response failed", "id", id, "error", err)
		return
	}
	covered := int64(SmallResponseBytes)
	if req != nil {
		covered += req.reserved
	}
	if extra := int64(len(frame)) - covered; extra > 0 {
		ctx := c.ctx
		if ctx == nil {
			ctx = c.s.base
		}
		if err := c.acquireResponse(ctx, extra, req.releaseConn); err != nil {
			if ctx.Err() == nil {
				c.log.Warn("closing connection: a response waited too long for room in the response budget (is the client reading its responses?)",
					"id", id, "bytes", len(frame), "connection_held", c.responses.InUse(), "connection_budget", c.responses.Limit(),
					"server_held", c.s.responses.InUse(), "server_budget", c.s.responses.Limit())
			}
			c.broken.Store(true)
			c.nc.Close()
			return
		}
		defer c.releaseResponse(extra)
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	// What waited for the response runs once it is out, before any later
	// response of the connection: a client that sends its next request
	// after reading this response finds this one's audit line first.
	if req != nil {
		defer c.runAfter(req)
	}
	// A slow reader: the connection's next request is read meanwhile.
	if err := c.write(frame, req.releaseConn); err != nil {
		c.broken.Store(true)
		c.log.Debug("write failed; closing connection", "error", err)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			c.log.Warn("closing connection: a response could not be written within the write timeout (is the client reading its responses?)",
				"id", id, "bytes", len(frame), "write_timeout", c.s.cfg.WriteTimeout)
		}
		c.nc.Close()
	}
}
