package bwrap

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
	r := runRequest{
		argv:    []string{"sh", "-c", "echo 'x y'\n", ""},
		env:     []string{"A=", "B=c=d", "UNICODE=é"},
		cwd:     "/workspace/sub dir",
		timeout: 1500 * time.Millisecond, killAfter: 2 * time.Second,
	}
	got, err := decodeRunRequest(r.encode())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.argv, r.argv) || !slices.Equal(got.env, r.env) || got.cwd != r.cwd || got.timeout != r.timeout || got.killAfter != r.killAfter {
		t.Errorf("round trip: %+v, want %+v", got, r)
	}
}

func TestDecodeRunRequestRefuses(t *testing.T) {
	ok := runRequest{argv: []string{"true"}, env: []string{"A=b"}, cwd: "/", timeout: time.Second}
	cases := map[string][]byte{
		"empty":            nil,
		"wrong magic":      append([]byte("xxxx"), ok.encode()[4:]...),
		"trailing byte":    append(ok.encode(), 0),
		"truncated":        ok.encode()[:len(ok.encode())-1],
		"no budget":        runRequest{argv: []string{"/bin/sh", "-c", "true"}, cwd: "/"}.encode(),
		"budget too long":  runRequest{argv: ok.argv, cwd: "/", timeout: backend.MaxTimeout + time.Millisecond}.encode(),
		"grace too long":   runRequest{argv: ok.argv, cwd: "/", timeout: time.Second, killAfter: backend.MaxTimeout + time.Millisecond}.encode(),
		"empty argv":       runRequest{cwd: "/", timeout: time.Second}.encode(),
		"empty program":    runRequest{argv: []string{""}, cwd: "/", timeout: time.Second}.encode(),
		"relative cwd":     runRequest{argv: ok.argv, cwd: "workspace", timeout: time.Second}.encode(),
		"unclean cwd":      runRequest{argv: ok.argv, cwd: "/workspace/../etc", timeout: time.Second}.encode(),
		"NUL in argv":      runRequest{argv: []string{"true", "a\x00b"}, cwd: "/", timeout: time.Second}.encode(),
		"NUL in env":       runRequest{argv: ok.argv, env: []string{"A=\x00"}, cwd: "/", timeout: time.Second}.encode(),
		"env without name": runRequest{argv: ok.argv, env: []string{"=x"}, cwd: "/", timeout: time.Second}.encode(),
		"env without =":    runRequest{argv: ok.argv, env: []string{"PATH"}, cwd: "/", timeout: time.Second}.encode(),
		"huge count":       binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, requestMagic), 1<<31),
		"huge length": binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(
			binary.LittleEndian.AppendUint32(nil, requestMagic), 1), 1<<31),
		"oversized": append(ok.encode(), make([]byte, maxRequestBytes)...),
	}
	for name, buf := range cases {
		if _, err := decodeRunRequest(buf); !errors.Is(err, errBadMessage) {
			t.Errorf("%s: err = %v, want errBadMessage", name, err)
		}
	}
}

func TestInitMsgs(t *testing.T) {
	for _, m := range []initMsg{{kind: msgReady}, {kind: msgRun}, {kind: msgStarted, a: 42}, {kind: msgExited, a: endKilled, b: 9, c: timedKill}, {kind: msgFailed, a: 2}} {
		got, err := decodeInitMsg(m.encode())
		if err != nil || got != m {
			t.Errorf("decode(encode(%+v)) = %+v, %v", m, got, err)
		}
	}
	for name, buf := range map[string][]byte{
		"short":        initMsg{kind: msgReady}.encode()[:initMsgSize-1],
		"long":         append(initMsg{kind: msgReady}.encode(), 0),
		"magic":        append([]byte("nope"), initMsg{kind: msgReady}.encode()[4:]...),
		"version":      slices.Concat(initMsg{kind: msgReady}.encode()[:4], []byte{9, 0, 0, 0}, initMsg{kind: msgReady}.encode()[8:]),
		"unknown kind": initMsg{kind: 99}.encode(),
		"kind zero":    initMsg{}.encode(),
	} {
		if _, err := decodeInitMsg(buf); !errors.Is(err, errBadMessage) {
			t.Errorf("%s: err = %v, want errBadMessage", name, err)
		}
	}
}

func TestExitCodeFromInit(t *testing.T) {
	cases := []struct {
		m     initMsg
		code  int
		timed bool
		ok    bool
	}{
		{initMsg{kind: msgExited, a: endExited, b: 0}, 0, false, true},
		{initMsg{kind: msgExited, a: endExited, b: 124}, 124, false, true},
		{initMsg{kind: msgExited, a: endExited, b: 255}, 255, false, true},
		{initMsg{kind: msgExited, a: endKilled, b: 9}, 137, false, true},
		{initMsg{kind: msgExited, a: endDumped, b: 11}, 139, false, true},
		// Stopped at its budget: what GNU timeout reported, whatever the
		// command's own status.
		{initMsg{kind: msgExited, a: endKilled, b: 15, c: timedTerm}, 124, true, true},
		{initMsg{kind: msgExited, a: endExited, b: 0, c: timedTerm}, 124, true, true},
		{initMsg{kind: msgExited, a: endKilled, b: 9, c: timedKill}, 137, true, true},
		{initMsg{kind: msgExited, a: endKilled, b: 9, c: 3}, 0, false, false},
		{initMsg{kind: msgExited, a: endExited, b: 256, c: timedTerm}, 0, false, false},
		{initMsg{kind: msgExited, a: endExited, b: 256}, 0, false, false},
		{initMsg{kind: msgExited, a: endKilled, b: 0}, 0, false, false},
		{initMsg{kind: msgExited, a: endKilled, b: 65}, 0, false, false},
		{initMsg{kind: msgExited, a: 7, b: 1}, 0, false, false},
		{initMsg{kind: msgStarted, a: endExited, b: 0}, 0, false, false},
	}
	for _, tc := range cases {
		code, timed, err := tc.m.exitCode()
		if (err == nil) != tc.ok || code != tc.code || timed != tc.timed {
			t.Errorf("exitCode(%+v) = %d, %v, %v; want %d, %v, ok %v", tc.m, code, timed, err, tc.code, tc.timed, tc.ok)
		}
	}
}

func FuzzDecodeRunRequest(f *testing.F) {
	f.Add(runRequest{argv: []string{"true"}, env: []string{"A=b"}, cwd: "/", timeout: time.Second}.encode())
	f.Add([]byte("rreq"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, buf []byte) {
		r, err := decodeRunRequest(buf)
		if err != nil {
			return
		}
		// What decodes re-encodes to the same bytes, and is what init may
		// run: budgeted, clean, no NUL.
		if !bytes.Equal(r.encode(), buf) {
			t.Fatalf("re-encoding %+v differs from the input", r)
		}
		if len(r.argv) == 0 || r.argv[0] == "" || r.timeout < time.Millisecond || r.timeout > backend.MaxTimeout || !strings.HasPrefix(r.cwd, "/") {
			t.Fatalf("accepted %+v", r)
		}
		for _, s := range slices.Concat(r.argv, r.env, []string{r.cwd}) {
			if strings.IndexByte(s, 0) >= 0 {
				t.Fatalf("accepted a NUL in %q", s)
			}
		}
	})
}

func FuzzDecodeInitMsg(f *testing.F) {
	f.Add(initMsg{kind: msgExited, a: endExited, b: 3}.encode())
	f.Add([]byte("init"))
	f.Fuzz(func(t *testing.T, buf []byte) {
		m, err := decodeInitMsg(buf)
		if err != nil {
			return
		}
		if !bytes.Equal(m.encode(), buf) {
			t.Fatalf("re-encoding %+v differs from the input", m)
		}
		if code, _, err := m.exitCode(); err == nil && (code < 0 || code > 255) {
			t.Fatalf("exit code %d out of range from %+v", code, m)
		}
	})
}

func TestRlimitsEncoding(t *testing.T) {
	in := limits.Limits{OpenFiles: 100, FileSizeBytes: 1 << 20}.Rlimits()
	out, err := decodeRlimits(encodeRlimits(in))
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
	if rls, err := decodeRlimits(""); err != nil || len(rls) != 0 {
		t.Errorf(`decodeRlimits("") = %v, %v`, rls, err)
	}
	for _, bad := range []string{"x=1", "4=", "4=-1", "99=1", "4", "-1=0", strings.Repeat("4=0,", 20) + "4=0"} {
		if _, err := decodeRlimits(bad); err == nil {
			t.Errorf("decodeRlimits(%q) accepted it", bad)
		}
	}
}

func TestDecodeInitThreads(t *testing.T) {
	for in, want := range map[string]int{"0": 0, "8": 8, "64": 64, "": initThreads, "65": initThreads, "-1": initThreads, "x": initThreads, "1e3": initThreads} {
		if got := decodeInitThreads(in); got != want {
			t.Errorf("decodeInitThreads(%q) = %d, want %d", in, got, want)
		}
	}
}
