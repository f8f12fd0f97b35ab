// Package initproc is what the bubblewrap and gVisor backends' sandbox
// inits share: how the daemon's binary, run again inside a sandbox, knows
// it is init, and the steps init takes before it serves the daemon. The
// protocols they then speak are each backend's own.
package initproc

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Name is init's process name, as ps shows it inside and outside.
const Name = "sandbox-init"

// Is reports whether this process is an init: env is set to "1" in the
// environment its backend gives init, and nowhere else. Each backend has
// its own env, so one backend's init is never taken for the other's.
func Is(env string) bool { return os.Getenv(env) == "1" }

// Main runs run and exits with its status when Is(env); otherwise it
// returns at once and does nothing.
func Main(env string, run func() int) {
	if !Is(env) {
		return
	}
	os.Exit(run())
}

// WarmEnv is set (to "1") in the environment of the warm-up command a
// pool member's init runs before any client's (the backends' Warm) when
// the sandbox's root has no `true`: that command is the init's own
// executable, which exits 0 at once when it finds WarmEnv (WarmMain).
const WarmEnv = "SANDBOX_SIDECAR_INIT_WARM"

// WarmMain exits 0 at once when this process is such a warm-up command;
// otherwise it returns and does nothing. Both inits' Main call it first.
func WarmMain() { Main(WarmEnv, func() int { return 0 }) }

// Fail says why init cannot go on, on its stderr, and returns the status
// init exits with.
func Fail(format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "sandbox init: "+format+"\n", args...)
	return 2
}

// Become makes this process init: it names itself Name (first: once
// non-dumpable it may no longer write its own /proc files), makes itself
// non-dumpable (nothing in the sandbox may read its memory, environment or
// descriptors, or trace it), checks that it is pid 1 (of where, named in
// the error) and routes ShieldedSignals to a channel never read.
func Become(where string) error {
	_ = os.WriteFile("/proc/self/comm", []byte(Name), 0)
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("cannot make init non-dumpable: %v", err)
	}
	if os.Getpid() != 1 {
		return fmt.Errorf("init must be pid 1 of %s, not %d", where, os.Getpid())
	}
	signal.Notify(make(chan os.Signal, 1), ShieldedSignals()...)
	return nil
}

// ShieldedSignals are the signals init handles (by dropping them) because
// without a handler they would end it. What a Go program does with a signal
// it has not asked for is documented (os/signal, "Default behavior of
// signals in Go programs"): SIGHUP, SIGINT and SIGTERM make it exit;
// SIGQUIT, SIGILL, SIGTRAP, SIGABRT, SIGSTKFLT and SIGSYS make it exit with
// a stack dump; SIGBUS, SIGFPE and SIGSEGV, sent by kill, do the same.
// Those twelve are shielded. The runtime catches every other signal and
// does nothing with it (SIGUSR1, SIGPIPE, SIGALRM, SIGWINCH...; but a
// write to fd 1 or 2 that fails with EPIPE still ends the program, so an
// init writes to the daemon through another descriptor), or leaves
// it at the system's default (SIGTSTP, SIGTTIN, SIGTTOU, SIGCONT), which
// the kernel never delivers to a PID namespace's pid 1 from inside it.
// SIGKILL and SIGSTOP it never delivers from inside either.
// TestBwrapGuestCannotHurtInit sends every signal to init from a command
// (backendtest.GuestAttackOnInit) and checks it survives, and is neither
// killed nor stopped; it fails if any of the twelve is left out.
//
// Notify, not SIG_IGN, which init's commands would inherit. Shielding no
// more than these is what keeps it cheap: Notify enables each signal the
// runtime counts as notifiable (of these twelve SIGHUP, SIGINT, SIGQUIT,
// SIGABRT and SIGTERM; before, also SIGUSR1, SIGPIPE, the job-control
// signals and ten others) through a round trip to a locked thread of its
// own, and 19 such round trips were 1 ms of every init's start on a 2-vCPU
// VM (docs/benchmarks-history.md, "A create and its first command").
func ShieldedSignals() []os.Signal {
	return []os.Signal{
		syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGILL, syscall.SIGTRAP, syscall.SIGABRT,
		syscall.SIGBUS, syscall.SIGFPE, syscall.SIGSEGV, syscall.SIGTERM, syscall.SIGSTKFLT, syscall.SIGSYS,
	}
}

// LookPath finds name as execvp would with env's PATH: a name with a slash
// is used as it is; otherwise the first executable regular file of that
// name in PATH's directories. It fails with unix.ENOENT when there is none
// and unix.EACCES when the only ones found may not be executed, so that
// the caller can report it as a shell does (127, 126). Init runs commands
// directly, with no shell or GNU timeout in front of them to do this.
func LookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	pathVar := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathVar = v
		}
	}
	var found error = unix.ENOENT
	for _, dir := range filepath.SplitList(pathVar) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p)
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if unix.Access(p, unix.X_OK) != nil {
			found = unix.EACCES
			continue
		}
		return p, nil
	}
	return "", found
}

// NotRunnableStatus is the exit status a shell reports for a command it
// could not start because of err: 127 when it does not exist, 126 when it
// cannot be executed.
func NotRunnableStatus(err error) int {
	if errors.Is(err, unix.ENOENT) {
		return 127
	}
	return 126
}

// BinaryName is the small static init's executable
// (cmd/sandbox-sidecar-init).
const BinaryName = "sandbox-sidecar-init"

// Find returns the small static init that belongs with the daemon's
// executable daemonExe: BinaryName in the same directory (a build tree's
// bin/), or in ../libexec/sandbox-sidecar/ from it (the package's
// /usr/libexec/sandbox-sidecar/). It returns "" when there is none, and the
// backends then run the daemon's own executable as init. Only a regular
// file counts, not a directory or a dangling link.
func Find(daemonExe string) string {
	dir := filepath.Dir(daemonExe)
	for _, p := range []string{
		filepath.Join(dir, BinaryName),
		filepath.Join(dir, "..", "libexec", "sandbox-sidecar", BinaryName),
	} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return filepath.Clean(p)
		}
	}
	return ""
}

// ReserveThreads makes the Go runtime start n OS threads now and keep them
// idle, so that it has one at hand whenever it needs another later (to run
// the collector while init waits in a system call, say). An init's threads
// count against the sandbox's pids limit like its commands' processes, and
// a command may take every pid there is (a fork bomb): a runtime that then
// cannot create a thread it needs dies ("failed to create new OS thread"),
// and the sandbox with it. n goroutines each lock themselves to a thread
// of their own until all n run at once, then unlock and return; the
// threads stay in the runtime's idle list.
func ReserveThreads(n int) {
	var running, release sync.WaitGroup
	running.Add(n)
	release.Add(1)
	var done sync.WaitGroup
	done.Add(n)
	for range n {
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			running.Done()
			release.Wait()
			runtime.UnlockOSThread()
		}()
	}
	running.Wait()
	release.Done()
	done.Wait()
}

// OpenForGuest opens path for an opener serving the daemon's file
// operations inside a sandbox, with the opener's (the guest's) identity:
// read-only, non-blocking (a FIFO does not wait for a writer), never as a
// controlling terminal, close-on-exec, and a directory when dir is set. It
// returns the descriptor, or -1 and the errno of the attempt (EIO for an
// error that carries none).
func OpenForGuest(path string, dir bool) (int, unix.Errno) {
	flags := unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
	if dir {
		flags |= unix.O_DIRECTORY
	}
	for {
		fd, err := unix.Open(path, flags, 0)
		switch {
		case err == nil:
			return fd, 0
		case errors.Is(err, unix.EINTR):
			continue
		}
		if e, ok := errors.AsType[unix.Errno](err); ok && e != 0 {
			return -1, e
		}
		return -1, unix.EIO
	}
}
