package gvwire

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
)

// Code contexts (backend/agent's Contexts) travel in the stream too, each
// cell with a sequence number its output and its status carry, beside a
// command, the durable processes' frames and other cells:
//
//	daemon → init:  code (seq, request)            run a cell (an agent.CellRequest)
//	init → daemon:  cell output (seq, stream, bytes) its stdout, stderr or results stream
//	init → daemon:  cell status (seq, what, values, reason)  started, ended or failed
//	daemon → init:  context list (seq)             answered with a proc answer: the list
//	daemon → init:  context delete (seq, name)     a proc answer: 0, or ESRCH (none)
//	daemon → init:  context restart (seq, name)    as a delete, but the context is kept,
//	                                               fresh (agent.Contexts.Restart)
//	daemon → init:  code warm (seq, request)       start the zygote ahead of any cell (a
//	                                               warm-pool member's): the request's Env,
//	                                               Preload and MaxContexts; a proc answer
//	                                               once it is ready (0) or could not be (an
//	                                               errno, as agent.Reply's, and why)
//
// A cell's three streams are made by init inside the sandbox (pipes for
// stdout and stderr, a stream socket for the results, as bwrap's daemon
// makes them; no host descriptor reaches the sentry, and runsc opens no
// host FIFO unless told to for every mount): init hands one end of each
// to the context with the cell and copies what comes out of the other
// into cell output frames. Its status says it started (the context took it), then how it
// ended (after every byte of its streams was sent, or init gave up waiting
// for one a process of the cell holds open), or that it failed to start
// (an errno, as agent.Reply's, and why). A cell of a daemon that went
// away says nothing to the next one: init sends a cell's frames only while
// the daemon that asked for it is attached.
const (
	KindCode           = 20
	KindContextList    = 21
	KindContextDelete  = 22
	KindCellOutput     = 23
	KindCellStatus     = 24
	KindCodeWarm       = 25
	KindContextRestart = 26
)

// A cell output's stream.
const (
	CellStdout  = 1
	CellStderr  = 2
	CellResults = 3
)

// What a cell status says.
const (
	CellStarted = 1
	CellEnded   = 2 // A: lost (1) or kept (0); B how (proclog.End*), C its code, D timed, Count the cell's number
	CellFailed  = 3 // A: the errno; the reason follows
)

const (
	cellOutputHeader = 8
	cellStatusHeader = 28
	// MaxCodePayload bounds a code frame: its seq and its request.
	MaxCodePayload = 4 + agent.MaxCellRequest
	// MaxAnswerBody bounds a proc answer's body: a list of processes or
	// of contexts.
	MaxAnswerBody = max(MaxProcListBody, agent.MaxContextListText)
)

// Code is a code frame.
type Code struct {
	Seq     uint32
	Request []byte // an agent.CellRequest, encoded
}

func (c Code) Encode() []byte {
	return append(U32s(c.Seq), c.Request...)
}

// DecodeCode splits a code frame (its request is agent.DecodeCellRequest's
// to check).
func DecodeCode(p []byte) (Code, error) {
	if len(p) < 4 || len(p) > MaxCodePayload {
		return Code{}, fmt.Errorf("%w: code frame of %d bytes", ErrBadFrame, len(p))
	}
	return Code{Seq: binary.LittleEndian.Uint32(p), Request: p[4:]}, nil
}

// ContextDelete is a context delete frame, or a context restart frame
// (the same fields).
type ContextDelete struct {
	Seq  uint32
	Name string
}

func (d ContextDelete) Encode() []byte { return append(U32s(d.Seq), d.Name...) }

// DecodeContextDelete checks a context delete or restart frame: a
// context's name (agent.ValidContextName).
func DecodeContextDelete(p []byte) (ContextDelete, error) {
	if len(p) < 4 {
		return ContextDelete{}, fmt.Errorf("%w: context delete of %d bytes", ErrBadFrame, len(p))
	}
	d := ContextDelete{Seq: binary.LittleEndian.Uint32(p), Name: string(p[4:])}
	if !agent.ValidContextName(d.Name) {
		return ContextDelete{Seq: d.Seq}, fmt.Errorf("%w: context delete of %q", ErrBadFrame, truncate(d.Name, 80))
	}
	return d, nil
}

// CellOutput is a cell output frame.
type CellOutput struct {
	Seq, Stream uint32
	Data        []byte
}

func (o CellOutput) Encode() []byte {
	return append(U32s(o.Seq, o.Stream), o.Data...)
}

// DecodeCellOutput checks a cell output frame: a stream of the three and
// at most MaxChunk bytes.
func DecodeCellOutput(p []byte) (CellOutput, error) {
	if len(p) < cellOutputHeader || len(p) > cellOutputHeader+MaxChunk {
		return CellOutput{}, fmt.Errorf("%w: cell output of %d bytes", ErrBadFrame, len(p))
	}
	o := CellOutput{Seq: binary.LittleEndian.Uint32(p), Stream: binary.LittleEndian.Uint32(p[4:]), Data: p[cellOutputHeader:]}
	if o.Stream < CellStdout || o.Stream > CellResults {
		return CellOutput{}, fmt.Errorf("%w: cell output of stream %d", ErrBadFrame, o.Stream)
	}
	return o, nil
}

// CellStatus is a cell status frame. An end's Count is the cell's number
// in its context as the agent counted it (agent.CellEnd's: 0 when the
// context was lost before it said), which no cell can forge.
type CellStatus struct {
	Seq, What  uint32
	A, B, C, D uint32
	Count      uint32
	Reason     string
}

func (s CellStatus) Encode() []byte {
	return append(U32s(s.Seq, s.What, s.A, s.B, s.C, s.D, s.Count), s.Reason...)
}

// DecodeCellStatus checks a cell status frame: what it says is one of the
// three, and a reason only a failure's, within MaxReasonBytes.
func DecodeCellStatus(p []byte) (CellStatus, error) {
	if len(p) < cellStatusHeader || len(p) > cellStatusHeader+MaxReasonBytes {
		return CellStatus{}, fmt.Errorf("%w: cell status of %d bytes", ErrBadFrame, len(p))
	}
	u := func(i int) uint32 { return binary.LittleEndian.Uint32(p[4*i:]) }
	s := CellStatus{Seq: u(0), What: u(1), A: u(2), B: u(3), C: u(4), D: u(5), Count: u(6), Reason: string(p[cellStatusHeader:])}
	switch {
	case s.What < CellStarted || s.What > CellFailed:
		return CellStatus{}, fmt.Errorf("%w: cell status %d", ErrBadFrame, s.What)
	case s.What != CellFailed && s.Reason != "":
		return CellStatus{}, fmt.Errorf("%w: cell status %d with a reason", ErrBadFrame, s.What)
	case s.What == CellEnded && (s.A > 1 || s.C > 255 || s.D > TimedKill || s.Count > math.MaxInt32):
		return CellStatus{}, fmt.Errorf("%w: a cell's end %d/%d/%d/%d/%d", ErrBadFrame, s.A, s.B, s.C, s.D, s.Count)
	case s.What != CellEnded && s.Count != 0:
		return CellStatus{}, fmt.Errorf("%w: cell status %d with a count", ErrBadFrame, s.What)
	}
	return s, nil
}
