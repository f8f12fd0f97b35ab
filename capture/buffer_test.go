package capture

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"
)

// model is the obvious, unbounded implementation a Buffer must agree with.
type model struct {
	limit int
	head  bool
	all   []byte
}

func (m *model) want() (kept []byte, truncated bool) {
	truncated = len(m.all) > m.limit
	if m.head {
		return m.all[:min(len(m.all), m.limit)], truncated
	}
	from := max(len(m.all)-m.limit, 0)
	kept = m.all[from:]
	if truncated && m.all[from-1] != '\n' {
		if i := bytes.IndexByte(kept, '\n'); i >= 0 && i < len(kept)-1 {
			kept = kept[i+1:]
		}
	}
	return kept, truncated
}

func checkAgainstModel(t *testing.T, b *Buffer, m *model) {
	t.Helper()
	kept, truncated := m.want()
	if got := b.Bytes(); !bytes.Equal(got, kept) {
		t.Fatalf("limit %d head %v after %d bytes: Bytes() = %q, want %q", m.limit, m.head, len(m.all), got, kept)
	}
	if b.Truncated() != truncated {
		t.Fatalf("Truncated() = %v, want %v", b.Truncated(), truncated)
	}
	if b.Total() != int64(len(m.all)) {
		t.Fatalf("Total() = %d, want %d", b.Total(), len(m.all))
	}
	if cap(b.data) > m.limit {
		t.Fatalf("backing array grew to %d bytes, past the limit %d", cap(b.data), m.limit)
	}
}

func TestBufferAgreesWithModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("ab\n")
	for _, limit := range []int{0, 1, 2, 3, 7, 64, 1000} {
		for _, head := range []bool{false, true} {
			for round := 0; round < 50; round++ {
				b, m := NewTail(limit), &model{limit: limit, head: head}
				if head {
					b = NewHead(limit)
				}
				for w := 0; w < 40; w++ {
					p := make([]byte, rng.IntN(2*limit+3))
					for i := range p {
						p[i] = alphabet[rng.IntN(len(alphabet))]
					}
					n, err := b.Write(p)
					if n != len(p) || err != nil {
						t.Fatalf("Write returned %d, %v; want %d, nil", n, err, len(p))
					}
					m.all = append(m.all, p...)
					checkAgainstModel(t, b, m)
				}
			}
		}
	}
}

func TestTailDropsLeadingPartialLine(t *testing.T) {
	cases := []struct {
		name   string
		writes []string
		limit  int
		want   string
	}{
		{"fits", []string{"a\nb\n"}, 10, "a\nb\n"},
		{"cut mid-line", []string{"line1\nline2\nline3\n"}, 8, "line3\n"},
		{"cut at line start keeps the line", []string{"line1\nline2\nline3\n"}, 6, "line3\n"},
		{"cut at line start across writes", []string{"line1\n", "line2\n", "line3\n"}, 12, "line2\nline3\n"},
		{"no newline in window keeps raw tail", []string{"0123456789"}, 4, "6789"},
		{"only newline is last byte keeps raw tail", []string{"xxxxabc\n"}, 4, "abc\n"},
		{"one long line across writes keeps raw tail", []string{`{"k":"`, "vvvvvvvvvvvv", `"}`, "\n"}, 6, `vvv"}` + "\n"},
		{"many small writes", []string{"a", "b", "\n", "c", "d", "\n", "e"}, 4, "cd\ne"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := NewTail(tc.limit)
			for _, w := range tc.writes {
				_, _ = b.Write([]byte(w))
			}
			if got := string(b.Bytes()); got != tc.want {
				t.Errorf("Bytes() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestHeadKeepsFirstBytes(t *testing.T) {
	b := NewHead(5)
	_, _ = b.Write([]byte("abc"))
	_, _ = b.Write([]byte("defgh"))
	_, _ = b.Write([]byte("ijk"))
	if got := string(b.Bytes()); got != "abcde" {
		t.Errorf("Bytes() = %q, want %q", got, "abcde")
	}
	if !b.Truncated() || b.Total() != 11 {
		t.Errorf("Truncated() = %v, Total() = %d; want true, 11", b.Truncated(), b.Total())
	}
}

func TestZeroLimitKeepsNothing(t *testing.T) {
	for _, b := range []*Buffer{NewTail(0), NewHead(0), NewTail(-5)} {
		if b.Truncated() {
			t.Fatal("an empty buffer reports truncation")
		}
		_, _ = b.Write([]byte("x\ny"))
		if len(b.Bytes()) != 0 || !b.Truncated() || b.Total() != 3 {
			t.Errorf("Bytes() = %q, Truncated() = %v, Total() = %d; want empty, true, 3", b.Bytes(), b.Truncated(), b.Total())
		}
	}
}

func TestTailMemoryStaysWithinLimit(t *testing.T) {
	const limit = 4096
	b := NewTail(limit)
	chunk := bytes.Repeat([]byte("0123456789abcde\n"), 4096) // 64 KiB
	for i := 0; i < 1024; i++ {                              // 64 MiB
		_, _ = b.Write(chunk)
		_, _ = b.Write(chunk[:i%97])
	}
	if cap(b.data) != limit {
		t.Errorf("backing array is %d bytes, want exactly the limit %d", cap(b.data), limit)
	}
	if got := len(b.Bytes()); got > limit || got < limit-16 {
		t.Errorf("kept %d bytes, want about %d", got, limit)
	}
}

func FuzzTail(f *testing.F) {
	f.Add([]byte("line1\nline2\nline3\n"), uint8(8), uint8(3))
	f.Add([]byte("no newline at all"), uint8(4), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, limit, chunk uint8) {
		b, m := NewTail(int(limit)), &model{limit: int(limit)}
		step := int(chunk) + 1
		for len(data) > 0 {
			n := min(step, len(data))
			_, _ = b.Write(data[:n])
			m.all = append(m.all, data[:n]...)
			data = data[n:]
		}
		checkAgainstModel(t, b, m)
	})
}

// BenchmarkTailWrite pushes 1 GiB through a 64 KiB tail in 32 KiB writes,
// the shape of a drain loop facing a guest that floods stdout.
func BenchmarkTailWrite(b *testing.B) {
	const total = 1 << 30
	chunk := bytes.Repeat([]byte("x"), drainChunk)
	b.SetBytes(total)
	b.ReportAllocs()
	for b.Loop() {
		buf := NewTail(64 << 10)
		for written := 0; written < total; written += len(chunk) {
			_, _ = buf.Write(chunk)
		}
		_, _ = io.Discard.Write(buf.Bytes())
	}
}
