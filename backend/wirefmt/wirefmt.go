// Package wirefmt is the field encoding the bubblewrap and gVisor
// backends' init protocols share: little-endian integers, strings and byte
// strings prefixed with their uint32 length, lists prefixed with their
// uint32 count. Each backend's messages (which fields, in what order) stay
// its own; this package only reads and writes the fields, every length
// checked against what is left so a bad message cannot make it allocate.
package wirefmt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// AppendString appends s with its length.
func AppendString(buf []byte, s string) []byte {
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(s)))
	return append(buf, s...)
}

// AppendList appends the count of list and each string with its length.
func AppendList(buf []byte, list []string) []byte {
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(list)))
	for _, s := range list {
		buf = AppendString(buf, s)
	}
	return buf
}

// ListSize is how many bytes AppendList adds for list.
func ListSize(list []string) int {
	n := 4
	for _, s := range list {
		n += 4 + len(s)
	}
	return n
}

// Decoder reads fields from the front of a message. Each method reports
// false, consuming an unspecified part of the message, when what is left
// is too short or a field is invalid.
type Decoder struct{ buf []byte }

// NewDecoder reads buf.
func NewDecoder(buf []byte) *Decoder { return &Decoder{buf: buf} }

// Left is how many bytes are not read yet.
func (d *Decoder) Left() int { return len(d.buf) }

// U32 reads a uint32.
func (d *Decoder) U32() (uint32, bool) {
	if len(d.buf) < 4 {
		return 0, false
	}
	v := binary.LittleEndian.Uint32(d.buf)
	d.buf = d.buf[4:]
	return v, true
}

// U64 reads a uint64.
func (d *Decoder) U64() (uint64, bool) {
	if len(d.buf) < 8 {
		return 0, false
	}
	v := binary.LittleEndian.Uint64(d.buf)
	d.buf = d.buf[8:]
	return v, true
}

// Bytes reads a byte string; the result shares the message's memory.
func (d *Decoder) Bytes() ([]byte, bool) {
	n, ok := d.U32()
	if !ok || uint64(n) > uint64(len(d.buf)) {
		return nil, false
	}
	b := d.buf[:n]
	d.buf = d.buf[n:]
	return b, true
}

// String reads a string, which must not contain a NUL byte.
func (d *Decoder) String() (string, bool) {
	b, ok := d.Bytes()
	if !ok {
		return "", false
	}
	s := string(b)
	return s, !strings.ContainsRune(s, 0)
}

// List reads a list of at most limit strings, none containing a NUL.
func (d *Decoder) List(limit uint32) ([]string, bool) {
	n, ok := d.U32()
	// Each entry takes at least its 4-byte length.
	if !ok || n > limit || uint64(n)*4 > uint64(len(d.buf)) {
		return nil, false
	}
	out := make([]string, 0, n)
	for range n {
		s, ok := d.String()
		if !ok {
			return nil, false
		}
		out = append(out, s)
	}
	return out, true
}

// Command reads a command's argv (at most maxArgv entries), environment
// (at most maxEnv) and working directory, as both inits' run requests
// carry them, and checks them: a non-empty argv, and CheckCommand.
func (d *Decoder) Command(maxArgv, maxEnv uint32) (argv, env []string, cwd string, err error) {
	var ok bool
	if argv, ok = d.List(maxArgv); !ok {
		return nil, nil, "", errors.New("bad argv")
	}
	if env, ok = d.List(maxEnv); !ok {
		return nil, nil, "", errors.New("bad environment")
	}
	if cwd, ok = d.String(); !ok {
		return nil, nil, "", errors.New("bad working directory")
	}
	if len(argv) == 0 || argv[0] == "" {
		return nil, nil, "", errors.New("argv is empty")
	}
	if err := CheckCommand(env, cwd); err != nil {
		return nil, nil, "", err
	}
	return argv, env, cwd, nil
}

// CheckCommand checks the parts of a command request both inits share: cwd
// a clean absolute path of at most backend.MaxGuestPathLen bytes, every
// environment entry NAME=value with a non-empty name.
func CheckCommand(env []string, cwd string) error {
	if !path.IsAbs(cwd) || path.Clean(cwd) != cwd || len(cwd) > backend.MaxGuestPathLen {
		return fmt.Errorf("working directory %q is not a clean absolute path", cwd)
	}
	for _, kv := range env {
		if k, _, found := strings.Cut(kv, "="); !found || k == "" {
			return fmt.Errorf("environment entry without a name")
		}
	}
	return nil
}
