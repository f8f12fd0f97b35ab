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
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/capture"
)

func TestRunRequestRoundTrip(t *testing.T) {
	want := gvwire.RunRequest{Argv: []string{"sh", "-c", "echo 'x'"}, Env: []string{"A=b", "EMPTY="},
		Cwd: "/workspace/sub", Stdin: []byte("in\x00put"), Timeout: 1500 * time.Millisecond, KillAfter: time.Second}
	got, err := gvwire.DecodeRunRequest(want.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Argv, want.Argv) || !slices.Equal(got.Env, want.Env) || got.Cwd != want.Cwd || !bytes.Equal(got.Stdin, want.Stdin) ||
		got.Timeout != want.Timeout || got.KillAfter != want.KillAfter {
		t.Fatalf("round trip: %+v, want %+v", got, want)
	}
}

func TestDecodeRunRequestRefuses(t *testing.T) {
	s := time.Second
	good := gvwire.RunRequest{Argv: []string{"true"}, Env: []string{"A=b"}, Cwd: "/workspace", Timeout: s, KillAfter: s}
	for name, req := range map[string]gvwire.RunRequest{
		"no budget":          {Argv: good.Argv, Cwd: "/workspace", KillAfter: s},
		"no grace":           {Argv: good.Argv, Cwd: "/workspace", Timeout: s},
		"budget too long":    {Argv: good.Argv, Cwd: "/workspace", Timeout: backend.MaxTimeout + 1, KillAfter: s},
		"empty argv":         {Cwd: "/workspace", Timeout: s, KillAfter: s},
		"relative cwd":       {Argv: good.Argv, Cwd: "workspace", Timeout: s, KillAfter: s},
		"unclean cwd":        {Argv: good.Argv, Cwd: "/workspace/../etc", Timeout: s, KillAfter: s},
		"env without a name": {Argv: good.Argv, Env: []string{"=x"}, Cwd: "/workspace", Timeout: s, KillAfter: s},
		"env without =":      {Argv: good.Argv, Env: []string{"A"}, Cwd: "/workspace", Timeout: s, KillAfter: s},
		"NUL in argv":        {Argv: []string{"a\x00b"}, Cwd: "/workspace", Timeout: s, KillAfter: s},
	} {
		if _, err := gvwire.DecodeRunRequest(req.Encode()); !errors.Is(err, gvwire.ErrBadFrame) {
			t.Errorf("%s: err = %v, want ErrBadFrame", name, err)
		}
	}
	enc := good.Encode()
	for name, buf := range map[string][]byte{
		"empty":       nil,
		"wrong magic": append([]byte{1, 2, 3, 4}, enc[4:]...),
		"truncated":   enc[:len(enc)-3],
		"trailing":    append(slices.Clone(enc), 0),
		"huge count":  append(slices.Clone(enc[:4]), 0xff, 0xff, 0xff, 0x7f),
	} {
		if _, err := gvwire.DecodeRunRequest(buf); !errors.Is(err, gvwire.ErrBadFrame) {
			t.Errorf("%s: err = %v, want ErrBadFrame", name, err)
		}
	}
}

func TestFrames(t *testing.T) {
	var buf bytes.Buffer
	if err := gvwire.WriteFrame(&buf, gvwire.KindStdout, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := gvwire.WriteFrame(&buf, gvwire.KindExited, gvwire.U32s(gvwire.EndKilled, 9, gvwire.TimedNo)); err != nil {
		t.Fatal(err)
	}
	allowed := uint32(1<<gvwire.KindStdout | 1<<gvwire.KindExited)
	kind, p, err := gvwire.ReadFrame(&buf, allowed)
	if err != nil || kind != gvwire.KindStdout || string(p) != "hello" {
		t.Fatalf("first frame: %d %q %v", kind, p, err)
	}
	kind, p, err = gvwire.ReadFrame(&buf, allowed)
	if err != nil || kind != gvwire.KindExited {
		t.Fatalf("second frame: %d %v", kind, err)
	}
	if code, timed, err := gvwire.ExitCode(p); err != nil || code != 137 || timed {
		t.Fatalf("exit code %d (timed out %v), %v; want 137 not timed out", code, timed, err)
	}
	if _, _, err := gvwire.ReadFrame(&buf, allowed); !errors.Is(err, io.EOF) {
		t.Fatalf("at the end: %v, want EOF", err)
	}

	bad := map[string][]byte{
		"kind not allowed":   {gvwire.KindRun, 0, 0, 0, 0, 0, 0, 0},
		"unknown kind":       {99, 0, 0, 0, 0, 0, 0, 0},
		"reserved bytes":     {gvwire.KindStdout, 1, 0, 0, 0, 0, 0, 0},
		"payload over bound": {gvwire.KindStdout, 0, 0, 0, 0xff, 0xff, 0xff, 0xff},
		"exit too long":      {gvwire.KindExited, 0, 0, 0, 13, 0, 0, 0},
	}
	for name, b := range bad {
		if _, _, err := gvwire.ReadFrame(bytes.NewReader(b), allowed); !errors.Is(err, gvwire.ErrBadFrame) {
			t.Errorf("%s: err = %v, want ErrBadFrame", name, err)
		}
	}
	// A frame cut short is an unexpected EOF, not a clean end.
	var cut bytes.Buffer
	_ = gvwire.WriteFrame(&cut, gvwire.KindStdout, []byte(strings.Repeat("x", 100)))
	if _, _, err := gvwire.ReadFrame(bytes.NewReader(cut.Bytes()[:50]), allowed); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut frame: %v, want ErrUnexpectedEOF", err)
	}
	for _, p := range [][]byte{gvwire.U32s(gvwire.EndExited, 256, 0), gvwire.U32s(gvwire.EndKilled, 0, 0), gvwire.U32s(7, 1, 0), gvwire.U32s(gvwire.EndExited, 0, 3), gvwire.U32s(gvwire.EndExited, 0), {1, 2}} {
		if _, _, err := gvwire.ExitCode(p); !errors.Is(err, gvwire.ErrBadFrame) {
			t.Errorf("ExitCode(%v): %v, want ErrBadFrame", p, err)
		}
	}
	// A command init stopped at its budget reads as GNU timeout's status.
	for timed, want := range map[uint32]int{gvwire.TimedTerm: 124, gvwire.TimedKill: 137} {
		if code, to, err := gvwire.ExitCode(gvwire.U32s(gvwire.EndKilled, 15, timed)); err != nil || code != want || !to {
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
		"bad exit":          append([]byte{gvwire.KindExited, 0, 0, 0, 12, 0, 0, 0}, gvwire.U32s(7, 7, 7)...),
		"short lstat":       {gvwire.KindLstated, 0, 0, 0, 0, 0, 0, 0},
		"unknown kind":      {42, 0, 0, 0, 0, 0, 0, 0},
		"payload too large": {gvwire.KindStdout, 0, 0, 0, 0, 0, 0x10, 0},
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
			_ = gvwire.WriteFrame(&good, gvwire.KindStdout, []byte("before"))
			if _, err := w.Write(append(good.Bytes(), frame...)); err != nil {
				t.Fatal(err)
			}
			select {
			case <-c.dead:
			case <-time.After(5 * time.Second):
				t.Fatal("the reader did not stop at a bad frame")
			}
			w.Close()
			if !errors.Is(c.deadErr, gvwire.ErrBadFrame) {
				t.Errorf("deadErr = %v, want ErrBadFrame", c.deadErr)
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
	if err := gvwire.ReadyFrom(gvwire.U32s(gvwire.Protocol)); err != nil {
		t.Errorf("this version's ready frame: %v", err)
	}
	for name, p := range map[string][]byte{"empty (before versions)": nil, "another version": gvwire.U32s(gvwire.Protocol + 1), "too long": gvwire.U32s(gvwire.Protocol, 0)} {
		err := gvwire.ReadyFrom(p)
		if err == nil || !strings.Contains(err.Error(), "install them together") {
			t.Errorf("%s: %v, want a refusal that says what to do", name, err)
		}
	}
}

func TestProcFrames(t *testing.T) {
	req := agent.Request{ID: "p-0123456789ab", Argv: []string{"sh", "-c", "true"}, Cwd: "/workspace", UID: 1000, GID: 1000}
	start := gvwire.ProcStart{Seq: 7, Request: req.Encode(), Stdin: []byte("in\x00put")}
	got, err := gvwire.DecodeProcStart(start.Encode())
	if err != nil || got.Seq != 7 || !bytes.Equal(got.Request, start.Request) || !bytes.Equal(got.Stdin, start.Stdin) {
		t.Fatalf("proc start round trip: %+v, %v", got, err)
	}
	enc := start.Encode()
	for name, p := range map[string][]byte{
		"empty":            nil,
		"request too long": append(gvwire.U32s(1, uint32(len(enc))), enc[8:]...),
		"request huge":     gvwire.U32s(1, agent.MaxRequestSize+1),
	} {
		if _, err := gvwire.DecodeProcStart(p); !errors.Is(err, gvwire.ErrBadFrame) {
			t.Errorf("proc start %s: %v, want ErrBadFrame", name, err)
		}
	}
	sig := gvwire.ProcSignal{Seq: 3, Signal: 15, ID: "p-0123456789ab"}
	if got, err := gvwire.DecodeProcSignal(sig.Encode()); err != nil || got != sig {
		t.Fatalf("proc signal round trip: %+v, %v", got, err)
	}
	for name, s := range map[string]gvwire.ProcSignal{"no signal": {ID: "p-1"}, "signal 65": {Signal: 65, ID: "p-1"}, "a path": {Signal: 9, ID: "../etc"}, "no id": {Signal: 9}} {
		if _, err := gvwire.DecodeProcSignal(s.Encode()); !errors.Is(err, gvwire.ErrBadFrame) {
			t.Errorf("proc signal %s: %v, want ErrBadFrame", name, err)
		}
	}
	a, err := gvwire.DecodeProcAnswer(gvwire.ProcAnswer{Seq: 9, Errno: 0, Value: 42, Body: []byte("p-1\np-2")}.Encode())
	if err != nil || a.Seq != 9 || a.Value != 42 {
		t.Fatalf("proc answer round trip: %+v, %v", a, err)
	}
	if ids, err := a.IDs(); err != nil || !slices.Equal(ids, []string{"p-1", "p-2"}) {
		t.Errorf("a list's ids: %q, %v", ids, err)
	}
	if _, err := (gvwire.ProcAnswer{Body: []byte("p-1\n../x")}).IDs(); !errors.Is(err, gvwire.ErrBadFrame) {
		t.Errorf("a list naming a path: %v", err)
	}
	if _, err := gvwire.DecodeProcAnswer([]byte{1, 2, 3}); !errors.Is(err, gvwire.ErrBadFrame) {
		t.Errorf("a short answer: %v", err)
	}
}

// An attached frame, as init writes it, begins with the marker a
// re-attaching daemon looks for.
func TestAttachedMarker(t *testing.T) {
	nonce := []byte("0123456789abcdef")
	var buf bytes.Buffer
	if err := gvwire.WriteFrame(&buf, gvwire.KindAttached, gvwire.Attached(nonce)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), gvwire.AttachedMarker(nonce)) {
		t.Errorf("the attached frame %x is not its marker %x", buf.Bytes(), gvwire.AttachedMarker(nonce))
	}
	kind, p, err := gvwire.ReadFrame(&buf, 1<<gvwire.KindAttached)
	if err != nil || kind != gvwire.KindAttached || len(p) != 4+gvwire.NonceSize {
		t.Errorf("reading it back: %d %x %v", kind, p, err)
	}
}
