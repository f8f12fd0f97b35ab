package cellres

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// frame is one frame as pyrt.py writes it.
func frame(t testing.TB, msg any) []byte {
	t.Helper()
	b, err := json.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)
}

func stream(t testing.TB, msgs ...any) []byte {
	var out []byte
	for _, m := range msgs {
		if raw, ok := m.([]byte); ok {
			out = append(out, raw...)
			continue
		}
		out = append(out, frame(t, m)...)
	}
	return out
}

func display(data map[string]any) map[string]any { return map[string]any{"t": "display", "data": data} }

func done(count int, dropped int, err any) map[string]any {
	return map[string]any{"t": "done", "count": count, "error": err, "dropped": dropped}
}

// readAll reads b and checks what every read must hold: it read b to its
// end, and kept no more than maxBytes of values.
func readAll(t testing.TB, b []byte, maxBytes int) Results {
	t.Helper()
	r := bytes.NewReader(b)
	res := Read(r, maxBytes)
	if r.Len() != 0 {
		t.Fatalf("Read left %d bytes of the stream unread", r.Len())
	}
	kept := 0
	for _, b := range res.Bundles {
		if len(b) == 0 || len(b) > 32 {
			t.Fatalf("a bundle of %d values", len(b))
		}
		for _, v := range b {
			switch x := v.(type) {
			case string:
				kept += len(x)
			case []byte:
				kept += len(x)
			default:
				raw, _ := json.Marshal(x)
				kept += len(raw)
			}
		}
	}
	if kept > maxBytes {
		t.Fatalf("kept %d bytes of values, more than %d", kept, maxBytes)
	}
	if res.Error != nil && len(res.Error.Traceback) > 200 {
		t.Fatalf("a traceback of %d lines", len(res.Error.Traceback))
	}
	return res
}

func TestReadsBundlesInOrderAndTheEnd(t *testing.T) {
	png := []byte("\x89PNG\r\n\x1a\nrest")
	res := readAll(t, stream(t,
		display(map[string]any{"text/plain": "'a'", "text/html": "<b>a</b>"}),
		display(map[string]any{"text/plain": "<img>", "image/png": base64.StdEncoding.EncodeToString(png)}),
		map[string]any{"t": "result", "data": map[string]any{"text/plain": "3", "application/json": map[string]any{"n": 3, "f": 1.5, "l": []any{1, "x"}}}},
		done(7, 0, nil)), 1<<20)
	if res.Malformed != nil || !res.Done || res.Count != 7 || res.Truncated || res.Error != nil || len(res.Bundles) != 3 {
		t.Fatalf("%+v", res)
	}
	if res.Bundles[0]["text/html"] != "<b>a</b>" || !bytes.Equal(res.Bundles[1]["image/png"].([]byte), png) || res.Bundles[2]["text/plain"] != "3" {
		t.Errorf("bundles: %+v", res.Bundles)
	}
	j := res.Bundles[2]["application/json"].(map[string]any)
	if j["n"] != int64(3) || j["f"] != 1.5 || j["l"].([]any)[0] != int64(1) {
		t.Errorf("application/json's numbers: %#v", j)
	}
}

func TestReadsTheCellsError(t *testing.T) {
	tb := make([]any, 300)
	for i := range tb {
		tb[i] = "line\n"
	}
	res := readAll(t, stream(t, done(2, 0, map[string]any{"name": "ZeroDivisionError", "value": "division by zero", "traceback": tb})), 1<<20)
	if res.Error == nil || res.Error.Name != "ZeroDivisionError" || res.Error.Value != "division by zero" || len(res.Error.Traceback) != 200 {
		t.Errorf("the error: %+v", res.Error)
	}
	for _, bad := range []any{"a string", map[string]any{"value": "no name"}, []any{1}} {
		res := readAll(t, stream(t, done(2, 0, bad)), 1<<20)
		if res.Error == nil || res.Error.Name != "Error" {
			t.Errorf("an error %v: %+v", bad, res.Error)
		}
	}
}

func TestKeepsWithinItsBytes(t *testing.T) {
	big := strings.Repeat("y", 600<<10)
	res := readAll(t, stream(t,
		display(map[string]any{"text/plain": big}),
		display(map[string]any{"text/plain": big}), // past 1 MiB together: left out
		display(map[string]any{"text/plain": "small"}),
		done(1, 0, nil)), 1<<20)
	if !res.Truncated || len(res.Bundles) != 2 || res.Bundles[1]["text/plain"] != "small" || !res.Done || res.Malformed != nil {
		t.Errorf("%d bundles, truncated %v, done %v, malformed %v", len(res.Bundles), res.Truncated, res.Done, res.Malformed)
	}
	// A frame larger than what may still be kept is skipped unread.
	huge := display(map[string]any{"text/plain": strings.Repeat("z", 3<<20)})
	res = readAll(t, stream(t, huge, done(1, 0, nil)), 1<<20)
	if !res.Truncated || len(res.Bundles) != 0 || !res.Done {
		t.Errorf("a frame past the bytes: %+v", res)
	}
	// What the guest itself left out says so too.
	if res := readAll(t, stream(t, done(1, 3, nil)), 1<<20); !res.Truncated {
		t.Errorf("dropped in the guest: %+v", res)
	}
}

func TestRefusesWhatIsNotABundle(t *testing.T) {
	many := map[string]any{}
	for i := 0; i < 33; i++ {
		many[strings.Repeat("m", i+1)] = "v"
	}
	for name, data := range map[string]any{
		"no values":        map[string]any{},
		"too many values":  many,
		"a long mime type": map[string]any{strings.Repeat("x", 129): "v"},
		"a number":         map[string]any{"text/plain": 3},
		"bad base64":       map[string]any{"image/png": "not base64!"},
		"png not a string": map[string]any{"image/png": []any{1}},
	} {
		res := readAll(t, stream(t, map[string]any{"t": "display", "data": data}, done(1, 0, nil)), 1<<20)
		if len(res.Bundles) != 0 || !res.Truncated || !res.Done {
			t.Errorf("%s: %+v", name, res)
		}
	}
}

func TestAMalformedStreamIsReadToItsEnd(t *testing.T) {
	ok := display(map[string]any{"text/plain": "kept"})
	rest := stream(t, display(map[string]any{"text/plain": "after"}), done(1, 0, nil))
	for name, bad := range map[string][]byte{
		"a frame past MaxFrame": binary.BigEndian.AppendUint32(nil, MaxFrame+1),
		"not JSON":              append(binary.BigEndian.AppendUint32(nil, 3), "{x}"...),
		"an unknown kind":       frame(t, map[string]any{"t": "mystery"}),
		"data not a map":        frame(t, map[string]any{"t": "display", "data": "text"}),
	} {
		res := readAll(t, stream(t, ok, bad, rest), 1<<20)
		if res.Malformed == nil || len(res.Bundles) != 1 || res.Bundles[0]["text/plain"] != "kept" || res.Done {
			t.Errorf("%s: %+v", name, res)
		}
	}
	for name, cut := range map[string][]byte{
		"a header cut short": {0, 0},
		"a body cut short":   frame(t, ok)[:10],
	} {
		if res := readAll(t, stream(t, ok, cut), 1<<20); res.Malformed == nil || len(res.Bundles) != 1 {
			t.Errorf("%s: %+v", name, res)
		}
	}
	if res := readAll(t, nil, 1<<20); res.Malformed != nil || res.Done || len(res.Bundles) != 0 {
		t.Errorf("an empty stream: %+v", res)
	}
}

// FuzzCellresRead: whatever a guest writes on a results stream, Read
// returns, reads the stream to its end, and keeps within its bytes.
func FuzzCellresRead(f *testing.F) {
	f.Add(stream(f, display(map[string]any{"text/plain": "'a'", "image/png": "iVBORw0KGgo="}), done(1, 0, nil)), uint32(1<<20))
	f.Add(stream(f, map[string]any{"t": "result", "data": map[string]any{"application/json": []any{1, 2.5, "x", nil}}},
		done(3, 1, map[string]any{"name": "E", "value": "v", "traceback": []any{"a"}})), uint32(64))
	f.Add(binary.BigEndian.AppendUint32(nil, 0xffffffff), uint32(1<<20))
	f.Add([]byte{0, 0, 0, 2, '{', '}'}, uint32(0))
	f.Fuzz(func(t *testing.T, b []byte, maxBytes uint32) {
		res := readAll(t, b, int(maxBytes%(4<<20)))
		var _ []backend.Bundle = res.Bundles
	})
}
