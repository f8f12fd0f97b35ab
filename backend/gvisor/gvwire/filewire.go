package gvwire

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
	FileRead  = 1 // n: max bytes
	FileRange = 2 // offset, n: length
	FileList  = 3 // n: max entries
)

// Result codes of a file done frame.
const (
	FileOK       = 0
	FileErrno    = 1 // the open failed with errno
	FileBadPath  = 2
	FileNotFound = 3
	FileIsDir    = 4
	FileNotDir   = 5
	FileTooLarge = 6 // size is the size seen
	FileTooMany  = 7
	FileInvalid  = 8
	FileFailed   = 9
)

const (
	FileRequestHeader = 24 // seq, op, offset, n
	FileDoneHeader    = 24 // seq, code, errno, pad, size
	// MaxFileData is a file data frame's payload: the seq and a piece.
	MaxFileData = MaxChunk
)

// FileRequest is one file operation on a path of the guest's view.
type FileRequest struct {
	Seq       uint32
	Op        uint32
	Offset, N int64
	Path      string // absolute; resolved by the guest's kernel
}

func (r FileRequest) Encode() []byte {
	b := binary.LittleEndian.AppendUint32(nil, r.Seq)
	b = binary.LittleEndian.AppendUint32(b, r.Op)
	b = binary.LittleEndian.AppendUint64(b, uint64(r.Offset))
	b = binary.LittleEndian.AppendUint64(b, uint64(r.N))
	return append(b, r.Path...)
}

// DecodeFileRequest checks a file op frame: a known op, non-negative
// numbers, an absolute path without NUL within backend.MaxGuestPathLen.
func DecodeFileRequest(p []byte) (FileRequest, error) {
	if len(p) < FileRequestHeader {
		return FileRequest{}, fmt.Errorf("%w: file op of %d bytes", ErrBadFrame, len(p))
	}
	d := wirefmt.NewDecoder(p)
	var r FileRequest
	r.Seq, _ = d.U32()
	r.Op, _ = d.U32()
	off, _ := d.U64()
	n, _ := d.U64()
	r.Offset, r.N = int64(off), int64(n)
	r.Path = string(p[FileRequestHeader:])
	switch {
	case r.Op < FileRead || r.Op > FileList:
		return FileRequest{}, fmt.Errorf("%w: file op %d", ErrBadFrame, r.Op)
	case r.Offset < 0 || r.N < 0:
		return FileRequest{}, fmt.Errorf("%w: negative offset or bound", ErrBadFrame)
	case r.Path == "" || r.Path[0] != '/' || strings.IndexByte(r.Path, 0) >= 0 || len(r.Path) > backend.MaxGuestPathLen:
		return FileRequest{}, fmt.Errorf("%w: the path is not absolute, holds a NUL or is too long", ErrBadFrame)
	}
	return r, nil
}

// FileDone is how a file op ended.
type FileDone struct {
	Seq         uint32
	Code, Errno uint32
	Size        int64
	Text        string // what went wrong, in init's words (for fileBadPath and the like)
}

func (d FileDone) Encode() []byte {
	b := binary.LittleEndian.AppendUint32(nil, d.Seq)
	b = binary.LittleEndian.AppendUint32(b, d.Code)
	b = binary.LittleEndian.AppendUint32(b, d.Errno)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(d.Size))
	return append(b, truncate(d.Text, MaxReasonBytes-8)...)
}

func DecodeFileDone(p []byte) (FileDone, error) {
	if len(p) < FileDoneHeader {
		return FileDone{}, fmt.Errorf("%w: file done of %d bytes", ErrBadFrame, len(p))
	}
	d := FileDone{
		Seq:   binary.LittleEndian.Uint32(p),
		Code:  binary.LittleEndian.Uint32(p[4:]),
		Errno: binary.LittleEndian.Uint32(p[8:]),
		Size:  int64(binary.LittleEndian.Uint64(p[16:])),
		Text:  strings.ToValidUTF8(string(p[FileDoneHeader:]), "?"),
	}
	if d.Code > FileFailed || d.Size < 0 {
		return FileDone{}, fmt.Errorf("%w: file done code %d size %d", ErrBadFrame, d.Code, d.Size)
	}
	return d, nil
}

// FileDoneOf is the done frame for err, the outcome of an op whose path
// opened (init's side): the backend sentinel it wraps as a code, and the
// rest of its message as text.
func FileDoneOf(seq uint32, err error) FileDone {
	d := FileDone{Seq: seq}
	var tooLarge *backend.FileTooLargeError
	codes := []struct {
		sentinel error
		code     uint32
	}{
		{backend.ErrBadPath, FileBadPath}, {backend.ErrPathNotFound, FileNotFound}, {backend.ErrIsDirectory, FileIsDir},
		{backend.ErrNotDirectory, FileNotDir}, {backend.ErrTooManyEntries, FileTooMany}, {backend.ErrInvalidArgument, FileInvalid},
	}
	switch {
	case err == nil:
		return d
	case errors.As(err, &tooLarge):
		d.Code, d.Size = FileTooLarge, tooLarge.Size
		return d
	}
	d.Code, d.Text = FileFailed, err.Error()
	for _, c := range codes {
		if errors.Is(err, c.sentinel) {
			d.Code = c.code
			d.Text = strings.TrimPrefix(err.Error(), c.sentinel.Error()+": ")
		}
	}
	return d
}

// CodeSentinels maps a done frame's code back to the backend's sentinel.
var CodeSentinels = map[uint32]error{
	FileBadPath: backend.ErrBadPath, FileNotFound: backend.ErrPathNotFound, FileIsDir: backend.ErrIsDirectory,
	FileNotDir: backend.ErrNotDirectory, FileTooMany: backend.ErrTooManyEntries, FileInvalid: backend.ErrInvalidArgument,
}

// AppendEntry encodes one listing entry: is-dir byte, u16 length, name.
func AppendEntry(b []byte, e backend.DirEntry) []byte {
	dir := byte(0)
	if e.IsDir {
		dir = 1
	}
	b = append(b, dir)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(e.Name)))
	return append(b, e.Name...)
}

// DecodeEntries parses AppendEntry's output: at most max entries, each
// name 1-255 bytes without '/' or NUL.
func DecodeEntries(b []byte, max int) ([]backend.DirEntry, error) {
	var out []backend.DirEntry
	for len(b) > 0 {
		if len(b) < 3 || b[0] > 1 {
			return nil, fmt.Errorf("%w: a listing entry is malformed", ErrBadFrame)
		}
		n := int(binary.LittleEndian.Uint16(b[1:]))
		name := b[3:]
		if n == 0 || n > 255 || n > len(name) || strings.ContainsAny(string(name[:n]), "/\x00") || len(out) >= max {
			return nil, fmt.Errorf("%w: a listing entry is malformed, or one too many", ErrBadFrame)
		}
		out = append(out, backend.DirEntry{Name: string(name[:n]), IsDir: b[0] == 1})
		b = name[n:]
	}
	return out, nil
}

// EntryBytes bounds a listing of max entries as encoded.
func EntryBytes(max int) int64 { return int64(max) * (3 + 255) }

// ErrnoOf is an errno as a done frame carries it.
func ErrnoOf(v uint32) syscall.Errno { return syscall.Errno(v) }
