package bwwire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

func TestRunRequestRoundTrip(t *testing.T) {
	r := RunRequest{
		Argv:    []string{"sh", "-c", "echo 'x y'\n", ""},
		Env:     []string{"A=", "B=c=d", "UNICODE=é"},
		Cwd:     "/workspace/sub dir",
		Timeout: 1500 * time.Millisecond, KillAfter: 2 * time.Second,
	}
	got, err := DecodeRunRequest(r.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Argv, r.Argv) || !slices.Equal(got.Env, r.Env) || got.Cwd != r.Cwd || got.Timeout != r.Timeout || got.KillAfter != r.KillAfter {
		t.Errorf("round trip: %+v, want %+v", got, r)
	}
}

func TestDecodeRunRequestRefuses(t *testing.T) {
	ok := RunRequest{Argv: []string{"true"}, Env: []string{"A=b"}, Cwd: "/", Timeout: time.Second}
	cases := map[string][]byte{
		"empty":            nil,
		"wrong magic":      append([]byte("xxxx"), ok.Encode()[4:]...),
		"trailing byte":    append(ok.Encode(), 0),
		"truncated":        ok.Encode()[:len(ok.Encode())-1],
		"no budget":        RunRequest{Argv: []string{"/bin/sh", "-c", "true"}, Cwd: "/"}.Encode(),
		"budget too long":  RunRequest{Argv: ok.Argv, Cwd: "/", Timeout: backend.MaxTimeout + time.Millisecond}.Encode(),
		"grace too long":   RunRequest{Argv: ok.Argv, Cwd: "/", Timeout: time.Second, KillAfter: backend.MaxTimeout + time.Millisecond}.Encode(),
		"empty argv":       RunRequest{Cwd: "/", Timeout: time.Second}.Encode(),
		"empty program":    RunRequest{Argv: []string{""}, Cwd: "/", Timeout: time.Second}.Encode(),
		"relative cwd":     RunRequest{Argv: ok.Argv, Cwd: "workspace", Timeout: time.Second}.Encode(),
		"unclean cwd":      RunRequest{Argv: ok.Argv, Cwd: "/workspace/../etc", Timeout: time.Second}.Encode(),
		"NUL in argv":      RunRequest{Argv: []string{"true", "a\x00b"}, Cwd: "/", Timeout: time.Second}.Encode(),
		"NUL in env":       RunRequest{Argv: ok.Argv, Env: []string{"A=\x00"}, Cwd: "/", Timeout: time.Second}.Encode(),
		"env without name": RunRequest{Argv: ok.Argv, Env: []string{"=x"}, Cwd: "/", Timeout: time.Second}.Encode(),
		"env without =":    RunRequest{Argv: ok.Argv, Env: []string{"PATH"}, Cwd: "/", Timeout: time.Second}.Encode(),
		"huge count":       binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, RequestMagic), 1<<31),
		"huge length": binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(
			binary.LittleEndian.AppendUint32(nil, RequestMagic), 1), 1<<31),
		"oversized": append(ok.Encode(), make([]byte, MaxRequestBytes)...),
	}
	for name, buf := range cases {
		if _, err := DecodeRunRequest(buf); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: err = %v, want ErrBadMessage", name, err)
		}
	}
}

func TestInitMsgs(t *testing.T) {
	for _, m := range []Msg{{Kind: MsgReady}, {Kind: MsgRun}, {Kind: MsgStarted, A: 42}, {Kind: MsgExited, A: EndKilled, B: 9, C: TimedKill}, {Kind: MsgFailed, A: 2}} {
		got, err := DecodeMsg(m.Encode())
		if err != nil || got != m {
			t.Errorf("decode(encode(%+v)) = %+v, %v", m, got, err)
		}
	}
	for name, buf := range map[string][]byte{
		"short":        Msg{Kind: MsgReady}.Encode()[:MsgSize-1],
		"long":         append(Msg{Kind: MsgReady}.Encode(), 0),
		"magic":        append([]byte("nope"), Msg{Kind: MsgReady}.Encode()[4:]...),
		"version":      slices.Concat(Msg{Kind: MsgReady}.Encode()[:4], []byte{9, 0, 0, 0}, Msg{Kind: MsgReady}.Encode()[8:]),
		"unknown kind": Msg{Kind: 99}.Encode(),
		"kind zero":    Msg{}.Encode(),
	} {
		if _, err := DecodeMsg(buf); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: err = %v, want ErrBadMessage", name, err)
		}
	}
}

func TestExitCodeFromInit(t *testing.T) {
	cases := []struct {
		m     Msg
		code  int
		timed bool
		ok    bool
	}{
		{Msg{Kind: MsgExited, A: EndExited, B: 0}, 0, false, true},
		{Msg{Kind: MsgExited, A: EndExited, B: 124}, 124, false, true},
		{Msg{Kind: MsgExited, A: EndExited, B: 255}, 255, false, true},
		{Msg{Kind: MsgExited, A: EndKilled, B: 9}, 137, false, true},
		{Msg{Kind: MsgExited, A: EndDumped, B: 11}, 139, false, true},
		// Stopped at its budget: what GNU timeout reported, whatever the
		// command's own status.
		{Msg{Kind: MsgExited, A: EndKilled, B: 15, C: TimedTerm}, 124, true, true},
		{Msg{Kind: MsgExited, A: EndExited, B: 0, C: TimedTerm}, 124, true, true},
		{Msg{Kind: MsgExited, A: EndKilled, B: 9, C: TimedKill}, 137, true, true},
		{Msg{Kind: MsgExited, A: EndKilled, B: 9, C: 3}, 0, false, false},
		{Msg{Kind: MsgExited, A: EndExited, B: 256, C: TimedTerm}, 0, false, false},
		{Msg{Kind: MsgExited, A: EndExited, B: 256}, 0, false, false},
		{Msg{Kind: MsgExited, A: EndKilled, B: 0}, 0, false, false},
		{Msg{Kind: MsgExited, A: EndKilled, B: 65}, 0, false, false},
		{Msg{Kind: MsgExited, A: 7, B: 1}, 0, false, false},
		{Msg{Kind: MsgStarted, A: EndExited, B: 0}, 0, false, false},
	}
	for _, tc := range cases {
		code, timed, err := tc.m.ExitCode()
		if (err == nil) != tc.ok || code != tc.code || timed != tc.timed {
			t.Errorf("ExitCode(%+v) = %d, %v, %v; want %d, %v, ok %v", tc.m, code, timed, err, tc.code, tc.timed, tc.ok)
		}
	}
}

func FuzzDecodeRunRequest(f *testing.F) {
	f.Add(RunRequest{Argv: []string{"true"}, Env: []string{"A=b"}, Cwd: "/", Timeout: time.Second}.Encode())
	f.Add([]byte("rreq"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, buf []byte) {
		r, err := DecodeRunRequest(buf)
		if err != nil {
			return
		}
		// What decodes re-encodes to the same bytes, and is what init may
		// run: budgeted, clean, no NUL.
		if !bytes.Equal(r.Encode(), buf) {
			t.Fatalf("re-encoding %+v differs from the input", r)
		}
		if len(r.Argv) == 0 || r.Argv[0] == "" || r.Timeout < time.Millisecond || r.Timeout > backend.MaxTimeout || !strings.HasPrefix(r.Cwd, "/") {
			t.Fatalf("accepted %+v", r)
		}
		for _, s := range slices.Concat(r.Argv, r.Env, []string{r.Cwd}) {
			if strings.IndexByte(s, 0) >= 0 {
				t.Fatalf("accepted a NUL in %q", s)
			}
		}
	})
}

func FuzzDecodeInitMsg(f *testing.F) {
	f.Add(Msg{Kind: MsgExited, A: EndExited, B: 3}.Encode())
	f.Add([]byte("init"))
	f.Fuzz(func(t *testing.T, buf []byte) {
		m, err := DecodeMsg(buf)
		if err != nil {
			return
		}
		if !bytes.Equal(m.Encode(), buf) {
			t.Fatalf("re-encoding %+v differs from the input", m)
		}
		if code, _, err := m.ExitCode(); err == nil && (code < 0 || code > 255) {
			t.Fatalf("exit code %d out of range from %+v", code, m)
		}
	})
}

func TestRlimitsEncoding(t *testing.T) {
	var in []Rlimit
	for _, r := range (limits.Limits{OpenFiles: 100, FileSizeBytes: 1 << 20}).Rlimits() {
		in = append(in, Rlimit{Resource: r.Resource, Value: r.Value})
	}
	out, err := DecodeRlimits(EncodeRlimits(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(in) {
		t.Fatalf("decoded %d rlimits, want %d", len(out), len(in))
	}
	for i := range in {
		if out[i].Resource != in[i].Resource || out[i].Value != in[i].Value {
			t.Errorf("rlimit %d: got %+v, want %+v", i, out[i], in[i])
		}
	}
	if rls, err := DecodeRlimits(""); err != nil || len(rls) != 0 {
		t.Errorf(`DecodeRlimits("") = %v, %v`, rls, err)
	}
	for _, bad := range []string{"x=1", "4=", "4=-1", "99=1", "4", "-1=0", strings.Repeat("4=0,", 20) + "4=0"} {
		if _, err := DecodeRlimits(bad); err == nil {
			t.Errorf("DecodeRlimits(%q) accepted it", bad)
		}
	}
}

func TestDecodeInitThreads(t *testing.T) {
	for in, want := range map[string]int{"0": 0, "8": 8, "64": 64, "": Threads, "65": Threads, "-1": Threads, "x": Threads, "1e3": Threads} {
		if got := DecodeThreads(in); got != want {
			t.Errorf("DecodeThreads(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestCodeRequestRoundTrip(t *testing.T) {
	r := CodeRequest{Context: "ctx-1", Code: []byte("print('é')\x00\n"), Env: []string{"A=b", "PATH=/usr/bin"}, Preload: "numpy,pandas",
		Timeout: 3 * time.Second, Grace: time.Second, MaxContexts: 8}
	got, err := DecodeCodeRequest(r.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if got.Context != r.Context || !bytes.Equal(got.Code, r.Code) || !slices.Equal(got.Env, r.Env) || got.Preload != r.Preload ||
		got.Timeout != r.Timeout || got.Grace != r.Grace || got.MaxContexts != r.MaxContexts {
		t.Errorf("round trip: %+v, want %+v", got, r)
	}
	// A warm request carries no cell.
	if w, err := DecodeCodeRequest(CodeRequest{Env: r.Env, Preload: "numpy"}.Encode()); err != nil || w.Preload != "numpy" || w.Context != "" {
		t.Errorf("a warm request: %+v, %v", w, err)
	}
}

func TestDecodeCodeRequestRefuses(t *testing.T) {
	ok := CodeRequest{Context: "default", Code: []byte("1"), Env: []string{"A=b"}, Timeout: time.Second}
	cases := map[string][]byte{
		"empty":             nil,
		"wrong magic":       append([]byte("xxxx"), ok.Encode()[4:]...),
		"trailing byte":     append(ok.Encode(), 0),
		"truncated":         ok.Encode()[:len(ok.Encode())-1],
		"budget too long":   CodeRequest{Context: "c", Timeout: backend.MaxTimeout + 1}.Encode(),
		"grace too long":    CodeRequest{Context: "c", Grace: backend.MaxTimeout + 1}.Encode(),
		"too many contexts": CodeRequest{Context: "c", MaxContexts: 1025}.Encode(),
		"NUL in context":    CodeRequest{Context: "a\x00b"}.Encode(),
		"NUL in env":        CodeRequest{Context: "c", Env: []string{"A=\x00"}}.Encode(),
		"env without name":  CodeRequest{Context: "c", Env: []string{"=x"}}.Encode(),
		"env without =":     CodeRequest{Context: "c", Env: []string{"PATH"}}.Encode(),
		"NUL in preload":    CodeRequest{Context: "c", Preload: "numpy\x00"}.Encode(),
		"huge env count":    binary.LittleEndian.AppendUint32(wirefmtString(wirefmtString(CodeRequest{}.Encode()[:4], "c"), "1"), 1<<31),
		"too large":         make([]byte, MaxRequestBytes+1),
	}
	for name, b := range cases {
		if _, err := DecodeCodeRequest(b); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: err = %v, want ErrBadMessage", name, err)
		}
	}
}

// wirefmtString appends s as the wire's strings are: a length, the bytes.
func wirefmtString(b []byte, s string) []byte {
	return append(binary.LittleEndian.AppendUint32(b, uint32(len(s))), s...)
}

// FuzzDecodeCodeRequest: whatever the bytes, the decoder refuses or
// returns a request within its bounds that encodes back to itself.
func FuzzDecodeCodeRequest(f *testing.F) {
	f.Add(CodeRequest{Context: "default", Code: []byte("x = 1\nx"), Env: []string{"A=b"}, Preload: "numpy", Timeout: time.Second, Grace: time.Second, MaxContexts: 8}.Encode())
	f.Add(CodeRequest{Env: []string{"PATH=/usr/bin"}}.Encode())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeCodeRequest(b)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("refused without ErrBadMessage: %v", err)
			}
			return
		}
		if r.Timeout > backend.MaxTimeout || r.Grace > backend.MaxTimeout || r.MaxContexts > 1024 || len(r.Env) > MaxRequestEnv ||
			strings.ContainsRune(r.Context, 0) || strings.ContainsRune(r.Preload, 0) {
			t.Fatalf("accepted out of bounds: %+v", r)
		}
		again := r.Encode()
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoded differently:\n%x\n%x", again, b)
		}
	})
}
