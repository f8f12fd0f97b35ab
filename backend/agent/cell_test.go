package agent

import (
	"encoding/binary"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestCellRequestRoundTrip(t *testing.T) {
	r := CellRequest{Context: "ctx-1", Code: []byte("x = 1\nprint('é')\n"), Env: []string{"PATH=/bin", "A="},
		Preload: "numpy,pandas", Timeout: 1500 * time.Millisecond, Grace: time.Second, MaxContexts: 12}
	got, err := DecodeCellRequest(r.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if got.Context != r.Context || string(got.Code) != string(r.Code) || !slices.Equal(got.Env, r.Env) || got.Preload != r.Preload ||
		got.Timeout != r.Timeout || got.Grace != r.Grace || got.MaxContexts != r.MaxContexts {
		t.Errorf("round trip: %+v, want %+v", got, r)
	}
	empty, err := DecodeCellRequest(CellRequest{}.Encode())
	if err != nil || empty.Context != "" || len(empty.Code) != 0 || empty.Timeout != 0 {
		t.Errorf("an empty request: %+v, %v", empty, err)
	}
}

func TestDecodeCellRequestRefuses(t *testing.T) {
	ok := CellRequest{Context: "default", Code: []byte("1")}.Encode()
	cases := map[string][]byte{
		"empty":         nil,
		"wrong magic":   append([]byte("xxxx"), ok[4:]...),
		"trailing byte": append(slices.Clone(ok), 0),
		"truncated":     ok[:len(ok)-1],
		"budget":        CellRequest{Timeout: MaxCellTimeout + 1}.Encode(),
		"grace":         CellRequest{Grace: MaxCellTimeout + 1}.Encode(),
		"bound":         CellRequest{MaxContexts: MaxContextsBound + 1}.Encode(),
		"huge length":   binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, cellMagic), 1<<31),
		"oversized":     CellRequest{Code: make([]byte, MaxCellRequest)}.Encode(),
	}
	for name, b := range cases {
		if _, err := DecodeCellRequest(b); !errors.Is(err, ErrBadCell) {
			t.Errorf("%s: %v, want ErrBadCell", name, err)
		}
	}
}

func TestContextListRoundTrip(t *testing.T) {
	c := &Contexts{byName: map[string]*codeContext{
		"b":       {name: "b", count: 3, cell: &cell{}},
		"a.x_y-z": {name: "a.x_y-z", count: 0},
	}}
	assert.Equal(t, "a.x_y-z 0 0\nb 1 3", string(c.ListText()))
	assert.Equal(t, []ContextInfo{{Name: "a.x_y-z", Count: 0}, {Name: "b", Running: true, Count: 3}}, ParseContextList(c.ListText()))
	// What is not a line of one is skipped.
	assert.Equal(t, []ContextInfo{{Name: "ok", Count: 2}}, ParseContextList([]byte("bad name 1 2\nok 0 2\nneg 0 -1\n\nx 0 y\nz 0")))
	assert.Empty(t, ParseContextList(nil))
	assert.LessOrEqual(t, len((&Contexts{}).ListText()), MaxContextListText)
}

func FuzzDecodeCellRequest(f *testing.F) {
	f.Add(CellRequest{Context: "default", Code: []byte("x"), Env: []string{"A=b"}, Timeout: time.Second}.Encode())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeCellRequest(b)
		if err != nil {
			return
		}
		again, err := DecodeCellRequest(r.Encode())
		if err != nil || again.Context != r.Context || string(again.Code) != string(r.Code) || !slices.Equal(again.Env, r.Env) ||
			again.Timeout != r.Timeout || again.Grace != r.Grace || again.MaxContexts != r.MaxContexts || again.Preload != r.Preload {
			t.Fatalf("a request that decodes does not round-trip: %+v / %+v, %v", r, again, err)
		}
	})
}

func FuzzParseContextList(f *testing.F) {
	f.Add([]byte("a 0 1\nb 1 2"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, x := range ParseContextList(b) {
			if !ValidContextName(x.Name) || x.Count < 0 {
				t.Fatalf("parsed %+v", x)
			}
		}
	})
}
