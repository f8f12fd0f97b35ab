package egress

import (
	"io"
	"net"
	"testing"
)

// BenchmarkThroughput compares one connection's download through the egress
// path (a sandbox namespace, its TUN device, the netstack, the daemon's
// dial) with the same download over the host's loopback directly. Run:
//
//	go test -run '^$' -bench Throughput -benchtime 2x ./sandbox/egress
func BenchmarkThroughput(b *testing.B) {
	const size = 1 << 30
	srv, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	go func() {
		buf := make([]byte, 256<<10)
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for sent := 0; sent < size; sent += len(buf) {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	_, port, _ := net.SplitHostPort(srv.Addr().String())
	download := func(b *testing.B, dial func() (net.Conn, error)) {
		b.SetBytes(size)
		buf := make([]byte, 256<<10)
		for b.Loop() {
			c, err := dial()
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.CopyBuffer(io.Discard, c, buf)
			c.Close()
			if err != nil || n != size {
				b.Fatalf("%d bytes: %v", n, err)
			}
		}
	}
	b.Run("loopback", func(b *testing.B) {
		download(b, func() (net.Conn, error) { return net.Dial("tcp", "127.0.0.1:"+port) })
	})
	b.Run("egress", func(b *testing.B) {
		if err := rootOK(); err != "" {
			b.Skip(err)
		}
		e, err := New(Config{PrivateAllowed: loopbackOnly})
		if err != nil {
			b.Fatal(err)
		}
		p, _ := ParsePolicy(nil, []string{"127.0.0.1/32"})
		ns, err := NewNetns()
		if err != nil {
			b.Fatal(err)
		}
		defer ns.NS.Close()
		s, err := e.Serve(ns.TUN, "bench", "", p)
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		download(b, func() (c net.Conn, err error) {
			derr := ns.Do(func() error {
				c, err = net.Dial("tcp", "100.127.0.1:"+port)
				return nil
			})
			if derr != nil {
				return nil, derr
			}
			return c, err
		})
	})
}
