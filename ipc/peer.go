package ipc

import (
	"encoding/binary"
	"fmt"
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Peer is who is on the other end of a connection, as the kernel says:
// never what the client claims.
type Peer struct {
	// ConnID numbers connections from 1 within one server's life.
	ConnID uint64
	UID    uint32
	GID    uint32
	PID    int32
	// Groups are the peer's supplementary groups at connect time
	// (SO_PEERGROUPS); nil when the kernel could not say.
	Groups []uint32
}

// InGroup reports whether gid is the peer's primary or a supplementary group.
func (p *Peer) InGroup(gid uint32) bool {
	if p.GID == gid {
		return true
	}
	for _, g := range p.Groups {
		if g == gid {
			return true
		}
	}
	return false
}

func (p *Peer) String() string {
	return fmt.Sprintf("uid=%d gid=%d pid=%d", p.UID, p.GID, p.PID)
}

// PeerOf reads the kernel's credentials for a connected Unix socket.
func PeerOf(c *net.UnixConn) (*Peer, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var (
		cred   *unix.Ucred
		groups []uint32
		opErr  error
	)
	err = raw.Control(func(fd uintptr) {
		cred, opErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if opErr == nil {
			groups = peerGroups(int(fd))
		}
	})
	if err == nil {
		err = opErr
	}
	if err != nil {
		return nil, fmt.Errorf("reading peer credentials (SO_PEERCRED): %w", err)
	}
	return &Peer{UID: cred.Uid, GID: cred.Gid, PID: cred.Pid, Groups: groups}, nil
}

// peerGroups reads SO_PEERGROUPS (Linux 4.13+): the peer's supplementary
// groups as of connect(2). x/sys has no typed wrapper, so call getsockopt
// with a buffer big enough for NGROUPS_MAX (65536) gids.
func peerGroups(fd int) []uint32 {
	buf := make([]byte, 4*256)
	for {
		n := uint32(len(buf))
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		switch {
		case errno == unix.ERANGE && int(n) > len(buf) && n <= 4*65536:
			buf = make([]byte, n)
			continue
		case errno != 0:
			return nil
		}
		out := make([]uint32, 0, n/4)
		for i := 0; i+4 <= int(n); i += 4 {
			out = append(out, binary.NativeEndian.Uint32(buf[i:]))
		}
		return out
	}
}
