package packaging

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

// The container image: a minimal Debian bookworm with systemd as init. The
// packages are what the test needs inside; bubblewrap is there already so
// installing the .deb needs no network and no apt lists.
const (
	suite   = "bookworm"
	variant = "minbase"
	// debootstrapTimeout bounds building the image cold (a few minutes on
	// two cores with a nearby mirror).
	debootstrapTimeout = 12 * time.Minute
	// extractTimeout bounds unpacking the cached image.
	extractTimeout = 2 * time.Minute
	// imageFormat changes when what is done to the image after debootstrap
	// changes, so an old cache is not reused.
	imageFormat = "1"
)

var includePackages = []string{
	"systemd", "systemd-sysv", "dbus", // init, systemctl, the system bus
	"bubblewrap",      // the .deb's dependency
	"procps",          // pgrep, to look for orphans
	"python3-minimal", // what guest code runs; loopback TCP inside a sandbox
	"man-db",          // systemd-analyze verify checks Documentation=man:...
}

// cacheDir is where built images are kept between runs.
func cacheDir() string {
	if d := os.Getenv("SANDBOX_SIDECAR_TEST_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "sandbox-sidecar-test")
	}
	return "/var/cache/sandbox-sidecar-test"
}

// imageKey names an image by everything that decides its content.
func imageKey() string {
	pkgs := slices.Clone(includePackages)
	slices.Sort(pkgs)
	h := sha256.Sum256([]byte(strings.Join([]string{imageFormat, suite, variant, strings.Join(pkgs, ",")}, "\n")))
	return hex.EncodeToString(h[:])[:16]
}

// debianMirror is the Debian mirror apt on this host uses for the suite
// (SANDBOX_SIDECAR_DEBIAN_MIRROR overrides it).
func debianMirror() string {
	if m := os.Getenv("SANDBOX_SIDECAR_DEBIAN_MIRROR"); m != "" {
		return m
	}
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	for _, f := range files {
		if m := mirrorFromDeb822(f); m != "" {
			return m
		}
	}
	files, _ = filepath.Glob("/etc/apt/sources.list.d/*.list")
	for _, f := range append([]string{"/etc/apt/sources.list"}, files...) {
		if m := mirrorFromList(f); m != "" {
			return m
		}
	}
	return "http://deb.debian.org/debian"
}

// mirrorFromDeb822 returns the first URI of a stanza whose Suites has the
// suite, from a deb822 .sources file.
func mirrorFromDeb822(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	for _, stanza := range strings.Split(string(b), "\n\n") {
		fields := map[string]string{}
		for _, line := range strings.Split(stanza, "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, "#") && !strings.HasPrefix(line, " ") {
				fields[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
			}
		}
		if fields["enabled"] == "no" || !slices.Contains(strings.Fields(fields["types"]), "deb") {
			continue
		}
		if slices.Contains(strings.Fields(fields["suites"]), suite) {
			if uris := strings.Fields(fields["uris"]); len(uris) > 0 {
				return uris[0]
			}
		}
	}
	return ""
}

// mirrorFromList does the same for a one-line-style sources.list.
func mirrorFromList(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 3 || fs[0] != "deb" {
			continue
		}
		fs = fs[1:]
		if strings.HasPrefix(fs[0], "[") { // [options]
			for len(fs) > 0 && !strings.HasSuffix(fs[0], "]") {
				fs = fs[1:]
			}
			if len(fs) > 0 {
				fs = fs[1:]
			}
		}
		if len(fs) >= 2 && fs[1] == suite {
			return fs[0]
		}
	}
	return ""
}

// image returns the cached image tarball, building it with debootstrap when
// there is none. Concurrent runs wait for each other on a lock.
func image(t *testing.T) string {
	t.Helper()
	dir := cacheDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("creating the image cache %s: %v", dir, err)
	}
	tarball := filepath.Join(dir, fmt.Sprintf("rootfs-%s-%s.tar", suite, imageKey()))
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
		t.Logf("image: cached %s", tarball)
		return tarball
	}
	mirror := debianMirror()
	start := time.Now()
	t.Logf("image: debootstrap %s (%s, +%s) from %s: no cached %s", suite, variant, strings.Join(includePackages, ","), mirror, tarball)
	build := t.TempDir()
	root := filepath.Join(build, "root")
	ctx, cancel := context.WithTimeout(context.Background(), debootstrapTimeout)
	defer cancel()
	out, err := runHost(ctx, "debootstrap", "--variant="+variant, "--include="+strings.Join(includePackages, ","), suite, root, mirror)
	if err != nil {
		t.Fatalf("debootstrap failed (%v); last output:\n%s", err, tail(out, 40))
	}
	// An empty machine-id: systemd makes one at each boot of a copy.
	if err := os.WriteFile(filepath.Join(root, "etc/machine-id"), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	tmp := tarball + ".tmp"
	if out, err := runHost(ctx, "tar", "--numeric-owner", "--xattrs", "-C", root, "-cf", tmp, "."); err != nil {
		os.Remove(tmp)
		t.Fatalf("archiving the image: %v\n%s", err, tail(out, 20))
	}
	if err := os.Rename(tmp, tarball); err != nil {
		t.Fatal(err)
	}
	t.Logf("image: built in %s", time.Since(start).Round(time.Second))
	return tarball
}

// unpack extracts the image into a fresh directory.
func unpack(t *testing.T, tarball string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), extractTimeout)
	defer cancel()
	if out, err := runHost(ctx, "tar", "--numeric-owner", "--xattrs", "-C", root, "-xf", tarball); err != nil {
		t.Fatalf("unpacking %s: %v\n%s", tarball, err, tail(out, 20))
	}
	return root
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

// runHost runs a command on the host, output combined.
func runHost(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Kill the whole group on timeout: debootstrap and tar start children.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s timed out: %w", name, ctx.Err())
	}
	return string(out), err
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
