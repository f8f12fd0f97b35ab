// Package image proves the daemon's container image (make image) with
// Debian's podman: the image runs as the daemon, and a second container of
// another uid (the official Airflow image's, 50000) that shares only the
// socket's directory runs the Python client end to end against it.
//
// It needs root, podman, runc and debootstrap (the image's root filesystem
// is debootstrapped once and cached under /var/cache/sandbox-sidecar-test),
// and takes minutes cold, so it runs only when SANDBOX_SIDECAR_IMAGE_TEST=1,
// as scripts/test.sh does. It skips without them, and fails instead when
// CI=true. podman runs with a storage of its own under a temp directory and
// --network none: nothing system-wide is touched.
package image

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

const (
	enableEnv = "SANDBOX_SIDECAR_IMAGE_TEST"
	cacheDir  = "/var/cache/sandbox-sidecar-test"
	// buildTimeout bounds make image cold (debootstrap on two cores).
	buildTimeout = 15 * time.Minute
	// podmanTimeout bounds one podman command.
	podmanTimeout = 3 * time.Minute
	// serveTimeout bounds the daemon container's start.
	serveTimeout = 60 * time.Second
	workerUID    = 50000
)

func requireEnvironment(t *testing.T) {
	t.Helper()
	// Asked for first, as the packaging test does: scripts/test.sh installs
	// podman and runc only in its packaging step, after the whole suite's
	// go test, and runs this test in a step of its own.
	if os.Getenv(enableEnv) != "1" {
		t.Skipf("takes minutes: runs in the container image step of scripts/test.sh; alone: sudo %s=1 go test -v ./test/image", enableEnv)
	}
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, tool := range []string{"podman", "runc", "debootstrap"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	switch {
	case len(missing) > 0 && os.Getenv("CI") == "true":
		t.Fatalf("the image test needs %s, and CI=true forbids skipping", strings.Join(missing, ", "))
	case len(missing) > 0:
		t.Skipf("needs %s", strings.Join(missing, ", "))
	}
}

// podman runs podman with a storage of its own.
type podman struct {
	t    *testing.T
	base []string
}

func newPodman(t *testing.T) *podman {
	dir := t.TempDir()
	p := &podman{t: t, base: []string{
		"--root", filepath.Join(dir, "storage"), "--runroot", filepath.Join(dir, "run"),
		"--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "file",
		// crun, podman's default, refuses this host's hybrid cgroup layout.
		"--runtime", "runc",
		"--tmpdir", filepath.Join(dir, "tmp"),
	}}
	t.Cleanup(func() { _, _ = p.try("rm", "--all", "--force", "--time", "10") })
	return p
}

func (p *podman) try(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), podmanTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "podman", append(append([]string{}, p.base...), args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func (p *podman) run(args ...string) string {
	p.t.Helper()
	out, err := p.try(args...)
	if err != nil {
		p.t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// buildImage runs make image's script into a temp directory.
func buildImage(t *testing.T) string {
	t.Helper()
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "../../packaging/image/build.sh", out)
	cmd.Env = append(os.Environ(), "IMAGE_CACHE="+cacheDir, "VERSION=0.1.0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("make image: %v\n%s", err, tail(stderr.String(), 40))
	}
	archive := strings.TrimSpace(string(stdout))
	fi, err := os.Stat(archive)
	if err != nil {
		t.Fatalf("make image printed %q: %v", archive, err)
	}
	t.Logf("make image: %s, %d MiB, in %s", filepath.Base(archive), fi.Size()>>20, time.Since(start).Round(time.Second))
	return archive
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// clientScript is what the worker container runs: the Python client of
// this checkout, end to end.
const clientScript = `
import os, sys
sys.path.insert(0, "/client")
from sandbox_sidecar import SidecarClient
print("worker uid", os.getuid())
with SidecarClient() as c:
    box = c.create()["sandbox"]
    c.write_file(box, "job.py", b"import os\nprint(6 * 7, os.getuid())\n")
    res = c.run_command(box, "python3 job.py", timeout_s=60)
    print("exit", res["exit_code"], "stdout", res["stdout"].decode().strip())
    print("read", c.read_file(box, "job.py")["data"][:6])
    listed = [s["sandbox"] for s in c.call("list")["sandboxes"]]
    print("listed", box in listed)
    c.destroy(box)
print("client done")
`

func TestImageWithPodman(t *testing.T) {
	requireEnvironment(t)
	archive := buildImage(t)
	p := newPodman(t)

	loaded := p.run("load", "--input", archive)
	m := regexp.MustCompile(`Loaded image(?:\(s\))?: *(\S+)`).FindStringSubmatch(loaded)
	if m == nil {
		t.Fatalf("podman load said:\n%s", loaded)
	}
	img := m[1]
	t.Logf("loaded %s", img)
	inspect := p.run("image", "inspect", "--format", "{{.Config.Entrypoint}} {{.Config.Cmd}} {{.Config.User}} {{.Os}}/{{.Architecture}}", img)
	if want := "[/usr/bin/sandbox-sidecar] [serve] 0:0 linux/amd64"; strings.TrimSpace(inspect) != want {
		t.Errorf("image config = %q, want %q", strings.TrimSpace(inspect), want)
	}

	// The socket's directory is all the two containers share.
	sockDir, err := os.MkdirTemp("", "sidecar-image-sock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	if err := os.Chmod(sockDir, 0o755); err != nil {
		t.Fatal(err)
	}
	var suffix [4]byte
	rand.Read(suffix[:])
	name := "sidecar-image-test-" + hex.EncodeToString(suffix[:])
	ulimits := []string{"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"}

	daemonArgs := append([]string{"run", "--detach", "--name", name, "--network", "none", "--privileged",
		"--volume", sockDir + ":/run/sandbox-sidecar"}, ulimits...)
	daemonArgs = append(daemonArgs, img, "serve", "--allow-uid", fmt.Sprint(workerUID), "--socket-group", "0", "--log-format", "json")
	p.run(daemonArgs...)
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := p.try("logs", name)
			t.Logf("the daemon container's log:\n%s", tail(logs, 60))
		}
	})
	deadline := time.Now().Add(serveTimeout)
	for {
		logs, _ := p.try("logs", name)
		if strings.Contains(logs, "is listening on /run/sandbox-sidecar/sidecar.sock") {
			break
		}
		state, _ := p.try("inspect", "--format", "{{.State.Status}}", name)
		if strings.TrimSpace(state) == "exited" || time.Now().After(deadline) {
			t.Fatalf("the daemon container did not serve (state %s):\n%s", strings.TrimSpace(state), tail(logs, 60))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(sockDir, "sidecar.sock")); err != nil {
		t.Fatalf("no socket in the shared directory: %v", err)
	}
	health := p.run("exec", name, "sandbox-sidecar", "health")
	t.Logf("health in the daemon container: %s", strings.TrimSpace(health))

	// The worker: another uid, no privileges, only the socket's directory
	// and the client's source (read-only).
	src, err := filepath.Abs("../../clients/python/src")
	if err != nil {
		t.Fatal(err)
	}
	worker := func(user string) (string, error) {
		args := append([]string{"run", "--rm", "--network", "none", "--user", user,
			"--security-opt", "no-new-privileges", "--cap-drop", "all",
			"--volume", sockDir + ":/run/sandbox-sidecar", "--volume", src + ":/client:ro", "--entrypoint", "python3"}, ulimits...)
		return p.try(append(args, img, "-c", clientScript)...)
	}
	out, err := worker(fmt.Sprintf("%d:0", workerUID))
	t.Logf("the worker container (%v):\n%s", err, out)
	for _, want := range []string{fmt.Sprintf("worker uid %d", workerUID), "exit 0 stdout 42 ", "read b'import'", "listed True", "client done"} {
		if !strings.Contains(out, want) {
			t.Errorf("the worker's output lacks %q", want)
		}
	}

	// A uid outside the allow-list and the socket's group: kept out.
	out, err = worker("4242:4242")
	if err == nil || strings.Contains(out, "client done") {
		t.Errorf("a uid outside the allow-list got in (err %v):\n%s", err, out)
	}
	t.Logf("uid 4242: %s", tail(out, 3))

	// SIGTERM stops the daemon cleanly.
	p.run("stop", "--time", "30", name)
	if code := strings.TrimSpace(p.run("inspect", "--format", "{{.State.ExitCode}}", name)); code != "0" {
		t.Errorf("the daemon container exited %s after SIGTERM", code)
	}
}
