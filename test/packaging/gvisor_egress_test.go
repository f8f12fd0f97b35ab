package packaging

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// gvisorEgressCaps is the bounding set of the three drop-ins together:
// gvisor-backend.conf's six (it resets egress.conf's, read before it),
// and gvisor-egress.conf's two for runsc's network set-up.
var gvisorEgressCaps = map[string]uint{
	"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_NET_ADMIN": 12,
	"CAP_NET_RAW": 13, "CAP_SYS_ADMIN": 21, "CAP_SETFCAP": 31,
}

// TestGVisorEgressDropInsOnSystemd boots the package configured for the
// gvisor backend with egress on: with egress.conf and gvisor-backend.conf
// only, the daemon cannot set up runsc's network and refuses to start;
// with gvisor-egress.conf too it holds exactly the eight capabilities, is
// rated as docs/security.md says, and a worker's allow-listed gVisor
// sandbox reaches the allowed name on the container's own loopback and
// nothing else, with the same checks as the bwrap egress test.
func TestGVisorEgressDropInsOnSystemd(t *testing.T) {
	requireEnvironment(t)
	requireTUN(t)
	runsc := pinnedRunsc(t)
	began := time.Now()
	step := stepper(t)

	step("build the package")
	share, deb := egressShare(t)

	step("container image, runsc installed in it")
	root := unpack(t, image(t))
	copyFile(t, runsc, filepath.Join(root, runscInContainer), 0o755)

	step("boot")
	c := boot(t, root, share, "--private-network")

	step("install, configure gvisor and egress")
	c.shTimeout(aptTimeout, "apt-get install -y --no-install-recommends "+deb)
	c.sh(fmt.Sprintf("useradd -m -G %s %s", daemonUser, worker))
	c.sh(`sed -i -e "s|^# backend = 'bwrap'$|backend = \"gvisor\"|" -e "s|^# runsc_path = ''$|runsc_path = \"` + runscInContainer + `\"|" ` + configPath +
		` && grep -qx 'backend = "gvisor"' ` + configPath)
	configureEgress(t, c)

	step("without gvisor-egress.conf the daemon refuses to start")
	dir := filepath.Dir(egressDropIn)
	examples := "/usr/share/doc/sandbox-sidecar/examples/"
	c.sh("mkdir -p " + dir + " && cp " + examples + "egress.conf " + examples + "gvisor-backend.conf " + dir + "/ && systemctl daemon-reload")
	if code, out := c.exitCode("systemctl start sandbox-sidecar.service"); code == 0 {
		t.Errorf("the daemon started for egress on gVisor without gvisor-egress.conf:\n%s", out)
	}
	c.exitCode("systemctl stop sandbox-sidecar.service sandbox-sidecar.socket; systemctl reset-failed sandbox-sidecar.service")

	step("the three drop-ins")
	c.sh("cp " + examples + "gvisor-egress.conf " + dir + "/ && systemctl daemon-reload")
	if verify := c.sh("systemd-analyze verify sandbox-sidecar.service 2>&1"); strings.TrimSpace(verify) != "" {
		t.Errorf("systemd-analyze verify with the three drop-ins is not silent:\n%s", verify)
	}
	checkGVisorEgressExposure(t, c)
	checkEgressDeviceACL(t, c)
	c.sh("systemctl start sandbox-sidecar.socket sandbox-sidecar.service")
	expectContains(t, "journal", c.sh("journalctl -b -u sandbox-sidecar.service --no-pager -o cat"), "egress enabled")
	var mask uint64
	for _, bit := range gvisorEgressCaps {
		mask |= 1 << bit
	}
	bnd := c.sh("sed -n 's/^CapBnd:[[:space:]]*//p' /proc/$(systemctl show -P MainPID sandbox-sidecar.service)/status")
	expectEqual(t, "the daemon's bounding set with the three drop-ins", bnd, fmt.Sprintf("%016x", mask))

	step("a loopback server in the container")
	port := startEgressServer(c)

	step("an allow-listed gVisor sandbox")
	sbx := checkEgressAllowlist(t, c, port)
	hostKernel := strings.TrimSpace(c.sh("uname -r"))
	if guest := strings.TrimSpace(c.sh(as(worker, "sandbox-sidecar exec --sandbox "+sbx+" -- uname -r"))); guest == hostKernel {
		t.Errorf("the allow-listed sandbox runs on the host's kernel %s, not gVisor's", hostKernel)
	}

	step("a gVisor sandbox without lists")
	checkEgressNoLists(t, c, port)

	step("the audit trail")
	checkEgressAudit(t, c, sbx, port)

	step("stop")
	c.sh(as(worker, "sandbox-sidecar rm "+sbx))
	c.sh("systemctl stop sandbox-sidecar.socket sandbox-sidecar.service")
	if code, out := c.exitCode("pgrep -a -f 'runsc-(sandbox|gofer)'"); code == 0 {
		t.Errorf("runsc processes outlive the stopped service:\n%s", out)
	}
	t.Logf("the gVisor egress packaging test took %s", time.Since(began).Round(time.Second))
}

// requireTUN skips (fails under CI=true) without /dev/net/tun on the host:
// nspawn gives the container the host's node.
func requireTUN(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		msg := fmt.Sprintf("egress needs /dev/net/tun on the host (modprobe tun): %v", err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// checkGVisorEgressExposure compares systemd-analyze security of the unit
// with the three drop-ins with docs/security.md and gvisor-egress.conf.
func checkGVisorEgressExposure(t *testing.T, c *container) {
	score := checkDocumentedExposure(t, c, "the three drop-ins", "gvisor-egress.conf",
		regexp.MustCompile("gVisor: with `egress.conf`, `gvisor-backend.conf` and `gvisor-egress.conf` \\| \\*\\*([0-9]+\\.[0-9]) "),
		regexp.MustCompile(`rates the unit with all three\n# drop-ins ([0-9]+\.[0-9])`))
	t.Logf("systemd-analyze security --offline=yes with the three drop-ins: %s", score)
}
