// Package agent is the part of a sandbox's init that owns durable
// processes, shared by the bubblewrap and gVisor inits: a process that
// outlives the request that started it runs under a keeper, a small
// process of its own (the init's executable again) that spawns it, copies
// its output into logs the daemon made (proclog), keeps its budget, sends
// it signals, and writes its exit record before it says it ended. Init
// holds a Table of its keepers and spares their processes when it cleans
// up after a command.
//
// Why a keeper per process, not init itself: a keeper is a child
// subreaper (PR_SET_CHILD_SUBREAPER), so every descendant of its process,
// a double-forked daemon included, is re-parented to the keeper and never
// to init. Init's direct children are then its commands' leftovers, the
// opener and keepers, and nothing else: a command's clean-up kills every
// direct child but the keepers, and their process trees are untouched.
// The keeper also writes the exit record itself, so a process that ends
// while no daemon is up still leaves one.
//
// It imports nothing of the daemon's side: the sandbox's small init links
// it.
package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/wirefmt"
)

// Bounds on what a process's request may hold.
const (
	MaxArgv        = 4096
	MaxEnv         = 4096
	MaxIDLen       = 64
	MaxRequestSize = 4 << 20
	requestMagic   = 0x6b656570 // "keep"
)

// Request is what a keeper is asked to run.
type Request struct {
	// ID names the process (the daemon's, e.g. "p-0123abcd").
	ID        string
	Argv, Env []string
	Cwd       string
	// Timeout is the process's budget; 0: none, it runs until it ends or
	// is signalled. KillGrace is how long after SIGTERM at the budget it
	// gets SIGKILL.
	Timeout, KillGrace time.Duration
	// UID and GID, when UID is not 0, are the identity the process runs as
	// (gVisor's keepers run as root and drop to the guest's).
	UID, GID uint32
}

// Encode returns r as a keeper reads it.
func (r Request) Encode() []byte {
	buf := binary.LittleEndian.AppendUint32(nil, requestMagic)
	buf = wirefmt.AppendString(buf, r.ID)
	buf = wirefmt.AppendList(buf, r.Argv)
	buf = wirefmt.AppendList(buf, r.Env)
	buf = wirefmt.AppendString(buf, r.Cwd)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(r.Timeout))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(r.KillGrace))
	buf = binary.LittleEndian.AppendUint32(buf, r.UID)
	buf = binary.LittleEndian.AppendUint32(buf, r.GID)
	return buf
}

// ErrBadRequest is a request that does not decode or does not hold.
var ErrBadRequest = errors.New("malformed process request")

// DecodeRequest reads and checks a request.
func DecodeRequest(b []byte) (Request, error) {
	if len(b) > MaxRequestSize {
		return Request{}, fmt.Errorf("%w: %d bytes", ErrBadRequest, len(b))
	}
	d := wirefmt.NewDecoder(b)
	var r Request
	magic, ok := d.U32()
	if !ok || magic != requestMagic {
		return r, fmt.Errorf("%w: bad magic", ErrBadRequest)
	}
	if r.ID, ok = d.String(); !ok || !ValidID(r.ID) {
		return r, fmt.Errorf("%w: bad id", ErrBadRequest)
	}
	var err error
	if r.Argv, r.Env, r.Cwd, err = d.Command(MaxArgv, MaxEnv); err != nil {
		return r, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	timeout, ok1 := d.U64()
	grace, ok2 := d.U64()
	uid, ok3 := d.U32()
	gid, ok4 := d.U32()
	if !ok1 || !ok2 || !ok3 || !ok4 || d.Left() != 0 || timeout > uint64(48*time.Hour) || grace > uint64(time.Hour) {
		return r, fmt.Errorf("%w: bad budget or identity", ErrBadRequest)
	}
	r.Timeout, r.KillGrace, r.UID, r.GID = time.Duration(timeout), time.Duration(grace), uid, gid
	return r, nil
}

// ValidID reports whether id may name a process: 1 to MaxIDLen bytes of
// lower-case letters, digits and '-'.
func ValidID(id string) bool {
	if id == "" || len(id) > MaxIDLen {
		return false
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
