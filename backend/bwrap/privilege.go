package bwrap

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// A non-root daemon gives sandboxes uids of their own with three
// capabilities and nothing else (no setuid helper: NoNewPrivileges= and
// RestrictSUIDSGID= forbid newuidmap, and a helper would need the same
// capabilities handed down from the daemon anyway):
//
//   - CAP_SETUID and CAP_SETGID let the child it forks for bwrap switch to
//     the sandbox's uid and gid before exec (bwrap then makes the user
//     namespace as that uid, exactly as under a root daemon), and let one
//     locked thread of the daemon take the sandbox's filesystem ids
//     (setfsuid, setfsgid) while it makes or reads the guest's files, so
//     they are the sandbox's without CAP_CHOWN and reached without
//     CAP_DAC_OVERRIDE;
//   - CAP_KILL lets it signal its bwrap and init processes, which run as
//     the sandbox's uid.
//
// They arrive as ambient capabilities (systemd's AmbientCapabilities=),
// which every program the daemon runs would inherit: New clears the ambient
// set on every thread first, so bwrap starts with none (it refuses to run
// with capabilities it did not get from being setuid).

// Capabilities a non-root daemon needs for Config.UIDRange.
var uidCaps = []struct {
	bit  uint
	name string
}{{unix.CAP_SETUID, "CAP_SETUID"}, {unix.CAP_SETGID, "CAP_SETGID"}, {unix.CAP_KILL, "CAP_KILL"}}

// checkUIDPrivilege reports whether the daemon gives sandboxes their own
// uids through capabilities (not root), or why it cannot.
func checkUIDPrivilege() (viaCaps bool, err error) {
	if os.Geteuid() == 0 {
		return false, nil
	}
	eff, _, err := capSets()
	if err != nil {
		return false, fmt.Errorf("bwrap backend: cannot read the daemon's capabilities: %w", err)
	}
	var missing []string
	for _, c := range uidCaps {
		if eff&(1<<c.bit) == 0 {
			missing = append(missing, c.name)
		}
	}
	if len(missing) > 0 {
		return false, fmt.Errorf("bwrap backend: giving each sandbox a host uid of its own (bwrap.own_uids) needs a root daemon or one holding CAP_SETUID, CAP_SETGID and CAP_KILL (the packaged unit's AmbientCapabilities=); this daemon (uid %d) lacks %v. Grant them, or set bwrap.own_uids = off to run every sandbox as the daemon's own uid", os.Geteuid(), missing)
	}
	return true, nil
}

// capSets returns the calling thread's effective and ambient sets.
func capSets() (eff, amb uint64, err error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return 0, 0, err
	}
	eff = uint64(data[0].Effective) | uint64(data[1].Effective)<<32
	for bit := uint(0); bit < 64; bit++ {
		r, err := unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, uintptr(bit), 0, 0)
		if err != nil {
			break // past the kernel's last capability
		}
		if r == 1 {
			amb |= 1 << bit
		}
	}
	return eff, amb, nil
}

// dropAmbientCaps clears the ambient capabilities of every thread, so no
// program the daemon runs inherits its capabilities.
func dropAmbientCaps() error {
	_, amb, err := capSets()
	if err != nil {
		return fmt.Errorf("bwrap backend: cannot read the daemon's ambient capabilities: %w", err)
	}
	if amb == 0 {
		return nil
	}
	_, _, errno := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0)
	if errno == syscall.ENOTSUP {
		return fmt.Errorf("bwrap backend: the daemon holds ambient capabilities (%#x) that bwrap must not inherit, and this build cannot clear them on every thread because it uses cgo; build it with CGO_ENABLED=0, as the package does", amb)
	}
	if errno != 0 {
		return fmt.Errorf("bwrap backend: cannot clear the daemon's ambient capabilities: %w", errno)
	}
	return nil
}

// asOwner runs fn with the sandbox's filesystem ids on a thread of its own.
func (b *Backend) asOwner(sb *sandbox, fn func() error) error {
	return b.asIDs(sb.uid, sb.gid, fn)
}

// asIDs runs fn on a locked thread whose filesystem uid and gid are uid
// and gid (-1: unchanged); the thread gets the daemon's back afterwards.
func (b *Backend) asIDs(uid, gid int, fn func() error) error { return asFSIDs(uid, gid, fn) }

func asFSIDs(uid, gid int, fn func() error) error {
	restore, err := lockFSIDs(uid, gid)
	if err != nil {
		return err
	}
	defer restore()
	return fn()
}

// errFSIDs means a thread's filesystem ids did not take the value asked.
var errFSIDs = errors.New("the thread's filesystem ids did not change")

// lockFSIDs locks the calling goroutine to its thread and gives the thread
// filesystem ids uid and gid (-1: unchanged). restore gives it the
// daemon's back and unlocks it; should that fail, the thread stays locked
// and the runtime ends it with the goroutine, so no other goroutine ever
// runs with the sandbox's ids.
func lockFSIDs(uid, gid int) (restore func(), err error) {
	runtime.LockOSThread()
	ownUID, ownGID := os.Geteuid(), os.Getegid()
	back := func() bool {
		_ = unix.Setfsuid(ownUID)
		_ = unix.Setfsgid(ownGID)
		return fsIDs() == [2]int{ownUID, ownGID}
	}
	if gid >= 0 {
		_ = unix.Setfsgid(gid)
	}
	if uid >= 0 {
		_ = unix.Setfsuid(uid)
	}
	want := [2]int{ownUID, ownGID}
	if uid >= 0 {
		want[0] = uid
	}
	if gid >= 0 {
		want[1] = gid
	}
	if got := fsIDs(); got != want {
		if back() {
			runtime.UnlockOSThread()
		}
		return nil, fmt.Errorf("%w: asked %v, have %v (CAP_SETUID/CAP_SETGID missing?)", errFSIDs, want, got)
	}
	return func() {
		if back() {
			runtime.UnlockOSThread()
		}
	}, nil
}

// fsIDs are the calling thread's filesystem uid and gid (setfsuid(-1)
// changes nothing and returns the current one).
func fsIDs() [2]int {
	u, _ := unix.SetfsuidRetUid(-1)
	g, _ := unix.SetfsgidRetGid(-1)
	return [2]int{u, g}
}

// CanGiveOwnUIDs reports why this daemon cannot give sandboxes host uids
// of their own (Config.UIDRange), or nil when it can: it is root, or holds
// CAP_SETUID, CAP_SETGID and CAP_KILL.
func CanGiveOwnUIDs() error {
	_, err := checkUIDPrivilege()
	return err
}
