package gvisor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/wirefmt"
)

// File operations on the sandbox's own view travel in the stream too:
//
//	daemon → init:  file op (seq, op, offset, n, path)   read, ranged read or listing
//	init → daemon:  file data (seq, bytes)                the contents or the encoded entries, in pieces
//	init → daemon:  file done (seq, code, errno, size, text)
//
// Init opens the path as the guest (its opener, opener.go) and reads the
// descriptor bounded as backend/hostfs reads one; the daemon keeps at most
// what the op allows (n, plus one for a read) and drops frames of any other
// seq, so an answer to an op that timed out never lands in the next one.

// File ops.
const (
	fileRead  = 1 // n: max bytes
	fileRange = 2 // offset, n: length
	fileList  = 3 // n: max entries
)

// Result codes of a file done frame.
const (
	fileOK       = 0
	fileErrno    = 1 // the open failed with errno
	fileBadPath  = 2
	fileNotFound = 3
	fileIsDir    = 4
	fileNotDir   = 5
	fileTooLarge = 6 // size is the size seen
	fileTooMany  = 7
	fileInvalid  = 8
	fileFailed   = 9
)

const (
	fileRequestHeader = 24 // seq, op, offset, n
	fileDoneHeader    = 24 // seq, code, errno, pad, size
	// maxFileData is a file data frame's payload: the seq and a piece.
	maxFileData = maxChunk
)

// fileRequest is one file operation on a path of the guest's view.
type fileRequest struct {
	seq       uint32
	op        uint32
	offset, n int64
	path      string // absolute; resolved by the guest's kernel
}

func (r fileRequest) encode() []byte {
	b := binary.LittleEndian.AppendUint32(nil, r.seq)
	b = binary.LittleEndian.AppendUint32(b, r.op)
	b = binary.LittleEndian.AppendUint64(b, uint64(r.offset))
	b = binary.LittleEndian.AppendUint64(b, uint64(r.n))
	return append(b, r.path...)
}

// decodeFileRequest checks a file op frame: a known op, non-negative
// numbers, an absolute path without NUL within backend.MaxGuestPathLen.
func decodeFileRequest(p []byte) (fileRequest, error) {
	if len(p) < fileRequestHeader {
		return fileRequest{}, fmt.Errorf("%w: file op of %d bytes", errBadFrame, len(p))
	}
	d := wirefmt.NewDecoder(p)
	var r fileRequest
	r.seq, _ = d.U32()
	r.op, _ = d.U32()
	off, _ := d.U64()
	n, _ := d.U64()
	r.offset, r.n = int64(off), int64(n)
	r.path = string(p[fileRequestHeader:])
	switch {
	case r.op < fileRead || r.op > fileList:
		return fileRequest{}, fmt.Errorf("%w: file op %d", errBadFrame, r.op)
	case r.offset < 0 || r.n < 0:
		return fileRequest{}, fmt.Errorf("%w: negative offset or bound", errBadFrame)
	case r.path == "" || r.path[0] != '/' || strings.IndexByte(r.path, 0) >= 0 || len(r.path) > backend.MaxGuestPathLen:
		return fileRequest{}, fmt.Errorf("%w: the path is not absolute, holds a NUL or is too long", errBadFrame)
	}
	return r, nil
}

// fileDone is how a file op ended.
type fileDone struct {
	seq         uint32
	code, errno uint32
	size        int64
	text        string // what went wrong, in init's words (for fileBadPath and the like)
}

func (d fileDone) encode() []byte {
	b := binary.LittleEndian.AppendUint32(nil, d.seq)
	b = binary.LittleEndian.AppendUint32(b, d.code)
	b = binary.LittleEndian.AppendUint32(b, d.errno)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(d.size))
	return append(b, truncate(d.text, maxReasonBytes-8)...)
}

func decodeFileDone(p []byte) (fileDone, error) {
	if len(p) < fileDoneHeader {
		return fileDone{}, fmt.Errorf("%w: file done of %d bytes", errBadFrame, len(p))
	}
	d := fileDone{
		seq:   binary.LittleEndian.Uint32(p),
		code:  binary.LittleEndian.Uint32(p[4:]),
		errno: binary.LittleEndian.Uint32(p[8:]),
		size:  int64(binary.LittleEndian.Uint64(p[16:])),
		text:  strings.ToValidUTF8(string(p[fileDoneHeader:]), "?"),
	}
	if d.code > fileFailed || d.size < 0 {
		return fileDone{}, fmt.Errorf("%w: file done code %d size %d", errBadFrame, d.code, d.size)
	}
	return d, nil
}

// fileDoneOf is the done frame for err, the outcome of an op whose path
// opened (init's side): the backend sentinel it wraps as a code, and the
// rest of its message as text.
func fileDoneOf(seq uint32, err error) fileDone {
	d := fileDone{seq: seq}
	var tooLarge *backend.FileTooLargeError
	codes := []struct {
		sentinel error
		code     uint32
	}{
		{backend.ErrBadPath, fileBadPath}, {backend.ErrPathNotFound, fileNotFound}, {backend.ErrIsDirectory, fileIsDir},
		{backend.ErrNotDirectory, fileNotDir}, {backend.ErrTooManyEntries, fileTooMany}, {backend.ErrInvalidArgument, fileInvalid},
	}
	switch {
	case err == nil:
		return d
	case errors.As(err, &tooLarge):
		d.code, d.size = fileTooLarge, tooLarge.Size
		return d
	}
	d.code, d.text = fileFailed, err.Error()
	for _, c := range codes {
		if errors.Is(err, c.sentinel) {
			d.code = c.code
			d.text = strings.TrimPrefix(err.Error(), c.sentinel.Error()+": ")
		}
	}
	return d
}

// codeSentinels maps a done frame's code back to the backend's sentinel.
var codeSentinels = map[uint32]error{
	fileBadPath: backend.ErrBadPath, fileNotFound: backend.ErrPathNotFound, fileIsDir: backend.ErrIsDirectory,
	fileNotDir: backend.ErrNotDirectory, fileTooMany: backend.ErrTooManyEntries, fileInvalid: backend.ErrInvalidArgument,
}

// appendEntry encodes one listing entry: is-dir byte, u16 length, name.
func appendEntry(b []byte, e backend.DirEntry) []byte {
	dir := byte(0)
	if e.IsDir {
		dir = 1
	}
	b = append(b, dir)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(e.Name)))
	return append(b, e.Name...)
}

// decodeEntries parses appendEntry's output: at most max entries, each
// name 1-255 bytes without '/' or NUL.
func decodeEntries(b []byte, max int) ([]backend.DirEntry, error) {
	var out []backend.DirEntry
	for len(b) > 0 {
		if len(b) < 3 || b[0] > 1 {
			return nil, fmt.Errorf("%w: a listing entry is malformed", errBadFrame)
		}
		n := int(binary.LittleEndian.Uint16(b[1:]))
		name := b[3:]
		if n == 0 || n > 255 || n > len(name) || strings.ContainsAny(string(name[:n]), "/\x00") || len(out) >= max {
			return nil, fmt.Errorf("%w: a listing entry is malformed, or one too many", errBadFrame)
		}
		out = append(out, backend.DirEntry{Name: string(name[:n]), IsDir: b[0] == 1})
		b = name[n:]
	}
	return out, nil
}

// entryBytes bounds a listing of max entries as encoded.
func entryBytes(max int) int64 { return int64(max) * (3 + 255) }

// errnoOf is an errno as a done frame carries it.
func errnoOf(v uint32) syscall.Errno { return syscall.Errno(v) }
