package egress

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"
)

// peekRest bounds the wait for the rest of a ClientHello or request head
// once its first byte came; a variable for tests.
var peekRest = 5 * time.Second

// errPeekBound is a client's first maxPeek bytes naming nothing yet.
var errPeekBound = fmt.Errorf("no name asked for in the first %d bytes (a TLS ClientHello or an HTTP request head longer than that)", maxPeek)

// peekName reads the first bytes a client sends to find the name it asks
// for: the SNI of a TLS ClientHello or the Host of an HTTP/1 request. A
// client that sends nothing within wait, or something else, speaks another
// protocol: name is "" and err nil. A TLS ClientHello without SNI or an
// HTTP request without Host is an error: it names nothing to check.
func peekName(c net.Conn, wait time.Duration) (first []byte, name string, err error) {
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, 0, 4096)
	c.SetReadDeadline(time.Now().Add(wait))
	read := func() error {
		if len(buf) == cap(buf) {
			if cap(buf) >= maxPeek {
				return errPeekBound
			}
			// Grown by hand: append's growth rounds up to its size
			// classes, and let the peek read 20 KiB, not maxPeek.
			grown := make([]byte, len(buf), min(2*cap(buf), maxPeek))
			copy(grown, buf)
			buf = grown
		}
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		return err
	}
	if err := read(); err != nil {
		if isTimeout(err) && len(buf) == 0 {
			return nil, "", nil // the server speaks first
		}
		if len(buf) == 0 {
			return nil, "", errors.New("closed before sending anything")
		}
	}
	c.SetReadDeadline(time.Now().Add(peekRest))
	switch {
	case buf[0] == 0x16: // TLS handshake record
		for len(buf) < 5 || len(buf) < 5+int(buf[3])<<8|int(buf[4]) {
			if len(buf) >= 5 && 5+(int(buf[3])<<8|int(buf[4])) > maxPeek {
				return nil, "", fmt.Errorf("a TLS ClientHello of more than %d bytes", maxPeek)
			}
			if err := read(); err != nil {
				return nil, "", incomplete("TLS ClientHello", err)
			}
		}
		sni := serverName(buf)
		if sni == "" {
			return nil, "", errors.New("TLS without a server name (SNI) to an address allowed by name")
		}
		return buf, normName(sni), nil
	case looksHTTP(buf):
		for !bytes.Contains(buf, []byte("\r\n\r\n")) {
			if err := read(); err != nil {
				return nil, "", incomplete("HTTP request head", err)
			}
		}
		host := httpHost(buf)
		if host == "" {
			return nil, "", errors.New("HTTP request without a Host header to an address allowed by name")
		}
		return buf, host, nil
	}
	return buf, "", nil
}

// incomplete is the error of a ClientHello or request head that stopped
// before its end: err is why the read stopped (the bound, a timeout, the
// client's close).
func incomplete(what string, err error) error {
	switch {
	case isTimeout(err):
		return fmt.Errorf("incomplete %s: the rest did not come within %v", what, peekRest)
	case errors.Is(err, io.EOF):
		return fmt.Errorf("incomplete %s: the client closed the connection", what)
	case errors.Is(err, errPeekBound):
		return err
	}
	return fmt.Errorf("incomplete %s: %v", what, err)
}

// isTimeout reports a read deadline passing (the netstack's conns have
// their own error for it).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

var httpMethods = []string{"GET ", "POST ", "PUT ", "HEAD ", "DELETE ", "OPTIONS ", "PATCH ", "CONNECT ", "TRACE "}

func looksHTTP(b []byte) bool {
	for _, m := range httpMethods {
		n := min(len(b), len(m))
		if string(b[:n]) == m[:n] {
			return true
		}
	}
	return false
}

func httpHost(head []byte) string {
	end := bytes.Index(head, []byte("\r\n\r\n"))
	lines := strings.Split(string(head[:end]), "\r\n")
	for _, l := range lines[1:] {
		k, v, ok := strings.Cut(l, ":")
		if ok && strings.EqualFold(strings.TrimSpace(k), "host") {
			h := strings.TrimSpace(v)
			if hh, _, err := net.SplitHostPort(h); err == nil {
				h = hh
			}
			return normName(strings.Trim(h, "[]"))
		}
	}
	return ""
}

// serverName parses a ClientHello with crypto/tls itself: the handshake is
// stopped as soon as the hello is read, and nothing is written back.
func serverName(hello []byte) string {
	var name string
	stop := errors.New("stop")
	conn := tls.Server(&helloConn{r: bytes.NewReader(hello)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			name = h.ServerName
			return nil, stop
		},
	})
	_ = conn.Handshake()
	return name
}

// helloConn reads a recorded ClientHello and swallows writes.
type helloConn struct {
	r io.Reader
	net.Conn
}

func (c *helloConn) Read(b []byte) (int, error)       { return c.r.Read(b) }
func (c *helloConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c *helloConn) Close() error                     { return nil }
func (c *helloConn) SetDeadline(time.Time) error      { return nil }
func (c *helloConn) SetReadDeadline(time.Time) error  { return nil }
func (c *helloConn) SetWriteDeadline(time.Time) error { return nil }
func (c *helloConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *helloConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
