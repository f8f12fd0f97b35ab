package sbx

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// These tests drive the backend against the fake sbx (./sbxfake) and
// reproduce sbx's sharp edges one by one.

func TestSbxCommandLines(t *testing.T) {
	b, f := newFakeBackend(t, func(c *Config) { c.CPUs = 2; c.Memory = "1536M" })
	id, info := create(t, b, backend.Spec{Env: map[string]string{"B": "2", "A": "1"}})
	name := b.sbxName(id)
	ws := filepath.Join(f.dir, id, "workspace")
	if info.Workdir != ws || info.Network != networkNone {
		t.Fatalf("Info = %+v, want the workspace's host path %s and network none", info, ws)
	}
	if !strings.HasPrefix(name, DefaultMarker(f.dir)+"-sc-") {
		t.Errorf("sbx name %q does not carry the marker", name)
	}
	if !f.called("create", "--name", name, "--memory", "1536m", "--cpus", "2", "--deny-network", "**", "--pull", "missing", "--template", DefaultTemplate, "shell", ws) {
		t.Errorf("no sbx create with the expected arguments in %q", f.calls())
	}

	if _, err := b.Exec(context.Background(), id, backend.ExecRequest{Command: "cat", Stdin: []byte("in"), Timeout: 1500 * time.Millisecond, Env: map[string]string{"C": "3"}}); err != nil {
		t.Fatal(err)
	}
	// The environment goes in a file (--env-file), never on the command line.
	execs := f.callsOf("exec", "-i", "--env-file")
	if len(execs) != 1 {
		t.Fatalf("no sbx exec -i --env-file in %q", f.calls())
	}
	want := []string{"exec", "-i", "--env-file", execs[0][3], "-w", ws, "--", name,
		"timeout", "--kill-after=0.500", "--", "1.500", "/bin/sh", "-c", "cat"}
	if !slices.Equal(execs[0], want) {
		t.Errorf("sbx exec %q, want %q", execs[0], want)
	}
	run(t, b, id, "true")
	if len(f.callsOf("exec", "--env-file")) != 1 {
		t.Errorf("an exec without stdin should not pass -i; calls: %q", f.calls())
	}
}

// TestSbxEnvNeverOnTheCommandLine: a sandbox's env and a command's env reach
// the command through an env file only the daemon could read, removed after
// the call; no value appears in any argv sbx was given, which every local
// user can read in ps (#13).
func TestSbxEnvNeverOnTheCommandLine(t *testing.T) {
	b, f := newFakeBackend(t)
	const token, other = "s3cr3t-api-token-4f1d", "req-value-9a7e"
	id, _ := create(t, b, backend.Spec{Env: map[string]string{"API_TOKEN": token, "SPACED": "  a # b = c "}})
	res, err := b.Exec(context.Background(), id, backend.ExecRequest{
		Command: `printf '%s|%s|%s' "$API_TOKEN" "$SPACED" "$OTHER"`, Timeout: 10 * time.Second, Env: map[string]string{"OTHER": other}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(res.Stdout), token+"|  a # b = c |"+other; got != want {
		t.Errorf("the command saw %q, want %q (values byte for byte)", got, want)
	}
	for _, c := range f.calls() {
		for _, a := range c {
			if strings.Contains(a, token) || strings.Contains(a, other) {
				t.Errorf("an env value is on sbx's command line: %q", c)
			}
		}
	}
	files := f.envFiles()
	if len(files) != 1 {
		t.Fatalf("sbx read %d env files, want 1: %v", len(files), files)
	}
	if files[0].Mode != "0600" || files[0].UID != uint32(os.Getuid()) {
		t.Errorf("the env file was mode %s, uid %d: want 0600 and the daemon's uid %d", files[0].Mode, files[0].UID, os.Getuid())
	}
	if !strings.HasPrefix(files[0].Path, filepath.Join(f.dir, id)+"/") || strings.HasPrefix(files[0].Path, filepath.Join(f.dir, id, "workspace")) {
		t.Errorf("the env file %s is not in the sandbox's state directory outside its workspace", files[0].Path)
	}
	if _, err := os.Lstat(files[0].Path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the env file %s is still there after the call: %v", files[0].Path, err)
	}
}

// TestSbxRefusesEnvAnEnvFileCannotCarry: a value with a newline (or
// anything else an env file would change) is refused with
// ErrInvalidArgument (bad_request) at create, and in a command's env at
// exec, before sbx is called.
func TestSbxRefusesEnvAnEnvFileCannotCarry(t *testing.T) {
	b, f := newFakeBackend(t)
	for name, env := range map[string]map[string]string{
		"newline":         {"K": "line1\nline2"},
		"carriage return": {"K": "v\r"},
		"invalid UTF-8":   {"K": "\xff"},
		"space in name":   {"A B": "v"},
		"comment name":    {"#K": "v"},
		"too long":        {"K": strings.Repeat("x", maxEnvFileLine)},
	} {
		before := len(f.calls())
		_, err := b.Create(context.Background(), newID(), backend.Spec{Env: env})
		if !errors.Is(err, backend.ErrInvalidArgument) || !strings.Contains(err.Error(), "env file") {
			t.Errorf("%s: Create = %v, want ErrInvalidArgument naming the env file", name, err)
		}
		if len(f.calls()) != before {
			t.Errorf("%s: sbx was called for a create refused up front", name)
		}
	}
	if err := b.CheckEnv(map[string]string{"K": "a\nb"}); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("CheckEnv (the warm pool's check) = %v", err)
	}
	if err := b.CheckEnv(map[string]string{"K": "a = b # c", "EMPTY": ""}); err != nil {
		t.Errorf("CheckEnv of a plain env = %v", err)
	}
	id, _ := create(t, b, backend.Spec{})
	_, err := b.Exec(context.Background(), id, backend.ExecRequest{Command: "true", Timeout: 10 * time.Second, Env: map[string]string{"K": "a\nb"}})
	if !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("Exec with a newline in the command's env = %v, want ErrInvalidArgument", err)
	}
}

func TestSbxLsBannerIsSkipped(t *testing.T) {
	b, f := newFakeBackend(t)
	id, _ := create(t, b, backend.Spec{})
	f.set("banner", "1")
	if out, _ := f.sbx("ls", "--json"); !strings.HasPrefix(out, "Starting sandboxd daemon") {
		t.Fatalf("the fake did not print its banner: %q", out)
	}
	ids, err := b.List(context.Background())
	if err != nil || !slices.Contains(ids, id) {
		t.Fatalf("List with a banner before the JSON = %v, %v", ids, err)
	}
	if err := b.Health(context.Background()); err != nil {
		t.Errorf("Health with a banner: %v", err)
	}
	// The vanished-sandbox check reads ls too.
	if res := run(t, b, id, "exit 1"); res.SandboxTerminated || res.ExitCode != 1 {
		t.Errorf("exit 1 in a live sandbox: %+v", res)
	}
}

func TestSbxLsHangIsBounded(t *testing.T) {
	const limit = time.Second
	b, f := newFakeBackend(t, func(c *Config) { c.ListTimeout = limit })
	f.set("ls-hang", "1")
	for what, call := range map[string]func() error{
		"List":   func() error { _, err := b.List(context.Background()); return err },
		"Health": func() error { return b.Health(context.Background()) },
	} {
		start := time.Now()
		err := call()
		elapsed := time.Since(start)
		if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "did not answer within 1s") {
			t.Errorf("%s with a hanging ls: %v", what, err)
		}
		if elapsed > limit+3*time.Second {
			t.Errorf("%s with a hanging ls took %v, want about %v", what, elapsed, limit)
		}
	}
	f.unset("ls-hang")
	if err := b.Health(context.Background()); err != nil {
		t.Errorf("Health once ls answers again (failures must not be cached): %v", err)
	}
}

func TestSbxVanishedSandbox(t *testing.T) {
	b, f := newFakeBackend(t)
	ctx := context.Background()
	id, _ := create(t, b, backend.Spec{})
	// A live sandbox whose command fails quietly is not reported gone.
	if res := run(t, b, id, "false"); res.SandboxTerminated || res.ExitCode != 1 {
		t.Fatalf("false in a live sandbox: %+v", res)
	}
	if !f.called("ls", "--json") {
		t.Errorf("an exit 1 without output was not checked with sbx ls")
	}

	if _, code := f.sbx("rm", "-f", b.sbxName(id)); code != 0 {
		t.Fatal("the fake could not remove the sandbox")
	}
	if _, code := f.sbx("exec", b.sbxName(id), "true"); code != 1 {
		t.Fatalf("the fake's exec on a missing sandbox exited %d, want 1 like sbx", code)
	}
	res := run(t, b, id, "echo hello")
	if !res.SandboxTerminated {
		t.Errorf("Exec in a sandbox whose microVM is gone: %+v, want SandboxTerminated", res)
	}
	_, err := b.ReadFile(ctx, id, "x", 10)
	wantErr(t, err, backend.ErrNotFound, "microVM", "create a new sandbox")
	err = b.WriteFile(ctx, id, "x", []byte("x"), 0)
	wantErr(t, err, backend.ErrNotFound)
	_, err = b.ListDirectory(ctx, id, ".", 10)
	wantErr(t, err, backend.ErrNotFound)

	// sbx rm of a missing sandbox exits non-zero; Destroy still succeeds.
	if _, code := f.sbx("rm", "-f", b.sbxName(id)); code == 0 {
		t.Fatal("the fake's rm of a missing sandbox succeeded; sbx exits non-zero")
	}
	if err := b.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy of a sandbox sbx no longer has: %v", err)
	}
	if _, err := os.Stat(filepath.Join(f.dir, id)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Destroy left %s behind", filepath.Join(f.dir, id))
	}
	ids, err := b.List(ctx)
	if err != nil || slices.Contains(ids, id) {
		t.Errorf("List after Destroy = %v, %v", ids, err)
	}
}

func TestSbxDestroyKeepsFilesWhenRmFails(t *testing.T) {
	b, f := newFakeBackend(t)
	ctx := context.Background()
	id, _ := create(t, b, backend.Spec{})
	f.set("rm-fail", "1")
	err := b.Destroy(ctx, id)
	wantErr(t, err, backend.ErrUnavailable, "still lists it", "retried")
	if _, statErr := os.Stat(filepath.Join(f.dir, id, specName)); statErr != nil {
		t.Fatalf("a failed Destroy removed the files that let it be retried: %v", statErr)
	}
	if ids, _ := b.List(ctx); !slices.Contains(ids, id) {
		t.Errorf("List lost a sandbox whose Destroy failed: %v", ids)
	}
	f.unset("rm-fail")
	if err := b.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy retried: %v", err)
	}
	if slices.Contains(f.names(), b.sbxName(id)) {
		t.Errorf("the microVM is still there after the retry")
	}
}

func TestSbxHalfMadeCreateIsCleaned(t *testing.T) {
	b, f := newFakeBackend(t)
	f.set("create-fail", "1")
	id := newID()
	_, err := b.Create(context.Background(), id, backend.Spec{})
	wantErr(t, err, backend.ErrUnavailable, "sbx create", "microVM exited during boot")
	if names := f.names(); len(names) != 0 {
		t.Errorf("the half-made microVM is still registered: %v", names)
	}
	if !f.called("rm", "-f", b.sbxName(id)) {
		t.Errorf("no sbx rm -f after the failed create: %q", f.calls())
	}
	if _, err := os.Stat(filepath.Join(f.dir, id)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the half-made sandbox's directory is still there: %v", err)
	}
	f.unset("create-fail")
	if _, err := b.Create(context.Background(), id, backend.Spec{}); err != nil {
		t.Errorf("Create with the same id after the cleanup: %v", err)
	}
	_ = b.Destroy(context.Background(), id)
}

func TestSbxSlowCreate(t *testing.T) {
	t.Run("within the timeout", func(t *testing.T) {
		b, f := newFakeBackend(t, func(c *Config) { c.CreateTimeout = 20 * time.Second })
		f.set("create-delay", "1500ms")
		start := time.Now()
		id, _ := create(t, b, backend.Spec{})
		if elapsed := time.Since(start); elapsed < 1500*time.Millisecond {
			t.Errorf("Create took %v; the fake's delay did not apply", elapsed)
		}
		if got := string(run(t, b, id, "echo booted").Stdout); got != "booted\n" {
			t.Errorf("the slow-booted sandbox printed %q", got)
		}
	})
	t.Run("past the timeout", func(t *testing.T) {
		b, f := newFakeBackend(t, func(c *Config) { c.CreateTimeout = time.Second })
		f.set("create-delay", "30s")
		id := newID()
		start := time.Now()
		_, err := b.Create(context.Background(), id, backend.Spec{})
		elapsed := time.Since(start)
		wantErr(t, err, backend.ErrUnavailable, "did not finish within 1s")
		if elapsed > 8*time.Second {
			t.Errorf("Create past its timeout took %v", elapsed)
		}
		if names := f.names(); len(names) != 0 {
			t.Errorf("the microVM killed mid-create is still registered: %v", names)
		}
		if _, err := os.Stat(filepath.Join(f.dir, id)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the directory of the sandbox killed mid-create is still there: %v", err)
		}
	})
	t.Run("request cancelled", func(t *testing.T) {
		b, f := newFakeBackend(t)
		f.set("create-delay", "30s")
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_, err := b.Create(ctx, newID(), backend.Spec{})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Create with a cancelled request: %v", err)
		}
		if names := f.names(); len(names) != 0 {
			t.Errorf("a cancelled Create left a microVM: %v (the cleanup must not depend on the request)", names)
		}
	})
}

func TestSbxExecCLIHangDestroysTheSandbox(t *testing.T) {
	b, f := newFakeBackend(t, func(c *Config) { c.ExecGrace = time.Second })
	id, _ := create(t, b, backend.Spec{})
	f.set("exec-hang", "1")
	start := time.Now()
	res, err := b.Exec(context.Background(), id, backend.ExecRequest{Command: "echo hi", Timeout: time.Second})
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if !res.SandboxTerminated || !res.TimedOut {
		t.Errorf("Exec whose sbx exec hangs: %+v, want TimedOut and SandboxTerminated", res)
	}
	budget := time.Second + testKillAfter + time.Second
	if elapsed < budget || elapsed > budget+5*time.Second {
		t.Errorf("Exec took %v, want a little over %v", elapsed, budget)
	}
	if slices.Contains(f.names(), b.sbxName(id)) {
		t.Errorf("the stuck sandbox was not removed")
	}
	if _, err := os.Stat(filepath.Join(f.dir, id)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the stuck sandbox's directory is still there: %v", err)
	}
	f.unset("exec-hang")
	_, err = b.Exec(context.Background(), id, backend.ExecRequest{Command: "true", Timeout: time.Second})
	wantErr(t, err, backend.ErrNotFound)
}

func TestSbxEgressRules(t *testing.T) {
	spec := backend.Spec{AllowEgressTo: []string{"PyPI.org", "files.pythonhosted.org", "pypi.org"}}
	t.Run("deny-all host", func(t *testing.T) {
		b, f := newFakeBackend(t)
		id, info := create(t, b, spec)
		if info.Network != networkAllowList {
			t.Errorf("Network = %q, want %q", info.Network, networkAllowList)
		}
		if !f.called("policy", "allow", "network", "--sandbox", b.sbxName(id), "files.pythonhosted.org,pypi.org") {
			t.Errorf("no per-sandbox sbx policy allow network: %q", f.calls())
		}
	})
	for _, p := range []HostPolicy{PolicyAllowAll, PolicyUnknown} {
		t.Run(string(p)+" host", func(t *testing.T) {
			b, f := newFakeBackend(t, func(c *Config) { c.HostPolicy = p })
			_, err := b.Create(context.Background(), newID(), spec)
			wantErr(t, err, backend.ErrSpecUnenforceable, "deny-all")
			if f.called("create") || f.called("policy") {
				t.Errorf("a refused spec still reached sbx: %q", f.calls())
			}
		})
	}
	t.Run("cidrs on every host", func(t *testing.T) {
		for _, p := range []HostPolicy{PolicyDenyAll, PolicyAllowAll, PolicyUnknown} {
			b, f := newFakeBackend(t, func(c *Config) { c.HostPolicy = p })
			_, err := b.Create(context.Background(), newID(), backend.Spec{AllowEgressToCIDRs: []string{"10.0.0.0/8"}})
			wantErr(t, err, backend.ErrSpecUnenforceable, "allow_egress_to_cidrs")
			if f.called("create") {
				t.Errorf("%s: a refused spec reached sbx", p)
			}
		}
	})
	t.Run("policy rule fails", func(t *testing.T) {
		b, f := newFakeBackend(t)
		f.set("policy-fail", "1")
		id := newID()
		_, err := b.Create(context.Background(), id, spec)
		wantErr(t, err, backend.ErrSpecUnenforceable, "sbx policy allow network failed")
		if names := f.names(); len(names) != 0 {
			t.Errorf("a Create whose policy failed left its microVM: %v", names)
		}
		if _, statErr := os.Stat(filepath.Join(f.dir, id)); !errors.Is(statErr, fs.ErrNotExist) {
			t.Errorf("a Create that failed part-way left its directory: %v", statErr)
		}
	})
}

func TestSbxRestartReadoptsSandboxes(t *testing.T) {
	b, f := newFakeBackend(t)
	id, _ := create(t, b, backend.Spec{Env: map[string]string{"KEPT": "yes"}})
	run(t, b, id, "echo data > file")
	b2 := f.backend()
	res := run(t, b2, id, `cat file; printf '%s' "$KEPT"`)
	if string(res.Stdout) != "data\nyes" {
		t.Errorf("a restarted backend sees %q", res.Stdout)
	}
	ids, err := b2.List(context.Background())
	if err != nil || !slices.Contains(ids, id) {
		t.Errorf("List after restart = %v, %v", ids, err)
	}
	// A sandbox made under another marker is not used under this one.
	other := f.backend(func(c *Config) { c.Marker = "othermarker" })
	_, err = other.Exec(context.Background(), id, backend.ExecRequest{Command: "true", Timeout: time.Second})
	wantErr(t, err, backend.ErrNotFound, "another marker")
}

func TestSbxListIsMicroVMsAndDirectories(t *testing.T) {
	b, f := newFakeBackend(t)
	ctx := context.Background()
	id, _ := create(t, b, backend.Spec{})

	// A directory without a microVM: a crash between sbx rm and removing it.
	dirOnly := newID()
	if err := os.MkdirAll(filepath.Join(f.dir, dirOnly, workspaceName), 0o700); err != nil {
		t.Fatal(err)
	}
	// A microVM without a directory: sbx has it, the disk does not.
	vmOnly := newID()
	scratch := t.TempDir()
	for _, name := range []string{b.sbxName(vmOnly), "othermarker-" + newID(), "airflow-sandbox-0123456789ab", b.cfg.Marker + "-NotAnID"} {
		if _, code := f.sbx("create", "--name", name, "shell", scratch); code != 0 {
			t.Fatalf("the fake refused to create %s", name)
		}
	}
	ids, err := b.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{id, dirOnly, vmOnly}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Errorf("List = %v, want %v (ours only, from sbx and from disk)", ids, want)
	}
	for _, victim := range []string{dirOnly, vmOnly} {
		if err := b.Destroy(ctx, victim); err != nil {
			t.Errorf("Destroy(%s): %v", victim, err)
		}
	}
	if ids, _ := b.List(ctx); !slices.Equal(ids, []string{id}) {
		t.Errorf("List after sweeping = %v, want [%s]", ids, id)
	}
	if n := len(f.names()); n != 4 {
		t.Errorf("the sweep touched foreign sandboxes: %d left, want 4 (ours and the three foreign)", n)
	}
}

func TestSbxHealth(t *testing.T) {
	ctx := context.Background()
	b, f := newFakeBackend(t)
	if err := b.Health(ctx); err != nil {
		t.Fatalf("Health on a good fake host: %v", err)
	}

	missing := f.backend(func(c *Config) { c.KVMDevice = filepath.Join(t.TempDir(), "no-kvm") })
	wantErr(t, missing.Health(ctx), backend.ErrUnavailable, "does not exist", "no KVM")

	if os.Geteuid() != 0 {
		locked := filepath.Join(t.TempDir(), "kvm")
		if err := os.WriteFile(locked, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(locked, 0o400); err != nil {
			t.Fatal(err)
		}
		noAccess := f.backend(func(c *Config) { c.KVMDevice = locked })
		wantErr(t, noAccess.Health(ctx), backend.ErrUnavailable, "kvm", "never give the Airflow worker")
	} else if err := checkKVM("/proc/self/nonexistent-kvm"); !errors.Is(err, backend.ErrUnavailable) {
		t.Errorf("checkKVM of a missing device: %v", err)
	}

	bin := filepath.Join(t.TempDir(), "sbx")
	data, err := os.ReadFile(fakeBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	gone := f.backend(func(c *Config) { c.SbxPath = bin })
	if err := gone.Health(ctx); err != nil {
		t.Fatalf("Health with a copy of the fake: %v", err)
	}
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	wantErr(t, gone.Health(ctx), backend.ErrUnavailable, "install")
}

func TestSbxProbeCatchesAWorkspaceNotVisibleInside(t *testing.T) {
	f := newFakeHost(t)
	// A wrapper whose sandboxes do not see the workspace the host prepared,
	// as with an sbx that mounted workspaces somewhere else.
	wrapper := filepath.Join(t.TempDir(), "sbx")
	script := "#!/bin/sh\nc=$1; [ \"$c\" = --no-input ] && c=$2\nif [ \"$c\" = create ]; then\n\tfor last do :; done\n\trm -f \"$last/.sidecar-probe\"\nfi\nexec " + fakeBin + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	b := f.backend(func(c *Config) { c.SbxPath = wrapper })
	id := newID()
	_, err := b.Create(context.Background(), id, backend.Spec{})
	wantErr(t, err, backend.ErrUnavailable, "did not mount the workspace")
	if names := f.names(); len(names) != 0 {
		t.Errorf("a Create refused by the probe left %v", names)
	}
	if _, statErr := os.Stat(filepath.Join(f.dir, id)); !errors.Is(statErr, fs.ErrNotExist) {
		t.Errorf("a Create refused by the probe left its directory: %v", statErr)
	}
}

func TestSbxExecRequestCancelled(t *testing.T) {
	b, _ := newFakeBackend(t)
	id, _ := create(t, b, backend.Spec{})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	res, err := b.Exec(ctx, id, backend.ExecRequest{Command: "sleep 30", Timeout: time.Minute})
	if !errors.Is(err, context.DeadlineExceeded) || res.SandboxTerminated {
		t.Errorf("Exec with a cancelled request: %+v, %v", res, err)
	}
	if elapsed := time.Since(start); elapsed > 3*time.Second {
		t.Errorf("Exec took %v after its request ended", elapsed)
	}
	if got := string(run(t, b, id, "echo fine").Stdout); got != "fine\n" {
		t.Errorf("the sandbox after an abandoned command: %q", got)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	f := newFakeHost(t)
	cases := []struct {
		name  string
		tweak func(*Config)
		hint  string
	}{
		{"relative dir", func(c *Config) { c.Dir = "state/sbx" }, "absolute"},
		{"memory below 512 MiB", func(c *Config) { c.Memory = "256m" }, "less than 512 MiB"},
		{"memory one MiB short", func(c *Config) { c.Memory = "511m" }, "less than 512 MiB"},
		{"memory nonsense", func(c *Config) { c.Memory = "lots" }, "not a size"},
		{"negative cpus", func(c *Config) { c.CPUs = -1 }, "CPUs"},
		{"negative timeout", func(c *Config) { c.CreateTimeout = -time.Second }, "CreateTimeout"},
		{"bad policy", func(c *Config) { c.HostPolicy = "balanced" }, "declare unknown for balanced"},
		{"marker with dash", func(c *Config) { c.Marker = "a-b" }, "no '-'"},
		{"marker too long", func(c *Config) { c.Marker = strings.Repeat("a", 25) }, "marker"},
		{"template flag", func(c *Config) { c.Template = "--privileged" }, "image"},
		{"template short name", func(c *Config) { c.Template = "python:3.12-slim" }, "docker.io/library/python:3.12-slim"},
		{"template short path", func(c *Config) { c.Templates = []string{"acme/agent:1"} }, "docker.io/acme/agent:1"},
		{"env without =", func(c *Config) { c.Env = []string{"NOVALUE"} }, "NAME=value"},
		{"missing binary", func(c *Config) { c.SbxPath = filepath.Join(t.TempDir(), "sbx") }, "install"},
	}
	for _, tc := range cases {
		_, err := New(f.config(tc.tweak))
		if err == nil || !strings.Contains(err.Error(), tc.hint) {
			t.Errorf("%s: err = %v, want it to say %q", tc.name, err, tc.hint)
		}
	}
	for _, ok := range []string{"512m", "1g", "1024m", "1G", "1GiB", "2g", "1073741824", "536870912"} {
		if _, err := New(f.config(func(c *Config) { c.Memory = ok })); err != nil {
			t.Errorf("memory %q refused: %v", ok, err)
		}
	}
	b, err := New(f.config(func(c *Config) { c.HostPolicy = "" }))
	if err != nil || b.cfg.HostPolicy != PolicyUnknown || b.cfg.Template != DefaultTemplate || b.memory != "2g" ||
		b.cfg.CreateTimeout != DefaultCreateTimeout || b.cfg.Marker != DefaultMarker(f.dir) ||
		b.cfg.StartTimeout != DefaultStartTimeout || b.cfg.AutoStopGrace != DefaultAutoStopGrace {
		t.Errorf("defaults: %+v, %v", b, err)
	}
	if got := b.MaxCreateDuration(); got != 2*policyTimeout+DefaultCreateTimeout+networkCheckTimeout+b.cfg.ListTimeout+DefaultStartTimeout+probeTimeout {
		t.Errorf("MaxCreateDuration = %v", got)
	}
	if fi, err := os.Stat(f.dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("state directory: %v, %v; want mode 0700", fi, err)
	}
}

func TestSbxSpecResources(t *testing.T) {
	b, f := newFakeBackend(t, func(c *Config) { c.CPUs = 4; c.Memory = "4g" })
	id, _ := create(t, b, backend.Spec{Resources: backend.Resources{MemoryBytes: 1536 << 20, CPUs: 2}})
	if !f.called("create", "--name", b.sbxName(id), "--memory", "1536m", "--cpus", "2") {
		t.Errorf("a smaller microVM was not asked of sbx: %q", f.calls())
	}
	for _, r := range []backend.Resources{
		{MemoryBytes: 8 << 30}, {MemoryBytes: 511 << 20}, {CPUs: 1.5}, {CPUs: 8}, {PIDs: 64}, {DiskBytes: 1 << 30},
	} {
		if _, err := b.Create(context.Background(), "refused", backend.Spec{Resources: r}); !errors.Is(err, backend.ErrSpecUnenforceable) {
			t.Errorf("Create with %+v: %v, want ErrSpecUnenforceable", r, err)
		}
	}
	if f.called("create", "--name", b.sbxName("refused")) {
		t.Error("a refused spec still reached sbx create")
	}
	if got := b.LimitsInForce(); got["memory"] != "microvm" || got["disk"] != "off" {
		t.Errorf("LimitsInForce = %v", got)
	}
}

// The default configuration names the binary "sbx": it must be found on
// PATH, as a shell would, and not stat'ed as a file in the daemon's working
// directory.
func TestSbxBareNameIsLookedUpOnPath(t *testing.T) {
	f := newFakeHost(t)
	dir := t.TempDir()
	data, err := os.ReadFile(fakeBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sbx"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	for _, name := range []string{"sbx", ""} {
		b, err := New(f.config(func(c *Config) { c.SbxPath = name }))
		if err != nil {
			t.Fatalf("New with SbxPath %q and sbx on PATH: %v", name, err)
		}
		if b.sbx != filepath.Join(dir, "sbx") {
			t.Errorf("SbxPath %q resolved to %q, want the one on PATH", name, b.sbx)
		}
	}
	t.Setenv("PATH", t.TempDir())
	_, err = New(f.config(func(c *Config) { c.SbxPath = "sbx" }))
	wantErr(t, err, backend.ErrUnavailable, "not on PATH")
}

// An image maps to sbx's --template, and only an allowed one.
func TestSbxImageIsAnAllowedTemplate(t *testing.T) {
	b, f := newFakeBackend(t, func(c *Config) { c.Templates = []string{"ghcr.io/acme/agent:1"} })
	id, _ := create(t, b, backend.Spec{Image: backend.Image{Name: "ghcr.io/acme/agent:1"}})
	ws := filepath.Join(f.dir, id, "workspace")
	if !f.callsContain("--template", "ghcr.io/acme/agent:1", "shell", ws) {
		t.Errorf("no sbx create with the allowed template in %q", f.calls())
	}
	_, err := b.Create(context.Background(), "sc-notallowed", backend.Spec{Image: backend.Image{Name: "evil/miner:latest"}})
	if !errors.Is(err, backend.ErrSpecUnenforceable) || !strings.Contains(err.Error(), "templates") {
		t.Fatalf("a template the operator did not allow: %v, want spec_unenforceable naming [sbx] templates", err)
	}
	if f.callsContain("--template", "evil/miner:latest") {
		t.Fatal("sbx was asked to boot a template the operator did not allow")
	}
	names := []string{}
	for _, im := range b.Images() {
		names = append(names, im.Name)
	}
	if !slices.Equal(names, []string{DefaultTemplate, "ghcr.io/acme/agent:1"}) {
		t.Fatalf("Images() = %v", names)
	}
}

// TestSbxEnvironmentIsOnlyWhatSbxNeeds: sbx runs with PATH, HOME, its own
// settings variables and the proxies, and nothing else of the daemon's
// environment: an operator's SSH agent (which sbx would forward into
// every sandbox) and credentials never reach it, nor a guest.
func TestSbxEnvironmentIsOnlyWhatSbxNeeds(t *testing.T) {
	t.Setenv("SSH_AUTH_SOCK", "/run/user/0/ssh-agent.sock")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "daemon-secret-7c1e")
	t.Setenv("DOCKER_SANDBOXES_PROXY", "http://proxy.internal:3128")
	t.Setenv("SANDBOXD_LOG_LEVEL", "debug")
	t.Setenv("HTTPS_PROXY", "http://proxy.internal:3128")
	t.Setenv("HOME", "/var/lib/sandbox-sidecar")
	b, f := newFakeBackend(t)
	id, _ := create(t, b, backend.Spec{})
	res := run(t, b, id, `printf '%s|%s' "${SSH_AUTH_SOCK-unset}" "${AWS_SECRET_ACCESS_KEY-unset}"`)
	if got := string(res.Stdout); got != "unset|unset" {
		t.Errorf("the guest saw %q of the daemon's environment", got)
	}
	if err := b.Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	envs := f.envs()
	if len(envs) < 3 {
		t.Fatalf("only %d sbx calls recorded", len(envs))
	}
	allowed := func(k string) bool {
		switch k {
		case "PATH", "HOME", "HTTPS_PROXY", "SBXFAKE_STATE":
			return true
		}
		return strings.HasPrefix(k, "DOCKER_SANDBOXES_") || strings.HasPrefix(k, "SANDBOXD_")
	}
	for i, env := range envs {
		got := map[string]string{}
		for _, kv := range env {
			k, v, _ := strings.Cut(kv, "=")
			got[k] = v
			if !allowed(k) {
				t.Errorf("call %d (%q): sbx was given %s", i, f.calls()[i], kv)
			}
		}
		if got["HOME"] != "/var/lib/sandbox-sidecar" || got["PATH"] != os.Getenv("PATH") ||
			got["DOCKER_SANDBOXES_PROXY"] != "http://proxy.internal:3128" || got["SANDBOXD_LOG_LEVEL"] != "debug" {
			t.Errorf("call %d: sbx's environment lacks what it needs: %q", i, env)
		}
	}
	f.checkSbxNeverSaw("SSH_AUTH_SOCK", "AWS_SECRET_ACCESS_KEY")
}

// recordNames lists the fake's sandboxes from its records, without
// asking it (a signed-out fake would not answer).
func (f *fakeHost) recordNames() []string {
	f.t.Helper()
	matches, err := filepath.Glob(filepath.Join(f.state, "sandboxes", "*.json"))
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for _, m := range matches {
		out = append(out, strings.TrimSuffix(filepath.Base(m), ".json"))
	}
	return out
}

// TestSbxSignedOutFailsFast: an sbx whose login expired starts an
// interactive sign-in and waits for it (sbx-releases#109), which held a
// create for its whole create timeout. With --no-input every call fails
// at once naming `sbx login`: health says so, create leaves nothing, a
// command or a file operation fails as backend_unavailable without
// ending its sandbox, destroy keeps the files to retry. Signed in again,
// everything works, the sandbox's files intact.
func TestSbxSignedOutFailsFast(t *testing.T) {
	b, f := newFakeBackend(t, func(c *Config) { c.ListTimeout = 30 * time.Second })
	ctx := context.Background()
	id, _ := create(t, b, backend.Spec{})
	if err := b.WriteFile(ctx, id, "kept.txt", []byte("kept"), 0); err != nil {
		t.Fatal(err)
	}
	// A command of the agent's that mentions sbx login is only a command.
	if res := run(t, b, id, "echo 'please run sbx login' >&2; exit 1"); res.ExitCode != 1 || res.SandboxTerminated {
		t.Fatalf("a failing command that prints 'sbx login': %+v", res)
	}

	f.set("signed-out", "1")
	const fast = 10 * time.Second // far below the 10-minute create timeout and 30 s ls
	for what, call := range map[string]func() error{
		"Health": func() error { return b.Health(ctx) },
		"List":   func() error { _, err := b.List(ctx); return err },
		"Create": func() error { _, err := b.Create(ctx, newID(), backend.Spec{}); return err },
		"Exec": func() error {
			res, err := b.Exec(ctx, id, backend.ExecRequest{Command: "echo hi", Timeout: time.Minute})
			if res.SandboxTerminated || res.TimedOut {
				t.Errorf("Exec signed out ended the sandbox: %+v", res)
			}
			return err
		},
		"ReadFile": func() error { _, err := b.ReadFile(ctx, id, "kept.txt", 100); return err },
		"Destroy":  func() error { return b.Destroy(ctx, id) },
	} {
		start := time.Now()
		err := call()
		if elapsed := time.Since(start); elapsed > fast {
			t.Errorf("%s signed out took %v", what, elapsed)
		}
		if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "sbx needs `sbx login`") || !strings.Contains(err.Error(), "--password-stdin") {
			t.Errorf("%s signed out: %v; want backend_unavailable saying sbx needs `sbx login` and how", what, err)
		}
	}
	if names := f.recordNames(); len(names) != 1 || names[0] != b.sbxName(id) {
		t.Errorf("sandboxes after the signed-out calls: %v, want only %s", names, b.sbxName(id))
	}
	if _, err := os.Stat(filepath.Join(f.dir, id, specName)); err != nil {
		t.Errorf("a destroy that sbx refused removed the files that let it be retried: %v", err)
	}
	for _, args := range f.rawCalls() {
		if args[0] != "--no-input" {
			t.Errorf("an sbx call without --no-input: %q", args)
		}
	}

	f.unset("signed-out")
	if err := b.Health(ctx); err != nil {
		t.Errorf("Health signed in again: %v", err)
	}
	got, err := b.ReadFile(ctx, id, "kept.txt", 100)
	if err != nil || string(got) != "kept" {
		t.Errorf("the sandbox's file signed in again: %q, %v", got, err)
	}
}

// TestSbxPolicyNeverInitialised: sbx asks for a network preset before it
// runs a sandbox; with --no-input the create fails at once, saying to run
// sbx policy init.
func TestSbxPolicyNeverInitialised(t *testing.T) {
	b, f := newFakeBackend(t)
	f.set("policy-uninit", "1")
	start := time.Now()
	_, err := b.Create(context.Background(), newID(), backend.Spec{})
	wantErr(t, err, backend.ErrUnavailable, "sbx policy init")
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("Create with no policy took %v", elapsed)
	}
	if names := f.recordNames(); len(names) != 0 {
		t.Errorf("a refused create left %v", names)
	}
}

// TestSbxVersionGate: the backend asks sbx version --json at start and
// refuses an sbx older than MinVersion; where sbx does not take
// --no-input, it runs without it.
func TestSbxVersionGate(t *testing.T) {
	f := newFakeHost(t)
	for v, hint := range map[string]string{
		"v0.41.2": "no \"version --json\"",
		"v0.42.1": "older than " + MinVersion.String(),
		"v0.9.0":  "older than",
	} {
		f.set("version", v)
		_, err := New(f.config())
		wantErr(t, err, backend.ErrUnavailable, hint, "upgrade sbx")
	}
	for _, v := range []string{"v0.43.0", "v0.55.0", "v1.0.0-rc1"} {
		f.set("version", v)
		b, err := New(f.config())
		if err != nil {
			t.Fatalf("sbx %s: %v", v, err)
		}
		if got, _ := parseVersion(v); b.version != got || !b.noInput {
			t.Errorf("sbx %s: version %v, noInput %v", v, b.version, b.noInput)
		}
	}

	f.unset("version")
	f.set("no-input-unsupported", "1")
	before := len(f.rawCalls())
	b := f.backend()
	if b.noInput {
		t.Fatal("noInput with an sbx that refuses --no-input")
	}
	id, _ := create(t, b, backend.Spec{})
	if got := string(run(t, b, id, "echo ok").Stdout); got != "ok\n" {
		t.Errorf("a command without --no-input printed %q", got)
	}
	for _, args := range f.rawCalls()[before+1:] {
		if args[0] == "--no-input" {
			t.Errorf("--no-input passed to an sbx without it: %q", args)
		}
	}
}

func TestVersionFromOutput(t *testing.T) {
	cases := map[string]string{
		`{"version":"v0.55.0","commit":"abc"}`:                            "v0.55.0",
		`{"client":{"version":"0.55.1","goVersion":"go1.26.1"}}`:          "v0.55.1",
		"Starting sandboxd…\n{\"Version\":\"v0.44.0-rc2\"}":               "v0.44.0",
		`{"build":{"tag":"v0.50.2"},"api":"1.2.3"}`:                       "v0.50.2",
		"sbx version: v0.33.0 d7da69cb30eb3000c4d4ef0c848ffe84f32058bf\n": "v0.33.0",
	}
	for out, want := range cases {
		v, ok := versionFromOutput([]byte(out))
		if !ok || v.String() != want {
			t.Errorf("versionFromOutput(%q) = %v, %v; want %s", out, v, ok, want)
		}
	}
	for _, bad := range []string{"", "{}", `{"api":"1.2.3"}`, "sbx version unknown", `{"version":"latest"}`} {
		if v, ok := versionFromOutput([]byte(bad)); ok {
			t.Errorf("versionFromOutput(%q) = %v", bad, v)
		}
	}
}

// TestSbxAutoStoppedSandboxBootsOutsideTheCommandsBudget: sbx stops a
// sandbox a grace after its last session, and the next sbx exec boots it.
// With a boot longer than a command's whole budget (timeout + kill grace
// + exec grace), the command used to time out and the sandbox, files and
// all, was destroyed as stuck. The backend now starts it first under a
// deadline of its own: the command runs with its full budget, the files
// are there; what ran in the background died with the stop.
func TestSbxAutoStoppedSandboxBootsOutsideTheCommandsBudget(t *testing.T) {
	const grace, boot = 300 * time.Millisecond, 4 * time.Second
	f := newFakeHost(t)
	b := f.backend(f.autoStop(grace, boot), func(c *Config) { c.ExecGrace = time.Second })
	budget := time.Second + testKillAfter + b.cfg.ExecGrace
	if boot <= budget {
		t.Fatalf("the boot (%v) must outlast the command's budget (%v)", boot, budget)
	}
	ctx := context.Background()
	id, _ := create(t, b, backend.Spec{})
	name := b.sbxName(id)
	if err := b.WriteFile(ctx, id, "notes.txt", []byte("agent's work"), 0); err != nil {
		t.Fatal(err)
	}
	res := run(t, b, id, "sleep 300 >/dev/null 2>&1 & echo $!")
	pid := strings.TrimSpace(string(res.Stdout))

	f.waitStopped(name) // the agent thinks for longer than the grace
	if processRuns(pid) {
		t.Errorf("background process %s survived the sandbox's stop", pid)
	}
	start := time.Now()
	res, err := b.Exec(ctx, id, backend.ExecRequest{Command: "cat notes.txt", Timeout: time.Second})
	elapsed := time.Since(start)
	if err != nil || res.TimedOut || res.SandboxTerminated || res.ExitCode != 0 || string(res.Stdout) != "agent's work" {
		t.Fatalf("a 1 s command in a stopped sandbox: %+v, %v; want it run in full after the boot", res, err)
	}
	if elapsed < boot {
		t.Errorf("the command came back in %v, before the fake's %v boot: the sandbox did not stop?", elapsed, boot)
	}
	if !slices.Contains(f.names(), name) {
		t.Fatal("the sandbox is gone")
	}
	if !f.called("exec", "-w", "/", "--", name, "true") {
		t.Errorf("no start of the stopped sandbox before the command: %q", f.calls())
	}

	// File operations start it too.
	f.waitStopped(name)
	got, err := b.ReadFile(ctx, id, "notes.txt", 100)
	if err != nil || string(got) != "agent's work" {
		t.Errorf("ReadFile in a stopped sandbox: %q, %v", got, err)
	}
}

// TestSbxFailedBootKeepsTheSandbox: a start that fails, or does not finish
// within StartTimeout, is a clear error; the sandbox and its files stay,
// and the next command starts it.
func TestSbxFailedBootKeepsTheSandbox(t *testing.T) {
	const grace = 200 * time.Millisecond
	f := newFakeHost(t)
	b := f.backend(f.autoStop(grace, 0), func(c *Config) { c.StartTimeout = time.Second })
	ctx := context.Background()
	id, _ := create(t, b, backend.Spec{})
	name := b.sbxName(id)
	if err := b.WriteFile(ctx, id, "kept.txt", []byte("kept"), 0); err != nil {
		t.Fatal(err)
	}

	f.set("boot-fail", "1")
	f.waitStopped(name)
	_, err := b.Exec(ctx, id, backend.ExecRequest{Command: "true", Timeout: time.Second})
	wantErr(t, err, backend.ErrUnavailable, "could not start it", "files are kept")
	f.unset("boot-fail")

	f.set("boot-delay", "30s")
	start := time.Now()
	_, err = b.ReadFile(ctx, id, "kept.txt", 100)
	wantErr(t, err, backend.ErrUnavailable, "did not start within 1s", "files are kept")
	if elapsed := time.Since(start); elapsed > 8*time.Second {
		t.Errorf("a start past its deadline took %v", elapsed)
	}

	f.set("boot-delay", "0s")
	if !slices.Contains(f.names(), name) {
		t.Fatal("a failed start removed the microVM")
	}
	if got := string(run(t, b, id, "cat kept.txt").Stdout); got != "kept" {
		t.Errorf("after the failed starts the sandbox has %q", got)
	}
}

// processRuns reports whether process pid exists and is not a zombie (a
// killed process may wait for a subreaper to reap it).
func processRuns(pid string) bool {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

// policyCheck asks the fake, as an operator would, whether sandbox name's
// policy lets target through.
func (f *fakeHost) policyCheck(name, target string) string {
	f.t.Helper()
	out, code := f.sbx("policy", "check", "network", "--sandbox", name, target)
	if code != 0 {
		f.t.Fatalf("sbx policy check exited %d", code)
	}
	return strings.TrimSpace(out)
}

// TestSbxNetworkAsSbxHasIt: block_network is a per-sandbox deny of "**"
// at create, which holds on any host preset, and a sandbox reported with
// no network gets it too (kits may add allow rules even under deny-all);
// what is in force is read back with sbx policy check, and a sandbox
// whose policy says otherwise is refused and removed; an organisation's
// governance (local allow rules inactive) and a kit's allow rules refuse
// an allow-list; ours "*.x" (any depth) is sbx's "**.x".
func TestSbxNetworkAsSbxHasIt(t *testing.T) {
	ctx := context.Background()
	block := backend.Spec{BlockNetwork: boolPtr(true)}
	t.Run("block_network on an allow-all host", func(t *testing.T) {
		b, f := newFakeBackend(t, func(c *Config) { c.HostPolicy = PolicyAllowAll })
		f.sbx("policy", "init", "allow-all")
		id, info := create(t, b, block)
		name := b.sbxName(id)
		if info.Network != networkNone || !f.callsContain("--deny-network", "**") {
			t.Errorf("Info %+v; calls %q", info, f.calls())
		}
		if got := f.policyCheck(name, "pypi.org"); got != "Denied: pypi.org" {
			t.Errorf("the sandbox's policy: %q", got)
		}
		if got := f.policyCheck("", "pypi.org"); got != "Allowed: pypi.org" {
			t.Errorf("the host's policy changed: %q", got)
		}
		// Nothing stated on an allow-all host is open, and checked.
		_, info = create(t, b, backend.Spec{})
		if info.Network != networkOpen {
			t.Errorf("nothing stated on an allow-all host: %+v", info)
		}
	})
	t.Run("a deny sbx did not apply", func(t *testing.T) {
		b, f := newFakeBackend(t, func(c *Config) { c.HostPolicy = PolicyAllowAll })
		f.sbx("policy", "init", "allow-all")
		f.set("deny-ignored", "1")
		_, err := b.Create(ctx, newID(), block)
		wantErr(t, err, backend.ErrSpecUnenforceable, "allows", "policy check")
		if names := f.recordNames(); len(names) != 0 {
			t.Errorf("a sandbox whose policy did not hold was kept: %v", names)
		}
	})
	t.Run("kit allow rules", func(t *testing.T) {
		b, f := newFakeBackend(t)
		f.set("kit-allow", "api.openai.com")
		_, err := b.Create(ctx, newID(), backend.Spec{AllowEgressTo: []string{"pypi.org"}})
		wantErr(t, err, backend.ErrSpecUnenforceable, "kit adds allow rules", "api.openai.com")
		if names := f.recordNames(); len(names) != 0 {
			t.Errorf("a refused allow-list left %v", names)
		}
		// No network stays none: the deny of "**" wins over the kit's allow.
		id, info := create(t, b, backend.Spec{})
		if got := f.policyCheck(b.sbxName(id), "api.openai.com"); info.Network != networkNone || got != "Denied: api.openai.com" {
			t.Errorf("no network with a kit's allow rule: %+v, %q", info, got)
		}
	})
	t.Run("governance", func(t *testing.T) {
		b, f := newFakeBackend(t)
		f.set("governance", "acme")
		_, err := b.Create(ctx, newID(), backend.Spec{AllowEgressTo: []string{"pypi.org"}})
		wantErr(t, err, backend.ErrSpecUnenforceable, "Managed by acme", "inactive")
		if f.called("create") {
			t.Errorf("an allow-list under governance reached sbx create: %q", f.calls())
		}
		if _, info := create(t, b, block); info.Network != networkNone {
			t.Errorf("block_network under governance: %+v", info)
		}
		// An allow-all host under governance is not open: reported unknown.
		b2 := f.backend(func(c *Config) { c.HostPolicy = PolicyAllowAll })
		f.sbx("policy", "init", "allow-all")
		if _, info := create(t, b2, backend.Spec{}); info.Network != networkUnknown {
			t.Errorf("nothing stated on a governed allow-all host: %+v", info)
		}
		_, err = b2.Create(ctx, newID(), backend.Spec{BlockNetwork: boolPtr(false)})
		wantErr(t, err, backend.ErrSpecUnenforceable, "denies")
	})
	t.Run("wildcards", func(t *testing.T) {
		b, f := newFakeBackend(t)
		id, info := create(t, b, backend.Spec{AllowEgressTo: []string{"*.Example.com", "pypi.org:443"}})
		name := b.sbxName(id)
		if info.Network != networkAllowList || !f.called("policy", "allow", "network", "--sandbox", name, "**.example.com,pypi.org:443") {
			t.Fatalf("Info %+v; calls %q", info, f.calls())
		}
		for target, want := range map[string]string{
			"api.example.com": "Allowed", "v2.api.example.com": "Allowed", "example.com": "Denied",
			"pypi.org": "Allowed", "pypi.org:80": "Denied", "files.pythonhosted.org": "Denied",
		} {
			if got := f.policyCheck(name, target); got != want+": "+target {
				t.Errorf("%s: %q, want %s", target, got, want)
			}
		}
	})
}

// TestSbxSmallestMicroVM: sbx runs a 512 MiB microVM since v0.43.
func TestSbxSmallestMicroVM(t *testing.T) {
	b, f := newFakeBackend(t, func(c *Config) { c.Memory = "512m" })
	id, _ := create(t, b, backend.Spec{Resources: backend.Resources{MemoryBytes: 512 << 20}})
	if !f.called("create", "--name", b.sbxName(id), "--memory", "512m") {
		t.Errorf("no 512 MiB microVM asked of sbx: %q", f.calls())
	}
}

// TestSbxPullMissing: sbx create pulls its template always by default,
// which asks the registry on every create; --pull missing uses a template
// already there, so creates go on while the registry is down.
func TestSbxPullMissing(t *testing.T) {
	b, f := newFakeBackend(t)
	create(t, b, backend.Spec{})
	f.set("registry-down", "1")
	create(t, b, backend.Spec{})
	pulls, err := os.ReadFile(filepath.Join(f.state, "pulls.log"))
	if err != nil || strings.Count(string(pulls), "\n") != 1 {
		t.Errorf("pulls of the template: %q, %v; want one", pulls, err)
	}
}

// TestSbxProbeWritesTheWorkspace: a workspace the guest can read but not
// write is refused at create, not found out at the first write_file.
func TestSbxProbeWritesTheWorkspace(t *testing.T) {
	b, f := newFakeBackend(t)
	f.set("workspace-readonly", "1")
	id := newID()
	_, err := b.Create(context.Background(), id, backend.Spec{})
	wantErr(t, err, backend.ErrUnavailable, "cannot write the workspace")
	if names := f.recordNames(); len(names) != 0 {
		t.Errorf("a create refused by the probe left %v", names)
	}
	if _, statErr := os.Stat(filepath.Join(f.dir, id)); !errors.Is(statErr, fs.ErrNotExist) {
		t.Errorf("a create refused by the probe left its directory: %v", statErr)
	}
}
