package ipc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// writeFailureGrace bounds how long a failed write waits for the reason
// the daemon gave when it closed the connection.
const writeFailureGrace = time.Second

// Client is a connection to the daemon. It is safe for concurrent use:
// calls are pipelined on one connection and matched to responses by id.
//
// Who reads the connection: a call made while no other is in flight reads
// its own response on its own goroutine (the fast path: no hand-off between
// goroutines, which cost a single caller more than the daemon's whole
// answer). Frames of other calls it meets on the way are handed to them. If
// calls are still waiting when it has its answer (or gives up on it), a
// reader goroutine takes over and runs until none is left. Exactly one
// goroutine owns the reader role at a time (reading, under mu); whenever a
// call is pending, one does.
type Client struct {
	nc       net.Conn
	maxFrame int

	writeMu sync.Mutex
	raw     syscall.RawConn // nc's descriptor, for writeNow; nil: none

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan response
	// listeners get the events of calls made with CallStream.
	listeners map[uint64]func(event string, data []byte)
	err       error // set once the connection is dead
	done      chan struct{}
	// reading: some goroutine owns the reader role (fr and the read
	// deadline). readGen changes at every hand-off of the role, so a
	// cancelled call's late wake-up (cancelRead) cannot touch the read
	// deadline of a later owner.
	reading bool
	readGen uint64

	fr frameReader // the reader role's alone
}

// newClient wraps a connection; nothing reads it until the first call.
func newClient(nc net.Conn, maxFrame int) *Client {
	c := &Client{nc: nc, maxFrame: maxFrame, pending: map[uint64]chan response{}, done: make(chan struct{}),
		fr: frameReader{br: bufio.NewReaderSize(nc, readBufferSize), max: maxFrame}}
	if sc, ok := nc.(syscall.Conn); ok {
		c.raw, _ = sc.SyscallConn()
	}
	return c
}

type response struct {
	ok     bool
	result msgpack.RawMessage
	err    *Error
}

// DialOptions say what a client checks before it sends anything.
type DialOptions struct {
	// TrustedUIDs, when not empty, are the uids the daemon may run as
	// (root, the packaged daemon's user, the caller's own for a daemon of
	// its own). The socket's directory must belong to one of them and be
	// writable by nobody else, and the server's credentials (SO_PEERCRED:
	// whoever listened on the socket; root for a socket systemd made) must
	// be one of them; otherwise Dial fails with an *UntrustedSocketError
	// and sends nothing. A socket in a directory anyone may create (the
	// per-user fallback under $TMPDIR) could be another user's, who would
	// receive the caller's commands and forge their results.
	TrustedUIDs []uint32
}

// UntrustedSocketError: the socket, its directory or its server belongs
// to someone the client does not trust.
type UntrustedSocketError struct {
	Path   string
	Reason string
}

func (e *UntrustedSocketError) Error() string {
	return fmt.Sprintf("refusing the daemon socket %s: %s; someone else may have put it there to receive your commands: remove it, or point SANDBOX_SIDECAR_SOCKET elsewhere, unless you know whose it is", e.Path, e.Reason)
}

// Dial connects to the daemon's socket.
func Dial(ctx context.Context, path string) (*Client, error) {
	return DialWith(ctx, path, DialOptions{})
}

// DialWith connects to the daemon's socket after the checks opts ask for.
func DialWith(ctx context.Context, path string, opts DialOptions) (*Client, error) {
	if len(opts.TrustedUIDs) > 0 {
		if err := checkSocketDir(path, opts.TrustedUIDs); err != nil {
			return nil, err
		}
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	switch {
	case errors.Is(err, syscall.EACCES):
		return nil, fmt.Errorf("connecting to %s: %w: the socket is for members of its group; ask an operator to add this user to it (usually sandbox-sidecar) and log in again", path, err)
	case err != nil:
		return nil, fmt.Errorf("connecting to %s: %w (is the daemon running? `sandbox-sidecar serve` starts it)", path, err)
	}
	if len(opts.TrustedUIDs) > 0 {
		// The check that counts: the kernel says who listens.
		server, err := PeerOf(nc.(*net.UnixConn))
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("connecting to %s: %w", path, err)
		}
		if !slices.Contains(opts.TrustedUIDs, server.UID) {
			nc.Close()
			return nil, &UntrustedSocketError{Path: path, Reason: fmt.Sprintf("its server runs as uid %d, which is none of %s", server.UID, uidList(opts.TrustedUIDs))}
		}
	}
	return newClient(nc, DefaultMaxFrame), nil
}

// checkSocketDir refuses a socket whose directory belongs to someone not
// trusted, or that others may write to (and so put a socket in). It gives
// clear errors; the server's credentials, checked after connecting, are
// what makes the check sound against a directory swapped in between.
func checkSocketDir(path string, trusted []uint32) error {
	dir := filepath.Dir(path)
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil // connecting fails with the clearer error
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !ok:
		return nil
	case fi.Mode()&fs.ModeSymlink != 0:
		return &UntrustedSocketError{Path: path, Reason: fmt.Sprintf("its directory %s is a symlink", dir)}
	case !slices.Contains(trusted, st.Uid):
		return &UntrustedSocketError{Path: path, Reason: fmt.Sprintf("its directory %s belongs to uid %d, which is none of %s", dir, st.Uid, uidList(trusted))}
	case fi.Mode().Perm()&0o022 != 0:
		return &UntrustedSocketError{Path: path, Reason: fmt.Sprintf("its directory %s may be written by others (mode %04o)", dir, fi.Mode().Perm())}
	}
	return nil
}

func uidList(uids []uint32) string {
	s := make([]string, len(uids))
	for i, u := range uids {
		s[i] = strconv.FormatUint(uint64(u), 10)
	}
	return "the trusted uids (" + strings.Join(s, ", ") + ")"
}

// Close closes the connection; pending calls fail.
func (c *Client) Close() error {
	c.fail(net.ErrClosed)
	return c.nc.Close()
}

// Done is closed once the client has seen the connection die: a read or
// write on it failed, the daemon refused it, or Close. Nothing reads an
// idle connection, so a daemon that hangs up on one is noticed by the next
// call (which then fails with the daemon's reason, if it gave one).
func (c *Client) Done() <-chan struct{} { return c.done }

func (c *Client) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	for id, ch := range c.pending {
		delete(c.pending, id)
		close(ch)
	}
	close(c.done)
}

// wireResponse mirrors Response for decoding; result stays raw so Call can
// decode it into the caller's type.
type wireResponse struct {
	V      uint64             `msgpack:"v"`
	ID     uint64             `msgpack:"id"`
	OK     bool               `msgpack:"ok"`
	Result msgpack.RawMessage `msgpack:"result"`
	Error  map[string]any     `msgpack:"error"`
	Event  string             `msgpack:"event"`
	Data   []byte             `msgpack:"data"`
}

// readLoop is the reader goroutine: it owns the reader role (handed to it
// with reading set) and reads until no call is pending, the connection dies,
// or the daemon refuses it.
func (c *Client) readLoop() {
	for {
		body, err := c.fr.next()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// A deadline a cancelled inline reader set before it handed
				// the role over; nobody else sets one for this goroutine.
				c.nc.SetReadDeadline(time.Time{})
				continue
			}
			c.readFailed(err)
			return
		}
		if !c.dispatch(body) {
			return
		}
		c.mu.Lock()
		if len(c.pending) == 0 {
			c.reading = false
			c.readGen++
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
	}
}

// readFailed ends the connection after a read error.
func (c *Client) readFailed(err error) {
	c.fail(fmt.Errorf("connection to the daemon lost: %w", err))
	c.nc.Close()
}

// dispatch hands one frame to its call (a response) or its listener (an
// event). It returns false when the frame ended the connection: malformed,
// or a connection-level error.
func (c *Client) dispatch(body []byte) bool {
	if err := checkShape(body, 0); err != nil {
		c.fail(fmt.Errorf("malformed frame from the daemon: %w", err))
		c.nc.Close()
		return false
	}
	var w wireResponse
	if err := decodeWire(body, &w); err != nil {
		c.fail(fmt.Errorf("malformed response from the daemon: %w", err))
		c.nc.Close()
		return false
	}
	if w.Event != "" {
		// An event of a CallStream call; any other is ignored, as the
		// protocol asks of clients that did not ask for events.
		c.mu.Lock()
		fn := c.listeners[w.ID]
		c.mu.Unlock()
		if fn != nil {
			fn(w.Event, w.Data)
		}
		return true
	}
	resp := response{ok: w.OK, result: w.Result}
	if !w.OK {
		resp.err = errorFromWire(w.Error)
	}
	if w.ID == 0 && !w.OK {
		// A connection-level error (unauthorized, frame_too_large, ...):
		// every pending call fails with it.
		c.fail(resp.err)
		c.nc.Close()
		return false
	}
	c.mu.Lock()
	ch, ok := c.pending[w.ID]
	delete(c.pending, w.ID)
	c.mu.Unlock()
	if ok {
		ch <- resp // buffered: never blocks
	}
	return true
}

// readInline is the fast path: the caller owns the reader role and reads
// until its own response (id) arrives on ch, handing other calls' frames to
// them. ctx ending makes it give up (the read deadline is set to wake it)
// with ctx's error. Either way the role is handed over before it returns.
func (c *Client) readInline(ctx context.Context, id uint64, ch chan response) (resp response, ok bool, err error) {
	var stop func() bool
	if ctx.Done() != nil {
		c.mu.Lock()
		gen := c.readGen
		c.mu.Unlock()
		stop = context.AfterFunc(ctx, func() { c.cancelRead(gen) })
	}
	defer c.handOffReader(stop)
	for {
		body, rerr := c.fr.next()
		if rerr == nil {
			if !c.dispatch(body) {
				resp, ok = <-ch // closed by fail, unless the answer came first
				return resp, ok, nil
			}
			select {
			case resp, ok = <-ch:
				return resp, ok, nil
			default:
				continue
			}
		}
		if errors.Is(rerr, os.ErrDeadlineExceeded) {
			if ctx.Err() != nil {
				c.forget(id)
				return response{}, false, ctx.Err()
			}
			c.nc.SetReadDeadline(time.Time{}) // a stale one; read on
			continue
		}
		c.readFailed(rerr)
		resp, ok = <-ch
		return resp, ok, nil
	}
}

// cancelRead wakes the inline reader of generation gen, if it still owns
// the role, by putting its read deadline in the past. A partly read frame
// is kept (frameReader), so the next owner goes on where it stopped.
func (c *Client) cancelRead(gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reading && c.readGen == gen {
		c.nc.SetReadDeadline(time.Unix(1, 0))
	}
}

// handOffReader ends an inline reader's hold on the role: a deadline its
// cancellation may have set is cleared first (while the role is still its
// own, so a later owner's is never touched), then the role goes to a reader
// goroutine if calls are still waiting, or to nobody.
func (c *Client) handOffReader(stop func() bool) {
	c.mu.Lock()
	c.readGen++ // from here cancelRead of this reader does nothing
	c.mu.Unlock()
	if stop != nil && !stop() {
		c.nc.SetReadDeadline(time.Time{})
	}
	c.mu.Lock()
	more := len(c.pending) > 0 && c.err == nil
	c.reading = more
	c.mu.Unlock()
	if more {
		go c.readLoop()
	}
}

func errorFromWire(m map[string]any) *Error {
	e := &Error{Code: CodeInternal, Message: "malformed error response"}
	if m == nil {
		return e
	}
	if s, ok := m["code"].(string); ok {
		e.Code = s
	}
	if s, ok := m["message"].(string); ok {
		e.Message = s
	}
	for k, v := range m {
		if k != "code" && k != "message" {
			if e.Details == nil {
				e.Details = map[string]any{}
			}
			e.Details[k] = v
		}
	}
	return e
}

// Call sends op with args (a map, or one of ipc/api's request types) and
// decodes the result into out (a pointer, or nil to discard it). A daemon
// error is returned as *Error. ctx bounds the wait; when it ends the call
// is abandoned (the daemon may still finish it). The typed methods
// (RunCommand, ...) are Call with ipc/api's types.
func (c *Client) Call(ctx context.Context, op string, args any, out any) error {
	return c.CallStream(ctx, op, args, out, nil)
}

// CallStream is Call that also hands every event frame of the call
// (run_command's "stdout"/"stderr" with "stream": true) to onEvent, in
// order, before it returns. onEvent runs on whichever goroutine reads the
// connection (the call's own when no other is in flight) and must be quick:
// while it runs no other response is read.
func (c *Client) CallStream(ctx context.Context, op string, args any, out any, onEvent func(event string, data []byte)) error {
	if m, isMap := args.(map[string]any); args == nil || (isMap && m == nil) {
		args = map[string]any{}
	}
	ch := make(chan response, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = ch
	// Alone on the connection: this call reads its own answer.
	inline := !c.reading
	c.reading = true
	if onEvent != nil {
		if c.listeners == nil {
			c.listeners = map[uint64]func(string, []byte){}
		}
		c.listeners[id] = onEvent
		defer func() {
			c.mu.Lock()
			delete(c.listeners, id)
			c.mu.Unlock()
		}()
	}
	c.mu.Unlock()

	body, err := marshal(map[string]any{"v": ProtocolVersion, "id": id, "op": op, "args": args})
	if err != nil {
		c.forget(id)
		if inline {
			c.handOffReader(nil)
		}
		return fmt.Errorf("encoding %s request: %w", op, err)
	}
	c.writeMu.Lock()
	err = c.writeFrame(ctx, body)
	c.writeMu.Unlock()
	if err != nil {
		c.forget(id)
		if inline {
			// A reader is needed to get the reason below.
			c.mu.Lock()
			c.readGen++
			c.mu.Unlock()
			go c.readLoop()
		}
		// The daemon may have refused the connection with a reason
		// (unauthorized, busy) and closed it before this write: that frame
		// is still waiting to be read, and it is the real answer. Give the
		// reader a moment to get it before giving the write error.
		select {
		case <-c.done:
		case <-time.After(writeFailureGrace):
		}
		c.fail(fmt.Errorf("connection to the daemon lost: %w", err))
		c.mu.Lock()
		reason := c.err
		c.mu.Unlock()
		return reason
	}

	var resp response
	var ok bool
	if inline {
		if resp, ok, err = c.readInline(ctx, id, ch); err != nil {
			return err
		}
	} else {
		select {
		case resp, ok = <-ch:
		case <-ctx.Done():
			c.forget(id)
			return ctx.Err()
		}
	}
	if !ok {
		c.mu.Lock()
		err := c.err
		c.mu.Unlock()
		return err
	}
	if resp.err != nil {
		return resp.err
	}
	if out == nil || len(resp.result) == 0 {
		return nil
	}
	dec := msgpack.NewDecoder(bytes.NewReader(resp.result))
	dec.SetCustomStructTag("msgpack")
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("decoding %s result: %w", op, err)
	}
	return nil
}

// writeFrame writes body as one frame, bounded by ctx's deadline: a frame
// the socket has room for goes out at once with no deadline armed
// (writeWithin). The caller holds writeMu.
func (c *Client) writeFrame(ctx context.Context, body []byte) error {
	frame, err := newFrame(body, c.maxFrame)
	if err != nil {
		return err
	}
	dl, _ := ctx.Deadline() // none: the zero time, no deadline
	return writeWithin(c.nc, c.raw, frame, dl, nil)
}

func (c *Client) forget(id uint64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// IsCode reports whether err is a daemon error with the given code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}
