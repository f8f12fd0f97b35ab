package main

import (
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
	"github.com/sandbox-sidecar/sandbox-sidecar/metrics"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress"
)

// EgressSection turns on the egress path of bwrap and gvisor sandboxes whose spec
// names allow_egress_to or allow_egress_to_cidrs (docs/operations.md,
// Egress). Off: such specs are refused with spec_unenforceable.
type EgressSection struct {
	Enabled bool `toml:"enabled"`
	// Hosts maps names to addresses the egress resolver answers instead of
	// the host's resolver (an /etc/hosts for sandboxes).
	Hosts map[string][]string `toml:"hosts"`
	// PrivateAllowed lists loopback, private and host-own ranges sandboxes
	// may be let reach (never link-local: the metadata endpoint).
	PrivateAllowed []string `toml:"private_allowed"`
	// MaxConns bounds each sandbox's concurrent connections (default 256).
	MaxConns int `toml:"max_conns"`
	// IdleTimeout closes connections idle this long (default 5m).
	IdleTimeout Duration `toml:"conn_idle_timeout"`
}

func (e EgressSection) validate() []error {
	_, err := e.config(nil)
	if err != nil {
		return []error{err}
	}
	return nil
}

// config is the egress package's Config for this section.
func (e EgressSection) config(audit func(egress.Event)) (egress.Config, error) {
	cfg := egress.Config{MaxConns: e.MaxConns, IdleTimeout: e.IdleTimeout.D(), Audit: audit, Hosts: map[string][]netip.Addr{}}
	if e.MaxConns < 0 || e.MaxConns > 65536 {
		return cfg, fmt.Errorf("egress.max_conns %d: give 1 to 65536 (0: the default, 256)", e.MaxConns)
	}
	if len(e.Hosts) > 4096 {
		return cfg, fmt.Errorf("egress.hosts has %d names, more than 4096", len(e.Hosts))
	}
	for name, addrs := range e.Hosts {
		if len(addrs) == 0 || len(addrs) > 16 {
			return cfg, fmt.Errorf("egress.hosts %q: give 1 to 16 addresses", name)
		}
		for _, a := range addrs {
			ip, err := netip.ParseAddr(a)
			if err != nil {
				return cfg, fmt.Errorf("egress.hosts %q: %q is not an IP address", name, a)
			}
			cfg.Hosts[name] = append(cfg.Hosts[name], ip)
		}
	}
	for _, p := range e.PrivateAllowed {
		pfx, err := netip.ParsePrefix(p)
		if err != nil {
			return cfg, fmt.Errorf("egress.private_allowed %q is not a CIDR", p)
		}
		cfg.PrivateAllowed = append(cfg.PrivateAllowed, pfx)
	}
	if _, err := egress.New(cfg); err != nil {
		return cfg, fmt.Errorf("egress: %v", err)
	}
	return cfg, nil
}

// egressAudit sends egress events to the audit trail, which (like the
// manager whose records name each sandbox's owner) exists only after the
// backend: until then they go to the daemon's log.
type egressAudit struct {
	log      atomic.Pointer[hclog.Logger]
	describe atomic.Pointer[func(string) (lifecycle.Sandbox, bool)]
}

var egressAuditor egressAudit

func (a *egressAudit) set(log hclog.Logger, describe func(string) (lifecycle.Sandbox, bool)) {
	a.log.Store(&log)
	a.describe.Store(&describe)
}

func (a *egressAudit) event(fallback hclog.Logger) func(egress.Event) {
	return func(ev egress.Event) {
		log := fallback
		if l := a.log.Load(); l != nil {
			log = *l
		}
		owner, uid := ev.Owner, ""
		if d := a.describe.Load(); d != nil && ev.Sandbox != "" {
			if sb, ok := (*d)(ev.Sandbox); ok {
				owner, uid = sb.Owner, fmt.Sprint(sb.UID)
			}
		}
		kv := []any{"op", "egress", "sandbox", ev.Sandbox, "owner", owner, "uid", uid, "proto", ev.Proto, "name", ev.Name,
			"allowed", ev.Allowed, "reason", ev.Reason}
		if ev.Addr.IsValid() {
			kv = append(kv, "addr", ev.Addr.String(), "port", ev.Port)
		}
		switch ev.Proto {
		case "dns":
			kv = append(kv, dnsAuditFields(ev)...)
		case "suppressed": // the summary of lines past the sandbox's audit budget
			kv = append(kv, "suppressed", ev.Suppressed, "duration_ms", ev.Duration.Milliseconds())
		default:
			kv = append(kv, "bytes_out", ev.BytesOut, "bytes_in", ev.BytesIn, "duration_ms", ev.Duration.Milliseconds())
		}
		log.Info("audit", kv...)
	}
}

// dnsAuditFields are a DNS audit line's own fields (docs/operations.md,
// Egress): the transport, and for a query the resolver answered its type,
// the reply's code, the addresses handed out and those withheld (lists,
// empty rather than absent).
func dnsAuditFields(ev egress.Event) []any {
	kv := []any{"transport", ev.Transport}
	if ev.RCode == "" && ev.QType == "" {
		return kv // a DNS-over-TCP connection refused or closed: no query to describe
	}
	answers := make([]string, 0, len(ev.Answers))
	for _, a := range ev.Answers {
		answers = append(answers, a.String())
	}
	withheld := make([]string, 0, len(ev.Withheld))
	for _, w := range ev.Withheld {
		withheld = append(withheld, w.String())
	}
	return append(kv, "qtype", ev.QType, "rcode", ev.RCode, "answers", answers, "withheld", withheld)
}

// newEgress is the daemon's egress path, or nil when it is off. On, the
// daemon must be able to make a namespace with a TUN device: it tries once,
// so a host that cannot (the default unit, no /dev/net/tun) fails at start,
// not at the first sandbox.
func newEgress(s EgressSection, log hclog.Logger) (*egress.Egress, error) {
	if !s.Enabled {
		return nil, nil
	}
	cfg, err := s.config(egressAuditor.event(log.Named("audit")))
	if err != nil {
		return nil, err
	}
	e, err := egress.New(cfg)
	if err != nil {
		return nil, err
	}
	ns, err := egress.NewNetns()
	if err != nil {
		return nil, fmt.Errorf("egress.enabled: this daemon cannot make a sandbox's network namespace and TUN device (%v); it needs CAP_SYS_ADMIN, CAP_NET_ADMIN and /dev/net/tun, which the packaged unit grants only with its egress drop-in (docs/operations.md, Egress)", err)
	}
	ns.Close()
	log.Info("egress enabled", "private_allowed", s.PrivateAllowed, "hosts", len(s.Hosts), "max_conns", cfg.MaxConns)
	return e, nil
}

// egressCounts is metrics.Sources.Egress: the egress path's counters.
func (enf *enforcement) egressCounts() (metrics.EgressCounts, bool) {
	e := enf.egress
	if e == nil {
		return metrics.EgressCounts{}, false
	}
	st := e.Stats()
	return metrics.EgressCounts{Refused: st.Refused, DNSDropped: st.DNSDropped, AuditSuppressed: st.AuditSuppressed}, true
}
