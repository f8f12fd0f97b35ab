// Package sandboximage proves images end to end, against the real daemon
// (built statically, as an image sandbox's init must be) and bubblewrap:
// an image built from Debian packages (a debootstrapped bookworm with
// python3, numpy, pandas and matplotlib, cached under
// /var/cache/sandbox-sidecar-test as test/packaging caches its rootfs,
// packed as an OCI layout with go-containerregistry) imported through the
// CLI and the socket, in whose sandboxes numpy imports while it does not
// on the host image, and the conformance suite on it (code contexts
// rendering DataFrames and figures among it); a small
// busybox image without any python; a gVisor snapshot with memory of a
// sandbox on the numpy image; a pull from go-containerregistry's
// in-memory registry on 127.0.0.1; a daemon killed with -9 mid-import;
// and an image in use that cannot be removed.
//
// The tests that need the debootstrapped image take minutes cold, so they
// run only when SANDBOX_SIDECAR_SANDBOX_IMAGE_TEST=1, as scripts/test.sh
// sets; every test skips without root and bubblewrap, and fails instead
// when CI=true.
package sandboximage

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/test/internal/testdaemon"
)

const enableEnv = "SANDBOX_SIDECAR_SANDBOX_IMAGE_TEST"

var daemonBin string

func TestMain(m *testing.M) { testdaemon.Main(m, &daemonBin) }

// requireSlow is for the tests that debootstrap.
func requireSlow(t *testing.T) {
	t.Helper()
	testdaemon.RequireHost(t)
	if _, err := exec.LookPath("debootstrap"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs debootstrap, and CI=true forbids skipping")
		}
		t.Skip("needs debootstrap")
	}
	if os.Getenv(enableEnv) != "1" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("set %s=1 (scripts/test.sh does): CI=true forbids skipping", enableEnv)
		}
		t.Skipf("takes minutes cold: set %s=1 (scripts/test.sh does)", enableEnv)
	}
}

type daemon struct {
	t        *testing.T
	proc     *testdaemon.Process
	cmd      *exec.Cmd
	socket   string
	stateDir string
	args     []string
}

func startDaemon(t *testing.T, base string, extra ...string) *daemon {
	t.Helper()
	testdaemon.RequireHost(t)
	if base == "" {
		var err error
		base, err = os.MkdirTemp("", "sidecar-img")
		require.NoError(t, err)
		require.NoError(t, os.Chmod(base, 0o755))
		t.Cleanup(func() { os.RemoveAll(base) })
	}
	d := &daemon{t: t, socket: filepath.Join(base, "run", "sidecar.sock"), stateDir: filepath.Join(base, "state")}
	d.args = testdaemon.NoHostConfig(append([]string{"serve", "--socket", d.socket, "--state-dir", d.stateDir, "--log-format", "json", "--reap-interval", "200ms"}, extra...))
	d.start()
	t.Cleanup(d.end)
	return d
}

func (d *daemon) start() {
	d.t.Helper()
	cmd := exec.Command(daemonBin, d.args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The daemon runs with the packaged unit's UMask=0077: what it makes
	// for the sandboxes must not depend on a friendlier umask.
	old := syscall.Umask(0o077)
	d.proc = testdaemon.Start(d.t, cmd, 60*time.Second, func() { syscall.Umask(old) })
	d.cmd = cmd
}

// stop stops the daemon; its kept sandboxes live on, for a restart.
func (d *daemon) stop() {
	if !d.proc.Running() {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.proc.Done():
	case <-time.After(60 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.proc.Done()
		d.t.Errorf("daemon did not stop within 60s of SIGTERM\n%s", d.proc.Logs())
	}
}

// end stops the daemon and ends what its kept sandboxes still run (a kept
// sandbox outlives its daemon, a kill -9 too), their disks with them,
// before the state directory goes: nothing of the test is left.
func (d *daemon) end() {
	d.stop()
	testdaemon.EndSandboxes(d.t, daemonBin, d.socket, d.stateDir)
	gvisor.KillSandboxes(filepath.Join(d.stateDir, "gvisor"))
}

func (d *daemon) kill9() {
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.proc.Done()
}

func (d *daemon) client(t *testing.T) *ipc.Client { return testdaemon.Dial(t, d.socket) }

// cli runs the daemon's binary as a client of d.
func (d *daemon) cli(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return testdaemon.CLI(t, daemonBin, d.socket, args...)
}

// mustCLI is cli that fails t unless it exits 0.
func (d *daemon) mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, code := d.cli(t, args...)
	if code != 0 {
		t.Fatalf("sandbox-sidecar %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
