package bwrap

import (
	"fmt"
	"os"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/resources"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress"
)

// networkAllowlist is a sandbox whose only way out is the daemon's egress
// path: a network namespace of its own made by the daemon, with a TUN
// device served by sandbox/egress under the spec's allow-lists.
const networkAllowlist = "allowlist"

// egressPolicy checks a spec's allow-lists for this daemon.
func (b *Backend) egressPolicy(names, cidrs []string) (egress.Policy, error) {
	return resources.EgressPolicy(b.cfg.Egress, names, cidrs, "the packaged unit's egress drop-in")
}

// egressPath is one init's network (an egress.Path): its namespace and the
// session serving it. It lives as long as the init: a new init (after a
// restart) gets a new one.
type egressPath struct{ path *egress.Path }

// startEgress makes the namespace sb's next init starts in.
func (b *Backend) startEgress(sb *sandbox) (*egressPath, error) {
	p, err := b.egressPolicy(sb.egressTo, sb.egressCIDRs)
	if err != nil {
		return nil, err
	}
	ep, err := b.cfg.Egress.NewPath(sb.id, "", p)
	if err != nil {
		return nil, fmt.Errorf("%w: sandbox %s: %v; egress needs CAP_SYS_ADMIN, CAP_NET_ADMIN and /dev/net/tun (the packaged unit's egress drop-in grants them)", backend.ErrUnavailable, sb.id, err)
	}
	return &egressPath{path: ep}, nil
}

func (ep *egressPath) close(log interface{ Warn(string, ...any) }) {
	if ep == nil {
		return
	}
	if err := ep.path.Close(); err != nil { // closes the TUN device too
		log.Warn("egress", "error", err.Error())
	}
}

func (ep *egressPath) netns() *os.File {
	if ep == nil {
		return nil
	}
	return ep.path.NS
}
