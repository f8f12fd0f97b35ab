package gvisor

import (
	"bytes"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/capture"
)

func TestRunRequestRoundTrip(t *testing.T) {
	want := runRequest{argv: []string{"sh", "-c", "echo 'x'"}, env: []string{"A=b", "EMPTY="},
		cwd: "/workspace/sub", stdin: []byte("in\x00put"), timeout: 1500 * time.Millisecond, killAfter: time.Second}
	got, err := decodeRunRequest(want.encode())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.argv, want.argv) || !slices.Equal(got.env, want.env) || got.cwd != want.cwd || !bytes.Equal(got.stdin, want.stdin) ||
		got.timeout != want.timeout || got.killAfter != want.killAfter {
		t.Fatalf("round trip: %+v, want %+v", got, want)
	}
}

func TestDecodeRunRequestRefuses(t *testing.T) {
	s := time.Second
	good := runRequest{argv: []string{"true"}, env: []string{"A=b"}, cwd: "/workspace", timeout: s, killAfter: s}
	for name, req := range map[string]runRequest{
		"no budget":          {argv: good.argv, cwd: "/workspace", killAfter: s},
		"no grace":           {argv: good.argv, cwd: "/workspace", timeout: s},
		"budget too long":    {argv: good.argv, cwd: "/workspace", timeout: backend.MaxTimeout + 1, killAfter: s},
		"empty argv":         {cwd: "/workspace", timeout: s, killAfter: s},
		"relative cwd":       {argv: good.argv, cwd: "workspace", timeout: s, killAfter: s},
		"unclean cwd":        {argv: good.argv, cwd: "/workspace/../etc", timeout: s, killAfter: s},
		"env without a name": {argv: good.argv, env: []string{"=x"}, cwd: "/workspace", timeout: s, killAfter: s},
		"env without =":      {argv: good.argv, env: []string{"A"}, cwd: "/workspace", timeout: s, killAfter: s},
		"NUL in argv":        {argv: []string{"a\x00b"}, cwd: "/workspace", timeout: s, killAfter: s},
	} {
		if _, err := decodeRunRequest(req.encode()); !errors.Is(err, errBadFrame) {
			t.Errorf("%s: err = %v, want errBadFrame", name, err)
		}
	}
	enc := good.encode()
	for name, buf := range map[string][]byte{
		"empty":       nil,
		"wrong magic": append([]byte{1, 2, 3, 4}, enc[4:]...),
		"truncated":   enc[:len(enc)-3],
		"trailing":    append(slices.Clone(enc), 0),
		"huge count":  append(slices.Clone(enc[:4]), 0xff, 0xff, 0xff, 0x7f),
	} {
		if _, err := decodeRunRequest(buf); !errors.Is(err, errBadFrame) {
			t.Errorf("%s: err = %v, want errBadFrame", name, err)
		}
	}
}

func TestFrames(t *testing.T) {
	var buf bytes.Buffer
	if err := writeFrame(&buf, kindStdout, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := writeFrame(&buf, kindExited, u32s(endKilled, 9, timedNo)); err != nil {
		t.Fatal(err)
	}
	allowed := uint32(1<<kindStdout | 1<<kindExited)
	kind, p, err := readFrame(&buf, allowed)
	if err != nil || kind != kindStdout || string(p) != "hello" {
		t.Fatalf("first frame: %d %q %v", kind, p, err)
	}
	kind, p, err = readFrame(&buf, allowed)
	if err != nil || kind != kindExited {
		t.Fatalf("second frame: %d %v", kind, err)
	}
	if code, timed, err := exitCode(p); err != nil || code != 137 || timed {
		t.Fatalf("exit code %d (timed out %v), %v; want 137 not timed out", code, timed, err)
	}
	if _, _, err := readFrame(&buf, allowed); !errors.Is(err, io.EOF) {
		t.Fatalf("at the end: %v, want EOF", err)
	}

	bad := map[string][]byte{
		"kind not allowed":   {kindRun, 0, 0, 0, 0, 0, 0, 0},
		"unknown kind":       {99, 0, 0, 0, 0, 0, 0, 0},
		"reserved bytes":     {kindStdout, 1, 0, 0, 0, 0, 0, 0},
		"payload over bound": {kindStdout, 0, 0, 0, 0xff, 0xff, 0xff, 0xff},
		"exit too long":      {kindExited, 0, 0, 0, 13, 0, 0, 0},
	}
	for name, b := range bad {
		if _, _, err := readFrame(bytes.NewReader(b), allowed); !errors.Is(err, errBadFrame) {
			t.Errorf("%s: err = %v, want errBadFrame", name, err)
		}
	}
	// A frame cut short is an unexpected EOF, not a clean end.
	var cut bytes.Buffer
	_ = writeFrame(&cut, kindStdout, []byte(strings.Repeat("x", 100)))
	if _, _, err := readFrame(bytes.NewReader(cut.Bytes()[:50]), allowed); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut frame: %v, want ErrUnexpectedEOF", err)
	}
	for _, p := range [][]byte{u32s(endExited, 256, 0), u32s(endKilled, 0, 0), u32s(7, 1, 0), u32s(endExited, 0, 3), u32s(endExited, 0), {1, 2}} {
		if _, _, err := exitCode(p); !errors.Is(err, errBadFrame) {
			t.Errorf("exitCode(%v): %v, want errBadFrame", p, err)
		}
	}
	// A command init stopped at its budget reads as GNU timeout's status.
	for timed, want := range map[uint32]int{timedTerm: 124, timedKill: 137} {
		if code, to, err := exitCode(u32s(endKilled, 15, timed)); err != nil || code != want || !to {
			t.Errorf("timed %d: %d %v %v, want %d timed out", timed, code, to, err, want)
		}
	}
}

// TestReadLoopEndsOnABadFrame feeds the daemon's reader frames init would
// never send: a malformed exit, a short lstat answer. Each ends the stream
// (the sandbox is then stopped as dead) with the reason, and the command
// waiting on it is not told an exit; nothing panics.
func TestReadLoopEndsOnABadFrame(t *testing.T) {
	for name, frame := range map[string][]byte{
		"bad exit":          append([]byte{kindExited, 0, 0, 0, 12, 0, 0, 0}, u32s(7, 7, 7)...),
		"short lstat":       {kindLstated, 0, 0, 0, 0, 0, 0, 0},
		"unknown kind":      {42, 0, 0, 0, 0, 0, 0, 0},
		"payload too large": {kindStdout, 0, 0, 0, 0, 0, 0x10, 0},
	} {
		t.Run(name, func(t *testing.T) {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			c := &initConn{fromInit: r, dead: make(chan struct{}), lstated: make(chan [2]uint32, 1)}
			cmd := &command{stdout: capture.NewTail(100), stderr: capture.NewTail(100), end: make(chan frameEnd, 1)}
			c.cur = cmd
			go c.readLoop()
			var good bytes.Buffer
			_ = writeFrame(&good, kindStdout, []byte("before"))
			if _, err := w.Write(append(good.Bytes(), frame...)); err != nil {
				t.Fatal(err)
			}
			select {
			case <-c.dead:
			case <-time.After(5 * time.Second):
				t.Fatal("the reader did not stop at a bad frame")
			}
			w.Close()
			if !errors.Is(c.deadErr, errBadFrame) {
				t.Errorf("deadErr = %v, want errBadFrame", c.deadErr)
			}
			select {
			case e := <-cmd.end:
				t.Errorf("the command was told it ended: %+v", e)
			default:
			}
			if got := string(cmd.stdout.Bytes()); got != "before" {
				t.Errorf("output before the bad frame: %q", got)
			}
		})
	}
}

// Init is a binary of its own: a daemon given one of another version
// refuses it at its ready frame, with what to do, rather than misread it.
func TestReadyFrameCarriesTheProtocol(t *testing.T) {
	if err := readyFrom(u32s(initProtocol)); err != nil {
		t.Errorf("this version's ready frame: %v", err)
	}
	for name, p := range map[string][]byte{"empty (before versions)": nil, "another version": u32s(initProtocol + 1), "too long": u32s(initProtocol, 0)} {
		err := readyFrom(p)
		if err == nil || !strings.Contains(err.Error(), "install them together") {
			t.Errorf("%s: %v, want a refusal that says what to do", name, err)
		}
	}
}
