package bwrap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/hostids"
)

// hostIDs are the real, effective, saved and filesystem uids of pid.
func hostIDs(t *testing.T, pid int) []int {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			var ids []int
			for _, f := range strings.Fields(rest) {
				n, err := strconv.Atoi(f)
				require.NoError(t, err)
				ids = append(ids, n)
			}
			return ids
		}
	}
	t.Fatalf("no Uid line for pid %d", pid)
	return nil
}

// startedInit runs a command in sandbox id so its init exists, and
// returns the init's pid.
func startedInit(t *testing.T, b *Backend, id string) int {
	t.Helper()
	runOK(t, b, id, "echo secret > /workspace/secret")
	pid := initPID(t, b, id)
	require.NotZero(t, pid, "no init")
	return pid
}

// Two live sandboxes of a root daemon run as two host uids of the range,
// neither shared with anything else; the guest still sees uid 1000; its
// files are its uid's; its directory lets only that uid in.
func TestBwrapSandboxesHaveHostUIDsOfTheirOwn(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	ctx := context.Background()
	var uids []int
	for _, id := range []string{"own-uid-a", "own-uid-b"} {
		info, err := b.Create(ctx, id, backend.Spec{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Destroy(ctx, id) })
		require.True(t, testRange.Contains(info.HostUID), "Info.HostUID %d is not in %s", info.HostUID, testRange)

		pid := startedInit(t, b, id)
		want := int(info.HostUID)
		require.Equal(t, []int{want, want, want, want}, hostIDs(t, pid), "init's host uids")
		require.Equal(t, "1000\n", runOK(t, b, id, "id -u"), "the guest's own view")
		assertOwner(t, filepath.Join(b.sandboxDir(id), workDirName), want)
		assertOwner(t, filepath.Join(b.sandboxDir(id), workDirName, "secret"), want)
		require.NoError(t, b.WriteFile(ctx, id, "/workspace/d/from-host", []byte("x"), 0))
		assertOwner(t, filepath.Join(b.sandboxDir(id), workDirName, "d"), want)
		assertOwner(t, filepath.Join(b.sandboxDir(id), workDirName, "d", "from-host"), want)

		fi, err := os.Stat(b.sandboxDir(id))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(ownSandboxDirMode), fi.Mode().Perm())
		require.Equal(t, uint32(want), fi.Sys().(*syscall.Stat_t).Gid)
		uids = append(uids, want)
	}
	require.NotEqual(t, uids[0], uids[1], "two live sandboxes share a host uid")
}

// probeAsNobody runs, as host uid 65534 (any local process of that uid:
// an NFS-squashed user, another program's sandbox), the three attacks of
// a shared uid on a sandbox whose init is pid: read its workspace through
// /proc/<pid>/root, PTRACE_ATTACH to it, SIGKILL it. It returns what each
// did: "ok" or the error.
func probeAsNobody(t *testing.T, pid int) map[string]string {
	t.Helper()
	script := fmt.Sprintf(`
import ctypes, json, os, signal
pid = %d
out = {}
try:
    out["read"] = "ok:" + open("/proc/%%d/root/workspace/secret" %% pid).read().strip()
except OSError as e:
    out["read"] = e.strerror
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
if libc.ptrace(16, pid, None, None) == 0:  # PTRACE_ATTACH
    out["ptrace"] = "ok"
    libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
else:
    out["ptrace"] = os.strerror(ctypes.get_errno())
try:
    os.kill(pid, 0)  # the permission check of SIGKILL, without the kill
    out["kill"] = "ok"
except OSError as e:
    out["kill"] = e.strerror
print(json.dumps(out))
`, pid)
	cmd := exec.Command("/usr/bin/python3", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	var got map[string]string
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	return got
}

// A process of uid 65534 can neither read a sandbox's workspace, nor
// ptrace nor signal its init — which it could when every sandbox ran as
// 65534 (the shared mode, probed too so the probe is known to bite).
func TestBwrapNobodyCannotReachASandbox(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		skipOrFail(t, "python3 is needed for the probe: %v", err)
	}
	shared := newTestBackend(t, sharedUID)
	sid := create(t, shared, backend.Spec{})
	got := probeAsNobody(t, startedInit(t, shared, sid))
	require.Equal(t, map[string]string{"read": "ok:secret", "ptrace": "ok", "kill": "ok"}, got,
		"the probe must reach a sandbox that shares uid 65534, or it proves nothing")

	b := newTestBackend(t, rangeUID)
	id := create(t, b, backend.Spec{})
	pid := startedInit(t, b, id)
	got = probeAsNobody(t, pid)
	for what, res := range got {
		if strings.HasPrefix(res, "ok") {
			t.Errorf("uid 65534 could %s the init of a sandbox with a uid of its own: %s", what, res)
		}
	}
	require.Equal(t, "Permission denied", got["read"])
	require.Equal(t, "Operation not permitted", got["ptrace"])
	require.Equal(t, "Operation not permitted", got["kill"])
	require.Equal(t, "ok\n", runOK(t, b, id, "echo ok"), "the sandbox lives on")
}

// A restarted daemon re-adopts a sandbox with the uid recorded for it and
// never hands that uid (nor one of a half-made sandbox) to a new sandbox;
// Destroy returns it.
func TestBwrapRestartKeepsEachSandboxsUID(t *testing.T) {
	first := newTestBackend(t, rangeUID)
	ctx := context.Background()
	kept, err := first.Create(ctx, "kept", backend.Spec{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = first.Destroy(ctx, "kept") })
	runOK(t, first, "kept", "echo data > f")
	first.killInit(known(t, first, "kept"))

	// A sandbox half made by a daemon that died before its spec.json: only
	// its directory's group names its uid.
	half := filepath.Join(first.cfg.Dir, "half")
	require.NoError(t, os.Mkdir(half, 0o700))
	halfUID := kept.HostUID + 1
	if !testRange.Contains(halfUID) {
		halfUID = testRange.First
	}
	require.NoError(t, os.Chown(half, -1, int(halfUID)))
	require.NoError(t, os.Chmod(half, ownSandboxDirMode))

	// A tiny range: the two ids in use, and one free.
	cfg := first.cfg
	cfg.UIDRange = hostids.Range{First: min(kept.HostUID, halfUID), Size: 3}
	if max(kept.HostUID, halfUID)-cfg.UIDRange.First >= 3 {
		t.Fatalf("test setup: %d and %d are not adjacent", kept.HostUID, halfUID)
	}
	second, err := New(cfg)
	require.NoError(t, err)
	require.Equal(t, "data\n", runOK(t, second, "kept", "cat f"))
	pid := initPID(t, second, "kept")
	require.Equal(t, int(kept.HostUID), hostIDs(t, pid)[0], "re-adopted with its recorded uid")

	fresh, err := second.Create(ctx, "fresh", backend.Spec{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = second.Destroy(ctx, "fresh") })
	require.NotEqual(t, kept.HostUID, fresh.HostUID)
	require.NotEqual(t, halfUID, fresh.HostUID)
	_, err = second.Create(ctx, "one-too-many", backend.Spec{})
	wantErr(t, err, backend.ErrUnavailable)
	require.True(t, errors.Is(err, backend.ErrUnavailable) && strings.Contains(err.Error(), "uid_range_size"), "%v", err)

	// Destroying the half-made sandbox returns its uid.
	require.NoError(t, second.Destroy(ctx, "half"))
	again, err := second.Create(ctx, "one-too-many", backend.Spec{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = second.Destroy(ctx, "one-too-many") })
	require.Equal(t, halfUID, again.HostUID)
}

// Two sandboxes whose settings claim one uid: the second is not adopted.
func TestBwrapDuplicateUIDIsNotAdopted(t *testing.T) {
	first := newTestBackend(t, rangeUID)
	ctx := context.Background()
	a := create(t, first, backend.Spec{})
	bID := create(t, first, backend.Spec{})
	runOK(t, first, a, "true")
	specA, err := first.loadSpec(a)
	require.NoError(t, err)
	specB, err := first.loadSpec(bID)
	require.NoError(t, err)
	specB.UID = specA.UID
	raw, err := json.Marshal(specB)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(first.sandboxDir(bID), specName), raw, 0o600))
	first.killInit(known(t, first, a))

	second, err := New(first.cfg)
	require.NoError(t, err)
	// Which of the two New reads first is the directory's order; exactly
	// one runs.
	var ran, refused int
	for _, id := range []string{a, bID} {
		_, err := second.Exec(ctx, id, backend.ExecRequest{Command: "true", Timeout: 10 * time.Second})
		switch {
		case err == nil:
			ran++
		case errors.Is(err, backend.ErrNotFound) && strings.Contains(err.Error(), "did not reserve"):
			refused++
		default:
			t.Errorf("Exec(%s): %v", id, err)
		}
	}
	require.Equal(t, [2]int{1, 1}, [2]int{ran, refused})
	for _, id := range []string{a, bID} {
		require.NoError(t, second.Destroy(ctx, id))
	}
}

// A sandbox made before the range existed (no uid in its spec.json) keeps
// running as the uid it was made with; new ones get their own.
func TestBwrapSandboxFromBeforeTheRangeKeepsItsUID(t *testing.T) {
	old := newTestBackend(t, sharedUID)
	ctx := context.Background()
	id := create(t, old, backend.Spec{})
	runOK(t, old, id, "echo from-before > f")
	old.killInit(known(t, old, id))

	cfg := old.cfg
	cfg.UIDRange = testRange
	upgraded, err := New(cfg)
	require.NoError(t, err)
	require.Equal(t, "from-before\n", runOK(t, upgraded, id, "cat f; echo more >> f"))
	require.Equal(t, 65534, hostIDs(t, initPID(t, upgraded, id))[0])
	require.NoError(t, upgraded.WriteFile(ctx, id, "/workspace/w", []byte("x"), 0))
	assertOwner(t, filepath.Join(upgraded.sandboxDir(id), workDirName, "w"), 65534)

	info, err := upgraded.Create(ctx, "after-upgrade", backend.Spec{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = upgraded.Destroy(ctx, "after-upgrade") })
	require.True(t, testRange.Contains(info.HostUID))
	require.NoError(t, upgraded.Destroy(ctx, id))
}

// New refuses a range holding a user, a group or someone's subordinate
// ids, and says which.
func TestNewRefusesARangeThatOverlapsARealUser(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "the uid range needs root here")
	}
	dir := t.TempDir()
	for p := dir; p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
		require.NoError(t, os.Chmod(p, 0o711))
	}
	passwd := filepath.Join(dir, "passwd")
	require.NoError(t, os.WriteFile(passwd, []byte(fmt.Sprintf("root:x:0:0::/root:/bin/sh\nsquashed:x:%d:100::/:/bin/false\n", testRange.First+7)), 0o644))
	_, err := New(Config{Dir: filepath.Join(dir, "state"), SandboxUID: 65534, SandboxGID: 65534, UIDRange: testRange, AccountFiles: hostids.Files{Passwd: passwd}})
	require.Error(t, err)
	require.Contains(t, err.Error(), `user "squashed"`)
	require.Contains(t, err.Error(), "bwrap.uid_range_start")

	_, err = New(Config{Dir: filepath.Join(dir, "state"), SandboxUID: 65534, SandboxGID: 65534, UIDRange: hostids.Range{First: 0x7FFFFFFF, Size: 1}, AccountFiles: hostids.Files{Passwd: filepath.Join(dir, "none")}})
	require.NoError(t, err, "a clear range is accepted")
}

// A daemon that is neither root nor holds the capabilities refuses a range
// with the reason (checked without changing this process's ids).
func TestCheckUIDPrivilegeNamesWhatIsMissing(t *testing.T) {
	if os.Geteuid() == 0 {
		viaCaps, err := checkUIDPrivilege()
		require.NoError(t, err)
		require.False(t, viaCaps, "root needs no capabilities")
	}
	eff, _, err := capSets()
	require.NoError(t, err)
	if os.Geteuid() != 0 && eff&(1<<5|1<<6|1<<7) != 1<<5|1<<6|1<<7 {
		_, err := checkUIDPrivilege()
		require.ErrorContains(t, err, "CAP_SETUID")
	}
}

// lockFSIDs gives only its own thread the sandbox's filesystem ids, so what
// it creates is the sandbox's, and restore gives the daemon's back.
func TestLockFSIDsIsPerThreadAndRestored(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "setfsuid to another uid needs root or CAP_SETUID")
	}
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o777))
	for p := filepath.Dir(dir); p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
		require.NoError(t, os.Chmod(p, 0o711))
	}
	uid := int(testRange.First)
	restore, err := lockFSIDs(uid, uid)
	require.NoError(t, err)
	restored := false
	defer func() {
		if !restored {
			restore()
		}
	}()
	require.Equal(t, [2]int{uid, uid}, fsIDs())
	other := make(chan [2]int)
	go func() { other <- fsIDs() }()
	require.Equal(t, [2]int{0, 0}, <-other, "another goroutine's thread kept the daemon's ids")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "made-as-sandbox"), nil, 0o600))
	restore()
	restored = true
	require.Equal(t, [2]int{0, 0}, fsIDs())
	assertOwner(t, filepath.Join(dir, "made-as-sandbox"), uid)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "made-as-daemon"), nil, 0o600))
	assertOwner(t, filepath.Join(dir, "made-as-daemon"), 0)
}
