package bwrap

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc/inittest"
)

func TestMain(m *testing.M) {
	// This binary is also every test sandbox's init, as the daemon's is.
	InitMain()
	code := m.Run()
	inittest.Remove()
	os.Exit(code)
}

func boolPtr(v bool) *bool { return &v }

func TestBwrapSpecRefusals(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	ctx := context.Background()
	cases := []struct {
		name   string
		spec   backend.Spec
		target error
		hint   string
	}{
		{"egress hosts", backend.Spec{AllowEgressTo: []string{"pypi.org"}}, backend.ErrSpecUnenforceable, "egress filtering is not enabled on this daemon"},
		{"egress cidrs", backend.Spec{AllowEgressToCIDRs: []string{"10.0.0.0/8"}}, backend.ErrSpecUnenforceable, "egress filtering is not enabled on this daemon"},
		{"network wanted", backend.Spec{BlockNetwork: boolPtr(false)}, backend.ErrSpecUnenforceable, "share-host-network"},
		{"env name with =", backend.Spec{Env: map[string]string{"A=B": "x"}}, backend.ErrInvalidArgument, "rename"},
		{"empty env name", backend.Spec{Env: map[string]string{"": "x"}}, backend.ErrInvalidArgument, "rename"},
		{"NUL in env value", backend.Spec{Env: map[string]string{"A": "x\x00"}}, backend.ErrInvalidArgument, "NUL"},
	}
	for i, tc := range cases {
		id := fmt.Sprintf("refused-%d", i)
		_, err := b.Create(ctx, id, tc.spec)
		if !errors.Is(err, tc.target) || !strings.Contains(err.Error(), tc.hint) {
			t.Errorf("%s: err = %v, want %q saying %q", tc.name, err, tc.target, tc.hint)
		}
		if _, statErr := os.Lstat(b.sandboxDir(id)); !errors.Is(statErr, fs.ErrNotExist) {
			t.Errorf("%s: a refused Create left %s behind", tc.name, b.sandboxDir(id))
		}
	}
	for _, id := range []string{"", "UPPER", "../x", "a/b", "-lead", strings.Repeat("a", 64)} {
		if _, err := b.Create(ctx, id, backend.Spec{}); !errors.Is(err, backend.ErrInvalidArgument) {
			t.Errorf("Create(%q): %v, want ErrInvalidArgument", id, err)
		}
	}
	// Explicitly blocked is what we do anyway.
	info, err := b.Create(ctx, "blocked", backend.Spec{BlockNetwork: boolPtr(true)})
	if err != nil || info.Network != "none" {
		t.Errorf("BlockNetwork=true: %+v, %v", info, err)
	}
	_ = b.Destroy(ctx, "blocked")
}

func TestBwrapShareHostNetwork(t *testing.T) {
	b := newTestBackend(t, rangeUID, func(c *Config) { c.ShareHostNetwork = true })
	ctx := context.Background()
	info, err := b.Create(ctx, "hostnet", backend.Spec{BlockNetwork: boolPtr(false)})
	if err != nil || info.Network != "host" {
		t.Fatalf("Create with host network: %+v, %v", info, err)
	}
	defer b.Destroy(ctx, "hostnet")
	hostIfaces := interfaces(t, "/proc/net/dev")
	got := strings.Fields(runOK(t, b, "hostnet", `tail -n +3 /proc/net/dev | cut -d: -f1`))
	slices.Sort(got)
	if !slices.Equal(got, hostIfaces) {
		t.Errorf("a host-network sandbox sees interfaces %v, the host has %v", got, hostIfaces)
	}
	// A default sandbox on the same backend still has none.
	none := create(t, b, backend.Spec{})
	if out := runOK(t, b, none, `tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '`); out != "lo\n" {
		t.Errorf("a default sandbox sees %q", out)
	}
}

func interfaces(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(data), "\n")[2:] {
		if name, _, ok := strings.Cut(line, ":"); ok {
			names = append(names, strings.TrimSpace(name))
		}
	}
	slices.Sort(names)
	return names
}

func TestBwrapCreateDuplicate(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	id := create(t, b, backend.Spec{})
	runOK(t, b, id, "echo keep > k")
	if _, err := b.Create(context.Background(), id, backend.Spec{}); !errors.Is(err, fs.ErrExist) {
		t.Errorf("second Create: %v, want ErrExist", err)
	}
	if out := runOK(t, b, id, "cat k"); out != "keep\n" {
		t.Errorf("a refused duplicate Create damaged the sandbox: %q", out)
	}
}

func TestBwrapCreateFailurePartWayRemovesEverything(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "mounting a small tmpfs needs root")
	}
	// A tmpfs with room for only a few inodes makes Create fail at a
	// chosen step: 3 inodes stop it at the private /tmp, 4 at spec.json.
	for _, inodes := range []int{3, 4} {
		t.Run(fmt.Sprintf("%d inodes", inodes), func(t *testing.T) {
			dir := t.TempDir()
			if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("nr_inodes=%d,mode=0700", inodes)); err != nil {
				skipOrFail(t, "cannot mount a tmpfs: %v", err)
			}
			defer syscall.Unmount(dir, syscall.MNT_DETACH)
			b, err := New(Config{Dir: dir, SandboxUID: -1, SandboxGID: -1})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.Create(context.Background(), "half", backend.Spec{}); err == nil {
				t.Fatal("Create succeeded on a full filesystem")
			}
			entries, _ := os.ReadDir(dir)
			if len(entries) != 0 {
				t.Errorf("the failed Create left %v behind", entries)
			}
			if _, err := b.Exec(context.Background(), "half", backend.ExecRequest{Command: "true", Timeout: time.Second}); !errors.Is(err, backend.ErrNotFound) {
				t.Errorf("Exec on the failed sandbox: %v", err)
			}
		})
	}
}

func TestBwrapDestroyIsThoroughAndIdempotent(t *testing.T) {
	forEachMode(t, func(t *testing.T, b *Backend) {
		ctx := context.Background()
		id := create(t, b, backend.Spec{})
		// What a hostile guest leaves behind: unreadable, unwritable trees.
		runOK(t, b, id, `mkdir -p a/b/c /tmp/t/u && touch a/b/c/f /tmp/t/u/f && chmod 000 a/b/c && chmod 000 a/b /tmp/t && chmod 500 a && ln -s /etc etc-link`)
		if err := b.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(b.sandboxDir(id)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Destroy left %s: %v", b.sandboxDir(id), err)
		}
		if _, err := os.Stat("/etc/passwd"); err != nil {
			t.Fatalf("Destroy followed a symlink out: %v", err)
		}
		for i := 0; i < 2; i++ {
			if err := b.Destroy(ctx, id); err != nil {
				t.Errorf("Destroy again: %v", err)
			}
		}
		if err := b.Destroy(ctx, "never-existed"); err != nil {
			t.Errorf("Destroy of an unknown id: %v", err)
		}
		ids, err := b.List(ctx)
		if err != nil || slices.Contains(ids, id) {
			t.Errorf("List after Destroy = %v, %v", ids, err)
		}
	})
}

func TestBwrapDestroyInvalidIDTouchesNothing(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	sibling := filepath.Join(filepath.Dir(b.cfg.Dir), "victim")
	if err := os.Mkdir(sibling, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"../victim", "..", ".", "", "/", "a/../../victim"} {
		if err := b.Destroy(context.Background(), id); err != nil {
			t.Errorf("Destroy(%q) = %v, want nil", id, err)
		}
	}
	if _, err := os.Stat(sibling); err != nil {
		t.Fatalf("Destroy with a bad id removed a path outside Dir: %v", err)
	}
	if _, err := os.Stat(b.cfg.Dir); err != nil {
		t.Fatalf("Destroy with a bad id removed the state directory: %v", err)
	}
}

func TestBwrapRestartReadoptsSandboxes(t *testing.T) {
	first := newTestBackend(t, rangeUID, func(c *Config) { c.ShareHostNetwork = true })
	ctx := context.Background()
	id := create(t, first, backend.Spec{Env: map[string]string{"KEPT": "across restarts"}})
	runOK(t, first, id, "echo data > f")
	if _, err := first.Create(ctx, "hostnet", backend.Spec{BlockNetwork: boolPtr(false)}); err != nil {
		t.Fatal(err)
	}

	// A new process over the same state directory.
	second, err := New(first.cfg)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := second.List(ctx)
	if err != nil || !slices.Contains(ids, id) || !slices.Contains(ids, "hostnet") {
		t.Fatalf("List after restart = %v, %v", ids, err)
	}
	if out := runOK(t, second, id, `echo "$KEPT"; cat f`); out != "across restarts\ndata\n" {
		t.Errorf("re-adopted sandbox: %q", out)
	}

	// The operator turned host networking off in between.
	cfg := first.cfg
	cfg.ShareHostNetwork = false
	third, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = third.Exec(ctx, "hostnet", backend.ExecRequest{Command: "true", Timeout: time.Second})
	wantErr(t, err, backend.ErrSpecUnenforceable)

	// Settings that are not ours.
	if err := os.WriteFile(filepath.Join(third.sandboxDir(id), specName), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = third.Exec(ctx, id, backend.ExecRequest{Command: "true", Timeout: time.Second})
	wantErr(t, err, backend.ErrNotFound)
	if err := third.Destroy(ctx, "hostnet"); err != nil {
		t.Fatal(err)
	}
}

func TestBwrapListFindsEverySandboxDirectory(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	ctx := context.Background()
	id := create(t, b, backend.Spec{})
	// A half-made sandbox (no spec.json), a stray file and a foreign name.
	for _, d := range []string{"half-made", "Not_An_ID"} {
		if err := os.Mkdir(filepath.Join(b.cfg.Dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(b.cfg.Dir, "stray-file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ids, err := b.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"half-made", id}; !slices.Equal(ids, want) {
		t.Errorf("List = %v, want %v", ids, want)
	}
	_, err = b.Exec(ctx, "half-made", backend.ExecRequest{Command: "true", Timeout: time.Second})
	wantErr(t, err, backend.ErrNotFound)
	if err := b.Destroy(ctx, "half-made"); err != nil {
		t.Fatal(err)
	}
}

func TestBwrapHealth(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	ctx := context.Background()
	if err := b.Health(ctx); err != nil {
		t.Fatalf("Health: %v", err)
	}
	start := time.Now()
	if err := b.Health(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("cached Health took %v", time.Since(start))

	fakes := map[string]string{
		"fails":     "#!/bin/sh\nexit 1\n",
		"hangs":     "#!/bin/sh\nexec sleep 1006\n",
		"no userns": "#!/bin/sh\n[ \"$1\" = --version ] && { echo bubblewrap 0.8.0; exit 0; }\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n",
	}
	for name, script := range fakes {
		t.Run(name, func(t *testing.T) {
			fake := filepath.Join(t.TempDir(), "bwrap")
			if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			fb, err := New(Config{Dir: filepath.Join(t.TempDir(), "s"), BwrapPath: fake, SandboxUID: -1, SandboxGID: -1})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			err = fb.Health(ctx)
			wantErr(t, err, backend.ErrUnavailable)
			if elapsed := time.Since(start); elapsed > versionTimeout+2*time.Second {
				t.Errorf("Health took %v", elapsed)
			}
			if name == "no userns" && !strings.Contains(err.Error(), "No permissions to create new namespace") {
				t.Errorf("Health does not pass on bwrap's reason: %v", err)
			}
		})
	}
	waitNoProcess(t, time.Second, "sleep", "1006")
}

func TestBwrapSandboxRemovedBehindOurBack(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	ctx := context.Background()
	id := create(t, b, backend.Spec{})
	runOK(t, b, id, "true")
	if err := os.RemoveAll(b.sandboxDir(id)); err != nil {
		t.Fatal(err)
	}
	_, err := b.Exec(ctx, id, backend.ExecRequest{Command: "true", Timeout: time.Second})
	wantErr(t, err, backend.ErrNotFound)
	if _, err := b.Create(ctx, id, backend.Spec{}); err != nil {
		t.Fatalf("Create again after an operator removed the sandbox: %v", err)
	}
	runOK(t, b, id, "true")
}
