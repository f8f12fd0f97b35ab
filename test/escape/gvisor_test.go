package escape

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/internal/runscpin"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// pinnedRunsc is where scripts/install-runsc.sh caches the pinned build.
const pinnedRunsc = runscpin.Path

// testRunsc finds runsc ($SANDBOX_SIDECAR_RUNSC, the pinned build, PATH):
// without one the test skips, and under CI=true fails.
func testRunsc(t *testing.T) string {
	for _, p := range []string{os.Getenv("SANDBOX_SIDECAR_RUNSC"), pinnedRunsc} {
		if p != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true: runsc is not installed (scripts/test.sh installs it)")
	}
	t.Skip("runsc is not installed; run scripts/install-runsc.sh as root")
	return ""
}

// TestGVisorBoundary runs, from a sandbox of the real daemon on the gvisor
// backend, the attempts that show the boundary: the guest's kernel is
// gVisor's, and interfaces only the host's kernel has fail inside. The
// gvisor backend loads no guest seccomp filter of ours (runsc applies
// gVisor's own filter to the sentry, on the host side), so each system
// call here reaches gVisor's kernel and the row shows what it refuses
// itself. -update-doc writes the table into docs/security.md.
func TestGVisorBoundary(t *testing.T) {
	runsc := testRunsc(t)
	h := startHarness(t, "--backend", "gvisor", "--gvisor-runsc-path", runsc)
	b := &battery{t: t, h: h}
	const g = "gvisor"
	id := h.create()
	defer h.destroy(id)

	host, err := os.ReadFile("/proc/sys/kernel/osrelease")
	require.NoError(t, err)
	r := h.run(id, "uname -r", 30)
	b.record(g, "uname -r", "gVisor's kernel, not the host's", r.out(),
		judge(r.out() != "" && r.out() != strings.TrimSpace(string(host))))
	r = h.run(id, "dmesg 2>&1 | head -1", 30)
	b.record(g, "dmesg", "gVisor's own boot messages", r.out(), judge(strings.Contains(r.out(), "gVisor")))
	r = h.run(id, "cat /proc/version", 30)
	b.record(g, "/proc/version", "not the host's", r.out(), judge(!strings.Contains(r.out(), strings.TrimSpace(string(host)))))

	for _, f := range []string{"/proc/sys/kernel/hostname", "/proc/sys/kernel/sysrq", "/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger"} {
		r = h.run(id, fmt.Sprintf("echo x > %s 2>&1; echo rc=$?", f), 30)
		b.record(g, "write "+f, "refused", r.out(), judge(!strings.HasSuffix(r.out(), "rc=0")))
	}
	hostCore, _ := os.ReadFile("/proc/sys/kernel/core_pattern")
	b.record(g, "the host's core_pattern afterwards", "unchanged", strings.TrimSpace(string(hostCore)), judge(strings.TrimSpace(string(hostCore)) != "x"))

	if runtime.GOARCH == "amd64" {
		require.NoError(t, h.call(ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "probe.py", "data": []byte(probeScript)}, nil))
		r = h.run(id, "/usr/bin/python3 probe.py", 30)
		var res map[string]string
		if err := json.Unmarshal(r.Stdout, &res); err != nil {
			b.record(g, "system call probe", "JSON", string(r.Stdout)+string(r.Stderr), failed)
		} else {
			for _, name := range []string{"keyctl", "add_key", "bpf", "perf_event_open", "io_uring_setup", "userfaultfd", "init_module", "finit_module",
				"kexec_load", "open_by_handle_at", "mount", "unshare(CLONE_NEWUSER)"} {
				got := res[name]
				switch name {
				case "keyctl", "unshare(CLONE_NEWUSER)":
					// gVisor implements session keyrings and user namespaces
					// in the sentry: the call succeeds on gVisor's objects,
					// never reaching the host's keyrings or namespaces.
					v := info
					if got == "" {
						v = failed
					}
					b.record(g, "syscall "+name, "refused, or served by gVisor's own kernel (our filter is not loaded)", got+" (gVisor's own implementation)", v)
				default:
					b.record(g, "syscall "+name, "refused by gVisor's kernel (our filter is not loaded)", got, judge(got != "" && got != "allowed"))
				}
			}
		}
	}
	r = h.run(id, "ls -d /sys/fs/bpf /sys/kernel/debug /dev/kvm /dev/mem /dev/kmsg 2>&1 | wc -l; ls -d /sys/fs/bpf /sys/kernel/debug /dev/kvm /dev/mem /dev/kmsg 2>/dev/null; echo end", 30)
	b.record(g, "host kernel interfaces (/sys/fs/bpf, /sys/kernel/debug, /dev/kvm, /dev/mem, /dev/kmsg)", "absent", r.out(), judge(r.out() == "5\nend"))

	// read_file of the sandbox's own view: served inside gVisor, as the guest.
	readCode := func(p string, max int) (string, []byte) {
		var res api.ReadFileResult
		code := h.fileErr(ipc.OpReadFile, map[string]any{"sandbox": id, "path": p, "max_bytes": max}, &res)
		return orOK(code), res.Data
	}
	vc, version := readCode("/proc/version", 1<<16)
	sc, status := readCode("/proc/self/status", 1<<16)
	shc, _ := readCode("/etc/shadow", 1<<16)
	zc, _ := readCode("/dev/zero", 1024)
	uid := ""
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "Uid:") || strings.HasPrefix(line, "Pid:") {
			uid += strings.Join(strings.Fields(line), " ") + "; "
		}
	}
	obs := fmt.Sprintf("/proc/version→%s (%s); /proc/self/status→%s (%s); /etc/shadow→%s; /dev/zero→%s", vc,
		map[bool]string{true: "gVisor's", false: "NOT gVisor's"}[strings.Contains(string(version), "gVisor") || !strings.Contains(string(version), strings.TrimSpace(string(host)))], sc, uid, shc, zc)
	b.record(g, "read_file of the sandbox's view (/proc/version, /proc/self/status, /etc/shadow, /dev/zero)", "gVisor's own files, read as the guest (uid 1000, not pid 1); no shadow file; /dev/zero bounded", obs,
		judge(vc == "ok" && !strings.Contains(string(version), strings.TrimSpace(string(host))) && sc == "ok" && strings.Contains(uid, "Uid: 1000 1000 1000 1000") &&
			!strings.Contains(uid, "Pid: 1;") && shc == "path_not_found" && zc == "file_too_large"))

	if *updateDoc {
		require.NoError(t, writeGVisorTable(b.rows))
	}
	for _, r := range b.rows {
		t.Logf("%-8s | %-40s | %-9s | %s", r.Group, r.Attempt, r.Verdict, r.Observed)
	}
}

const (
	gvisorTableBegin = "<!-- BEGIN GVISOR BOUNDARY (generated by `go test ./test/escape -run GVisorBoundary -update-doc`; do not edit) -->"
	gvisorTableEnd   = "<!-- END GVISOR BOUNDARY -->"
)

func writeGVisorTable(rows []row) error {
	var t strings.Builder
	t.WriteString("| # | attempt | expected | observed | verdict |\n|---|---|---|---|---|\n")
	for i, r := range rows {
		fmt.Fprintf(&t, "| %d | %s | %s | %s | %s |\n", i+1, r.Attempt, r.Expected, r.observedCell(), r.Verdict)
	}
	return spliceSecurityDoc(gvisorTableBegin, gvisorTableEnd, t.String())
}
