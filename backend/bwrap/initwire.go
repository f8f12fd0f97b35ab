package bwrap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/wirefmt"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

// The conversation between the daemon and a sandbox's init.
//
// The daemon and init share one Unix SOCK_SEQPACKET socket pair, the control
// socket: init inherits its end as fd initControlFD and is the only process
// in the sandbox holding it. Every message is a fixed-size header
// (initMsgSize bytes, little-endian: magic, protocol version, kind, three
// values); the variable part of a request follows the header in the same
// message when it is at most maxInlineRequest bytes (the header's first
// value says how many), and travels in a memfd otherwise.
//
//	init → daemon, control:  ready                    once, when init is set up
//	daemon → init, control:  run (value: the request's length) + the request + SCM_RIGHTS [status socket, stdin, stdout, stderr], or
//	                         run (value: 0) + SCM_RIGHTS [status socket, request memfd, stdin, stdout, stderr]
//	init → daemon, status:   started (value: the command's pid in the sandbox)
//	                         exited (values: how and with what status it ended, and
//	                         what init did about its budget: timedNo, timedTerm, timedKill), or
//	                         failed (value: errno; the reason was written to its stderr)
//	daemon → init, status:   shutdown(SHUT_WR): kill the command now
//	daemon → init, control:  open + SCM_RIGHTS [reply socket]   (any time, also while a command runs)
//	daemon → opener, reply:  open request (what, path), queued before the socket is handed over
//	opener → daemon, reply:  opened (value: errno) + SCM_RIGHTS [the descriptor] when errno is 0
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
	initMsgSize     = 24
	initMagic       = 0x74696e69 // "init"
	initProtocol    = 3          // 3: a small request travels in the run message itself
	initControlFD   = 3          // init's end of the control socket
	initExeFD       = 4          // the daemon's executable, which bwrap runs as init
	initRunFDs      = 5          // status, request, stdin, stdout, stderr
	initInlineFDs   = 4          // status, stdin, stdout, stderr: the request is in the message
	maxRequestBytes = 4 << 20
	// maxInlineRequest bounds a request sent in the run message: well
	// within a seqpacket socket's send buffer, and the buffer init keeps
	// for receiving. A command's argv and environment are almost always
	// far smaller; a larger request costs a memfd.
	maxInlineRequest = 32 << 10
	requestMagic     = 0x71657272 // "rreq"
)

// Message kinds.
const (
	msgReady   = 1
	msgRun     = 2
	msgStarted = 3
	msgExited  = 4
	msgFailed  = 5
	msgOpen    = 6
	msgOpened  = 7
)

// How a command ended (the si_code of waitid).
const (
	endExited = 1 // CLD_EXITED: the value is the exit status
	endKilled = 2 // CLD_KILLED: the value is the signal
	endDumped = 3 // CLD_DUMPED: the value is the signal
)

// What init did about a command's budget, in an exited message (its third
// value).
const (
	timedNo   = 0 // the command ended within its budget
	timedTerm = 1 // init sent the command's process group SIGTERM at the budget
	timedKill = 2 // and, the grace spent, SIGKILL to every process of the sandbox
)

// initMsg is one header.
type initMsg struct {
	kind    uint32
	a, b, c uint32
}

func (m initMsg) encode() []byte {
	buf := make([]byte, initMsgSize)
	binary.LittleEndian.PutUint32(buf[0:], initMagic)
	binary.LittleEndian.PutUint32(buf[4:], initProtocol)
	binary.LittleEndian.PutUint32(buf[8:], m.kind)
	binary.LittleEndian.PutUint32(buf[12:], m.a)
	binary.LittleEndian.PutUint32(buf[16:], m.b)
	binary.LittleEndian.PutUint32(buf[20:], m.c)
	return buf
}

var errBadMessage = errors.New("malformed message")

// decodeInitMsg checks that buf is exactly one header of our protocol.
func decodeInitMsg(buf []byte) (initMsg, error) {
	if len(buf) != initMsgSize {
		return initMsg{}, fmt.Errorf("%w: %d bytes, want %d", errBadMessage, len(buf), initMsgSize)
	}
	if binary.LittleEndian.Uint32(buf[0:]) != initMagic || binary.LittleEndian.Uint32(buf[4:]) != initProtocol {
		return initMsg{}, fmt.Errorf("%w: wrong magic or protocol version", errBadMessage)
	}
	m := initMsg{
		kind: binary.LittleEndian.Uint32(buf[8:]),
		a:    binary.LittleEndian.Uint32(buf[12:]),
		b:    binary.LittleEndian.Uint32(buf[16:]),
		c:    binary.LittleEndian.Uint32(buf[20:]),
	}
	if m.kind < msgReady || m.kind > msgOpened {
		return initMsg{}, fmt.Errorf("%w: unknown kind %d", errBadMessage, m.kind)
	}
	return m, nil
}

// exitCode turns an exited message into the status a shell would report
// (the exit status, or 128+N for a command killed by signal N) and whether
// init stopped the command at its budget. A timed-out command's status is
// what GNU timeout gave: 124 (backend.ExitTimedOut), or 137
// (backend.ExitKilled) when SIGKILL was needed.
func (m initMsg) exitCode() (code int, timedOut bool, err error) {
	valid := m.kind == msgExited &&
		(m.a == endExited && m.b <= 255 || (m.a == endKilled || m.a == endDumped) && m.b >= 1 && m.b <= 64)
	switch {
	case !valid:
	case m.c == timedTerm:
		return backend.ExitTimedOut, true, nil
	case m.c == timedKill:
		return backend.ExitKilled, true, nil
	case m.c != timedNo:
	case m.a == endExited:
		return int(m.b), false, nil
	default:
		return 128 + int(m.b), false, nil
	}
	return 0, false, fmt.Errorf("%w: not a valid exit (kind %d, %d/%d/%d)", errBadMessage, m.kind, m.a, m.b, m.c)
}

// What an open request opens a path for.
const (
	openRead = 1 // reading: O_RDONLY
	openList = 2 // listing: O_RDONLY|O_DIRECTORY
)

// openRequest is one path to open inside the sandbox, as the guest.
type openRequest struct {
	what uint32 // openRead or openList
	path string // absolute, as the guest sees it; resolved by the guest's kernel
}

// encode gives the request's one datagram: a header (kind msgOpen, the
// what, the path's length), then the path.
func (r openRequest) encode() []byte {
	return append(initMsg{kind: msgOpen, a: r.what, b: uint32(len(r.path))}.encode(), r.path...)
}

// decodeOpenRequest checks that buf is one open request: our header, a
// known what, a length that is the rest of the datagram, an absolute path
// without NUL within backend.MaxGuestPathLen.
func decodeOpenRequest(buf []byte) (openRequest, error) {
	if len(buf) < initMsgSize {
		return openRequest{}, fmt.Errorf("%w: open request of %d bytes", errBadMessage, len(buf))
	}
	m, err := decodeInitMsg(buf[:initMsgSize])
	if err != nil {
		return openRequest{}, err
	}
	p := buf[initMsgSize:]
	switch {
	case m.kind != msgOpen:
		return openRequest{}, fmt.Errorf("%w: kind %d, not an open request", errBadMessage, m.kind)
	case m.a != openRead && m.a != openList:
		return openRequest{}, fmt.Errorf("%w: open for %d", errBadMessage, m.a)
	case int64(m.b) != int64(len(p)) || len(p) == 0 || len(p) > backend.MaxGuestPathLen:
		return openRequest{}, fmt.Errorf("%w: a path of %d bytes said %d", errBadMessage, len(p), m.b)
	case p[0] != '/' || bytes.IndexByte(p, 0) >= 0:
		return openRequest{}, fmt.Errorf("%w: the path is not absolute or holds a NUL", errBadMessage)
	}
	return openRequest{what: m.a, path: string(p)}, nil
}

// runRequest is what init needs to start one command.
type runRequest struct {
	argv []string // the command: argv[0] a path, or a name looked up in env's PATH
	env  []string // "NAME=value", the whole environment
	cwd  string   // absolute, inside the sandbox
	// timeout is the command's budget and killAfter the grace between
	// SIGTERM and SIGKILL, both whole milliseconds (backend.GuestTimeout),
	// timeout at least one.
	timeout, killAfter time.Duration
}

// Bounds init applies to a request, beyond the total size.
const (
	maxRequestArgv = backend.MaxArgv
	maxRequestEnv  = 1 << 16
)

func (r runRequest) encode() []byte {
	buf := make([]byte, 0, 12+wirefmt.ListSize(r.argv)+wirefmt.ListSize(r.env)+4+len(r.cwd))
	buf = binary.LittleEndian.AppendUint32(buf, requestMagic)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(r.timeout.Milliseconds()))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(r.killAfter.Milliseconds()))
	buf = wirefmt.AppendList(buf, r.argv)
	buf = wirefmt.AppendList(buf, r.env)
	return wirefmt.AppendString(buf, r.cwd)
}

// decodeRunRequest parses and checks a request: a budget of at least a
// millisecond and at most backend.MaxTimeout (and a grace no longer), every
// count and length within what is left, no NUL anywhere, a non-empty argv,
// every environment entry NAME=value, an absolute clean cwd, nothing
// trailing.
func decodeRunRequest(buf []byte) (runRequest, error) {
	bad := func(format string, args ...any) (runRequest, error) {
		return runRequest{}, fmt.Errorf("%w: request: "+format, append([]any{errBadMessage}, args...)...)
	}
	if len(buf) > maxRequestBytes {
		return bad("%d bytes, more than %d", len(buf), maxRequestBytes)
	}
	d := wirefmt.NewDecoder(buf)
	if magic, ok := d.U32(); !ok || magic != requestMagic {
		return bad("wrong magic")
	}
	var r runRequest
	timeout, ok1 := d.U32()
	killAfter, ok2 := d.U32()
	if !ok1 || !ok2 {
		return bad("no budget")
	}
	r.timeout, r.killAfter = time.Duration(timeout)*time.Millisecond, time.Duration(killAfter)*time.Millisecond
	if r.timeout < time.Millisecond || r.timeout > backend.MaxTimeout || r.killAfter > backend.MaxTimeout {
		return bad("budget %v (grace %v) is not within 1ms and %v", r.timeout, r.killAfter, backend.MaxTimeout)
	}
	var ok bool
	if r.argv, ok = d.List(maxRequestArgv); !ok {
		return bad("bad argv")
	}
	if r.env, ok = d.List(maxRequestEnv); !ok {
		return bad("bad environment")
	}
	if r.cwd, ok = d.String(); !ok {
		return bad("bad working directory")
	}
	switch {
	case d.Left() != 0:
		return bad("%d bytes trailing", d.Left())
	case len(r.argv) == 0 || r.argv[0] == "":
		return bad("argv is empty")
	}
	if err := wirefmt.CheckCommand(r.env, r.cwd); err != nil {
		return bad("%v", err)
	}
	return r, nil
}

// initRlimitsEnv carries the sandbox's rlimits to its init, which sets them
// on itself before it says it is ready, so every command inherits them (and,
// hard limits being equal to soft ones, cannot raise them). The value is
// "resource=value" pairs (RLIMIT_* numbers) separated by commas.
const initRlimitsEnv = "SANDBOX_SIDECAR_RLIMITS"

// initThreadsEnv carries how many threads init reserves before its first
// command (initproc.ReserveThreads; see reservedThreads): a decimal count.
const initThreadsEnv = "SANDBOX_SIDECAR_INIT_THREADS"

// maxInitThreads bounds what init accepts in initThreadsEnv.
const maxInitThreads = 64

// decodeInitThreads is the count init reserves for initThreadsEnv's value
// s: a decimal within maxInitThreads, else initThreads (the safe side:
// a value init cannot read never costs it its reserve).
func decodeInitThreads(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > maxInitThreads {
		return initThreads
	}
	return n
}

// maxInitRlimits bounds what init accepts in initRlimitsEnv.
const maxInitRlimits = 16

// rlimNLimits is Linux's RLIM_NLIMITS: resources are 0..15.
const rlimNLimits = 16

func encodeRlimits(rls []limits.Rlimit) string {
	parts := make([]string, 0, len(rls))
	for _, r := range rls {
		parts = append(parts, strconv.Itoa(r.Resource)+"="+strconv.FormatUint(r.Value, 10))
	}
	return strings.Join(parts, ",")
}

// decodeRlimits parses encodeRlimits' output.
func decodeRlimits(s string) ([]limits.Rlimit, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > maxInitRlimits {
		return nil, fmt.Errorf("%d rlimits, more than %d", len(parts), maxInitRlimits)
	}
	out := make([]limits.Rlimit, 0, len(parts))
	for _, p := range parts {
		k, v, ok := strings.Cut(p, "=")
		res, err1 := strconv.Atoi(k)
		val, err2 := strconv.ParseUint(v, 10, 64)
		if !ok || err1 != nil || err2 != nil || res < 0 || res >= rlimNLimits {
			return nil, fmt.Errorf("malformed rlimit %q", p)
		}
		out = append(out, limits.Rlimit{Resource: res, Value: val})
	}
	return out, nil
}

// applyOwnRlimits sets the rlimits in initRlimitsEnv on the calling process.
//
// Without an open-files limit (open_files 0) it sets NOFILE's soft limit
// to its hard one: the Go runtime raised init's own soft limit to one
// below the hard at start, and initproc.Spawn, unlike the runtime's own
// fork, does not put the original back in the command; the command would
// inherit that odd figure. Soft = hard is what a sandbox gets with a
// limit, and what the gVisor backend's commands get without one.
func applyOwnRlimits(env string) error {
	rls, err := decodeRlimits(env)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(rls, func(r limits.Rlimit) bool { return r.Resource == unix.RLIMIT_NOFILE }) {
		var cur unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &cur); err != nil {
			return fmt.Errorf("getrlimit NOFILE: %w", err)
		}
		rls = append(rls, limits.Rlimit{Resource: unix.RLIMIT_NOFILE, Value: cur.Max})
	}
	for _, r := range rls {
		// A limit above the hard limit init was started with cannot be
		// raised without privilege: keep the (stricter) hard limit.
		var cur unix.Rlimit
		if err := unix.Getrlimit(r.Resource, &cur); err == nil && r.Value > cur.Max {
			r.Value = cur.Max
		}
		lim := unix.Rlimit{Cur: r.Value, Max: r.Value}
		if err := unix.Setrlimit(r.Resource, &lim); err != nil {
			return fmt.Errorf("setrlimit %d=%d: %w", r.Resource, r.Value, err)
		}
	}
	return nil
}
