package main

import (
	"fmt"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// mountNSEnv tells the re-executed daemon that it already runs in a mount
// namespace of its own; it is removed from the environment at once.
const mountNSEnv = "SANDBOX_SIDECAR_PRIVATE_MOUNTS"

// sysmonEnv tells the re-executed daemon that it runs with its runtime's
// monitor kept out of deep sleep (see sysmonGODEBUG); its value is the
// GODEBUG the daemon was started with, which is put back at once, so the
// processes the daemon starts inherit the operator's environment, not the
// tuning.
const sysmonEnv = "SANDBOX_SIDECAR_SYSMON_AWAKE"

// sysmonGODEBUG keeps the Go runtime's monitor thread (sysmon) from its
// deep sleep. The runtime sends sysmon to sleep indefinitely whenever every
// P is idle, and wakes it at the next system call with its polling reset
// to every 20 µs for the next millisecond: for a daemon that idles between
// short requests, that is ~50 wake-ups of a thread during every command,
// on the two CPUs the command needs (50–70 µs of a 1.1 ms `/bin/true`:
// docs/benchmarks-history.md, "A command in a bwrap sandbox"). A
// schedtrace period keeps sysmon out of deep sleep, so it settles at its
// slowest polling (every 10 ms) and stays there; the period itself (about
// 24 days) means no trace is ever printed. The runtime reads this setting
// only at start: hence the re-execution.
const sysmonGODEBUG = "schedtrace=2147483647"

// reexec re-executes the daemon, as the same process (same pid, so socket
// activation and sd_notify are unaffected), once for all of:
//
//   - sysmonGODEBUG in its GODEBUG, unless the operator's GODEBUG already
//     sets schedtrace (GODEBUG=schedtrace=0 keeps the runtime's default);
//   - with privateMounts, a mount namespace of its own whose mounts
//     propagate from the host but not back. The sandboxes' disks
//     (loop-mounted images) are then mounted there: no one else sees them,
//     and they vanish with the daemon and its sandboxes' processes however
//     the daemon ends, kill -9 included, instead of pinning loop devices
//     and the state directory on the host. A restarted daemon mounts them
//     again when it re-adopts its sandboxes. It is what systemd's
//     PrivateMounts=yes gives the packaged service, for a root daemon
//     started any other way.
//
// Call it first thing in serve, before any descriptor is opened or read:
// the process image is replaced. In the re-executed daemon it puts the
// environment back as it was and returns nil; mountsErr says why the
// daemon could not have its own mount namespace (it then goes on without
// one, re-executed for the tuning alone or not at all).
//
// unshare(CLONE_NEWNS) only moves the calling thread, so it is done on a
// locked thread that then execs: the exec takes the whole process into the
// thread's namespace.
func reexec(privateMounts bool) (mountsErr error) {
	if exe, _ := os.Executable(); strings.HasSuffix(exe, ".test") {
		return nil // a test binary running serve in-process is not the daemon
	}
	orig, tuned := os.LookupEnv(sysmonEnv)
	if tuned || os.Getenv(mountNSEnv) == "1" {
		restoreEnv(orig, tuned)
		return nil
	}
	wantTune := !strings.Contains(os.Getenv("GODEBUG"), "schedtrace=")
	env := os.Environ()
	if privateMounts {
		runtime.LockOSThread()
		moved, err := unshareMounts()
		switch {
		case err == nil:
			env = append(env, mountNSEnv+"=1")
		case moved:
			// Never exec from, nor unlock, a thread left in a namespace
			// it could not finish: it stays locked, and dies with its
			// goroutine.
			return err
		default:
			runtime.UnlockOSThread()
			mountsErr, privateMounts = err, false
		}
	}
	if !wantTune && !privateMounts {
		return mountsErr
	}
	if wantTune {
		env = append(setGODEBUG(env, sysmonGODEBUG), sysmonEnv+"="+os.Getenv("GODEBUG"))
	}
	err := unix.Exec("/proc/self/exe", os.Args, env)
	if privateMounts {
		return fmt.Errorf("re-execute the daemon in its own mount namespace: %w", err)
	}
	return mountsErr // only the tuning is lost: the daemon runs as it was started
}

// unshareMounts moves the calling (locked) thread into a new mount
// namespace whose mounts are slaves of the host's; moved says whether the
// thread left the host's namespace.
func unshareMounts() (moved bool, err error) {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return false, fmt.Errorf("unshare the mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return true, fmt.Errorf("make the daemon's mounts private: %w", err)
	}
	return true, nil
}

// restoreEnv takes the re-execution's markers out of the environment and
// gives GODEBUG back its value from before (the runtime keeps what it read
// at start).
func restoreEnv(orig string, tuned bool) {
	_ = os.Unsetenv(mountNSEnv)
	if !tuned {
		return
	}
	_ = os.Unsetenv(sysmonEnv)
	if orig == "" {
		_ = os.Unsetenv("GODEBUG")
	} else {
		_ = os.Setenv("GODEBUG", orig)
	}
}

// setGODEBUG returns env with setting added to its GODEBUG (made when
// there is none).
func setGODEBUG(env []string, setting string) []string {
	out := make([]string, 0, len(env)+1)
	found := false
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			found = true
			if v != "" {
				kv = "GODEBUG=" + v + "," + setting
			} else {
				kv = "GODEBUG=" + setting
			}
		}
		out = append(out, kv)
	}
	if !found {
		out = append(out, "GODEBUG="+setting)
	}
	return out
}
