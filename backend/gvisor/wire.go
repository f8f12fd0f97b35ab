package gvisor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/wirefmt"
)

// The conversation between the daemon and a sandbox's init.
//
// Init is the container's process (pid 1 inside gVisor). Its stdin and
// stdout are two host pipes whose other ends only the daemon holds: runsc
// donates the container process's stdio to the sandbox as host files, and
// nothing else of the host reaches the guest that way. bubblewrap's init
// protocol does not fit here: it hands init each command's pipes with
// SCM_RIGHTS, and a descriptor cannot cross gVisor's boundary after the
// sandbox started (the sentry does not accept host descriptors in control
// messages). A Unix socket on a bind mount would need --host-uds, which lets
// every guest process connect to host sockets on its mounts. So one ordered
// byte stream each way carries frames:
//
//	init → daemon:  ready (protocol)          once, when init is set up: the
//	                                          protocol version it speaks (u32)
//	daemon → init:  run (request)             one command: argv, env, cwd, stdin
//	init → daemon:  failed (reason: the command did not start)
//	init → daemon:  stdout / stderr (bytes)   the command's output, in chunks
//	init → daemon:  exited (how, value, timed) after every process the command
//	                                          started is dead and its output sent
//	daemon → init:  kill                      kill the command now
//	daemon → init:  lstat (path)              what the guest sees at path
//	init → daemon:  lstat result (type, errno)
//	daemon → init:  file op; init → daemon: file data..., file done (filewire.go)
//
// A frame is a kind byte, three zero bytes and a little-endian u32 payload
// length, then the payload. Both sides check every header and bound every
// length before reading it. Output and the exit share one stream, so the
// daemon has all of a command's output when it reads its exit.
const (
	frameHeaderSize = 8
	// maxChunk bounds an output frame's payload (init sends at most this).
	maxChunk = 64 << 10
	// maxRunPayload bounds a run request: argv and env (backend.MaxExecBytes
	// and the environment's 1 MiB) plus stdin (maxStdinBytes).
	maxRunPayload = maxStdinBytes + 4<<20
	// maxStdinBytes bounds a command's stdin, which travels in its request.
	maxStdinBytes = 32 << 20
	// maxReasonBytes bounds a failed frame's text.
	maxReasonBytes = 4 << 10
	requestMagic   = 0x71657267 // "greq"
)

// Frame kinds.
const (
	kindReady = 1
	kindRun   = 2
	kindKill  = 3
	// 4 was "started" (the command's pid), which the daemon never used:
	// a frame less to write, and to wake the daemon for, per command
	// (protocol 2).
	kindStdout  = 5
	kindStderr  = 6
	kindExited  = 7
	kindFailed  = 8
	kindLstat   = 9
	kindLstated = 10
	// File operations on the guest's view (filewire.go).
	kindFileOp   = 11
	kindFileData = 12
	kindFileDone = 13
)

// How a command ended (the si_code of waitid).
const (
	endExited = 1 // the value is the exit status
	endKilled = 2 // the value is the signal
)

var errBadFrame = errors.New("malformed frame")

// initProtocol is the version of this conversation, which init says in its
// ready frame: the init is a binary of its own (sandbox-sidecar-init), so
// a daemon started with an init of another version refuses it instead of
// misreading its frames.
const initProtocol = 2

// readyFrom checks a ready frame's payload: init's protocol version,
// which must be this daemon's.
func readyFrom(p []byte) error {
	if len(p) == 4 && binary.LittleEndian.Uint32(p) == initProtocol {
		return nil
	}
	return fmt.Errorf("it speaks another protocol than this daemon (ready frame %x, want version %d): the daemon and its %s are of different versions; install them together and restart",
		p, initProtocol, initproc.BinaryName)
}

// maxPayload is the largest payload a frame of kind may carry, 0 for an
// unknown kind.
func maxPayload(kind byte) int {
	switch kind {
	case kindKill:
		return 0
	case kindReady:
		return 4
	case kindExited:
		return 12
	case kindStdout, kindStderr:
		return maxChunk
	case kindFailed:
		return maxReasonBytes
	case kindLstat:
		return backend.MaxGuestPathLen
	case kindLstated:
		return 8
	case kindRun:
		return maxRunPayload
	case kindFileOp:
		return fileRequestHeader + backend.MaxGuestPathLen
	case kindFileData:
		return maxFileData
	case kindFileDone:
		return fileDoneHeader + maxReasonBytes
	}
	return -1
}

// writeFrame writes one frame. Callers serialise writes to one stream.
func writeFrame(w io.Writer, kind byte, payload []byte) error {
	buf := make([]byte, frameHeaderSize, frameHeaderSize+len(payload))
	buf[0] = kind
	binary.LittleEndian.PutUint32(buf[4:], uint32(len(payload)))
	_, err := w.Write(append(buf, payload...))
	return err
}

// readFrame reads one frame of a kind in allowed (a bitmask of 1<<kind).
func readFrame(r io.Reader, allowed uint32) (byte, []byte, error) {
	var h [frameHeaderSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	kind := h[0]
	n := binary.LittleEndian.Uint32(h[4:])
	limit := maxPayload(kind)
	switch {
	case h[1] != 0 || h[2] != 0 || h[3] != 0:
		return 0, nil, fmt.Errorf("%w: reserved header bytes set", errBadFrame)
	case kind >= 32 || allowed&(1<<kind) == 0 || limit < 0:
		return 0, nil, fmt.Errorf("%w: unexpected kind %d", errBadFrame, kind)
	case int64(n) > int64(limit):
		return 0, nil, fmt.Errorf("%w: kind %d with %d bytes, more than %d", errBadFrame, kind, n, limit)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return kind, payload, nil
}

// What init did about a command's budget, in an exited frame.
const (
	timedNo   = 0 // the command ended within its budget
	timedTerm = 1 // init sent the command's process group SIGTERM at the budget
	timedKill = 2 // and, the grace spent, SIGKILL to every process of the sandbox
)

// u32s encodes little-endian u32 values (an exited or lstated payload).
func u32s(vs ...uint32) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return b
}

// exitCode turns an exited frame's payload into the status a shell would
// report (the exit status, or 128+N for a command killed by signal N) and
// whether init stopped the command at its budget. A timed-out command's
// status is what GNU timeout gives: 124, or 137 when SIGKILL was needed.
func exitCode(p []byte) (code int, timedOut bool, err error) {
	if len(p) != 12 {
		return 0, false, fmt.Errorf("%w: exit status of %d bytes", errBadFrame, len(p))
	}
	how, v, timed := binary.LittleEndian.Uint32(p), binary.LittleEndian.Uint32(p[4:]), binary.LittleEndian.Uint32(p[8:])
	switch {
	case timed == timedTerm:
		return backend.ExitTimedOut, true, nil
	case timed == timedKill:
		return backend.ExitKilled, true, nil
	case timed != timedNo:
	case how == endExited && v <= 255:
		return int(v), false, nil
	case how == endKilled && v >= 1 && v <= 64:
		return 128 + int(v), false, nil
	}
	return 0, false, fmt.Errorf("%w: not a valid exit (%d/%d/%d)", errBadFrame, how, v, timed)
}

// runRequest is what init needs to start one command.
type runRequest struct {
	argv  []string // the command, argv[0] a path or a name looked up in PATH
	env   []string // "NAME=value", the whole environment
	cwd   string   // absolute, inside the sandbox
	stdin []byte
	// timeout is the command's budget: at it init sends the command's
	// process group SIGTERM, and killAfter later SIGKILL to everything.
	timeout, killAfter time.Duration
}

// Bounds init applies to a request, beyond the total size.
const (
	maxRequestArgv = backend.MaxArgv + 8 // the command's and timeout's own
	maxRequestEnv  = 1 << 16
)

func (r runRequest) encode() []byte {
	buf := make([]byte, 0, 4+16+wirefmt.ListSize(r.argv)+wirefmt.ListSize(r.env)+4+len(r.cwd)+4+len(r.stdin))
	buf = binary.LittleEndian.AppendUint32(buf, requestMagic)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(r.timeout))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(r.killAfter))
	buf = wirefmt.AppendList(buf, r.argv)
	buf = wirefmt.AppendList(buf, r.env)
	buf = wirefmt.AppendString(buf, r.cwd)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(r.stdin)))
	return append(buf, r.stdin...)
}

// decodeRunRequest parses and checks a request: every count and length
// within what is left, no NUL in a string, a budget within
// backend.MaxTimeout, a non-empty argv, every environment entry NAME=value,
// a clean absolute cwd, nothing trailing.
func decodeRunRequest(buf []byte) (runRequest, error) {
	bad := func(format string, args ...any) (runRequest, error) {
		return runRequest{}, fmt.Errorf("%w: request: "+format, append([]any{errBadFrame}, args...)...)
	}
	d := wirefmt.NewDecoder(buf)
	if magic, ok := d.U32(); !ok || magic != requestMagic {
		return bad("wrong magic")
	}
	var r runRequest
	timeout, ok := d.U64()
	killAfter, ok2 := d.U64()
	if !ok || !ok2 {
		return bad("no budget")
	}
	r.timeout, r.killAfter = time.Duration(timeout), time.Duration(killAfter)
	if r.timeout <= 0 || r.timeout > backend.MaxTimeout || r.killAfter <= 0 || r.killAfter > backend.MaxTimeout {
		return bad("budget %v, grace %v out of range", r.timeout, r.killAfter)
	}
	if r.argv, ok = d.List(maxRequestArgv); !ok {
		return bad("bad argv")
	}
	if r.env, ok = d.List(maxRequestEnv); !ok {
		return bad("bad environment")
	}
	if r.cwd, ok = d.String(); !ok {
		return bad("bad working directory")
	}
	stdin, ok := d.Bytes()
	if !ok || len(stdin) > maxStdinBytes {
		return bad("bad stdin")
	}
	r.stdin = stdin
	switch {
	case d.Left() != 0:
		return bad("%d bytes trailing", d.Left())
	case len(r.argv) == 0 || r.argv[0] == "":
		return bad("empty argv")
	}
	if err := wirefmt.CheckCommand(r.env, r.cwd); err != nil {
		return bad("%v", err)
	}
	return r, nil
}
