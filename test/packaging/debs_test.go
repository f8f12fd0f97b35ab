package packaging

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/test/internal/debroot"
)

const (
	// buildTimeout bounds one packaging/deb/build.sh (a cold go build).
	buildTimeout = 10 * time.Minute
	// lintianTimeout bounds one lintian run.
	lintianTimeout = 5 * time.Minute
)

// repoRoot is the repository this package sits in (test/packaging).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// changelogVersion is the version of packaging/deb/changelog's top entry.
func changelogVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "packaging", "deb", "changelog"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	_, rest, ok := strings.Cut(first, " (")
	version, _, ok2 := strings.Cut(rest, ")")
	if !ok || !ok2 || version == "" {
		t.Fatalf("no version in the changelog's first line %q", first)
	}
	return version
}

// buildDeb builds the package at version into dir with packaging/deb/build.sh
// and returns its path.
func buildDeb(t *testing.T, version, dir string) string {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(repoRoot(t), "packaging", "deb", "build.sh"), dir)
	cmd.Env = append(os.Environ(), "VERSION="+version)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("packaging/deb/build.sh (VERSION=%s): %v\n%s", version, err, stderr.String())
	}
	deb := strings.TrimSpace(string(out))
	if _, err := os.Stat(deb); err != nil {
		t.Fatalf("build.sh printed %q, which is not a file: %v", deb, err)
	}
	t.Logf("built %s in %s", filepath.Base(deb), time.Since(start).Round(time.Second))
	return deb
}

// lintianErrors runs lintian on deb and returns its output and its error
// tags ("E: ...").
func lintianErrors(t *testing.T, deb string) (string, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), lintianTimeout)
	defer cancel()
	// --fail-on none: with --show-overrides, lintian 2.116 counts an
	// overridden error tag (the static init's statically-linked-binary)
	// toward its exit status; the E: lines are what we judge.
	out, err := debroot.RunHost(ctx, "lintian", "--pedantic", "--display-info", "--show-overrides", "--fail-on", "none", deb)
	if ctx.Err() != nil {
		t.Fatalf("lintian: %v", err)
	}
	var errs []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "E: ") {
			errs = append(errs, line)
		}
	}
	// Errors are reported from the E: lines; a non-zero exit is then a
	// failure of lintian itself.
	if err != nil && len(errs) == 0 {
		t.Fatalf("lintian failed: %v\n%s", err, out)
	}
	return out, errs
}
