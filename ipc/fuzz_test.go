package ipc

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// FuzzDecodeFrame feeds arbitrary bytes through the frame reader and the
// envelope decoder, as the server does. Whatever comes in, decoding must
// not panic, and an accepted request must survive re-encoding.
func FuzzDecodeFrame(f *testing.F) {
	seed := func(v any) []byte {
		b, _ := msgpack.Marshal(v)
		return AppendFrame(nil, b)
	}
	f.Add(seed(map[string]any{"v": 1, "id": 1, "op": "health"}))
	f.Add(seed(map[string]any{"v": 1, "id": 2, "op": "run_command", "args": map[string]any{"sandbox": "sc-1", "command": "echo hi", "timeout_s": 1.5, "stdin": []byte{0, 1}}}))
	f.Add(seed([]any{1, 2, 3}))
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 5, 0x91, 0x91, 0x91})
	f.Add(append([]byte{0, 0, 0, 8}, bytes.Repeat([]byte{0x91}, 8)...))
	f.Add([]byte("garbage bytes that are not a frame"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		for {
			body, err := ReadFrame(r, 1<<16)
			if err != nil {
				return
			}
			req, e := DecodeRequest(body)
			if e != nil {
				if e.Code == "" || e.Message == "" {
					t.Fatalf("error without code or message: %#v", e)
				}
				continue
			}
			again, err := msgpack.Marshal(map[string]any{"v": req.V, "id": req.ID, "op": req.Op, "args": req.Args.Map()})
			if err != nil {
				t.Fatalf("re-encoding an accepted request: %v", err)
			}
			// Re-encoding may shrink it (compact integers) below what
			// its items need: the item budget may then refuse it.
			if _, e := DecodeRequest(again); e != nil && e.Details["max_items"] == nil {
				t.Fatalf("re-encoded request refused: %v", e)
			}
		}
	})
}
