package gvwire

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
)

// Durable processes (backend/agent) travel in the stream too, each request
// with a sequence number its answer carries, so that they go beside a
// command and beside each other:
//
//	daemon → init:  proc start (seq, request, stdin)   start a process under a keeper
//	daemon → init:  proc signal (seq, signal, id)      signal a process's group
//	daemon → init:  proc list (seq)                    which processes run
//	init → daemon:  proc answer (seq, errno, value, body)
//
// A start's request is the agent.Request the keeper runs. Its logs and
// exit file are the daemon's, made on the host in the sandbox's procs/
// directory, which is bound into the sandbox at GuestProcs (root's alone):
// init opens GuestProcs/<id>/{stdout,stderr,exit} and hands them to the
// keeper. Its answer comes once the keeper said the process started (value:
// its pid; 0 when it ended at once, its exit record says how) or it could
// not be started (errno). A signal's answer is 0 or ESRCH (no such running
// process); a list's body is the running processes' ids, one a line.
//
// And a daemon that finds a live init a previous daemon left re-attaches
// to it:
//
//	daemon → init:  attach (nonce)              the first frame of a new daemon
//	init → daemon:  attached (protocol, nonce)
//
// The stream of each direction is a named FIFO, which outlives the daemon:
// init reads EOF when the daemon that wrote to it is gone, drops what it
// held of a frame and waits for the next writer, whose first frame is
// attach; the next daemon skips whatever the previous one left unread
// until the attached frame with its own nonce.
const (
	KindProcStart  = 14
	KindProcSignal = 15
	KindProcList   = 16
	KindProcAnswer = 17
	KindAttach     = 18
	KindAttached   = 19
)

const (
	// NonceSize is an attach frame's nonce.
	NonceSize = 16
	// MaxProcStartPayload bounds a proc start: its seq, request length,
	// request and stdin.
	MaxProcStartPayload = 8 + agent.MaxRequestSize + MaxStdinBytes
	// MaxProcListBody bounds a proc answer's body: the ids of the most
	// processes init runs at once (agent.Table's default bound), one a
	// line.
	MaxProcListBody  = 64 * (agent.MaxIDLen + 1)
	procAnswerHeader = 12
	// GuestProcs is where the sandbox's procs/ directory is bound: 0700,
	// root's, so that only init and its keepers (root inside gVisor) reach
	// it, never the guest (uid GuestUID).
	GuestProcs = "/.sandbox-sidecar-procs"
)

// ProcStart is a proc start frame.
type ProcStart struct {
	Seq     uint32
	Request []byte // an agent.Request, encoded
	Stdin   []byte
}

func (s ProcStart) Encode() []byte {
	b := binary.LittleEndian.AppendUint32(make([]byte, 0, 8+len(s.Request)+len(s.Stdin)), s.Seq)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s.Request)))
	return append(append(b, s.Request...), s.Stdin...)
}

// DecodeProcStart splits a proc start frame (the request is the keeper's
// to check, as agent.DecodeRequest does).
func DecodeProcStart(p []byte) (ProcStart, error) {
	if len(p) < 8 {
		return ProcStart{}, fmt.Errorf("%w: proc start of %d bytes", ErrBadFrame, len(p))
	}
	s := ProcStart{Seq: binary.LittleEndian.Uint32(p)}
	n := int64(binary.LittleEndian.Uint32(p[4:]))
	if n > agent.MaxRequestSize || n > int64(len(p)-8) || int64(len(p)-8)-n > MaxStdinBytes {
		return ProcStart{Seq: s.Seq}, fmt.Errorf("%w: proc start with a request of %d bytes in %d", ErrBadFrame, n, len(p))
	}
	s.Request, s.Stdin = p[8:8+n], p[8+n:]
	return s, nil
}

// ProcSignal is a proc signal frame.
type ProcSignal struct {
	Seq, Signal uint32
	ID          string
}

func (s ProcSignal) Encode() []byte {
	return append(U32s(s.Seq, s.Signal), s.ID...)
}

// DecodeProcSignal checks a proc signal frame: a signal 1 to 64 and a
// process id (agent.ValidID).
func DecodeProcSignal(p []byte) (ProcSignal, error) {
	if len(p) < 8 {
		return ProcSignal{}, fmt.Errorf("%w: proc signal of %d bytes", ErrBadFrame, len(p))
	}
	s := ProcSignal{Seq: binary.LittleEndian.Uint32(p), Signal: binary.LittleEndian.Uint32(p[4:]), ID: string(p[8:])}
	if s.Signal == 0 || s.Signal > 64 || !agent.ValidID(s.ID) {
		return ProcSignal{Seq: s.Seq}, fmt.Errorf("%w: proc signal %d to %q", ErrBadFrame, s.Signal, truncate(s.ID, 80))
	}
	return s, nil
}

// ProcAnswer is init's answer to a proc request.
type ProcAnswer struct {
	Seq, Errno, Value uint32
	Body              []byte
}

func (a ProcAnswer) Encode() []byte { return append(U32s(a.Seq, a.Errno, a.Value), a.Body...) }

func DecodeProcAnswer(p []byte) (ProcAnswer, error) {
	if len(p) < procAnswerHeader {
		return ProcAnswer{}, fmt.Errorf("%w: proc answer of %d bytes", ErrBadFrame, len(p))
	}
	return ProcAnswer{Seq: binary.LittleEndian.Uint32(p), Errno: binary.LittleEndian.Uint32(p[4:]),
		Value: binary.LittleEndian.Uint32(p[8:]), Body: p[procAnswerHeader:]}, nil
}

// IDs reads a list answer's body: the ids of the running processes; an id
// that is none is an error.
func (a ProcAnswer) IDs() ([]string, error) {
	var ids []string
	for _, line := range bytes.Split(a.Body, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		if !agent.ValidID(string(line)) {
			return nil, fmt.Errorf("%w: a process list naming %q", ErrBadFrame, truncate(string(line), 80))
		}
		ids = append(ids, string(line))
	}
	return ids, nil
}

// Attached is an attached frame's payload for nonce.
func Attached(nonce []byte) []byte { return append(U32s(Protocol), nonce...) }

// AttachedMarker is the bytes an attached frame for nonce begins with,
// header included: what a re-attaching daemon looks for in a stream that
// may begin with what its predecessor left unread.
func AttachedMarker(nonce []byte) []byte {
	var h [FrameHeaderSize]byte
	h[0] = KindAttached
	binary.LittleEndian.PutUint32(h[4:], uint32(4+len(nonce)))
	return append(h[:], Attached(nonce)...)
}
