package main

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// mountNSEnv tells the re-executed daemon that it already runs in a mount
// namespace of its own; it is removed from the environment at once.
const mountNSEnv = "SANDBOX_SIDECAR_PRIVATE_MOUNTS"

// enterPrivateMounts re-executes the daemon, as the same process (same
// pid, so socket activation and sd_notify are unaffected), in a mount
// namespace of its own whose mounts propagate from the host but not back.
// The sandboxes' disks (loop-mounted images) are then mounted there: no
// one else sees them, and they vanish with the daemon and its sandboxes'
// processes however the daemon ends, kill -9 included, instead of pinning
// loop devices and the state directory on the host. A restarted daemon
// mounts them again when it re-adopts its sandboxes. It is what systemd's
// PrivateMounts=yes gives the packaged service, for a root daemon started
// any other way.
//
// Call it first thing in serve, before any descriptor is opened or read:
// the process image is replaced. It returns nil in the re-executed daemon.
// unshare(CLONE_NEWNS) only moves the calling thread, so it is done on a
// locked thread that then execs: the exec takes the whole process into the
// thread's namespace.
func enterPrivateMounts() error {
	if os.Getenv(mountNSEnv) == "1" {
		return os.Unsetenv(mountNSEnv)
	}
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("unshare the mount namespace: %w", err)
	}
	// From here on this thread is in the new namespace: it stays locked
	// (and so dies with its goroutine) if anything fails.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make the daemon's mounts private: %w", err)
	}
	env := append(os.Environ(), mountNSEnv+"=1")
	return fmt.Errorf("re-execute the daemon in its own mount namespace: %w", unix.Exec("/proc/self/exe", os.Args, env))
}
