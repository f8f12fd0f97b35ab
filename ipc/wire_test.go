package ipc

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// wireBodies are response and event bodies as the daemon writes them, and
// as other encoders might: every integer width, nil where a value may be,
// keys this client does not know, a key given twice.
func wireBodies(t testing.TB) [][]byte {
	body := func(frame []byte, err error) []byte {
		require.NoError(t, err)
		return frame[headerSize:]
	}
	run := api.RunCommandResult{ExitCode: 3, Stdout: []byte("out"), Stderr: []byte{}, Reason: "exited", AppliedTimeoutS: 120, DurationS: 0.25}
	bodies := [][]byte{
		body(encodeResponseFrame(1, map[string]any{"status": "ok", "backends": []any{map[string]any{"name": "bwrap", "ok": true}}}, nil)),
		body(encodeResponseFrame(2, run, nil)),
		body(encodeResponseFrame(3, nil, nil)),
		body(encodeResponseFrame(1<<40, []any{1, "a"}, nil)),
		body(encodeResponseFrame(5, nil, Errorf(CodeNotFound, "no sandbox %s", "x").With("sandbox", "x"))),
		mp(t, Event{V: 1, ID: 6, Event: "stdout", Data: []byte("chunk")}),
		mp(t, Event{V: 1, ID: 7, Event: "stderr", Data: []byte{}}),
		mp(t, Event{V: 1, ID: 8, Event: "stderr"}),
	}
	for _, m := range []map[string]any{
		{"v": int8(1), "id": int16(300), "ok": true, "result": nil},
		{"v": uint8(1), "id": uint16(70), "ok": false, "result": "scalar"},
		{"v": int32(1), "id": uint32(1 << 20), "ok": true, "result": map[string]any{}},
		{"v": int64(1), "id": uint64(1) << 50, "ok": true, "later": []any{1, 2}, "result": 7},
		{"v": 1, "id": -4, "ok": true},
		{"v": 1.0, "id": 2, "ok": true},
		{"v": 1, "id": 2, "ok": nil, "event": nil, "data": nil},
		{"v": 1, "id": 2, "ok": 1},
		{"v": 1, "id": 2, "event": "stdout", "data": "a string, not bin"},
		{"v": 1, "id": 2, "event": 5},
		{"v": "1", "id": 2},
		{"v": 1, "id": 2, "ok": true, "error": nil},
		{"v": 1, "id": 2, "ok": false, "error": map[string]any{"code": "busy", "message": "m", "retry_after_s": 1.5}},
	} {
		bodies = append(bodies, mp(t, m))
	}
	// A key given twice (msgpack's encoder never writes one).
	bodies = append(bodies, []byte{0x83, 0xa2, 'i', 'd', 0x01, 0xa2, 'i', 'd', 0x02, 0xa1, 'v', 0x01})
	// A key that is not a str.
	bodies = append(bodies, []byte{0x82, 0xc4, 0x02, 'i', 'd', 0x01, 0xa1, 'v', 0x01})
	return bodies
}

// wireAgrees fails t unless decodeWire gives what msgpack's decoder does
// for body.
func wireAgrees(t testing.TB, body []byte) {
	if checkShape(body, 0) != nil {
		return // dispatch never decodes it
	}
	var got, want wireResponse
	gotErr, wantErr := decodeWire(body, &got), msgpack.Unmarshal(body, &want)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("decodeWire(% x): error %v; msgpack's: %v", body, gotErr, wantErr)
	}
	// Printed, not reflect.DeepEqual: a NaN in an error's details is
	// the same NaN; nil and empty slices still print differently.
	if g, w := fmt.Sprintf("%#v", got), fmt.Sprintf("%#v", want); gotErr == nil && g != w {
		t.Fatalf("decodeWire(% x) =\n%s\nmsgpack's:\n%s", body, g, w)
	}
}

func TestDecodeWireAgreesWithMsgpack(t *testing.T) {
	skipOn32Bit(t)
	bodies := wireBodies(t)
	for _, b := range bodies {
		wireAgrees(t, b)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 40000 {
		b := bytes.Clone(bodies[rng.IntN(len(bodies))])
		for range 1 + rng.IntN(2) {
			if i := rng.IntN(len(b)); rng.IntN(2) == 0 {
				b[i] = byte(rng.Uint32())
			} else {
				b = append(b[:i], b[i+1:]...)
			}
			if len(b) == 0 {
				b = []byte{0x80}
			}
		}
		wireAgrees(t, b)
	}
}

// The frames a daemon sends on every call take the fast reading: a
// success, an event.
func TestDecodeWireReadsTheDaemonsFramesItself(t *testing.T) {
	bodies := wireBodies(t)
	for i, b := range bodies[:8] {
		var w wireResponse
		want := i != 4 // the error response is msgpack's
		assert.Equal(t, want, decodeWireFast(b, &w), "body %d: % x", i, b)
	}
}

// FuzzDecodeWire holds decodeWire to msgpack's decoder on any bytes.
func FuzzDecodeWire(f *testing.F) {
	for _, b := range wireBodies(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		skipOn32Bit(t)
		wireAgrees(t, body)
	})
}
