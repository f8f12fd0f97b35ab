package packaging

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeRunsc says a version the way runsc --version does, then much more
// than a pipe holds: a reader that stops at the version line makes its
// next write fail (SIGPIPE) every time, not only when the timing is
// unlucky.
const fakeRunsc = `package main

import (
	"fmt"
	"os"
	"strings"
)

// A runsc built with its seccomp programs precompiled holds their keys.
const precompiled = ` + "`" + `GOARCH="amd64" Platform="systrap" HostNetwork=false HostNetworkRawSockets=false HostFilesystem=true` + "`" + `

func main() {
	if len(os.Args) == 3 && os.Args[1] == "--programs" {
		fmt.Println(precompiled)
	}
	if len(os.Args) != 2 || os.Args[1] != "--version" {
		os.Exit(2)
	}
	fmt.Println("runsc version v0.0.0-test")
	fmt.Print(strings.Repeat("spec: 1.1.0-rc.1\n", 1<<16))
}
`

// installRunscTimeout bounds the fake's build and the script's run.
const installRunscTimeout = 2 * time.Minute

// TestInstallRunscKeepsAGoodCache: scripts/install-runsc.sh takes a
// cached runsc that says the pinned version, was built with the pinned Go
// and holds precompiled seccomp programs, prints its path and builds
// nothing, whatever the binary prints after its version line. The check piped runsc --version into grep -q, which
// exits at its match; runsc then got SIGPIPE about every other time,
// pipefail failed the check, and the script rebuilt a good cache (its
// check of the new build failing as often: "the runsc just built is not
// version ...", and with it every gVisor test of the run).
func TestInstallRunscKeepsAGoodCache(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), installRunscTimeout)
	defer cancel()
	dir := t.TempDir()
	src, cache := filepath.Join(dir, "src"), filepath.Join(dir, "cache")
	for _, d := range []string{src, cache} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range map[string]string{"go.mod": "module fakerunsc\n\ngo 1.21\n", "main.go": fakeRunsc} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Offline and with this toolchain only: nothing here may fetch.
	env := append(os.Environ(), "GOTOOLCHAIN=local", "GOPROXY=off", "GOFLAGS=", "CGO_ENABLED=0")
	goVersion, err := exec.CommandContext(ctx, "go", "env", "GOVERSION").Output()
	if err != nil {
		t.Fatalf("go env GOVERSION: %v", err)
	}
	cached := filepath.Join(cache, "runsc-v0.0.0-test")
	build := exec.CommandContext(ctx, "go", "build", "-o", cached, ".")
	build.Dir, build.Env = src, env
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the fake runsc: %v\n%s", err, out)
	}
	before, err := os.Stat(cached)
	if err != nil {
		t.Fatal(err)
	}

	cmd := exec.CommandContext(ctx, filepath.Join(repoRoot(t), "scripts", "install-runsc.sh"))
	cmd.Env = append(env, "RUNSC_CACHE="+cache, "RUNSC_VERSION=v0.0.0-test", "RUNSC_GO="+strings.TrimSpace(string(goVersion)))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if err != nil || strings.TrimSpace(stdout.String()) != cached || stderr.Len() != 0 {
		t.Fatalf("install-runsc.sh with a good cached runsc: %v, stdout %q, stderr:\n%s\nwant the cached path, nothing built", err, stdout.String(), stderr.String())
	}
	if after, err := os.Stat(cached); err != nil || !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()) {
		t.Fatalf("the cached runsc was replaced: %v", err)
	}
}
