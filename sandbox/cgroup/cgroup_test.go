package cgroup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func requireCI(t *testing.T, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("this test needs %s, and CI=true forbids skipping", what)
	}
	t.Skipf("needs %s", what)
}

func uniqueName(prefix string) string {
	var b [4]byte
	rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

func TestParseMountInfo(t *testing.T) {
	cases := []struct {
		line string
		want mount
		ok   bool
	}{
		{"36 25 0:32 / /sys/fs/cgroup/memory rw,relatime shared:15 - cgroup cgroup rw,memory",
			mount{point: "/sys/fs/cgroup/memory", root: "/", controllers: []string{"memory"}}, true},
		{"37 25 0:33 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,nosuid,cpu,cpuacct",
			mount{point: "/sys/fs/cgroup/cpu,cpuacct", root: "/", controllers: []string{"cpu", "cpuacct"}}, true},
		{"38 25 0:34 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd",
			mount{point: "/sys/fs/cgroup/systemd", root: "/"}, true},
		{"30 25 0:27 /docker/abc /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate",
			mount{point: "/sys/fs/cgroup", root: "/docker/abc", v2: true}, true},
		{`31 25 0:27 / /mnt/with\040space rw - cgroup2 cgroup2 rw`,
			mount{point: "/mnt/with space", root: "/", v2: true}, true},
		{"22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw", mount{}, false},
	}
	for _, c := range cases {
		p := filepath.Join(t.TempDir(), "mountinfo")
		require.NoError(t, os.WriteFile(p, []byte(c.line+"\n"), 0o644))
		got, err := parseMountInfo(p)
		require.NoError(t, err, c.line)
		if !c.ok {
			require.Empty(t, got, c.line)
			continue
		}
		require.Equal(t, []mount{c.want}, got, c.line)
	}
	p := filepath.Join(t.TempDir(), "mountinfo")
	require.NoError(t, os.WriteFile(p, []byte("garbage\n"), 0o644))
	_, err := parseMountInfo(p)
	require.ErrorIs(t, err, ErrUnavailable, "a mountinfo that is not one is refused")
}

func TestPlanChoosesTheHierarchy(t *testing.T) {
	v1mounts := []mount{
		{point: "/sys/fs/cgroup/memory", root: "/", controllers: []string{"memory"}},
		{point: "/sys/fs/cgroup/pids", root: "/", controllers: []string{"pids"}},
		{point: "/sys/fs/cgroup/cpu,cpuacct", root: "/", controllers: []string{"cpu", "cpuacct"}},
	}
	v2hybrid := mount{point: "/sys/fs/cgroup/unified", root: "/", v2: true}
	v2pure := mount{point: "/sys/fs/cgroup", root: "/", v2: true}

	// A hybrid host: v2 mounted but with no controllers of ours -> v1,
	// under the daemon's own cgroup in each hierarchy.
	m, err := plan(layout{
		mounts: append([]mount{v2hybrid}, v1mounts...),
		own:    map[string]string{"memory": "/svc/a", "pids": "/", "cpu": "/", "": "/"},
		v2Ctrl: []string{"hugetlb"},
	}, Options{Base: "sbx"})
	require.NoError(t, err)
	require.Equal(t, V1, m.Version())
	require.Equal(t, map[string]string{
		"memory": "/sys/fs/cgroup/memory/svc/a/sbx",
		"pids":   "/sys/fs/cgroup/pids/sbx",
		"cpu":    "/sys/fs/cgroup/cpu,cpuacct/sbx",
	}, m.v1Base)

	// Pure v2 with the controllers, a delegated service cgroup.
	m, err = plan(layout{
		mounts: []mount{v2pure},
		own:    map[string]string{"": "/system.slice/sandbox-sidecar.service"},
		v2Ctrl: []string{"cpuset", "cpu", "io", "memory", "pids"},
	}, Options{Base: "sandboxes"})
	require.NoError(t, err)
	require.Equal(t, V2, m.Version())
	require.Equal(t, "/sys/fs/cgroup/system.slice/sandbox-sidecar.service/sandboxes", m.v2Base)

	// Root without delegation.
	m, err = plan(layout{mounts: []mount{v2pure}, own: map[string]string{"": "/user.slice"}, v2Ctrl: []string{"cpu", "memory", "pids"}},
		Options{Base: "sandbox-sidecar", UnderRoot: true})
	require.NoError(t, err)
	require.Equal(t, "/sys/fs/cgroup/sandbox-sidecar", m.v2Base)

	// A cgroup namespace: the mount shows only /docker/abc.
	m, err = plan(layout{mounts: []mount{{point: "/sys/fs/cgroup", root: "/docker/abc", v2: true}},
		own: map[string]string{"": "/docker/abc/app"}, v2Ctrl: []string{"cpu", "memory", "pids"}}, Options{Base: "s"})
	require.NoError(t, err)
	require.Equal(t, "/sys/fs/cgroup/app/s", m.v2Base)

	// Nothing usable: refused, not silently unlimited.
	_, err = plan(layout{mounts: []mount{v2hybrid}, own: map[string]string{"": "/"}, v2Ctrl: []string{"hugetlb"}}, Options{Base: "s"})
	require.ErrorIs(t, err, ErrUnavailable)

	// Forcing v2 where it lacks the controllers chooses it anyway (New then
	// fails to enable them); forcing v1 without v1 mounts fails here.
	_, err = plan(layout{mounts: []mount{v2pure}, own: map[string]string{"": "/"}}, Options{Base: "s", Force: V1})
	require.ErrorIs(t, err, ErrUnavailable)
}

func TestLimitWrites(t *testing.T) {
	l := Limits{MemoryBytes: 256 << 20, PIDs: 128, CPUs: 1.5, CPUWeight: 50}
	v2 := (&Cgroup{version: V2, dir: "/cg/x"}).limitWrites(l)
	require.Equal(t, []write{
		{path: "/cg/x/memory.max", value: "268435456"},
		{path: "/cg/x/memory.swap.max", value: "0", optional: true},
		{path: "/cg/x/pids.max", value: "128"},
		{path: "/cg/x/cpu.max", value: "150000 100000"},
		{path: "/cg/x/cpu.weight", value: "50"},
	}, v2)
	v1 := (&Cgroup{version: V1, dirs: map[string]string{"memory": "/m/x", "pids": "/p/x", "cpu": "/c/x"}}).limitWrites(l)
	require.Equal(t, []write{
		{path: "/m/x/memory.limit_in_bytes", value: "268435456"},
		{path: "/m/x/memory.memsw.limit_in_bytes", value: "268435456", optional: true},
		{path: "/m/x/memory.swappiness", value: "0", optional: true},
		{path: "/p/x/pids.max", value: "128"},
		{path: "/c/x/cpu.cfs_period_us", value: "100000"},
		{path: "/c/x/cpu.cfs_quota_us", value: "150000"},
		{path: "/c/x/cpu.shares", value: "512"},
	}, v1)
	require.Empty(t, (&Cgroup{version: V2, dir: "/x"}).limitWrites(Limits{}))
}

func TestLimitsValidate(t *testing.T) {
	require.NoError(t, Limits{}.validate())
	require.NoError(t, Limits{MemoryBytes: 64 << 20, PIDs: 1, CPUs: 0.1, CPUWeight: 10000}.validate())
	for _, bad := range []Limits{{MemoryBytes: -1}, {MemoryBytes: 4096}, {PIDs: -1}, {CPUs: -1}, {CPUWeight: 20000}, {CPUs: 0.001}} {
		require.Error(t, bad.validate(), "%+v", bad)
	}
}

// A limit whose control file does not exist cannot be enforced: Create
// refuses and leaves nothing behind.
func TestCreateRefusesWhatItCannotEnforce(t *testing.T) {
	base := t.TempDir()
	m := &Manager{version: V2, v2Base: base}
	_, err := m.Create("sbx", Limits{MemoryBytes: 64 << 20})
	require.ErrorIs(t, err, ErrUnavailable)
	_, statErr := os.Stat(filepath.Join(base, "sbx"))
	require.True(t, errors.Is(statErr, os.ErrNotExist), "half-made group left behind")
	_, err = m.Create("../escape", Limits{})
	require.Error(t, err)
}

// realManager makes a manager on this host, under the test's own cgroups,
// and removes its base afterwards.
func realManager(t *testing.T, opts Options) *Manager {
	t.Helper()
	requireCI(t, os.Geteuid() == 0, "root")
	if opts.Base == "" {
		opts.Base = uniqueName("sidecar-cgtest")
	}
	m, err := New(opts)
	requireCI(t, err == nil, "a cgroup hierarchy with the memory, pids and cpu controllers ("+errString(err)+")")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		names, _ := m.List()
		for _, n := range names {
			if err := m.Remove(ctx, n); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		m.releaseAnchor()
		for _, d := range m.Dirs() {
			_ = syscall.Rmdir(d)
		}
	})
	return m
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// gated starts `sh -c script` stopped at a read of its stdin, so it can be
// moved into a group before it does anything; release lets it go on.
type gated struct {
	cmd  *exec.Cmd
	gate io.WriteCloser
	done chan struct{} // closed once the process is reaped; err is then set
	err  error
}

func startGated(t *testing.T, script string) *gated {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "read _ ; "+script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	gate, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	g := &gated{cmd: cmd, gate: gate, done: make(chan struct{})}
	go func() { g.err = cmd.Wait(); close(g.done) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-g.done:
		case <-time.After(10 * time.Second):
		}
	})
	return g
}

func (g *gated) release(t *testing.T) {
	t.Helper()
	_, err := g.gate.Write([]byte("go\n"))
	require.NoError(t, err)
	g.gate.Close()
}

func (g *gated) wait(t *testing.T, within time.Duration) *exec.ExitError {
	t.Helper()
	select {
	case <-g.done:
		var ee *exec.ExitError
		if errors.As(g.err, &ee) {
			return ee
		}
		require.NoError(t, g.err)
		return nil
	case <-time.After(within):
		t.Fatalf("process did not end within %v", within)
		return nil
	}
}

func readTrim(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}

func TestRealMemoryLimitKillsAndIsCounted(t *testing.T) {
	m := realManager(t, Options{})
	const limit = 64 << 20
	cg, err := m.Create("oom", Limits{MemoryBytes: limit, PIDs: 16})
	require.NoError(t, err)
	for _, d := range cg.Dirs() {
		if m.Version() == V1 && strings.Contains(d, "/memory/") {
			require.Equal(t, "67108864", readTrim(t, filepath.Join(d, "memory.limit_in_bytes")))
		}
		if m.Version() == V2 {
			require.Equal(t, "67108864", readTrim(t, filepath.Join(d, "memory.max")))
		}
	}
	before, err := cg.OOMKills()
	require.NoError(t, err)
	// The counter held open, as around a command, reads the file anew.
	held, err := cg.OpenOOMCounter()
	require.NoError(t, err)
	defer held.Close()
	heldBefore, err := held.Read()
	require.NoError(t, err)
	require.Equal(t, before, heldBefore)

	// Touch 256 MiB, four times the limit: the kernel must kill it.
	g := startGated(t, `exec /usr/bin/python3 -c 'b = bytearray(256 << 20); print("survived")'`)
	require.NoError(t, cg.Add(g.cmd.Process.Pid))
	pids, err := cg.PIDs()
	require.NoError(t, err)
	require.Contains(t, pids, g.cmd.Process.Pid)
	g.release(t)
	ee := g.wait(t, 60*time.Second)
	require.NotNil(t, ee, "the balloon must not survive")
	ws := ee.Sys().(syscall.WaitStatus)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "want SIGKILL, got %v", ws)

	st, err := cg.Stats()
	require.NoError(t, err)
	require.Greater(t, st.OOMKills, before, "the OOM kill must be counted: %+v", st)
	require.LessOrEqual(t, st.MemoryPeakBytes, int64(limit))
	heldAfter, err := held.Read()
	require.NoError(t, err)
	require.Equal(t, st.OOMKills, heldAfter, "the counter held open since before the kill counts it")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, cg.Destroy(ctx))
	for _, d := range cg.Dirs() {
		_, err := os.Stat(d)
		require.True(t, errors.Is(err, os.ErrNotExist), "%s still exists", d)
	}
	require.NoError(t, cg.Destroy(ctx), "destroy is idempotent")
}

func TestRealForkBombIsContainedAndKilled(t *testing.T) {
	m := realManager(t, Options{})
	const maxPIDs = 24
	cg, err := m.Create("bomb", Limits{PIDs: maxPIDs, MemoryBytes: 256 << 20, CPUs: 0.5})
	require.NoError(t, err)
	pidsDir := cg.Dirs()[0]
	if m.Version() == V1 {
		pidsDir = cg.dirs["pids"]
	}
	// The bound is verified before anything forks.
	require.Equal(t, "24", readTrim(t, filepath.Join(pidsDir, "pids.max")))

	g := startGated(t, `b() { b | b & }; b`)
	require.NoError(t, cg.Add(g.cmd.Process.Pid))
	g.release(t)

	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := cg.Stats()
		require.NoError(t, err)
		require.LessOrEqual(t, st.PIDs, int64(maxPIDs))
		if st.PIDsLimitHits > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the bomb never reached pids.max: %+v", st)
		time.Sleep(20 * time.Millisecond)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, cg.Kill(ctx))
	pids, err := cg.PIDs()
	require.NoError(t, err)
	require.Empty(t, pids)
	require.Less(t, time.Since(start), killWait)
	require.NoError(t, cg.Destroy(ctx))
}

func TestRealOpenListRemove(t *testing.T) {
	m := realManager(t, Options{})
	_, err := m.Create("a1", Limits{PIDs: 8})
	require.NoError(t, err)
	_, err = m.Create("a1", Limits{})
	require.ErrorIs(t, err, os.ErrExist)
	_, err = m.Create("b2", Limits{})
	require.NoError(t, err)
	names, err := m.List()
	require.NoError(t, err)
	require.Equal(t, []string{"a1", "b2"}, names)
	c, err := m.Open("a1")
	require.NoError(t, err)
	require.Equal(t, "a1", c.Name())
	_, err = m.Open("zz")
	require.ErrorIs(t, err, ErrNotFound)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, m.Remove(ctx, "a1"))
	require.NoError(t, m.Remove(ctx, "a1"))
	names, err = m.List()
	require.NoError(t, err)
	require.Equal(t, []string{"b2"}, names)
}

// The v2 mechanics (group, move, cgroup.kill, removal) on this host's v2
// hierarchy, whatever controllers it has.
func TestRealV2Mechanics(t *testing.T) {
	requireCI(t, os.Geteuid() == 0, "root")
	m, err := New(Options{Base: uniqueName("sidecar-cgtest-v2"), Force: V2, UnderRoot: true, Controllers: []string{}})
	requireCI(t, err == nil, "a cgroup v2 mount ("+errString(err)+")")
	t.Cleanup(func() {
		for _, d := range m.Dirs() {
			_ = syscall.Rmdir(d)
		}
	})
	cg, err := m.Create("k", Limits{})
	require.NoError(t, err)
	f, err := cg.FD()
	require.NoError(t, err)
	f.Close()

	// Born inside the group: no window outside it.
	fd, err := cg.FD()
	require.NoError(t, err)
	defer fd.Close()
	cmd := exec.Command("/bin/sh", "-c", "sleep 600 & sleep 600 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(fd.Fd()), Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids, err := cg.PIDs()
		require.NoError(t, err)
		if len(pids) == 3 {
			break
		}
		require.True(t, time.Now().Before(deadline), "want 3 processes in the group, have %v", pids)
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, cg.Destroy(ctx))
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the shell survived cgroup.kill")
	}
	_, err = os.Stat(cg.Dirs()[0])
	require.True(t, errors.Is(err, os.ErrNotExist))
}

func TestV1HasNoFD(t *testing.T) {
	_, err := (&Cgroup{version: V1}).FD()
	require.ErrorIs(t, err, ErrUnavailable)
}

// The delegated layout: the daemon's own v2 cgroup (systemd's, for the
// service) holds the daemon; New moves it into the supervisor leaf and puts
// the base beside that leaf, not inside it. cgroupfs is played by a
// directory whose control files exist beforehand.
func TestNewDelegatedMovesTheDaemonAndPutsTheBaseBesideIt(t *testing.T) {
	root := t.TempDir()
	svc := filepath.Join(root, "system.slice", "sandbox-sidecar.service")
	for _, d := range []string{svc, filepath.Join(svc, "supervisor"), filepath.Join(svc, "sandboxes")} {
		require.NoError(t, os.MkdirAll(d, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), nil, 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(d, "cgroup.procs"), nil, 0o644))
	}
	require.NoError(t, os.WriteFile(filepath.Join(svc, "cgroup.controllers"), []byte("cpu memory pids\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(svc, "cgroup.procs"), []byte("4242\n"), 0o644))
	mi := filepath.Join(t.TempDir(), "mountinfo")
	require.NoError(t, os.WriteFile(mi, []byte("35 23 0:27 / "+root+" rw,nosuid shared:11 - cgroup2 cgroup2 rw,nsdelegate\n"), 0o644))
	self := filepath.Join(t.TempDir(), "cgroup")
	require.NoError(t, os.WriteFile(self, []byte("0::/system.slice/sandbox-sidecar.service\n"), 0o644))

	m, err := New(Options{Base: "sandboxes", SupervisorLeaf: "supervisor", MountInfo: mi, SelfCgroup: self})
	require.NoError(t, err)
	assert.Equal(t, []string{filepath.Join(svc, "sandboxes")}, m.Dirs(), "the base is beside the supervisor leaf")
	moved, _ := os.ReadFile(filepath.Join(svc, "supervisor", "cgroup.procs"))
	assert.Equal(t, "4242", string(moved), "the daemon's process moved into the leaf")
	enabled, _ := os.ReadFile(filepath.Join(svc, "cgroup.subtree_control"))
	assert.Equal(t, "+memory +pids +cpu", string(enabled), "controllers enabled for the service's children")

	_, err = New(Options{Base: "sandboxes", SupervisorLeaf: "sandboxes", MountInfo: mi, SelfCgroup: self})
	assert.Error(t, err, "the leaf cannot be the base")
}

func TestCreateRemakesAVanishedBase(t *testing.T) {
	requireCI(t, os.Geteuid() == 0, "root")
	m, err := New(Options{Base: uniqueName("sidecar-cgtest-base"), UnderRoot: true})
	requireCI(t, err == nil, "cgroups ("+errString(err)+")")
	t.Cleanup(func() {
		_ = m.Remove(context.Background(), "g")
		for _, d := range m.Dirs() {
			_ = syscall.Rmdir(d)
		}
	})
	for _, d := range m.Dirs() {
		require.NoError(t, syscall.Rmdir(d))
	}
	cg, err := m.Create("g", Limits{PIDs: 16})
	require.NoError(t, err, "the base is made again")
	for _, d := range cg.Dirs() {
		_, err := os.Stat(d)
		require.NoError(t, err)
	}
}

// TestRealBaseMemoryBoundsEverySandboxTogether: two groups, each within
// its own limit, together past the base's: the kernel kills inside them
// rather than let them take what the host was not promised to give (#13).
func TestRealBaseMemoryBoundsEverySandboxTogether(t *testing.T) {
	const base, each, balloon = 112 << 20, 96 << 20, 72 << 20
	m := realManager(t, Options{BaseMemoryBytes: base})
	bm, err := m.BaseMemory()
	require.NoError(t, err)
	require.Equal(t, int64(base), bm.LimitBytes)
	memDir := m.memoryBase()
	if m.Version() == V1 {
		require.Equal(t, "117440512", readTrim(t, filepath.Join(memDir, "memory.limit_in_bytes")))
	} else {
		require.Equal(t, "117440512", readTrim(t, filepath.Join(memDir, "memory.max")))
	}

	// The first sandbox takes its balloon and holds it.
	a, err := m.Create("a", Limits{MemoryBytes: each, PIDs: 16})
	require.NoError(t, err)
	ga := startGated(t, fmt.Sprintf(`exec /usr/bin/python3 -c 'import time; b = b"x" * %d; time.sleep(60)'`, balloon))
	require.NoError(t, a.Add(ga.cmd.Process.Pid))
	ga.release(t)
	require.Eventually(t, func() bool {
		st, err := a.Stats()
		return err == nil && st.MemoryBytes >= balloon
	}, 30*time.Second, 20*time.Millisecond, "the first balloon is charged to its group")
	bm, err = m.BaseMemory()
	require.NoError(t, err)
	require.GreaterOrEqual(t, bm.UsedBytes, int64(balloon), "the base counts its children: %+v", bm)

	// The second, within its own limit too, does not fit beside it: the
	// kernel kills one of the two (the larger at that moment, its choice).
	b, err := m.Create("b", Limits{MemoryBytes: each, PIDs: 16})
	require.NoError(t, err)
	gb := startGated(t, fmt.Sprintf(`exec /usr/bin/python3 -c 'import time; b = b"x" * %d; time.sleep(60)'`, balloon))
	require.NoError(t, b.Add(gb.cmd.Process.Pid))
	gb.release(t)
	killed := func(g *gated) bool {
		select {
		case <-g.done:
			var ee *exec.ExitError
			if errors.As(g.err, &ee) {
				ws := ee.Sys().(syscall.WaitStatus)
				return ws.Signaled() && ws.Signal() == syscall.SIGKILL
			}
		default:
		}
		return false
	}
	require.Eventually(t, func() bool { return killed(ga) || killed(gb) }, 60*time.Second, 20*time.Millisecond,
		"two balloons of %d MiB in groups of %d MiB each must not both live under a base of %d MiB", balloon>>20, each>>20, base>>20)
	for _, cg := range []*Cgroup{a, b} {
		st, err := cg.Stats()
		require.NoError(t, err)
		require.Less(t, st.MemoryPeakBytes, int64(each), "stopped by the base's limit, not its own")
	}
	bm, err = m.BaseMemory()
	require.NoError(t, err)
	require.LessOrEqual(t, bm.UsedBytes, int64(base))
	require.NotZero(t, bm.OOMKills, "the kill is counted at the base: %+v", bm)

	// A manager without a limit (the offline sweep) leaves it in place;
	// one with another limit replaces it.
	m2, err := New(Options{Base: filepath.Base(m.Dirs()[0])})
	require.NoError(t, err)
	bm, err = m2.BaseMemory()
	require.NoError(t, err)
	require.Equal(t, int64(base), bm.LimitBytes)
	m3, err := New(Options{Base: filepath.Base(m.Dirs()[0]), BaseMemoryBytes: 2 * base})
	require.NoError(t, err)
	bm, err = m3.BaseMemory()
	require.NoError(t, err)
	require.Equal(t, int64(2*base), bm.LimitBytes)
}

func TestMemTotal(t *testing.T) {
	p := filepath.Join(t.TempDir(), "meminfo")
	require.NoError(t, os.WriteFile(p, []byte("MemTotal:       24564280 kB\nMemFree:        23000000 kB\n"), 0o644))
	n, err := memTotal(p)
	require.NoError(t, err)
	require.Equal(t, int64(24564280)<<10, n)
	require.NoError(t, os.WriteFile(p, []byte("MemFree: 1 kB\n"), 0o644))
	_, err = memTotal(p)
	require.Error(t, err)
	n, err = HostMemoryBytes()
	require.NoError(t, err)
	require.Greater(t, n, int64(64<<20))
}

func TestBaseMemoryOptionIsChecked(t *testing.T) {
	for _, bad := range []int64{-1, 1 << 20} {
		_, err := New(Options{Base: "x", BaseMemoryBytes: bad, MountInfo: "/nonexistent"})
		require.Error(t, err)
		require.Contains(t, err.Error(), "too small")
	}
}

func TestKeyedReadsOneKeyAsParseKeyedDoes(t *testing.T) {
	for _, text := range []string{
		"oom_kill_disable 0\nunder_oom 0\noom_kill 7\n",               // v1 memory.oom_control
		"low 0\nhigh 0\nmax 3\noom 4\noom_kill 7\noom_group_kill 0\n", // v2 memory.events
		"oom_kill 7",
		"oom_kill_disable 1\n oom_kill 7 \n",
		"", "oom_kill x\n", "oom_killer 7\n",
	} {
		assert.Equal(t, parseKeyed([]byte(text))["oom_kill"], keyed([]byte(text), "oom_kill"), "%q", text)
	}
}

// A limit that cannot be written because the daemon ran out of
// descriptors says so, rather than blaming the host's cgroups (seen when
// 10,000 live sandboxes met a 20,000-descriptor limit).
func TestLimitWriteHintNamesTheDaemonsDescriptors(t *testing.T) {
	emfile := &os.PathError{Op: "open", Path: "/sys/fs/cgroup/memory/x/memory.limit_in_bytes", Err: syscall.EMFILE}
	assert.Contains(t, limitWriteHint(emfile), "out of file descriptors")
	assert.Contains(t, limitWriteHint(fmt.Errorf("write: %w", syscall.ENFILE)), "LimitNOFILE")
	assert.Equal(t, "this host cannot enforce that limit", limitWriteHint(&os.PathError{Op: "write", Path: "x", Err: syscall.EINVAL}))
}
