package initproc

import "syscall"

// rawSpawn blocks every signal in the calling thread, vforks a child
// sharing init's memory (CLONE_VM|CLONE_VFORK: the parent thread waits
// until the child has exec'd or exited) and restores the thread's mask;
// the child, using registers only (it runs on the parent's stack), makes
// a's calls and execs, or writes the failed call's errno to a.errno and
// exits 127. It returns the child's pid, or the errno of the mask or the
// clone. spawn_amd64.s.
//
// Why the child may run with init's signal handlers installed, which
// syscall.ForkExec's child resets one by one first: every signal is
// blocked from before the clone until the child's last call before its
// execve unblocks them, and execve resets every handled signal to its
// default. In that window of one system call only a sender that knows
// the new pid could reach the child, and between commands there is none
// (init kills and reaps every guest process when a command ends, and the
// daemon runs one command of a sandbox at a time: a caller that ever
// spawns while guest processes live must revisit this); the
// Go handler it would run (in a child that shares init's memory) only
// counts a notified signal (init drops them all) or, for a fatal one,
// kills the child.
//
//go:noescape
func rawSpawn(a *spawnArgs) (pid int64, errno uintptr)

func spawn(prog string, argv []string, attr SpawnAttr) (int, error) {
	a, err := prepare(prog, argv, attr)
	if err != nil {
		return 0, err
	}
	// As syscall.ForkExec: no descriptor is being made inheritable
	// (a non-atomic open then CLOEXEC elsewhere) while the child forks.
	syscall.ForkLock.Lock()
	pid, errno := rawSpawn(a)
	syscall.ForkLock.Unlock()
	keep(a)
	return finish(a, attr, pid, errno)
}
