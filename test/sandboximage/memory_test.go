package sandboximage

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// cell runs code in sandbox's default code context and returns its value
// (text/plain), failing t on an exception.
func cell(t *testing.T, c *ipc.Client, sandbox, code string) string {
	t.Helper()
	res, err := c.RunCode(ctxT(t, 3*time.Minute), api.RunCodeRequest{Sandbox: sandbox, Code: code, TimeoutS: 120})
	require.NoError(t, err)
	require.Nil(t, res.Error, "cell %q: %+v; stderr: %s", code, res.Error, res.Stderr)
	require.NotEmpty(t, res.Results, "cell %q has no value", code)
	v, _ := res.Results[len(res.Results)-1]["text/plain"].(string)
	return v
}

// TestGVisorMemorySnapshotOfAnImageSandbox: a gVisor sandbox on an
// imported image (the numpy image) whose code context holds a variable
// and numpy, imported and seeded, is snapshotted with its memory. Its
// base image can go (the snapshot's root is its own); a sandbox created
// from the snapshot has the context as it was (the variable, numpy in
// memory) with numpy's generator reseeded (it draws apart from the
// source and from a second sandbox of the snapshot), the restored marker,
// and the source's files; the snapshot is refused removal while in use;
// and a memory snapshot of a restored sandbox, paused, on the snapshot
// image, works in turn.
func TestGVisorMemorySnapshotOfAnImageSandbox(t *testing.T) {
	requireSlow(t)
	d := startDaemon(t, "", "--backend", "gvisor", "--gvisor-runsc-path", runscPath(t))
	d.mustCLI(t, "image", "import", numpyRootfs(t), "--name", "numpy")
	c := d.client(t)
	ctx := ctxT(t, 10*time.Minute)

	src, err := c.Create(ctx, api.CreateRequest{Image: "numpy", Spec: &api.Spec{Owner: "dag/prepare"}, TTLS: 900})
	require.NoError(t, err)
	res := sh(t, c, src.Sandbox, "echo prepared > /workspace/data.txt")
	require.Equal(t, 0, res.ExitCode, "%s", res.Stderr)
	assert.Equal(t, "'1.0'", cell(t, c, src.Sandbox, "import numpy as np\nanswer = 41\nnp.random.seed(7)\nstr(np.float64(1.0))"))

	start := time.Now()
	snap, err := c.Snapshot(ctx, api.SnapshotRequest{Sandbox: src.Sandbox, Name: "analytics", Memory: true})
	require.NoError(t, err, "a memory snapshot of a sandbox on an imported image")
	t.Logf("numbers: memory snapshot of a numpy sandbox on an imported image: %s, %d bytes in %d files",
		time.Since(start).Round(time.Millisecond), snap.SizeBytes, snap.Files)
	assert.Equal(t, "numpy", snap.BaseImage)
	info := imageByName(t, d, "analytics")
	assert.True(t, info.Memory, "image ls does not say the snapshot has memory: %+v", info)
	require.NotNil(t, info.Origin)
	assert.Equal(t, "numpy", info.Origin.BaseImage)

	// The source goes on unrestored: its generator draws what seed 7 gives.
	seeded := cell(t, c, src.Sandbox, "float(np.random.random())")
	assert.Equal(t, "False", cell(t, c, src.Sandbox, "import os\nos.path.exists('/tmp/.sandbox-restored')"))

	// The base image goes (once its sandbox is gone): the snapshot needs
	// nothing of it.
	require.NoError(t, c.Destroy(ctx, src.Sandbox))
	_, err = c.ImageRemove(ctx, "numpy")
	require.NoError(t, err, "the base image of a memory snapshot")

	var draws []string
	var froms []string
	for range 2 {
		from, err := c.Create(ctx, api.CreateRequest{Image: "analytics", Spec: &api.Spec{Owner: "dag/analyse"}, TTLS: 900})
		require.NoError(t, err, "a create from the memory snapshot of an image sandbox")
		froms = append(froms, from.Sandbox)
		assert.Equal(t, "(41, 'numpy')", cell(t, c, from.Sandbox, "(answer, np.__name__)"), "the context's state came back")
		draws = append(draws, cell(t, c, from.Sandbox, "float(np.random.random())"))
		var marker struct {
			From string `json:"from"`
		}
		res = sh(t, c, from.Sandbox, "cat /tmp/.sandbox-restored /workspace/data.txt")
		require.Equal(t, 0, res.ExitCode, "%s", res.Stderr)
		lines := strings.SplitN(string(res.Stdout), "\n", 2)
		require.NoError(t, json.Unmarshal([]byte(lines[0]), &marker), "%s", res.Stdout)
		assert.Equal(t, src.Sandbox, marker.From)
		assert.Equal(t, "prepared\n", lines[1])
	}
	assert.NotEqual(t, seeded, draws[0], "the restored context's numpy draws what the source's did: not reseeded")
	assert.NotEqual(t, draws[0], draws[1], "two sandboxes of the snapshot draw the same: not reseeded")

	// In use: not removable.
	_, err = c.ImageRemove(ctx, "analytics")
	var we *ipc.Error
	require.True(t, errors.As(err, &we), "%v", err)
	assert.Equal(t, ipc.CodeImageInUse, we.Code, "%v", we)

	// A sandbox of the snapshot, paused (its checkpoint is the memory),
	// snapshots with memory in turn.
	cell(t, c, froms[0], "answer += 1\nanswer")
	_, err = c.Pause(ctx, froms[0])
	require.NoError(t, err)
	_, err = c.Snapshot(ctx, api.SnapshotRequest{Sandbox: froms[0], Name: "analytics-2", Memory: true})
	require.NoError(t, err, "a memory snapshot of a paused sandbox on a memory snapshot")
	again, err := c.Create(ctx, api.CreateRequest{Image: "analytics-2", TTLS: 900})
	require.NoError(t, err)
	assert.Equal(t, "42", cell(t, c, again.Sandbox, "answer"))
	if t.Failed() {
		t.Logf("daemon log:\n%s", d.proc.Logs())
	}
}
