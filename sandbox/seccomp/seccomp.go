// Package seccomp builds the system-call filter every sandbox process runs
// under, as a compiled classic BPF program: the bytes bubblewrap's
// `--seccomp FD` reads, or a filter a supervisor inside the sandbox installs
// on itself just before it execs a guest command.
//
// The filter is a denylist over a default of "allow". It denies what
// container runtimes deny an unprivileged container by default (Docker's
// default profile: kernel modules, kexec, keyrings, bpf, perf, userfaultfd,
// handle-based opens, clock and swap changes, NUMA placement, mounting,
// namespaces, tracing other processes, io_uring), a few more (modify_ldt,
// memfd_secret, every socket family but AF_UNIX, AF_INET, AF_INET6 and
// AF_NETLINK; docs/security.md compares it with Docker's profile call by
// call) and every system call made
// through a foreign ABI (32-bit int 0x80 and x32 on x86-64), which would
// otherwise bypass a denylist keyed on x86-64 numbers. What is denied depends
// on Options, so that a supervisor that itself creates nested namespaces can
// run under a looser filter than the guest code it starts; filters stack,
// and the strictest one wins.
//
// The rules are assembled by github.com/elastic/go-seccomp-bpf (pure Go; no
// cgo, no libseccomp). This package never installs a filter unless Install is
// called, and it knows nothing of sandboxes, daemons or bubblewrap's other
// options.
package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"unsafe"

	libseccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Options choose what the filter leaves allowed. The zero value is the
// strictest filter, the one for guest code.
type Options struct {
	// AllowNamespaces permits creating and entering namespaces: clone and
	// unshare with CLONE_NEW* flags, clone3, setns. A supervisor that starts
	// each command in a nested user and PID namespace needs it; guest code
	// never does (a nested user namespace hands the guest every capability
	// inside it, and with them much more of the kernel to attack).
	AllowNamespaces bool
	// AllowMount permits mount, umount2, pivot_root and the new mount API
	// (fsopen, fsmount, open_tree, move_mount, ...). A supervisor that mounts
	// /proc for a nested PID namespace needs it; guest code never does.
	AllowMount bool
	// AllowPtrace permits ptrace and its relatives (process_vm_readv/writev,
	// kcmp, pidfd_getfd, process_madvise) among the sandbox's own processes,
	// for debuggers and strace. The PID and user namespaces already keep
	// them from reaching anything outside the sandbox; off by default all the
	// same, since guests rarely need them.
	AllowPtrace bool
}

// Guest is the filter for untrusted code: everything in the denylist denied.
func Guest() Options { return Options{} }

// Supervisor is the filter for a process inside the sandbox that builds
// namespaces for the commands it starts (an init); it must install Guest on
// each command before exec.
func Supervisor() Options { return Options{AllowNamespaces: true, AllowMount: true} }

// Clone and unshare flags that create namespaces (linux/sched.h).
const (
	cloneNewTime   = 0x00000080
	cloneNewNS     = 0x00020000
	cloneNewCgroup = 0x02000000
	cloneNewUTS    = 0x04000000
	cloneNewIPC    = 0x08000000
	cloneNewUser   = 0x10000000
	cloneNewPID    = 0x20000000
	cloneNewNet    = 0x40000000

	// NamespaceFlags are the CLONE_NEW* flags clone(2) takes. CLONE_NEWTIME
	// shares its bit with the exit signal in clone(2)'s flags, so it is only
	// checked for unshare(2).
	NamespaceFlags = cloneNewNS | cloneNewCgroup | cloneNewUTS | cloneNewIPC | cloneNewUser | cloneNewPID | cloneNewNet
)

// Socket address families the filter lets through (linux/socket.h):
// local sockets, IPv4, IPv6 (what every network tool needs, loopback
// included) and netlink (what ip, ss and glibc's getaddrinfo use to read
// the sandbox's own interfaces and routes). Everything else is refused with
// EAFNOSUPPORT, the kernel's own answer for a family it lacks, so programs
// fall back as they would on a kernel built without it. Among the refused:
// AF_VSOCK, which is not namespaced (a guest would bind ports in the host's
// vsock space and, on a VM, reach the hypervisor's), AF_PACKET (raw frames),
// AF_ALG (the kernel crypto API), AF_KEY, AF_XDP, and the long tail of
// protocol families (TIPC, RDS, CAN, Bluetooth, ...) whose code is rarely
// exercised and a steady source of kernel bugs.
const (
	afUnix    = 1
	afInet    = 2
	afInet6   = 10
	afNetlink = 16
	afVsock   = 40
)

// AllowedSocketFamilies lists the families socket(2) and socketpair(2)
// may create.
var AllowedSocketFamilies = []uint64{afUnix, afInet, afInet6, afNetlink}

// personalities the filter lets through (Docker's list): PER_LINUX,
// PER_LINUX32, UNAME26, PER_LINUX32|UNAME26, and 0xffffffff, which only
// queries. Anything else (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE, ...) weakens
// the process's own hardening and is refused.
var allowedPersonalities = []uint64{0x0, 0x8, 0x20000, 0x20008, 0xffffffff}

// Rule is one entry of the denylist, for documentation and tests.
type Rule struct {
	// Syscalls are the names denied (those the architecture lacks are
	// skipped when the filter is built).
	Syscalls []string
	// When describes an argument condition, or "" for "always".
	When string
	// Errno is what a denied call returns.
	Errno unix.Errno
	// Why says what the rule protects.
	Why string

	conds []libseccomp.ArgumentConditions // nil: unconditional; else any set matching denies
}

// Rules returns the denylist for o, in the order the filter checks it.
func Rules(o Options) []Rule {
	var rules []Rule
	add := func(r Rule) { rules = append(rules, r) }

	add(Rule{Syscalls: []string{"init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms"},
		Errno: unix.EPERM, Why: "loading or removing kernel modules"})
	add(Rule{Syscalls: []string{"kexec_load", "kexec_file_load", "reboot"},
		Errno: unix.EPERM, Why: "replacing or rebooting the kernel"})
	add(Rule{Syscalls: []string{"keyctl", "add_key", "request_key"},
		Errno: unix.EPERM, Why: "kernel keyrings are not namespaced: keys of other users and sandboxes"})
	add(Rule{Syscalls: []string{"bpf", "perf_event_open", "userfaultfd", "lookup_dcookie"},
		Errno: unix.EPERM, Why: "eBPF, performance counters and userfaultfd: large kernel attack surface, frequent exploit primitives"})
	add(Rule{Syscalls: []string{"io_uring_setup", "io_uring_enter", "io_uring_register"},
		Errno: unix.EPERM, Why: "io_uring: a history of privilege escalations; disabled by container runtimes"})
	add(Rule{Syscalls: []string{"name_to_handle_at", "open_by_handle_at"},
		Errno: unix.EPERM, Why: "opening files by handle bypasses the mount namespace (the 'shocker' escape)"})
	add(Rule{Syscalls: []string{"acct", "swapon", "swapoff", "quotactl", "quotactl_fd", "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl", "syslog", "vm86", "vm86old", "iopl", "ioperm"},
		Errno: unix.EPERM, Why: "host administration, obsolete interfaces and raw I/O ports"})
	add(Rule{Syscalls: []string{"settimeofday", "stime", "clock_settime", "clock_adjtime"},
		Errno: unix.EPERM, Why: "the clock is the host's"})
	add(Rule{Syscalls: []string{"mbind", "set_mempolicy", "get_mempolicy", "set_mempolicy_home_node", "move_pages", "migrate_pages"},
		Errno: unix.EPERM, Why: "NUMA placement of memory, including other processes'"})
	add(Rule{Syscalls: []string{"fanotify_init"},
		Errno: unix.EPERM, Why: "filesystem-wide event monitoring; its unprivileged mode is recent and little used (inotify serves the sandbox's tools)"})
	add(Rule{Syscalls: []string{"modify_ldt"},
		Errno: unix.EPERM, Why: "16-bit segments in a per-process descriptor table: only DOS and Win16 emulators need them, and the code behind them has had several privilege escalations"})
	add(Rule{Syscalls: []string{"memfd_secret"},
		Errno: unix.EPERM, Why: "secret memory is taken out of the kernel's direct map (fragmenting it for the whole host), locked in RAM and hidden from the host's own tools; nothing a sandbox runs needs it"})

	family := libseccomp.ArgumentConditions{}
	for _, f := range AllowedSocketFamilies {
		family = append(family, libseccomp.Condition{Argument: 0, Operation: libseccomp.NotEqual, Value: f})
	}
	add(Rule{Syscalls: []string{"socket", "socketpair"}, When: "family not AF_UNIX, AF_INET, AF_INET6 or AF_NETLINK",
		Errno: unix.EAFNOSUPPORT, Why: "address families beyond local, IP and netlink sockets: AF_VSOCK is not namespaced (the host's and hypervisor's vsock space), the others are rarely used kernel code",
		conds: []libseccomp.ArgumentConditions{family}})

	personality := libseccomp.ArgumentConditions{}
	for _, p := range allowedPersonalities {
		personality = append(personality, libseccomp.Condition{Argument: 0, Operation: libseccomp.NotEqual, Value: p})
	}
	add(Rule{Syscalls: []string{"personality"}, When: "persona not one of 0x0, 0x8, 0x20000, 0x20008, 0xffffffff",
		Errno: unix.EPERM, Why: "execution domains that turn off ASLR or make data executable",
		conds: []libseccomp.ArgumentConditions{personality}})

	if !o.AllowMount {
		add(Rule{Syscalls: []string{"mount", "umount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick", "open_tree", "open_tree_attr", "move_mount", "mount_setattr"},
			Errno: unix.EPERM, Why: "mounting filesystems (in a nested user namespace it would succeed and expose filesystem parsers)"})
	}
	if !o.AllowNamespaces {
		add(Rule{Syscalls: []string{"setns"}, Errno: unix.EPERM, Why: "entering other namespaces"})
		add(Rule{Syscalls: []string{"unshare"}, When: "flags include a CLONE_NEW* flag",
			Errno: unix.EPERM, Why: "new namespaces; a user namespace hands the guest every capability inside it",
			conds: []libseccomp.ArgumentConditions{{{Argument: 0, Operation: libseccomp.BitsSet, Value: NamespaceFlags | cloneNewTime}}}})
		add(Rule{Syscalls: []string{"clone"}, When: "flags include a CLONE_NEW* flag",
			Errno: unix.EPERM, Why: "new namespaces, as for unshare",
			conds: []libseccomp.ArgumentConditions{{{Argument: 0, Operation: libseccomp.BitsSet, Value: NamespaceFlags}}}})
		// clone3 passes its flags in memory, out of a filter's reach: make
		// it look absent, and the C library falls back to clone(2), whose
		// flags are checked above.
		add(Rule{Syscalls: []string{"clone3"}, Errno: unix.ENOSYS,
			Why: "flags in memory cannot be checked; ENOSYS makes libc fall back to clone"})
	}
	if !o.AllowPtrace {
		add(Rule{Syscalls: []string{"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise"},
			Errno: unix.EPERM, Why: "reading, writing or steering other processes"})
	}
	return rules
}

// ForeignABIErrno is what every system call through an ABI other than the
// native one returns: on x86-64, 32-bit calls (int 0x80) and x32 calls.
const ForeignABIErrno = unix.ENOSYS

// Program returns the filter for o as classic BPF instructions for the
// architecture this binary was built for.
func Program(o Options) ([]bpf.Instruction, error) {
	native, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp: no system call table for %s: %w", runtime.GOARCH, err)
	}
	// The library's programs keep the syscall number in the accumulator
	// only until an argument is loaded: a rule with argument conditions
	// that does not match leaves an argument there for the rules after it.
	// So every conditional rule gets a program of its own, and the programs
	// are chained: each one's final "allow" is replaced by the next program,
	// which starts by loading the architecture and the number again.
	unconditional := libseccomp.Policy{DefaultAction: libseccomp.ActionAllow}
	var policies []libseccomp.Policy
	for _, r := range Rules(o) {
		action := libseccomp.ActionErrno | libseccomp.Action(r.Errno)
		names := make([]string, 0, len(r.Syscalls))
		for _, name := range r.Syscalls {
			if _, ok := native.SyscallNames[name]; ok { // vm86, stime... do not exist on x86-64
				names = append(names, name)
			}
		}
		if r.conds == nil {
			if len(names) > 0 {
				unconditional.Syscalls = append(unconditional.Syscalls, libseccomp.SyscallGroup{Names: names, Action: action})
			}
			continue
		}
		for _, name := range names {
			group := libseccomp.SyscallGroup{Action: action}
			for _, c := range r.conds {
				group.NamesWithCondtions = append(group.NamesWithCondtions, libseccomp.NameWithConditions{Name: name, Conditions: c})
			}
			policies = append(policies, libseccomp.Policy{DefaultAction: libseccomp.ActionAllow, Syscalls: []libseccomp.SyscallGroup{group}})
		}
	}
	policies = append([]libseccomp.Policy{unconditional}, policies...)

	// The library lets a call from a foreign architecture through with the
	// default action (allow), which would make every rule void for a
	// process using int 0x80. Refuse those calls first.
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(native.ID), SkipTrue: 1},
		bpf.RetConstant{Val: retErrno(ForeignABIErrno)},
	}
	allow := bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW}
	for i, p := range policies {
		if len(p.Syscalls) == 0 {
			continue
		}
		body, err := p.Assemble()
		if err != nil {
			return nil, fmt.Errorf("seccomp: assembling the filter: %w", err)
		}
		if last := len(body) - 1; body[last] != allow {
			return nil, fmt.Errorf("seccomp: program %d does not end in allow (%v); the chaining below would be wrong", i, body[last])
		} else if i < len(policies)-1 {
			body = body[:last]
		}
		prog = append(prog, body...)
	}
	// Chaining is only sound if nothing returns "allow" before the end (the
	// library copies a return to shorten long jumps; an early allow would
	// skip the programs after it).
	for i, in := range prog[:len(prog)-1] {
		if in == allow {
			return nil, fmt.Errorf("seccomp: instruction %d returns allow before the end of the filter; the rules after it would be skipped", i)
		}
	}
	if prog[len(prog)-1] != allow {
		return nil, errors.New("seccomp: the filter does not end in allow")
	}
	return prog, nil
}

// Offsets in struct seccomp_data.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

func retErrno(e unix.Errno) uint32 {
	return unix.SECCOMP_RET_ERRNO | (uint32(e) & unix.SECCOMP_RET_DATA)
}

// Compile returns the filter for o as the kernel's struct sock_filter array.
func Compile(o Options) ([]unix.SockFilter, error) {
	insts, err := Program(o)
	if err != nil {
		return nil, err
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("seccomp: assembling BPF: %w", err)
	}
	if len(raw) > bpfMaxInsns {
		return nil, fmt.Errorf("seccomp: the filter has %d instructions, more than the kernel's %d", len(raw), bpfMaxInsns)
	}
	out := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		out[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return out, nil
}

// bpfMaxInsns is BPF_MAXINSNS, the kernel's limit on a classic program.
const bpfMaxInsns = 4096

// Bytes returns the filter for o in the format bubblewrap's --seccomp FD
// reads: the struct sock_filter array, native byte order, nothing else.
func Bytes(o Options) ([]byte, error) {
	prog, err := Compile(o)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, 8*len(prog))
	for _, f := range prog {
		out = binary.NativeEndian.AppendUint16(out, f.Code)
		out = append(out, f.Jt, f.Jf)
		out = binary.NativeEndian.AppendUint32(out, f.K)
	}
	return out, nil
}

// Memfd returns a sealed, read-only-content anonymous file holding Bytes(o),
// positioned at its start, for `--seccomp N` with the file in
// exec.Cmd.ExtraFiles at N-3. It is close-on-exec (ExtraFiles clears that
// in the child); the caller closes it once bwrap has started.
func Memfd(o Options) (*os.File, error) {
	data, err := Bytes(o)
	if err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate("sandbox-seccomp", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("seccomp: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "sandbox-seccomp")
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, fmt.Errorf("seccomp: writing the filter: %w", err)
	}
	// Sealed, so nothing holding the descriptor can change the filter
	// between now and the moment bubblewrap reads it.
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		f.Close()
		return nil, fmt.Errorf("seccomp: sealing the filter: %w", err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Install sets no_new_privs and loads the filter for o into every thread of
// the calling process (SECCOMP_FILTER_FLAG_TSYNC). It cannot be undone: call
// it only in a process that is about to exec the command it confines (a
// helper re-executed for that purpose), never in the daemon.
func Install(o Options) error {
	prog, err := Compile(o)
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("seccomp: prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		if errno == unix.ENOSYS || errno == unix.EINVAL {
			return fmt.Errorf("seccomp: the kernel does not support seccomp filters (%w); a kernel built with CONFIG_SECCOMP_FILTER is required", errno)
		}
		return fmt.Errorf("seccomp: loading the filter: %w", errno)
	}
	return nil
}

// ErrUnsupported: the kernel cannot run seccomp filters.
var ErrUnsupported = errors.New("seccomp filters are not supported by this kernel")

// Supported reports whether the kernel accepts seccomp filters, without
// installing one: it reads /proc/sys/kernel/seccomp/actions_avail, which
// exists on every kernel with filter support (4.14+).
func Supported() error {
	b, err := os.ReadFile("/proc/sys/kernel/seccomp/actions_avail")
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	for _, need := range []string{"errno", "allow"} {
		if !containsWord(string(b), need) {
			return fmt.Errorf("%w: action %q missing from actions_avail (%q)", ErrUnsupported, need, b)
		}
	}
	return nil
}

func containsWord(s, w string) bool {
	for start := 0; start < len(s); {
		end := start
		for end < len(s) && s[end] != ' ' && s[end] != '\n' {
			end++
		}
		if s[start:end] == w {
			return true
		}
		start = end + 1
	}
	return false
}
