package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/hostids"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/image"
	"github.com/sandbox-sidecar/sandbox-sidecar/test/internal/testdaemon"
)

// storeEntries lists what the image store of d holds under images/, tmp/
// and names/ (the debris a half-made image would leave).
func storeEntries(t *testing.T, d *daemon) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, sub := range []string{"images", "tmp", "names"} {
		ents, err := os.ReadDir(filepath.Join(d.stateDir, "images", sub))
		require.NoError(t, err)
		for _, e := range ents {
			out[sub] = append(out[sub], e.Name())
		}
	}
	return out
}

// counter starts a durable process in sandbox id that counts into
// /workspace/n, and returns a reader of its count.
func counter(t *testing.T, c *ipc.Client, id string) func(*ipc.Client) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := c.StartCommand(ctx, api.StartCommandRequest{Sandbox: id, Name: "counter",
		Command: `i=0; while :; do i=$((i+1)); echo $i > n.tmp; mv n.tmp n; sleep 0.01; done`})
	require.NoError(t, err)
	read := func(c *ipc.Client) int {
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			res, err := c.ReadFile(ctx, api.ReadFileRequest{Sandbox: id, Path: "n"})
			cancel()
			if err == nil {
				if n, err := strconv.Atoi(strings.TrimSpace(string(res.Data))); err == nil {
					return n
				}
			}
		}
		t.Fatal("the counter wrote nothing")
		return 0
	}
	read(c)
	return read
}

// TestSnapshotKilledMidwayLeavesTheSandboxAndNoImage kills the daemon at
// the failpoints of a snapshot (its processes frozen; its files copied
// into the store, not yet placed; placed, not yet named) and restarts it:
// the sandbox is as it was (its files, its durable process counting on,
// thawed), the store holds no half image and no debris, and the same
// snapshot then succeeds.
func TestSnapshotKilledMidwayLeavesTheSandboxAndNoImage(t *testing.T) {
	for _, fp := range []string{bwrap.FailSnapshotHeld, image.FailSnapshotCopied, "image-placed"} {
		t.Run(fp, func(t *testing.T) {
			d := startDaemonEnv(t, "", []string{"SANDBOX_SIDECAR_FAILPOINT=" + fp})
			c := d.client(t)
			id := create(t, c, map[string]any{"spec": map[string]any{"owner": "dag/snap"}, "ttl_s": 600})
			run(t, c, id, "echo kept > kept.txt")
			count := counter(t, c, id)
			go c.Call(context.Background(), ipc.OpSnapshot, api.SnapshotRequest{Sandbox: id, Name: "half"}, nil)
			select {
			case <-d.proc.Done():
			case <-time.After(time.Minute):
				t.Fatalf("the daemon did not reach failpoint %s", fp)
			}
			c.Close()
			d.env = nil
			d.restart()
			c = d.client(t)

			ls, err := c.ImageList(context.Background())
			require.NoError(t, err)
			require.Len(t, ls.Images, 1, "only host: %+v", ls.Images)
			assert.Empty(t, storeEntries(t, d), "the store keeps debris of the killed snapshot")
			assert.Equal(t, "kept\n", string(run(t, c, id, "cat kept.txt").Stdout))
			before := count(c)
			eventually(t, 30*time.Second, "the durable process counts on after the restart", func() bool { return count(c) > before })

			snap, err := c.Snapshot(context.Background(), api.SnapshotRequest{Sandbox: id, Name: "half"})
			require.NoError(t, err)
			assert.Equal(t, "half", snap.Image)
			h, err := c.Health(context.Background())
			require.NoError(t, err)
			if strings.HasPrefix(h.Limits["pids"], "cgroup") {
				assert.True(t, snap.Frozen, "a sandbox with a cgroup of its own is frozen for a snapshot")
			} else if os.Getenv("CI") == "true" {
				t.Errorf("CI=true: the daemon has no cgroups (%v), so the frozen hold was not tested", h.Limits)
			}
			if t.Failed() {
				t.Logf("daemon log:\n%s", d.Logs())
			}
		})
	}
}

// TestSnapshotOfAFullDisk fills the state directory's filesystem (a small
// tmpfs) so that a snapshot cannot fit: it answers no_space, keeps nothing
// of the image, and the sandbox is as it was; with room again it works.
func TestSnapshotOfAFullDisk(t *testing.T) {
	requireHost(t)
	base := baseDir(t)
	state := filepath.Join(base, "state")
	require.NoError(t, os.Mkdir(state, 0o755))
	require.NoError(t, unix.Mount("tmpfs", state, "tmpfs", 0, "size=96m,mode=0755"))
	t.Cleanup(func() { _ = unix.Unmount(state, unix.MNT_DETACH) })
	d := startDaemon(t, base)
	c := d.client(t)
	id := create(t, c, map[string]any{"ttl_s": 600})
	res := run(t, c, id, "head -c 30000000 /dev/urandom > big && echo written")
	require.Equal(t, "written\n", string(res.Stdout), "%s", res.Stderr)
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(state, &st))
	free := int64(st.Bavail) * st.Bsize
	filler := filepath.Join(state, "filler")
	f, err := os.Create(filler)
	require.NoError(t, err)
	_, err = f.Write(make([]byte, free-10<<20))
	require.NoError(t, err)
	require.NoError(t, f.Close())

	err = c.Call(context.Background(), ipc.OpSnapshot, api.SnapshotRequest{Sandbox: id, Name: "full"}, nil)
	var we *ipc.Error
	require.ErrorAs(t, err, &we)
	assert.Equal(t, ipc.CodeNoSpace, we.Code, "%v", err)
	assert.Empty(t, storeEntries(t, d), "a snapshot that did not fit left something")
	assert.Equal(t, "30000000\n", string(run(t, c, id, "wc -c < big").Stdout))

	require.NoError(t, os.Remove(filler))
	snap, err := c.Snapshot(context.Background(), api.SnapshotRequest{Sandbox: id, Name: "full"})
	require.NoError(t, err)
	assert.EqualValues(t, 30000000, snap.SizeBytes)
}

// TestForkQuotaIsAllOrNothing: with room for 3 more sandboxes of the uid,
// a fork of 5 makes none and says so; a fork of 3 makes 3, each a copy.
func TestForkQuotaIsAllOrNothing(t *testing.T) {
	d := startDaemon(t, "", "--max-sandboxes-per-uid", "4")
	c := d.client(t)
	id := create(t, c, map[string]any{"spec": map[string]any{"owner": "dag/fork"}, "ttl_s": 600})
	run(t, c, id, "echo from-source > f")
	_, errOut, code := d.cli(t, "fork", id, "5")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errOut, "quota_exceeded")
	assert.Contains(t, errOut, "room for 3")
	assert.Len(t, listed(t, d), 1, "a refused fork made sandboxes")

	out, errOut, code := d.cli(t, "fork", id, "3", "--ttl", "10m")
	require.Equal(t, 0, code, "%s", errOut)
	forks := strings.Fields(out)
	require.Len(t, forks, 3)
	for i, f := range forks {
		assert.Equal(t, "from-source\n", string(run(t, c, f, fmt.Sprintf("cat f; echo %d > f", i)).Stdout))
	}
	assert.Equal(t, "from-source\n", string(run(t, c, id, "cat f").Stdout))
	assert.Len(t, listed(t, d), 4)
	assertConsistent(t, d)
}

// TestNonRootDaemonSnapshotsAndForks: a daemon that is not root (the
// packaged unit: its own user, CAP_SETUID, CAP_SETGID and CAP_KILL) reads a
// sandbox's files with the sandbox's ids, a secret of mode 0600 included,
// and makes a fork's, and a snapshot's sandbox's, files as their own uids.
func TestNonRootDaemonSnapshotsAndForks(t *testing.T) {
	requireHost(t)
	daemonUID := unusedID(t, 61873)
	r := hostids.Range{First: hostids.DefaultFirst + 0xA100, Size: 16}
	base := baseDir(t)
	d := &daemon{t: t, base: base, socket: filepath.Join(base, "run", "sidecar.sock"), stateDir: filepath.Join(base, "state")}
	for _, dir := range []string{filepath.Dir(d.socket), d.stateDir} {
		require.NoError(t, os.Mkdir(dir, 0o700))
		require.NoError(t, os.Chown(dir, daemonUID, daemonUID))
	}
	d.args = testdaemon.NoHostConfig([]string{"serve", "--socket", d.socket, "--state-dir", d.stateDir, "--log-format", "json",
		"--own-uids", "required", "--uid-range-start", fmt.Sprint(r.First), "--uid-range-size", fmt.Sprint(r.Size),
		"--limit-cgroups", "off", "--limit-disk-caps", "off"})
	cmd := exec.Command(daemonBin, d.args...)
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + base, "LANG=C"}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential:  &syscall.Credential{Uid: uint32(daemonUID), Gid: uint32(daemonUID), Groups: []uint32{}},
		AmbientCaps: []uintptr{capSetuid, capSetgid, capKill},
		Setpgid:     true,
		Pdeathsig:   syscall.SIGKILL,
	}
	d.proc = testdaemon.Start(t, cmd, 30*time.Second, nil)
	d.cmd = cmd
	t.Cleanup(func() { killUIDs(r.First, r.Size) })
	t.Cleanup(d.stop)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.Logs())
		}
	})

	c := d.client(t)
	src := create(t, c, map[string]any{"ttl_s": 600})
	res := run(t, c, src, "mkdir -p deep/er && echo secret > deep/er/secret && chmod 600 deep/er/secret && chmod 700 deep && echo tmp > /tmp/t")
	require.Equal(t, 0, res.ExitCode, "%s", res.Stderr)
	snap, err := c.Snapshot(context.Background(), api.SnapshotRequest{Sandbox: src, Name: "nonroot"})
	require.NoError(t, err)
	assert.False(t, snap.Frozen, "no cgroups: not frozen, and it says so")
	fork, err := c.Fork(context.Background(), api.ForkRequest{Sandbox: src, Count: 1})
	require.NoError(t, err)
	from := create(t, c, map[string]any{"ttl_s": 600, "image": "nonroot"})
	for _, id := range []string{fork.Sandboxes[0], from} {
		res = run(t, c, id, "cat deep/er/secret /tmp/t && echo more >> deep/er/secret && id -u")
		assert.Equal(t, "secret\ntmp\n1000\n", string(res.Stdout), "%s: %s", id, res.Stderr)
		var st syscall.Stat_t
		require.NoError(t, syscall.Stat(filepath.Join(d.stateDir, "bwrap", id, "work", "deep", "er", "secret"), &st))
		assert.True(t, r.Contains(st.Uid), "%s: its copy belongs to %d, not a uid of the range", id, st.Uid)
		var srcSt syscall.Stat_t
		require.NoError(t, syscall.Stat(filepath.Join(d.stateDir, "bwrap", src, "work"), &srcSt))
		assert.NotEqual(t, srcSt.Uid, st.Uid, "%s: its files are its source's uid's", id)
	}
}

// TestSbxSnapshotAndForkAreNotSupported: a backend that cannot copy its
// sandboxes says so, with the code clients switch on, and hello does not
// name the feature.
func TestSbxSnapshotAndForkAreNotSupported(t *testing.T) {
	d, _ := startSbxDaemon(t, "0s")
	c := d.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hello, err := c.Hello(ctx, api.HelloRequest{})
	require.NoError(t, err)
	assert.NotContains(t, hello.Features, "snapshots")
	id := create(t, c, map[string]any{"ttl_s": 600})
	for _, op := range []struct {
		name string
		args any
	}{{ipc.OpSnapshot, api.SnapshotRequest{Sandbox: id, Name: "x"}}, {ipc.OpFork, api.ForkRequest{Sandbox: id, Count: 1}}} {
		err := c.Call(ctx, op.name, op.args, nil)
		var we *ipc.Error
		require.ErrorAs(t, err, &we, op.name)
		assert.Equal(t, ipc.CodeNotSupported, we.Code, "%s: %v", op.name, err)
	}
	assert.Len(t, listed(t, d), 1)
}
