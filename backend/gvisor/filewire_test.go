package gvisor

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
)

func TestFileRequestRoundTrip(t *testing.T) {
	for _, r := range []gvwire.FileRequest{
		{Seq: 7, Op: gvwire.FileRead, N: 1 << 20, Path: "/etc/os-release"},
		{Seq: 1 << 31, Op: gvwire.FileRange, Offset: 1 << 40, N: 4096, Path: "/workspace/x"},
		{Seq: 0, Op: gvwire.FileList, N: 10000, Path: "/"},
	} {
		if got, err := gvwire.DecodeFileRequest(r.Encode()); err != nil || got != r {
			t.Errorf("round trip of %+v: %+v, %v", r, got, err)
		}
	}
}

func TestDecodeFileRequestRefuses(t *testing.T) {
	good := gvwire.FileRequest{Op: gvwire.FileRead, N: 10, Path: "/x"}
	for name, buf := range map[string][]byte{
		"empty":           nil,
		"short":           good.Encode()[:gvwire.FileRequestHeader-1],
		"no path":         good.Encode()[:gvwire.FileRequestHeader],
		"unknown op":      gvwire.FileRequest{Op: 9, N: 10, Path: "/x"}.Encode(),
		"zero op":         gvwire.FileRequest{Op: 0, N: 10, Path: "/x"}.Encode(),
		"negative bound":  gvwire.FileRequest{Op: gvwire.FileRead, N: -1, Path: "/x"}.Encode(),
		"negative offset": gvwire.FileRequest{Op: gvwire.FileRange, Offset: -5, N: 1, Path: "/x"}.Encode(),
		"relative":        gvwire.FileRequest{Op: gvwire.FileRead, N: 1, Path: "x"}.Encode(),
		"NUL":             gvwire.FileRequest{Op: gvwire.FileRead, N: 1, Path: "/a\x00b"}.Encode(),
		"too long":        gvwire.FileRequest{Op: gvwire.FileRead, N: 1, Path: "/" + strings.Repeat("x", backend.MaxGuestPathLen)}.Encode(),
	} {
		if _, err := gvwire.DecodeFileRequest(buf); !errors.Is(err, gvwire.ErrBadFrame) {
			t.Errorf("%s: err = %v, want ErrBadFrame", name, err)
		}
	}
}

// TestFileDoneCarriesTheError: what init's hostfs said comes out of the
// daemon as the same sentinel, the size of a file too large, the errno of
// an open.
func TestFileDoneCarriesTheError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error
	}{
		{fmt.Errorf("%w: \"/x\" is a FIFO", backend.ErrBadPath), backend.ErrBadPath},
		{fmt.Errorf("%w: gone", backend.ErrPathNotFound), backend.ErrPathNotFound},
		{fmt.Errorf("%w: dir", backend.ErrIsDirectory), backend.ErrIsDirectory},
		{fmt.Errorf("%w: file", backend.ErrNotDirectory), backend.ErrNotDirectory},
		{fmt.Errorf("%w: many", backend.ErrTooManyEntries), backend.ErrTooManyEntries},
		{fmt.Errorf("%w: bad", backend.ErrInvalidArgument), backend.ErrInvalidArgument},
		{errors.New("EIO somewhere"), backend.ErrUnavailable},
	} {
		d, err := gvwire.DecodeFileDone(gvwire.FileDoneOf(3, tc.err).Encode())
		if err != nil {
			t.Fatal(err)
		}
		got := doneError("p", d, 10)
		if !errors.Is(got, tc.want) || d.Seq != 3 {
			t.Errorf("%v came back as %v (seq %d), want %v", tc.err, got, d.Seq, tc.want)
		}
		if strings.Count(got.Error(), tc.want.Error()) != 1 {
			t.Errorf("the sentinel's words twice or never: %v", got)
		}
	}
	d, _ := gvwire.DecodeFileDone(gvwire.FileDoneOf(1, &backend.FileTooLargeError{Path: "/dev/zero", Size: 4097, MaxBytes: 4096}).Encode())
	var tl *backend.FileTooLargeError
	if err := doneError("zero", d, 4096); !errors.As(err, &tl) || tl.Size != 4097 || tl.MaxBytes != 4096 || tl.Path != "zero" {
		t.Errorf("too large came back as %v", err)
	}
	d, _ = gvwire.DecodeFileDone(gvwire.FileDone{Seq: 1, Code: gvwire.FileErrno, Errno: uint32(syscall.EACCES)}.Encode())
	if err := doneError("/etc/shadow", d, 1); !errors.Is(err, backend.ErrBadPath) || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("EACCES came back as %v", err)
	}
	if _, err := gvwire.DecodeFileDone(gvwire.FileDone{Code: 99}.Encode()); !errors.Is(err, gvwire.ErrBadFrame) {
		t.Errorf("an unknown code: %v", err)
	}
	if _, err := gvwire.DecodeFileDone(make([]byte, gvwire.FileDoneHeader-1)); !errors.Is(err, gvwire.ErrBadFrame) {
		t.Errorf("a short done: %v", err)
	}
}

func TestEntriesRoundTrip(t *testing.T) {
	want := []backend.DirEntry{{Name: "a", IsDir: true}, {Name: "new\nline"}, {Name: strings.Repeat("n", 255)}}
	var b []byte
	for _, e := range want {
		b = gvwire.AppendEntry(b, e)
	}
	if int64(len(b)) > gvwire.EntryBytes(len(want)) {
		t.Errorf("%d bytes for %d entries, more than entryBytes", len(b), len(want))
	}
	got, err := gvwire.DecodeEntries(b, 3)
	if err != nil || len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for name, buf := range map[string][]byte{
		"one too many": b,
		"truncated":    b[:len(b)-1],
		"bad dir byte": append([]byte{2}, b[1:]...),
		"empty name":   {0, 0, 0},
		"slash":        gvwire.AppendEntry(nil, backend.DirEntry{Name: "a/b"}),
	} {
		max := 3
		if name == "one too many" {
			max = 2
		}
		if _, err := gvwire.DecodeEntries(buf, max); !errors.Is(err, gvwire.ErrBadFrame) {
			t.Errorf("%s: %v, want ErrBadFrame", name, err)
		}
	}
}

func FuzzDecodeFileFrames(f *testing.F) {
	f.Add(gvwire.FileRequest{Op: gvwire.FileRead, N: 1, Path: "/x"}.Encode())
	f.Add(gvwire.FileDone{Code: gvwire.FileTooLarge, Size: 5}.Encode())
	f.Add(gvwire.AppendEntry(nil, backend.DirEntry{Name: "x"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := gvwire.DecodeFileRequest(b); err == nil {
			if again, err := gvwire.DecodeFileRequest(r.Encode()); err != nil || again != r {
				t.Fatalf("request not stable: %+v %v", again, err)
			}
		}
		if d, err := gvwire.DecodeFileDone(b); err == nil && (d.Code > gvwire.FileFailed || d.Size < 0) {
			t.Fatalf("accepted %+v", d)
		}
		if es, err := gvwire.DecodeEntries(b, 10); err == nil && len(es) > 10 {
			t.Fatalf("%d entries past the bound", len(es))
		}
	})
}

// TestFileFramesReachOnlyTheirOp: the reader gives a file op the data and
// the end of its own seq, drops another seq's (an op that timed out), and
// refuses more data than the op asked for.
func TestFileFramesReachOnlyTheirOp(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	toR, toW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer toR.Close()
	defer toW.Close()
	c := &initConn{fromInit: r, toInit: toW, dead: make(chan struct{}), lstated: make(chan [2]uint32, 1)}
	go c.readLoop()
	// A fake init: answers each op with a stale frame, then its own.
	go func() {
		for {
			kind, payload, err := gvwire.ReadFrame(toR, 1<<gvwire.KindFileOp)
			if err != nil || kind != gvwire.KindFileOp {
				return
			}
			req, _ := gvwire.DecodeFileRequest(payload)
			data := func(seq uint32, p string) []byte { return append(binary.LittleEndian.AppendUint32(nil, seq), p...) }
			var out bytes.Buffer
			_ = gvwire.WriteFrame(&out, gvwire.KindFileData, data(req.Seq-1, "stale"))
			_ = gvwire.WriteFrame(&out, gvwire.KindFileDone, gvwire.FileDone{Seq: req.Seq - 1, Code: gvwire.FileOK}.Encode())
			_ = gvwire.WriteFrame(&out, gvwire.KindFileData, data(req.Seq, "fresh"))
			if req.Path == "/big" {
				_ = gvwire.WriteFrame(&out, gvwire.KindFileData, data(req.Seq, strings.Repeat("x", 100)))
			}
			_ = gvwire.WriteFrame(&out, gvwire.KindFileDone, gvwire.FileDone{Seq: req.Seq, Code: gvwire.FileOK, Size: 5}.Encode())
			if _, err := w.Write(out.Bytes()); err != nil {
				return
			}
		}
	}()
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		data, d, err := c.fileOp(ctx, gvwire.FileRequest{Op: gvwire.FileRead, N: 10, Path: "/x"}, 10)
		if err != nil || string(data) != "fresh" || d.Size != 5 {
			t.Fatalf("op %d: %q, %+v, %v; want only its own answer", i, data, d, err)
		}
	}
	if _, _, err := c.fileOp(ctx, gvwire.FileRequest{Op: gvwire.FileRead, N: 10, Path: "/big"}, 10); !errors.Is(err, gvwire.ErrBadFrame) {
		t.Errorf("an answer past the op's limit: %v, want ErrBadFrame", err)
	}
	w.Close()
	select {
	case <-c.dead:
	case <-time.After(5 * time.Second):
		t.Fatal("the reader did not end")
	}
	if _, _, err := c.fileOp(ctx, gvwire.FileRequest{Op: gvwire.FileRead, N: 10, Path: "/x"}, 10); err == nil {
		t.Error("a file op on a dead init succeeded")
	}
}
