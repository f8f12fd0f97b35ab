package bwinit

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap/bwwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc"
)

// Files as the sandbox sees them.
//
// read_file and list_directory take any path of the sandbox's own view
// (/etc/os-release, /usr/lib/python3, /proc/self/status), and the daemon
// never resolves such a path on the host: the sandbox's opener opens it
// inside the sandbox and hands the descriptor to the daemon, which only
// fstats, reads and lists it (hostfs.ReadOpened and friends). So symlinks,
// '..' and /proc resolve in the sandbox's mount namespace, exactly as for a
// guest process, and nothing of the host the sandbox does not see can be
// reached however the guest swaps names meanwhile: the kernel resolved the
// path where the guest lives.
//
// The opener is a process of its own, a child of init started from init's
// own executable (/proc/self/exe, with openerEnv set): it has the guest's
// identity throughout, uid 1000 without capabilities, the guest's seccomp
// filter, no_new_privs and rlimits, all inherited from init, and /proc/self
// is its own, a process like the guest's, never init's (whose descriptors
// include the control socket). It makes itself non-dumpable first thing
// and checks that nothing traced it before (TracerPid), so even a sandbox
// allowed ptrace cannot take it over; the one difference this makes to
// what it opens is that its own owner-only /proc/self files (environ, mem)
// are closed to it, as they would be to any other process. The guest can
// signal it (then the open is retried with a new one) and gains nothing by
// it: the opener holds no descriptor of the host, and whatever descriptor
// reached the daemon is one of the sandbox, which the daemon treats as
// hostile (it checks the type, reads non-blocking and bounded, and never
// resolves a name through it).
//
// It serves one request after another until it has been idle openerIdle,
// or a command's end kills it with the rest of the guest's processes (init
// starts another when the next request comes). Init's part is to start it
// and pass each reply socket on; it never opens a guest path itself.

// openerEnv is set (to "1") in the opener's environment, and nowhere else.
const openerEnv = "SANDBOX_SIDECAR_OPENER"

// openerFD is the opener's end of its socket from init.
const openerFD = 3

// openerIdleMillis is how long an opener waits for a request before it exits.
const openerIdleMillis = 30_000

// OpenerName is the opener's process name, as ps shows it.
const OpenerName = "sandbox-open"

// runOpener is the opener's main loop: each message on openerFD carries
// reply sockets, each with one open request queued on it.
func runOpener() int {
	_ = os.WriteFile("/proc/self/comm", []byte(OpenerName), 0)
	if err := beUntraceable(); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox opener: %v\n", err)
		return 1
	}
	buf := make([]byte, 8)
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		fds := []unix.PollFd{{Fd: openerFD, Events: unix.POLLIN}}
		n, err := unix.Poll(fds, openerIdleMillis)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			fmt.Fprintf(os.Stderr, "sandbox opener: poll: %v\n", err)
			return 1
		case n == 0:
			return 0 // idle: init starts another when needed
		}
		n, oobn, _, _, err := unix.Recvmsg(openerFD, buf, oob, unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT)
		switch {
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			fmt.Fprintf(os.Stderr, "sandbox opener: read its socket: %v\n", err)
			return 1
		case n == 0 && oobn == 0:
			return 0 // init is gone
		}
		for _, reply := range bwwire.ReceivedFDs(oob[:oobn]) {
			serveOpen(reply)
			_ = unix.Close(reply)
		}
	}
}

// serveOpen answers the open request queued on reply: the path opened
// non-blocking (a FIFO does not wait for a writer, a terminal does not
// become the controlling one) and sent back, or the errno of the attempt.
func serveOpen(reply int) {
	if typ, err := unix.GetsockoptInt(reply, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || typ != unix.SOCK_SEQPACKET {
		return
	}
	buf := make([]byte, bwwire.MsgSize+backend.MaxGuestPathLen+1)
	n, _, err := unix.Recvfrom(reply, buf, unix.MSG_DONTWAIT)
	if err != nil {
		return // nothing asked: dropping the socket tells the daemon
	}
	errno := unix.Errno(0)
	fd := -1
	req, err := bwwire.DecodeOpenRequest(buf[:n])
	if err != nil {
		errno = unix.EINVAL
	} else {
		fd, errno = initproc.OpenForGuest(req.Path, req.What == bwwire.OpenList)
	}
	var rights []byte
	if fd >= 0 {
		rights = unix.UnixRights(fd)
		defer unix.Close(fd)
	}
	_ = unix.Sendmsg(reply, bwwire.Msg{Kind: bwwire.MsgOpened, A: uint32(errno)}.Encode(), rights, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
}

// openerChild is init's record of its opener: its pid and init's end of
// its socket, or -1 for both when there is none.
type openerChild struct {
	pid, sock int
}

// forwardOpen hands reply to the opener, starting one when there is none
// (or the one there was has died), and closes init's copy. When that
// fails, dropping reply tells the daemon, which may retry.
func (st *initState) forwardOpen(reply int) {
	defer unix.Close(reply)
	for try := 0; try < 2; try++ {
		if st.opener.sock < 0 {
			if err := st.startOpener(); err != nil {
				fmt.Fprintf(os.Stderr, "sandbox init: cannot start the opener: %v\n", err)
				return
			}
		}
		err := unix.Sendmsg(st.opener.sock, []byte{'o'}, unix.UnixRights(reply), nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
		switch {
		case err == nil:
			return
		case errors.Is(err, unix.EAGAIN):
			// The opener is stuck on an open; this request fails rather
			// than wait. The daemon's deadline covers the stuck one.
			return
		}
		// Gone (a command's end killed it, or the guest did): the next
		// try starts another. Its exit is reaped like any child's.
		st.dropOpener()
	}
}

// startOpener starts the opener from init's own executable.
func (st *initState) startOpener() error {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fds[1])
	pid, err := syscall.ForkExec("/proc/self/exe", []string{OpenerName}, &syscall.ProcAttr{
		Dir:   "/",
		Env:   []string{openerEnv + "=1", "GOMAXPROCS=1"},
		Files: []uintptr{0, 1, 2, uintptr(fds[1])},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		unix.Close(fds[0])
		return err
	}
	st.children = true
	st.opener = openerChild{pid: pid, sock: fds[0]}
	return nil
}

// dropOpener forgets the opener (it died or is being replaced).
func (st *initState) dropOpener() {
	if st.opener.sock >= 0 {
		_ = unix.Close(st.opener.sock)
	}
	st.opener = openerChild{pid: -1, sock: -1}
}

// beUntraceable makes the calling process non-dumpable (so no process of
// the sandbox may ptrace it or read its memory and descriptors) and checks
// that no tracer attached in the moment between its exec and that.
func beUntraceable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("cannot make itself non-dumpable: %v", err)
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return fmt.Errorf("cannot read its own status: %v", err)
	}
	if pid := tracerPID(string(status)); pid != "" && pid != "0" {
		return fmt.Errorf("traced by pid %s; refusing to serve", pid)
	}
	return nil
}

// tracerPID is the TracerPid field of a /proc/PID/status, "" if absent.
func tracerPID(status string) string {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, "TracerPid:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
