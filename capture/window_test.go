package capture

import (
	"bytes"
	"context"
	"testing"
	"time"
)

func TestWindowCoalescesAndBounds(t *testing.T) {
	w := NewWindow(128 << 10)
	for range 1000 {
		w.Write(Stdout, []byte("line\n"))
	}
	w.Write(Stderr, []byte("err"))
	ctx := context.Background()
	s, d, ok := w.Next(ctx)
	if !ok || s != Stdout || len(d) != 5000 {
		t.Fatalf("first chunk: %v %d %v; want 1000 small writes coalesced into one stdout chunk", s, len(d), ok)
	}
	if s, d, ok = w.Next(ctx); !ok || s != Stderr || string(d) != "err" {
		t.Fatalf("second chunk: %v %q %v", s, d, ok)
	}
	// A consumer that stops taking: the window holds its limit, no more.
	big := bytes.Repeat([]byte("x"), 1<<20)
	for range 10 {
		w.Write(Stdout, big)
	}
	if w.held > w.limit {
		t.Fatalf("held %d bytes past the %d limit", w.held, w.limit)
	}
	out, errb := w.Dropped()
	if out != 10<<20-128<<10 || errb != 0 {
		t.Errorf("Dropped = %d, %d; want everything past the window counted", out, errb)
	}
	var got int
	w.Close()
	for {
		_, d, ok := w.Next(ctx)
		if !ok {
			break
		}
		if len(d) > maxChunk {
			t.Fatalf("a chunk of %d bytes, past %d", len(d), maxChunk)
		}
		got += len(d)
	}
	if got != 128<<10 {
		t.Errorf("drained %d bytes after Close, want the window's %d", got, 128<<10)
	}
	w.Write(Stdout, []byte("late"))
	if out, _ := w.Dropped(); out != 10<<20-128<<10+4 {
		t.Errorf("a write after Close is not counted as dropped: %d", out)
	}
}

func TestWindowNextWaitsAndStops(t *testing.T) {
	w := NewWindow(0)
	go func() { time.Sleep(50 * time.Millisecond); w.Write(Stderr, []byte("late")) }()
	if s, d, ok := w.Next(context.Background()); !ok || s != Stderr || string(d) != "late" {
		t.Fatalf("Next = %v %q %v", s, d, ok)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, _, ok := w.Next(ctx); ok {
		t.Fatal("Next returned a chunk from an empty window")
	}
	w.Write(Stdout, []byte("held"))
	w.Discard()
	if out, _ := w.Dropped(); out != 4 {
		t.Errorf("Discard did not count what it dropped: %d", out)
	}
	if _, _, ok := w.Next(context.Background()); ok {
		t.Fatal("Next after Discard returned a chunk")
	}
}

// Run hands every byte to Output as it is read, and still keeps the tail.
func TestRunOutputSeesEverything(t *testing.T) {
	requireTools(t, "/bin/sh", "head")
	var n [2]int64
	res, err := Run(context.Background(), sh("head -c 3000000 /dev/zero; echo err >&2"), Options{
		Timeout: time.Minute, MaxOutputBytes: 100,
		Output: func(s Stream, p []byte) { n[s] += int64(len(p)) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if n[Stdout] != 3000000 || n[Stderr] != 4 || !res.StdoutTruncated || len(res.Stdout) != 100 {
		t.Errorf("Output saw %v bytes; result kept %d (truncated %v)", n, len(res.Stdout), res.StdoutTruncated)
	}
}
