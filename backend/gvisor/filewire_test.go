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
)

func TestFileRequestRoundTrip(t *testing.T) {
	for _, r := range []fileRequest{
		{seq: 7, op: fileRead, n: 1 << 20, path: "/etc/os-release"},
		{seq: 1 << 31, op: fileRange, offset: 1 << 40, n: 4096, path: "/workspace/x"},
		{seq: 0, op: fileList, n: 10000, path: "/"},
	} {
		if got, err := decodeFileRequest(r.encode()); err != nil || got != r {
			t.Errorf("round trip of %+v: %+v, %v", r, got, err)
		}
	}
}

func TestDecodeFileRequestRefuses(t *testing.T) {
	good := fileRequest{op: fileRead, n: 10, path: "/x"}
	for name, buf := range map[string][]byte{
		"empty":           nil,
		"short":           good.encode()[:fileRequestHeader-1],
		"no path":         good.encode()[:fileRequestHeader],
		"unknown op":      fileRequest{op: 9, n: 10, path: "/x"}.encode(),
		"zero op":         fileRequest{op: 0, n: 10, path: "/x"}.encode(),
		"negative bound":  fileRequest{op: fileRead, n: -1, path: "/x"}.encode(),
		"negative offset": fileRequest{op: fileRange, offset: -5, n: 1, path: "/x"}.encode(),
		"relative":        fileRequest{op: fileRead, n: 1, path: "x"}.encode(),
		"NUL":             fileRequest{op: fileRead, n: 1, path: "/a\x00b"}.encode(),
		"too long":        fileRequest{op: fileRead, n: 1, path: "/" + strings.Repeat("x", backend.MaxGuestPathLen)}.encode(),
	} {
		if _, err := decodeFileRequest(buf); !errors.Is(err, errBadFrame) {
			t.Errorf("%s: err = %v, want errBadFrame", name, err)
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
		d, err := decodeFileDone(fileDoneOf(3, tc.err).encode())
		if err != nil {
			t.Fatal(err)
		}
		got := doneError("p", d, 10)
		if !errors.Is(got, tc.want) || d.seq != 3 {
			t.Errorf("%v came back as %v (seq %d), want %v", tc.err, got, d.seq, tc.want)
		}
		if strings.Count(got.Error(), tc.want.Error()) != 1 {
			t.Errorf("the sentinel's words twice or never: %v", got)
		}
	}
	d, _ := decodeFileDone(fileDoneOf(1, &backend.FileTooLargeError{Path: "/dev/zero", Size: 4097, MaxBytes: 4096}).encode())
	var tl *backend.FileTooLargeError
	if err := doneError("zero", d, 4096); !errors.As(err, &tl) || tl.Size != 4097 || tl.MaxBytes != 4096 || tl.Path != "zero" {
		t.Errorf("too large came back as %v", err)
	}
	d, _ = decodeFileDone(fileDone{seq: 1, code: fileErrno, errno: uint32(syscall.EACCES)}.encode())
	if err := doneError("/etc/shadow", d, 1); !errors.Is(err, backend.ErrBadPath) || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("EACCES came back as %v", err)
	}
	if _, err := decodeFileDone(fileDone{code: 99}.encode()); !errors.Is(err, errBadFrame) {
		t.Errorf("an unknown code: %v", err)
	}
	if _, err := decodeFileDone(make([]byte, fileDoneHeader-1)); !errors.Is(err, errBadFrame) {
		t.Errorf("a short done: %v", err)
	}
}

func TestEntriesRoundTrip(t *testing.T) {
	want := []backend.DirEntry{{Name: "a", IsDir: true}, {Name: "new\nline"}, {Name: strings.Repeat("n", 255)}}
	var b []byte
	for _, e := range want {
		b = appendEntry(b, e)
	}
	if int64(len(b)) > entryBytes(len(want)) {
		t.Errorf("%d bytes for %d entries, more than entryBytes", len(b), len(want))
	}
	got, err := decodeEntries(b, 3)
	if err != nil || len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for name, buf := range map[string][]byte{
		"one too many": b,
		"truncated":    b[:len(b)-1],
		"bad dir byte": append([]byte{2}, b[1:]...),
		"empty name":   {0, 0, 0},
		"slash":        appendEntry(nil, backend.DirEntry{Name: "a/b"}),
	} {
		max := 3
		if name == "one too many" {
			max = 2
		}
		if _, err := decodeEntries(buf, max); !errors.Is(err, errBadFrame) {
			t.Errorf("%s: %v, want errBadFrame", name, err)
		}
	}
}

func FuzzDecodeFileFrames(f *testing.F) {
	f.Add(fileRequest{op: fileRead, n: 1, path: "/x"}.encode())
	f.Add(fileDone{code: fileTooLarge, size: 5}.encode())
	f.Add(appendEntry(nil, backend.DirEntry{Name: "x"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := decodeFileRequest(b); err == nil {
			if again, err := decodeFileRequest(r.encode()); err != nil || again != r {
				t.Fatalf("request not stable: %+v %v", again, err)
			}
		}
		if d, err := decodeFileDone(b); err == nil && (d.code > fileFailed || d.size < 0) {
			t.Fatalf("accepted %+v", d)
		}
		if es, err := decodeEntries(b, 10); err == nil && len(es) > 10 {
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
			kind, payload, err := readFrame(toR, 1<<kindFileOp)
			if err != nil || kind != kindFileOp {
				return
			}
			req, _ := decodeFileRequest(payload)
			data := func(seq uint32, p string) []byte { return append(binary.LittleEndian.AppendUint32(nil, seq), p...) }
			var out bytes.Buffer
			_ = writeFrame(&out, kindFileData, data(req.seq-1, "stale"))
			_ = writeFrame(&out, kindFileDone, fileDone{seq: req.seq - 1, code: fileOK}.encode())
			_ = writeFrame(&out, kindFileData, data(req.seq, "fresh"))
			if req.path == "/big" {
				_ = writeFrame(&out, kindFileData, data(req.seq, strings.Repeat("x", 100)))
			}
			_ = writeFrame(&out, kindFileDone, fileDone{seq: req.seq, code: fileOK, size: 5}.encode())
			if _, err := w.Write(out.Bytes()); err != nil {
				return
			}
		}
	}()
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		data, d, err := c.fileOp(ctx, fileRequest{op: fileRead, n: 10, path: "/x"}, 10)
		if err != nil || string(data) != "fresh" || d.size != 5 {
			t.Fatalf("op %d: %q, %+v, %v; want only its own answer", i, data, d, err)
		}
	}
	if _, _, err := c.fileOp(ctx, fileRequest{op: fileRead, n: 10, path: "/big"}, 10); !errors.Is(err, errBadFrame) {
		t.Errorf("an answer past the op's limit: %v, want errBadFrame", err)
	}
	w.Close()
	select {
	case <-c.dead:
	case <-time.After(5 * time.Second):
		t.Fatal("the reader did not end")
	}
	if _, _, err := c.fileOp(ctx, fileRequest{op: fileRead, n: 10, path: "/x"}, 10); err == nil {
		t.Error("a file op on a dead init succeeded")
	}
}
