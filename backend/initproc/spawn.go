package initproc

import (
	"errors"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// SpawnAttr says how Spawn starts a command.
type SpawnAttr struct {
	// Dir is the command's working directory, entered after the
	// credentials change (so one the command's user may not enter fails
	// the spawn); "" keeps init's.
	Dir string
	// Env is the command's whole environment.
	Env []string
	// Stdio are the descriptors the command gets as 0, 1 and 2. Every
	// other descriptor of init must be close-on-exec (as the Go runtime
	// and golang.org/x/sys/unix open them).
	Stdio [3]int
	// Cred, when set, is the user and group the command runs as, with no
	// supplementary groups.
	Cred *Cred
	// PidFD, when set, gets a pidfd of the command (CLONE_PIDFD; Linux
	// 5.2, not gVisor's sentry), which the caller must close.
	PidFD *int
}

// Cred is a command's user and group.
type Cred struct{ UID, GID uint32 }

// Spawn starts prog with argv in a session of its own (setsid), as attr
// says, and returns its pid once it has exec'd: an error from any step
// before the exec (the credentials, Dir, prog's own execve: ENOENT,
// EACCES, ENOEXEC...) is returned as the unix.Errno it failed with, and
// that child is already reaped. The command starts with every signal's
// disposition at its default (as execve leaves every handled signal) and
// its signal mask empty.
//
// What it saves over syscall.ForkExec, which both inits used before: the
// Go runtime's child path resets every signal handler the runtime
// installed, ~60 rt_sigaction calls between the fork and the exec, and
// reports the exec's result through a pipe of its own. Inside gVisor each
// system call is a round trip into the sentry (~20 µs on a loaded VM), so
// that was ~1.2 ms of every command (docs/benchmarks-history.md,
// "gVisor"). Spawn's child makes only the calls the
// command needs (setsid, setgroups/setgid/setuid, chdir, three dup3, the
// signal mask, execve) and reports a failure in memory it shares with
// init. Where the assembly child is not written (any GOARCH but amd64)
// Spawn is syscall.ForkExec with the same attributes.
func Spawn(prog string, argv []string, attr SpawnAttr) (int, error) {
	if len(argv) == 0 {
		return 0, unix.EINVAL
	}
	// A descriptor below 3 would be overwritten by another's dup3 before
	// it was duplicated itself: move it up first.
	for i, fd := range attr.Stdio {
		if fd < 0 {
			return 0, unix.EBADF
		}
		if fd < 3 {
			up, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
			if err != nil {
				return 0, err
			}
			defer unix.Close(up)
			attr.Stdio[i] = up
		}
	}
	return spawn(prog, argv, attr)
}

// forkExec is Spawn through syscall.ForkExec.
func forkExec(prog string, argv []string, attr SpawnAttr) (int, error) {
	sys := &syscall.SysProcAttr{Setsid: true, PidFD: attr.PidFD}
	if attr.Cred != nil {
		sys.Credential = &syscall.Credential{Uid: attr.Cred.UID, Gid: attr.Cred.GID, Groups: []uint32{}}
	}
	pid, err := syscall.ForkExec(prog, argv, &syscall.ProcAttr{
		Dir: attr.Dir, Env: attr.Env,
		Files: []uintptr{uintptr(attr.Stdio[0]), uintptr(attr.Stdio[1]), uintptr(attr.Stdio[2])},
		Sys:   sys,
	})
	if e, ok := errors.AsType[syscall.Errno](err); ok {
		err = unix.Errno(e)
	}
	return pid, err
}

// spawnArgs is what rawSpawn's child reads (and writes errno to): its
// layout is spawn_linux_amd64.s's offsets, which TestSpawnArgsLayout
// checks.
type spawnArgs struct {
	path  *byte    // 0
	argv  **byte   // 8
	envp  **byte   // 16
	dir   *byte    // 24: nil keeps the directory
	stdio [3]int64 // 32, 40, 48
	uid   int64    // 56: -1 keeps the credentials
	gid   int64    // 64
	flags uint64   // 72: clone's flags
	pidfd *int32   // 80: where CLONE_PIDFD puts the pidfd
	block uint64   // 88: every signal
	saved uint64   // 96: the parent thread's mask while it forks
	empty uint64   // 104: the command's mask
	errno int64    // 112: the child's failure, 0 when it exec'd
}

// prepare builds rawSpawn's arguments; everything it points to is on the
// heap and stays alive through keep.
func prepare(prog string, argv []string, attr SpawnAttr) (*spawnArgs, error) {
	path, err := syscall.BytePtrFromString(prog)
	if err != nil {
		return nil, err
	}
	argvp, err := syscall.SlicePtrFromStrings(argv)
	if err != nil {
		return nil, err
	}
	envp, err := syscall.SlicePtrFromStrings(attr.Env)
	if err != nil {
		return nil, err
	}
	a := &spawnArgs{path: path, argv: &argvp[0], envp: &envp[0], uid: -1, gid: -1, block: ^uint64(0),
		flags: unix.CLONE_VM | unix.CLONE_VFORK | uint64(unix.SIGCHLD)}
	if attr.Dir != "" {
		if a.dir, err = syscall.BytePtrFromString(attr.Dir); err != nil {
			return nil, err
		}
	}
	for i, fd := range attr.Stdio {
		a.stdio[i] = int64(fd)
	}
	if attr.Cred != nil {
		a.uid, a.gid = int64(attr.Cred.UID), int64(attr.Cred.GID)
	}
	if attr.PidFD != nil {
		a.flags |= unix.CLONE_PIDFD
		a.pidfd = new(int32)
	}
	return a, nil
}

// finish turns rawSpawn's results into Spawn's: the pid, or the errno of
// the fork or of the child's failed step (that child reaped).
func finish(a *spawnArgs, attr SpawnAttr, pid int64, errno uintptr) (int, error) {
	if errno != 0 {
		return 0, unix.Errno(errno)
	}
	if a.errno != 0 {
		if a.pidfd != nil {
			_ = unix.Close(int(*a.pidfd))
		}
		for {
			var ws unix.WaitStatus
			if _, err := unix.Wait4(int(pid), &ws, 0, nil); !errors.Is(err, unix.EINTR) {
				break // reaped, or by someone else (ECHILD)
			}
		}
		return 0, unix.Errno(a.errno)
	}
	if attr.PidFD != nil {
		*attr.PidFD = int(*a.pidfd)
	}
	return int(pid), nil
}

// keep keeps a's memory alive until the child has exec'd.
func keep(a *spawnArgs) { runtime.KeepAlive(a) }
