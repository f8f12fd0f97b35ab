package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

func TestStreamedOutputArrivesAsItComes(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	id := create(t, c, nil)
	var mu sync.Mutex
	var arrivals []time.Duration
	var got strings.Builder
	start := time.Now()
	var res api.RunCommandResult
	err := c.CallStream(context.Background(), ipc.OpRunCommand, map[string]any{
		"sandbox": id, "command": "for i in 1 2 3 4 5 6 7 8 9 10; do echo line $i; echo err $i >&2; sleep 1; done", "timeout_s": 60, "stream": true,
	}, &res, func(event string, data []byte) {
		mu.Lock()
		defer mu.Unlock()
		if event == "stdout" {
			arrivals = append(arrivals, time.Since(start))
			got.Write(data)
		}
	})
	took := time.Since(start)
	require.NoError(t, err)
	want := ""
	for i := 1; i <= 10; i++ {
		want += fmt.Sprintf("line %d\n", i)
	}
	assert.Equal(t, want, got.String(), "every line streamed, in order")
	assert.Equal(t, want, string(res.Stdout), "the final response still carries the output")
	require.NotNil(t, res.StdoutStreamDropped)
	assert.Zero(t, *res.StdoutStreamDropped)
	require.NotEmpty(t, arrivals)
	t.Logf("a 10 s command: first line after %v, last after %v, answered after %v (%d stdout events)", arrivals[0], arrivals[len(arrivals)-1], took, len(arrivals))
	// The lines came while the command ran, not all at its end.
	assert.Less(t, arrivals[0], took/2, "the first line arrived while the command still ran")
	assert.GreaterOrEqual(t, len(arrivals), 5, "the lines came in several events, as printed")
}

func TestStreamToAClientThatStopsReadingDoesNotGrowTheDaemon(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	id := create(t, c, map[string]any{"ttl_s": 600}) // outlives any connection
	conn, err := net.Dial("unix", d.socket)
	require.NoError(t, err)
	defer conn.Close()
	before := peakRSS(t, d.cmd.Process.Pid)
	// Ask for a streamed flood, then read nothing while it runs.
	require.NoError(t, ipc.WriteFrame(conn, req(t, 1, ipc.OpRunCommand, map[string]any{
		"sandbox": id, "command": "head -c 300000000 /dev/zero; echo; echo THE-END; touch /tmp/done", "timeout_s": 120,
		"max_output_bytes": 65536, "stream": true,
	}), 1<<30))
	eventually(t, 60*time.Second, "the flood to end", func() bool {
		var r struct{}
		return c.Call(context.Background(), ipc.OpReadFile, map[string]any{"sandbox": id, "path": "/tmp/done"}, &r) == nil
	})
	growth := peakRSS(t, d.cmd.Process.Pid) - before
	t.Logf("300 MB streamed to a client that read nothing: daemon peak RSS +%d KiB", growth)
	assert.Less(t, growth, int64(48<<10), "the daemon holds the stream's window, not the output (KiB)")
	assert.Equal(t, "ok", call(t, c, ipc.OpHealth, nil)["status"], "the daemon answers others meanwhile")

	// Now read: the events that fit, then the answer with what was dropped counted.
	var streamed int64
	for {
		m := readFrame(t, conn)
		if ev, ok := m["event"].(string); ok {
			require.Equal(t, "stdout", ev)
			streamed += int64(len(m["data"].([]byte)))
			continue
		}
		require.Equal(t, true, m["ok"], "%v", m)
		r := m["result"].(map[string]any)
		dropped := toInt64(r["stdout_stream_dropped"])
		t.Logf("streamed %d bytes, dropped %d", streamed, dropped)
		assert.EqualValues(t, 300000000+9, streamed+dropped, "every byte was either streamed or counted as dropped")
		assert.Greater(t, dropped, int64(0))
		assert.Equal(t, true, r["stdout_truncated"])
		assert.True(t, strings.HasSuffix(string(r["stdout"].([]byte)), "THE-END\n"), "the final tail is whole")
		break
	}
}

func toInt64(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case uint64:
		return int64(n)
	case int8:
		return int64(n)
	case int16:
		return int64(n)
	case int32:
		return int64(n)
	case uint8:
		return int64(n)
	case uint16:
		return int64(n)
	case uint32:
		return int64(n)
	}
	return -1
}

func TestA1GiBFloodStreamsAtCaptureSpeed(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	id := create(t, c, nil)
	const flood = "head -c 1073741824 /dev/zero"
	args := map[string]any{"sandbox": id, "command": flood, "timeout_s": 300, "max_output_bytes": 65536}
	start := time.Now()
	var plain api.RunCommandResult
	require.NoError(t, c.Call(context.Background(), ipc.OpRunCommand, args, &plain))
	plainTook := time.Since(start)

	args["stream"] = true
	var streamed int64
	var res api.RunCommandResult
	start = time.Now()
	require.NoError(t, c.CallStream(context.Background(), ipc.OpRunCommand, args, &res, func(_ string, data []byte) {
		streamed += int64(len(data))
	}))
	streamTook := time.Since(start)
	require.NotNil(t, res.StdoutStreamDropped)
	t.Logf("1 GiB: %v without a stream, %v streamed (ratio %.2f; the machine is shared); %d bytes streamed, %d dropped",
		plainTook, streamTook, streamTook.Seconds()/plainTook.Seconds(), streamed, *res.StdoutStreamDropped)
	assert.EqualValues(t, 1<<30, streamed+*res.StdoutStreamDropped, "every byte streamed or counted")
	assert.True(t, res.StdoutTruncated)
	assert.Equal(t, 0, res.ExitCode)
}
