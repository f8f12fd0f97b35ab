package wirefmt

import (
	"slices"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	list := []string{"a", "", "ccc"}
	buf := AppendList(nil, list)
	if len(buf) != ListSize(list) {
		t.Fatalf("AppendList wrote %d bytes, ListSize says %d", len(buf), ListSize(list))
	}
	buf = AppendString(buf, "/w")
	d := NewDecoder(buf)
	got, ok := d.List(3)
	if !ok || !slices.Equal(got, list) {
		t.Fatalf("List = %q, %v; want %q", got, ok, list)
	}
	if s, ok := d.String(); !ok || s != "/w" || d.Left() != 0 {
		t.Fatalf("String = %q, %v, %d left", s, ok, d.Left())
	}
	if _, ok := d.U32(); ok {
		t.Error("U32 past the end succeeded")
	}
}

func TestRefuses(t *testing.T) {
	three := AppendList(nil, []string{"a", "b", "c"})
	if _, ok := NewDecoder(three).List(2); ok {
		t.Error("a list over its limit was accepted")
	}
	for n := range len(three) {
		if _, ok := NewDecoder(three[:n]).List(3); ok {
			t.Errorf("a list cut at %d bytes was accepted", n)
		}
	}
	// A count the bytes left cannot hold is refused before allocating.
	if _, ok := NewDecoder([]byte{0xff, 0xff, 0xff, 0x0f}).List(1 << 30); ok {
		t.Error("a huge count was accepted")
	}
	if _, ok := NewDecoder(AppendString(nil, "a\x00b")).String(); ok {
		t.Error("a string with a NUL was accepted")
	}
	if b, ok := NewDecoder(AppendString(nil, "a\x00b")).Bytes(); !ok || string(b) != "a\x00b" {
		t.Errorf("Bytes = %q, %v; a byte string may hold NUL", b, ok)
	}
	if _, ok := NewDecoder([]byte{1, 2, 3, 4, 5, 6, 7}).U64(); ok {
		t.Error("U64 of 7 bytes succeeded")
	}
}

func TestCheckCommand(t *testing.T) {
	if err := CheckCommand([]string{"A=1", "B="}, "/workspace/d"); err != nil {
		t.Errorf("a good command: %v", err)
	}
	for _, tc := range []struct {
		env  []string
		cwd  string
		says string
	}{
		{nil, "rel", "not a clean absolute path"},
		{nil, "/a/../b", "not a clean absolute path"},
		{nil, "/" + strings.Repeat("a", 9000), "not a clean absolute path"},
		{[]string{"NOEQUALS"}, "/", "without a name"},
		{[]string{"=v"}, "/", "without a name"},
	} {
		if err := CheckCommand(tc.env, tc.cwd); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("CheckCommand(%q, %.20q) = %v; want %q", tc.env, tc.cwd, err, tc.says)
		}
	}
}
