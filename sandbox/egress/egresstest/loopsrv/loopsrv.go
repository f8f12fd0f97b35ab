// Package loopsrv is the loopback servers the egress tests' sandboxes
// reach, the guest programs that reach them, and the checks that are the
// same on every egress path (ThousandConnections, Rebinding). It imports
// nothing of the egress path, so sandbox/egress's own tests use it as the
// backends' tests do (through egresstest). Every server listens on
// 127.0.0.1 only.
package loopsrv

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// Servers listen on 127.0.0.1 until the test ends: HTTP answers "hello
// HOST", HTTPS "secure HOST SNI", Raw echoes its first line as "echo
// LINE", and UDP counts the datagrams it gets.
type Servers struct {
	HTTPPort, TLSPort, RawPort, UDPPort string
	udp                                 atomic.Int64
}

// Start starts the servers.
func Start(t testing.TB) *Servers {
	t.Helper()
	s := &Servers{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello %s", r.Host) }))
	t.Cleanup(hs.Close)
	_, s.HTTPPort, _ = net.SplitHostPort(hs.Listener.Addr().String())
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "secure %s %s", r.Host, r.TLS.ServerName)
	}))
	t.Cleanup(ts.Close)
	_, s.TLSPort, _ = net.SplitHostPort(ts.Listener.Addr().String())
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	_, s.RawPort, _ = net.SplitHostPort(raw.Addr().String())
	go func() {
		for {
			c, err := raw.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				line, _ := bufio.NewReader(c).ReadString('\n')
				fmt.Fprintf(c, "echo %s", line)
			}()
		}
	}()
	u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	_, s.UDPPort, _ = net.SplitHostPort(u.LocalAddr().String())
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := u.ReadFrom(buf); err != nil {
				return
			}
			s.udp.Add(1)
		}
	}()
	return s
}

// UDPReceived is how many datagrams the UDP server got.
func (s *Servers) UDPReceived() int64 { return s.udp.Load() }

// PyRaw is a guest program: it resolves argv[1], connects a plain TCP
// socket to it at port argv[2], sends a line and prints the answer (the
// raw server's "echo ping raw"); GAIERROR and exit 4 when the name does not
// resolve.
const PyRaw = `
import socket, sys
try:
    addr = socket.getaddrinfo(sys.argv[1], int(sys.argv[2]), socket.AF_INET, socket.SOCK_STREAM)[0][4]
except socket.gaierror as e:
    print("GAIERROR", e.errno); sys.exit(4)
s = socket.create_connection(addr, timeout=20)
s.sendall(b"ping raw\n")
data = b""
while True:
    b = s.recv(4096)
    if not b: break
    data += b
print(data.decode(), end="")
`
