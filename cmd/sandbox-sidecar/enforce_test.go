package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/cgroup"
)

// needRoot skips a test that needs root, or fails it when CI=true.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("this test needs root")
	}
	t.Skip("needs root")
}

func TestCgroupBaseIsPerStateDir(t *testing.T) {
	assert.Equal(t, "sandbox-sidecar", cgroupBase("/var/lib/sandbox-sidecar"))
	assert.Equal(t, "sandbox-sidecar", cgroupBase("/var/lib/sandbox-sidecar/"))
	a, b := cgroupBase("/tmp/a/state"), cgroupBase("/tmp/b/state")
	assert.Regexp(t, `^sandbox-sidecar-[0-9a-f]{8}$`, a)
	assert.NotEqual(t, a, b, "two state directories, two cgroup bases")
	assert.Equal(t, a, cgroupBase("/tmp/a/../a/state"), "the same directory, however written")
}

// fakeSystemd lays out a cgroup2 "mount" in a temporary directory holding
// the cgroup a service would get, and returns a host that sees it.
func fakeSystemd(t *testing.T, euid int, procs string, env map[string]string) (host, string) {
	t.Helper()
	root := t.TempDir()
	svc := filepath.Join(root, "system.slice", "sandbox-sidecar.service")
	require.NoError(t, os.MkdirAll(svc, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(svc, "cgroup.procs"), []byte(procs), 0o644))
	mi := filepath.Join(t.TempDir(), "mountinfo")
	require.NoError(t, os.WriteFile(mi, []byte(
		"30 23 0:26 / /sys/fs/cgroup/memory rw,relatime shared:10 - cgroup cgroup rw,memory\n"+
			"35 23 0:27 / "+root+" rw,nosuid shared:11 - cgroup2 cgroup2 rw,nsdelegate\n"), 0o644))
	sc := filepath.Join(t.TempDir(), "cgroup")
	require.NoError(t, os.WriteFile(sc, []byte("0::/system.slice/sandbox-sidecar.service\n"), 0o644))
	return host{euid: euid, pid: 4242, getenv: func(k string) string { return env[k] }, mountInfo: mi, selfCgroup: sc,
		diskCheck: func() error { return nil }}, svc
}

func TestDelegatedCgroupDetection(t *testing.T) {
	systemd := map[string]string{"INVOCATION_ID": "0123abcd", "SYSTEMD_EXEC_PID": "4242"}

	// A service with User= and Delegate=yes: its cgroup is its own.
	h, svc := fakeSystemd(t, 1000, "4242\n", systemd)
	dir, err := delegatedCgroup(h)
	require.NoError(t, err)
	assert.Equal(t, svc, dir)
	p, why := placements(h, "/var/lib/sandbox-sidecar")
	require.Len(t, p, 1, "not root: only the delegated placement")
	assert.True(t, p[0].prepare)
	assert.Equal(t, "sandboxes", p[0].opts.Base)
	assert.False(t, p[0].opts.UnderRoot)
	assert.Equal(t, []string{"the daemon does not run as root (uid 1000)"}, why)

	for name, c := range map[string]struct {
		env   map[string]string
		procs string
		want  string
	}{
		"not under systemd":      {map[string]string{}, "4242\n", "not started by systemd"},
		"a child of the service": {map[string]string{"INVOCATION_ID": "0123abcd", "SYSTEMD_EXEC_PID": "1"}, "4242\n", "not as its main process"},
		"other processes there":  {systemd, "4242\n77\n", "holds other processes"},
	} {
		h, _ := fakeSystemd(t, 1000, c.procs, c.env)
		_, err := delegatedCgroup(h)
		assert.ErrorIs(t, err, errNotDelegated, name)
		assert.ErrorContains(t, err, c.want, name)
	}

	// At the top of the hierarchy: nothing to delegate.
	h, _ = fakeSystemd(t, 1000, "4242\n", systemd)
	require.NoError(t, os.WriteFile(h.selfCgroup, []byte("0::/\n"), 0o644))
	_, err = delegatedCgroup(h)
	assert.ErrorContains(t, err, "no cgroup v2 of its own")

	// Root: only systemd's mark says the cgroup is delegated (root may
	// write anywhere).
	h, svc = fakeSystemd(t, 0, "4242\n", systemd)
	_, err = delegatedCgroup(h)
	assert.ErrorContains(t, err, "is not delegated")
	p, _ = placements(h, "/srv/state")
	require.Len(t, p, 1)
	assert.Equal(t, cgroup.Options{Base: cgroupBase("/srv/state"), UnderRoot: true, MountInfo: h.mountInfo, SelfCgroup: h.selfCgroup}, p[0].opts)
	if os.Geteuid() == 0 {
		if err := unix.Setxattr(svc, "trusted.delegate", []byte("1"), 0); err != nil {
			t.Logf("cannot set trusted.delegate on %s (%v): the root case with systemd's mark is not checked", svc, err)
		} else {
			dir, err := delegatedCgroup(h)
			require.NoError(t, err)
			assert.Equal(t, svc, dir)
			p, _ = placements(h, "/srv/state")
			require.Len(t, p, 2, "root and delegated: the service's own cgroup first, the top of the hierarchy after")
			assert.True(t, p[0].prepare)
			assert.True(t, p[1].opts.UnderRoot)
		}
	}
}

func TestEnforcementModes(t *testing.T) {
	// A laptop: not root, not a systemd service, no loop-mounting.
	laptop := host{euid: 1000, pid: os.Getpid(), getenv: func(string) string { return "" },
		diskCheck: func() error { return errors.New("disk caps unavailable: loop-mounting needs root") }}
	logged := func() (hclog.Logger, *bytes.Buffer) {
		var buf bytes.Buffer
		return hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Info}), &buf
	}
	cfg := defaultConfig()
	cfg.Server.StateDir = t.TempDir()

	// auto: one warning each, saying what is not enforced and what to do.
	log, buf := logged()
	e, err := setupEnforcement(laptop, cfg, log)
	require.NoError(t, err)
	assert.Nil(t, e.cgroups)
	assert.False(t, e.diskCaps)
	out := buf.String()
	assert.Equal(t, 2, strings.Count(out, "[WARN]"), out)
	assert.Contains(t, out, "per-sandbox memory, pids and CPU limits (limits.memory, limits.pids, limits.cpus, limits.cpu_weight) are NOT enforced")
	assert.Contains(t, out, "Run it as root, or as a systemd service with Delegate=yes")
	assert.Contains(t, out, "the daemon does not run as root (uid 1000)")
	assert.Contains(t, out, "per-sandbox disk caps (limits.disk, limits.disk_inodes) are NOT enforced")

	// required: the same words, as the reason not to start.
	for _, mutate := range []func(*LimitsSection){
		func(l *LimitsSection) { l.Cgroups = enforceRequired },
		func(l *LimitsSection) { l.DiskCaps = enforceRequired },
	} {
		c := cfg
		mutate(&c.Limits)
		log, _ := logged()
		_, err := setupEnforcement(laptop, c, log)
		require.Error(t, err)
		assert.Regexp(t, `NOT enforced: .*\(limits\.(cgroups|disk_caps) = required\)$`, err.Error())
	}

	// off: not tried, no warning.
	c := cfg
	c.Limits.Cgroups, c.Limits.DiskCaps = enforceOff, enforceOff
	log, buf = logged()
	e, err = setupEnforcement(laptop, c, log)
	require.NoError(t, err)
	assert.Nil(t, e.cgroups)
	assert.NotContains(t, buf.String(), "[WARN]")
	assert.Contains(t, buf.String(), "limits.cgroups = off")

	// No disk limit: nothing to cap, nothing to warn about.
	c = cfg
	c.Limits.Cgroups, c.Limits.Disk = enforceOff, 0
	log, buf = logged()
	_, err = setupEnforcement(laptop, c, log)
	require.NoError(t, err)
	assert.NotContains(t, buf.String(), "[WARN]")

	// The sbx backend's microVMs have limits of their own: nothing here.
	c = cfg
	c.Server.Backend = "sbx"
	c.Limits.Cgroups = enforceRequired
	log, buf = logged()
	e, err = setupEnforcement(laptop, c, log)
	require.NoError(t, err)
	assert.Nil(t, e.cgroups)
	assert.Empty(t, buf.String())
}

// TestRootCgroupsPerStateDir makes the cgroups of a root daemon (not a
// systemd service) for two state directories: each gets a base of its own,
// which the other's orphan sweep (List) never sees, and release removes
// them once empty.
func TestRootCgroupsPerStateDir(t *testing.T) {
	needRoot(t)
	h := realHost()
	h.getenv = func(string) string { return "" }
	mk := func(stateDir string) *cgroup.Manager {
		lim := defaultConfig().Limits
		lim.Cgroups = enforceRequired
		m, err := newCgroups(h, lim, stateDir, hclog.NewNullLogger())
		require.NoError(t, err)
		t.Logf("%s: %s", m.Version(), strings.Join(m.Dirs(), " "))
		for _, d := range m.Dirs() {
			assert.Equal(t, cgroupBase(stateDir), filepath.Base(d))
			assert.DirExists(t, d)
		}
		return m
	}
	a, b := mk(t.TempDir()), mk(t.TempDir())
	ea, eb := &enforcement{cgroups: a}, &enforcement{cgroups: b}
	defer ea.release(hclog.NewNullLogger())
	defer eb.release(hclog.NewNullLogger())

	cg, err := a.Create("sc-enforcetest", cgroup.Limits{MemoryBytes: 64 << 20, PIDs: 16})
	require.NoError(t, err)
	la, err := a.List()
	require.NoError(t, err)
	lb, err := b.List()
	require.NoError(t, err)
	assert.Equal(t, []string{"sc-enforcetest"}, la)
	assert.Empty(t, lb, "another state directory's daemon sees none of them")

	// A sandbox cgroup with a process stays, and so does its base; an
	// empty one goes (a re-adopted sandbox gets a new one).
	sleeper := exec.Command("sleep", "60")
	require.NoError(t, sleeper.Start())
	defer sleeper.Process.Kill()
	require.NoError(t, cg.Add(sleeper.Process.Pid))
	ea.release(hclog.NewNullLogger())
	for _, d := range cg.Dirs() {
		assert.DirExists(t, d)
	}
	sleeper.Process.Kill()
	sleeper.Wait()
	require.Eventually(t, func() bool { pids, err := cg.PIDs(); return err == nil && len(pids) == 0 }, 5*time.Second, 10*time.Millisecond)
	ea.release(hclog.NewNullLogger())
	eb.release(hclog.NewNullLogger())
	for _, d := range append(a.Dirs(), b.Dirs()...) {
		assert.NoDirExists(t, d)
	}
}

// buildDaemon builds the daemon into a directory every user may read.
func buildDaemon(t *testing.T) (dir, bin string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "sidecar-enforce-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	bin = filepath.Join(dir, "sandbox-sidecar")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return dir, bin
}

// TestServeWithoutCgroups runs the built daemon where it cannot make
// cgroups (an unprivileged user, not a systemd service): with
// limits.cgroups = required it refuses to start and says why; with auto it
// starts and warns.
func TestServeWithoutCgroups(t *testing.T) {
	dir, bin := buildDaemon(t)
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		cred = &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}
	}
	own := func(p string) {
		require.NoError(t, os.Mkdir(p, 0o700))
		if cred != nil {
			require.NoError(t, os.Chown(p, int(cred.Uid), int(cred.Gid)))
		}
	}
	state, run := filepath.Join(dir, "state"), filepath.Join(dir, "run")
	own(state)
	own(run)
	socket := filepath.Join(run, "s", "sidecar.sock")
	daemon := func(mode string) *exec.Cmd {
		cmd := exec.Command(bin, "serve", "--config", "/dev/null", "--state-dir", state, "--socket", socket,
			"--limit-cgroups", mode, "--limit-disk-caps", "off")
		// No INVOCATION_ID: not a systemd service.
		cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir, "LANG=C"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
		return cmd
	}

	cmd := daemon("required")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := runBounded(t, cmd, 30*time.Second)
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "the daemon started without cgroups:\n%s", stderr.String())
	assert.Equal(t, 1, ee.ExitCode())
	out := stderr.String()
	t.Logf("%s", out)
	assert.Contains(t, out, "cannot start")
	assert.Contains(t, out, "are NOT enforced: this daemon cannot make cgroups (")
	assert.Contains(t, out, "does not run as root")
	assert.Contains(t, out, "Delegate=yes")
	assert.Contains(t, out, "(limits.cgroups = required)")
	assert.NoFileExists(t, socket, "a daemon that refuses to start serves nothing")

	// auto: it serves, with a warning.
	if _, err := exec.LookPath("bwrap"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("bubblewrap is not installed, and CI=true forbids skipping")
		}
		t.Skip("bubblewrap is not installed: the daemon with limits.cgroups = auto is not started")
	}
	cmd = daemon("auto")
	log := startListening(t, cmd)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, runBounded(t, cmd, 0))
	out = log.String()
	assert.Regexp(t, regexp.MustCompile(`\[WARN\] +sandbox-sidecar: per-sandbox memory, pids and CPU limits .* are NOT enforced`), out)
	// A non-root daemon without CAP_SETUID/CAP_SETGID/CAP_KILL also says
	// its sandboxes share its uid (bwrap.own_uids = auto).
	assert.Contains(t, out, "sandboxes do NOT get host uids of their own: every sandbox runs as the daemon's own uid")
	assert.Equal(t, 2, strings.Count(out, "[WARN]  sandbox-sidecar: "), "the daemon warns twice, for cgroups and for host uids:\n%s", out)
	assert.Contains(t, out, "some sandbox limits are not enforced on this host: memory, pids, cpu", "the backend says what is in force")
}

// startListening starts cmd (a serve) and returns its stderr once it says
// it is listening, within 20 s; the daemon is killed when the test ends.
func startListening(t *testing.T, cmd *exec.Cmd) *syncWriter {
	t.Helper()
	log := &syncWriter{w: &bytes.Buffer{}}
	cmd.Stderr = log
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(log.String(), "is listening on") {
		require.True(t, time.Now().Before(deadline), "the daemon did not start:\n%s", log.String())
		time.Sleep(20 * time.Millisecond)
	}
	return log
}

// runBounded runs cmd (or waits for a started one when limit is 0) within
// 30 s.
func runBounded(t *testing.T, cmd *exec.Cmd, limit time.Duration) error {
	t.Helper()
	if limit == 0 {
		limit = 30 * time.Second
	} else if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s did not exit within %s", cmd.Path, limit)
	}
}

// syncWriter is a bytes.Buffer safe to read while a process writes it.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

func TestHostMemoryLimit(t *testing.T) {
	host := func(n int64) func() (int64, error) { return func() (int64, error) { return n, nil } }
	lim := LimitsSection{Memory: 1 << 30}
	got, err := hostMemoryLimit(lim, host(24<<30))
	require.NoError(t, err)
	assert.Equal(t, int64(18<<30), got, "three quarters of a 24 GiB host")
	got, err = hostMemoryLimit(lim, host(1<<30))
	require.NoError(t, err)
	assert.Equal(t, int64(1<<30), got, "never below one sandbox's own limit")
	lim.HostMemory = 5 << 30
	got, err = hostMemoryLimit(lim, host(24<<30))
	require.NoError(t, err)
	assert.Equal(t, int64(5<<30), got, "the configured value wins")
	_, err = hostMemoryLimit(LimitsSection{}, func() (int64, error) { return 0, errors.New("no /proc") })
	require.ErrorContains(t, err, "limits.host_memory")
}
