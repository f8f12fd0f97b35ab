package service

import (
	"context"
	"testing"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// BenchmarkHealthHandle measures the health op inside the daemon, without
// the socket: what it adds to the ipc round trip.
func BenchmarkHealthHandle(b *testing.B) {
	m, err := lifecycle.New(lifecycle.Config{Backend: newTestBackend(b), IdleTimeout: -1})
	if err != nil {
		b.Fatal(err)
	}
	s := New(Config{Manager: m, Version: "bench"})
	peer := &ipc.Peer{UID: 0}
	req := &ipc.Request{V: 1, ID: 1, Op: ipc.OpHealth, Args: ipc.NewArgs(nil)}
	b.ReportAllocs()
	for b.Loop() {
		res, err := s.Handle(context.Background(), peer, req)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ipc.EncodeResponse(1, res, nil); err != nil {
			b.Fatal(err)
		}
	}
}
