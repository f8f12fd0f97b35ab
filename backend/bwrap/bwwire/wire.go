// Package bwwire is the conversation between the bubblewrap backend's
// daemon side (backend/bwrap) and a sandbox's init and opener (bwinit): the
// messages both sides encode and check, and the environment the daemon
// gives init. It is its own package so that the init's binary
// (cmd/sandbox-sidecar-init) links it without the daemon's side.
package bwwire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/wirefmt"
)

// The conversation between the daemon and a sandbox's init.
//
// The daemon and init share one Unix SOCK_SEQPACKET socket pair, the control
// socket: init inherits its end as fd ControlFD and is the only process
// in the sandbox holding it. Every message is a fixed-size header
// (MsgSize bytes, little-endian: magic, protocol version, kind, three
// values); the variable part of a request follows the header in the same
// message when it is at most MaxInlineRequest bytes (the header's first
// value says how many), and travels in a memfd otherwise.
//
//	init → daemon, control:  ready                    when init is set up; again (value 1) on each new
//	                         control connection a restarted daemon made on ListenFD
//	daemon → init, control:  run (value: the request's length) + the request + SCM_RIGHTS [status socket, stdin, stdout, stderr], or
//	                         run (value: 0) + SCM_RIGHTS [status socket, request memfd, stdin, stdout, stderr]
//	init → daemon, status:   started (value: the command's pid in the sandbox)
//	                         exited (values: how and with what status it ended, and
//	                         what init did about its budget: TimedNo, TimedTerm, TimedKill), or
//	                         failed (value: errno; the reason was written to its stderr)
//	daemon → init, status:   shutdown(SHUT_WR): kill the command now
//	daemon → init, control:  open + SCM_RIGHTS [reply socket]   (any time, also while a command runs)
//	daemon → opener, reply:  open request (what, path), queued before the socket is handed over
//	opener → daemon, reply:  opened (value: errno) + SCM_RIGHTS [the descriptor] when errno is 0
//	daemon → init, control:  proc start (values: the request's length, 0, whether the OOM counter comes)
//	                         + the agent.Request + SCM_RIGHTS [status, stdin, stdout log, stderr log,
//	                         exit file, OOM counter?], or (length 0) with the request in a memfd
//	                         after the status socket
//	init → daemon, status:   started (value: the process's pid; 0 when it ended at once, its exit
//	                         record says how), or failed (value: errno: init could not start it)
//	daemon → init, control:  proc signal (value B: the signal) + the process's id + SCM_RIGHTS [reply]
//	daemon → init, control:  proc list + SCM_RIGHTS [reply]
//	init → daemon, reply:    proc done (value: ProcOK or ProcUnknown; a list's ids follow, one a line)
//
// A durable process runs under a keeper of init's (backend/agent), which
// writes its output into the two logs and its end into the exit file; the
// daemon made those files and reads them itself, so nothing of a
// process's output or end passes through this socket.
//
// An open request is for a file operation on a path as the guest sees it
// (opener.go): init hands the reply socket to its opener, a process of the
// guest's identity, which opens the path inside the sandbox and sends the
// descriptor back on the reply socket; the daemon only reads it.
//
// The request carries the command's budget: init keeps it itself (a timer
// per command), so the command is exec'd directly, with no GNU timeout in
// front of it.
//
// The status socket is a fresh pair per command, so the daemon reads each
// command's outcome on its own socket and needs no multiplexing; when init
// dies, the daemon's end of every status socket reads EOF. Both sides check
// every header they receive and never trust a length they did not bound.
const (
	MsgSize   = 24
	Magic     = 0x74696e69 // "init"
	Protocol  = 4          // 4: durable processes (proc start, signal, list)
	ControlFD = 3          // init's end of the control socket
	ExeFD     = 4          // init's executable (the small static init, or the daemon's own), which bwrap runs
	// ListenFD is init's listening socket, bound in the sandbox's
	// directory on the host (agent.sock, the daemon's alone): a daemon
	// started after the one that made the sandbox died connects to it and
	// the connection becomes init's control socket.
	ListenFD        = 5
	RunFDs          = 5 // status, request, stdin, stdout, stderr
	InlineFDs       = 4 // status, stdin, stdout, stderr: the request is in the message
	MaxRequestBytes = 4 << 20
	// MaxInlineRequest bounds a request sent in the run message: well
	// within a seqpacket socket's send buffer, and the buffer init keeps
	// for receiving. A command's argv and environment are almost always
	// far smaller; a larger request costs a memfd.
	MaxInlineRequest = 32 << 10
	RequestMagic     = 0x71657272 // "rreq"
)

// Message kinds.
const (
	MsgReady   = 1
	MsgRun     = 2
	MsgStarted = 3
	MsgExited  = 4
	MsgFailed  = 5
	MsgOpen    = 6
	MsgOpened  = 7
	// Durable processes (backend/agent).
	MsgProcStart  = 8
	MsgProcSignal = 9
	MsgProcList   = 10
	MsgProcDone   = 11
	// Code contexts (backend/agent's Contexts).
	MsgCode          = 12 // a cell: header values A (the request's length, 0: in a memfd), + CodeRequest
	MsgCellEnd       = 13 // how a cell ended: A count<<1 | lost (1) or kept (0), B how (proclog.End*), C timed<<8 | code
	MsgContextList   = 14 // answered with a proc done whose payload lists "name running count" lines
	MsgContextDelete = 15 // + the context's name; answered with a proc done
	// MsgCodeWarm starts the zygote ahead of any cell (a warm-pool
	// member's): A the CodeRequest's length (its Env and Preload count) +
	// it + SCM_RIGHTS [reply]; answered with a proc done once the zygote
	// is ready (ProcOK) or could not be (ProcUnknown, the reason after it).
	MsgCodeWarm = 16
	// MsgContextRestart ends a context's process and state and keeps the
	// context (agent.Contexts.Restart): + the context's name; answered
	// with a proc done (ProcUnknown: no such context).
	MsgContextRestart = 17
)

// Descriptors of a code message: status, stdout, stderr, results, then
// the request's memfd when its first value is 0.
const CodeFDs = 4

// CodeRequest is one cell (backend/agent's, which both inits carry).
type CodeRequest = agent.CellRequest

// DecodeCodeRequest reads and checks a cell's request (agent's, within
// this wire's bounds).
func DecodeCodeRequest(b []byte) (CodeRequest, error) {
	if len(b) > MaxRequestBytes {
		return CodeRequest{}, fmt.Errorf("%w: code request: too large", ErrBadMessage)
	}
	r, err := agent.DecodeCellRequest(b)
	if err != nil {
		return CodeRequest{}, fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	if r.Timeout > backend.MaxTimeout || r.Grace > backend.MaxTimeout || len(r.Env) > MaxRequestEnv {
		return CodeRequest{}, fmt.Errorf("%w: code request: bad budget or environment", ErrBadMessage)
	}
	return r, nil
}

// What a proc signal or proc list answers (a proc done's value).
const (
	ProcOK      = 0
	ProcUnknown = 1 // no running process of that id
)

// Descriptors of a proc start: status, stdin, the two logs and the exit
// file, then the OOM counter when its third value says so; with the
// request in a memfd, that comes second.
const (
	ProcStartFDs = 5
	// MaxProcList bounds a proc list's answer.
	MaxProcList = 64 << 10
)

// How a command ended (the si_code of waitid).
const (
	EndExited = 1 // CLD_EXITED: the value is the exit status
	EndKilled = 2 // CLD_KILLED: the value is the signal
	EndDumped = 3 // CLD_DUMPED: the value is the signal
)

// What init did about a command's budget, in an exited message (its third
// value).
const (
	TimedNo   = 0 // the command ended within its budget
	TimedTerm = 1 // init sent the command's process group SIGTERM at the budget
	TimedKill = 2 // and, the grace spent, SIGKILL to every process of the sandbox
)

// Msg is one header.
type Msg struct {
	Kind    uint32
	A, B, C uint32
}

func (m Msg) Encode() []byte {
	buf := make([]byte, MsgSize)
	binary.LittleEndian.PutUint32(buf[0:], Magic)
	binary.LittleEndian.PutUint32(buf[4:], Protocol)
	binary.LittleEndian.PutUint32(buf[8:], m.Kind)
	binary.LittleEndian.PutUint32(buf[12:], m.A)
	binary.LittleEndian.PutUint32(buf[16:], m.B)
	binary.LittleEndian.PutUint32(buf[20:], m.C)
	return buf
}

var ErrBadMessage = errors.New("malformed message")

// DecodeMsg checks that buf is exactly one header of our protocol.
func DecodeMsg(buf []byte) (Msg, error) {
	if len(buf) != MsgSize {
		return Msg{}, fmt.Errorf("%w: %d bytes, want %d", ErrBadMessage, len(buf), MsgSize)
	}
	if binary.LittleEndian.Uint32(buf[0:]) != Magic || binary.LittleEndian.Uint32(buf[4:]) != Protocol {
		return Msg{}, fmt.Errorf("%w: wrong magic or protocol version", ErrBadMessage)
	}
	m := Msg{
		Kind: binary.LittleEndian.Uint32(buf[8:]),
		A:    binary.LittleEndian.Uint32(buf[12:]),
		B:    binary.LittleEndian.Uint32(buf[16:]),
		C:    binary.LittleEndian.Uint32(buf[20:]),
	}
	if m.Kind < MsgReady || m.Kind > MsgContextRestart {
		return Msg{}, fmt.Errorf("%w: unknown kind %d", ErrBadMessage, m.Kind)
	}
	return m, nil
}

// ExitCode turns an exited message into the status a shell would report
// (the exit status, or 128+N for a command killed by signal N) and whether
// init stopped the command at its budget. A timed-out command's status is
// what GNU timeout gave: 124 (backend.ExitTimedOut), or 137
// (backend.ExitKilled) when SIGKILL was needed.
func (m Msg) ExitCode() (code int, timedOut bool, err error) {
	valid := m.Kind == MsgExited &&
		(m.A == EndExited && m.B <= 255 || (m.A == EndKilled || m.A == EndDumped) && m.B >= 1 && m.B <= 64)
	switch {
	case !valid:
	case m.C == TimedTerm:
		return backend.ExitTimedOut, true, nil
	case m.C == TimedKill:
		return backend.ExitKilled, true, nil
	case m.C != TimedNo:
	case m.A == EndExited:
		return int(m.B), false, nil
	default:
		return 128 + int(m.B), false, nil
	}
	return 0, false, fmt.Errorf("%w: not a valid exit (kind %d, %d/%d/%d)", ErrBadMessage, m.Kind, m.A, m.B, m.C)
}

// What an open request opens a path for.
const (
	OpenRead = 1 // reading: O_RDONLY
	OpenList = 2 // listing: O_RDONLY|O_DIRECTORY
)

// OpenRequest is one path to open inside the sandbox, as the guest.
type OpenRequest struct {
	What uint32 // OpenRead or OpenList
	Path string // absolute, as the guest sees it; resolved by the guest's kernel
}

// Encode gives the request's one datagram: a header (kind MsgOpen, the
// what, the path's length), then the path.
func (r OpenRequest) Encode() []byte {
	return append(Msg{Kind: MsgOpen, A: r.What, B: uint32(len(r.Path))}.Encode(), r.Path...)
}

// DecodeOpenRequest checks that buf is one open request: our header, a
// known what, a length that is the rest of the datagram, an absolute path
// without NUL within backend.MaxGuestPathLen.
func DecodeOpenRequest(buf []byte) (OpenRequest, error) {
	if len(buf) < MsgSize {
		return OpenRequest{}, fmt.Errorf("%w: open request of %d bytes", ErrBadMessage, len(buf))
	}
	m, err := DecodeMsg(buf[:MsgSize])
	if err != nil {
		return OpenRequest{}, err
	}
	p := buf[MsgSize:]
	switch {
	case m.Kind != MsgOpen:
		return OpenRequest{}, fmt.Errorf("%w: kind %d, not an open request", ErrBadMessage, m.Kind)
	case m.A != OpenRead && m.A != OpenList:
		return OpenRequest{}, fmt.Errorf("%w: open for %d", ErrBadMessage, m.A)
	case int64(m.B) != int64(len(p)) || len(p) == 0 || len(p) > backend.MaxGuestPathLen:
		return OpenRequest{}, fmt.Errorf("%w: a path of %d bytes said %d", ErrBadMessage, len(p), m.B)
	case p[0] != '/' || bytes.IndexByte(p, 0) >= 0:
		return OpenRequest{}, fmt.Errorf("%w: the path is not absolute or holds a NUL", ErrBadMessage)
	}
	return OpenRequest{What: m.A, Path: string(p)}, nil
}

// RunRequest is what init needs to start one command.
type RunRequest struct {
	Argv []string // the command: argv[0] a path, or a name looked up in env's PATH
	Env  []string // "NAME=value", the whole environment
	Cwd  string   // absolute, inside the sandbox
	// Timeout is the command's budget and KillAfter the grace between
	// SIGTERM and SIGKILL, both whole milliseconds (backend.GuestTimeout),
	// Timeout at least one.
	Timeout, KillAfter time.Duration
}

// Bounds init applies to a request, beyond the total size.
const (
	MaxRequestArgv = backend.MaxArgv
	MaxRequestEnv  = 1 << 16
)

func (r RunRequest) Encode() []byte {
	buf := make([]byte, 0, 12+wirefmt.ListSize(r.Argv)+wirefmt.ListSize(r.Env)+4+len(r.Cwd))
	buf = binary.LittleEndian.AppendUint32(buf, RequestMagic)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(r.Timeout.Milliseconds()))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(r.KillAfter.Milliseconds()))
	buf = wirefmt.AppendList(buf, r.Argv)
	buf = wirefmt.AppendList(buf, r.Env)
	return wirefmt.AppendString(buf, r.Cwd)
}

// DecodeRunRequest parses and checks a request: a budget of at least a
// millisecond and at most backend.MaxTimeout (and a grace no longer), every
// count and length within what is left, no NUL anywhere, a non-empty argv,
// every environment entry NAME=value, an absolute clean cwd, nothing
// trailing.
func DecodeRunRequest(buf []byte) (RunRequest, error) {
	bad := func(format string, args ...any) (RunRequest, error) {
		return RunRequest{}, fmt.Errorf("%w: request: "+format, append([]any{ErrBadMessage}, args...)...)
	}
	if len(buf) > MaxRequestBytes {
		return bad("%d bytes, more than %d", len(buf), MaxRequestBytes)
	}
	d := wirefmt.NewDecoder(buf)
	if magic, ok := d.U32(); !ok || magic != RequestMagic {
		return bad("wrong magic")
	}
	var r RunRequest
	timeout, ok1 := d.U32()
	killAfter, ok2 := d.U32()
	if !ok1 || !ok2 {
		return bad("no budget")
	}
	r.Timeout, r.KillAfter = time.Duration(timeout)*time.Millisecond, time.Duration(killAfter)*time.Millisecond
	if r.Timeout < time.Millisecond || r.Timeout > backend.MaxTimeout || r.KillAfter > backend.MaxTimeout {
		return bad("budget %v (grace %v) is not within 1ms and %v", r.Timeout, r.KillAfter, backend.MaxTimeout)
	}
	var err error
	if r.Argv, r.Env, r.Cwd, err = d.Command(MaxRequestArgv, MaxRequestEnv); err != nil {
		return bad("%v", err)
	}
	if d.Left() != 0 {
		return bad("%d bytes trailing", d.Left())
	}
	return r, nil
}

// InitEnv is set (to "1") in the environment bwrap gives a sandbox's init,
// and nowhere else: it is how the init's binary, run inside the sandbox,
// knows it is init.
const InitEnv = "SANDBOX_SIDECAR_INIT"

// Threads is how many OS threads init starts before any command, so
// that its runtime finds an idle one whenever it needs one later, when the
// sandbox's processes and threads are capped (initproc.ReserveThreads).
const Threads = 8

// RlimitsEnv carries the sandbox's rlimits to its init, which sets them
// on itself before it says it is ready, so every command inherits them (and,
// hard limits being equal to soft ones, cannot raise them). The value is
// "resource=value" pairs (RLIMIT_* numbers) separated by commas.
const RlimitsEnv = "SANDBOX_SIDECAR_RLIMITS"

// ThreadsEnv carries how many threads init reserves before its first
// command (initproc.ReserveThreads; see backend/bwrap's reservedThreads): a decimal count.
const ThreadsEnv = "SANDBOX_SIDECAR_INIT_THREADS"

// MaxThreads bounds what init accepts in ThreadsEnv.
const MaxThreads = 64

// DecodeThreads is the count init reserves for ThreadsEnv's value
// s: a decimal within MaxThreads, else Threads (the safe side:
// a value init cannot read never costs it its reserve).
func DecodeThreads(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > MaxThreads {
		return Threads
	}
	return n
}

// MaxRlimits bounds what init accepts in RlimitsEnv.
const MaxRlimits = 16

// rlimNLimits is Linux's RLIM_NLIMITS: resources are 0..15.
const rlimNLimits = 16

// Rlimit is one resource limit as init sets it on itself: soft and hard
// limit both Value (sandbox/limits' Rlimit, which the init does not link).
type Rlimit struct {
	Resource int // an RLIMIT_* number
	Value    uint64
}

// EncodeRlimits gives RlimitsEnv's value for rls.
func EncodeRlimits(rls []Rlimit) string {
	parts := make([]string, 0, len(rls))
	for _, r := range rls {
		parts = append(parts, strconv.Itoa(r.Resource)+"="+strconv.FormatUint(r.Value, 10))
	}
	return strings.Join(parts, ",")
}

// DecodeRlimits parses EncodeRlimits' output.
func DecodeRlimits(s string) ([]Rlimit, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > MaxRlimits {
		return nil, fmt.Errorf("%d rlimits, more than %d", len(parts), MaxRlimits)
	}
	out := make([]Rlimit, 0, len(parts))
	for _, p := range parts {
		k, v, ok := strings.Cut(p, "=")
		res, err1 := strconv.Atoi(k)
		val, err2 := strconv.ParseUint(v, 10, 64)
		if !ok || err1 != nil || err2 != nil || res < 0 || res >= rlimNLimits {
			return nil, fmt.Errorf("malformed rlimit %q", p)
		}
		out = append(out, Rlimit{Resource: res, Value: val})
	}
	return out, nil
}

// ReceivedFDs returns every descriptor in SCM_RIGHTS messages of oob.
func ReceivedFDs(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if got, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds
}
