package gvisor

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/cellres"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/capture"
)

func TestCodeFramesRoundTrip(t *testing.T) {
	req := agent.CellRequest{Context: "c", Code: []byte("1")}.Encode()
	if c, err := gvwire.DecodeCode(gvwire.Code{Seq: 7, Request: req}.Encode()); err != nil || c.Seq != 7 || !bytes.Equal(c.Request, req) {
		t.Errorf("code: %+v, %v", c, err)
	}
	if d, err := gvwire.DecodeContextDelete(gvwire.ContextDelete{Seq: 3, Name: "a.b-c_d"}.Encode()); err != nil || d != (gvwire.ContextDelete{Seq: 3, Name: "a.b-c_d"}) {
		t.Errorf("context delete: %+v, %v", d, err)
	}
	o := gvwire.CellOutput{Seq: 9, Stream: gvwire.CellResults, Data: []byte("bytes")}
	if got, err := gvwire.DecodeCellOutput(o.Encode()); err != nil || got.Seq != 9 || got.Stream != gvwire.CellResults || string(got.Data) != "bytes" {
		t.Errorf("cell output: %+v, %v", got, err)
	}
	for _, s := range []gvwire.CellStatus{
		{Seq: 1, What: gvwire.CellStarted},
		{Seq: 2, What: gvwire.CellEnded, A: 1, B: 2, C: 9, D: gvwire.TimedKill, Count: 12},
		{Seq: 3, What: gvwire.CellFailed, A: 2, Reason: "no python3"},
	} {
		if got, err := gvwire.DecodeCellStatus(s.Encode()); err != nil || got != s {
			t.Errorf("cell status %+v: %+v, %v", s, got, err)
		}
	}
}

func TestCodeFramesRefused(t *testing.T) {
	for name, err := range map[string]error{
		"code without seq":         second(gvwire.DecodeCode([]byte{1, 2})),
		"code too large":           second(gvwire.DecodeCode(make([]byte, gvwire.MaxCodePayload+1))),
		"delete of a bad name":     second(gvwire.DecodeContextDelete(gvwire.ContextDelete{Name: "a b"}.Encode())),
		"delete of no name":        second(gvwire.DecodeContextDelete(gvwire.U32s(1))),
		"output of no stream":      second(gvwire.DecodeCellOutput(gvwire.CellOutput{Stream: 0}.Encode())),
		"output of stream 4":       second(gvwire.DecodeCellOutput(gvwire.CellOutput{Stream: 4}.Encode())),
		"output too large":         second(gvwire.DecodeCellOutput(gvwire.CellOutput{Stream: 1, Data: make([]byte, gvwire.MaxChunk+1)}.Encode())),
		"output cut short":         second(gvwire.DecodeCellOutput([]byte{1, 0, 0})),
		"status of nothing":        second(gvwire.DecodeCellStatus(gvwire.CellStatus{What: 4}.Encode())),
		"status cut short":         second(gvwire.DecodeCellStatus(gvwire.U32s(1, 1))),
		"a start with a reason":    second(gvwire.DecodeCellStatus(gvwire.CellStatus{What: gvwire.CellStarted, Reason: "x"}.Encode())),
		"an end lost twice":        second(gvwire.DecodeCellStatus(gvwire.CellStatus{What: gvwire.CellEnded, A: 2}.Encode())),
		"an end of code 256":       second(gvwire.DecodeCellStatus(gvwire.CellStatus{What: gvwire.CellEnded, C: 256}.Encode())),
		"an end timed 3":           second(gvwire.DecodeCellStatus(gvwire.CellStatus{What: gvwire.CellEnded, D: 3}.Encode())),
		"an end counted past 2^31": second(gvwire.DecodeCellStatus(gvwire.CellStatus{What: gvwire.CellEnded, Count: 1 << 31}.Encode())),
		"a start with a count":     second(gvwire.DecodeCellStatus(gvwire.CellStatus{What: gvwire.CellStarted, Count: 1}.Encode())),
		"a reason too long":        second(gvwire.DecodeCellStatus(gvwire.CellStatus{What: gvwire.CellFailed, Reason: strings.Repeat("x", gvwire.MaxReasonBytes+1)}.Encode())),
	} {
		if !errors.Is(err, gvwire.ErrBadFrame) {
			t.Errorf("%s: %v, want ErrBadFrame", name, err)
		}
	}
	// Every frame kind of a cell has a bound.
	for _, k := range []byte{gvwire.KindCode, gvwire.KindContextList, gvwire.KindContextDelete, gvwire.KindCellOutput, gvwire.KindCellStatus, gvwire.KindCodeWarm, gvwire.KindContextRestart} {
		if gvwire.MaxPayload(k) <= 0 {
			t.Errorf("kind %d has no bound", k)
		}
	}
	if gvwire.MaxPayload(gvwire.KindProcAnswer) < 12+agent.MaxContextListText {
		t.Error("a proc answer cannot carry the longest context list")
	}
}

func second[T any](_ T, err error) error { return err }

func FuzzDecodeCodeFrames(f *testing.F) {
	f.Add(gvwire.CellOutput{Seq: 1, Stream: 1, Data: []byte("x")}.Encode())
	f.Add(gvwire.CellStatus{Seq: 1, What: gvwire.CellFailed, A: 2, Reason: "r"}.Encode())
	f.Add(gvwire.ContextDelete{Seq: 1, Name: "default"}.Encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		if o, err := gvwire.DecodeCellOutput(b); err == nil && (o.Stream < 1 || o.Stream > 3 || len(o.Data) > gvwire.MaxChunk) {
			t.Fatalf("accepted %+v", o)
		}
		if s, err := gvwire.DecodeCellStatus(b); err == nil {
			if again, err := gvwire.DecodeCellStatus(s.Encode()); err != nil || again != s {
				t.Fatalf("status not stable: %+v %v", again, err)
			}
		}
		if d, err := gvwire.DecodeContextDelete(b); err == nil && !agent.ValidContextName(d.Name) {
			t.Fatalf("accepted %+v", d)
		}
		if c, err := gvwire.DecodeCode(b); err == nil && len(c.Request) > agent.MaxCellRequest {
			t.Fatalf("accepted a request of %d bytes", len(c.Request))
		}
	})
}

// TestCellFramesReachOnlyTheirCell: the reader gives a cell its own
// output and status, drops another seq's (a cell whose caller is gone),
// keeps reading while a cell's results reader does not read (it was
// dropped), and ends on a malformed cell frame.
func TestCellFramesReachOnlyTheirCell(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c := &initConn{fromInit: r, dead: make(chan struct{}), lstated: make(chan [2]uint32, 1)}
	go c.readLoop()
	newCell := func() (*cellWait, <-chan cellres.Results) {
		pr, pw := io.Pipe()
		cw := &cellWait{stdout: capture.NewTail(100), stderr: capture.NewTail(100), results: pw, reader: pr, status: make(chan gvwire.CellStatus, 2)}
		read := make(chan cellres.Results, 1)
		go func() { read <- cellres.Read(pr, 1<<20) }()
		return cw, read
	}
	mine, read := newCell()
	seq := c.addCell(mine)
	gone, _ := newCell()
	goneSeq := c.addCell(gone)
	c.dropCell(goneSeq) // its results are read by nobody now

	frame := func(kind byte, p []byte) []byte {
		var b bytes.Buffer
		_ = gvwire.WriteFrame(&b, kind, p)
		return b.Bytes()
	}
	result := []byte(`{"t":"result","data":{"text/plain":"42"}}`)
	done := []byte(`{"t":"done","count":3,"error":null,"dropped":0}`)
	results := binary.BigEndian.AppendUint32(nil, uint32(len(result)))
	results = append(append(results, result...), binary.BigEndian.AppendUint32(nil, uint32(len(done)))...)
	results = append(results, done...)
	var stream []byte
	for _, f := range [][]byte{
		frame(gvwire.KindCellStatus, gvwire.CellStatus{Seq: seq, What: gvwire.CellStarted}.Encode()),
		frame(gvwire.KindCellOutput, gvwire.CellOutput{Seq: goneSeq, Stream: gvwire.CellResults, Data: make([]byte, 1<<16)}.Encode()),
		frame(gvwire.KindCellOutput, gvwire.CellOutput{Seq: seq + 100, Stream: gvwire.CellStdout, Data: []byte("stray")}.Encode()),
		frame(gvwire.KindCellOutput, gvwire.CellOutput{Seq: seq, Stream: gvwire.CellStdout, Data: []byte("out")}.Encode()),
		frame(gvwire.KindCellOutput, gvwire.CellOutput{Seq: seq, Stream: gvwire.CellStderr, Data: []byte("err")}.Encode()),
		frame(gvwire.KindCellOutput, gvwire.CellOutput{Seq: seq, Stream: gvwire.CellResults, Data: results}.Encode()),
		frame(gvwire.KindCellStatus, gvwire.CellStatus{Seq: seq, What: gvwire.CellEnded, B: 1}.Encode()),
	} {
		stream = append(stream, f...)
	}
	go func() { _, _ = w.Write(stream) }()
	for _, want := range []uint32{gvwire.CellStarted, gvwire.CellEnded} {
		select {
		case s := <-mine.status:
			if s.What != want {
				t.Fatalf("status %+v, want %d", s, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no status %d", want)
		}
	}
	_ = mine.results.Close()
	res := <-read
	if string(mine.stdout.Bytes()) != "out" || string(mine.stderr.Bytes()) != "err" || !res.Done || res.Count != 3 || len(res.Bundles) != 1 || res.Bundles[0]["text/plain"] != "42" {
		t.Errorf("the cell got stdout %q stderr %q results %+v", mine.stdout.Bytes(), mine.stderr.Bytes(), res)
	}
	_, _ = w.Write(frame(gvwire.KindCellStatus, gvwire.U32s(seq, 9, 0, 0, 0, 0)))
	select {
	case <-c.dead:
		if !errors.Is(c.deadErr, gvwire.ErrBadFrame) {
			t.Errorf("the reader ended with %v, want ErrBadFrame", c.deadErr)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the reader did not end on a malformed cell status")
	}
	w.Close()
}
