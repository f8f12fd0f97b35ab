package ipc

import (
	"context"
	"testing"
)

// BenchmarkRoundTrip measures one request/response over a real Unix
// socket with a trivial handler: the floor under every op.
func BenchmarkRoundTrip(b *testing.B) {
	s := NewServer(ServerConfig{Handler: &testHandler{}})
	dir := b.TempDir()
	l, err := Listen(ListenConfig{Path: dir + "/s/s.sock", Mode: 0o600, GID: -1})
	if err != nil {
		b.Fatal(err)
	}
	go s.Serve(l)
	defer s.Shutdown(context.Background())
	c, err := Dial(context.Background(), dir+"/s/s.sock")
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := c.Call(ctx, "echo", nil, nil); err != nil {
			b.Fatal(err)
		}
	}
}
