// Package proclog is the on-disk form of a durable process's record, which
// the sandbox's agent writes and the daemon reads: each output stream's
// log, a ring of a fixed size addressed by absolute byte offsets, and the
// exit record. The daemon makes the files (so their size is its to set) and
// hands the agent open descriptors; the agent only writes through them, so
// it never names a path of the host. Both sides treat what they read as
// hostile: every length is checked, and a reader never trusts the writer
// to have finished.
//
// It imports nothing of the project and nothing beyond the standard
// library's encoding/binary and hash/crc32, so the sandbox's small init
// links it.
package proclog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// A log is a header page and a ring of Cap bytes after it. The byte at
// absolute offset o of the stream (counted from the process's start) lives
// at HeaderSize + o mod Cap while it is kept: only the last Cap bytes are.
//
// The header holds two counts. Committed is how many bytes of the stream
// are in the ring, whole; Reserved is how many a write under way will
// have made. A writer first raises Reserved, then writes the data (which
// may overwrite the oldest kept bytes), then raises Committed to match. A
// reader reads the header, the data it wants below Committed, and the
// header again: every byte below the second Reserved - Cap may have been
// overwritten while it read, and is reported as dropped. So a reader
// never returns a byte the writer was overwriting, and a writer killed
// half-way leaves Committed at the last whole write.
const (
	// HeaderSize is the header's page: the ring starts at a page.
	HeaderSize = 4096
	logMagic   = "SCLOG001"
	// MinCap and MaxCap bound a ring's size.
	MinCap = 4096
	MaxCap = 1 << 40
)

// ErrBadLog is a log file whose header is not ours or does not hold.
var ErrBadLog = errors.New("not a process log")

// header is a log's header as stored: magic, ring size, committed and
// reserved counts, little-endian.
type header struct {
	cap, committed, reserved int64
}

const headerBytes = 8 + 3*8

func (h header) encode() []byte {
	b := make([]byte, headerBytes)
	copy(b, logMagic)
	binary.LittleEndian.PutUint64(b[8:], uint64(h.cap))
	binary.LittleEndian.PutUint64(b[16:], uint64(h.committed))
	binary.LittleEndian.PutUint64(b[24:], uint64(h.reserved))
	return b
}

func readHeader(f *os.File) (header, error) {
	var b [headerBytes]byte
	if _, err := f.ReadAt(b[:], 0); err != nil {
		if errors.Is(err, io.EOF) {
			return header{}, fmt.Errorf("%w: its header is cut short", ErrBadLog)
		}
		return header{}, err
	}
	if string(b[:8]) != logMagic {
		return header{}, fmt.Errorf("%w: bad magic", ErrBadLog)
	}
	h := header{
		cap:       int64(binary.LittleEndian.Uint64(b[8:])),
		committed: int64(binary.LittleEndian.Uint64(b[16:])),
		reserved:  int64(binary.LittleEndian.Uint64(b[24:])),
	}
	if h.cap < MinCap || h.cap > MaxCap || h.committed < 0 || h.reserved < h.committed {
		return header{}, fmt.Errorf("%w: its counts do not hold (cap %d, committed %d, reserved %d)", ErrBadLog, h.cap, h.committed, h.reserved)
	}
	return h, nil
}

// Create makes f an empty log of a ring of capBytes (the daemon's side:
// before it hands f to the agent).
func Create(f *os.File, capBytes int64) error {
	if capBytes < MinCap || capBytes > MaxCap {
		return fmt.Errorf("a log's size must be between %d and %d bytes, not %d", MinCap, int64(MaxCap), capBytes)
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt(header{cap: capBytes}.encode(), 0)
	return err
}

// Writer appends a stream to a log (the agent's side). It is not safe for
// concurrent use; one writer per log.
type Writer struct {
	f   *os.File
	h   header
	err error // the first write error: the stream's later bytes are dropped
	// Dropped counts the bytes of the stream that could not be written
	// (the log's file refused them: disk full): they are counted as
	// written, so offsets stay those of the stream, and read back as
	// dropped.
	Dropped int64
}

// OpenWriter reads f's header and returns a writer that appends after
// what it holds.
func OpenWriter(f *os.File) (*Writer, error) {
	h, err := readHeader(f)
	if err != nil {
		return nil, err
	}
	// A writer killed half-way left reserved above committed: those bytes
	// are not whole, and the next write overwrites them.
	h.reserved = h.committed
	return &Writer{f: f, h: h}, nil
}

// Written is how many bytes of the stream the log has taken.
func (w *Writer) Written() int64 { return w.h.committed }

// Write appends p to the stream. It never fails: a byte the file refuses
// (a full disk) is counted in Dropped and the stream goes on, as a process's
// output must not stop because its log could not keep it.
func (w *Writer) Write(p []byte) (int, error) {
	n := int64(len(p))
	if n == 0 {
		return 0, nil
	}
	start := w.h.committed
	w.h.reserved = start + n
	if w.err == nil {
		w.err = w.writeHeader()
	}
	// Only the last cap bytes of p can be kept.
	data, at := p, start
	if n > w.h.cap {
		data, at = p[n-w.h.cap:], start+n-w.h.cap
	}
	for w.err == nil && len(data) > 0 {
		pos := at % w.h.cap
		chunk := data[:min(int64(len(data)), w.h.cap-pos)]
		_, w.err = w.f.WriteAt(chunk, HeaderSize+pos)
		data, at = data[len(chunk):], at+int64(len(chunk))
	}
	w.h.committed = w.h.reserved
	if w.err != nil {
		w.Dropped += n
		return len(p), nil
	}
	if err := w.writeHeader(); err != nil {
		w.err = err
	}
	return len(p), nil
}

func (w *Writer) writeHeader() error {
	_, err := w.f.WriteAt(w.h.encode(), 0)
	return err
}

// Err is the write error that made the writer drop the stream's bytes
// since, if any.
func (w *Writer) Err() error { return w.err }

// Read is what ReadAt found.
type Read struct {
	// Data is the stream's bytes from Offset on.
	Data []byte
	// Offset is where Data starts: the offset asked for, or the oldest
	// byte still kept when older ones were dropped.
	Offset int64
	// Dropped is how many bytes between the offset asked for and Offset
	// are gone.
	Dropped int64
	// Written is how many bytes the stream had when it was read: the
	// next offset to ask for once Data is taken is Offset+len(Data).
	Written int64
}

// ReadAt reads at most maxBytes of the stream in f from offset (the
// daemon's side). An offset past what was written reads nothing.
func ReadAt(f *os.File, offset int64, maxBytes int) (Read, error) {
	if offset < 0 {
		return Read{}, fmt.Errorf("offset %d is negative", offset)
	}
	h, err := readHeader(f)
	if err != nil {
		return Read{}, err
	}
	r := Read{Offset: offset, Written: h.committed}
	if oldest := h.committed - h.cap; offset < oldest {
		r.Offset, r.Dropped = oldest, oldest-offset
	}
	if r.Offset >= h.committed || maxBytes <= 0 {
		r.Offset = min(r.Offset, max(h.committed, offset))
		return r, nil
	}
	n := min(h.committed-r.Offset, int64(maxBytes))
	buf := make([]byte, n)
	for done := int64(0); done < n; {
		pos := (r.Offset + done) % h.cap
		chunk := min(n-done, h.cap-pos)
		if _, err := f.ReadAt(buf[done:done+chunk], HeaderSize+pos); err != nil && !errors.Is(err, io.EOF) {
			return Read{}, err
		}
		done += chunk
	}
	// What a writer overwrote while this read is not the stream's.
	after, err := readHeader(f)
	if err != nil {
		return Read{}, err
	}
	if valid := after.reserved - after.cap; r.Offset < valid {
		cut := min(valid-r.Offset, n)
		buf, r.Offset, r.Dropped = buf[cut:], r.Offset+cut, r.Dropped+cut
	}
	r.Data = buf
	return r, nil
}

// Exit is a process's exit record: how it ended, and what it wrote.
type Exit struct {
	// How is EndExited, EndKilled, EndDumped (the wait status's kind),
	// EndLost (the process's keeper died before it could say) or
	// EndAgentLost (the sandbox's agent died, and its processes with it:
	// the daemon writes that record, when it starts another agent).
	How uint32
	// Code is the exit status (EndExited) or the signal.
	Code uint32
	// Timed says what the keeper did about the process's budget:
	// TimedNo, TimedTerm, TimedKill.
	Timed uint32
	// OOM: the process died of SIGKILL and its sandbox's OOM-kill count
	// rose while it ran.
	OOM bool
	// StartedNS and EndedNS are Unix times in nanoseconds.
	StartedNS, EndedNS int64
	// StdoutBytes and StderrBytes are how many bytes each stream had.
	StdoutBytes, StderrBytes int64
}

// How a process ended.
const (
	EndExited    = 1
	EndKilled    = 2
	EndDumped    = 3
	EndLost      = 4
	EndAgentLost = 5
)

// What its keeper did about its budget.
const (
	TimedNo   = 0
	TimedTerm = 1
	TimedKill = 2
)

const (
	exitMagic = "SCEXIT01"
	// ExitSize is an exit record's size on disk.
	ExitSize = 8 + 4*4 + 4*8 + 4
)

// Encode is x as stored: written in one write at the file's start.
func (x Exit) Encode() []byte {
	b := make([]byte, ExitSize)
	copy(b, exitMagic)
	binary.LittleEndian.PutUint32(b[8:], x.How)
	binary.LittleEndian.PutUint32(b[12:], x.Code)
	binary.LittleEndian.PutUint32(b[16:], x.Timed)
	if x.OOM {
		binary.LittleEndian.PutUint32(b[20:], 1)
	}
	binary.LittleEndian.PutUint64(b[24:], uint64(x.StartedNS))
	binary.LittleEndian.PutUint64(b[32:], uint64(x.EndedNS))
	binary.LittleEndian.PutUint64(b[40:], uint64(x.StdoutBytes))
	binary.LittleEndian.PutUint64(b[48:], uint64(x.StderrBytes))
	binary.LittleEndian.PutUint32(b[56:], crc32.ChecksumIEEE(b[:56]))
	return b
}

// ErrNoExit: the record is not written (the process runs, or its keeper is
// half-way through writing it).
var ErrNoExit = errors.New("no exit record")

// DecodeExit reads an exit record. An empty or partial one is ErrNoExit; one
// that is whole but wrong is ErrBadLog.
func DecodeExit(b []byte) (Exit, error) {
	if len(b) < ExitSize {
		return Exit{}, ErrNoExit
	}
	if len(b) > ExitSize || string(b[:8]) != exitMagic {
		return Exit{}, fmt.Errorf("%w: not an exit record", ErrBadLog)
	}
	if crc32.ChecksumIEEE(b[:56]) != binary.LittleEndian.Uint32(b[56:]) {
		return Exit{}, ErrNoExit // torn: its writer is not done
	}
	x := Exit{
		How:         binary.LittleEndian.Uint32(b[8:]),
		Code:        binary.LittleEndian.Uint32(b[12:]),
		Timed:       binary.LittleEndian.Uint32(b[16:]),
		OOM:         binary.LittleEndian.Uint32(b[20:]) == 1,
		StartedNS:   int64(binary.LittleEndian.Uint64(b[24:])),
		EndedNS:     int64(binary.LittleEndian.Uint64(b[32:])),
		StdoutBytes: int64(binary.LittleEndian.Uint64(b[40:])),
		StderrBytes: int64(binary.LittleEndian.Uint64(b[48:])),
	}
	if x.How < EndExited || x.How > EndAgentLost || x.Timed > TimedKill || (x.How <= EndDumped && x.How != EndExited && (x.Code == 0 || x.Code > 64)) ||
		(x.How == EndExited && x.Code > 255) || x.StdoutBytes < 0 || x.StderrBytes < 0 {
		return Exit{}, fmt.Errorf("%w: an exit record that does not hold", ErrBadLog)
	}
	return x, nil
}

// ReadExit reads f's exit record.
func ReadExit(f *os.File) (Exit, error) {
	b := make([]byte, ExitSize+1)
	n, err := f.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return Exit{}, err
	}
	return DecodeExit(b[:n])
}

// WriteExit writes x into f, the process's empty exit file, and syncs it:
// once it returns the record survives a crash of the host.
func WriteExit(f *os.File, x Exit) error {
	if _, err := f.WriteAt(x.Encode(), 0); err != nil {
		return err
	}
	return f.Sync()
}

// ExitCode is the exit code a client sees: the status, or 128+N for
// signal N (a lost process as SIGKILL's).
func (x Exit) ExitCode() int {
	switch x.How {
	case EndExited:
		return int(x.Code)
	case EndLost, EndAgentLost:
		return 128 + 9
	}
	return 128 + int(x.Code)
}

// Reason is one word for why the process ended: sandbox_terminated,
// timed_out, oom_killed, killed or exited.
func (x Exit) Reason() string {
	switch {
	case x.How == EndAgentLost:
		return "sandbox_terminated"
	case x.Timed != TimedNo:
		return "timed_out"
	case x.OOM:
		return "oom_killed"
	case x.How == EndExited:
		return "exited"
	}
	return "killed"
}
