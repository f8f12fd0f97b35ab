// Package gvwire is the conversation between the gVisor backend's daemon
// side (backend/gvisor) and a sandbox's init (gvinit): the frames both
// sides write and check, and what the daemon and init agree on beside
// them (the guest's identity, where init's executable is bound, the
// environment that tells init it is one). It is its own package so that
// the init's binary (cmd/sandbox-sidecar-init) links it without the
// daemon's side.
package gvwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/wirefmt"
)

// The conversation between the daemon and a sandbox's init.
//
// Init is the container's process (pid 1 inside gVisor). Its stdin and
// stdout are two host FIFOs in the sandbox's directory (the daemon's, 0700)
// whose other ends only the daemon holds: runsc donates the container
// process's stdio to the sandbox as host files, and nothing else of the
// host reaches the guest that way. FIFOs rather than pipes, so that a
// daemon started after this one died can open them again (procwire.go). bubblewrap's init
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
//	daemon → init:  proc start, signal, list; init → daemon: proc answer (procwire.go)
//	daemon → init:  code, context list, delete; init → daemon: cell output, status (codewire.go)
//	daemon → init:  reclaim; init → daemon: proc answer (memwire.go)
//
// A frame is a kind byte, three zero bytes and a little-endian u32 payload
// length, then the payload. Both sides check every header and bound every
// length before reading it. Output and the exit share one stream, so the
// daemon has all of a command's output when it reads its exit.
const (
	FrameHeaderSize = 8
	// MaxChunk bounds an output frame's payload (init sends at most this).
	MaxChunk = 64 << 10
	// MaxRunPayload bounds a run request: argv and env (backend.MaxExecBytes
	// and the environment's 1 MiB) plus stdin (MaxStdinBytes).
	MaxRunPayload = MaxStdinBytes + 4<<20
	// MaxStdinBytes bounds a command's stdin, which travels in its request.
	MaxStdinBytes = 32 << 20
	// MaxReasonBytes bounds a failed frame's text.
	MaxReasonBytes = 4 << 10
	RequestMagic   = 0x71657267 // "greq"
)

// Frame kinds.
const (
	KindReady = 1
	KindRun   = 2
	KindKill  = 3
	// 4 was "started" (the command's pid), which the daemon never used:
	// a frame less to write, and to wake the daemon for, per command
	// (protocol 2).
	KindStdout  = 5
	KindStderr  = 6
	KindExited  = 7
	KindFailed  = 8
	KindLstat   = 9
	KindLstated = 10
	// File operations on the guest's view (filewire.go).
	KindFileOp   = 11
	KindFileData = 12
	KindFileDone = 13
)

// How a command ended (the si_code of waitid).
const (
	EndExited = 1 // the value is the exit status
	EndKilled = 2 // the value is the signal
)

var ErrBadFrame = errors.New("malformed frame")

// Protocol is the version of this conversation, which init says in its
// ready frame: the init is a binary of its own (sandbox-sidecar-init), so
// a daemon started with an init of another version refuses it instead of
// misreading its frames. 3: durable processes and re-attaching
// (procwire.go); 4: code contexts (codewire.go); 5: reclaim at the
// memory limit (memwire.go).
const Protocol = 5

// ReadyFrom checks a ready frame's payload: init's protocol version,
// which must be this daemon's.
func ReadyFrom(p []byte) error {
	if len(p) == 4 && binary.LittleEndian.Uint32(p) == Protocol {
		return nil
	}
	return fmt.Errorf("it speaks another protocol than this daemon (ready frame %x, want version %d): the daemon and its %s are of different versions; install them together and restart",
		p, Protocol, initproc.BinaryName)
}

// MaxPayload is the largest payload a frame of kind may carry, 0 for an
// unknown kind.
func MaxPayload(kind byte) int {
	switch kind {
	case KindKill:
		return 0
	case KindReady:
		return 4
	case KindExited:
		return 12
	case KindStdout, KindStderr:
		return MaxChunk
	case KindFailed:
		return MaxReasonBytes
	case KindLstat:
		return backend.MaxGuestPathLen
	case KindLstated:
		return 8
	case KindRun:
		return MaxRunPayload
	case KindFileOp:
		return FileRequestHeader + backend.MaxGuestPathLen
	case KindFileData:
		return MaxFileData
	case KindFileDone:
		return FileDoneHeader + MaxReasonBytes
	case KindProcStart:
		return MaxProcStartPayload
	case KindProcSignal:
		return 8 + agent.MaxIDLen
	case KindProcList, KindReclaim:
		return 4
	case KindProcAnswer:
		return procAnswerHeader + MaxAnswerBody
	case KindAttach:
		return NonceSize
	case KindAttached:
		return 4 + NonceSize
	case KindCode, KindCodeWarm:
		return MaxCodePayload
	case KindContextList:
		return 4
	case KindContextDelete, KindContextRestart:
		return 4 + agent.MaxContextName
	case KindCellOutput:
		return cellOutputHeader + MaxChunk
	case KindCellStatus:
		return cellStatusHeader + MaxReasonBytes
	}
	return -1
}

// WriteFrame writes one frame. Callers serialise writes to one stream.
func WriteFrame(w io.Writer, kind byte, payload []byte) error {
	buf := make([]byte, FrameHeaderSize, FrameHeaderSize+len(payload))
	buf[0] = kind
	binary.LittleEndian.PutUint32(buf[4:], uint32(len(payload)))
	_, err := w.Write(append(buf, payload...))
	return err
}

// ReadFrame reads one frame of a kind in allowed (a bitmask of 1<<kind).
func ReadFrame(r io.Reader, allowed uint32) (byte, []byte, error) {
	var h [FrameHeaderSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	kind := h[0]
	n := binary.LittleEndian.Uint32(h[4:])
	limit := MaxPayload(kind)
	switch {
	case h[1] != 0 || h[2] != 0 || h[3] != 0:
		return 0, nil, fmt.Errorf("%w: reserved header bytes set", ErrBadFrame)
	case kind >= 32 || allowed&(1<<kind) == 0 || limit < 0:
		return 0, nil, fmt.Errorf("%w: unexpected kind %d", ErrBadFrame, kind)
	case int64(n) > int64(limit):
		return 0, nil, fmt.Errorf("%w: kind %d with %d bytes, more than %d", ErrBadFrame, kind, n, limit)
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
	TimedNo   = 0 // the command ended within its budget
	TimedTerm = 1 // init sent the command's process group SIGTERM at the budget
	TimedKill = 2 // and, the grace spent, SIGKILL to every process of the sandbox
)

// U32s encodes little-endian u32 values (an exited or lstated payload).
func U32s(vs ...uint32) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return b
}

// ExitCode turns an exited frame's payload into the status a shell would
// report (the exit status, or 128+N for a command killed by signal N) and
// whether init stopped the command at its budget. A timed-out command's
// status is what GNU timeout gives: 124, or 137 when SIGKILL was needed.
func ExitCode(p []byte) (code int, timedOut bool, err error) {
	if len(p) != 12 {
		return 0, false, fmt.Errorf("%w: exit status of %d bytes", ErrBadFrame, len(p))
	}
	how, v, timed := binary.LittleEndian.Uint32(p), binary.LittleEndian.Uint32(p[4:]), binary.LittleEndian.Uint32(p[8:])
	switch {
	case timed == TimedTerm:
		return backend.ExitTimedOut, true, nil
	case timed == TimedKill:
		return backend.ExitKilled, true, nil
	case timed != TimedNo:
	case how == EndExited && v <= 255:
		return int(v), false, nil
	case how == EndKilled && v >= 1 && v <= 64:
		return 128 + int(v), false, nil
	}
	return 0, false, fmt.Errorf("%w: not a valid exit (%d/%d/%d)", ErrBadFrame, how, v, timed)
}

// RunRequest is what init needs to start one command.
type RunRequest struct {
	Argv  []string // the command, argv[0] a path or a name looked up in PATH
	Env   []string // "NAME=value", the whole environment
	Cwd   string   // absolute, inside the sandbox
	Stdin []byte
	// Timeout is the command's budget: at it init sends the command's
	// process group SIGTERM, and KillAfter later SIGKILL to everything.
	Timeout, KillAfter time.Duration
}

// Bounds init applies to a request, beyond the total size.
const (
	MaxRequestArgv = backend.MaxArgv + 8 // the command's and timeout's own
	MaxRequestEnv  = 1 << 16
)

func (r RunRequest) Encode() []byte {
	buf := make([]byte, 0, 4+16+wirefmt.ListSize(r.Argv)+wirefmt.ListSize(r.Env)+4+len(r.Cwd)+4+len(r.Stdin))
	buf = binary.LittleEndian.AppendUint32(buf, RequestMagic)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(r.Timeout))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(r.KillAfter))
	buf = wirefmt.AppendList(buf, r.Argv)
	buf = wirefmt.AppendList(buf, r.Env)
	buf = wirefmt.AppendString(buf, r.Cwd)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(r.Stdin)))
	return append(buf, r.Stdin...)
}

// DecodeRunRequest parses and checks a request: every count and length
// within what is left, no NUL in a string, a budget within
// backend.MaxTimeout, a non-empty argv, every environment entry NAME=value,
// a clean absolute cwd, nothing trailing.
func DecodeRunRequest(buf []byte) (RunRequest, error) {
	bad := func(format string, args ...any) (RunRequest, error) {
		return RunRequest{}, fmt.Errorf("%w: request: "+format, append([]any{ErrBadFrame}, args...)...)
	}
	d := wirefmt.NewDecoder(buf)
	if magic, ok := d.U32(); !ok || magic != RequestMagic {
		return bad("wrong magic")
	}
	var r RunRequest
	timeout, ok := d.U64()
	killAfter, ok2 := d.U64()
	if !ok || !ok2 {
		return bad("no budget")
	}
	r.Timeout, r.KillAfter = time.Duration(timeout), time.Duration(killAfter)
	if r.Timeout <= 0 || r.Timeout > backend.MaxTimeout || r.KillAfter <= 0 || r.KillAfter > backend.MaxTimeout {
		return bad("budget %v, grace %v out of range", r.Timeout, r.KillAfter)
	}
	var err error
	if r.Argv, r.Env, r.Cwd, err = d.Command(MaxRequestArgv, MaxRequestEnv); err != nil {
		return bad("%v", err)
	}
	stdin, ok := d.Bytes()
	if !ok || len(stdin) > MaxStdinBytes {
		return bad("bad stdin")
	}
	r.Stdin = stdin
	if d.Left() != 0 {
		return bad("%d bytes trailing", d.Left())
	}
	return r, nil
}

// InitEnv is set (to "1") in the environment of a sandbox's init, and
// nowhere else: it is how the init's binary, run inside gVisor as the
// container's process, knows it is init.
const InitEnv = "SANDBOX_SIDECAR_GVISOR_INIT"

// What the guest runs as, and where the sandboxes' init (Config.InitPath,
// or the daemon's own executable) is bound, read-only.
const (
	GuestUID  = 1000
	GuestGID  = 1000
	GuestInit = "/.sandbox-sidecar-init"
)

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
