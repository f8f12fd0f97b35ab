package gvisor

// Egress allow-lists. A sandbox whose spec names allow_egress_to or
// allow_egress_to_cidrs (network "allowlist") boots with runsc
// --network=sandbox in a network namespace the daemon made for it
// (egress.Path): lo and a TUN device whose other end the daemon's egress
// netstack serves. runsc copies that namespace's interfaces, addresses and
// routes into the sentry's own netstack and hands it an AF_PACKET socket on
// the TUN device (no MAC: raw IP packets, no Ethernet header), so every
// packet the guest sends leaves gVisor's netstack for the daemon's, which
// checks it against the sandbox's policy (sandbox/egress). The guest's
// /etc/resolv.conf names the daemon's resolver. Every other sandbox keeps
// --network=none: a loopback device and nothing else.
//
// The path lives as long as the gVisor sandbox it was made for: a sandbox
// re-adopted after a restart boots with a new one (the old TUN device went
// with the dead daemon's descriptor, and the namespace with its last
// process), as the bubblewrap backend's inits do.

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/resources"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress"
)

const (
	// networkAllowlist: the sandbox's only way out is the egress path.
	networkAllowlist = "allowlist"
	// netnsPath is what the OCI spec names as the sandbox's network
	// namespace: descriptor 3 of `runsc run` (its first ExtraFiles entry),
	// which joins it to start the sentry in, in that same process. The
	// path is read only then.
	netnsPath = "/proc/self/fd/3"
	// resolvName is the sandbox's /etc/resolv.conf in Dir/<id>.
	resolvName = "resolv.conf"
)

// egressPolicy checks a spec's allow-lists for this daemon.
func (b *Backend) egressPolicy(names, cidrs []string) (egress.Policy, error) {
	return resources.EgressPolicy(b.cfg.Egress, names, cidrs, "the packaged unit's gvisor and egress drop-ins")
}

// networkFor is the network a spec asks for: allowlist with lists, else
// none (block_network=false alone is refused: the host's network is never
// given).
func (b *Backend) networkFor(spec backend.Spec) (string, error) {
	if len(spec.AllowEgressTo) > 0 || len(spec.AllowEgressToCIDRs) > 0 {
		if _, err := b.egressPolicy(spec.AllowEgressTo, spec.AllowEgressToCIDRs); err != nil {
			return "", err
		}
		return networkAllowlist, nil
	}
	if spec.BlockNetwork != nil && !*spec.BlockNetwork {
		return "", fmt.Errorf("%w: the gvisor backend never gives a sandbox the host's network; keep block_network=true, or name what it may reach in allow_egress_to or allow_egress_to_cidrs (with egress enabled on the daemon)", backend.ErrSpecUnenforceable)
	}
	return networkNone, nil
}

// startEgress makes the namespace sb's next gVisor sandbox boots in.
func (b *Backend) startEgress(sb *sandbox) (*egress.Path, error) {
	p, err := b.egressPolicy(sb.egressTo, sb.egressCIDRs)
	if err != nil {
		return nil, err
	}
	ep, err := b.cfg.Egress.NewPath(sb.id, "", p)
	if err != nil {
		return nil, fmt.Errorf("%w: sandbox %s: %v; egress on gvisor needs CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_NET_RAW and /dev/net/tun (the packaged unit's gvisor and egress drop-ins together grant them)", backend.ErrUnavailable, sb.id, err)
	}
	return ep, nil
}

// runscNetwork is flags with runsc's network set for sb: an allowlist
// sandbox's sentry gets the interfaces of the namespace the daemon made
// (--network=sandbox), and no host segmentation offload (--gso=false):
// with it runsc asks for virtio-net headers on its AF_PACKET socket and
// leaves the TCP checksum of what the sentry sends to the device, which
// the TUN device (no IFF_VNET_HDR) passes on unfilled: the daemon's
// netstack counted every segment a checksum error and no connection got
// through. gVisor's own segmentation (--software-gso, on by default)
// computes them.
func runscNetwork(flags []string, sb *sandbox) []string {
	if sb.network != networkAllowlist {
		return flags
	}
	out := make([]string, 0, len(flags)+1)
	for _, f := range flags {
		if f == "--network=none" {
			out = append(out, "--network=sandbox", "--gso=false")
			continue
		}
		out = append(out, f)
	}
	return out
}

// writeResolvConf writes the /etc/resolv.conf an allowlist sandbox sees:
// the daemon's resolver.
func writeResolvConf(sb *sandbox) error {
	p := filepath.Join(sb.dir, resolvName)
	if err := os.WriteFile(p, []byte(egress.ResolvConf()), 0o644); err != nil {
		return err
	}
	return os.Chmod(p, 0o644) // whatever the daemon's umask: the guest reads it
}
