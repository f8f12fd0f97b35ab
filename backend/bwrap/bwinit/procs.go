package bwinit

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap/bwwire"
)

// startProc starts a durable process under a keeper (backend/agent) and
// answers on its status socket once the keeper says it started. It takes
// every descriptor in fds.
func (st *initState) startProc(m bwwire.Msg, payload []byte, fds []int) {
	want := bwwire.ProcStartFDs + int(m.C&1)
	if m.A == 0 {
		want++ // the request's memfd
	}
	closeAll := func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}
	if len(fds) != want || int64(m.A) != int64(len(payload)) || m.C > 1 {
		fmt.Fprintf(os.Stderr, "sandbox init: ignoring a proc start: %d descriptors, want %d\n", len(fds), want)
		closeAll()
		return
	}
	status := fds[0]
	if err := checkStatusSocket(status); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox init: ignoring a proc start: %v\n", err)
		closeAll()
		return
	}
	failed := func(err error) {
		errno, ok := errors.AsType[unix.Errno](err)
		if !ok {
			errno = unix.EINVAL
		}
		_ = unix.Sendmsg(status, bwwire.Msg{Kind: bwwire.MsgFailed, A: uint32(errno)}.Encode(), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
		_ = unix.Close(status)
	}
	rest := fds[1:]
	var reqFD int
	if m.A == 0 {
		reqFD, rest = rest[0], rest[1:]
	} else {
		fd, err := unix.MemfdCreate("sandbox-proc-request", unix.MFD_CLOEXEC)
		if err == nil {
			if _, err = unix.Write(fd, payload); err != nil {
				_ = unix.Close(fd)
			}
		}
		if err != nil {
			for _, fd := range rest {
				_ = unix.Close(fd)
			}
			failed(err)
			return
		}
		reqFD = fd
	}
	files := agent.Files{Stdin: rest[0], Stdout: rest[1], Stderr: rest[2], Exit: rest[3], Request: reqFD, OOM: -1}
	if m.C&1 != 0 {
		files.OOM = rest[4]
	}
	id, err := requestID(reqFD)
	if err != nil {
		files.Close()
		failed(err)
		return
	}
	err = st.procs.Start(id, files, func(pid int) {
		_ = unix.Sendmsg(status, bwwire.Msg{Kind: bwwire.MsgStarted, A: uint32(pid)}.Encode(), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
		_ = unix.Close(status)
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandbox init: process %s: %v\n", id, err)
		switch {
		case errors.Is(err, agent.ErrTooMany):
			err = unix.EAGAIN
		case errors.Is(err, agent.ErrGivenUp):
			err = unix.ESTALE
		}
		failed(err)
		return
	}
	st.children = true
}

// requestID reads the process's id from its request (the keeper checks
// the rest).
func requestID(fd int) (string, error) {
	var stat unix.Stat_t
	if err := unix.Fstat(fd, &stat); err != nil {
		return "", err
	}
	if stat.Mode&unix.S_IFMT != unix.S_IFREG || stat.Size <= 0 || stat.Size > agent.MaxRequestSize {
		return "", unix.EINVAL
	}
	buf := make([]byte, stat.Size)
	if n, err := unix.Pread(fd, buf, 0); err != nil || int64(n) != stat.Size {
		return "", unix.EINVAL
	}
	r, err := agent.DecodeRequest(buf)
	if err != nil {
		return "", unix.EINVAL
	}
	return r.ID, nil
}

// procRequest answers a proc signal or a proc list on reply, and closes
// it.
func (st *initState) procRequest(m bwwire.Msg, payload []byte, reply int) {
	defer unix.Close(reply)
	answer := bwwire.Msg{Kind: bwwire.MsgProcDone, A: bwwire.ProcOK}
	var body []byte
	switch m.Kind {
	case bwwire.MsgProcSignal:
		id := string(payload)
		if !agent.ValidID(id) || m.B == 0 || m.B > 64 {
			answer.A = bwwire.ProcUnknown
		} else if err := st.procs.Signal(id, unix.Signal(m.B)); err != nil {
			answer.A = bwwire.ProcUnknown
		}
	case bwwire.MsgProcList:
		body = []byte(strings.Join(st.procs.Running(), "\n"))
		answer.B = uint32(len(body))
	}
	_ = unix.Sendmsg(reply, append(answer.Encode(), body...), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
}
