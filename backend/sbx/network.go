package sbx

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/internal/hostname"
)

// sbx filters a sandbox's egress by hostname in a proxy on the host, by
// the host's global preset (sbx policy init), per-sandbox rules (ours, and
// those its agent kit adds, even under deny-all) and, when an organisation
// governs the account, the organisation's rules, which make every local
// and kit allow rule inactive. A deny rule wins over any allow, from any
// source. So:
//
//   - a sandbox with no network gets the deny rule "**" at create
//     (sbx create --deny-network, v0.38), which holds on any preset and
//     under governance;
//   - an allow-list needs a deny-all host (nothing else can be narrowed to
//     a list), no governance (its allow rules would be inactive) and no
//     kit allow rules (the sandbox would reach more than listed);
//   - what is in force is read back after create with
//     sbx policy check network --sandbox NAME, and a sandbox whose policy
//     says otherwise is removed.

// denyAll is sbx's pattern for every destination.
const denyAll = "**"

// checkTarget is a name no allow-list holds (.invalid is reserved, RFC
// 2606); policy check evaluates rules, it sends nothing. checkPublic is one
// a preset or a kit may well allow.
const (
	checkTarget = "sandbox-sidecar-check.invalid"
	checkPublic = "pypi.org"
)

// networkCheckTimeout bounds the whole read-back of a new sandbox's policy
// (a kit listing and one policy check per target, each also bounded by
// policyTimeout).
const networkCheckTimeout = 2 * time.Minute

// networkPlan is what a create does for a spec's network.
type networkPlan struct {
	network  string   // reported in backend.Info
	hosts    []string // allow_egress_to in normal form (ours: "*.x" any depth)
	deny     bool     // sbx create --deny-network "**"
	required bool     // the spec asked for network (block_network=false)
}

// networkFor decides what network a spec gets on a host with policy p, or
// refuses a spec the host cannot enforce. allow_egress_to_cidrs is never
// enforceable (sbx filters by name); allow_egress_to only on a deny-all
// host; block_network=true everywhere (a per-sandbox deny of "**");
// block_network=false only where the sandbox really gets some network.
func networkFor(p HostPolicy, spec backend.Spec) (networkPlan, error) {
	if len(spec.AllowEgressToCIDRs) > 0 {
		return networkPlan{}, fmt.Errorf("%w: the sbx backend filters egress by hostname only, so it cannot limit a sandbox to allow_egress_to_cidrs; list hostnames in allow_egress_to instead", backend.ErrSpecUnenforceable)
	}
	hosts, err := checkEgressHosts(spec.AllowEgressTo)
	if err != nil {
		return networkPlan{}, err
	}
	block := spec.BlockNetwork != nil && *spec.BlockNetwork
	want := spec.BlockNetwork != nil && !*spec.BlockNetwork
	switch {
	case len(hosts) > 0 && p != PolicyDenyAll:
		return networkPlan{}, fmt.Errorf("%w: allow_egress_to needs the host's sbx policy to be deny-all (it is declared %s), otherwise the sandbox could reach more than the listed hosts; an operator must run \"sbx policy init deny-all\" and declare it to the daemon", backend.ErrSpecUnenforceable, p)
	case len(hosts) > 0:
		return networkPlan{network: networkAllowList, hosts: hosts}, nil
	case block:
		return networkPlan{network: networkNone, deny: true}, nil
	case want && p == PolicyDenyAll:
		return networkPlan{}, fmt.Errorf("%w: block_network=false cannot be met: the host's sbx policy is deny-all, so the sandbox would have no network; list the hosts it needs in allow_egress_to", backend.ErrSpecUnenforceable)
	case want && p != PolicyAllowAll:
		return networkPlan{}, fmt.Errorf("%w: block_network=false cannot be guaranteed: the host's sbx policy is not declared, so the sandbox may have no network; list the hosts it needs in allow_egress_to on a deny-all host, or an operator can declare the host's policy", backend.ErrSpecUnenforceable)
	case want:
		return networkPlan{network: networkOpen, required: true}, nil
	}
	switch p {
	case PolicyDenyAll:
		// Kits may add allow rules even under deny-all: "none" is made
		// true by a deny of everything.
		return networkPlan{network: networkNone, deny: true}, nil
	case PolicyAllowAll:
		return networkPlan{network: networkOpen}, nil
	}
	return networkPlan{network: networkUnknown}, nil
}

// checkEgressHosts checks allow_egress_to by the same syntax the egress
// netstack uses (internal/hostname: a hostname, an optional leading "*."
// and ":port"; no commas, which sbx splits on, no spaces, nothing that
// reads as a flag) and returns the entries in normal form (lower case, no
// trailing dot), sorted, each once.
func checkEgressHosts(hosts []string) ([]string, error) {
	if len(hosts) > maxEgressHosts {
		return nil, fmt.Errorf("%w: allow_egress_to lists %d hosts, more than the %d allowed; use wildcards such as *.example.com", backend.ErrInvalidArgument, len(hosts), maxEgressHosts)
	}
	var out []string
	for _, h := range hosts {
		p, err := hostname.Parse(h)
		switch {
		case errors.Is(err, hostname.ErrBadPort):
			return nil, fmt.Errorf("%w: allow_egress_to entry %s has a bad port (1 to 65535)", backend.ErrInvalidArgument, backend.ShortName(h))
		case errors.Is(err, hostname.ErrBareWild):
			return nil, fmt.Errorf("%w: allow_egress_to entry %s: %v", backend.ErrInvalidArgument, backend.ShortName(h), err)
		case err != nil:
			return nil, fmt.Errorf("%w: allow_egress_to entry %s is not a hostname (%s)", backend.ErrInvalidArgument, backend.ShortName(h), hostname.Rule)
		}
		out = append(out, p.String())
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// sbxPattern is allow_egress_to entry h (normal form) as sbx's rule syntax
// writes it. Ours "*.example.com" is every subdomain, at any depth; sbx's
// "*." matches one level only and "**." any depth, so it becomes
// "**.example.com".
func sbxPattern(h string) string {
	if rest, ok := strings.CutPrefix(h, "*."); ok {
		return "**." + rest
	}
	return h
}

// sbxPatterns is sbxPattern of every entry.
func sbxPatterns(hosts []string) []string {
	out := make([]string, len(hosts))
	for i, h := range hosts {
		out[i] = sbxPattern(h)
	}
	return out
}

// policyProbe is a name allow_egress_to entry h (normal form) covers, for
// policy check: a wildcard's at two levels below its suffix, so that sbx's
// one-level "*." would not cover it.
func policyProbe(h string) string {
	name, port, hasPort := strings.Cut(h, ":")
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		name = "sidecar-check.sub." + rest
	}
	if hasPort {
		return name + ":" + port
	}
	return name
}

// governance returns who manages the host's sbx policy ("Managed by
// <org>", the first line of sbx policy ls under organisation governance),
// or "" when nobody does.
func (b *Backend) governance(ctx context.Context) (string, error) {
	res, err := b.runSbx(ctx, policyTimeout, cliOutputBytes, nil, "policy", "ls")
	switch {
	case err != nil && ctx.Err() != nil:
		return "", fmt.Errorf("the request ended during sbx policy ls: %w", ctx.Err())
	case err == nil && operatorNeeded(res) != nil:
		return "", operatorNeeded(res)
	case err != nil || res.TimedOut || res.ExitCode != 0:
		return "", fmt.Errorf("%w: sbx policy ls failed (%s); check sbx", backend.ErrUnavailable, failure(res, err, policyTimeout))
	}
	for _, line := range strings.Split(string(res.Stdout), "\n") {
		rest, ok := cutPrefixFold(strings.TrimSpace(line), "Governance:")
		if ok && strings.Contains(strings.ToLower(rest), "managed by") {
			return strings.TrimSpace(rest), nil
		}
	}
	return "", nil
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix) {
		return s[len(prefix):], true
	}
	return "", false
}

// kitAllows returns the allow rules sandbox name's agent kit added (sbx
// policy ls NAME --source kit --decision allow --json), as the resources
// they name. The JSON's fields are not documented, so any listed rule
// counts: its resources are only for the message.
func (b *Backend) kitAllows(ctx context.Context, name string) ([]string, error) {
	res, err := b.runSbx(ctx, policyTimeout, cliOutputBytes, nil,
		"policy", "ls", name, "--source", "kit", "--type", "network", "--decision", "allow", "--json")
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, fmt.Errorf("the request ended during sbx policy ls: %w", ctx.Err())
	case err == nil && operatorNeeded(res) != nil:
		return nil, operatorNeeded(res)
	case err != nil || res.TimedOut || res.ExitCode != 0:
		return nil, fmt.Errorf("%w: sbx policy ls %s --source kit failed (%s)", backend.ErrUnavailable, name, failure(res, err, policyTimeout))
	}
	rules, ok := listedRules(res.Stdout)
	if !ok {
		return nil, fmt.Errorf("%w: sbx policy ls --json printed no JSON listing of rules (it began %s); check the sbx version (docs/sbx.md)", backend.ErrUnavailable, backend.ShortName(firstLine(res.Stdout)))
	}
	return rules, nil
}

// listedRules reads a JSON listing of rules: an array, or an object whose
// array fields are the lists. It returns one resource string (or "?") per
// listed rule.
func listedRules(out []byte) ([]string, bool) {
	i := bytes.IndexAny(out, "[{")
	if i < 0 {
		return nil, false
	}
	var doc any
	if json.NewDecoder(bytes.NewReader(out[i:])).Decode(&doc) != nil {
		return nil, false
	}
	var lists [][]any
	switch x := doc.(type) {
	case []any:
		lists = append(lists, x)
	case map[string]any:
		for _, v := range x {
			if l, ok := v.([]any); ok {
				lists = append(lists, l)
			}
		}
	case nil:
		return nil, true
	default:
		return nil, false
	}
	var rules []string
	for _, l := range lists {
		for _, e := range l {
			rules = append(rules, resourcesOf(e)...)
		}
	}
	return rules, true
}

// resourcesOf names what a listed rule covers: the strings under a key
// that mentions "resource", else "?".
func resourcesOf(e any) []string {
	m, ok := e.(map[string]any)
	if !ok {
		return []string{"?"}
	}
	var out []string
	for k, v := range m {
		if !strings.Contains(strings.ToLower(k), "resource") {
			continue
		}
		switch x := v.(type) {
		case string:
			out = append(out, x)
		case []any:
			for _, s := range x {
				if s, ok := s.(string); ok {
					out = append(out, s)
				}
			}
		}
	}
	if len(out) == 0 {
		return []string{"?"}
	}
	slices.Sort(out)
	return out
}

// policyAllows asks sbx whether sandbox name's policy lets target through
// (sbx policy check network --sandbox NAME TARGET, "Allowed: ..." or
// "Denied: ...").
func (b *Backend) policyAllows(ctx context.Context, name, target string) (bool, error) {
	res, err := b.runSbx(ctx, policyTimeout, cliOutputBytes, nil, "policy", "check", "network", "--sandbox", name, target)
	switch {
	case err != nil && ctx.Err() != nil:
		return false, fmt.Errorf("the request ended during sbx policy check: %w", ctx.Err())
	case err == nil && operatorNeeded(res) != nil:
		return false, operatorNeeded(res)
	case err != nil || res.TimedOut:
		return false, fmt.Errorf("%w: sbx policy check network failed (%s)", backend.ErrUnavailable, failure(res, err, policyTimeout))
	}
	for _, line := range strings.Split(string(res.Stdout)+"\n"+string(res.Stderr), "\n") {
		line = strings.TrimSpace(line)
		if _, ok := cutPrefixFold(line, "Allowed:"); ok {
			return true, nil
		}
		if _, ok := cutPrefixFold(line, "Denied:"); ok {
			return false, nil
		}
	}
	return false, fmt.Errorf("%w: sbx policy check network gave no Allowed: or Denied: answer (%s); check the sbx version (docs/sbx.md)", backend.ErrUnavailable, failure(res, nil, policyTimeout))
}

// verifyNetwork reads back, after create, what sbx enforces for sandbox
// name, and refuses (backend.ErrSpecUnenforceable) a policy that is not
// what plan says: "none" must deny; an allow-list must allow each of its
// entries, deny a name it does not hold and come with no allow rules of a
// kit; "open" must allow, or, when the spec did not ask for network, is
// reported "unknown" (an organisation's governance may narrow an
// allow-all host). It returns the network to report.
func (b *Backend) verifyNetwork(ctx context.Context, name string, plan networkPlan) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, networkCheckTimeout)
	defer cancel()
	want := map[string]bool{}
	switch plan.network {
	case networkNone:
		want[checkTarget], want[checkPublic] = false, false
	case networkAllowList:
		kit, err := b.kitAllows(ctx, name)
		if err != nil {
			return "", err
		}
		if len(kit) > 0 {
			return "", fmt.Errorf("%w: sbx's agent kit adds allow rules to the sandbox (%s), so it could reach more than allow_egress_to lists; the sandbox was removed: use block_network, or a template whose kit adds no network rules (sbx policy ls NAME --source kit)", backend.ErrSpecUnenforceable, strings.Join(kit, ", "))
		}
		for _, h := range plan.hosts {
			want[policyProbe(h)] = true
		}
		if _, listed := want[checkTarget]; !listed {
			want[checkTarget] = false
		}
	case networkOpen:
		want[checkTarget] = true
	default:
		return plan.network, nil
	}
	for _, target := range slices.Sorted(maps.Keys(want)) {
		allowed, err := b.policyAllows(ctx, name, target)
		if err != nil {
			return "", err
		}
		if allowed == want[target] {
			continue
		}
		if plan.network == networkOpen && !plan.required {
			return networkUnknown, nil
		}
		verb := "denies"
		if allowed {
			verb = "allows"
		}
		return "", fmt.Errorf("%w: sbx's policy for the new sandbox %s %s %s, which is not the %s network the daemon asked for (sbx policy check network --sandbox %s %s); the sandbox was removed: check sbx policy ls %s (an organisation's governance makes local allow rules inactive) and the sbx version", backend.ErrSpecUnenforceable, name, verb, target, plan.network, name, target, name)
	}
	return plan.network, nil
}
