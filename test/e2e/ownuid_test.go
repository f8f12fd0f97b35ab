package e2e

import (
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

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/hostids"
	"github.com/sandbox-sidecar/sandbox-sidecar/test/internal/testdaemon"
)

// restartCmd is a copy of cmd, to start again.
func (d *daemon) restartCmd(cmd *exec.Cmd) *exec.Cmd {
	again := exec.Command(cmd.Path, cmd.Args[1:]...)
	again.Env, again.SysProcAttr = cmd.Env, cmd.SysProcAttr
	d.cmd = again
	return again
}

// Capability numbers (linux/capability.h).
const (
	capKill   = 5
	capSetgid = 6
	capSetuid = 7
)

// procStatus returns the fields of /proc/pid/status.
func procStatus(pid int) (map[string]string, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out, nil
}

// realUID is the first field of a status Uid line.
func realUID(status map[string]string) int {
	f := strings.Fields(status["Uid"])
	if len(f) == 0 {
		return -1
	}
	n, _ := strconv.Atoi(f[0])
	return n
}

// processesInRange returns pid -> status of the host processes named name
// whose real uid is in r.
func processesInRange(t *testing.T, name string, r hostids.Range) map[int]map[string]string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	out := map[int]map[string]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := procStatus(pid)
		if err != nil || st["Name"] != name {
			continue
		}
		if uid := realUID(st); uid >= 0 && r.Contains(uint32(uid)) {
			out[pid] = st
		}
	}
	return out
}

// unusedID is the first id from from on that no user or group of the host
// has (in /etc/passwd and /etc/group), nor any running process.
func unusedID(t *testing.T, from int) int {
	t.Helper()
	used := map[int]bool{}
	for _, f := range []struct {
		path  string
		field int
	}{{"/etc/passwd", 2}, {"/etc/passwd", 3}, {"/etc/group", 2}} {
		raw, err := os.ReadFile(f.path)
		require.NoError(t, err)
		for _, line := range strings.Split(string(raw), "\n") {
			if fields := strings.Split(line, ":"); len(fields) > f.field {
				if id, err := strconv.Atoi(fields[f.field]); err == nil {
					used[id] = true
				}
			}
		}
	}
	for id := from; id < from+1000; id++ {
		if !used[id] && len(processesOf(t, id)) == 0 {
			return id
		}
	}
	t.Fatalf("no unused id in [%d, %d)", from, from+1000)
	return -1
}

// processesOf returns the pids of the host processes whose real uid is uid.
func processesOf(t *testing.T, uid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := procStatus(pid); err == nil && realUID(st) == uid {
			out = append(out, pid)
		}
	}
	return out
}

// The packaged service's way: a daemon that is not root, holding only
// CAP_SETUID, CAP_SETGID and CAP_KILL (AmbientCapabilities=), gives each
// sandbox a host uid of its own, neither its own uid nor shared; the
// guest's files are that uid's; nothing it runs inherits a capability; and
// destroy removes everything.
func TestNonRootDaemonGivesSandboxesUIDsOfTheirOwn(t *testing.T) {
	requireHost(t)
	daemonUID := unusedID(t, 61871) // a system-like id no account or group of the host has
	r := hostids.Range{First: hostids.DefaultFirst + 0xA000, Size: 16}

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
	// After the stop (cleanups run last-first): a kept sandbox outlives its
	// daemon, so what still runs as one of the range's uids ends here.
	t.Cleanup(func() { killUIDs(r.First, r.Size) })
	t.Cleanup(d.stop)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.Logs())
		}
	})

	// The daemon holds its three capabilities, none of them ambient.
	st, err := procStatus(cmd.Process.Pid)
	require.NoError(t, err)
	require.Equal(t, daemonUID, realUID(st))
	require.Equal(t, "0000000000000000", st["CapAmb"], "the daemon clears its ambient set, so nothing it runs inherits it")
	require.Equal(t, fmt.Sprintf("%016x", 1<<capKill|1<<capSetgid|1<<capSetuid), st["CapEff"])

	c := d.client(t)
	lease := map[string]any{"ttl_s": 600} // expiring: they outlive a restart
	ids := []string{create(t, c, lease), create(t, c, lease)}
	uids := map[string]int{}
	for _, id := range ids {
		res := run(t, c, id, "echo secret > /workspace/secret; id -u")
		require.Equal(t, 0, res.ExitCode, "stderr: %s", res.Stderr)
		require.Equal(t, "1000\n", string(res.Stdout))
		call(t, c, ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "sub/dir/from-host.txt", "data": []byte("hello")})
		got := call(t, c, ipc.OpReadFile, map[string]any{"sandbox": id, "path": "secret"})
		require.Equal(t, []byte("secret\n"), got["data"])
		res = run(t, c, id, "cat sub/dir/from-host.txt && echo more >> sub/dir/from-host.txt")
		require.Equal(t, 0, res.ExitCode, "the guest can change what the daemon wrote: %s", res.Stderr)

		work := filepath.Join(d.stateDir, "bwrap", id, "work")
		fi, err := os.Stat(filepath.Join(work, "secret"))
		require.NoError(t, err)
		uid := int(fi.Sys().(*syscall.Stat_t).Uid)
		require.True(t, r.Contains(uint32(uid)), "the guest's file belongs to %d, not a uid of the range", uid)
		for _, p := range []string{work, filepath.Join(work, "sub"), filepath.Join(work, "sub", "dir"), filepath.Join(work, "sub", "dir", "from-host.txt")} {
			fi, err := os.Stat(p)
			require.NoError(t, err)
			assert.Equal(t, uint32(uid), fi.Sys().(*syscall.Stat_t).Uid, "%s", p)
			assert.Equal(t, uint32(uid), fi.Sys().(*syscall.Stat_t).Gid, "%s", p)
		}
		uids[id] = uid
	}
	require.NotEqual(t, uids[ids[0]], uids[ids[1]], "two live sandboxes share a host uid")

	// Their processes run as those uids, with no capability on the host.
	inits := processesInRange(t, "sandbox-init", r)
	require.Len(t, inits, 2)
	seen := map[int]bool{}
	for pid, st := range inits {
		uid := realUID(st)
		seen[uid] = true
		assert.NotEqual(t, daemonUID, uid)
		parent, _ := strconv.Atoi(st["PPid"])
		if pst, err := procStatus(parent); err == nil && pst["Name"] == "bwrap" {
			assert.Equal(t, "0000000000000000", pst["CapPrm"], "bwrap %d (init %d's parent) holds capabilities on the host", parent, pid)
		}
	}
	assert.Equal(t, map[int]bool{uids[ids[0]]: true, uids[ids[1]]: true}, seen)

	// A crash and a restart: both sandboxes (expiring ones, journaled with
	// their uids) come back with the same uids.
	// And a process of the first sandbox's uid, carrying its marker, that
	// outlived the daemon, as one caught in bubblewrap's set-up by the
	// crash would (its start flag left): the restarted daemon must find it
	// (it can read that uid's /proc/PID/environ only as that uid) and kill
	// it. It looks as that uid because of the flag: a non-root daemon's
	// start looks once per flagged sandbox, not once per sandbox.
	var markerVar string
	for pid, st := range inits {
		if realUID(st) != uids[ids[0]] {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		require.NoError(t, err)
		for _, kv := range strings.Split(string(env), "\x00") {
			if strings.HasPrefix(kv, "SANDBOX_SIDECAR_SANDBOX=") {
				markerVar = kv
			}
		}
	}
	require.NotEmpty(t, markerVar, "the init carries no marker")
	d.kill9()
	flag := filepath.Join(d.stateDir, "bwrap", ids[0], "init-starting")
	require.NoError(t, os.WriteFile(flag, nil, 0o600))
	require.NoError(t, os.Chown(flag, daemonUID, daemonUID))
	stray := exec.Command("/bin/sleep", "600")
	stray.Env = []string{markerVar}
	stray.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uids[ids[0]]), Gid: uint32(uids[ids[0]]), Groups: []uint32{}}, Setsid: true}
	require.NoError(t, stray.Start())
	strayDone := make(chan error, 1)
	go func() { strayDone <- stray.Wait() }()
	t.Cleanup(func() { _ = stray.Process.Kill() })
	d.proc = testdaemon.Start(t, d.restartCmd(cmd), 30*time.Second, nil)
	select {
	case err := <-strayDone:
		require.Error(t, err, "the stray was killed, not ended")
	case <-time.After(10 * time.Second):
		t.Fatalf("the restarted daemon left a stray of its sandbox's uid running\n%s", d.Logs())
	}
	// The flagged start's init was killed with the stray; the other
	// sandbox's init outlived the daemon, and the new one re-attached.
	require.Eventually(t, func() bool { return len(processesInRange(t, "sandbox-init", r)) == 1 }, 10*time.Second, 50*time.Millisecond,
		"only the unflagged sandbox's init outlived the daemon")
	c = d.client(t)
	for _, id := range ids {
		res := run(t, c, id, "cat secret")
		require.Equal(t, "secret\n", string(res.Stdout), "stderr: %s", res.Stderr)
	}
	_, err = os.Lstat(flag)
	require.True(t, os.IsNotExist(err), "the first sandbox's next start left its start flag: %v", err)
	seen = map[int]bool{}
	for _, st := range processesInRange(t, "sandbox-init", r) {
		seen[realUID(st)] = true
	}
	assert.Equal(t, map[int]bool{uids[ids[0]]: true, uids[ids[1]]: true}, seen, "re-adopted with their own uids")

	// What the guest sees of the host in mountinfo (docs/security.md,
	// Known gaps): a non-root daemon cannot give a sandbox a filesystem of
	// its own, so the root field of /workspace and /tmp is each
	// directory's path inside the host filesystem it lives on. Binding
	// them from a descriptor instead of a path would show the same: the
	// kernel prints the bound directory's path from its filesystem's root,
	// whatever name the bind was given.
	all, roots := guestMountRoots(t, c, ids[0])
	for guest, host := range map[string]string{"/workspace": "work", "/tmp": "tmp"} {
		assert.Equal(t, rootFieldOf(t, filepath.Join(d.stateDir, "bwrap", ids[0], host)), roots[guest],
			"the root of %s in the guest's mountinfo (docs/security.md says what it is):\n%s", guest, all)
	}

	// Destroy removes every file (made as the sandbox's uid) and process.
	for _, id := range ids {
		call(t, c, ipc.OpDestroy, map[string]any{"sandbox": id})
		_, err := os.Lstat(filepath.Join(d.stateDir, "bwrap", id))
		assert.True(t, os.IsNotExist(err), "sandbox %s's directory is left: %v", id, err)
	}
	require.Eventually(t, func() bool { return len(processesInRange(t, "sandbox-init", r)) == 0 }, 10*time.Second, 50*time.Millisecond)
}

// killUIDs kills every process whose real uid is in [first, first+n).
func killUIDs(first, n uint32) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc", e.Name()), &st) == nil && st.Uid >= first && st.Uid < first+n {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
