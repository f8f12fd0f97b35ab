package bwinit

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap/bwwire"
)

// Code contexts (run_code): init hands each cell to agent.Contexts, which
// runs it in its context (a fork of the zygote), and answers on the cell's
// status socket.

// cellReply answers one cell on its status socket.
type cellReply struct{ status int }

func (r cellReply) Started() {
	_ = unix.Sendmsg(r.status, bwwire.Msg{Kind: bwwire.MsgStarted}.Encode(), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
}

func (r cellReply) Ended(e agent.CellEnd) {
	m := bwwire.Msg{Kind: bwwire.MsgCellEnd, A: uint32(min(max(e.Count, 0), 1<<31-1)) << 1, B: e.How, C: e.Timed<<8 | e.Code&0xff}
	if e.Lost {
		m.A |= 1
	}
	_ = unix.Sendmsg(r.status, m.Encode(), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
	_ = unix.Close(r.status)
}

func (r cellReply) Failed(errno unix.Errno, reason string) {
	if len(reason) > 1024 {
		reason = reason[:1024]
	}
	_ = unix.Sendmsg(r.status, append(bwwire.Msg{Kind: bwwire.MsgFailed, A: uint32(errno), B: uint32(len(reason))}.Encode(), reason...), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
	_ = unix.Close(r.status)
}

// runCell takes a code message: it decodes the cell's request and hands
// the cell to the contexts. It takes every descriptor in fds.
func (st *initState) runCell(m bwwire.Msg, payload []byte, fds []int) {
	want := bwwire.CodeFDs
	if m.A == 0 {
		want++
	}
	if len(fds) != want || int64(m.A) != int64(len(payload)) {
		fmt.Fprintf(os.Stderr, "sandbox init: ignoring a code message: %d descriptors, want %d\n", len(fds), want)
		closeFDs(fds)
		return
	}
	status := fds[0]
	if err := checkStatusSocket(status); err != nil {
		closeFDs(fds)
		return
	}
	reply := cellReply{status: status}
	raw := payload
	if m.A == 0 {
		b, _, err := readBounded(fds[4])
		_ = unix.Close(fds[4])
		if err != nil {
			closeFDs(fds[1:4])
			reply.Failed(unix.EINVAL, err.Error())
			return
		}
		raw = b
	}
	req, err := bwwire.DecodeCodeRequest(raw)
	if err != nil {
		closeFDs(fds[1:4])
		reply.Failed(unix.EINVAL, err.Error())
		return
	}
	st.codeReady()
	st.children = true
	st.code.RunCell(req, fds[1], fds[2], fds[3], reply)
}

// codeReady sets up init's contexts on first use.
func (st *initState) codeReady() {
	if st.code.Table == nil {
		st.code = agent.Contexts{Table: &st.procs, Cwd: "/workspace"}
	}
}

// warmCode takes a code warm message: it starts the zygote with the
// request's environment and preloads, unless one runs, and answers on
// reply once it is ready or could not be.
func (st *initState) warmCode(m bwwire.Msg, payload []byte, reply int) {
	answer := func(err error) {
		msg := bwwire.Msg{Kind: bwwire.MsgProcDone, A: bwwire.ProcOK}
		var body []byte
		if err != nil {
			body = []byte(err.Error())
			if len(body) > 1024 {
				body = body[:1024]
			}
			msg.A, msg.B = bwwire.ProcUnknown, uint32(len(body))
		}
		_ = unix.Sendmsg(reply, append(msg.Encode(), body...), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
		_ = unix.Close(reply)
	}
	if err := checkStatusSocket(reply); err != nil {
		_ = unix.Close(reply)
		return
	}
	req, err := bwwire.DecodeCodeRequest(payload)
	if err != nil || int64(m.A) != int64(len(payload)) {
		answer(fmt.Errorf("%w: a code warm request of %d bytes said %d", bwwire.ErrBadMessage, len(payload), m.A))
		return
	}
	st.codeReady()
	st.code.Max = int(req.MaxContexts)
	st.children = true
	st.code.Prestart(req.Env, req.Preload, answer)
}

// contextRequest answers a context list, delete or restart on reply, and
// closes it.
func (st *initState) contextRequest(m bwwire.Msg, payload []byte, reply int) {
	defer unix.Close(reply)
	answer := bwwire.Msg{Kind: bwwire.MsgProcDone, A: bwwire.ProcOK}
	var body []byte
	switch m.Kind {
	case bwwire.MsgContextList:
		body = st.code.ListText()
		answer.B = uint32(len(body))
	case bwwire.MsgContextDelete:
		if !st.code.Delete(string(payload)) {
			answer.A = bwwire.ProcUnknown
		}
	case bwwire.MsgContextRestart:
		if !st.code.Restart(string(payload)) {
			answer.A = bwwire.ProcUnknown
		}
	}
	_ = unix.Sendmsg(reply, append(answer.Encode(), body...), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// readBounded reads a request memfd (a regular file within
// bwwire.MaxRequestBytes).
func readBounded(fd int) ([]byte, int64, error) {
	var stat unix.Stat_t
	if err := unix.Fstat(fd, &stat); err != nil {
		return nil, 0, err
	}
	if stat.Mode&unix.S_IFMT != unix.S_IFREG || stat.Size < 0 || stat.Size > bwwire.MaxRequestBytes {
		return nil, 0, fmt.Errorf("%w: the request is not a regular file within %d bytes", bwwire.ErrBadMessage, bwwire.MaxRequestBytes)
	}
	buf := make([]byte, stat.Size)
	if n, err := unix.Pread(fd, buf, 0); err != nil || int64(n) != stat.Size {
		return nil, 0, fmt.Errorf("%w: the request could not be read", bwwire.ErrBadMessage)
	}
	return buf, stat.Size, nil
}
