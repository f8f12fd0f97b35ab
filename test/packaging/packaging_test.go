// Package packaging proves the Debian package on a real systemd: it builds
// two versions of the .deb, checks them with lintian, boots a minimal Debian
// bookworm with systemd-nspawn (debootstrapped once, then cached), and
// drives it from the host with nsenter: install, socket activation, who may
// connect, READY and STATUS, per-sandbox limits under Delegate=yes, the
// watchdog killing a frozen daemon and recovery after it, a daemon started by hand, restart, upgrade, remove and
// purge. Its other tests boot the package with the shipped gVisor and
// egress drop-ins (gvisor_test.go, egress_test.go).
//
// It needs root, systemd-nspawn, debootstrap, dpkg-deb and lintian, and
// takes minutes, so it runs only when SANDBOX_SIDECAR_PACKAGING_TEST=1, as
// the packaging step of scripts/test.sh does (after installing those). It
// skips without them, and fails instead when CI=true.
package packaging

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/metrics/metricstest"
)

const (
	enableEnv = "SANDBOX_SIDECAR_PACKAGING_TEST"

	socketPath = "/run/sandbox-sidecar/sidecar.sock"
	stateDir   = "/var/lib/sandbox-sidecar"
	configPath = "/etc/sandbox-sidecar/config.toml"
	daemonUser = "sandbox-sidecar"
	worker     = "airflow"  // in the group sandbox-sidecar
	outsider   = "outsider" // not in it

	// maxExposure is the systemd-analyze security score recorded in
	// docs/packaging.md: a unit change that weakens the sandbox fails here.
	maxExposure = 2.5

	// aptTimeout bounds one apt-get run in the container.
	aptTimeout = 3 * time.Minute
	// watchdogRestartTimeout bounds a frozen daemon's replacement:
	// WatchdogSec (30 s) + TimeoutAbortSec (10 s) + RestartSec (2 s) + start.
	watchdogRestartTimeout = 90 * time.Second
	// statusTimeout bounds the first periodic STATUS= (every 10 s).
	statusTimeout = 25 * time.Second
	// daemonStopTimeout bounds a daemon's graceful exit on SIGTERM.
	daemonStopTimeout = 45 * time.Second
	// metricsAddr is ListenStream= of sandbox-sidecar-metrics.socket.
	metricsAddr = "127.0.0.1:9464"
)

func TestDebianPackageOnSystemd(t *testing.T) {
	requireEnvironment(t)
	began := time.Now()
	step := stepper(t)

	step("build two versions of the package")
	share := filepath.Join(t.TempDir(), "share")
	if err := os.Mkdir(share, 0o755); err != nil {
		t.Fatal(err)
	}
	// The first is a release build (the changelog's version), the second a
	// later snapshot: lintian sees the release's changelog, the upgrade a
	// newer version.
	v1 := changelogVersion(t)
	v2 := v1 + "+pkgtest"
	deb1 := "/share/" + filepath.Base(buildDeb(t, v1, share))
	deb2 := "/share/" + filepath.Base(buildDeb(t, v2, share))

	step("lintian")
	out, errs := lintianErrors(t, filepath.Join(share, filepath.Base(deb1)))
	t.Logf("lintian:\n%s", out)
	if len(errs) > 0 {
		t.Errorf("lintian reports errors:\n%s", strings.Join(errs, "\n"))
	}

	step("container image")
	root := unpack(t, image(t))

	step("boot")
	c := boot(t, root, share)

	step("install")
	c.shTimeout(aptTimeout, "apt-get install -y --no-install-recommends "+deb1)
	checkInstalled(t, c, v1)

	step("socket activation and who may connect")
	checkAccess(t, c)

	step("READY and STATUS")
	checkNotify(t, c)

	step("metrics through their own socket")
	checkMetrics(t, c)

	step("per-sandbox limits")
	checkLimits(t, c)

	step("watchdog and recovery")
	kept := checkWatchdog(t, c)

	step("started by hand")
	checkByHand(t, c, kept)

	step("systemctl restart")
	checkRestart(t, c)

	step("upgrade")
	checkUpgrade(t, c, deb2, v2, kept)

	step("remove")
	checkRemove(t, c)

	step("purge")
	checkPurge(t, c)

	step("done")
	t.Logf("the packaging test took %s", time.Since(began).Round(time.Second))
}

// requireEnvironment skips (fails under CI=true) when the host cannot run
// the test, and skips unless the test is asked for.
func requireEnvironment(t *testing.T) {
	if os.Getenv(enableEnv) != "1" {
		t.Skipf("boots a container and takes minutes: runs in the packaging step of scripts/test.sh; alone: sudo %s=1 go test -v ./test/packaging", enableEnv)
	}
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, tool := range []string{"systemd-nspawn", "debootstrap", "nsenter", "dpkg-deb", "lintian", "tar", "gzip"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err != nil || strings.TrimSpace(string(b)) == "0" {
		missing = append(missing, "unprivileged user namespaces (sysctl user.max_user_namespaces > 0)")
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("the packaging test needs %s (apt-get install systemd-container debootstrap lintian dpkg-dev)", strings.Join(missing, ", "))
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// stepper logs each step with the time the previous one took.
func stepper(t *testing.T) func(string) {
	var name string
	var start time.Time
	return func(next string) {
		if name != "" {
			t.Logf("== %s: %s", name, time.Since(start).Round(100*time.Millisecond))
		}
		name, start = next, time.Now()
	}
}

// as runs a command line in the container as user, with its groups.
func as(user, cmdline string) string {
	return fmt.Sprintf("setpriv --reuid %s --regid %s --init-groups -- %s", user, user, cmdline)
}

func expectEqual(t *testing.T, what, got, want string) {
	t.Helper()
	if strings.TrimSpace(got) != want {
		t.Errorf("%s: got %q, want %q", what, strings.TrimSpace(got), want)
	}
}

func expectContains(t *testing.T, what, got, want string) {
	t.Helper()
	if !strings.Contains(got, want) {
		t.Errorf("%s: %q not in:\n%s", what, want, got)
	}
}

func checkInstalled(t *testing.T, c *container, version string) {
	expectEqual(t, "package status", c.sh("dpkg-query -W -f='${Status} ${Version}' sandbox-sidecar"), "install ok installed "+version)
	expectEqual(t, "binary version", c.sh("sandbox-sidecar version"), "sandbox-sidecar "+version)

	// The system user, its group, its home.
	pw := strings.Split(strings.TrimSpace(c.sh("getent passwd "+daemonUser)), ":")
	if len(pw) != 7 {
		t.Fatalf("getent passwd %s: %q", daemonUser, pw)
	}
	if uid, _ := strconv.Atoi(pw[2]); uid <= 0 || uid >= 1000 {
		t.Errorf("%s has uid %d, not a system uid", daemonUser, uid)
	}
	expectEqual(t, "home", pw[5], stateDir)
	expectEqual(t, "shell", pw[6], "/usr/sbin/nologin")
	c.sh("getent group " + daemonUser)

	// Enabled and listening; the daemon waits for its first client.
	expectEqual(t, "socket enabled", c.sh("systemctl is-enabled sandbox-sidecar.socket"), "enabled")
	expectEqual(t, "socket active", c.sh("systemctl is-active sandbox-sidecar.socket"), "active")
	_, state := c.exitCode("systemctl is-active sandbox-sidecar.service")
	expectEqual(t, "service before the first connection", state, "inactive")
	expectEqual(t, "socket", c.sh("stat -c '%U:%G %a %F' "+socketPath), "sandbox-sidecar:sandbox-sidecar 660 socket")
	expectEqual(t, "socket directory", c.sh("stat -c '%U:%G %a' "+filepath.Dir(socketPath)), "sandbox-sidecar:sandbox-sidecar 750")
	expectEqual(t, "state directory", c.sh("stat -c '%U:%G %a' "+stateDir), "sandbox-sidecar:sandbox-sidecar 711")

	// systemd-analyze verify exits 0 even on unknown keys: its output is
	// what counts.
	verify := c.sh("systemd-analyze verify /lib/systemd/system/sandbox-sidecar.socket /lib/systemd/system/sandbox-sidecar-metrics.socket /lib/systemd/system/sandbox-sidecar.service 2>&1")
	if strings.TrimSpace(verify) != "" {
		t.Errorf("systemd-analyze verify is not silent:\n%s", verify)
	}
	// The example drop-ins shipped in the docs are valid too.
	verify = c.sh(`d=/run/systemd/system/sandbox-sidecar.service.d; mkdir -p $d && cp /usr/share/doc/sandbox-sidecar/examples/*.conf $d/ &&
		systemd-analyze verify sandbox-sidecar.service 2>&1; rm -r $d`)
	if strings.TrimSpace(verify) != "" {
		t.Errorf("systemd-analyze verify with the example drop-ins is not silent:\n%s", verify)
	}
	security := c.sh("systemd-analyze security --offline=yes --no-pager /lib/systemd/system/sandbox-sidecar.service 2>&1")
	m := regexp.MustCompile(`Overall exposure level for sandbox-sidecar.service: ([0-9.]+)`).FindStringSubmatch(security)
	if m == nil {
		t.Errorf("no exposure level in systemd-analyze security:\n%s", security)
	} else {
		score, _ := strconv.ParseFloat(m[1], 64)
		t.Logf("systemd-analyze security --offline=yes: %.1f", score)
		if score > maxExposure {
			t.Errorf("exposure %.1f is above %.1f (docs/packaging.md); what got weaker?\n%s", score, maxExposure, security)
		}
	}

	// The default configuration: a conffile, valid as shipped.
	expectContains(t, "conffiles", c.sh("dpkg-query -W -f='${Conffiles}' sandbox-sidecar"), configPath)
	expectEqual(t, "config check", c.sh("sandbox-sidecar config check"), configPath+": OK")
	expectEqual(t, "man page", c.sh("man -w sandbox-sidecar"), "/usr/share/man/man1/sandbox-sidecar.1.gz")
}

func checkAccess(t *testing.T, c *container) {
	c.sh(fmt.Sprintf("useradd -m -G %s %s && useradd -m %s", daemonUser, worker, outsider))

	// The first connection starts the daemon.
	got := c.sh(as(worker, `sandbox-sidecar exec -- sh -c 'echo hello from $(id -u) on $(hostname)'`))
	expectEqual(t, "a worker's command", got, "hello from 1000 on sandbox")
	expectEqual(t, "service after the first connection", c.sh("systemctl is-active sandbox-sidecar.service"), "active")
	expectEqual(t, "TriggeredBy", c.sh("systemctl show -P TriggeredBy sandbox-sidecar.service"), "sandbox-sidecar.socket")
	expectContains(t, "journal", c.sh("journalctl -b -u sandbox-sidecar.service --no-pager -o cat"), "using the socket systemd passed (socket activation)")

	// What guest code expects of its sandbox works under the unit's
	// hardening: python, loopback TCP inside the sandbox's own network.
	got = c.sh(as(worker, `sandbox-sidecar exec -- python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); socket.create_connection(s.getsockname()); print('loopback ok')"`))
	expectEqual(t, "loopback TCP in a sandbox", got, "loopback ok")

	// Outside the group: the socket's directory keeps the user out.
	code, out := c.exitCode(as(outsider, "sandbox-sidecar exec -- echo should-not-run"))
	if code == 0 || !strings.Contains(out, "permission denied") || strings.Contains(out, "should-not-run") {
		t.Errorf("a user outside the group got exit %d:\n%s", code, out)
	}
}

// checkMetrics enables the metrics endpoint the documented way (the
// drop-in and sandbox-sidecar-metrics.socket) and scrapes it: the service
// keeps PrivateNetwork=yes and IPAddressDeny=any, and the socket systemd
// passes gets through them. Then it turns it off again.
func checkMetrics(t *testing.T, c *container) {
	c.sh("mkdir -p /etc/systemd/system/sandbox-sidecar.service.d && " +
		"cp /usr/share/doc/sandbox-sidecar/examples/metrics.conf /etc/systemd/system/sandbox-sidecar.service.d/metrics.conf && " +
		"systemctl daemon-reload && systemctl stop sandbox-sidecar.service && systemctl enable --now sandbox-sidecar-metrics.socket && systemctl start sandbox-sidecar.service")
	expectEqual(t, "PrivateNetwork kept", c.sh("systemctl show -P PrivateNetwork sandbox-sidecar.service"), "yes")
	expectContains(t, "IPAddressDeny kept", c.sh("systemctl show -P IPAddressDeny sandbox-sidecar.service"), "0.0.0.0/0")
	// The container shares the host's network namespace: scrape it from the
	// test, with a real HTTP client and the exposition format's parser.
	c.sh(as(worker, "sandbox-sidecar exec -- true")) // something to count
	fams := metricstest.Scrape(t, metricsAddr)
	if v, ok := metricstest.Value(fams, "sandbox_sidecar_creates_total", "source", "cold"); !ok || v != 1 {
		t.Errorf("sandbox_sidecar_creates_total{source=cold} = %v (present %v), want 1", v, ok)
	}
	if _, ok := metricstest.Value(fams, "sandbox_sidecar_connections"); !ok {
		t.Errorf("no sandbox_sidecar_connections in the scrape")
	}
	expectContains(t, "journal", c.sh("journalctl -b -u sandbox-sidecar.service --no-pager -o cat"), "the socket systemd passed")
	c.sh("systemctl disable --now sandbox-sidecar-metrics.socket && rm /etc/systemd/system/sandbox-sidecar.service.d/metrics.conf && " +
		"systemctl daemon-reload && systemctl restart sandbox-sidecar.service")
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + metricsAddr + "/metrics"); err == nil {
		resp.Body.Close()
		t.Errorf("the metrics endpoint still answers after it was turned off")
	}
}

func checkNotify(t *testing.T, c *container) {
	expectEqual(t, "Type", c.sh("systemctl show -P Type sandbox-sidecar.service"), "notify")
	expectEqual(t, "WatchdogUSec", c.sh("systemctl show -P WatchdogUSec sandbox-sidecar.service"), "30s")
	expectContains(t, "STATUS after READY", c.sh("systemctl show -P StatusText sandbox-sidecar.service"), "serving")
	// The periodic STATUS= with live counts.
	c.waitFor(statusTimeout, "a STATUS= line with live counts",
		`systemctl show -P StatusText sandbox-sidecar.service | grep -E '^serving: [0-9]+ sandboxes .*[0-9]+ commands running, [0-9]+ connections$'`)
	status := c.sh("systemctl status --no-pager sandbox-sidecar.service")
	expectContains(t, "systemctl status", status, `Status: "serving: `)
	expectContains(t, "systemctl status", status, "TriggeredBy:")
	expectContains(t, "systemctl status", status, "active (running)")
	expectContains(t, "health", c.sh("sandbox-sidecar health"), "ok: backend bwrap")

	// The hardening is in force on the running daemon, not just written:
	// its own uid, no group but its own, only CAP_KILL, CAP_SETGID and
	// CAP_SETUID (0xe0) and none of them ambient (the daemon cleared its
	// ambient set, so bwrap inherits nothing), the filter.
	uid := strings.TrimSpace(c.sh("id -u " + daemonUser))
	gid := strings.TrimSpace(c.sh("id -g " + daemonUser))
	st := map[string]string{}
	for _, line := range strings.Split(c.sh("cat /proc/$(systemctl show -P MainPID sandbox-sidecar.service)/status"), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			st[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	for k, want := range map[string]string{
		"Uid": strings.Repeat(uid+" ", 3) + uid, "Groups": gid, "CapBnd": "00000000000000e0",
		"CapEff": "00000000000000e0", "CapAmb": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2",
	} {
		expectEqual(t, "the daemon's "+k, st[k], want)
	}
}

// listed returns the ids of the sandboxes the daemon lists (as root, an
// admin: all of them).
func listed(t *testing.T, c *container) []string {
	t.Helper()
	var sbs []struct {
		Sandbox string `json:"sandbox"`
	}
	out := c.sh("sandbox-sidecar ls --json")
	if err := json.Unmarshal([]byte(out), &sbs); err != nil {
		t.Fatalf("sandbox-sidecar ls --json: %v\n%s", err, out)
	}
	var ids []string
	for _, s := range sbs {
		ids = append(ids, s.Sandbox)
	}
	return ids
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// checkWatchdog freezes the daemon with SIGSTOP while it holds an expiring
// sandbox and a connection-bound one running a command, and expects the
// watchdog to replace it and recovery to keep the first and leave nothing
// of the second. It returns the expiring sandbox's id.
func checkWatchdog(t *testing.T, c *container) string {
	kept := strings.TrimSpace(c.sh(as(worker, "sandbox-sidecar create --ttl 30m --owner etl/pkgtest")))
	bg := c.background(t, "bash", "-c", as(worker, "sandbox-sidecar exec --command-timeout 10m -- sleep 600"))
	c.waitFor(30*time.Second, "the sandboxed sleep running", "pgrep -x -f 'sleep 600'")
	// Two live sandboxes, two host uids of the range, neither the daemon's,
	// and the sleep runs as its sandbox's, with no capability on the host.
	c.sh(as(worker, "sandbox-sidecar exec --sandbox "+kept+" -- true"))
	uids := strings.Fields(c.sh("ps -eo uid=,comm= | awk '$2 == \"sandbox-init\" {print $1}' | sort -u"))
	daemonUID := strings.TrimSpace(c.sh("id -u " + daemonUser))
	if len(uids) != 2 || slices.Contains(uids, daemonUID) || slices.Contains(uids, "65534") {
		t.Errorf("the inits of two live sandboxes run as host uids %v (the daemon is %s); want two of the range", uids, daemonUID)
	}
	for _, u := range uids {
		if n, err := strconv.ParseUint(u, 10, 32); err != nil || n < 0x70000000 || n >= 0x70010000 {
			t.Errorf("sandbox uid %s is not in the default range", u)
		}
	}
	expectEqual(t, "the sandboxed sleep's host capabilities",
		c.sh("grep CapPrm /proc/$(pgrep -x -f 'sleep 600')/status | cut -f2"), "0000000000000000")
	initsBefore := strings.Fields(c.sh("pgrep -x sandbox-init | sort"))
	var doomed string
	for _, id := range listed(t, c) {
		if id != kept {
			doomed = id
		}
	}
	if doomed == "" {
		t.Fatalf("the connection-bound sandbox is not listed: %v", listed(t, c))
	}

	mainPID := strings.TrimSpace(c.sh("systemctl show -P MainPID sandbox-sidecar.service"))
	restarts := strings.TrimSpace(c.sh("systemctl show -P NRestarts sandbox-sidecar.service"))
	n, _ := strconv.Atoi(restarts)
	frozeAt := time.Now()
	c.sh("kill -STOP " + mainPID)
	c.waitFor(watchdogRestartTimeout, "the watchdog replacing the frozen daemon", fmt.Sprintf(
		`[ "$(systemctl show -P NRestarts sandbox-sidecar.service)" = %d ] && systemctl -q is-active sandbox-sidecar.service && [ "$(systemctl show -P MainPID sandbox-sidecar.service)" != %s ]`,
		n+1, mainPID))
	t.Logf("the frozen daemon was replaced %s after SIGSTOP", time.Since(frozeAt).Round(time.Second))
	journal := c.sh("journalctl -b -u sandbox-sidecar.service --no-pager -o cat")
	expectContains(t, "journal", journal, "Watchdog timeout")

	select {
	case err := <-bg.done:
		if err == nil {
			t.Errorf("the client whose daemon was killed exited 0:\n%s", bg.out.String())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("the client of the killed daemon still waits:\n%s", bg.out.String())
	}

	// Recovery: the expiring sandbox is re-adopted, the connection-bound
	// one destroyed, and nothing of it runs.
	ids := listed(t, c)
	if !contains(ids, kept) || contains(ids, doomed) {
		t.Errorf("after the restart the daemon lists %v; want %s kept and %s gone", ids, kept, doomed)
	}
	c.sh(fmt.Sprintf("test -d %s/bwrap/%s && ! test -e %s/bwrap/%s", stateDir, kept, stateDir, doomed))
	if code, out := c.exitCode("pgrep -a -x -f 'sleep 600'"); code == 0 {
		t.Errorf("the connection-bound sandbox's command outlived its destroy:\n%s", out)
	}
	// The kept sandbox's init outlived the killed daemon (KillMode=process)
	// and is the one the new daemon uses; the doomed one's is gone.
	c.sh(as(worker, "sandbox-sidecar exec --sandbox "+kept+" -- true"))
	initsAfter := strings.Fields(c.sh("pgrep -x sandbox-init | sort"))
	if len(initsAfter) != 1 || !slices.Contains(initsBefore, initsAfter[0]) {
		t.Errorf("sandbox inits %v after the restart (before: %v); want the kept sandbox's, which outlived the daemon", initsAfter, initsBefore)
	}
	if code, _ := c.exitCode("test -d /proc/" + mainPID); code == 0 {
		t.Errorf("the frozen daemon (pid %s) still exists", mainPID)
	}
	// Only the new daemon runs as the daemon's user.
	c.waitFor(10*time.Second, "only the new daemon running as "+daemonUser,
		`[ "$(pgrep -u `+daemonUser+`)" = "$(systemctl show -P MainPID sandbox-sidecar.service)" ]`)

	var health struct {
		Status   string `json:"status"`
		Recovery struct {
			Adopted   int `json:"adopted"`
			Destroyed int `json:"destroyed"`
		} `json:"recovery"`
	}
	out := c.sh("sandbox-sidecar health --json")
	if err := json.Unmarshal([]byte(out), &health); err != nil {
		t.Fatalf("health --json: %v\n%s", err, out)
	}
	if health.Status != "ok" || health.Recovery.Adopted < 1 || health.Recovery.Destroyed < 1 {
		t.Errorf("after the restart: %s", out)
	}
	return kept
}

// checkByHand stops the units and runs the daemon as its user by hand: it
// makes its own socket with the same owner and mode.
func checkByHand(t *testing.T, c *container, kept string) {
	c.sh("systemctl stop sandbox-sidecar.socket sandbox-sidecar.service")
	c.sh("! test -e " + socketPath)
	c.sh(fmt.Sprintf(`setsid -f bash -c 'echo $$ > /run/byhand.pid; exec setpriv --reuid %[1]s --regid %[1]s --init-groups -- sandbox-sidecar serve >/run/byhand.log 2>&1'`, daemonUser))
	c.waitFor(20*time.Second, "the hand-started daemon's socket", "test -S "+socketPath)
	expectEqual(t, "hand-made socket", c.sh("stat -c '%U:%G %a' "+socketPath), "sandbox-sidecar:sandbox-sidecar 660")
	expectEqual(t, "a worker's command, daemon started by hand", c.sh(as(worker, "sandbox-sidecar exec -- echo by hand")), "by hand")
	if code, out := c.exitCode(as(outsider, "sandbox-sidecar exec -- echo should-not-run")); code == 0 {
		t.Errorf("a user outside the group reached the hand-started daemon:\n%s", out)
	}
	if !contains(listed(t, c), kept) {
		t.Errorf("the hand-started daemon did not re-adopt %s", kept)
	}
	log := c.sh("cat /run/byhand.log")
	if strings.Contains(log, "socket activation") {
		t.Errorf("the hand-started daemon says it was socket-activated:\n%s", log)
	}
	c.sh("kill -TERM $(cat /run/byhand.pid)")
	c.waitFor(daemonStopTimeout, "the hand-started daemon's exit", "! kill -0 $(cat /run/byhand.pid) 2>/dev/null")
	c.sh("! test -e " + socketPath + " && rm /run/byhand.pid /run/byhand.log")

	c.sh("systemctl start sandbox-sidecar.socket")
	expectEqual(t, "socket-activated again", c.sh(as(worker, "sandbox-sidecar exec -- echo back")), "back")
}

func checkRestart(t *testing.T, c *container) {
	inode := strings.TrimSpace(c.sh("stat -c %i " + socketPath))
	mainPID := strings.TrimSpace(c.sh("systemctl show -P MainPID sandbox-sidecar.service"))
	c.sh("systemctl restart sandbox-sidecar.service")
	expectEqual(t, "a command after a restart", c.sh(as(worker, "sandbox-sidecar exec -- echo restarted")), "restarted")
	if got := strings.TrimSpace(c.sh("systemctl show -P MainPID sandbox-sidecar.service")); got == mainPID {
		t.Errorf("systemctl restart left the daemon (pid %s) in place", got)
	}
	// A client arriving while the daemon restarts waits in the socket's
	// backlog and is served by the new daemon.
	mainPID = strings.TrimSpace(c.sh("systemctl show -P MainPID sandbox-sidecar.service"))
	c.sh("systemctl restart --no-block sandbox-sidecar.service")
	expectEqual(t, "a command during a restart", c.sh(as(worker, "sandbox-sidecar exec -- echo through the restart")), "through the restart")
	c.waitFor(30*time.Second, "the restarted daemon", fmt.Sprintf(
		`m=$(systemctl show -P MainPID sandbox-sidecar.service); [ "$m" != %s ] && [ "$m" != 0 ] && systemctl -q is-active sandbox-sidecar.service`, mainPID))
	expectEqual(t, "socket inode across restarts", c.sh("stat -c %i "+socketPath), inode)
	expectContains(t, "health after a restart", c.sh("sandbox-sidecar health"), "ok: ")
}

func checkUpgrade(t *testing.T, c *container, deb, version, kept string) {
	// An admin's change to the conffile survives the upgrade, unasked.
	c.sh(`sed -i "s/^# log_level = 'info'$/log_level = 'debug'/" ` + configPath + ` && grep -qx "log_level = 'debug'" ` + configPath)
	inode := c.sh("stat -c %i " + socketPath)
	mainPID := c.sh("systemctl show -P MainPID sandbox-sidecar.service")
	uid := c.sh("id -u " + daemonUser)

	c.shTimeout(aptTimeout, "apt-get install -y --no-install-recommends "+deb)
	expectEqual(t, "package status", c.sh("dpkg-query -W -f='${Status} ${Version}' sandbox-sidecar"), "install ok installed "+version)
	expectEqual(t, "binary version", c.sh("sandbox-sidecar version"), "sandbox-sidecar "+version)
	expectEqual(t, "service after the upgrade", c.sh("systemctl is-active sandbox-sidecar.service"), "active")
	if got := c.sh("systemctl show -P MainPID sandbox-sidecar.service"); got == mainPID {
		t.Errorf("the upgrade did not restart the daemon (pid %s)", strings.TrimSpace(got))
	}
	var health struct {
		Version string `json:"version"`
	}
	out := c.sh("sandbox-sidecar health --json")
	if err := json.Unmarshal([]byte(out), &health); err != nil || health.Version != version {
		t.Errorf("the running daemon after the upgrade: %v\n%s", err, out)
	}
	expectEqual(t, "socket inode across the upgrade", c.sh("stat -c %i "+socketPath), strings.TrimSpace(inode))
	expectEqual(t, "uid across the upgrade", c.sh("id -u "+daemonUser), strings.TrimSpace(uid))
	c.sh(`grep -qx "log_level = 'debug'" ` + configPath + ` && ! test -e ` + configPath + `.dpkg-dist`)
	expectEqual(t, "a command after the upgrade", c.sh(as(worker, "sandbox-sidecar exec -- echo upgraded")), "upgraded")
	if !contains(listed(t, c), kept) {
		t.Errorf("the upgraded daemon did not re-adopt %s", kept)
	}
}

func checkRemove(t *testing.T, c *container) {
	c.shTimeout(aptTimeout, "apt-get remove -y sandbox-sidecar")
	for _, unit := range []string{"sandbox-sidecar.socket", "sandbox-sidecar.service"} {
		if _, out := c.exitCode("systemctl is-active " + unit); strings.TrimSpace(out) != "inactive" {
			t.Errorf("%s after remove: %s", unit, out)
		}
	}
	c.sh("! test -e " + socketPath)
	if code, out := c.exitCode("pgrep -a -u " + daemonUser); code == 0 {
		t.Errorf("processes of %s after remove:\n%s", daemonUser, out)
	}
	// Remove keeps what purge takes.
	c.sh(fmt.Sprintf("getent passwd %s && test -d %s && test -f %s", daemonUser, stateDir, configPath))
}

func checkPurge(t *testing.T, c *container) {
	uid := strings.TrimSpace(c.sh("id -u " + daemonUser))
	gid := strings.TrimSpace(c.sh("getent group " + daemonUser + " | cut -d: -f3"))
	c.shTimeout(aptTimeout, "apt-get purge -y sandbox-sidecar")

	if code, out := c.exitCode("dpkg-query -W -f='${Status}' sandbox-sidecar"); code == 0 && !strings.Contains(out, "not-installed") {
		t.Errorf("dpkg still knows the package: %s", out)
	}
	leftovers := c.sh(strings.Join([]string{
		"systemctl daemon-reload",
		"systemctl list-unit-files --no-legend 'sandbox-sidecar*' || true",
		"systemctl list-units --all --no-legend 'sandbox-sidecar*' || true",
		"find /lib/systemd /etc/systemd /run/systemd/system /var/lib/systemd -name '*sandbox-sidecar*'",
		"getent passwd " + daemonUser + " || true",
		"getent group " + daemonUser + " || true",
		"id -nG " + worker + " | tr ' ' '\\n' | grep -x " + daemonUser + " || true",
		"ls -d " + strings.Join([]string{stateDir, filepath.Dir(socketPath), filepath.Dir(configPath), "/var/log/sandbox-sidecar"}, " ") + " 2>/dev/null || true",
		"pgrep -a -u " + uid + " || true",
		// Anything the user or group still owns, anywhere.
		"find / /run /tmp /var/tmp -xdev \\( -uid " + uid + " -o -gid " + gid + " \\) -print 2>/dev/null || true",
	}, "; "))
	// A unit whose file is gone can stay in systemd's memory as
	// "not-found inactive dead" until its garbage collection runs: that is
	// systemd's bookkeeping, not something the package left on the system.
	var left []string
	for _, l := range strings.Split(leftovers, "\n") {
		if f := strings.Fields(strings.TrimLeft(l, "● ")); len(f) >= 4 && f[1] == "not-found" && f[2] == "inactive" && f[3] == "dead" {
			continue
		}
		if strings.TrimSpace(l) != "" {
			left = append(left, l)
		}
	}
	if len(left) > 0 {
		t.Errorf("purge left behind:\n%s", strings.Join(left, "\n"))
	}
}
