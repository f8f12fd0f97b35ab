package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
)

// pattern is size bytes that no two offsets of a piece boundary share, so
// a piece put in the wrong place changes the checksum.
func pattern(size int) []byte {
	b := make([]byte, size)
	var x uint32 = 2463534242
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

func TestFilesLargerThanAFrameMoveInPieces(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	id := create(t, c, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	const size = 100 << 20 // past the frame limit, and past what a piece may hold many times over
	data := pattern(size)
	sum := sha256.Sum256(data)
	before := peakRSS(t, d.cmd.Process.Pid)
	n, err := c.ImportFile(ctx, id, "in/big.bin", bytes.NewReader(data), 0o600, 0)
	require.NoError(t, err)
	require.EqualValues(t, size, n)
	afterImport := peakRSS(t, d.cmd.Process.Pid)
	t.Logf("import: daemon peak RSS %d KiB -> %d KiB", before, afterImport)
	res := run(t, c, id, "sha256sum in/big.bin && stat -c %a in/big.bin")
	assert.Equal(t, hex.EncodeToString(sum[:])+"  in/big.bin\n600\n", string(res.Stdout), "the sandbox sees the file whole, with its mode")

	h := sha256.New()
	n, err = c.ExportFile(ctx, id, "in/big.bin", h, size, 0)
	require.NoError(t, err)
	assert.EqualValues(t, size, n)
	assert.Equal(t, sum[:], h.Sum(nil), "exported bytes match")
	growth := peakRSS(t, d.cmd.Process.Pid) - before
	t.Logf("100 MiB in and out in %d KiB pieces: daemon peak RSS +%d KiB", ipc.DefaultPieceBytes>>10, growth)
	assert.Less(t, growth, int64(48<<10), "the daemon holds a piece at a time, never the 100 MiB file (KiB)")

	// A budget smaller than the file: refused before a byte is written.
	var dest bytes.Buffer
	_, err = c.ExportFile(ctx, id, "in/big.bin", &dest, size-1, 0)
	var e *ipc.Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, ipc.CodeFileTooLarge, e.Code)
	assert.EqualValues(t, size, e.Details["size_bytes"])
	assert.Zero(t, dest.Len())

	run(t, c, id, "mkdir -p dir && mkfifo fifo")
	for path, code := range map[string]string{"dir": ipc.CodeIsDirectory, "fifo": ipc.CodeBadPath, "missing": ipc.CodePathNotFound, "/dev/zero": ipc.CodeBadPath, "/etc/shadow": ipc.CodePathNotFound} {
		_, err = c.ExportFile(ctx, id, path, io.Discard, 1<<20, 0)
		require.ErrorAs(t, err, &e, path)
		assert.Equal(t, code, e.Code, path)
	}
}

// appendOnWrite grows the exported file through the daemon the first time
// the export writes to it: a file changing under an export, deterministically.
type appendOnWrite struct {
	c       *ipc.Client
	id      string
	grown   bool
	growErr error
}

func (w *appendOnWrite) Write(p []byte) (int, error) {
	if !w.grown {
		w.grown = true
		w.growErr = w.c.Call(context.Background(), ipc.OpWriteFile, map[string]any{"sandbox": w.id, "path": "grow", "data": []byte("more"), "append": true}, nil)
	}
	return len(p), nil
}

func TestExportOfAFileThatChangesFails(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	id := create(t, c, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	call(t, c, ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "grow", "data": pattern(3 << 20)})
	w := &appendOnWrite{c: c, id: id}
	_, err := c.ExportFile(ctx, id, "grow", w, 8<<20, 1<<20)
	require.NoError(t, w.growErr)
	assert.True(t, errors.Is(err, ipc.ErrFileChanged), "got %v", err)

	// Grown past the budget meanwhile: too large, not merely changed.
	call(t, c, ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "grow", "data": pattern(3 << 20)})
	w = &appendOnWrite{c: c, id: id}
	_, err = c.ExportFile(ctx, id, "grow", w, 3<<20+2, 1<<20)
	assert.True(t, ipc.IsCode(err, ipc.CodeFileTooLarge), "got %v", err)
}

func TestRangedArgumentsAreChecked(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	id := create(t, c, nil)
	call(t, c, ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "f", "data": []byte("0123456789")})
	got := call(t, c, ipc.OpReadFile, map[string]any{"sandbox": id, "path": "f", "offset": 3, "length": 4})
	assert.Equal(t, []byte("3456"), got["data"])
	assert.EqualValues(t, 10, got["size_bytes"])
	assert.Equal(t, false, got["eof"])
	got = call(t, c, ipc.OpReadFile, map[string]any{"sandbox": id, "path": "f", "offset": 8})
	assert.Equal(t, []byte("89"), got["data"])
	assert.Equal(t, true, got["eof"])
	got = call(t, c, ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "f", "data": []byte("ab"), "offset": 2})
	assert.EqualValues(t, 10, got["size_bytes"])
	got = call(t, c, ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "f", "data": []byte("!"), "append": true})
	assert.EqualValues(t, 11, got["size_bytes"])
	assert.Equal(t, []byte("01ab456789!"), call(t, c, ipc.OpReadFile, map[string]any{"sandbox": id, "path": "f"})["data"])

	for name, args := range map[string]map[string]any{
		"max_bytes with a range": {"op": ipc.OpReadFile, "offset": 0, "max_bytes": 10},
		"negative offset":        {"op": ipc.OpReadFile, "offset": -1},
		"append and offset":      {"op": ipc.OpWriteFile, "data": []byte("x"), "append": true, "offset": 0},
		"mode with append":       {"op": ipc.OpWriteFile, "data": []byte("x"), "append": true, "mode": 0o600},
		"offset past the end":    {"op": ipc.OpWriteFile, "data": []byte("x"), "offset": 100},
	} {
		op := args["op"].(string)
		delete(args, "op")
		args["sandbox"], args["path"] = id, "f"
		e := callErr(t, c, op, args)
		assert.Equal(t, ipc.CodeBadRequest, e.Code, "%s: %s", name, e.Message)
	}
}

func TestCLIReadAndWriteFilesLargerThanAFrame(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	id := create(t, c, map[string]any{"ttl_s": 600})
	data := pattern(24 << 20)
	write := exec.Command(daemonBin, "write", id, "big.bin")
	write.Env = append(write.Environ(), "SANDBOX_SIDECAR_SOCKET="+d.socket)
	write.Stdin = bytes.NewReader(data)
	out, err := write.CombinedOutput()
	require.NoError(t, err, "%s", out)
	read := exec.Command(daemonBin, "read", "--max-bytes", "33554432", id, "big.bin")
	read.Env = append(read.Environ(), "SANDBOX_SIDECAR_SOCKET="+d.socket)
	var stderr strings.Builder
	read.Stderr = &stderr
	got, err := read.Output()
	require.NoError(t, err, stderr.String())
	assert.True(t, bytes.Equal(data, got), "read gives back what write put (%d bytes, want %d)", len(got), len(data))
}
