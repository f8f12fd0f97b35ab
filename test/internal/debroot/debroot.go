// Package debroot holds what the tests that debootstrap a Debian root
// filesystem share: where the built roots are cached between runs, which
// mirror this host's apt uses, a cache key, a lock wait and a host command
// runner that kills debootstrap's whole process group on timeout.
package debroot

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

// CacheDir is where built root filesystems are kept between runs
// (SANDBOX_SIDECAR_TEST_CACHE, else $XDG_CACHE_HOME/sandbox-sidecar-test,
// else /var/cache/sandbox-sidecar-test).
func CacheDir() string {
	if d := os.Getenv("SANDBOX_SIDECAR_TEST_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "sandbox-sidecar-test")
	}
	return "/var/cache/sandbox-sidecar-test"
}

// Key names a root by everything that decides its content: a format
// version its builder bumps when what it does after debootstrap changes,
// the suite, the variant and the packages (in any order).
func Key(format, suite, variant string, pkgs []string) string {
	pkgs = slices.Clone(pkgs)
	slices.Sort(pkgs)
	h := sha256.Sum256([]byte(strings.Join([]string{format, suite, variant, strings.Join(pkgs, ",")}, "\n")))
	return hex.EncodeToString(h[:])[:16]
}

// Mirror is the Debian mirror apt on this host uses for suite
// (SANDBOX_SIDECAR_DEBIAN_MIRROR overrides it).
func Mirror(suite string) string {
	if m := os.Getenv("SANDBOX_SIDECAR_DEBIAN_MIRROR"); m != "" {
		return m
	}
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	for _, f := range files {
		if m := mirrorFromDeb822(f, suite); m != "" {
			return m
		}
	}
	files, _ = filepath.Glob("/etc/apt/sources.list.d/*.list")
	for _, f := range append([]string{"/etc/apt/sources.list"}, files...) {
		if m := mirrorFromList(f, suite); m != "" {
			return m
		}
	}
	return "http://deb.debian.org/debian"
}

// mirrorFromDeb822 returns the first URI of a stanza whose Suites has the
// suite, from a deb822 .sources file.
func mirrorFromDeb822(path, suite string) string {
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
func mirrorFromList(path, suite string) string {
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

// FlockTimeout takes an exclusive lock on f, waiting at most limit for a
// concurrent builder to finish.
func FlockTimeout(f *os.File, limit time.Duration) error {
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

// RunHost runs a command on the host, output combined. On timeout its
// whole process group is killed: debootstrap and tar start children.
func RunHost(ctx context.Context, name string, args ...string) (string, error) {
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

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Root is a debootstrapped root filesystem to build once and cache as a
// tarball: CacheDir()/<Prefix>-<Suite>-<Key(Format, Suite, Variant,
// Packages)>.tar.
type Root struct {
	Prefix, Format, Suite, Variant string
	Packages                       []string
	// AptPackages are installed after debootstrap, by apt-get inside the
	// root (without recommends), which resolves a dependency on
	// alternatives as apt does: one already chosen satisfies it, where
	// debootstrap takes the first, however heavy. Part of the cache key
	// as "apt:name".
	AptPackages []string
	// Timeout bounds the wait for another run's build and this build.
	Timeout time.Duration
	// Tidy changes the root after debootstrap, before it is archived.
	Tidy func(root string) error
	// TarArgs are extra arguments for tar (e.g. --xattrs).
	TarArgs []string
}

// Tarball returns r's cached tarball, debootstrapping it when there is
// none; concurrent runs wait for each other on a lock beside it.
func (r Root) Tarball(t *testing.T) string {
	t.Helper()
	dir := CacheDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("creating the cache %s: %v", dir, err)
	}
	keyed := slices.Clone(r.Packages)
	for _, p := range r.AptPackages {
		keyed = append(keyed, "apt:"+p)
	}
	tarball := filepath.Join(dir, fmt.Sprintf("%s-%s-%s.tar", r.Prefix, r.Suite, Key(r.Format, r.Suite, r.Variant, keyed)))
	lock, err := os.OpenFile(tarball+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := FlockTimeout(lock, r.Timeout); err != nil {
		t.Fatalf("waiting for another run building %s: %v", tarball, err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(tarball); err == nil {
		t.Logf("%s: cached %s", r.Prefix, tarball)
		return tarball
	}
	mirror := Mirror(r.Suite)
	start := time.Now()
	t.Logf("%s: debootstrap %s (%s, +%s; then apt-get +%s) from %s: no cached %s", r.Prefix, r.Suite, r.Variant, strings.Join(r.Packages, ","), strings.Join(r.AptPackages, ","), mirror, tarball)
	root := filepath.Join(t.TempDir(), "root")
	// debootstrap mounts /proc (and more) in the root, as the apt step
	// does; one stopped midway (its timeout) leaves them mounted, and the
	// root could not be removed.
	t.Cleanup(func() { unmountUnder(root) })
	ctx, cancel := context.WithTimeout(context.Background(), r.Timeout)
	defer cancel()
	out, err := RunHost(ctx, "debootstrap", "--variant="+r.Variant, "--include="+strings.Join(r.Packages, ","), r.Suite, root, mirror)
	if err != nil {
		t.Fatalf("debootstrap failed (%v); last output:\n%s", err, Tail(out, 40))
	}
	if len(r.AptPackages) > 0 {
		if out, err := aptInstall(ctx, root, r.AptPackages); err != nil {
			t.Fatalf("apt-get in the root failed (%v); last output:\n%s", err, Tail(out, 40))
		}
	}
	if r.Tidy != nil {
		if err := r.Tidy(root); err != nil {
			t.Fatal(err)
		}
	}
	tmp := tarball + ".tmp"
	args := append(append([]string{"--numeric-owner"}, r.TarArgs...), "-C", root, "-cf", tmp, ".")
	if out, err := RunHost(ctx, "tar", args...); err != nil {
		os.Remove(tmp)
		t.Fatalf("archiving the root: %v\n%s", err, Tail(out, 20))
	}
	if err := os.Rename(tmp, tarball); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: built in %s", r.Prefix, time.Since(start).Round(time.Second))
	return tarball
}

// aptInstall installs pkgs in root with its own apt-get (chrooted, its
// /proc mounted, the host's resolver for the mirror's name), without
// recommends, and leaves root as it found it but for the packages.
func aptInstall(ctx context.Context, root string, pkgs []string) (string, error) {
	resolv := filepath.Join(root, "etc", "resolv.conf")
	had, _ := os.ReadFile(resolv)
	if b, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		_ = os.Remove(resolv)
		if err := os.WriteFile(resolv, b, 0o644); err != nil {
			return "", err
		}
	}
	defer func() {
		_ = os.Remove(resolv)
		if had != nil {
			_ = os.WriteFile(resolv, had, 0o644)
		}
	}()
	proc := filepath.Join(root, "proc")
	if err := syscall.Mount("proc", proc, "proc", 0, ""); err != nil {
		return "", fmt.Errorf("mount %s: %w", proc, err)
	}
	defer unmountUnder(proc)
	var all strings.Builder
	for _, args := range [][]string{
		{"apt-get", "update", "-qq"},
		append([]string{"apt-get", "install", "-y", "-qq", "--no-install-recommends"}, pkgs...),
		{"apt-get", "clean"},
	} {
		out, err := RunHost(ctx, "chroot", append([]string{root, "/usr/bin/env", "DEBIAN_FRONTEND=noninteractive"}, args...)...)
		all.WriteString(out)
		if err != nil {
			return all.String(), fmt.Errorf("%s: %w", strings.Join(args, " "), err)
		}
	}
	return all.String(), nil
}

// unmountUnder detaches every mount at or below dir (deepest first).
func unmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, p := range points {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
}
