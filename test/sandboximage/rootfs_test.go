package sandboximage

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The numpy image: a minimal Debian bookworm with python3 and numpy,
// debootstrapped once and cached as a tarball under cacheDir, as
// test/packaging caches its rootfs.
const (
	suite   = "bookworm"
	variant = "minbase"
	// debootstrapTimeout bounds building the rootfs cold.
	debootstrapTimeout = 15 * time.Minute
	// rootfsFormat changes when what is done after debootstrap changes.
	rootfsFormat = "1"
)

var numpyPackages = []string{"python3", "python3-numpy"}

// cacheDir is where built root filesystems are kept between runs.
func cacheDir() string {
	if d := os.Getenv("SANDBOX_SIDECAR_TEST_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "sandbox-sidecar-test")
	}
	return "/var/cache/sandbox-sidecar-test"
}

func rootfsKey(pkgs []string) string {
	pkgs = slices.Clone(pkgs)
	slices.Sort(pkgs)
	h := sha256.Sum256([]byte(strings.Join([]string{rootfsFormat, suite, variant, strings.Join(pkgs, ",")}, "\n")))
	return hex.EncodeToString(h[:])[:16]
}

// debianMirror is the mirror this host's apt uses for the suite
// (SANDBOX_SIDECAR_DEBIAN_MIRROR overrides it).
func debianMirror() string {
	if m := os.Getenv("SANDBOX_SIDECAR_DEBIAN_MIRROR"); m != "" {
		return m
	}
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, stanza := range strings.Split(string(b), "\n\n") {
			fields := map[string]string{}
			for _, line := range strings.Split(stanza, "\n") {
				if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, "#") && !strings.HasPrefix(line, " ") {
					fields[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
				}
			}
			if fields["enabled"] != "no" && slices.Contains(strings.Fields(fields["types"]), "deb") &&
				slices.Contains(strings.Fields(fields["suites"]), suite) {
				if uris := strings.Fields(fields["uris"]); len(uris) > 0 {
					return uris[0]
				}
			}
		}
	}
	lists, _ := filepath.Glob("/etc/apt/sources.list.d/*.list")
	for _, path := range append([]string{"/etc/apt/sources.list"}, lists...) {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 3 || fs[0] != "deb" {
				continue
			}
			fs = fs[1:]
			if strings.HasPrefix(fs[0], "[") {
				for len(fs) > 0 && !strings.HasSuffix(fs[0], "]") {
					fs = fs[1:]
				}
				if len(fs) > 0 {
					fs = fs[1:]
				}
			}
			if len(fs) >= 2 && fs[1] == suite {
				f.Close()
				return fs[0]
			}
		}
		f.Close()
	}
	return "http://deb.debian.org/debian"
}

// numpyRootfs returns the cached rootfs tarball of the numpy image,
// debootstrapping it when there is none; concurrent runs wait on a lock.
func numpyRootfs(t *testing.T) string {
	t.Helper()
	dir := cacheDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("creating the cache %s: %v", dir, err)
	}
	tarball := filepath.Join(dir, fmt.Sprintf("sandbox-image-numpy-%s-%s.tar", suite, rootfsKey(numpyPackages)))
	lock, err := os.OpenFile(tarball+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := flockTimeout(lock, debootstrapTimeout); err != nil {
		t.Fatalf("waiting for another run building %s: %v", tarball, err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(tarball); err == nil {
		t.Logf("numpy rootfs: cached %s", tarball)
		return tarball
	}
	mirror := debianMirror()
	start := time.Now()
	t.Logf("numpy rootfs: debootstrap %s (%s, +%s) from %s", suite, variant, strings.Join(numpyPackages, ","), mirror)
	root := filepath.Join(t.TempDir(), "root")
	ctx, cancel := context.WithTimeout(context.Background(), debootstrapTimeout)
	defer cancel()
	out, err := runHost(ctx, "debootstrap", "--variant="+variant, "--include="+strings.Join(numpyPackages, ","), suite, root, mirror)
	if err != nil {
		t.Fatalf("debootstrap failed (%v); last output:\n%s", err, tail(out, 40))
	}
	// What an image does not need: apt's lists and caches.
	for _, d := range []string{"var/cache/apt/archives", "var/lib/apt/lists"} {
		_ = os.RemoveAll(filepath.Join(root, d))
	}
	tmp := tarball + ".tmp"
	if out, err := runHost(ctx, "tar", "--numeric-owner", "-C", root, "-cf", tmp, "."); err != nil {
		os.Remove(tmp)
		t.Fatalf("archiving the rootfs: %v\n%s", err, tail(out, 20))
	}
	if err := os.Rename(tmp, tarball); err != nil {
		t.Fatal(err)
	}
	t.Logf("numpy rootfs: built in %s", time.Since(start).Round(time.Second))
	return tarball
}

func flockTimeout(f *os.File, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if err != syscall.EWOULDBLOCK || time.Now().After(deadline) {
			return err
		}
		time.Sleep(time.Second)
	}
}

// runHost runs a command on the host, output combined, its whole process
// group killed on timeout.
func runHost(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s timed out: %w", name, ctx.Err())
	}
	return string(out), err
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
