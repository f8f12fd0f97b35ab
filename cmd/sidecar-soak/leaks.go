package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/disk"
)

// markerEnv is backend/bwrap's marker variable (strays.go): every bwrap
// process of a sandbox carries it in its environment, its value
// markerPrefix of the daemon's state directory followed by the sandbox's
// name.
const markerEnv = "SANDBOX_SIDECAR_SANDBOX"

// markerPrefix starts the marker of every sandbox of the daemon on state:
// backend/bwrap's markerPrefix of its directory, a hash of the path, so
// the value names no host path. The soak checks that it finds the live
// sandboxes' processes by it (liveMarked), so a change in the backend
// cannot silently blind the leak check.
func markerPrefix(state string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(filepath.Join(state, "bwrap"))))
	return hex.EncodeToString(sum[:8]) + "-"
}

// procMatcher says whether a host process (its environment and command
// line) is one of a sandbox of the daemon under soak, and of which
// ("" when it cannot tell).
type procMatcher func(env, cmdline string) (id string, ours bool)

// bwrapProcesses finds a bwrap sandbox's processes by their marker.
func bwrapProcesses(state string) procMatcher {
	prefix := markerEnv + "=" + markerPrefix(state)
	return func(env, _ string) (string, bool) {
		for _, kv := range strings.Split(env, "\x00") {
			if id, ok := strings.CutPrefix(kv, prefix); ok {
				return id, true
			}
		}
		return "", false
	}
}

// gvisorProcesses finds a gVisor sandbox's host processes (its runsc,
// sentry, gofer and, on systrap, guest stubs) by the runsc root they
// name, and the sandbox by their bundle.
func gvisorProcesses(state string) procMatcher {
	root := "--root=" + filepath.Join(state, "gvisor", ".runsc")
	return func(_, cmdline string) (string, bool) {
		argv := strings.Split(cmdline, "\x00")
		if !slices.Contains(argv, root) {
			return "", false
		}
		id := ""
		for i, a := range argv {
			bundle, ok := strings.CutPrefix(a, "--bundle=")
			if !ok && a == "--bundle" && i+1 < len(argv) {
				bundle, ok = argv[i+1], true
			}
			if ok {
				id = filepath.Base(filepath.Dir(bundle))
			}
		}
		return id, true
	}
}

// leaks lists what a stopped daemon left: processes of a sandbox (match)
// or in a sandbox's cgroup (a keeper, a durable process), cgroups named
// after a sandbox, loop devices attached to an image, mounts under the
// state directory. A process of a spared sandbox is none, and neither are
// the mounts shared mounts lists (what live sandboxes share).
func leaks(state, backendDir string, match procMatcher, shared []string, ids []string, spared ...string) []string {
	var out []string
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	ours := func(env, cmdline string) bool {
		id, ok := match(env, cmdline)
		return ok && (id == "" || !slices.Contains(spared, id))
	}
	for _, p := range processesWhere(func(env, cl, cg string) bool { return ours(env, cl) || inCgroupOf(cg, want) }) {
		out = append(out, "leaked process "+p)
	}
	_ = filepath.WalkDir("/sys/fs/cgroup", func(p string, de os.DirEntry, err error) error {
		if err != nil || !de.IsDir() {
			return nil
		}
		if strings.Count(strings.TrimPrefix(p, "/sys/fs/cgroup"), "/") > 6 {
			return filepath.SkipDir
		}
		if want[de.Name()] {
			out = append(out, "leaked cgroup "+p)
			return filepath.SkipDir
		}
		return nil
	})
	for _, id := range ids {
		if backendDir == "gvisor" {
			// runsc's control socket: in its root, else in the host's
			// directories it falls back to.
			for _, dir := range []string{filepath.Join(state, "gvisor", ".runsc"), "/var/run", "/run", "/tmp"} {
				if p := filepath.Join(dir, "runsc-"+id+".sock"); exists(p) {
					out = append(out, "leaked runsc control socket "+p)
				}
			}
		}
		img := filepath.Join(state, backendDir, id, "disk.img")
		if ls, err := disk.Attached(img); err == nil && len(ls) > 0 {
			out = append(out, fmt.Sprintf("sandbox %s's image is still attached to %d loop device(s)", id, len(ls)))
		}
	}
	if b, err := os.ReadFile("/proc/self/mounts"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], state+"/") && !slices.Contains(shared, f[1]) {
				out = append(out, "leaked mount "+f[1])
			}
		}
	}
	return out
}

// processesWhere lists the host's processes (but this one) for which
// match holds of their environment, command line and cgroups.
func processesWhere(match func(environ, cmdline, cgroups string) bool) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if e.Name() == fmt.Sprint(os.Getpid()) || e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		env, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		cl, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if match(string(env), string(cl), string(cg)) {
			out = append(out, fmt.Sprintf("%s: %q", e.Name(), strings.ReplaceAll(string(cl), "\x00", " ")))
		}
	}
	return out
}

// inCgroupOf reports whether a /proc/PID/cgroup's paths name one of ids.
func inCgroupOf(cgroups string, ids map[string]bool) bool {
	for _, line := range strings.Split(cgroups, "\n") {
		i := strings.LastIndexByte(line, ':')
		if i < 0 {
			continue
		}
		for _, part := range strings.Split(line[i+1:], "/") {
			if ids[part] {
				return true
			}
		}
	}
	return false
}

// liveMarked counts the processes match finds, and those in a cgroup of
// one of ids.
func liveMarked(match procMatcher, ids []string) (marked, inCgroup int) {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	marked = len(processesWhere(func(env, cl, _ string) bool { _, ok := match(env, cl); return ok }))
	inCgroup = len(processesWhere(func(_, _, cg string) bool { return inCgroupOf(cg, want) }))
	return marked, inCgroup
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
