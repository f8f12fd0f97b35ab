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
	"time"

	"github.com/hashicorp/go-hclog"
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

// ConnObserver is optionally implemented by a Handler that needs to know
// when a connection ends (after its last request has finished).
type ConnObserver interface {
	Disconnected(peer *Peer)
}

// readBufferSize is each connection's read buffer.
const readBufferSize = 4 << 10

// Defaults for ServerConfig's zero values.
const (
	DefaultMaxConns         = 4096
	DefaultMaxInFlight      = 64
	DefaultFrameReadTimeout = 30 * time.Second
	DefaultWriteTimeout     = 30 * time.Second
)

// ServerConfig configures a Server. Zero values take the defaults above.
type ServerConfig struct {
	Handler Handler
	// Authorize decides whether a peer may talk to the server at all. A
	// non-nil error refuses the connection; its text is logged as the
	// reason and sent to the peer in an unauthorized error frame.
	Authorize func(*Peer) error
	Logger    hclog.Logger
	// MaxFrame bounds a frame body in either direction.
	MaxFrame int
	// MaxConns bounds open connections; the next one gets a busy error
	// frame and is closed.
	MaxConns int
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
	closing   bool

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
	}
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

	writeMu sync.Mutex
	broken  atomic.Bool // a write failed; stop using the connection
}

func (s *Server) startConn(nc *net.UnixConn) {
	id := s.nextConnID.Add(1)
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		nc.Close()
		return
	}
	if len(s.conns) >= s.cfg.MaxConns {
		s.mu.Unlock()
		s.log.Warn("connection refused: too many connections", "limit", s.cfg.MaxConns)
		refuse(nc, Errorf(CodeBusy, "the daemon already has %d connections open; retry later or raise max_connections", s.cfg.MaxConns), s.cfg)
		return
	}
	c := &conn{s: s, nc: nc}
	s.conns[c] = struct{}{}
	s.connWG.Add(1)
	s.mu.Unlock()

	go func() {
		defer s.connWG.Done()
		defer func() {
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			nc.Close()
		}()
		peer, err := PeerOf(nc)
		if err != nil {
			s.log.Error("connection refused: no peer credentials", "conn", id, "error", err)
			return
		}
		peer.ConnID = id
		c.peer = peer
		c.log = s.log.With("conn", id, "peer_uid", peer.UID, "peer_pid", peer.PID)
		if s.cfg.Authorize != nil {
			if err := s.cfg.Authorize(peer); err != nil {
				c.log.Warn("connection refused", "peer_gid", peer.GID, "reason", err.Error())
				refuse(nc, Errorf(CodeUnauthorized, "%v", err), s.cfg)
				return
			}
		}
		c.log.Debug("connection accepted", "peer_gid", peer.GID)
		c.serve()
	}()
}

// refuse writes one connection-level error frame (id 0) and closes.
func refuse(nc net.Conn, e *Error, cfg ServerConfig) {
	if body, err := EncodeResponse(0, nil, e); err == nil {
		nc.SetWriteDeadline(time.Now().Add(time.Second))
		WriteFrame(nc, body, cfg.MaxFrame)
	}
	nc.Close()
}

func (c *conn) serve() {
	s := c.s
	ctx, cancel := context.WithCancel(s.base)
	var reqs sync.WaitGroup
	sem := make(chan struct{}, s.cfg.MaxInFlight)
	defer func() {
		cancel()
		reqs.Wait()
		if obs, ok := s.cfg.Handler.(ConnObserver); ok {
			obs.Disconnected(c.peer)
		}
		c.log.Debug("connection closed")
	}()

	// One read syscall usually brings a whole small frame (length and
	// body); 4 KiB per connection keeps idle connections cheap.
	br := bufio.NewReaderSize(c.nc, readBufferSize)
	for {
		n, err := ReadHeader(br, s.cfg.MaxFrame)
		switch {
		case errors.Is(err, ErrEmptyFrame):
			// The stream is still in step: answer and read on.
			c.send(0, nil, Errorf(CodeBadRequest, "zero-length frame; a frame holds one msgpack map"))
			continue
		case errors.Is(err, ErrFrameTooLarge):
			c.log.Warn("frame too large; closing connection", "announced", n, "limit", s.cfg.MaxFrame)
			c.send(0, nil, Errorf(CodeFrameTooLarge, "%v", err).With("max_frame_bytes", s.cfg.MaxFrame))
			return
		case err != nil:
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				c.log.Debug("read failed; closing connection", "error", err)
			}
			return
		}
		c.nc.SetReadDeadline(time.Now().Add(s.cfg.FrameReadTimeout))
		body, err := ReadBody(br, n)
		c.nc.SetReadDeadline(time.Time{})
		if err != nil {
			c.log.Warn("truncated frame; closing connection", "announced", n, "error", err)
			c.send(0, nil, Errorf(CodeBadRequest, "truncated frame: %d bytes announced, fewer arrived", n))
			return
		}
		req, derr := DecodeRequest(body)
		if derr != nil {
			c.log.Warn("request refused", "id", req.ID, "code", derr.Code, "reason", derr.Message)
			c.send(req.ID, nil, derr)
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
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
			c.send(req.ID, nil, Errorf(CodeShuttingDown, "the daemon is shutting down; retry against its successor"))
			continue
		}
		if in, ok := s.cfg.Handler.(Inliner); ok && in.Inline(req.Op) {
			c.handle(ctx, &req)
			<-sem
			s.inFlight.Done()
			continue
		}
		reqs.Add(1)
		go func(req Request) {
			defer func() { <-sem; reqs.Done(); s.inFlight.Done() }()
			c.handle(ctx, &req)
		}(req)
	}
}

func (c *conn) handle(ctx context.Context, req *Request) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("handler panicked", "op", req.Op, "id", req.ID, "panic", r)
			c.send(req.ID, nil, Errorf(CodeInternal, "internal error; the daemon's log has the details"))
		}
	}()
	result, err := c.s.cfg.Handler.Handle(ctx, c.peer, req)
	if err != nil {
		e := AsError(err)
		if e.Code == CodeInternal {
			c.log.Error("request failed", "op", req.Op, "id", req.ID, "error", err)
		}
		c.send(req.ID, nil, e)
		return
	}
	c.send(req.ID, result, nil)
}

// send writes one response; a response too large for a frame becomes an
// internal error (the handler should have bounded it).
func (c *conn) send(id uint64, result any, e *Error) {
	if c.broken.Load() {
		return
	}
	body, err := EncodeResponse(id, result, e)
	if err == nil && len(body) > c.s.cfg.MaxFrame {
		c.log.Error("response larger than a frame", "id", id, "bytes", len(body))
		body, err = EncodeResponse(id, nil, Errorf(CodeInternal, "the response would exceed the %d-byte frame limit; ask for less output", c.s.cfg.MaxFrame))
	}
	if err != nil {
		c.log.Error("encoding response failed", "id", id, "error", err)
		return
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
	if err := WriteFrame(c.nc, body, c.s.cfg.MaxFrame); err != nil {
		c.broken.Store(true)
		c.log.Debug("write failed; closing connection", "error", err)
		c.nc.Close()
	}
}
