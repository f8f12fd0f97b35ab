package packaging

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/test/internal/debroot"
)

const (
	// gvisorDropIn is where docs/operations.md says to install the
	// shipped drop-in.
	gvisorDropIn = "/etc/systemd/system/sandbox-sidecar.service.d/gvisor-backend.conf"
	// runscInContainer is where docs/operations.md installs runsc.
	runscInContainer = "/usr/local/bin/runsc"
	// runscTimeout bounds scripts/install-runsc.sh (a build when nothing is
	// cached: about a minute here, more on a loaded machine).
	runscTimeout = 10 * time.Minute
	// gvisorRestartTimeout bounds the daemon's replacement after kill -9
	// (RestartSec= 2 s, recovery, a start).
	gvisorRestartTimeout = 60 * time.Second
)

// gvisorCaps is the bounding set of the shipped drop-in, as the kernel
// numbers them (linux/capability.h): what the running daemon must hold,
// no more.
var gvisorCaps = map[string]uint{
	"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_SETGID": 6, "CAP_SETUID": 7,
	"CAP_SYS_ADMIN": 21, "CAP_SETFCAP": 31,
}

// TestGVisorDropInOnSystemd boots the package configured the documented
// way for the gvisor backend (backend = "gvisor", runsc in /usr/local/bin,
// the shipped drop-in) in a container of its own and proves that a worker's
// command runs in a gVisor sandbox through the socket-activated daemon,
// files cross in both directions, a kill -9 of the daemon is recovered
// from, and systemd-analyze security of the unit with the drop-in is the
// score docs/security.md and the drop-in state.
func TestGVisorDropInOnSystemd(t *testing.T) {
	requireEnvironment(t)
	runsc := pinnedRunsc(t)
	began := time.Now()
	step := stepper(t)

	step("build the package")
	share := filepath.Join(t.TempDir(), "share")
	if err := os.Mkdir(share, 0o755); err != nil {
		t.Fatal(err)
	}
	version := changelogVersion(t)
	deb := "/share/" + filepath.Base(buildDeb(t, version, share))

	step("container image, runsc installed in it")
	root := unpack(t, image(t))
	// The rootfs is this test's own copy: the shared cache is only read.
	copyFile(t, runsc, filepath.Join(root, runscInContainer), 0o755)

	step("boot")
	c := boot(t, root, share)

	step("install, configure for gvisor")
	c.shTimeout(aptTimeout, "apt-get install -y --no-install-recommends "+deb)
	// "runsc version v0.0.0-...", then the OCI spec's version.
	runscVersion := strings.Fields(c.sh(runscInContainer + " --version"))
	if len(runscVersion) < 3 || runscVersion[1] != "version" {
		t.Fatalf("%s --version: %q", runscInContainer, runscVersion)
	}
	c.sh(`sed -i -e "s|^# backend = 'bwrap'$|backend = \"gvisor\"|" -e "s|^# runsc_path = ''$|runsc_path = \"` + runscInContainer + `\"|" ` + configPath +
		` && grep -qx 'backend = "gvisor"' ` + configPath + ` && grep -qx 'runsc_path = "` + runscInContainer + `"' ` + configPath)
	expectEqual(t, "config check", c.sh("sandbox-sidecar config check"), configPath+": OK")
	c.sh("mkdir -p " + filepath.Dir(gvisorDropIn) + " && cp /usr/share/doc/sandbox-sidecar/examples/gvisor-backend.conf " + gvisorDropIn +
		" && systemctl daemon-reload")
	if verify := c.sh("systemd-analyze verify sandbox-sidecar.service 2>&1"); strings.TrimSpace(verify) != "" {
		t.Errorf("systemd-analyze verify with the gVisor drop-in is not silent:\n%s", verify)
	}
	checkGVisorExposure(t, c)

	step("a worker's command in a gVisor sandbox")
	c.sh(fmt.Sprintf("useradd -m -G %s %s", daemonUser, worker))
	got := c.sh(as(worker, `sandbox-sidecar exec -- sh -c 'uname -r; id -u; hostname; dmesg | head -n 1'`))
	lines := strings.Split(strings.TrimSpace(got), "\n")
	hostKernel := strings.TrimSpace(c.sh("uname -r"))
	if len(lines) != 4 || lines[0] == hostKernel || lines[1] != "1000" || lines[2] != "sandbox" || !strings.Contains(lines[3], "Starting gVisor") {
		t.Errorf("a worker's command in a gVisor sandbox printed %q; want gVisor's kernel (not the host's %s), uid 1000, host name sandbox, gVisor's dmesg", lines, hostKernel)
	}
	expectEqual(t, "TriggeredBy", c.sh("systemctl show -P TriggeredBy sandbox-sidecar.service"), "sandbox-sidecar.socket")
	checkGVisorHealth(t, c, runscVersion[2])
	checkGVisorDaemon(t, c)

	step("files both ways, python, a timeout")
	checkGVisorSandbox(t, c, lines[0])

	step("kill -9 of the daemon")
	checkGVisorCrash(t, c)

	step("stop")
	c.sh("systemctl stop sandbox-sidecar.socket sandbox-sidecar.service")
	if code, out := c.exitCode("pgrep -a -f 'runsc-(sandbox|gofer)'"); code == 0 {
		t.Errorf("runsc processes outlive the stopped service:\n%s", out)
	}

	step("done")
	t.Logf("the gVisor packaging test took %s", time.Since(began).Round(time.Second))
}

// pinnedRunsc returns the pinned runsc build: $SANDBOX_SIDECAR_RUNSC (what
// scripts/test.sh exports), else scripts/install-runsc.sh's cached one
// (which it builds when the cache has none). No runsc skips, or fails
// under CI=true.
func pinnedRunsc(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SANDBOX_SIDECAR_RUNSC"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("SANDBOX_SIDECAR_RUNSC=%s: %v", p, err)
		}
		return p
	}
	ctx, cancel := context.WithTimeout(context.Background(), runscTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(repoRoot(t), "scripts", "install-runsc.sh"))
	cmd.Env = append(os.Environ(), "RUNSC_CACHE="+debroot.CacheDir())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := fmt.Sprintf("no pinned runsc (scripts/install-runsc.sh: %v)\n%s", err, debroot.Tail(stderr.String(), 20))
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return strings.TrimSpace(string(out))
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dst, mode); err != nil {
		t.Fatal(err)
	}
}

// documentedScore finds the score a document states with re (one group).
func documentedScore(t *testing.T, what, text string, re *regexp.Regexp) string {
	t.Helper()
	m := re.FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("%s does not state the drop-in's systemd-analyze security score (%s)", what, re)
	}
	return m[1]
}

// checkGVisorExposure compares systemd-analyze security of the unit with
// the drop-in with what docs/security.md and the drop-in's own comment say.
func checkGVisorExposure(t *testing.T, c *container) {
	score := checkDocumentedExposure(t, c, "the gVisor drop-in", "gvisor-backend.conf",
		regexp.MustCompile("`systemd-analyze security --offline=yes` rates the unit with the gVisor drop-in ([0-9]+\\.[0-9])"),
		regexp.MustCompile(`systemd-analyze security rates the unit with this drop-in ([0-9]+\.[0-9])`))
	t.Logf("systemd-analyze security --offline=yes with the gVisor drop-in: %s", score)
}

// checkDocumentedExposure returns systemd-analyze security's score of the
// unit with the drop-ins installed now (what), after comparing it with the
// score docs/security.md states (docRe) and the one packaging/systemd/
// examples/dropIn's comment states (dropInRe).
func checkDocumentedExposure(t *testing.T, c *container, what, dropIn string, docRe, dropInRe *regexp.Regexp) string {
	t.Helper()
	score := exposure(t, c)
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	comment, err := os.ReadFile(filepath.Join(repoRoot(t), "packaging", "systemd", "examples", dropIn))
	if err != nil {
		t.Fatal(err)
	}
	for where, want := range map[string]string{
		"docs/security.md": documentedScore(t, "docs/security.md", string(doc), docRe),
		dropIn:             documentedScore(t, dropIn, string(comment), dropInRe),
	} {
		if score != want {
			t.Errorf("systemd-analyze security rates the unit with %s %s; %s says %s", what, score, where, want)
		}
	}
	return score
}

func checkGVisorHealth(t *testing.T, c *container, runscVersion string) {
	expectContains(t, "health", c.sh("sandbox-sidecar health"), "ok: backend gvisor")
	var h struct {
		Backend     string            `json:"backend"`
		BackendInfo map[string]string `json:"backend_info"`
	}
	out := c.sh("sandbox-sidecar health --json")
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		t.Fatalf("health --json: %v\n%s", err, out)
	}
	if h.Backend != "gvisor" || h.BackendInfo["runsc"] != runscInContainer || h.BackendInfo["runsc_version"] != runscVersion || h.BackendInfo["platform"] != "systrap" {
		t.Errorf("health --json: backend %q, backend_info %v; want gvisor, %s %s, systrap", h.Backend, h.BackendInfo, runscInContainer, runscVersion)
	}
}

// checkGVisorDaemon asserts what the drop-in leaves the running daemon:
// root, exactly the drop-in's bounding set, nothing ambient, no new
// privileges, the unit's system-call filter.
func checkGVisorDaemon(t *testing.T, c *container) {
	var mask uint64
	for _, bit := range gvisorCaps {
		mask |= 1 << bit
	}
	st := map[string]string{}
	for _, line := range strings.Split(c.sh("cat /proc/$(systemctl show -P MainPID sandbox-sidecar.service)/status"), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			st[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	for k, want := range map[string]string{
		"Uid": "0 0 0 0", "CapBnd": fmt.Sprintf("%016x", mask), "CapEff": fmt.Sprintf("%016x", mask),
		"CapAmb": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2",
	} {
		expectEqual(t, "the gVisor daemon's "+k, st[k], want)
	}
	// The drop-in's set is the one this test expects.
	dropIn, err := os.ReadFile(filepath.Join(repoRoot(t), "packaging", "systemd", "examples", "gvisor-backend.conf"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CapabilityBoundingSet=(CAP_.+)$`).FindStringSubmatch(string(dropIn))
	if m == nil || len(strings.Fields(m[1])) != len(gvisorCaps) {
		t.Fatalf("the drop-in's bounding set %q is not the test's %v", m, gvisorCaps)
	}
	for _, name := range strings.Fields(m[1]) {
		if _, ok := gvisorCaps[name]; !ok {
			t.Errorf("the drop-in names %s, which the test does not expect", name)
		}
	}
}

// checkGVisorSandbox runs a sandbox's life as the worker: a host write read
// inside, a guest write read from the host (each right after the other),
// python (on gVisor's kernel), a command past its timeout and one after it, destroy.
func checkGVisorSandbox(t *testing.T, c *container, guestKernel string) {
	id := strings.TrimSpace(c.sh(as(worker, "sandbox-sidecar create --ttl 10m")))
	c.sh(as(worker, "sh -c 'echo from the host | sandbox-sidecar write "+id+" /workspace/a/host.txt'"))
	expectEqual(t, "a host write read inside", c.sh(as(worker, "sandbox-sidecar exec --sandbox "+id+" -- cat /workspace/a/host.txt")), "from the host")
	c.sh(as(worker, "sandbox-sidecar exec --sandbox "+id+` -- sh -c 'echo from the guest > /workspace/guest.txt && mkdir /workspace/d && chmod 600 /workspace/guest.txt'`))
	expectEqual(t, "a guest write read from the host", c.sh(as(worker, "sandbox-sidecar read "+id+" /workspace/guest.txt")), "from the guest")
	c.sh(as(worker, "sh -c 'echo rewritten | sandbox-sidecar write "+id+" /workspace/guest.txt'"))
	expectEqual(t, "a host rewrite of a guest's file", c.sh(as(worker, "sandbox-sidecar exec --sandbox "+id+" -- cat /workspace/guest.txt")), "rewritten")
	expectEqual(t, "python in gVisor", c.sh(as(worker, "sandbox-sidecar exec --sandbox "+id+` -- python3 -c 'import os; print(os.uname().release)'`)), guestKernel)
	code, out := c.exitCode(as(worker, "sandbox-sidecar exec --sandbox "+id+" --command-timeout 1s -- sleep 100"))
	if code == 0 {
		t.Errorf("a command past its timeout exited 0:\n%s", out)
	}
	expectEqual(t, "a command after a timeout", c.sh(as(worker, "sandbox-sidecar exec --sandbox "+id+" -- echo still here")), "still here")
	c.sh(as(worker, "sandbox-sidecar rm "+id))
	if strings.Contains(c.sh("runsc --root="+stateDir+"/gvisor/.runsc list -quiet"), id) {
		t.Errorf("runsc still lists the destroyed sandbox %s", id)
	}
}

// checkGVisorCrash kills the daemon with -9 while it holds an expiring
// sandbox and a connection-bound one running a command: systemd restarts
// it, the first is re-adopted with its files, the second is gone from the
// journal and from runsc.
func checkGVisorCrash(t *testing.T, c *container) {
	kept := strings.TrimSpace(c.sh(as(worker, "sandbox-sidecar create --ttl 30m")))
	c.sh(as(worker, "sandbox-sidecar exec --sandbox "+kept+" -- sh -c 'echo kept > /workspace/k'"))
	bg := c.background(t, "bash", "-c", as(worker, "sandbox-sidecar exec --command-timeout 10m -- sleep 600"))
	c.waitFor(30*time.Second, "two runsc sandboxes listed", fmt.Sprintf(`[ "$(runsc --root=%s/gvisor/.runsc list -quiet | wc -l)" = 2 ]`, stateDir))
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
	n, _ := strconv.Atoi(strings.TrimSpace(c.sh("systemctl show -P NRestarts sandbox-sidecar.service")))
	c.sh("kill -9 " + mainPID)
	c.waitFor(gvisorRestartTimeout, "systemd restarting the killed daemon", fmt.Sprintf(
		`[ "$(systemctl show -P NRestarts sandbox-sidecar.service)" = %d ] && systemctl -q is-active sandbox-sidecar.service`, n+1))
	select {
	case err := <-bg.done:
		if err == nil {
			t.Errorf("the client whose daemon was killed exited 0:\n%s", bg.out.String())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("the client of the killed daemon still waits:\n%s", bg.out.String())
	}
	ids := listed(t, c)
	if !contains(ids, kept) || contains(ids, doomed) {
		t.Errorf("after kill -9 the daemon lists %v; want %s kept and %s gone", ids, kept, doomed)
	}
	expectEqual(t, "the re-adopted sandbox's file", c.sh(as(worker, "sandbox-sidecar exec --sandbox "+kept+" -- cat /workspace/k")), "kept")
	if runscList := c.sh("runsc --root=" + stateDir + "/gvisor/.runsc list -quiet"); strings.Contains(runscList, doomed) {
		t.Errorf("runsc still lists the destroyed sandbox %s:\n%s", doomed, runscList)
	}
	if code, out := c.exitCode("pgrep -a -f 'runsc-sandbox.*" + doomed + "'"); code == 0 {
		t.Errorf("the destroyed sandbox's runsc still runs:\n%s", out)
	}
	c.sh(as(worker, "sandbox-sidecar rm "+kept))
}
