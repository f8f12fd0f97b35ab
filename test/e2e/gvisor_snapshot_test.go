package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// tokenHolder is a durable process whose state is in memory alone: a
// token drawn at its start, kept in a variable and never written until
// asked. Asked (/tmp/ask), it answers in /tmp/answer with the token, 8
// bytes it draws from the kernel then, and whether it sees the restored
// marker. A copy that answers with the token was restored from memory.
const tokenHolder = `import os, time
tok = os.urandom(8).hex()
while True:
    if not os.path.exists("/tmp/ask"):
        time.sleep(0.02)
        continue
    with open("/tmp/answer.tmp", "w") as f:
        f.write("%s %s %s" % (tok, os.urandom(8).hex(), os.path.exists("/tmp/.sandbox-restored")))
    os.rename("/tmp/answer.tmp", "/tmp/answer")
    os.remove("/tmp/ask")
`

// answer is what a tokenHolder says when asked.
type answer struct {
	token, random string
	restored      bool
}

// ask asks sandbox id's tokenHolder for its answer.
func ask(t *testing.T, c *ipc.Client, id string) answer {
	t.Helper()
	res := run(t, c, id, `rm -f /tmp/answer; touch /tmp/ask
for i in $(seq 250); do [ -s /tmp/answer ] && break; sleep 0.1; done; cat /tmp/answer`, "timeout_s", 60)
	f := strings.Fields(string(res.Stdout))
	require.Len(t, f, 3, "%s: the holder did not answer: %q %s", id, res.Stdout, res.Stderr)
	return answer{token: f[0], random: f[1], restored: f[2] == "True"}
}

// startHolder starts a tokenHolder in sandbox id and returns its process.
func startHolder(t *testing.T, c *ipc.Client, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := c.WriteFile(ctx, api.WriteFileRequest{Sandbox: id, Path: "holder.py", Data: []byte(tokenHolder)})
	require.NoError(t, err)
	return call(t, c, ipc.OpStartCommand, map[string]any{"sandbox": id, "command": "exec python3 /workspace/holder.py", "name": "holder"})["process"].(string)
}

// holderRuns checks that sandbox id has process p running.
func holderRuns(t *testing.T, c *ipc.Client, id, p string) {
	t.Helper()
	w := call(t, c, ipc.OpWaitProcess, map[string]any{"sandbox": id, "process": p})
	require.Equal(t, true, w["running"], "%s: the holder is not running: %v", id, w)
}

// urandom is 16 bytes of sandbox id's /dev/urandom, in hex.
func urandom(t *testing.T, c *ipc.Client, id string) string {
	t.Helper()
	return strings.TrimSpace(string(run(t, c, id, "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'").Stdout))
}

// listedByID is list's sandboxes by id.
func listedByID(t *testing.T, c *ipc.Client) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, s := range call(t, c, ipc.OpList, map[string]any{})["sandboxes"].([]any) {
		m := s.(map[string]any)
		out[m["sandbox"].(string)] = m
	}
	return out
}

// A snapshot with memory through the socket on gVisor: the image is
// listed with its origin and its memory, a sandbox created from it has the
// source's durable process with its in-memory token and the restored
// marker (after a restart of the daemon too), its files are its own, and
// image_rm refuses the image while that sandbox runs on it.
func TestGVisorSnapshotWithMemoryThroughTheSocket(t *testing.T) {
	runsc := testRunsc(t)
	d := startDaemon(t, "", "--backend", "gvisor", "--gvisor-runsc-path", runsc)
	c := d.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	hello, err := c.Hello(ctx, api.HelloRequest{})
	require.NoError(t, err)
	require.Contains(t, hello.Features, "snapshots")
	require.Contains(t, hello.Features, "pause")

	src := create(t, c, map[string]any{"spec": map[string]any{"owner": "dag/prepare"}, "ttl_s": 600})
	p := startHolder(t, c, src)
	before := ask(t, c, src)
	require.False(t, before.restored, "the source has a restored marker")

	snap, err := c.Snapshot(ctx, api.SnapshotRequest{Sandbox: src, Name: "prepared", Memory: true})
	require.NoError(t, err)
	assert.Equal(t, "prepared", snap.Image)
	assert.True(t, snap.Frozen, "gVisor holds a snapshot's processes still")
	// A later run starts from it after the daemon restarted.
	c.Close()
	d.stop()
	d.restart()
	c = d.client(t)
	ls, err := c.ImageList(ctx)
	require.NoError(t, err)
	var info *api.ImageInfo
	for i := range ls.Images {
		if ls.Images[i].Name == "prepared" {
			info = &ls.Images[i]
		}
	}
	require.NotNil(t, info, "image_ls: %+v", ls.Images)
	require.NotNil(t, info.Origin, "a snapshot says where it came from")
	assert.Equal(t, src, info.Origin.Sandbox)
	assert.Equal(t, "host", info.Origin.BaseImage)
	assert.True(t, info.Memory, "image_ls does not say the snapshot has memory: %+v", info)

	from := create(t, c, map[string]any{"image": "prepared", "ttl_s": 600})
	holderRuns(t, c, from, p)
	got := ask(t, c, from)
	assert.Equal(t, before.token, got.token, "the restored holder's token is not the source's: its memory was not carried")
	assert.True(t, got.restored, "the restored holder does not see /tmp/.sandbox-restored")
	var marker struct {
		From string `json:"from"`
	}
	require.NoError(t, json.Unmarshal(run(t, c, from, "cat /tmp/.sandbox-restored").Stdout, &marker))
	assert.Equal(t, src, marker.From)
	// Independent: each one's files are its own.
	run(t, c, from, "echo from-copy > copy-only")
	run(t, c, src, "echo from-source > source-only")
	assert.Equal(t, "no\n", string(run(t, c, src, "test -e copy-only && echo yes || echo no").Stdout))
	assert.Equal(t, "no\n", string(run(t, c, from, "test -e source-only && echo yes || echo no").Stdout))
	holderRuns(t, c, src, p)
	assert.Equal(t, before.token, ask(t, c, src).token, "the source's holder lost its token")

	// The CLI's --memory: the same, and image inspect says so.
	out, errOut, code := d.cli(t, "snapshot", src, "prepared-cli", "--memory")
	require.Equal(t, 0, code, "%s", errOut)
	assert.Contains(t, out, "with its processes' memory")
	out, errOut, code = d.cli(t, "image", "inspect", "prepared-cli")
	require.Equal(t, 0, code, "%s", errOut)
	var inspected map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &inspected), "%s", out)
	assert.Equal(t, true, inspected["memory"], "image inspect: %s", out)
	assert.Positive(t, inspected["size_bytes"], "image inspect prints the wire's keys: %s", out)
	require.IsType(t, map[string]any{}, inspected["origin"], "%s", out)
	assert.Equal(t, "host", inspected["origin"].(map[string]any)["base_image"], "%s", out)

	e := callErr(t, c, ipc.OpImageRm, map[string]any{"name": "prepared"})
	assert.Equal(t, ipc.CodeImageInUse, e.Code, "%v", e)
	call(t, c, ipc.OpDestroy, map[string]any{"sandbox": from})
	_, err = c.ImageRemove(ctx, "prepared")
	require.NoError(t, err)
	if t.Failed() {
		t.Logf("daemon log:\n%s", d.Logs())
	}
}

// A fork with memory through the socket on gVisor: two copies, each with
// the source's durable process and its in-memory token, the restored
// marker, their own kernel randomness, workspaces, ids and leases; the
// source runs on unrestored.
func TestGVisorForkWithMemoryThroughTheSocket(t *testing.T) {
	runsc := testRunsc(t)
	d := startDaemon(t, "", "--backend", "gvisor", "--gvisor-runsc-path", runsc)
	c := d.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	src := create(t, c, map[string]any{"spec": map[string]any{"owner": "dag/explore"}, "ttl_s": 600})
	p := startHolder(t, c, src)
	before := ask(t, c, src)

	res, err := c.Fork(ctx, api.ForkRequest{Sandbox: src, Count: 2, Memory: true})
	require.NoError(t, err)
	require.Len(t, res.Sandboxes, 2)
	forks := res.Sandboxes
	require.NotEqual(t, forks[0], forks[1])
	require.NotContains(t, forks, src)

	listed := listedByID(t, c)
	randoms := map[string]string{}
	for _, f := range forks {
		require.Contains(t, listed, f)
		assert.Equal(t, "dag/explore", listed[f]["owner"], "%s: a fork has its source's owner", f)
		assert.Positive(t, listed[f]["expires_at"], "%s: a fork has a lease of its own", f)
		holderRuns(t, c, f, p)
		got := ask(t, c, f)
		assert.Equal(t, before.token, got.token, "%s: the holder's token is not the source's", f)
		assert.True(t, got.restored, "%s: the holder does not see /tmp/.sandbox-restored", f)
		randoms[f] = got.random
		run(t, c, f, "echo "+f+" > mine")
		randoms["urandom-"+f] = urandom(t, c, f)
	}
	// The source runs on, itself.
	holderRuns(t, c, src, p)
	after := ask(t, c, src)
	assert.Equal(t, before.token, after.token)
	assert.False(t, after.restored, "the source has a restored marker")
	randoms[src] = after.random
	randoms["urandom-"+src] = urandom(t, c, src)
	seen := map[string]string{}
	for who, r := range randoms {
		require.NotEmpty(t, r, who)
		if other, ok := seen[r]; ok {
			t.Errorf("%s and %s drew the same randomness %s: not reseeded", who, other, r)
		}
		seen[r] = who
	}
	// Their workspaces are their own.
	for _, id := range append([]string{src}, forks...) {
		out := string(run(t, c, id, "cat mine 2>/dev/null || echo none").Stdout)
		want := "none\n"
		if id != src {
			want = id + "\n"
		}
		assert.Equal(t, want, out, "%s", id)
	}
	// The CLI's fork --memory.
	out, errOut, code := d.cli(t, "fork", src, "1", "--memory")
	require.Equal(t, 0, code, "%s", errOut)
	third := strings.TrimSpace(out)
	got := ask(t, c, third)
	assert.Equal(t, before.token, got.token, "the CLI's fork: the holder's token is not the source's")
	assert.True(t, got.restored)
	call(t, c, ipc.OpDestroy, map[string]any{"sandbox": third})
	// A copy's process killed, the source's and the other's run on.
	call(t, c, ipc.OpSignalProcess, map[string]any{"sandbox": forks[0], "process": p, "signal": "KILL"})
	eventually(t, 30*time.Second, "the killed holder ends", func() bool {
		return call(t, c, ipc.OpWaitProcess, map[string]any{"sandbox": forks[0], "process": p})["running"] == false
	})
	holderRuns(t, c, forks[1], p)
	holderRuns(t, c, src, p)
	call(t, c, ipc.OpDestroy, map[string]any{"sandbox": forks[1]})
	assert.Equal(t, before.token, ask(t, c, src).token)
	if t.Failed() {
		t.Logf("daemon log:\n%s", d.Logs())
	}
}

// bwrap keeps files, not memory: a snapshot or a fork with memory answers
// not_supported and makes nothing; hello names snapshots and pause (the
// latter where the daemon has sandbox cgroups).
func TestBwrapRefusesMemorySnapshotsAndForks(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hello, err := c.Hello(ctx, api.HelloRequest{})
	require.NoError(t, err)
	assert.Contains(t, hello.Features, "snapshots")
	h, err := c.Health(ctx)
	require.NoError(t, err)
	if strings.HasPrefix(h.Limits["pids"], "cgroup") {
		assert.Contains(t, hello.Features, "pause")
	} else {
		assert.NotContains(t, hello.Features, "pause", "no sandbox cgroups, nothing to freeze")
	}
	id := create(t, c, map[string]any{"ttl_s": 600})
	e := callErr(t, c, ipc.OpSnapshot, map[string]any{"sandbox": id, "name": "mem", "memory": true})
	assert.Equal(t, ipc.CodeNotSupported, e.Code, "%v", e)
	e = callErr(t, c, ipc.OpFork, map[string]any{"sandbox": id, "count": 1, "memory": true})
	assert.Equal(t, ipc.CodeNotSupported, e.Code, "%v", e)
	assert.Len(t, listed(t, d), 1, "a refused fork made sandboxes")
	ls, err := c.ImageList(ctx)
	require.NoError(t, err)
	assert.Len(t, ls.Images, 1, "a refused snapshot made an image: %+v", ls.Images)
}
