package gvinit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc"
)

// Files as the sandbox sees them (gVisor).
//
// read_file, ranged reads and list_directory take any path of the
// sandbox's own view. Init runs as root inside gVisor, so it never opens
// such a path itself: its opener, a child started from init's executable
// as the guest (uid 1000, no capabilities, like every command), opens it
// inside the sandbox and passes the descriptor to init over a socket of
// the sandbox (SCM_RIGHTS works between gVisor's own processes); init
// reads it bounded, as backend/hostfs reads one, and sends the bytes on
// the stream (filewire.go). /proc/self is the opener's: a process of the
// guest's identity, never init's. The opener makes itself non-dumpable
// and refuses to serve when traced, holds only /dev/null and its socket,
// and serves one request after another until idle for openerIdleMillis or
// killed with the rest of the guest's processes at a command's end (init
// starts another when needed).

// openerEnv is set (to "1") in the opener's environment, and nowhere else.
const openerEnv = "SANDBOX_SIDECAR_GVISOR_OPENER"

const (
	openerFD         = 3
	openerIdleMillis = 30_000
	openerName       = "sandbox-open"
	// openerAnswerMillis bounds init's wait for one answer: an opener
	// stuck on an open is killed.
	openerAnswerMillis = 10_000
	// maxFileOpsWaiting bounds the file ops init holds at once (one runs,
	// the rest wait); more are refused at once.
	maxFileOpsWaiting = 4
)

// What the opener opens a path for.
const (
	openRead = 1
	openList = 2
)

// runOpener answers init's requests: each a datagram [what u32][path],
// each answer [errno u32] with the descriptor when errno is 0.
func runOpener() int {
	_ = os.WriteFile("/proc/self/comm", []byte(openerName), 0)
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox opener: cannot make itself non-dumpable: %v\n", err)
		return 1
	}
	if status, err := os.ReadFile("/proc/self/status"); err != nil || tracedBy(string(status)) {
		fmt.Fprintf(os.Stderr, "sandbox opener: traced, or its status unreadable (%v); refusing to serve\n", err)
		return 1
	}
	buf := make([]byte, 4+backend.MaxGuestPathLen+1)
	for {
		fds := []unix.PollFd{{Fd: openerFD, Events: unix.POLLIN}}
		n, err := unix.Poll(fds, openerIdleMillis)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil || n == 0:
			return 0
		}
		n, _, err = unix.Recvfrom(openerFD, buf, unix.MSG_DONTWAIT)
		switch {
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
			continue
		case err != nil || n == 0:
			return 0 // init is gone
		}
		errno, fd := unix.Errno(unix.EINVAL), -1
		if n > 4 && n <= 4+backend.MaxGuestPathLen {
			what, p := binary.LittleEndian.Uint32(buf), string(buf[4:n])
			if (what == openRead || what == openList) && p[0] == '/' && strings.IndexByte(p, 0) < 0 {
				fd, errno = initproc.OpenForGuest(p, what == openList)
			}
		}
		var rights []byte
		if fd >= 0 {
			rights = unix.UnixRights(fd)
		}
		_ = unix.Sendmsg(openerFD, binary.LittleEndian.AppendUint32(nil, uint32(errno)), rights, nil, unix.MSG_NOSIGNAL)
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}

func tracedBy(status string) bool {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, "TracerPid:"); ok {
			v = strings.TrimSpace(v)
			return v != "" && v != "0"
		}
	}
	return false
}

// fileOps is init's side of the guest's file operations.
type fileOps struct {
	waiting int // guarded by st.mu
	// mu runs one op at a time and keeps the opener from being started
	// while a command's end reaps every process (initmain.go's run).
	mu     sync.Mutex
	pid    int // the opener, 0 if none
	sock   int // init's end of its socket, -1 if none
	inited bool
}

// fileOp serves one file op: it opens the path as the guest, reads it
// bounded and sends what it read and how it ended.
func (st *initState) fileOp(req gvwire.FileRequest) {
	st.mu.Lock()
	full := st.files.waiting >= maxFileOpsWaiting
	if !full {
		st.files.waiting++
	}
	st.mu.Unlock()
	if full {
		_ = st.send(gvwire.KindFileDone, gvwire.FileDone{Seq: req.Seq, Code: gvwire.FileFailed, Text: "the sandbox is busy with other file operations; retry"}.Encode())
		return
	}
	defer func() {
		st.mu.Lock()
		st.files.waiting--
		st.mu.Unlock()
	}()
	st.files.mu.Lock()
	defer st.files.mu.Unlock()

	what := uint32(openRead)
	if req.Op == gvwire.FileList {
		what = openList
	}
	fd, errno, err := st.openAsGuest(what, req.Path)
	if err != nil {
		_ = st.send(gvwire.KindFileDone, gvwire.FileDone{Seq: req.Seq, Code: gvwire.FileFailed, Text: err.Error()}.Encode())
		return
	}
	if errno != 0 {
		_ = st.send(gvwire.KindFileDone, gvwire.FileDone{Seq: req.Seq, Code: gvwire.FileErrno, Errno: uint32(errno)}.Encode())
		return
	}
	f := os.NewFile(uintptr(fd), req.Path)
	defer f.Close()
	var data []byte
	var size int64
	switch req.Op {
	case gvwire.FileRead:
		data, err = hostfs.ReadOpened(f, req.Path, req.N)
		size = int64(len(data))
	case gvwire.FileRange:
		data, size, err = hostfs.ReadRangeOpened(f, req.Path, req.Offset, req.N)
	case gvwire.FileList:
		var entries []backend.DirEntry
		entries, err = hostfs.ListOpened(f, req.Path, int(min(req.N, 1<<30)))
		for _, e := range entries {
			data = gvwire.AppendEntry(data, e)
		}
		size = int64(len(entries))
	}
	if err != nil {
		_ = st.send(gvwire.KindFileDone, gvwire.FileDoneOf(req.Seq, err).Encode())
		return
	}
	for len(data) > 0 {
		piece := data[:min(len(data), gvwire.MaxFileData-4)]
		data = data[len(piece):]
		if err := st.send(gvwire.KindFileData, append(binary.LittleEndian.AppendUint32(nil, req.Seq), piece...)); err != nil {
			return
		}
	}
	_ = st.send(gvwire.KindFileDone, gvwire.FileDone{Seq: req.Seq, Code: gvwire.FileOK, Size: size}.Encode())
}

// openAsGuest has the opener open path, starting one when there is none
// or the last has died; it tries twice.
func (st *initState) openAsGuest(what uint32, path string) (int, unix.Errno, error) {
	var lastErr error
	for try := 0; try < 2; try++ {
		if st.files.sock < 0 || !st.files.inited {
			if err := st.startOpener(); err != nil {
				return -1, 0, fmt.Errorf("cannot start the sandbox's opener: %v", err)
			}
		}
		fd, errno, err := st.askOpener(what, path)
		if err == nil {
			return fd, errno, nil
		}
		lastErr = err
		st.dropOpener()
	}
	return -1, 0, fmt.Errorf("the sandbox's opener did not answer: %v; retry", lastErr)
}

func (st *initState) askOpener(what uint32, path string) (int, unix.Errno, error) {
	req := append(binary.LittleEndian.AppendUint32(nil, what), path...)
	if err := unix.Sendmsg(st.files.sock, req, nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT); err != nil {
		return -1, 0, err
	}
	for {
		fds := []unix.PollFd{{Fd: int32(st.files.sock), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, openerAnswerMillis)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return -1, 0, err
		}
		if n == 0 {
			return -1, 0, errors.New("no answer in time")
		}
		break
	}
	buf := make([]byte, 8)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := unix.Recvmsg(st.files.sock, buf, oob, unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT)
	if err != nil {
		return -1, 0, err
	}
	var fds []int
	if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
		for _, m := range msgs {
			if got, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	closeAll := func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}
	switch {
	case n == 0 && oobn == 0:
		return -1, 0, errors.New("the opener went away")
	case n != 4 || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0:
		closeAll()
		return -1, 0, errors.New("a malformed answer")
	}
	errno := unix.Errno(binary.LittleEndian.Uint32(buf))
	switch {
	case errno == 0 && len(fds) == 1:
		return fds[0], 0, nil
	case errno != 0 && len(fds) == 0:
		return -1, errno, nil
	}
	closeAll()
	return -1, 0, errors.New("a malformed answer")
}

// startOpener starts the opener as the guest, from init's executable
// bound into the sandbox (guestInit), with nothing of init's but its socket.
func (st *initState) startOpener() error {
	st.dropOpener()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fds[1])
	null, err := os.Open(os.DevNull)
	if err != nil {
		unix.Close(fds[0])
		return err
	}
	defer null.Close()
	pid, err := syscall.ForkExec(guestInit, []string{openerName}, &syscall.ProcAttr{
		Dir:   "/",
		Env:   []string{openerEnv + "=1", "GOMAXPROCS=1"},
		Files: []uintptr{null.Fd(), null.Fd(), null.Fd(), uintptr(fds[1])},
		Sys: &syscall.SysProcAttr{Setsid: true,
			Credential: &syscall.Credential{Uid: guestUID, Gid: guestGID, Groups: []uint32{}}},
	})
	if err != nil {
		unix.Close(fds[0])
		return err
	}
	st.files.pid, st.files.sock, st.files.inited = pid, fds[0], true
	return nil
}

// dropOpener forgets the opener: closing its socket makes it exit (one
// stuck in an open dies with the next command's end). It is never killed
// by pid: once reaped, that pid may be a guest's process.
func (st *initState) dropOpener() {
	if st.files.inited && st.files.sock >= 0 {
		_ = unix.Close(st.files.sock)
	}
	st.files.pid, st.files.sock, st.files.inited = 0, -1, false
}
