package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
)

// vmHWM is a process's peak resident set (VmHWM in /proc/<pid>/status).
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/<pid>/status")
	return 0
}

// loggedMemoryBound is the figure the daemon logged at start ("memory
// bound", docs/operations.md).
func loggedMemoryBound(t *testing.T, logs string) int64 {
	t.Helper()
	for _, line := range strings.Split(logs, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["@message"] == "memory bound" {
			return int64(m["bytes"].(float64))
		}
	}
	t.Fatalf("the daemon logged no memory bound:\n%s", logs)
	return 0
}

// The hostile clients, all at once, against the real daemon: frames
// of millions of empty arrays, pipelined reads of an 8 MB file on
// connections that never read, and a connection slot taken everywhere it
// may be. The daemon's peak resident set stays within the bound it computes
// from its configuration (docs/operations.md, "Memory"), and it keeps
// serving.
func TestHostileClientsStayWithinTheMemoryBound(t *testing.T) {
	const (
		maxConns        = 64
		requestBytes    = 64 << 20
		responseBytes   = 64 << 20
		perConnResponse = 32 << 20
	)
	d := startDaemon(t, "", "--max-connections", strconv.Itoa(maxConns), "--max-request-bytes", strconv.Itoa(requestBytes),
		"--max-response-bytes", strconv.Itoa(responseBytes), "--max-response-bytes-per-connection", strconv.Itoa(perConnResponse),
		"--max-connections-per-uid", strconv.Itoa(maxConns))
	bound := loggedMemoryBound(t, d.Logs())
	pid := d.cmd.Process.Pid
	c := d.client(t)
	id := create(t, c, map[string]any{"ttl_s": 600})
	const fileBytes = 8_000_000
	call(t, c, ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "/workspace/big", "data": bytes.Repeat([]byte{'x'}, fileBytes)})
	idle := vmHWM(t, pid)
	t.Logf("bound %d MiB; peak before the attack %d MiB", bound>>20, idle>>20)

	dial := func() net.Conn {
		conn, err := net.Dial("unix", d.socket)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	var wg sync.WaitGroup

	// Three frames of 15 M empty arrays each (on main: ~670 MiB apiece while
	// decoding).
	list := []byte{0x84, 0xa1, 'v', 0x01, 0xa2, 'i', 'd', 0x01, 0xa2, 'o', 'p', 0xa6, 'h', 'e', 'a', 'l', 't', 'h', 0xa4, 'a', 'r', 'g', 's', 0x81, 0xa1, 'a', 0xdd}
	list = binary.BigEndian.AppendUint32(list, 15<<20)
	list = append(list, bytes.Repeat([]byte{0x90}, 15<<20)...)
	for range 3 {
		conn := dial()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := ipc.WriteFrame(conn, list, 1<<30); err != nil {
				t.Errorf("writing the frame: %v", err)
				return
			}
			conn.SetReadDeadline(time.Now().Add(2 * time.Minute))
			body, err := ipc.ReadFrame(conn, ipc.DefaultMaxFrame)
			if err != nil {
				t.Errorf("no answer to the frame of empty arrays: %v", err)
				return
			}
			var m map[string]any
			msgpack.Unmarshal(body, &m)
			e, _ := m["error"].(map[string]any)
			assert.Equal(t, ipc.CodeBadRequest, e["code"], "%v", m)
		}()
	}

	// Four connections, each with 64 pipelined read_file of the 8 MB file,
	// that never read a byte (on main: ~614 MiB apiece for the 30 s write
	// timeout).
	for range 4 {
		conn := dial()
		var frames []byte
		for i := range 64 {
			b, err := msgpack.Marshal(map[string]any{"v": 1, "id": i + 1, "op": ipc.OpReadFile, "args": map[string]any{"sandbox": id, "path": "/workspace/big"}})
			require.NoError(t, err)
			frames = ipc.AppendFrame(frames, b)
		}
		_, err := conn.Write(frames)
		require.NoError(t, err)
	}

	// The rest of the connection slots, each having sent a frame (so the
	// first-frame deadline does not close them).
	for range maxConns - 3 - 4 - 2 {
		conn := dial()
		b, _ := msgpack.Marshal(map[string]any{"v": 1, "id": 1, "op": ipc.OpHealth})
		require.NoError(t, ipc.WriteFrame(conn, b, ipc.DefaultMaxFrame))
	}
	wg.Wait()
	// The reads that fit the response budgets are made; the rest wait.
	time.Sleep(3 * time.Second)

	// Meanwhile the daemon serves others.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var health map[string]any
	require.NoError(t, c.Call(ctx, ipc.OpHealth, nil, &health))
	assert.Equal(t, "ok", health["status"])

	peak := vmHWM(t, pid)
	t.Logf("peak resident set under attack %d MiB (bound %d MiB)", peak>>20, bound>>20)
	assert.LessOrEqual(t, peak, bound, "the daemon's peak resident set passed the bound it computed from its configuration")
}
