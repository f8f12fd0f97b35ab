package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"
)

// Timeouts of the metrics listener: a scrape is one small GET.
const (
	readHeaderTimeout = 5 * time.Second
	writeTimeout      = 15 * time.Second
	idleTimeout       = 60 * time.Second
	maxHeaderBytes    = 16 << 10
)

// CheckAddr validates metrics.listen: a host and a port, the host written
// out. An empty host (":9464", all interfaces) is refused, so that a
// metrics port never faces the network unless the operator wrote which
// address it faces.
func CheckAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port (write e.g. \"127.0.0.1:9464\")", addr)
	}
	if host == "" {
		return fmt.Errorf("%q listens on every interface: write the address, e.g. \"127.0.0.1:%s\" (or \"0.0.0.0:%s\" if you mean every interface)", addr, port, port)
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("%q: bad port %q", addr, port)
	}
	if _, err := netip.ParseAddr(host); err != nil && host != "localhost" {
		return fmt.Errorf("%q: give an IP address (127.0.0.1, ::1) or localhost, not a name", addr)
	}
	return nil
}

// IsLoopback reports whether addr's host is a loopback address.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// Server serves /metrics on a listener of its own.
type Server struct {
	srv  *http.Server
	lst  net.Listener
	done chan error
}

// Serve starts serving m on l: /metrics only (anything else is 404).
func (m *Metrics) Serve(l net.Listener) *Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	s := &Server{
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: readHeaderTimeout, WriteTimeout: writeTimeout,
			IdleTimeout: idleTimeout, MaxHeaderBytes: maxHeaderBytes},
		lst:  l,
		done: make(chan error, 1),
	}
	go func() {
		err := s.srv.Serve(l)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.done <- err
	}()
	return s
}

// Addr is where the server listens.
func (s *Server) Addr() net.Addr { return s.lst.Addr() }

// Close stops the server, letting a scrape in progress finish within ctx.
func (s *Server) Close(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		s.srv.Close()
	}
	<-s.done
	return err
}
