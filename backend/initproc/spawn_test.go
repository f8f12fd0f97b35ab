package initproc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestSpawnArgsLayout: spawn_amd64.s reads spawnArgs at fixed offsets.
func TestSpawnArgsLayout(t *testing.T) {
	var a spawnArgs
	for _, c := range []struct {
		name     string
		got, off uintptr
	}{
		{"path", unsafe.Offsetof(a.path), 0}, {"argv", unsafe.Offsetof(a.argv), 8}, {"envp", unsafe.Offsetof(a.envp), 16},
		{"dir", unsafe.Offsetof(a.dir), 24}, {"stdio", unsafe.Offsetof(a.stdio), 32}, {"uid", unsafe.Offsetof(a.uid), 56},
		{"gid", unsafe.Offsetof(a.gid), 64}, {"flags", unsafe.Offsetof(a.flags), 72}, {"pidfd", unsafe.Offsetof(a.pidfd), 80},
		{"block", unsafe.Offsetof(a.block), 88}, {"saved", unsafe.Offsetof(a.saved), 96}, {"empty", unsafe.Offsetof(a.empty), 104},
		{"errno", unsafe.Offsetof(a.errno), 112},
	} {
		if c.got != c.off {
			t.Errorf("spawnArgs.%s at %d, the assembly reads it at %d", c.name, c.got, c.off)
		}
	}
}

// spawnOut runs argv through Spawn with attr (Stdio set here: /dev/null
// in, a pipe out, the same pipe err) and returns its output and status.
func spawnOut(t *testing.T, argv []string, attr SpawnAttr) (string, unix.WaitStatus, error) {
	t.Helper()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	attr.Stdio = [3]int{int(null.Fd()), int(w.Fd()), int(w.Fd())}
	pid, err := Spawn(argv[0], argv, attr)
	w.Close()
	if err != nil {
		return "", 0, err
	}
	var out bytes.Buffer
	_, _ = out.ReadFrom(r)
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, 0, nil); err != nil {
		t.Fatalf("wait4 %d: %v", pid, err)
	}
	return out.String(), ws, nil
}

// statusField is a field of a /proc/<pid>/status text.
func statusField(status, name string) string {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestSpawnCommandState: the command runs in a session and process group
// of its own, in Dir, with Env, its stdio the given descriptors and no
// other, every signal's disposition its default (none caught, none
// ignored that this process does not ignore) and its mask empty, though
// this process has the Go runtime's handlers for every signal and the
// spawning thread some signals blocked.
func TestSpawnCommandState(t *testing.T) {
	// Give the spawning thread a non-empty mask to leak: Spawn must not
	// pass it on (syscall.ForkExec, Spawn on other GOARCHes, does).
	if runtime.GOARCH == "amd64" {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var set, old unix.Sigset_t
		set.Val[0] = 1<<(unix.SIGUSR1-1) | 1<<(unix.SIGWINCH-1)
		if err := unix.PthreadSigmask(unix.SIG_BLOCK, &set, &old); err != nil {
			t.Fatal(err)
		}
		defer unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil)
	}

	dir := t.TempDir()
	out, ws, err := spawnOut(t, []string{"/bin/cat", "/proc/self/status", "/proc/self/stat"}, SpawnAttr{Dir: dir, Env: []string{"A=1"}})
	if err != nil || ws.ExitStatus() != 0 {
		t.Fatalf("cat: %v %v %q", err, ws, out)
	}
	self, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if got := statusField(out, "SigBlk"); got != "0000000000000000" {
		t.Errorf("the command's signal mask is %s, want empty", got)
	}
	if got := statusField(out, "SigCgt"); got != "0000000000000000" {
		t.Errorf("the command catches signals %s, want none", got)
	}
	if got, want := statusField(out, "SigIgn"), statusField(string(self), "SigIgn"); got != want {
		t.Errorf("the command ignores signals %s, want what this process ignores (%s)", got, want)
	}
	stat := out[strings.LastIndex(out, ")")+2:] // after the command's name
	var state string
	var ppid, pgrp, sid int
	if _, err := fmt.Sscan(stat, &state, &ppid, &pgrp, &sid); err != nil {
		t.Fatalf("stat %q: %v", stat, err)
	}
	if p := statusField(out, "Pid"); p != fmt.Sprint(pgrp) || p != fmt.Sprint(sid) {
		t.Errorf("pid %s, process group %d, session %d: want a session of its own", p, pgrp, sid)
	}

	out, _, err = spawnOut(t, []string{"/bin/sh", "-c", `readlink /proc/self/cwd; echo "$A"`}, SpawnAttr{Dir: dir, Env: []string{"A=an env"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := dir + "\nan env\n"; out != want {
		t.Errorf("cwd and env: %q, want %q", out, want)
	}
	// The descriptors: those syscall.ForkExec passes (0-2, and whatever
	// this process inherited without close-on-exec), no more.
	ls := []string{"/bin/ls", "/proc/self/fd"}
	out, _, err = spawnOut(t, ls, SpawnAttr{})
	if err != nil {
		t.Fatal(err)
	}
	null, _ := os.Open(os.DevNull)
	defer null.Close()
	r, w, _ := os.Pipe()
	pid, err := syscall.ForkExec(ls[0], ls, &syscall.ProcAttr{Files: []uintptr{null.Fd(), w.Fd(), w.Fd()}})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	_, _ = want.ReadFrom(r)
	r.Close()
	_, _ = unix.Wait4(pid, nil, 0, nil)
	if out != want.String() || !strings.HasPrefix(out, "0\n1\n") {
		t.Errorf("the command's descriptors: %q, syscall.ForkExec's: %q", out, want.String())
	}
}

// TestSpawnFailures: a command that cannot start is the errno of the
// step that failed, as syscall.ForkExec reported it, and leaves no child.
func TestSpawnFailures(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(garbage, []byte{0x7f, 'E', 'L', 'F', 0, 0, 0, 0}, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		argv []string
		dir  string
		want unix.Errno
	}{
		{"missing program", []string{filepath.Join(dir, "nothing")}, "", unix.ENOENT},
		{"not executable", []string{plain}, "", unix.EACCES},
		{"a directory", []string{dir}, "", unix.EACCES},
		{"not a program", []string{garbage}, "", unix.ENOEXEC},
		{"missing directory", []string{"/bin/true"}, filepath.Join(dir, "nowhere"), unix.ENOENT},
		{"directory is a file", []string{"/bin/true"}, plain, unix.ENOTDIR},
	} {
		_, _, err := spawnOut(t, c.argv, SpawnAttr{Dir: c.dir})
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		if NotRunnableStatus(err) != NotRunnableStatus(c.want) {
			t.Errorf("%s: status %d", c.name, NotRunnableStatus(err))
		}
		// The failed child was reaped.
		var ws unix.WaitStatus
		if pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil); !errors.Is(err, unix.ECHILD) {
			t.Errorf("%s: a child is left (wait4: %d %v)", c.name, pid, err)
		}
	}
	if _, err := Spawn("/bin/true", nil, SpawnAttr{}); !errors.Is(err, unix.EINVAL) {
		t.Errorf("no argv: %v", err)
	}
	if _, err := Spawn("/bin/true", []string{"true"}, SpawnAttr{Stdio: [3]int{0, 1, -1}}); !errors.Is(err, unix.EBADF) {
		t.Errorf("a negative descriptor: %v", err)
	}
}

// TestSpawnCredentials (root): the command runs as Cred with no
// supplementary groups, and Dir is entered as that user: one only root
// may enter fails with EACCES.
func TestSpawnCredentials(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true: this test needs root")
		}
		t.Skip("needs root")
	}
	cred := &Cred{UID: 1000, GID: 1000}
	out, ws, err := spawnOut(t, []string{"/bin/cat", "/proc/self/status"}, SpawnAttr{Dir: "/", Cred: cred})
	if err != nil || ws.ExitStatus() != 0 {
		t.Fatalf("cat: %v %v %q", err, ws, out)
	}
	for field, want := range map[string]string{"Uid": "1000\t1000\t1000\t1000", "Gid": "1000\t1000\t1000\t1000", "Groups": ""} {
		if got := statusField(out, field); got != want {
			t.Errorf("%s: %q, want %q", field, got, want)
		}
	}
	private := filepath.Join(t.TempDir(), "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, _, err := spawnOut(t, []string{"/bin/true"}, SpawnAttr{Dir: private, Cred: cred}); !errors.Is(err, unix.EACCES) {
		t.Errorf("a directory the user may not enter: %v, want EACCES", err)
	}
}

// TestSpawnPidFD: with PidFD the caller gets a pidfd of the command.
func TestSpawnPidFD(t *testing.T) {
	pidfd := -1
	_, ws, err := spawnOut(t, []string{"/bin/true"}, SpawnAttr{PidFD: &pidfd})
	if err != nil || ws.ExitStatus() != 0 {
		t.Fatalf("true: %v %v", err, ws)
	}
	if pidfd < 0 {
		t.Fatal("no pidfd")
	}
	defer unix.Close(pidfd)
	link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", pidfd))
	if err != nil || link != "anon_inode:[pidfd]" {
		t.Errorf("the pidfd is %q (%v)", link, err)
	}
}

// spawnHelperEnv runs this test binary as TestSpawnHelper's child.
const spawnHelperEnv = "SANDBOX_SIDECAR_SPAWN_HELPER"

// TestSpawnWithoutSignalResets proves the point of Spawn: its child makes
// no rt_sigaction call. A helper process (this binary again) fails every
// rt_sigaction with EPERM through a seccomp filter, then starts /bin/true
// with syscall.ForkExec, whose child resets the runtime's handlers and so
// dies ("sigaction failed"), and with Spawn, which must start it.
func TestSpawnWithoutSignalResets(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("Spawn is syscall.ForkExec on " + runtime.GOARCH)
	}
	helper := func(how string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSpawnHelper$", "-test.v")
		cmd.Env = append(os.Environ(), spawnHelperEnv+"="+how)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// The control (its own process: Go's child, dying in init's memory,
	// takes the helper down with it).
	if out, err := helper("forkexec"); err == nil && strings.Contains(out, "forkexec: exit 0") {
		t.Errorf("syscall.ForkExec started a command under the filter: the filter does not catch its resets\n%s", out)
	}
	if out, err := helper("spawn"); err != nil || !strings.Contains(out, "spawn: exit 0") {
		t.Errorf("Spawn did not start /bin/true without rt_sigaction: %v\n%s", err, out)
	}
}

func TestSpawnHelper(t *testing.T) {
	how := os.Getenv(spawnHelperEnv)
	if how == "" {
		t.Skip("run by TestSpawnWithoutSignalResets")
	}
	const (
		auditArchX8664 = 0xc000003e
		retAllow       = 0x7fff0000
		retErrno       = 0x00050000
	)
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 4}, // arch
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 3, K: auditArchX8664},
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // nr
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: unix.SYS_RT_SIGACTION},
		{Code: unix.BPF_RET | unix.BPF_K, K: retErrno | uint32(unix.EPERM)},
		{Code: unix.BPF_RET | unix.BPF_K, K: retAllow},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog))); e != 0 {
		t.Fatalf("seccomp: %v", e)
	}
	run := func(name string, start func() (int, error)) {
		pid, err := start()
		if err != nil {
			fmt.Printf("%s: failed: %v\n", name, err)
			return
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(pid, &ws, 0, nil); err != nil {
			t.Fatal(err)
		}
		if ws.ExitStatus() != 0 {
			fmt.Printf("%s: failed: %v\n", name, ws)
			return
		}
		fmt.Printf("%s: exit 0\n", name)
	}
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	fd := int(null.Fd())
	if how == "forkexec" {
		run(how, func() (int, error) {
			return syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{Files: []uintptr{uintptr(fd), uintptr(fd), uintptr(fd)}})
		})
		return
	}
	run(how, func() (int, error) { return Spawn("/bin/true", []string{"true"}, SpawnAttr{Stdio: [3]int{fd, fd, fd}}) })
}
