package escape

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// Verdicts in the table.
const (
	contained = "contained"
	gap       = "gap"  // not an escape, but weaker than required until limits are wired
	info      = "info" // what a tool reports; nothing to contain
	failed    = "FAIL" // an escape or a daemon that did not survive
)

type row struct {
	Group, Attempt, Expected, Observed, Verdict string
}

type battery struct {
	t    *testing.T
	h    *harness
	rows []row
}

// record adds a row; a FAIL also fails the test.
func (b *battery) record(group, attempt, expected, observed, verdict string) {
	b.t.Helper()
	b.rows = append(b.rows, row{group, attempt, expected, oneLine(b.stable(observed)), verdict})
	if verdict == failed {
		b.t.Errorf("ESCAPE ATTEMPT NOT CONTAINED: %s / %s: expected %s, observed %s", group, attempt, expected, observed)
	}
}

// Run-specific details that would make every regenerated table differ.
var (
	pipeInode = regexp.MustCompile(`(pipe|socket):\[[0-9]+\]`)
	sandboxID = regexp.MustCompile(`sc-[0-9a-f]{16}`)
	ddSpeed   = regexp.MustCompile(`copied, [0-9.]+ s, [0-9.]+ [GMk]B/s`)
)

func (b *battery) stable(s string) string {
	s = strings.ReplaceAll(s, b.h.base, "$HARNESS")
	s = pipeInode.ReplaceAllString(s, "$1:[…]")
	s = sandboxID.ReplaceAllString(s, "sc-…")
	return ddSpeed.ReplaceAllString(s, "copied")
}

// judge turns a condition into a verdict.
func judge(ok bool) string {
	if ok {
		return contained
	}
	return failed
}

// gapOr is the verdict for something only per-sandbox limits contain:
// contained when it already holds, a gap until the limits are wired, and a
// failure once they are said to be.
func gapOr(ok bool) string {
	switch {
	case ok:
		return contained
	case *limitsWired:
		return failed
	}
	return gap
}

func oneLine(s string) string {
	s = strings.TrimSpace(s)
	s = strings.ReplaceAll(s, "\r", "")
	s = strings.ReplaceAll(s, "\n", " ⏎ ")
	s = strings.ReplaceAll(s, "|", "\\|")
	if len(s) > 240 {
		s = s[:240] + " …"
	}
	return s
}

func TestBattery(t *testing.T) {
	h := startHarness(t)
	b := &battery{t: t, h: h}
	b.record("harness", "bounds around the daemon", "verified before any attempt", h.bounds, info)

	groups := []struct {
		name string
		fn   func(*battery)
	}{
		{"host files", hostFiles},
		{"processes", processes},
		{"network", network},
		{"privileges", privileges},
		{"confuse the daemon", confuseDaemon},
		{"third-party eyes", thirdParty},
		{"exhaustion", exhaustion}, // last: each in its own sandbox
	}
	for _, g := range groups {
		t.Run(strings.ReplaceAll(g.name, " ", "_"), func(t *testing.T) {
			b.t = t
			g.fn(b)
			if err := h.healthy(); err != nil {
				b.record(g.name, "daemon healthy afterwards", "health ok, a fresh sandbox runs `echo`", err.Error(), failed)
				t.Fatalf("%v\n%s", err, tail(h.Logs(), 4000))
			}
		})
	}
	b.t = t
	b.record("daemon", "healthy after the whole battery", "health ok, a fresh sandbox runs `echo`", "ok", judge(h.healthy() == nil))

	if *updateDoc {
		require.NoError(t, writeTable(b.rows))
	}
	for _, r := range b.rows {
		t.Logf("%-20s | %-45s | %-8s | %s", r.Group, r.Attempt, r.Verdict, r.Observed)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// ---- host files -------------------------------------------------------

func hostFiles(b *battery) {
	h, t := b.h, b.t
	const g = "host files"
	id := h.create()
	defer h.destroy(id)

	r := h.run(id, "cat /etc/shadow 2>&1; echo rc=$?", 30)
	b.record(g, "read /etc/shadow", "absent", r.out(), judge(strings.Contains(r.out(), "No such file") && !strings.Contains(r.out(), "root:")))

	r = h.run(id, "ls -a /root /home 2>&1; echo rc=$?", 30)
	b.record(g, "list /root and /home", "absent", r.out(), judge(strings.Count(r.out(), "No such file") == 2))

	// Another sandbox's workspace: by content and by its host path.
	other := h.create()
	defer h.destroy(other)
	secret := "secret-" + token()
	require.NoError(t, h.call(ipc.OpWriteFile, map[string]any{"sandbox": other, "path": secret, "data": []byte(secret)}, nil))
	hostPath := filepath.Join(h.stateDir, "bwrap", other, "work", secret)
	// The daemon's view of the host: with disk caps the sandbox's files
	// are on its own filesystem, mounted in the daemon's mount namespace.
	daemonView := fmt.Sprintf("/proc/%d/root", h.cmd.Process.Pid)
	if _, err := os.Stat(daemonView + filepath.Join(h.stateDir, "bwrap", other, "vol")); err == nil {
		hostPath = filepath.Join(h.stateDir, "bwrap", other, "vol", "work", secret)
	}
	_, err := os.Stat(daemonView + hostPath)
	require.NoError(t, err, "the secret exists on the host at %s (as the daemon sees it)", hostPath)
	r = h.run(id, fmt.Sprintf("cat %s >/dev/null 2>&1 && echo READ-OTHER; find / -xdev -name %s 2>/dev/null; grep -rl %s /tmp /workspace 2>/dev/null; echo done", hostPath, secret, secret), 60)
	b.record(g, "read another sandbox's workspace (by its host path, find, grep)", "not visible", r.out(), judge(r.out() == "done"))

	r = h.run(id, fmt.Sprintf("ls -la %s %s 2>&1; test -S %s && echo SOCKET-VISIBLE; cat %s/journal.db 2>&1 | head -c 100", h.stateDir, filepath.Dir(h.socket), h.socket, h.stateDir), 30)
	b.record(g, "daemon state directory, journal and socket", "absent", r.out(), judge(!strings.Contains(r.out(), "SOCKET-VISIBLE") && strings.Count(r.out(), "No such file") >= 3))

	r = h.run(id, "tr '\\0' '\\n' < /proc/1/environ 2>&1; echo; cat /proc/1/cmdline | tr '\\0' ' '", 30)
	leak := strings.Contains(r.out(), "SANDBOX_SIDECAR") || strings.Contains(r.out(), h.stateDir)
	b.record(g, "/proc/1/environ (the sandbox's pid 1)", "nothing of the daemon's environment or paths", r.out(),
		map[bool]string{true: gap, false: contained}[leak])

	daemonPID := h.cmd.Process.Pid
	r = h.run(id, fmt.Sprintf("ls /proc/%d/ 2>&1 | head -2; cat /proc/%d/environ 2>&1 | head -c 200; ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '", daemonPID, daemonPID), 30)
	b.record(g, "/proc/<daemon pid>/ (host pid of the daemon)", "no such process in the sandbox's PID namespace", r.out(),
		judge(strings.Contains(r.out(), "No such file") && !strings.Contains(r.out(), "SANDBOX")))

	// Writes outside the workspace.
	probe := "escape-" + token()
	r = h.run(id, fmt.Sprintf(`for p in /usr/bin/%[1]s /etc/%[1]s /etc/passwd /%[1]s /proc/sys/kernel/%[1]s; do (echo x > $p) 2>&1 | tail -1; done; echo done`, probe), 30)
	hostHit := fileExists("/usr/bin/"+probe) || fileExists("/etc/"+probe) || fileExists("/"+probe)
	b.record(g, "write /usr, /etc, /, /proc/sys", "read-only or private to the sandbox; nothing on the host", r.out(), judge(!hostHit))

	// Symlinks planted in the workspace, then used through the file ops.
	shadowBefore := fileHash("/etc/shadow")
	h.run(id, "ln -s /etc/shadow abs; ln -s ../../../../../../../../etc/shadow rel; ln -s / rootlink; ln -s /dev/zero zero; mkdir d; ln -s ../.. d/up", 30)
	// Reads resolve inside the sandbox, as the guest's kernel does: the
	// links lead to the sandbox's own /etc, which has no shadow file.
	hostShadow, _ := os.ReadFile("/etc/shadow")
	var codes []string
	shadowRead := false
	for _, p := range []string{"abs", "rel", "rootlink/etc/shadow", "d/up/etc/shadow", "/workspace/abs", "/tmp/../etc/shadow"} {
		var res api.ReadFileResult
		code := h.fileErr(ipc.OpReadFile, map[string]any{"sandbox": id, "path": p}, &res)
		if code == "" && len(hostShadow) > 0 && bytes.Contains(res.Data, hostShadow[:min(len(hostShadow), 16)]) {
			shadowRead = true
		}
		codes = append(codes, p+"→"+orOK(code))
	}
	allUnseen := strings.Count(strings.Join(codes, " "), "→path_not_found") == len(codes)
	b.record(g, "read_file through planted symlinks (absolute, relative, dir, `..`)", "resolved inside the sandbox: path_not_found for every one (its /etc has no shadow), never the host's file", strings.Join(codes, " "), judge(allUnseen && !shadowRead))

	codes = codes[:0]
	for _, p := range []string{"abs", "rootlink/tmp/" + probe, "d/up/" + probe} {
		codes = append(codes, p+"→"+orOK(h.fileErr(ipc.OpWriteFile, map[string]any{"sandbox": id, "path": p, "data": []byte("pwned")}, nil)))
	}
	r = h.run(id, "ls -l abs | cut -c1", 30)
	untouched := fileHash("/etc/shadow") == shadowBefore && !fileExists("/tmp/"+probe) && !fileExists(filepath.Dir(h.stateDir)+"/"+probe)
	b.record(g, "write_file through planted symlinks", "the symlink itself is replaced (never written through) or bad_path; host untouched",
		strings.Join(codes, " ")+"; abs is now type "+r.out(), judge(untouched && r.out() == "-"))

	// Hard links: the guest cannot link host files in (different mounts),
	// and write_file replaces rather than writes through.
	r = h.run(id, "ln /etc/passwd hl 2>&1; ln /usr/bin/su su2 2>&1; echo orig > a; ln a b; echo done", 30)
	require.NoError(t, h.call(ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "b", "data": []byte("new")}, nil))
	var rf api.ReadFileResult
	require.NoError(t, h.call(ipc.OpReadFile, map[string]any{"sandbox": id, "path": "a"}, &rf))
	b.record(g, "hard links to host files; write_file on a hard-linked name", "EXDEV for host files; the other name keeps its content",
		r.out()+"; a="+strings.TrimSpace(string(rf.Data)), judge(strings.TrimSpace(string(rf.Data)) == "orig" && strings.Count(r.out(), "Invalid cross-device link") == 2))

	// TOCTOU: the guest swaps a name between a file and a symlink to
	// /etc/shadow while the daemon reads it.
	shadow, _ := os.ReadFile("/etc/shadow")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		h.run(id, `end=$(($(date +%s)+4)); while [ $(date +%s) -lt $end ]; do ln -sfn /etc/shadow race; echo benign > race.tmp; mv -f race.tmp race; done`, 20)
	}()
	leaked, reads, okReads, refused := false, 0, 0, 0
	deadline := time.Now().Add(4 * time.Second)
	read := func() string {
		var res api.ReadFileResult
		code := h.fileErr(ipc.OpReadFile, map[string]any{"sandbox": id, "path": "race"}, &res)
		if code == "" && len(shadow) > 0 && bytes.Contains(res.Data, shadow[:min(len(shadow), 16)]) {
			leaked = true
		}
		return code
	}
	// Until the swapping has begun (the name exists).
	for time.Now().Before(deadline) && read() == "path_not_found" {
		time.Sleep(10 * time.Millisecond)
	}
	// At least 400 reads, and on until both outcomes have been seen (a
	// loaded host can let a burst of reads land within one phase of the
	// swap loop); the guest's loop and this deadline bound it.
	for time.Now().Before(deadline) && (reads < 400 || okReads == 0 || refused == 0) {
		switch read() {
		case "":
			okReads++
		case "path_not_found": // the symlink, resolved in the sandbox
			refused++
		}
		reads++
	}
	wg.Wait()
	// Both outcomes seen: the reads really raced the swap.
	b.record(g, "TOCTOU: swap a file for a symlink to /etc/shadow during read_file", "never the host file; the race observed both ways",
		fmt.Sprintf("%d reads while swapping: %d the benign file, %d path_not_found (the symlink, resolved in the sandbox); host file leaked=%v", reads, okReads, refused, leaked),
		judge(!leaked && okReads > 0 && refused > 0))
}

func orOK(code string) string {
	if code == "" {
		return "ok"
	}
	return code
}

func fileExists(p string) bool { _, err := os.Lstat(p); return err == nil }

func fileHash(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return "unreadable"
	}
	return fmt.Sprintf("%x", len(b)) + string(b[:min(len(b), 64)])
}

// ---- processes ----------------------------------------------------------

func processes(b *battery) {
	h := b.h
	const g = "processes"
	// A host process of uid 65534 (nobody), which sandboxes used to share.
	sentinel := exec.Command("/bin/sleep", "600")
	sentinel.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}, Pdeathsig: syscall.SIGKILL}
	require.NoError(b.t, sentinel.Start())
	defer func() { sentinel.Process.Kill(); sentinel.Wait() }()

	id := h.create()
	defer h.destroy(id)
	r := h.run(id, "ls /proc | grep -cE '^[0-9]+$'; ps -e -o pid=,comm= | tr '\\n' ';'", 30)
	b.record(g, "/proc listing and ps -e", "only the sandbox's own processes", r.out(),
		judge(!strings.Contains(r.out(), "sandbox-sidecar") && !strings.Contains(r.out(), "sleep")))

	r = h.run(id, "kill -9 -1; echo survived-kill", 30)
	alive := sentinel.ProcessState == nil && syscall.Kill(sentinel.Process.Pid, 0) == nil
	b.record(g, "kill -9 -1 (a host process of uid 65534 running)", "kills only the sandbox; the host process and the daemon live",
		fmt.Sprintf("exit %d; host process alive=%v; daemon alive=%v", r.ExitCode, alive, h.running()), judge(alive && h.running()))

	r = h.run(id, fmt.Sprintf("kill -9 %d 2>&1; kill -0 %d 2>&1; echo rc=$?", h.cmd.Process.Pid, sentinel.Process.Pid), 30)
	b.record(g, "signal the daemon's and a host process's pid", "no such process", r.out(), judge(strings.Contains(r.out(), "No such process") && h.running()))

	// From the host: a process of uid 65534 (nobody, which every sandbox
	// ran as before each got a uid of its own) against two live sandboxes.
	other := h.create()
	defer h.destroy(other)
	var inits []int
	for _, sb := range []string{id, other} {
		token := fmt.Sprintf("uid-probe-%s-%d", sb, time.Now().UnixNano())
		h.run(sb, "echo "+token+" > /workspace/uid-probe", 30)
		inits = append(inits, initWithWorkspaceFile(token))
	}
	uids := []int{hostUID(inits[0]), hostUID(inits[1])}
	b.record(g, "host uids of two live sandboxes' inits", "distinct, neither 65534 nor the daemon's", fmt.Sprint(uids),
		judge(inits[0] > 0 && inits[1] > 0 && uids[0] != uids[1] && uids[0] > 0 && uids[1] > 0 && uids[0] != 65534 && uids[1] != 65534))
	if inits[0] > 0 {
		got := attackAsNobody(inits[0])
		b.record(g, "uid 65534 on the host reads /proc/<init>/root/workspace", "permission denied", got["read"], judge(got["read"] == "Permission denied"))
		b.record(g, "uid 65534 on the host: PTRACE_ATTACH to the sandbox's init", "operation not permitted", got["ptrace"], judge(got["ptrace"] == "Operation not permitted"))
		r = h.run(id, "echo alive", 30)
		b.record(g, "uid 65534 on the host: SIGKILL the sandbox's init", "operation not permitted; the sandbox lives", got["kill"]+"; then "+r.out(),
			judge(got["kill"] == "Operation not permitted" && r.out() == "alive" && !r.SandboxTerminated))
	}
}

// initWithWorkspaceFile is the pid of the sandbox init whose workspace
// holds a file uid-probe with token in it (0: none).
func initWithWorkspaceFile(token string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || strings.TrimSpace(string(comm)) != "sandbox-init" {
			continue
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/workspace/uid-probe", pid)); err == nil && strings.TrimSpace(string(b)) == token {
			return pid
		}
	}
	return 0
}

// hostUID is pid's real uid on the host (-1: unknown).
func hostUID(pid int) int {
	fi, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	if err != nil || pid <= 0 {
		return -1
	}
	return int(fi.Sys().(*syscall.Stat_t).Uid)
}

// attackAsNobody runs, as host uid 65534, a read of pid's workspace, a
// PTRACE_ATTACH to pid and a SIGKILL of it; it returns what each did ("ok"
// or the error).
func attackAsNobody(pid int) map[string]string {
	script := fmt.Sprintf(`
import ctypes, json, os
pid = %d
out = {}
try:
    open("/proc/%%d/root/workspace/uid-probe" %% pid).read()
    out["read"] = "ok"
except OSError as e:
    out["read"] = e.strerror
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
if libc.ptrace(16, pid, None, None) == 0:
    out["ptrace"] = "ok"
    libc.ptrace(17, pid, None, None)
else:
    out["ptrace"] = os.strerror(ctypes.get_errno())
try:
    os.kill(pid, 9)
    out["kill"] = "ok"
except OSError as e:
    out["kill"] = e.strerror
print(json.dumps(out))
`, pid)
	cmd := exec.Command("/usr/bin/python3", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	got := map[string]string{}
	if err != nil || json.Unmarshal(out, &got) != nil {
		msg := fmt.Sprintf("probe failed: %v %s", err, out)
		return map[string]string{"read": msg, "ptrace": msg, "kill": msg}
	}
	return got
}

// ---- network ------------------------------------------------------------

func network(b *battery) {
	h, t := b.h, b.t
	const g = "network"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	abstract := "@sidecar-escape-" + token()
	uln, err := net.Listen("unix", abstract)
	require.NoError(t, err)
	defer uln.Close()

	id := h.create()
	defer h.destroy(id)
	py := func(code string) execResult { return h.run(id, "/usr/bin/python3 -c '"+code+"' 2>&1", 30) }

	r := py(fmt.Sprintf(`import socket
s = socket.socket(); s.settimeout(2)
try: s.connect(("127.0.0.1", %d)); print("CONNECTED")
except OSError as e: print(type(e).__name__, e.errno)`, port))
	got := false
	select {
	case <-accepted:
		got = true
	case <-time.After(200 * time.Millisecond):
	}
	b.record(g, "connect to a host service on 127.0.0.1", "refused (the sandbox's loopback is its own)", r.out(), judge(!got && !strings.Contains(r.out(), "CONNECTED")))

	r = py(fmt.Sprintf(`import socket
s = socket.socket(socket.AF_UNIX); s.settimeout(2)
try: s.connect("\0%s"); print("CONNECTED")
except OSError as e: print(type(e).__name__, e.errno)`, strings.TrimPrefix(abstract, "@")))
	b.record(g, "connect to a host abstract Unix socket", "not found (abstract sockets belong to the network namespace)", r.out(), judge(!strings.Contains(r.out(), "CONNECTED")))

	// Only if the sandbox has no route at all does the next attempt run: it
	// then cannot send a packet anywhere.
	r = h.run(id, "cat /proc/net/route | tail -n +2 | wc -l; cat /proc/net/ipv6_route 2>/dev/null | grep -v ' lo$' | wc -l; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", 30)
	noRoutes := strings.HasPrefix(r.out(), "0\n0\n")
	b.record(g, "routes and interfaces", "loopback only, no route", r.out(), judge(noRoutes && strings.HasSuffix(r.out(), "lo")))
	if noRoutes {
		r = py(`import socket
s = socket.socket(); s.settimeout(1)
try: s.connect(("192.0.2.1", 9)); print("CONNECTED")
except OSError as e: print(type(e).__name__, e.errno, e.strerror)`)
		b.record(g, "connect to another address (TEST-NET-1, with no route)", "network unreachable", r.out(), judge(strings.Contains(r.out(), "unreachable")))
	}

	r = h.run(id, "getent hosts example.com; echo rc=$?; cat /etc/resolv.conf 2>&1", 30)
	b.record(g, "DNS", "no resolver, no answer", r.out(), judge(strings.HasPrefix(r.out(), "rc=2")))

	r = py(`import socket
for fam, kind, proto in ((socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP), (socket.AF_PACKET, socket.SOCK_RAW, 0), (socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)):
    try: socket.socket(fam, kind, proto); print("OPENED", fam, kind)
    except OSError as e: print(e.strerror)`)
	rawOpened := strings.Contains(r.out(), "OPENED AddressFamily.AF_INET SocketKind.SOCK_RAW") || strings.Contains(r.out(), "OPENED AddressFamily.AF_PACKET")
	b.record(g, "raw and packet sockets (and an ICMP datagram socket)", "raw/packet: refused", r.out(), judge(!rawOpened))

	// vsock is not namespaced: a guest that could open one would bind
	// ports in the host's vsock space (and on a VM reach the hypervisor's).
	r = py(`import socket
try:
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM); s.bind((socket.VMADDR_CID_ANY, 5000)); s.listen(); print("BOUND", s.getsockname())
except OSError as e: print(type(e).__name__, e.errno, e.strerror)`)
	b.record(g, "bind an AF_VSOCK port (the host's vsock space)", "address family not supported (the seccomp filter)", r.out(),
		judge(!strings.Contains(r.out(), "BOUND") && strings.Contains(r.out(), "not supported")))
}

// ---- privileges ---------------------------------------------------------

// probeScript calls system calls through libc and prints errno names as
// JSON: what reaches the kernel and what a filter stops. Arguments are
// chosen to do nothing when allowed (bad pointers, no such pid, invalid
// commands). unshare runs last: it changes the prober's namespaces.
const probeScript = `import ctypes, errno, json
libc = ctypes.CDLL(None, use_errno=True)
def sc(nr, *a):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(x) for x in a])
    return "allowed" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
tmpfs = ctypes.c_char_p(b"tmpfs"); tgt = ctypes.c_char_p(b"/tmp")
res = {}
res["keyctl"] = sc(250, 0, -3, 0)
res["add_key"] = sc(248, 0, 0, 0, 0, 0)
res["bpf"] = sc(321, 0, 0, 0)
res["perf_event_open"] = sc(298, 0, 0, -1, -1, 0)
res["userfaultfd"] = sc(323, 0)
res["io_uring_setup"] = sc(425, 0, 0)
res["init_module"] = sc(175, 0, 0, 0)
res["finit_module"] = sc(313, -1, 0, 0)
res["kexec_load"] = sc(246, 0, 0, 0, 0)
res["open_by_handle_at"] = sc(304, -1, 0, 0)
res["ptrace"] = sc(101, 3, 99999, 0, 0)
res["personality"] = sc(135, 0x0400000)
res["setns"] = sc(308, -1, 0)
res["clone3"] = sc(435, 0, 0)
res["modify_ldt"] = sc(154, 0, 0, 0)
res["memfd_secret"] = sc(447, 0)
res["socket(AF_VSOCK)"] = sc(41, 40, 1, 0)
res["socket(AF_ALG)"] = sc(41, 38, 5, 0)
res["socketpair(AF_VSOCK)"] = sc(53, 40, 1, 0, 0)
res["mount"] = libc.mount(tmpfs, tgt, tmpfs, 0, None) == 0 and "allowed" or errno.errorcode[ctypes.get_errno()]
res["unshare(CLONE_NEWUSER)"] = sc(272, 0x10000000)
print(json.dumps(res))
`

func privileges(b *battery) {
	h, t := b.h, b.t
	const g = "privileges"
	id := h.create()
	defer h.destroy(id)

	r := h.run(id, "ls -l /usr/bin/su | cut -c1-10; su -c id root </dev/null 2>&1 | tail -1; /usr/bin/mount -t tmpfs none /tmp 2>&1 | tail -1; id", 30)
	b.record(g, "setuid binaries (su, mount)", "setuid bit ignored: no root", r.out(),
		judge(!strings.Contains(r.out(), "uid=0(") && strings.Contains(r.out(), "uid=1000")))

	r = h.run(id, "grep -E '^(NoNewPrivs|CapEff|CapBnd|CapPrm):' /proc/self/status | tr '\\n' ' '; grep ' /usr ' /proc/self/mountinfo | grep -o 'nosuid' | head -1", 30)
	b.record(g, "capabilities and no_new_privs", "no capabilities; no_new_privs set", r.out(),
		judge(strings.Contains(r.out(), "CapEff:\t0000000000000000") && strings.Contains(r.out(), "NoNewPrivs:\t1")))

	if runtime.GOARCH == "amd64" {
		require.NoError(t, h.call(ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "probe.py", "data": []byte(probeScript)}, nil))
		r = h.run(id, "/usr/bin/python3 probe.py", 30)
		var res map[string]string
		if err := json.Unmarshal(r.Stdout, &res); err != nil {
			b.record(g, "system call probe", "JSON", string(r.Stdout)+string(r.Stderr), failed)
		} else {
			for _, name := range []string{"keyctl", "add_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "init_module", "finit_module",
				"kexec_load", "open_by_handle_at", "ptrace", "personality", "setns", "clone3", "mount", "unshare(CLONE_NEWUSER)",
				"modify_ldt", "memfd_secret", "socket(AF_VSOCK)", "socket(AF_ALG)", "socketpair(AF_VSOCK)"} {
				want := "EPERM"
				switch {
				case name == "clone3":
					want = "ENOSYS"
				case strings.HasPrefix(name, "socket"):
					want = "EAFNOSUPPORT"
				}
				got := res[name]
				obs := got
				if got != want {
					obs += " (reached the kernel)"
				}
				b.record(g, "syscall "+name, want+" from the seccomp filter", obs, gapOr(got == want))
			}
		}
	}

	r = h.run(id, "unshare -Urm sh -c 'mount -t tmpfs none /tmp && echo MOUNTED-IN-NESTED-USERNS; id -u' 2>&1; echo rc=$?", 30)
	b.record(g, "nested user namespace, then mount a filesystem", "denied (unshare fails)", r.out(), gapOr(!strings.Contains(r.out(), "MOUNTED")))

	r = h.run(id, "strace -f -e trace=none true 2>&1 | tail -1; echo rc=$?", 30)
	b.record(g, "ptrace a process of the sandbox (strace)", "denied by the filter; nothing outside is visible anyway", r.out(),
		gapOr(!strings.Contains(r.out(), "+++ exited with 0 +++") && !strings.HasPrefix(r.out(), "rc=0")))

	r = h.run(id, "ls /sys/module 2>&1 | head -1 >/dev/null; /usr/sbin/insmod /nonexistent.ko 2>&1 | tail -1; modprobe dummy 2>&1 | tail -1; echo rc=$?", 30)
	b.record(g, "load a kernel module (insmod, modprobe)", "denied", r.out(), judge(!strings.Contains(strings.ToLower(r.out()), "inserted")))
}

// ---- confuse the daemon ------------------------------------------------

func confuseDaemon(b *battery) {
	h, t := b.h, b.t
	const g = "confuse the daemon"
	id := h.create()
	defer h.destroy(id)
	fe := func(op string, args map[string]any) string {
		args["sandbox"] = id
		return orOK(h.fileErr(op, args, nil))
	}

	nl := fe(ipc.OpWriteFile, map[string]any{"path": "new\nline", "data": []byte("x")})
	var ls struct {
		Entries []map[string]any `msgpack:"entries"`
	}
	require.NoError(t, h.call(ipc.OpListDirectory, map[string]any{"sandbox": id, "path": "."}, &ls))
	listed := false
	for _, e := range ls.Entries {
		if fmt.Sprint(e["name"]) == "new\nline" {
			listed = true
		}
	}
	b.record(g, "filename with a newline", "written and listed as one name", "write "+nl+fmt.Sprintf(", listed=%v", listed), judge(nl == "ok" && listed))

	// Reads of `..` and outside paths read the sandbox's own /etc/passwd;
	// writes there are refused.
	hostPasswd, _ := os.ReadFile("/etc/passwd")
	guestRead := func(p string) string {
		var res api.ReadFileResult
		code := h.fileErr(ipc.OpReadFile, map[string]any{"sandbox": id, "path": p}, &res)
		switch {
		case code != "":
			return code
		case bytes.Equal(res.Data, hostPasswd):
			return "HOST-FILE"
		case bytes.Contains(res.Data, []byte("sandbox:x:1000:")):
			return "sandbox's"
		}
		return "other"
	}
	out := []string{
		"NUL→" + fe(ipc.OpWriteFile, map[string]any{"path": "a\x00b", "data": []byte("x")}),
		"read ../→" + guestRead("../../../../etc/passwd"),
		"read /workspace/..→" + guestRead("/workspace/../etc/passwd"),
		"read /etc→" + guestRead("/etc/passwd"),
		"write ../→" + fe(ipc.OpWriteFile, map[string]any{"path": "../../../../etc/passwd", "data": []byte("x")}),
		"write /etc→" + fe(ipc.OpWriteFile, map[string]any{"path": "/etc/passwd", "data": []byte("x")}),
		"empty→" + fe(ipc.OpReadFile, map[string]any{"path": ""}),
		"non-UTF-8→" + fe(ipc.OpWriteFile, map[string]any{"path": []byte{'x', 0xff, 0xfe}, "data": []byte("x")}),
	}
	s := strings.Join(out, " ")
	b.record(g, "paths with NUL, `..`, outside, empty, non-UTF-8", "reads of `..` and outside: the sandbox's own file; writes there and NUL: bad_path; empty: bad_request; non-UTF-8 bytes are a valid name", s,
		judge(strings.Count(s, "→sandbox's") == 3 && strings.Count(s, "bad_path") == 3 && strings.Contains(s, "empty→bad_request") && strings.HasSuffix(s, "non-UTF-8→ok")))

	long := strings.Repeat("d/", 2040) + "f"                             // 4081 bytes: within the 4096 allowed
	longer := strings.Repeat("x", 300) + "/" + strings.Repeat("y", 4000) // component > NAME_MAX, total > 4096
	s = "4 KiB deep→" + fe(ipc.OpWriteFile, map[string]any{"path": long, "data": []byte("x")}) +
		" 4.3 KiB→" + fe(ipc.OpWriteFile, map[string]any{"path": longer, "data": []byte("x")}) +
		" 255+ component→" + fe(ipc.OpWriteFile, map[string]any{"path": strings.Repeat("z", 300), "data": []byte("x")})
	b.record(g, "4 KiB paths, over-long components", "an error (bad_path) or success, never a hang or a crash", s, judge(h.running()))

	h.run(id, "mkfifo fifo; ln -s /dev/zero zero; ln -s /proc/self/mem mem; mkdir dir; ln -s fifo fifolink", 30)
	start := time.Now()
	s = "fifo→" + fe(ipc.OpReadFile, map[string]any{"path": "fifo"}) +
		" fifolink→" + fe(ipc.OpReadFile, map[string]any{"path": "fifolink"}) +
		" /dev/zero link→" + fe(ipc.OpReadFile, map[string]any{"path": "zero"}) +
		" /proc/self/mem link→" + fe(ipc.OpReadFile, map[string]any{"path": "mem"}) +
		" dir→" + fe(ipc.OpReadFile, map[string]any{"path": "dir"}) +
		" write dir→" + fe(ipc.OpWriteFile, map[string]any{"path": "dir", "data": []byte("x")})
	took := time.Since(start)
	b.record(g, "read_file of a FIFO, /dev/zero and /proc/self/mem symlinks, a directory", "at once: refused (bad_path, is_a_directory) or bounded (/dev/zero: file_too_large)",
		s+fmt.Sprintf(" (all in %s)", took.Round(100*time.Millisecond)),
		judge(took < 10*time.Second && !strings.Contains(s, "→ok") && strings.Contains(s, "/dev/zero link→file_too_large") && strings.Count(s, "is_a_directory") == 2))

	// read_file opens a path as the guest: /proc/self is a process of the
	// guest's identity and confinement (the opener), never init, whose
	// descriptors (the control socket) stay closed.
	var st api.ReadFileResult
	stCode := h.fileErr(ipc.OpReadFile, map[string]any{"sandbox": id, "path": "/proc/self/status"}, &st)
	var fields []string
	for _, line := range strings.Split(string(st.Data), "\n") {
		for _, k := range []string{"Pid:", "Uid:", "CapEff:", "NoNewPrivs:", "Seccomp:"} {
			if strings.HasPrefix(line, k) {
				fields = append(fields, strings.Join(strings.Fields(line), " "))
			}
		}
	}
	initFDs := fe(ipc.OpListDirectory, map[string]any{"path": "/proc/1/fd"})
	s = strings.Join(fields, "; ") + "; list /proc/1/fd→" + initFDs
	b.record(g, "read_file /proc/self/status, list /proc/1/fd", "the reader is a process of the guest's identity (uid 1000, no capabilities, no_new_privs, the seccomp filter), not pid 1; init's descriptors refused", orOK(stCode)+": "+s,
		judge(stCode == "" && strings.Contains(s, "Uid: 1000 1000 1000 1000") && strings.Contains(s, "CapEff: 0000000000000000") &&
			strings.Contains(s, "NoNewPrivs: 1") && strings.Contains(s, "Seccomp: 2") && !strings.Contains(s, "Pid: 1;") && initFDs == "bad_path"))

	big := fe(ipc.OpReadFile, map[string]any{"path": "big", "max_bytes": 10})
	h.run(id, "head -c 1000 /dev/zero > big", 30)
	big = fe(ipc.OpReadFile, map[string]any{"path": "big", "max_bytes": 10})
	b.record(g, "read a file larger than max_bytes", "file_too_large, nothing transferred", big, judge(big == "file_too_large"))
}

// ---- third-party eyes --------------------------------------------------

func thirdParty(b *battery) {
	h := b.h
	const g = "third-party eyes"
	id := h.create()
	defer h.destroy(id)
	tools := []struct{ name, cmd, want string }{
		{"capsh --print", "/usr/sbin/capsh --print 2>&1 | grep -E '^(Current: |Bounding set|Securebits|uid|gid|groups)' | tr '\\n' ';'", "Current: ="},
		{"/proc/self/status", "grep -E '^(Seccomp|Seccomp_filters|NoNewPrivs|CapEff|CapPrm|CapBnd|CapAmb):' /proc/self/status | tr '\\n' ' '", "CapEff:\t0000000000000000"},
		{"findmnt", "findmnt -rn -o TARGET,FSTYPE,OPTIONS | awk '{split($3,o,\",\"); printf \"%s %s %s; \", $1, $2, o[1]}'", "/workspace"},
		{"ip link", "ip -br link 2>&1 | tr '\\n' ';'", "lo"},
		{"ps -e", "ps -e -o pid=,user=,comm= | tr '\\n' ';'", "ps"},
		{"ls -l /proc/self/fd", "ls -l /proc/self/fd | tail -n +2 | awk '{print $9, $10, $11}' | tr '\\n' ';'", "0 -> "},
		{"id; hostname; uname -r", "id; hostname; uname -r", "uid=1000"},
	}
	for _, tl := range tools {
		r := h.run(id, tl.cmd, 30)
		verdict := info
		if !strings.Contains(r.out(), tl.want) {
			verdict = failed
		}
		if strings.Contains(r.out(), "not found") {
			verdict = failed
		}
		b.record(g, tl.name, "recorded", r.out(), verdict)
	}
	// Descriptors: only 0, 1, 2 (and the listing's own).
	r := h.run(id, "ls /proc/self/fd | tr '\\n' ' '", 30)
	b.record(g, "descriptors inherited from the daemon", "only 0, 1, 2 (3 is ls's own directory)", r.out(), judge(r.out() == "0 1 2 3"))
}

// ---- exhaustion --------------------------------------------------------

func exhaustion(b *battery) {
	h := b.h
	const g = "exhaustion"
	fresh := func(fn func(id string)) {
		id := h.create()
		defer h.destroy(id)
		fn(id)
	}

	fresh(func(id string) {
		r := h.run(id, "yes", 3, "max_output_bytes", 65536)
		b.record(g, "infinite output (yes)", "stopped at the timeout; output capped", fmt.Sprintf("timed_out=%v stdout=%d bytes truncated=%v", r.TimedOut, len(r.Stdout), r.StdoutTruncated),
			judge(r.TimedOut && len(r.Stdout) <= 65536 && r.StdoutTruncated))
	})
	fresh(func(id string) {
		r := h.run(id, "seq 1000000", 60, "max_output_bytes", 65536)
		lines := strings.Split(strings.TrimSpace(string(r.Stdout)), "\n")
		b.record(g, "a million-line stdout", "the tail kept, truncated flagged", fmt.Sprintf("exit %d, %d bytes, last line %q, truncated=%v", r.ExitCode, len(r.Stdout), lines[len(lines)-1], r.StdoutTruncated),
			judge(r.ExitCode == 0 && lines[len(lines)-1] == "1000000" && r.StdoutTruncated && len(r.Stdout) <= 65536))
	})
	fresh(func(id string) {
		start := time.Now()
		r := h.run(id, "exec >&- 2>&-; sleep 60", 2)
		took := time.Since(start)
		b.record(g, "close stdout and keep running", "stopped at the timeout", fmt.Sprintf("timed_out=%v after %s", r.TimedOut, took.Round(time.Second)), judge(r.TimedOut && took < 15*time.Second))
		start = time.Now()
		r = h.run(id, "(sleep 60 &); echo started", 10)
		took = time.Since(start)
		b.record(g, "leave a background process holding the pipes", "answered at once; the process dies with the command", fmt.Sprintf("exit %d %q after %s", r.ExitCode, r.out(), took.Round(100*time.Millisecond)),
			judge(r.ExitCode == 0 && took < 5*time.Second))
	})
	fresh(func(id string) {
		r := h.run(id, `/usr/bin/python3 -c '
import os, time
n = 0
for _ in range(200):
    if os.fork() == 0: os._exit(0)
    n += 1
time.sleep(0.5)
print(n, "zombies", sum(1 for p in os.listdir("/proc") if p.isdigit() and open("/proc/%s/stat" % p).read().split(") ")[1].startswith("Z")))'`, 30)
		b.record(g, "a zombie army (200 unreaped children)", "reaped when the command ends", r.out()+fmt.Sprintf("; exit %d", r.ExitCode), judge(r.ExitCode == 0))
	})
	fresh(func(id string) {
		r := h.run(id, `/usr/bin/python3 -c '
import os
os.mkdir("many")
n = 0
try:
    for i in range(100000):
        open("many/%d" % i, "w").close(); n += 1
except OSError as e: print(e.strerror)
print(n)'`, 120)
		code := orOK(h.fileErr(ipc.OpListDirectory, map[string]any{"sandbox": id, "path": "many"}, nil))
		// The sandbox's inode cap (a 256 MiB filesystem has 65536) stops
		// it short of 100k; without disk caps they are all created.
		capped := strings.Contains(r.out(), "No space left on device")
		b.record(g, "100k files", "stopped by the sandbox's inode cap (ENOSPC); list_directory refuses the listing", r.out()+"; list_directory→"+code,
			judge(code == "too_many_entries" && (capped || !*limitsWired)))
	})

	if !*exhaust {
		for _, a := range []string{"fork bomb", "memory balloon", "disk fill"} {
			b.record(g, a, "contained by per-sandbox limits", "not run (-exhaust=false)", gap)
		}
		return
	}
	fresh(func(id string) {
		before, _ := h.cg.Stats()
		start := time.Now()
		// The shell forks once, before the bomb exists ("b &"), then
		// execs: dash forks each element of "b | b" itself, so with "b;"
		// the bomb's first child could fill pids.max before the shell's
		// second fork, and the shell exited 2 ("Cannot fork") at once.
		r := h.run(id, "b() { b | b & }; b & exec sleep 8", 5)
		st, _ := h.cg.Stats()
		took := time.Since(start)
		hits := st.PIDsLimitHits - before.PIDsLimitHits
		reason := fmt.Sprintf("reason=%s exit=%d", r.Reason, r.ExitCode)
		if !r.TimedOut {
			reason += " " + r.out()
		}
		// Contained by the sandbox's own limit when the harness's, around
		// the whole daemon, was never reached.
		b.record(g, "fork bomb", "contained by the sandbox's pids limit; reported; the daemon unaffected",
			fmt.Sprintf("timed_out=%v after %s; harness pids.max hits +%d; %s", r.TimedOut, took.Round(time.Second), hits, reason),
			gapOr(hits == 0 && r.TimedOut))
	})
	fresh(func(id string) {
		before, _ := h.cg.Stats()
		r := h.run(id, `/usr/bin/python3 -c 'b = bytearray(4 << 30); print("survived")'`, 60)
		after, _ := h.cg.Stats()
		oom := r.OOMKilled
		b.record(g, "memory balloon (4 GiB)", "exit 137 with oom_killed, distinct from timed_out",
			fmt.Sprintf("exit %d timed_out=%v oom_killed=%v; harness OOM kills +%d", r.ExitCode, r.TimedOut, r.OOMKilled, after.OOMKills-before.OOMKills),
			gapOr(oom && r.ExitCode == 137 && !r.TimedOut))
		if r.ExitCode != 137 || strings.Contains(r.out(), "survived") {
			b.record(g, "memory balloon stopped at all", "killed", r.out(), failed)
		}
	})
	fresh(func(id string) {
		var st syscall.Statfs_t
		syscall.Statfs("/", &st)
		hostFreeBefore := int64(st.Bavail) * st.Bsize
		r := h.run(id, "dd if=/dev/zero of=/workspace/fill bs=1M count=2048 2>&1 | grep -v records; df -k /workspace | tail -1 | awk '{print $2\" KiB total\"}'", 120)
		syscall.Statfs("/", &st)
		hostFreeAfter := int64(st.Bavail) * st.Bsize
		enospc := strings.Contains(r.out(), "No space left on device")
		capped := !strings.Contains(r.out(), fmt.Sprintf("%d KiB total", harnessTmpfs>>10))
		b.record(g, "disk fill (2 GiB into the workspace)", "ENOSPC inside at the sandbox's cap; the host's disk untouched",
			fmt.Sprintf("%s; host free space change %+d MiB", r.out(), (hostFreeAfter-hostFreeBefore)>>20), gapOr(enospc && capped))
		if !enospc {
			b.record(g, "disk fill stopped at all", "ENOSPC", r.out(), failed)
		}
	})
}

// ---- the table in docs/security.md -------------------------------------

const (
	tableBegin = "<!-- BEGIN ESCAPE BATTERY (generated by `go test ./test/escape -run Battery -update-doc`; do not edit) -->"
	tableEnd   = "<!-- END ESCAPE BATTERY -->"
)

func writeTable(rows []row) error {
	var t strings.Builder
	counts := map[string]int{}
	for _, r := range rows {
		counts[r.Verdict]++
	}
	fmt.Fprintf(&t, "%d rows: %d contained, %d gaps, %d informational, %d failed. Limits asserted: %v.\n\n",
		len(rows), counts[contained], counts[gap], counts[info], counts[failed], *limitsWired)
	t.WriteString("| # | group | attempt | expected | observed | verdict |\n|---|---|---|---|---|---|\n")
	for i, r := range rows {
		fmt.Fprintf(&t, "| %d | %s | %s | %s | %s | %s |\n", i+1, r.Group, r.Attempt, r.Expected, r.observedCell(), r.Verdict)
	}
	return spliceSecurityDoc(tableBegin, tableEnd, t.String())
}

// observedCell is what a row observed, as a Markdown code span.
func (r row) observedCell() string { return "`" + strings.ReplaceAll(r.Observed, "`", "'") + "`" }

// spliceSecurityDoc replaces what stands between the markers begin and end
// in docs/security.md with body (the markers stay).
func spliceSecurityDoc(begin, end, body string) error {
	doc := filepath.Join("..", "..", "docs", "security.md")
	old, err := os.ReadFile(doc)
	if err != nil {
		return err
	}
	s := string(old)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %q ... %q markers", doc, begin, end)
	}
	return os.WriteFile(doc, []byte(s[:i]+begin+"\n\n"+body+"\n"+s[j:]), 0o644)
}
