package ipc

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// FuzzClientResponses plays a daemon that answers the client's first
// request with arbitrary bytes: the response decoder the CLI and other Go
// clients use. Whatever arrives, Call must return (a result, a daemon
// error or a broken connection) without panicking and without waiting past
// its context.
func FuzzClientResponses(f *testing.F) {
	frame := func(v any) []byte {
		b, _ := msgpack.Marshal(v)
		return AppendFrame(nil, b)
	}
	f.Add(frame(map[string]any{"v": 1, "id": 1, "ok": true, "result": map[string]any{"status": "ok"}}))
	f.Add(frame(map[string]any{"v": 1, "id": 1, "ok": false, "error": map[string]any{"code": "not_found", "message": "gone", "limit": 3}}))
	f.Add(frame(map[string]any{"v": 1, "id": 0, "ok": false, "error": map[string]any{"code": "busy"}}))
	f.Add(append(frame(map[string]any{"v": 1, "id": 1, "event": "stdout", "data": []byte("x")}), frame(map[string]any{"v": 1, "id": 1, "ok": true, "result": map[string]any{}})...))
	f.Add(frame(map[string]any{"v": 1, "id": 1, "ok": true, "result": []any{1, 2}}))
	f.Add(frame(map[string]any{"v": 1, "id": 1, "ok": false, "error": "not a map"}))
	f.Add(frame(map[string]any{"v": 1, "id": 99, "ok": true}))
	f.Add([]byte{0, 0, 0, 3, 0x81, 0xa1})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		server, conn := net.Pipe()
		c := newClient(conn, 1<<16)
		go func() {
			// Read the request, answer with the fuzzed bytes, then hang up.
			server.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := ReadFrame(server, 1<<16); err == nil {
				server.Write(data)
			}
			server.Close()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		var out map[string]any
		err := c.Call(ctx, OpHealth, nil, &out)
		if err == context.DeadlineExceeded {
			t.Fatalf("Call waited for its whole context on a closed connection")
		}
		if e, ok := err.(*Error); ok && (e.Code == "" || e.Message == "") {
			t.Fatalf("daemon error without code or message: %#v", e)
		}
		c.Close()
	})
}
