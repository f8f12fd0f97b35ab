package service

import (
	"fmt"
	"strings"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
)

// Policy decides who may connect and who is an admin, from the kernel's
// credentials of the peer.
type Policy struct {
	// AllowUIDs and AllowGIDs may connect (a peer in any listed group,
	// primary or supplementary, may).
	AllowUIDs []uint32
	AllowGIDs []uint32
	// AdminUIDs and AdminGIDs may also list and destroy every sandbox.
	AdminUIDs []uint32
	AdminGIDs []uint32
}

// Authorize returns nil if peer may connect, or the reason it may not.
func (p *Policy) Authorize(peer *ipc.Peer) error {
	if p.IsAdmin(peer) {
		return nil
	}
	for _, u := range p.AllowUIDs {
		if peer.UID == u {
			return nil
		}
	}
	for _, g := range p.AllowGIDs {
		if peer.InGroup(g) {
			return nil
		}
	}
	return fmt.Errorf("uid %d (gid %d) is not allowed to use this daemon: it is not in allowed uids [%s] nor in allowed groups [%s]; add the worker's user to the socket's group or to allow_uids",
		peer.UID, peer.GID, join(p.AllowUIDs), join(p.AllowGIDs))
}

// IsAdmin reports whether peer may see and destroy every sandbox.
func (p *Policy) IsAdmin(peer *ipc.Peer) bool {
	for _, u := range p.AdminUIDs {
		if peer.UID == u {
			return true
		}
	}
	for _, g := range p.AdminGIDs {
		if peer.InGroup(g) {
			return true
		}
	}
	return false
}

func join(ids []uint32) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	return strings.Join(s, " ")
}
