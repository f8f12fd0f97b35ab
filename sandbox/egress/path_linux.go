package egress

import (
	"errors"
	"fmt"
	"os"
)

// Path is one sandbox's way out: a network namespace of its own (NewNetns)
// whose TUN device a Session serves under the sandbox's Policy. A backend
// starts the sandbox in NS (bwrap from a thread entered into it; runsc
// --network=sandbox with the OCI spec's network namespace pointing at it),
// and closes the Path when that sandbox's processes are gone; a restarted
// sandbox gets a new one.
type Path struct {
	NS   *os.File // the namespace; keeps it alive until Close
	Sess *Session
}

// NewPath makes sandbox's namespace and serves it under p. Making one needs
// CAP_SYS_ADMIN, CAP_NET_ADMIN and /dev/net/tun; the error says which step
// failed.
func (e *Egress) NewPath(sandbox, owner string, p Policy) (*Path, error) {
	ns, err := NewNetns()
	if err != nil {
		return nil, fmt.Errorf("cannot make the network namespace: %w", err)
	}
	sess, err := e.Serve(ns.TUN, sandbox, owner, p) // owns the TUN device from here on
	if err != nil {
		ns.NS.Close()
		return nil, fmt.Errorf("cannot serve its network: %w", err)
	}
	return &Path{NS: ns.NS, Sess: sess}, nil
}

// Close ends the session (which closes the TUN device) and drops the
// namespace. A nil Path closes nothing; a second Close returns an error
// and changes nothing.
func (p *Path) Close() error {
	if p == nil {
		return nil
	}
	return errors.Join(p.Sess.Close(), p.NS.Close())
}
