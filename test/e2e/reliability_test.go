package e2e

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/internal/failpoint"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/disk"
	"github.com/sandbox-sidecar/sandbox-sidecar/test/internal/testdaemon"
)

// A client that goes away during run_command cancels its command, never
// the owned sandbox it ran in. The failpoints force the interleaving a soak
// found by luck: the connection closes before the backend reads the
// command's status, and the cancellation's wake-up of that read lands
// after the backend had already asked init to kill the command and set
// that request's deadline. The backend used to take the early wake-up for
// init's silence, declare init wedged and terminate the sandbox, which the
// manager then destroyed with its files.
func TestClientGoneDuringCommandKeepsOwnedSandbox(t *testing.T) {
	base := baseDir(t)
	requireHost(t)
	d := startDaemonEnv(t, base, []string{failpoint.Env + "=" + strings.Join([]string{
		bwrap.FailExecHandedOver + "=sleep:1s",
		bwrap.FailConverseWake + "=after:" + bwrap.FailConverseKillArmed,
		bwrap.FailConverseKillArmed + "=after:" + bwrap.FailConverseWoken,
	}, ",")})
	c := d.client(t)
	id := create(t, c, map[string]any{"spec": map[string]any{"owner": "dag/keep"}, "ttl_s": 600})
	call(t, c, ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "kept.txt", "data": []byte("kept\n")})
	require.Equal(t, 0, run(t, c, id, "true").ExitCode, "init is up")

	conn, err := net.Dial("unix", d.socket)
	require.NoError(t, err)
	require.NoError(t, ipc.WriteFrame(conn, req(t, 1, ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "sleep 5", "timeout_s": 30}), 1<<30))
	eventually(t, 20*time.Second, "the daemon at "+bwrap.FailExecHandedOver, func() bool { return reached(d, bwrap.FailExecHandedOver) })
	require.NoError(t, conn.Close())
	eventually(t, 20*time.Second, "the forced interleaving", func() bool { return reached(d, bwrap.FailConverseKillArmed) && reached(d, bwrap.FailConverseWake) })

	// The abandoned command ends (killed) within init's kill answer; until
	// then the sandbox is busy with it.
	var res execResult
	eventually(t, 20*time.Second, "the sandbox free again", func() bool {
		err := c.Call(context.Background(), ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "cat kept.txt", "timeout_s": 30}, &res)
		if ipc.IsCode(err, ipc.CodeQuotaExceeded) { // commands_per_sandbox
			return false
		}
		require.NoError(t, err, "the owned sandbox outlives the client that went away")
		return true
	})
	assert.Equal(t, "kept\n", string(res.Stdout), "and so do its files")
	assert.False(t, res.SandboxTerminated)
	assert.NotContains(t, d.Logs(), "sandbox terminated", "init was never taken for wedged")
	if t.Failed() {
		t.Logf("daemon log:\n%s", d.Logs())
	}
}

// The same client going away, but the daemon then loses the CPU (SIGSTOP,
// an overloaded host) for longer than init's kill answer may take: init's
// "exited" is queued, yet the deadline has passed when the daemon reads
// again, and the runtime reports the deadline without reading. The daemon
// must read what is queued before it judges init silent; it used to declare
// init wedged and terminate the owned sandbox. A soak found it; the
// failpoint stops the daemon's reader past the deadline every time.
func TestDaemonStalledPastKillDeadlineKeepsOwnedSandbox(t *testing.T) {
	base := baseDir(t)
	requireHost(t)
	d := startDaemonEnv(t, base, []string{failpoint.Env + "=" + strings.Join([]string{
		bwrap.FailExecHandedOver + "=sleep:500ms",
		bwrap.FailConverseKillArmed + "=sleep:3s", // past initKillAnswer (2 s)
	}, ",")})
	c := d.client(t)
	id := create(t, c, map[string]any{"spec": map[string]any{"owner": "dag/keep"}, "ttl_s": 600})
	call(t, c, ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "kept.txt", "data": []byte("kept\n")})

	conn, err := net.Dial("unix", d.socket)
	require.NoError(t, err)
	require.NoError(t, ipc.WriteFrame(conn, req(t, 1, ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "sleep 5", "timeout_s": 30}), 1<<30))
	eventually(t, 20*time.Second, "the daemon at "+bwrap.FailExecHandedOver, func() bool { return reached(d, bwrap.FailExecHandedOver) })
	require.NoError(t, conn.Close())
	eventually(t, 20*time.Second, "the stalled reader", func() bool { return reached(d, bwrap.FailConverseKillArmed) })

	var res execResult
	eventually(t, 30*time.Second, "the sandbox free again", func() bool {
		err := c.Call(context.Background(), ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "cat kept.txt", "timeout_s": 30}, &res)
		if ipc.IsCode(err, ipc.CodeQuotaExceeded) { // commands_per_sandbox
			return false
		}
		require.NoError(t, err, "the owned sandbox outlives the stall")
		return true
	})
	assert.Equal(t, "kept\n", string(res.Stdout))
	assert.NotContains(t, d.Logs(), "sandbox terminated")
	if t.Failed() {
		t.Logf("daemon log:\n%s", d.Logs())
	}
}

// requireDiskCaps skips (fails under CI=true) unless the daemon enforces
// disk caps here.
func requireDiskCaps(t *testing.T, c *ipc.Client) {
	t.Helper()
	limits, _ := call(t, c, ipc.OpHealth, nil)["limits"].(map[string]any)
	if limits["disk"] != "ext4 image" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("disk caps are not in force (health: %v), and CI=true forbids skipping", limits)
		}
		t.Skipf("disk caps are not in force here (health: %v)", limits)
	}
}

// image is sandbox id's disk image.
func (d *daemon) image(id string) string { return filepath.Join(d.stateDir, "bwrap", id, "disk.img") }

// attachments counts the loop devices sandbox id's image is attached to.
func (d *daemon) attachments(t *testing.T, id string) int {
	t.Helper()
	ls, err := disk.Attached(d.image(id))
	require.NoError(t, err)
	return len(ls)
}

func stateOf(t *testing.T, d *daemon, id string) api.SandboxInfo {
	t.Helper()
	c := d.client(t)
	defer c.Close()
	res, err := c.List(context.Background(), "")
	require.NoError(t, err)
	for _, s := range res.Sandboxes {
		if s.Sandbox == id {
			return s
		}
	}
	return api.SandboxInfo{}
}

// After kill -9, a process that outlived the daemon in its mount
// namespace (a stray child, here a sleep entered into that namespace) keeps
// the sandbox disks attached. A restart at once must not mount them a
// second time: the sandbox is quarantined (listed so in ls and health, its
// commands refused as unavailable, never not_found), and adopted as soon as
// the old attachment is gone, here released by gc while the holder still
// runs, with its files intact.
func TestRestartNeverMountsAHeldDiskTwice(t *testing.T) {
	d := startDaemon(t, "", "--limit-disk", "67108864")
	c := d.client(t)
	requireDiskCaps(t, c)
	id := create(t, c, map[string]any{"spec": map[string]any{"owner": "dag/keep"}, "ttl_s": 600})
	require.Equal(t, 0, run(t, c, id, "echo kept > /workspace/f").ExitCode)
	c.Close()
	require.Equal(t, 1, d.attachments(t, id))

	holder := exec.Command("nsenter", "--mount=/proc/"+strconv.Itoa(d.cmd.Process.Pid)+"/ns/mnt", "sleep", "600")
	require.NoError(t, holder.Start())
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	daemonNS, err := os.Readlink("/proc/" + strconv.Itoa(d.cmd.Process.Pid) + "/ns/mnt")
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the holder in the daemon's mount namespace", func() bool {
		ns, _ := os.Readlink("/proc/" + strconv.Itoa(holder.Process.Pid) + "/ns/mnt")
		cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(holder.Process.Pid) + "/cmdline")
		return ns == daemonNS && strings.HasPrefix(string(cmdline), "sleep\x00")
	})
	d.kill9()
	// The sandbox's init, which would outlive the daemon and be
	// re-attached with its disk, dies too: only the stray holds the disk.
	bwrap.KillSandboxes(filepath.Join(d.stateDir, "bwrap"))
	d.restart()

	assert.Equal(t, 1, d.attachments(t, id), "the restart did not attach the held image again")
	q := stateOf(t, d, id)
	assert.Equal(t, "quarantined", q.State, "ls says quarantined")
	assert.Contains(t, q.Quarantine, "still attached")
	c = d.client(t)
	health := call(t, c, ipc.OpHealth, nil)
	assert.Equal(t, "degraded", health["status"])
	assert.EqualValues(t, 1, health["recovery"].(map[string]any)["adopt_failed"])
	quarantined, _ := health["quarantined"].([]any)
	require.Len(t, quarantined, 1, "health lists it: %v", health)
	assert.Equal(t, id, quarantined[0].(map[string]any)["sandbox"])
	e := callErr(t, c, ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "cat /workspace/f"})
	assert.Equal(t, ipc.CodeBackendUnavail, e.Code, "refused as unavailable, not not_found: %v", e)
	assert.Contains(t, e.Message, "quarantined")
	time.Sleep(2 * time.Second) // the background retries run meanwhile
	assert.Equal(t, 1, d.attachments(t, id), "and never mount it twice")

	stdout, stderr, code := d.cli(t, "gc")
	require.Equal(t, 0, code, "gc: %s %s", stdout, stderr)
	eventually(t, 10*time.Second, "the sandbox adopted", func() bool { return stateOf(t, d, id).State == "ready" })
	assert.Nil(t, holder.ProcessState, "gc released the disk without killing the process that held it")
	assert.Equal(t, "kept\n", string(run(t, c, id, "cat /workspace/f").Stdout), "its files are intact")
	assert.Equal(t, 1, d.attachments(t, id))
	assert.Equal(t, "ok", call(t, c, ipc.OpHealth, nil)["status"])
	if t.Failed() {
		t.Logf("daemon log:\n%s", d.Logs())
	}
}

// The kill -9 matrix's row "create in flight with disk caps, restart at
// once": the daemon dies while mkfs.ext4 formats a new sandbox's disk. mkfs
// dies with it (parent-death signal) instead of keeping the dead daemon's
// mount namespace, and every disk in it, alive; the restart at once never
// attaches a kept sandbox's image twice, adopts it (at once, or from
// quarantine within seconds), destroys the half-made one, and a clean stop
// leaves no loop device or mount behind.
func TestCrashDuringDiskCreateRestartAtOnce(t *testing.T) {
	base := baseDir(t)
	d := startDaemon(t, base, "--limit-disk", "67108864")
	c := d.client(t)
	requireDiskCaps(t, c)
	keeper := create(t, c, map[string]any{"spec": map[string]any{"owner": "dag/keep"}, "ttl_s": 600})
	require.Equal(t, 0, run(t, c, keeper, "echo kept > /workspace/f").ExitCode)
	c.Close()
	for i := range 3 {
		d.stop()
		d.env = []string{failpoint.Env + "=" + bwrap.FailDiskFormatting}
		d.restart()
		c := d.client(t)
		go c.Call(context.Background(), ipc.OpCreate, map[string]any{"ttl_s": 600}, nil)
		select {
		case <-d.proc.Done():
		case <-time.After(30 * time.Second):
			t.Fatalf("iteration %d: the daemon did not reach %s", i, bwrap.FailDiskFormatting)
		}
		c.Close()
		require.Contains(t, d.Logs(), `"failpoint":"`+bwrap.FailDiskFormatting+`"`, "iteration %d: killed while mkfs ran", i)
		d.env = nil
		d.restart() // at once
		assert.LessOrEqual(t, d.attachments(t, keeper), 1, "iteration %d: never attached twice", i)
		eventually(t, 20*time.Second, "no mkfs outliving its daemon", func() bool { return len(processesMatching(d.stateDir+"/bwrap/")) == 0 })
		eventually(t, 30*time.Second, "the keeper adopted", func() bool { return stateOf(t, d, keeper).State == "ready" })
		assert.Equal(t, []string{keeper}, listed(t, d), "iteration %d: the half-made sandbox is destroyed", i)
		c = d.client(t)
		assert.Equal(t, "kept\n", string(run(t, c, keeper, "cat /workspace/f").Stdout), "iteration %d", i)
		assert.Equal(t, 1, d.attachments(t, keeper))
		c.Close()
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.Logs())
			return
		}
	}
	// A stopped daemon leaves the kept sandbox's init running, its disk
	// attached for it alone; once that ends nothing is left.
	d.stop()
	assert.Equal(t, 1, d.attachments(t, keeper), "the live init's disk, once")
	testdaemon.EndSandboxes(t, daemonBin, d.socket, d.stateDir)
	eventually(t, 10*time.Second, "no loop device attached", func() bool { return d.attachments(t, keeper) == 0 })
	assert.Zero(t, mountsUnder(t, "/proc/self/mounts", d.stateDir))
}

// reached reports whether d's log says it reached failpoint name (not
// merely that it was armed with it: that line names every failpoint).
func reached(d *daemon, name string) bool {
	logs := d.Logs()
	return strings.Contains(logs, `"failpoint":"`+name+`"`) || strings.Contains(logs, "failpoint="+name+" action=")
}
