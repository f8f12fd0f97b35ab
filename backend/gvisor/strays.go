package gvisor

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// runsc knows a sandbox by the state file `runsc run` writes once the
// sandbox is up. A `runsc run` killed before that (a boot that hangs, as
// runsc's kvm platform does on a KVM without the CPU's virtualisation
// extensions, or a create whose deadline passes mid-boot) leaves its
// sandbox and gofer processes running under no name runsc can delete. They
// are found instead by their command lines: runsc starts both with this
// backend's --root and the sandbox's --bundle flags, in that form.

// cmdlineBound caps what is read of one process's command line.
const cmdlineBound = 64 << 10

// strayWait bounds the wait for a killed stray to exit.
const strayWait = 2 * time.Second

// runscArgv reports whether argv is of a process runsc started for this
// backend's root: it has --root=<root> as a whole argument and, when bundle
// is not empty, that bundle (bundleArg).
func runscArgv(argv []string, root, bundle string) bool {
	return slices.Contains(argv, "--root="+root) && (bundle == "" || bundleArg(argv) == bundle)
}

// bundleArg is the bundle a runsc command line names: --bundle=<dir> (its
// sandbox) or --bundle <dir> (its gofer); "" when it names none.
func bundleArg(argv []string) string {
	for i, a := range argv {
		if v, ok := strings.CutPrefix(a, "--bundle="); ok {
			return v
		}
		if a == "--bundle" && i+1 < len(argv) {
			return argv[i+1]
		}
	}
	return ""
}

// readArgv reads /proc/PID/cmdline (bounded) as its arguments.
func readArgv(pid int) ([]string, bool) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, false
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, cmdlineBound))
	if err != nil || len(b) == 0 {
		return nil, false
	}
	var argv []string
	for _, a := range bytes.Split(bytes.TrimSuffix(b, []byte{0}), []byte{0}) {
		argv = append(argv, string(a))
	}
	return argv, true
}

// strayPasses bounds the scans of killRunscStrays.
const strayPasses = 3

// killRunscStrays kills, with SIGKILL, every process runsc started under
// this backend's root for bundle (every one under the root, with bundle
// ""), and waits a little for each to exit. Each is pinned by a pidfd and
// its command line read again through it before the signal, so a pid
// reused in between is never signalled. A process in the middle of an
// execve reads as an empty command line (runsc re-executes itself for its
// sandbox and gofer), so one scan can miss it: the scan is repeated, up to
// strayPasses times, until one finds nothing. It returns how many it
// killed.
func (b *Backend) killRunscStrays(bundle string) int {
	root := b.runscRoot()
	return b.killRunscMatching(func(argv []string) bool { return runscArgv(argv, root, bundle) }, bundle)
}

// killRunscStraysBut kills, as killRunscStrays does, every process runsc
// started under this backend's root but those of the bundles in keep (the
// runsc sandboxes a previous daemon left whose inits live, and their
// gofers).
func (b *Backend) killRunscStraysBut(keep map[string]bool) int {
	root := b.runscRoot()
	return b.killRunscMatching(func(argv []string) bool { return runscArgv(argv, root, "") && !keep[bundleArg(argv)] }, "")
}

// bundlesOf is the bundle directories of the sandboxes in ids.
func (b *Backend) bundlesOf(ids map[string]bool) map[string]bool {
	out := make(map[string]bool, len(ids))
	for id := range ids {
		out[filepath.Join(b.sandboxDir(id), bundleName)] = true
	}
	return out
}

// killRunscMatching kills every process whose command line match accepts
// (bundle names them in the log).
func (b *Backend) killRunscMatching(match func(argv []string) bool, bundle string) int {
	total := 0
	for range strayPasses {
		n := b.killRunscStraysOnce(match, bundle)
		total += n
		if n == 0 {
			break
		}
	}
	return total
}

func (b *Backend) killRunscStraysOnce(match func(argv []string) bool, bundle string) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var pidfds []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if argv, ok := readArgv(pid); !ok || !match(argv) {
			continue
		}
		pfd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue
		}
		// The pidfd pins this process: read its command line again, now
		// that the pid cannot name another.
		if argv, ok := readArgv(pid); !ok || !match(argv) {
			_ = unix.Close(pfd)
			continue
		}
		if err := unix.PidfdSendSignal(pfd, unix.SIGKILL, nil, 0); err != nil {
			_ = unix.Close(pfd)
			continue
		}
		b.log.Warn("killed a runsc process that runsc itself no longer knows", "pid", pid, "bundle", bundle)
		pidfds = append(pidfds, pfd)
	}
	deadline := time.Now().Add(strayWait)
	for _, pfd := range pidfds {
		for {
			left := time.Until(deadline)
			if left <= 0 {
				break
			}
			fds := []unix.PollFd{{Fd: int32(pfd), Events: unix.POLLIN}}
			if n, err := unix.Poll(fds, int(left.Milliseconds())+1); n > 0 || (err != nil && err != unix.EINTR) {
				break
			}
		}
		_ = unix.Close(pfd)
	}
	return len(pidfds)
}

// KillSandboxes kills every runsc process of the backend directory dir
// (its sandboxes' sentries and gofers, and so everything they run) and
// unmounts what runsc left mounted in its root: the gVisor sandboxes that
// outlive a daemon. It is for what abandons a backend's state without
// destroying its sandboxes (tests, benchmarks), as bwrap.KillSandboxes is;
// a daemon's own destroys and offline `gc --all` end sandboxes one by one.
// It returns how many processes it killed.
func KillSandboxes(dir string) int {
	b := &Backend{cfg: Config{Dir: dir}, log: hclog.NewNullLogger()}
	n := b.killRunscStraysBut(nil)
	unmountNullNetNS(b.runscRoot())
	return n
}
