package seccomp

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// childEnv makes the test binary act as a child that installs a filter and
// reports what a list of system calls returned (installing is irreversible,
// so it never happens in the test process itself).
const childEnv = "SECCOMP_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(runChild(mode))
	}
	os.Exit(m.Run())
}

// requireCI skips, or under CI=true fails, when the host lacks something.
func requireCI(t *testing.T, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("this test needs %s, and CI=true forbids skipping", what)
	}
	t.Skipf("needs %s", what)
}

// seccompData builds struct seccomp_data for the x/net/bpf VM. The VM loads
// 32-bit words big-endian, the kernel natively: each word is laid out
// natively and then stored big-endian, so the VM sees the value the kernel
// would.
func seccompData(nr int32, auditArch uint32, args ...uint64) []byte {
	native := make([]byte, 64)
	binary.NativeEndian.PutUint32(native[0:], uint32(nr))
	binary.NativeEndian.PutUint32(native[4:], auditArch)
	for i, a := range args {
		binary.NativeEndian.PutUint64(native[16+8*i:], a)
	}
	out := make([]byte, 64)
	for i := 0; i < 64; i += 4 {
		binary.BigEndian.PutUint32(out[i:], binary.NativeEndian.Uint32(native[i:]))
	}
	return out
}

type vmFilter struct {
	t    *testing.T
	vm   *bpf.VM
	info *arch.Info
}

func newVM(t *testing.T, o Options) vmFilter {
	t.Helper()
	prog, err := Program(o)
	require.NoError(t, err)
	vm, err := bpf.NewVM(prog)
	require.NoError(t, err)
	info, err := arch.GetInfo("")
	require.NoError(t, err)
	return vmFilter{t: t, vm: vm, info: info}
}

func (v vmFilter) run(nr int32, auditArch uint32, args ...uint64) uint32 {
	v.t.Helper()
	ret, err := v.vm.Run(seccompData(nr, auditArch, args...))
	require.NoError(v.t, err)
	return uint32(ret)
}

func (v vmFilter) call(name string, args ...uint64) uint32 {
	v.t.Helper()
	nr, ok := v.info.SyscallNames[name]
	require.True(v.t, ok, "no syscall %s on %s", name, v.info.Name)
	return v.run(int32(nr), uint32(v.info.ID), args...)
}

const allow uint32 = unix.SECCOMP_RET_ALLOW

var (
	eperm        = retErrno(unix.EPERM)
	enosys       = retErrno(unix.ENOSYS)
	eafnosupport = retErrno(unix.EAFNOSUPPORT)
)

func TestGuestFilterDecisions(t *testing.T) {
	v := newVM(t, Guest())
	cases := []struct {
		name string
		args []uint64
		want uint32
	}{
		{"getpid", nil, allow},
		{"read", []uint64{0, 0, 0}, allow},
		{"keyctl", nil, eperm},
		{"add_key", nil, eperm},
		{"bpf", nil, eperm},
		{"perf_event_open", nil, eperm},
		{"userfaultfd", nil, eperm},
		{"kexec_load", nil, eperm},
		{"kexec_file_load", nil, eperm},
		{"init_module", nil, eperm},
		{"finit_module", nil, eperm},
		{"delete_module", nil, eperm},
		{"mount", nil, eperm},
		{"umount2", nil, eperm},
		{"fsopen", nil, eperm},
		{"open_tree", nil, eperm},
		{"move_mount", nil, eperm},
		{"pivot_root", nil, eperm},
		{"ptrace", nil, eperm},
		{"process_vm_readv", nil, eperm},
		{"open_by_handle_at", nil, eperm},
		{"io_uring_setup", nil, eperm},
		{"setns", nil, eperm},
		{"clone3", nil, enosys},
		{"unshare", []uint64{cloneNewUser}, eperm},
		{"unshare", []uint64{cloneNewNet}, eperm},
		{"unshare", []uint64{cloneNewTime}, eperm},
		{"unshare", []uint64{0x200 /* CLONE_FS */}, allow},
		{"unshare", []uint64{0}, allow},
		// Garbage in the upper half must not hide a flag in the lower.
		{"unshare", []uint64{0xffffffff_00000000 | cloneNewUser}, eperm},
		{"clone", []uint64{uint64(unix.SIGCHLD)}, allow},
		{"clone", []uint64{0x003d0f00}, allow}, // what glibc passes for a thread
		{"clone", []uint64{cloneNewPID | uint64(unix.SIGCHLD)}, eperm},
		{"clone", []uint64{cloneNewUser | cloneNewNS}, eperm},
		{"personality", []uint64{0xffffffff}, allow},
		{"personality", []uint64{0}, allow},
		{"personality", []uint64{0x8}, allow},
		{"personality", []uint64{0x0400000 /* READ_IMPLIES_EXEC */}, eperm},
		{"personality", []uint64{0x0040000 /* ADDR_NO_RANDOMIZE */}, eperm},
		{"personality", []uint64{1 << 32}, eperm},
		{"modify_ldt", []uint64{0, 0, 0}, eperm},
		{"modify_ldt", []uint64{1, 0, 16}, eperm},
		{"memfd_secret", []uint64{0}, eperm},
		// Socket families: local, IP and netlink only.
		{"socket", []uint64{unix.AF_UNIX, unix.SOCK_STREAM, 0}, allow},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_DGRAM, 0}, allow},
		{"socket", []uint64{unix.AF_INET6, unix.SOCK_STREAM, 0}, allow},
		{"socket", []uint64{unix.AF_NETLINK, unix.SOCK_RAW, 0}, allow},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP}, allow}, // the kernel refuses it without CAP_NET_RAW
		{"socket", []uint64{unix.AF_VSOCK, unix.SOCK_STREAM, 0}, eafnosupport},
		{"socket", []uint64{unix.AF_PACKET, unix.SOCK_RAW, 0}, eafnosupport},
		{"socket", []uint64{unix.AF_ALG, unix.SOCK_SEQPACKET, 0}, eafnosupport},
		{"socket", []uint64{unix.AF_KEY, unix.SOCK_RAW, 2}, eafnosupport},
		{"socket", []uint64{unix.AF_XDP, unix.SOCK_RAW, 0}, eafnosupport},
		{"socket", []uint64{unix.AF_TIPC, unix.SOCK_RDM, 0}, eafnosupport},
		{"socket", []uint64{unix.AF_BLUETOOTH, unix.SOCK_RAW, 0}, eafnosupport},
		{"socket", []uint64{unix.AF_UNSPEC, unix.SOCK_STREAM, 0}, eafnosupport},
		// Garbage in the upper half is not AF_UNIX: refused, never let through.
		{"socket", []uint64{1<<32 | unix.AF_VSOCK, unix.SOCK_STREAM, 0}, eafnosupport},
		{"socket", []uint64{1<<32 | unix.AF_UNIX, unix.SOCK_STREAM, 0}, eafnosupport},
		{"socketpair", []uint64{unix.AF_UNIX, unix.SOCK_STREAM, 0, 0}, allow},
		{"socketpair", []uint64{unix.AF_VSOCK, unix.SOCK_STREAM, 0, 0}, eafnosupport},
	}
	for _, c := range cases {
		require.Equal(t, fmt.Sprintf("%#x", c.want), fmt.Sprintf("%#x", v.call(c.name, c.args...)), "%s(%#x)", c.name, c.args)
	}
}

func TestForeignABIsAreRefused(t *testing.T) {
	v := newVM(t, Guest())
	if v.info.ID != arch.X86_64.ID {
		t.Skip("the foreign ABIs checked here are x86-64's")
	}
	// getpid through int 0x80 (i386 number 20) and through x32.
	require.Equal(t, enosys, v.run(20, uint32(arch.I386.ID)))
	require.Equal(t, enosys, v.run(int32(arch.I386.SyscallNames["keyctl"]), uint32(arch.I386.ID)))
	require.Equal(t, enosys, v.run(0x40000000|39, uint32(arch.X86_64.ID)))
	require.Equal(t, enosys, v.run(0x40000000|int32(arch.X32.SyscallNames["keyctl"]&^0x40000000), uint32(arch.X86_64.ID)))
}

// With every argument zero, exactly the unconditional rules (and clone3)
// deny, whatever the syscall number, besides socket and socketpair, whose
// family 0 (AF_UNSPEC) is not an allowed one: no rule leaks into another,
// and no rule is skipped. This is what catches a chaining mistake.
func TestEveryNumberWithZeroArguments(t *testing.T) {
	for _, o := range []Options{Guest(), Supervisor(), {AllowPtrace: true}} {
		v := newVM(t, o)
		want := map[int]uint32{
			v.info.SyscallNames["socket"]:     eafnosupport,
			v.info.SyscallNames["socketpair"]: eafnosupport,
		}
		for _, r := range Rules(o) {
			if r.conds != nil {
				continue
			}
			for _, name := range r.Syscalls {
				if nr, ok := v.info.SyscallNames[name]; ok {
					want[nr] = retErrno(r.Errno)
				}
			}
		}
		for nr := 0; nr < 1024; nr++ {
			exp, denied := want[nr]
			if !denied {
				exp = allow
			}
			got := v.run(int32(nr), uint32(v.info.ID))
			require.Equal(t, exp, got, "options %+v: syscall %d (%s)", o, nr, v.info.SyscallNumbers[nr])
		}
	}
}

// A conditional rule that does not match must not leave an argument where
// the next rule expects the syscall number: an unshare whose flags equal the
// number of a denied syscall is still allowed, a clone whose flags equal
// personality's number too.
func TestConditionalRulesDoNotLeak(t *testing.T) {
	v := newVM(t, Guest())
	require.Equal(t, allow, v.call("unshare", uint64(v.info.SyscallNames["personality"])&^uint64(NamespaceFlags|cloneNewTime)))
	require.Equal(t, allow, v.call("clone", uint64(v.info.SyscallNames["personality"])))
	require.Equal(t, allow, v.call("clone", uint64(v.info.SyscallNames["keyctl"])))
}

func TestOptionsLoosenOnlyWhatTheyName(t *testing.T) {
	sup := newVM(t, Supervisor())
	require.Equal(t, allow, sup.call("unshare", cloneNewUser|cloneNewPID|cloneNewNS))
	require.Equal(t, allow, sup.call("clone", cloneNewUser))
	require.Equal(t, allow, sup.call("clone3"))
	require.Equal(t, allow, sup.call("setns"))
	require.Equal(t, allow, sup.call("mount"))
	require.Equal(t, eperm, sup.call("ptrace"))
	require.Equal(t, eperm, sup.call("keyctl"))
	require.Equal(t, eperm, sup.call("bpf"))

	dbg := newVM(t, Options{AllowPtrace: true})
	require.Equal(t, allow, dbg.call("ptrace"))
	require.Equal(t, eperm, dbg.call("mount"))
	require.Equal(t, eperm, dbg.call("unshare", cloneNewUser))
}

func TestBytesIsTheSockFilterArray(t *testing.T) {
	b, err := Bytes(Guest())
	require.NoError(t, err)
	prog, err := Compile(Guest())
	require.NoError(t, err)
	require.Equal(t, 8*len(prog), len(b))
	require.Equal(t, int(unsafe.Sizeof(unix.SockFilter{})), 8)
	for i, f := range prog {
		require.Equal(t, f.Code, binary.NativeEndian.Uint16(b[8*i:]))
		require.Equal(t, f.K, binary.NativeEndian.Uint32(b[8*i+4:]))
	}
	require.Less(t, len(prog), bpfMaxInsns)
}

func TestMemfdIsSealed(t *testing.T) {
	f, err := Memfd(Guest())
	require.NoError(t, err)
	defer f.Close()
	want, err := Bytes(Guest())
	require.NoError(t, err)
	got := make([]byte, len(want)+8)
	n, _ := f.Read(got)
	require.Equal(t, want, got[:n])
	_, err = f.WriteAt([]byte{0}, 0)
	require.Error(t, err, "the filter must not be writable once sealed")
}

func TestRulesCoverWhatContainerRuntimesDeny(t *testing.T) {
	denied := map[string]bool{}
	for _, r := range Rules(Guest()) {
		for _, s := range r.Syscalls {
			denied[s] = true
		}
	}
	for _, s := range []string{"keyctl", "bpf", "perf_event_open", "userfaultfd", "kexec_load", "kexec_file_load",
		"init_module", "finit_module", "mount", "ptrace", "unshare", "setns", "clone", "clone3", "open_by_handle_at",
		"add_key", "request_key", "swapon", "reboot", "pivot_root", "umount2", "acct", "settimeofday",
		"modify_ldt", "memfd_secret", "socket", "socketpair"} {
		require.True(t, denied[s], "%s is not denied", s)
	}
}

func TestSupported(t *testing.T) {
	requireCI(t, Supported() == nil, "a kernel with seccomp filters")
}

// childResult is what the child reports: errno per probe ("0" for success).
type childResult map[string]string

// probes are system calls whose outcome tells "denied by the filter" from
// "allowed", without side effects on the host when allowed (bad pointers,
// nonexistent targets, invalid commands).
func probes() map[string]func() unix.Errno {
	raw := func(nr uintptr, a ...uintptr) unix.Errno {
		var args [6]uintptr
		copy(args[:], a)
		_, _, e := unix.Syscall6(nr, args[0], args[1], args[2], args[3], args[4], args[5])
		return e
	}
	target, _ := unix.BytePtrFromString("/nonexistent-seccomp-test-target")
	fstype, _ := unix.BytePtrFromString("tmpfs")
	return map[string]func() unix.Errno{
		"getpid":          func() unix.Errno { return raw(unix.SYS_GETPID) },
		"keyctl":          func() unix.Errno { return raw(unix.SYS_KEYCTL, 0, ^uintptr(0)) },
		"bpf":             func() unix.Errno { return raw(unix.SYS_BPF, 9999, 0, 0) },
		"perf_event_open": func() unix.Errno { return raw(unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0) },
		"userfaultfd":     func() unix.Errno { return raw(unix.SYS_USERFAULTFD, ^uintptr(0)) },
		"unshare_user":    func() unix.Errno { return raw(unix.SYS_UNSHARE, cloneNewUser) },
		"clone3":          func() unix.Errno { return raw(unix.SYS_CLONE3, 0, 0) },
		"mount": func() unix.Errno {
			return raw(unix.SYS_MOUNT, uintptr(unsafe.Pointer(fstype)), uintptr(unsafe.Pointer(target)), uintptr(unsafe.Pointer(fstype)), 0, 0)
		},
		"ptrace":      func() unix.Errno { return raw(unix.SYS_PTRACE, unix.PTRACE_PEEKUSR, 0x7ffffff0, 0, 0) },
		"personality": func() unix.Errno { return raw(unix.SYS_PERSONALITY, 0x0400000) },
		"io_uring":    func() unix.Errno { return raw(unix.SYS_IO_URING_SETUP, 0, 0) },
		// Allowed, they open a descriptor: closed at once.
		"socket_unix": func() unix.Errno { return closeFd(unix.Syscall(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM, 0)) },
		"socket_inet": func() unix.Errno { return closeFd(unix.Syscall(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_DGRAM, 0)) },
		"socket_vsock": func() unix.Errno {
			return closeFd(unix.Syscall(unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM, 0))
		},
		"socketpair_vsock": func() unix.Errno { return raw(unix.SYS_SOCKETPAIR, unix.AF_VSOCK, unix.SOCK_STREAM, 0, 0) },
		// modify_ldt(0 = read, NULL, 0) reads nothing; memfd_secret(0)
		// would open a descriptor, closed at once.
		"modify_ldt":   func() unix.Errno { return raw(unix.SYS_MODIFY_LDT, 0, 0, 0) },
		"memfd_secret": func() unix.Errno { return closeFd(unix.Syscall(unix.SYS_MEMFD_SECRET, 0, 0, 0)) },
	}
}

// closeFd closes what a probe that succeeded opened and returns its errno.
func closeFd(fd, _ uintptr, e unix.Errno) unix.Errno {
	if e == 0 {
		unix.Close(int(fd))
	}
	return e
}

func runChild(mode string) int {
	stack := map[string][]Options{
		"guest":            {Guest()},
		"supervisor":       {Supervisor()},
		"supervisor+guest": {Supervisor(), Guest()},
	}[mode]
	for _, o := range stack {
		if err := Install(o); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
	}
	res := childResult{}
	for name, p := range probes() {
		res[name] = fmt.Sprint(int(p()))
	}
	status, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(status), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && (k == "Seccomp" || k == "NoNewPrivs") {
			res[k] = strings.TrimSpace(v)
		}
	}
	json.NewEncoder(os.Stdout).Encode(res)
	return 0
}

func runInChild(t *testing.T, mode string) childResult {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "child: %s", errb.String())
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("child did not finish within 30s")
	}
	var res childResult
	require.NoError(t, json.Unmarshal(out.Bytes(), &res), "child said %q / %q", out.String(), errb.String())
	return res
}

func errno(e unix.Errno) string { return fmt.Sprint(int(e)) }

func TestInstalledGuestFilterDenies(t *testing.T) {
	requireCI(t, Supported() == nil, "a kernel with seccomp filters")
	res := runInChild(t, "guest")
	require.Equal(t, "2", res["Seccomp"])
	require.Equal(t, "1", res["NoNewPrivs"])
	require.Equal(t, "0", res["getpid"])
	for _, name := range []string{"keyctl", "bpf", "perf_event_open", "userfaultfd", "unshare_user", "mount", "ptrace", "personality", "io_uring", "modify_ldt", "memfd_secret"} {
		require.Equal(t, errno(unix.EPERM), res[name], "%s", name)
	}
	require.Equal(t, errno(unix.ENOSYS), res["clone3"])
	require.Equal(t, errno(unix.EAFNOSUPPORT), res["socket_vsock"])
	require.Equal(t, errno(unix.EAFNOSUPPORT), res["socketpair_vsock"])
	require.Equal(t, "0", res["socket_unix"])
	require.Equal(t, "0", res["socket_inet"])
}

func TestInstalledSupervisorFilterAllowsNamespacesAndStacks(t *testing.T) {
	requireCI(t, Supported() == nil, "a kernel with seccomp filters")
	sup := runInChild(t, "supervisor")
	// Allowed by the filter: the kernel's own answer comes back instead
	// (a multithreaded process cannot unshare a user namespace: EINVAL;
	// clone3 with no arguments: EFAULT or EINVAL; no mount point: ENOENT
	// as root, EPERM otherwise).
	require.NotEqual(t, errno(unix.EPERM), sup["unshare_user"])
	require.NotEqual(t, errno(unix.ENOSYS), sup["clone3"])
	if os.Geteuid() == 0 {
		require.Equal(t, errno(unix.ENOENT), sup["mount"])
	}
	require.Equal(t, errno(unix.EPERM), sup["keyctl"])

	both := runInChild(t, "supervisor+guest")
	require.Equal(t, errno(unix.EPERM), both["unshare_user"], "the stricter filter stacked on top wins")
	require.Equal(t, errno(unix.ENOSYS), both["clone3"])
	require.Equal(t, errno(unix.EPERM), both["mount"])
}

// bubblewrap reads the filter from --seccomp FD and installs it just
// before it execs the command, after its own namespace setup.
func TestBubblewrapLoadsTheFilter(t *testing.T) {
	bwrap, err := exec.LookPath("bwrap")
	requireCI(t, err == nil, "bubblewrap (apt-get install bubblewrap)")
	f, err := Memfd(Guest())
	require.NoError(t, err)
	defer f.Close()
	script := `grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status
unshare -U true 2>/dev/null; echo "unshare=$?"
exec 3<&- 2>/dev/null; ls /proc/self/fd | tr '\n' ' '`
	cmd := exec.Command(bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
		"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev",
		"--seccomp", "3", "--", "/bin/sh", "-c", script)
	cmd.ExtraFiles = []*os.File{f}
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	s := string(out)
	require.Contains(t, s, "Seccomp:\t2")
	require.Contains(t, s, "NoNewPrivs:\t1")
	require.Contains(t, s, "unshare=1", "unshare -U must fail under the filter: %s", s)
}

// guestProbe is a guest program (Python, through libc as real tools call
// it) that tries what the filter refuses beyond Docker's default profile,
// and two things it must allow, and prints errno names as JSON.
const guestProbe = `import ctypes, errno, json, socket
libc = ctypes.CDLL(None, use_errno=True)
def sc(nr, *a):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(x) for x in a])
    return "allowed" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
def sock(fam, kind):
    try:
        socket.socket(fam, kind).close()
        return "allowed"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps({
    "vsock": sock(40, socket.SOCK_STREAM),
    "alg": sock(38, socket.SOCK_SEQPACKET),
    "unix": sock(socket.AF_UNIX, socket.SOCK_STREAM),
    "inet": sock(socket.AF_INET, socket.SOCK_DGRAM),
    "inet6": sock(socket.AF_INET6, socket.SOCK_DGRAM),
    "netlink": sock(socket.AF_NETLINK, socket.SOCK_RAW),
    "modify_ldt": sc(154, 0, 0, 0),
    "memfd_secret": sc(447, 0),
}))
`

// TestBubblewrapGuestRefusesFamiliesAndSyscalls runs guestProbe under
// bubblewrap with the guest filter, as a sandbox's commands run: AF_VSOCK
// and AF_ALG sockets, modify_ldt and memfd_secret are refused by the
// filter; local, IP and netlink sockets still work (#13).
func TestBubblewrapGuestRefusesFamiliesAndSyscalls(t *testing.T) {
	bwrap, err := exec.LookPath("bwrap")
	requireCI(t, err == nil, "bubblewrap (apt-get install bubblewrap)")
	_, err = os.Stat("/usr/bin/python3")
	requireCI(t, err == nil, "/usr/bin/python3")
	if arch.X86_64.ID != mustArch(t).ID {
		t.Skip("the probe's system call numbers are x86-64's")
	}
	f, err := Memfd(Guest())
	require.NoError(t, err)
	defer f.Close()
	cmd := exec.Command(bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
		"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev",
		"--seccomp", "3", "--", "/usr/bin/python3", "-c", guestProbe)
	cmd.ExtraFiles = []*os.File{f}
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	var got map[string]string
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	require.Equal(t, map[string]string{
		"vsock": "EAFNOSUPPORT", "alg": "EAFNOSUPPORT",
		"unix": "allowed", "inet": "allowed", "inet6": "allowed", "netlink": "allowed",
		"modify_ldt": "EPERM", "memfd_secret": "EPERM",
	}, got)
}

func mustArch(t *testing.T) *arch.Info {
	t.Helper()
	info, err := arch.GetInfo("")
	require.NoError(t, err)
	return info
}

// dockerDenies are the x86-64 system calls Docker's default seccomp
// profile (moby profiles/seccomp/default.json) refuses a container without
// capabilities, which is what a sandbox's guest is: the calls of the
// architecture's table that the profile neither allows outright nor allows
// under a condition.
var dockerDenies = strings.Fields(`_sysctl acct add_key afs_syscall bpf cachestat chroot clock_settime
create_module delete_module fanotify_init fchmodat2 finit_module fsconfig fsmount fsopen fspick
futex_requeue futex_wait futex_wake get_kernel_syms get_mempolicy getpmsg getxattrat init_module
ioperm iopl kcmp kexec_file_load kexec_load keyctl listmount listxattrat lookup_dcookie
lsm_get_self_attr lsm_list_modules lsm_set_self_attr map_shadow_stack mbind migrate_pages mount
mount_setattr move_mount move_pages mseal nfsservctl open_by_handle_at open_tree open_tree_attr
perf_event_open pidfd_getfd pivot_root process_madvise putpmsg query_module quotactl quotactl_fd
reboot removexattrat request_key security set_mempolicy set_mempolicy_home_node setdomainname
sethostname setns settimeofday setxattrat statmount swapoff swapon sysfs syslog tuxcall umount2
unshare uretprobe uselib userfaultfd ustat vhangup vserver`)

// allowedUnlikeDocker are the calls of dockerDenies the guest filter lets
// through on purpose, each for the reason docs/security.md gives ("The
// guest filter and Docker's default profile").
var allowedUnlikeDocker = map[string]string{
	// Not implemented by Linux on x86-64: the kernel answers ENOSYS.
	"afs_syscall": "unimplemented", "getpmsg": "unimplemented", "putpmsg": "unimplemented",
	"security": "unimplemented", "tuxcall": "unimplemented", "vserver": "unimplemented",
	// The kernel refuses them without a capability the guest never has.
	"chroot": "needs CAP_SYS_CHROOT", "sethostname": "needs CAP_SYS_ADMIN", "setdomainname": "needs CAP_SYS_ADMIN",
	"vhangup": "needs CAP_SYS_TTY_CONFIG",
	// Newer than the profile's list; variants of calls it allows.
	"fchmodat2": "fchmodat", "futex_wait": "futex", "futex_wake": "futex", "futex_requeue": "futex",
	"getxattrat": "getxattr", "setxattrat": "setxattr", "listxattrat": "listxattr", "removexattrat": "removexattr",
	"cachestat": "mincore", "listmount": "/proc/self/mountinfo", "statmount": "/proc/self/mountinfo",
	"lsm_get_self_attr": "/proc/self/attr", "lsm_set_self_attr": "/proc/self/attr", "lsm_list_modules": "/sys/kernel/security/lsm",
	"map_shadow_stack": "hardening", "mseal": "hardening", "uretprobe": "only from the kernel's trampoline",
	// Only with a CLONE_NEW* flag (unsharing the caller's own files, fs
	// or semaphores stays allowed).
	"unshare": "conditional",
}

// TestGuestFilterAgainstDockersDefault: every call Docker's default
// profile refuses a capability-less container is refused by the guest
// filter too, or listed, with its reason, in allowedUnlikeDocker (and
// docs/security.md). A call added to the filter or dropped from it that
// changes this comparison fails here until the list and the docs say so.
func TestGuestFilterAgainstDockersDefault(t *testing.T) {
	v := newVM(t, Guest())
	denied := map[string]bool{}
	for _, r := range Rules(Guest()) {
		for _, name := range r.Syscalls {
			denied[name] = true
		}
	}
	for _, name := range dockerDenies {
		_, known := v.info.SyscallNames[name]
		why, justified := allowedUnlikeDocker[name]
		switch {
		case !known:
			t.Errorf("%s is not in the library's x86-64 table", name)
		case denied[name] && justified && why != "conditional":
			t.Errorf("%s is denied, but allowedUnlikeDocker says it is allowed (%s)", name, why)
		case !denied[name] && !justified:
			t.Errorf("Docker's default profile refuses %s and the guest filter lets it through: deny it, or justify it in allowedUnlikeDocker and docs/security.md", name)
		}
	}
	// Where the guest filter is stricter than Docker's profile.
	for _, name := range []string{"io_uring_setup", "io_uring_enter", "io_uring_register", "name_to_handle_at",
		"ptrace", "process_vm_readv", "process_vm_writev", "modify_ldt", "memfd_secret", "clock_adjtime"} {
		require.Equal(t, eperm, v.call(name), "%s", name)
	}
	require.Equal(t, eafnosupport, v.call("socket", unix.AF_ALG, unix.SOCK_SEQPACKET, 0), "Docker refuses only AF_VSOCK")
}
