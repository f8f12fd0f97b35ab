package bwrap

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

func TestCheckExecRequest(t *testing.T) {
	ok := backend.ExecRequest{Command: "true", Timeout: time.Second}
	argv, cwd, err := backend.CheckExecRequest(ok, guestWorkspace)
	if err != nil || !slices.Equal(argv, []string{"/bin/sh", "-c", "true"}) || cwd != "/workspace" {
		t.Fatalf("checkExecRequest(%+v) = %q, %q, %v", ok, argv, cwd, err)
	}
	argv, cwd, err = backend.CheckExecRequest(backend.ExecRequest{Argv: []string{"-x", "y"}, Cwd: "/tmp/../tmp/d/", Timeout: time.Second}, guestWorkspace)
	if err != nil || !slices.Equal(argv, []string{"-x", "y"}) || cwd != "/tmp/d" {
		t.Fatalf("argv request: %q, %q, %v", argv, cwd, err)
	}
	bad := map[string]backend.ExecRequest{
		"no timeout":     {Command: "true"},
		"huge timeout":   {Command: "true", Timeout: 25 * time.Hour},
		"both":           {Command: "true", Argv: []string{"true"}, Timeout: time.Second},
		"neither":        {Timeout: time.Second},
		"NUL in command": {Command: "echo a\x00b", Timeout: time.Second},
		"NUL in argv":    {Argv: []string{"echo", "a\x00"}, Timeout: time.Second},
		"relative cwd":   {Command: "true", Cwd: "workspace", Timeout: time.Second},
		"NUL in cwd":     {Command: "true", Cwd: "/tmp\x00", Timeout: time.Second},
		"long command":   {Command: strings.Repeat("x", 128<<10), Timeout: time.Second},
		"many args":      {Argv: make([]string, backend.MaxArgv+1), Timeout: time.Second},
	}
	for name, req := range bad {
		if _, _, err := backend.CheckExecRequest(req, guestWorkspace); !errors.Is(err, backend.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", name, err)
		}
	}
}

func TestMergeEnvLayers(t *testing.T) {
	opts, err := mergeEnv(map[string]string{"A": "sandbox", "B": "sandbox", "PATH": "/opt/bin"}, map[string]string{"B": "request"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.IsSorted(opts) {
		t.Errorf("env %q is not sorted", opts)
	}
	got := map[string]string{}
	for _, kv := range opts {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			t.Fatalf("entry %q in %q is not NAME=value", kv, opts)
		}
		got[k] = v
	}
	if set := setenvOptions(opts); len(set) != 3*len(opts) || set[0] != "--setenv" || set[1] != "A" || set[2] != "sandbox" {
		t.Errorf("setenvOptions(%q) = %q", opts, set)
	}
	want := map[string]string{"A": "sandbox", "B": "request", "PATH": "/opt/bin", "HOME": "/workspace", "LANG": "C.UTF-8"}
	if len(got) != len(want) {
		t.Fatalf("env %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

func TestCanSearch(t *testing.T) {
	cases := []struct {
		perm         os.FileMode
		owner, group int
		uid, gid     int
		want         bool
	}{
		{0o711, 0, 0, 65534, 65534, true},
		{0o700, 0, 0, 65534, 65534, false},
		{0o750, 0, 65534, 65534, 65534, true},
		{0o705, 0, 0, 65534, 65534, true},
		{0o700, 65534, 0, 65534, 65534, true},
		{0o077, 65534, 0, 65534, 65534, false}, // owner bits rule for the owner
	}
	for _, tc := range cases {
		if got := canSearch(tc.perm, tc.owner, tc.group, tc.uid, tc.gid); got != tc.want {
			t.Errorf("canSearch(%v, owner %d:%d, as %d:%d) = %v, want %v", tc.perm, tc.owner, tc.group, tc.uid, tc.gid, got, tc.want)
		}
	}
}

func TestHostRootLinks(t *testing.T) {
	root := t.TempDir()
	if err := os.Symlink("usr/bin", filepath.Join(root, "bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	got := hostRootLinks(root)
	want := []string{"--symlink", "usr/bin", "/bin", "--ro-bind", filepath.Join(root, "lib"), "/lib"}
	if !slices.Equal(got, want) {
		t.Errorf("hostRootLinks = %q, want %q", got, want)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	dir := t.TempDir()
	cases := map[string]Config{
		"relative dir":   {Dir: "state", SandboxUID: -1, SandboxGID: -1},
		"empty dir":      {SandboxUID: -1, SandboxGID: -1},
		"zero uid":       {Dir: dir},
		"half set":       {Dir: dir, SandboxUID: 65534, SandboxGID: -1},
		"negative grace": {Dir: dir, SandboxUID: -1, SandboxGID: -1, KillGrace: -time.Second},
	}
	for name, cfg := range cases {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
	_, err := New(Config{Dir: dir, SandboxUID: -1, SandboxGID: -1, BwrapPath: filepath.Join(dir, "no-bwrap")})
	wantErr(t, err, backend.ErrUnavailable)
	if !strings.Contains(err.Error(), "apt-get install bubblewrap") {
		t.Errorf("the error does not say how to install bubblewrap: %v", err)
	}
}

func TestNewRefusesUnreachableStateDir(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "a SandboxUID needs root")
	}
	parent := t.TempDir() // 0700: uid 65534 cannot search it
	if err := os.Chmod(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := New(Config{Dir: filepath.Join(parent, "state"), SandboxUID: 65534, SandboxGID: 65534})
	if err == nil || !strings.Contains(err.Error(), "chmod o+x") {
		t.Fatalf("New with an unreachable Dir: %v, want a refusal saying how to fix it", err)
	}
}
