package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

const module = "github.com/sandbox-sidecar/sandbox-sidecar/"

// deniedPackages are packages the init must not link, by import path (a
// trailing slash: every package under it). Each is the daemon's side of
// something (a backend's daemon half, egress and its netstack, cgroups,
// disks, seccomp tables, the store, logging, the API), whose package
// initialisation and pages every sandbox's start would pay
// (docs/design.md, "A static init").
var deniedPackages = []string{
	module + "backend/bwrap",
	module + "backend/gvisor",
	module + "backend/initproc/initexe",
	module + "backend/registry",
	module + "backend/resources",
	module + "backend/statedir",
	module + "backend/sbx",
	module + "backend/hostback",
	module + "sandbox/",
	module + "internal/",
	module + "ipc",
	module + "ipc/",
	module + "lifecycle",
	module + "service",
	module + "metrics",
	module + "runwatch",
	"debug/elf",
	"encoding/json",
	"net",
	"net/",
	"crypto/",
	"log/slog",
}

// allowedThirdParty are the only packages outside the standard library and
// this module the init may link.
var allowedThirdParty = []string{"golang.org/x/sys/unix"}

// The init links only what runs inside a sandbox: a package of the
// daemon's side creeping back in (through an import of a backend from a
// package the init uses, say) fails here.
func TestInitLinksOnlyWhatItRuns(t *testing.T) {
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		if gobin, err = exec.LookPath("go"); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("no go tool to list the init's packages: %v", err)
			}
			t.Skipf("no go tool to list the init's packages: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gobin, "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}", ".")
	// As make build and the package build it.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	var n int
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, std, ok := strings.Cut(line, " ")
		if !ok {
			t.Fatalf("go list printed %q", line)
		}
		n++
		for _, d := range deniedPackages {
			if path == d || strings.HasSuffix(d, "/") && strings.HasPrefix(path, d) {
				t.Errorf("the init links %s, which it never runs (denied: %s)", path, d)
			}
		}
		if std == "false" && !strings.HasPrefix(path, module) && !slices.Contains(allowedThirdParty, path) {
			t.Errorf("the init links %s, a package outside the standard library and this module", path)
		}
	}
	if n < 10 || !strings.Contains(string(out), module+"backend/bwrap/bwinit ") || !strings.Contains(string(out), module+"backend/gvisor/gvinit ") {
		t.Fatalf("go list -deps did not list the init's packages:\n%s", out)
	}
}
