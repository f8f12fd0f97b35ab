package proclog

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// streamByte is the byte at absolute offset o of the tests' streams.
func streamByte(o int64) byte { return byte(o % 251) }

func stream(from, n int64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = streamByte(from + int64(i))
	}
	return b
}

func newLog(t *testing.T, capBytes int64) (*os.File, *Writer) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "log"), os.O_RDWR|os.O_CREATE, 0o600)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	require.NoError(t, Create(f, capBytes))
	w, err := OpenWriter(f)
	require.NoError(t, err)
	return f, w
}

func TestLogKeepsTheLastCapBytesAtAbsoluteOffsets(t *testing.T) {
	f, w := newLog(t, MinCap)
	r, err := ReadAt(f, 0, 100)
	require.NoError(t, err)
	assert.Equal(t, Read{Offset: 0, Written: 0}, r, "an empty log")

	// Writes of every size, some larger than the ring, some wrapping it.
	var at int64
	for _, n := range []int64{10, 4000, 200, 9000, 1, 4096, 3000} {
		_, _ = w.Write(stream(at, n))
		at += n
		require.NoError(t, w.Err())
	}
	assert.Equal(t, at, w.Written())
	fi, err := f.Stat()
	require.NoError(t, err)
	assert.LessOrEqual(t, fi.Size(), int64(HeaderSize+MinCap), "the file never grows past its ring")

	oldest := at - MinCap
	r, err = ReadAt(f, 0, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, oldest, r.Offset, "the oldest byte kept")
	assert.Equal(t, oldest, r.Dropped)
	assert.Equal(t, at, r.Written)
	assert.Equal(t, stream(oldest, MinCap), r.Data)

	r, err = ReadAt(f, at-10, 4)
	require.NoError(t, err)
	assert.Equal(t, Read{Data: stream(at-10, 4), Offset: at - 10, Written: at}, r)

	r, err = ReadAt(f, at+5, 4)
	require.NoError(t, err)
	assert.Equal(t, Read{Offset: at + 5, Written: at}, r, "past the end: nothing, at the offset asked")
}

// A writer killed between raising Reserved and raising Committed: the
// bytes it was writing are not the stream's, and whatever its ring write
// overwrote below Reserved - Cap reads as dropped.
func TestLogReaderDropsWhatAWriteUnderWayOverwrites(t *testing.T) {
	f, w := newLog(t, MinCap)
	_, _ = w.Write(stream(0, MinCap))
	// A write of 100 more bytes reserved and under way.
	_, err := f.WriteAt(header{cap: MinCap, committed: MinCap, reserved: MinCap + 100}.encode(), 0)
	require.NoError(t, err)
	_, err = f.WriteAt(bytes.Repeat([]byte{'X'}, 100), HeaderSize)
	require.NoError(t, err)

	r, err := ReadAt(f, 0, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, int64(100), r.Offset, "the first 100 bytes were being overwritten")
	assert.Equal(t, int64(100), r.Dropped)
	assert.Equal(t, int64(MinCap), r.Written, "only committed bytes count")
	assert.Equal(t, stream(100, MinCap-100), r.Data)

	// The next writer starts again from Committed.
	w2, err := OpenWriter(f)
	require.NoError(t, err)
	_, _ = w2.Write(stream(MinCap, 50))
	r, err = ReadAt(f, MinCap, 100)
	require.NoError(t, err)
	assert.Equal(t, stream(MinCap, 50), r.Data)
}

// Reads while a writer runs never return a byte that is not the stream's
// byte at its offset.
func TestLogReadsDuringWritesAreTheStreamsBytes(t *testing.T) {
	f, w := newLog(t, MinCap)
	const total = 8 << 20
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for at := int64(0); at < total; at += 777 {
			_, _ = w.Write(stream(at, 777))
		}
	}()
	rf, err := os.Open(f.Name())
	require.NoError(t, err)
	defer rf.Close()
	next := int64(0)
	for next < total-MinCap {
		r, err := ReadAt(rf, next, 3000)
		require.NoError(t, err)
		if !bytes.Equal(stream(r.Offset, int64(len(r.Data))), r.Data) {
			t.Fatalf("a read at %d returned bytes that are not the stream's", r.Offset)
		}
		next = r.Offset + int64(len(r.Data))
	}
	wg.Wait()
}

func TestLogRefusesWhatIsNotALog(t *testing.T) {
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "log"), os.O_RDWR|os.O_CREATE, 0o600)
	require.NoError(t, err)
	defer f.Close()
	_, err = ReadAt(f, 0, 10)
	assert.ErrorIs(t, err, ErrBadLog)
	_, err = f.WriteAt(header{cap: MinCap, committed: 10, reserved: 5}.encode(), 0)
	require.NoError(t, err)
	_, err = ReadAt(f, 0, 10)
	assert.ErrorIs(t, err, ErrBadLog, "reserved below committed")
	assert.Error(t, Create(f, 10), "a ring smaller than MinCap")
}

func TestExitRecordRoundTripsAndRefusesTornOnes(t *testing.T) {
	x := Exit{How: EndKilled, Code: 9, Timed: TimedKill, OOM: true, StartedNS: 1, EndedNS: 2, StdoutBytes: 3, StderrBytes: 4}
	got, err := DecodeExit(x.Encode())
	require.NoError(t, err)
	assert.Equal(t, x, got)
	assert.Equal(t, 137, got.ExitCode())
	assert.Equal(t, "timed_out", got.Reason())

	_, err = DecodeExit(nil)
	assert.ErrorIs(t, err, ErrNoExit, "not written yet")
	_, err = DecodeExit(x.Encode()[:20])
	assert.ErrorIs(t, err, ErrNoExit, "half written")
	torn := x.Encode()
	torn[30] ^= 1
	_, err = DecodeExit(torn)
	assert.ErrorIs(t, err, ErrNoExit, "a record whose checksum does not hold is not done")
	bad := Exit{How: 9}.Encode()
	_, err = DecodeExit(bad)
	assert.ErrorIs(t, err, ErrBadLog)

	for _, c := range []struct {
		x      Exit
		code   int
		reason string
	}{
		{Exit{How: EndExited, Code: 3}, 3, "exited"},
		{Exit{How: EndKilled, Code: 15}, 143, "killed"},
		{Exit{How: EndKilled, Code: 9, OOM: true}, 137, "oom_killed"},
		{Exit{How: EndDumped, Code: 11}, 139, "killed"},
		{Exit{How: EndLost}, 137, "killed"},
		{Exit{How: EndKilled, Code: 15, Timed: TimedTerm}, 143, "timed_out"},
	} {
		assert.Equal(t, c.code, c.x.ExitCode(), "%+v", c.x)
		assert.Equal(t, c.reason, c.x.Reason(), "%+v", c.x)
	}
}

func FuzzReadAt(f *testing.F) {
	f.Add(header{cap: MinCap, committed: 5, reserved: 5}.encode(), int64(0), 10)
	f.Add([]byte("SCLOG001"), int64(3), 1)
	f.Fuzz(func(t *testing.T, head []byte, offset int64, maxBytes int) {
		if maxBytes > 1<<16 || offset < 0 {
			return
		}
		p := filepath.Join(t.TempDir(), "log")
		require.NoError(t, os.WriteFile(p, head, 0o600))
		lf, err := os.Open(p)
		require.NoError(t, err)
		defer lf.Close()
		r, err := ReadAt(lf, offset, maxBytes)
		if err != nil {
			return
		}
		if len(r.Data) > max(maxBytes, 0) || r.Offset < offset || r.Offset+int64(len(r.Data)) > max(r.Written, offset) {
			t.Fatalf("read %+v for offset %d max %d", r, offset, maxBytes)
		}
	})
}
