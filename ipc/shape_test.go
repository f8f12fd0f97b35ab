package ipc

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// shapeByDecoder is the walk checkShape made before it read the bytes
// itself: the same rules through msgpack's decoder. It stays here as the
// reference checkShape must agree with.
func shapeByDecoder(body []byte, maxItems int) error {
	r := bytes.NewReader(body)
	d := msgpack.NewDecoder(r)
	c, err := d.PeekCode()
	if err != nil {
		return errors.New("empty body")
	}
	if !isMap(c) {
		return fmt.Errorf("the body is not a msgpack map (first byte 0x%02x)", c)
	}
	var stack [MaxDepth + 1]int
	remaining := append(stack[:0], 1)
	items := 1
	for len(remaining) > 0 {
		top := len(remaining) - 1
		if remaining[top] == 0 {
			remaining = remaining[:top]
			continue
		}
		remaining[top]--
		c, err := d.PeekCode()
		if err != nil {
			return truncated(err)
		}
		var n int
		switch {
		case isMap(c):
			n, err = d.DecodeMapLen()
			n *= 2
		case isArray(c):
			n, err = d.DecodeArrayLen()
		default:
			err = d.Skip()
			n = -1
		}
		if err != nil {
			return truncated(err)
		}
		if n >= 0 {
			if n > r.Len() {
				return errors.New("truncated msgpack value")
			}
			if items += n; maxItems > 0 && items > maxItems {
				return errTooManyItems
			}
			if len(remaining) >= MaxDepth {
				return fmt.Errorf("containers nested more than %d deep", MaxDepth)
			}
			remaining = append(remaining, n)
		}
	}
	if r.Len() > 0 {
		return errors.New("bytes after the map")
	}
	return nil
}

// skipOn32Bit skips a comparison with msgpack's decoder where it cannot
// be made: on a 32-bit host the decoder itself panics on a str, bin or ext
// whose 32-bit length passes 2^31 (its int goes negative), which is one of
// the reasons checkShape no longer walks through it.
func skipOn32Bit(t testing.TB) {
	if strconv.IntSize == 32 {
		t.Skip("msgpack's decoder panics on 32-bit lengths past 2^31 here; TestCheckShapeRefusals covers them")
	}
}

// shapeBodies are maps holding every msgpack type code there is, each
// width of every length-prefixed one included.
func shapeBodies(t testing.TB) [][]byte {
	many := func(n int) map[string]any {
		m := make(map[string]any, n)
		for i := range n {
			m[fmt.Sprint(i)] = i
		}
		return m
	}
	values := []any{
		nil, true, false, 0, 5, -3, -100, 200, -200, 40000, -40000, 1 << 20, -(1 << 20), uint64(1) << 40, int64(-1) << 40,
		float32(1.5), 2.25, "", "short", strings.Repeat("s", 40), strings.Repeat("m", 300), strings.Repeat("l", 70000),
		[]byte{}, []byte{1, 2}, bytes.Repeat([]byte{3}, 300), bytes.Repeat([]byte{4}, 70000),
		time.Unix(1, 0), time.Unix(1<<33, 5), time.Unix(1<<35, 7).UTC(), // fixext 4, fixext 8, ext 8
		[]any{}, []any{1, "a", []any{nil}}, make([]any, 20), make([]any, 70000),
		map[string]any{}, map[string]any{"a": map[string]any{"b": []any{1}}}, many(20), many(70000),
	}
	var bodies [][]byte
	for i, v := range values {
		bodies = append(bodies, mp(t, map[string]any{"v": 1, "id": i, "value": v}))
	}
	bodies = append(bodies, mp(t, map[string]any{"all": values}))
	// The ext widths msgpack's encoder never picks for a time.
	for _, ext := range [][]byte{{0xd4, 1, 0}, {0xd5, 1, 0, 0}, {0xd8, 1}, {0xc8, 0, 2, 1, 9, 9}, {0xc9, 0, 0, 0, 1, 1, 9}} {
		if ext[0] == 0xd8 {
			ext = append(ext, make([]byte, 16)...)
		}
		bodies = append(bodies, append([]byte{0x81, 0xa1, 'x'}, ext...))
	}
	return bodies
}

// agree fails t unless checkShape and the decoder's walk give the same
// verdict on body: both accept, or both refuse for the same kind of reason.
func agree(t testing.TB, body []byte, maxItems int) {
	got, want := checkShape(body, maxItems), shapeByDecoder(body, maxItems)
	if (got == nil) != (want == nil) || errors.Is(got, errTooManyItems) != errors.Is(want, errTooManyItems) ||
		(got != nil && want != nil && strings.Contains(want.Error(), "nested") != strings.Contains(got.Error(), "nested")) {
		t.Fatalf("checkShape(% x) = %v; the decoder's walk says %v", body[:min(len(body), 64)], got, want)
	}
}

func TestCheckShapeAgreesWithTheDecoder(t *testing.T) {
	skipOn32Bit(t)
	bodies := shapeBodies(t)
	for _, b := range bodies {
		require.NoError(t, checkShape(b, 0))
		agree(t, b, 0)
		agree(t, b, 30)
	}
	// Every cut of the small ones, and of the large ones near their ends.
	for _, b := range bodies {
		for n := range len(b) {
			if len(b) < 2048 || n < 64 || n > len(b)-64 {
				agree(t, b[:n], 0)
			}
		}
		agree(t, append(bytes.Clone(b), 0xc0), 0)
	}
	// Random damage: a byte changed, inserted or removed, many times over.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 40000 {
		b := bytes.Clone(bodies[rng.IntN(len(bodies))])
		if len(b) > 4096 {
			b = b[:4096]
		}
		for range 1 + rng.IntN(3) {
			i := rng.IntN(len(b))
			switch rng.IntN(3) {
			case 0:
				b[i] = byte(rng.Uint32())
			case 1:
				b = append(b[:i], append([]byte{byte(rng.Uint32())}, b[i:]...)...)
			default:
				b = append(b[:i], b[i+1:]...)
			}
			if len(b) == 0 {
				b = []byte{0x80}
			}
		}
		agree(t, b, rng.IntN(64))
	}
}

func TestCheckShapeRefusals(t *testing.T) {
	deep := bytes.Repeat([]byte{0x81, 0xa1, 'k'}, MaxDepth)
	deep = append(deep, 0xc0)
	for _, c := range []struct {
		name string
		body []byte
		want string
	}{
		{"empty", nil, "empty body"},
		{"an array", []byte{0x91, 1}, "not a msgpack map (first byte 0x91)"},
		{"a map that lies about its length", []byte{0xdf, 0xff, 0xff, 0xff, 0xff}, "truncated"},
		{"a string cut short", []byte{0x81, 0xa1, 'k', 0xdb, 0, 0, 1, 0, 'x'}, "truncated"},
		{"0xc1", []byte{0x81, 0xa1, 'k', 0xc1}, "0xc1"},
		{"too deep", deep, "nested more than 32 deep"},
		{"two maps", []byte{0x80, 0x80}, "bytes after the map"},
		// Lengths past 2^31, which a 32-bit int would make negative.
		{"a str 32 of 2^31 bytes", []byte{0x82, 0xa1, 'k', 0xdb, 0x80, 0, 0, 0, 0xa1, 'j', 1}, "truncated"},
		{"a str 32 of 2^32-1 bytes", []byte{0x81, 0xa1, 'k', 0xdb, 0xff, 0xff, 0xff, 0xff}, "truncated"},
		{"an ext 32 of 2^32-16 bytes", []byte{0x82, 0xa1, 'k', 0xc9, 0xff, 0xff, 0xff, 0xf0, 1, 0xa1, 'j', 1}, "truncated"},
		{"an array 32 of 2^32-1 items", []byte{0x81, 0xa1, 'k', 0xdd, 0xff, 0xff, 0xff, 0xff}, "truncated"},
		{"a map 32 of 2^31 entries", []byte{0x81, 0xa1, 'k', 0xdf, 0x80, 0, 0, 0}, "truncated"},
		{"a fixext 16 cut short", []byte{0x81, 0xa1, 'k', 0xd8}, "truncated"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := checkShape(c.body, 0)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			if strconv.IntSize == 64 { // see skipOn32Bit
				require.Error(t, shapeByDecoder(c.body, 0), "the decoder's walk refuses it too")
			}
		})
	}
	assert.ErrorIs(t, checkShape(mp(t, map[string]any{"a": []int{1, 2, 3, 4}}), 5), errTooManyItems)
}

// FuzzCheckShape holds checkShape to the decoder's walk on any bytes.
func FuzzCheckShape(f *testing.F) {
	for _, b := range shapeBodies(f) {
		if len(b) < 1024 {
			f.Add(b, 0)
		}
	}
	f.Add([]byte{0x81, 0xa1, 'k', 0xc1}, 0)
	f.Fuzz(func(t *testing.T, body []byte, maxItems int) {
		skipOn32Bit(t)
		agree(t, body, maxItems%128)
	})
}
