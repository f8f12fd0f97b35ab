package bwrap

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap/bwwire"
)

// A sandbox's init outlives the daemon that started it: a daemon killed
// with -9, stopped, restarted or upgraded leaves every kept sandbox's init,
// and the durable processes it runs, where they are. Each init listens on
// agent.sock in its sandbox's directory (bwwire.ListenFD): a socket the
// daemon made and bound before it started bwrap, 0600 and the daemon's,
// in a directory no guest can name. The next daemon connects to it when it
// loads the sandbox (adoptInit), and the connection becomes init's control
// socket; the kernel refuses the connect when no init holds the socket,
// which is how a dead one is told from a live one.

// agentSocket is the name of a sandbox's init's listening socket.
const agentSocket = "agent.sock"

// reattachTimeout bounds the wait for a re-attached init's ready message.
const reattachTimeout = 2 * time.Second

// shortPath reaches name in dir through a descriptor of dir, so that a
// socket's address fits sun_path (108 bytes) whatever the state
// directory's length; the returned close ends it.
func shortPath(dir, name string) (string, func(), error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	return "/proc/self/fd/" + strconv.Itoa(fd) + "/" + name, func() { _ = unix.Close(fd) }, nil
}

// listenAgent makes sandbox dir's init's socket, bound and not yet
// listening (init listens), replacing a stale one (its init is gone: this
// start makes a new one).
func listenAgent(dir string) (*os.File, error) {
	path, done, err := shortPath(dir, agentSocket)
	if err != nil {
		return nil, err
	}
	defer done()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "sandbox-agent-listener")
	_ = os.Remove(filepath.Join(dir, agentSocket))
	// (Init calls listen(2) itself, so a connecting daemon's peer is init.)
	// 0600 once bound: until init listens nobody can connect anyway, and the
	// directory is reachable only by the daemon and the sandbox's uid, all
	// of whose processes are inside the sandbox, which cannot name it.
	err = unix.Bind(fd, &unix.SockaddrUnix{Name: path})
	if err == nil {
		err = os.Chmod(filepath.Join(dir, agentSocket), 0o600)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// errNoLiveInit: no init listens in the sandbox's directory.
var errNoLiveInit = errors.New("no live init")

// dialAgent connects to sandbox dir's init, if one is alive, and returns
// the connection (non-blocking, as startInit's daemon end is) and init's
// pid as the kernel reported it (this daemon's PID namespace).
func dialAgent(dir string) (*os.File, int, error) {
	path, done, err := shortPath(dir, agentSocket)
	if err != nil {
		return nil, 0, errNoLiveInit
	}
	defer done()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, 0, err
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ENOENT) {
			return nil, 0, errNoLiveInit
		}
		return nil, 0, err
	}
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		unix.Close(fd)
		return nil, 0, err
	}
	return os.NewFile(uintptr(fd), "sandbox-control"), int(cred.Pid), nil
}

// adoptInit re-attaches to the live init a previous daemon left in sb, if
// there is one: nil, nil when there is none. It checks that the process
// that answered carries the sandbox's marker (it is the init this backend
// started there) and reads its ready message.
func (b *Backend) adoptInit(sb *sandbox) (*initProc, error) {
	ctrl, pid, err := dialAgent(sb.dir)
	if errors.Is(err, errNoLiveInit) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot reach its init: %w", err)
	}
	ip := &initProc{ctrl: ctrl, oom: &oomCounter{cg: sb.cg}, dir: sb.dir, pidfd: -1}
	fail := func(format string, args ...any) (*initProc, error) {
		err := fmt.Errorf(format, args...)
		if ip.pidfd >= 0 {
			// Something answered that is not ours to keep: end it.
			_ = unix.PidfdSendSignal(ip.pidfd, unix.SIGKILL, nil, 0)
		}
		ip.detach(b)
		return nil, err
	}
	if ip.pidfd, err = unix.PidfdOpen(pid, 0); err != nil {
		ip.pidfd = -1
		return fail("its init (pid %d) is gone: %v", pid, err)
	}
	if got, ok := readMarker(pid); !ok || got != marker(sb.dir) {
		// A non-root daemon cannot read another uid's environment: the
		// socket's place and mode (the daemon's alone) vouch for it then.
		if ok || os.Geteuid() == 0 {
			return fail("the process answering on its init's socket (pid %d) does not carry its marker", pid)
		}
	}
	buf := make([]byte, bwwire.MsgSize+1)
	if err := ctrl.SetReadDeadline(time.Now().Add(reattachTimeout)); err != nil {
		return fail("%v", err)
	}
	n, err := ctrl.Read(buf)
	if err != nil {
		return fail("its init did not say it was ready: %v", err)
	}
	if m, derr := bwwire.DecodeMsg(buf[:n]); derr != nil || m.Kind != bwwire.MsgReady {
		return fail("its init said something unexpected (%v): it is another version's (the daemon was upgraded); it is replaced, and its processes end", derr)
	}
	unpolled, err := outOfPoller(ctrl)
	if err != nil {
		return fail("%v", err)
	}
	ip.ctrl = unpolled
	return ip, nil
}
