package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// rule is one network rule: a decision on a resource (a host pattern),
// from a source (local, kit or org), global or scoped to one sandbox.
type rule struct {
	Decision string `json:"decision"`
	Resource string `json:"resource"`
	Source   string `json:"source"`
	Sandbox  string `json:"sandbox,omitempty"`
}

// presets are the global policies "sbx policy init" chooses between, as
// allow rules; deny-all has none.
var presets = map[string][]string{
	"allow-all": {"**"},
	"balanced":  {"api.anthropic.com", "**.npmjs.org", "pypi.org", "files.pythonhosted.org", "github.com", "**.github.com"},
	"deny-all":  nil,
}

var labelPattern = regexp.MustCompile(`^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$`)

// checkPattern checks a host pattern as sbx's rules take it: "**", or a
// hostname optionally after "*." (one level of subdomain) or "**." (any
// depth), optionally with ":port".
func checkPattern(p string) error {
	host, port, hasPort := strings.Cut(p, ":")
	if hasPort {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("bad port %q", port)
		}
	}
	if host == "**" {
		return nil
	}
	for _, w := range []string{"**.", "*."} {
		if rest, ok := strings.CutPrefix(host, w); ok {
			host = rest
			break
		}
	}
	if host == "" {
		return fmt.Errorf("empty host")
	}
	for _, l := range strings.Split(host, ".") {
		if !labelPattern.MatchString(l) {
			return fmt.Errorf("%q is not a host pattern", p)
		}
	}
	return nil
}

// matches reports whether pattern covers host on port: "*." one level of
// subdomain, "**." any depth (neither the name itself), "**" everything.
func matches(pattern, host string, port int) bool {
	name, pport, hasPort := strings.Cut(pattern, ":")
	if hasPort && pport != strconv.Itoa(port) {
		return false
	}
	switch {
	case name == "**":
		return true
	case strings.HasPrefix(name, "**."):
		return strings.HasSuffix(host, name[2:])
	case strings.HasPrefix(name, "*."):
		sub, ok := strings.CutSuffix(host, name[1:])
		return ok && sub != "" && !strings.Contains(sub, ".")
	}
	return host == name
}

func splitHosts(s string) []string {
	var out []string
	for _, h := range strings.Split(s, ",") {
		if h = strings.ToLower(strings.TrimSpace(h)); h != "" {
			out = append(out, h)
		}
	}
	return out
}

// globalRules are the local rules that apply to every sandbox.
func (f *fake) globalRules() []rule {
	var out []rule
	data, err := os.ReadFile(f.path("rules.json"))
	if err == nil {
		_ = json.Unmarshal(data, &out)
	}
	return out
}

func (f *fake) saveGlobalRules(rules []rule) error {
	data, err := json.Marshal(rules)
	if err != nil {
		return err
	}
	return os.WriteFile(f.path("rules.json"), data, 0o644)
}

func (f *fake) preset() string {
	if b, err := os.ReadFile(f.path("policy")); err == nil {
		return strings.TrimSpace(string(b))
	}
	return "deny-all"
}

// rulesFor are the rules that apply to sandbox r (nil: the global view):
// the preset's, the local global ones, r's own (local and kit) and the
// organisation's.
func (f *fake) rulesFor(r *record) []rule {
	var out []rule
	for _, h := range presets[f.preset()] {
		out = append(out, rule{Decision: "allow", Resource: h, Source: "local"})
	}
	out = append(out, f.globalRules()...)
	if r != nil {
		out = append(out, r.Rules...)
	}
	for _, h := range f.switchList("org-allow") {
		out = append(out, rule{Decision: "allow", Resource: h, Source: "org"})
	}
	return out
}

// active reports whether rule ru takes part in decisions: under an
// organisation's governance local and kit allow rules do not.
func (f *fake) active(ru rule) bool {
	return !(f.switchOn("governance") && ru.Decision == "allow" && ru.Source != "org")
}

// allowed decides host:port for sandbox r: a matching deny wins, then a
// matching active allow; anything else is denied.
func (f *fake) allowed(r *record, host string, port int) bool {
	rules := f.rulesFor(r)
	for _, ru := range rules {
		if ru.Decision == "deny" && matches(ru.Resource, host, port) {
			return false
		}
	}
	for _, ru := range rules {
		if ru.Decision == "allow" && f.active(ru) && matches(ru.Resource, host, port) {
			return true
		}
	}
	return false
}

func (f *fake) policy(args []string) int {
	if len(args) == 0 {
		return fail(1, "\"sbx policy\" requires a command")
	}
	switch args[0] {
	case "init":
		if len(args) != 2 {
			return fail(1, "\"sbx policy init\" requires one of allow-all, balanced, deny-all")
		}
		if _, ok := presets[args[1]]; !ok {
			return fail(1, "unknown policy %q: allow-all, balanced or deny-all", args[1])
		}
		_ = os.WriteFile(f.path("policy"), []byte(args[1]), 0o644)
		_ = os.Remove(f.path("policy-uninit"))
		fmt.Printf("Network policy initialized: %s\n", args[1])
		return 0
	case "allow", "deny":
		return f.policyRule(args[0], args[1:])
	case "rm":
		return f.policyRm(args[1:])
	case "ls":
		return f.policyLs(args[1:])
	case "check":
		return f.policyCheck(args[1:])
	}
	return fail(1, "unknown command %q for \"sbx policy\"", args[0])
}

func (f *fake) policyRule(decision string, args []string) int {
	if decision == "allow" && f.switchOn("policy-fail") {
		return fail(1, "cannot reach the policy service (sbxfake policy-fail)")
	}
	if len(args) == 0 || args[0] != "network" {
		return fail(1, "sbxfake implements only \"policy %s network\"", decision)
	}
	flags, pos, err := flagSet{"--sandbox": {"sandbox", true}}.parse(args[1:], true)
	if err != nil {
		return fail(1, "%v", err)
	}
	var hosts []string
	for _, p := range pos {
		hosts = append(hosts, splitHosts(p)...)
	}
	if len(hosts) == 0 {
		return fail(1, "requires at least one resource")
	}
	for _, h := range hosts {
		if err := checkPattern(h); err != nil {
			return fail(1, "%v", err)
		}
	}
	name := last(flags["sandbox"])
	verb := map[string]string{"allow": "Allowed", "deny": "Denied"}[decision]
	return f.locked(func() int {
		if name == "" {
			rules := f.globalRules()
			for _, h := range hosts {
				rules = append(rules, rule{Decision: decision, Resource: h, Source: "local"})
			}
			if err := f.saveGlobalRules(rules); err != nil {
				return fail(1, "%v", err)
			}
			fmt.Printf("%s %s\n", verb, strings.Join(hosts, ","))
			return 0
		}
		r, ok := f.load(name)
		if !ok {
			return fail(1, "sandbox %s not found", name)
		}
		for _, h := range hosts {
			r.Rules = append(r.Rules, rule{Decision: decision, Resource: h, Source: "local", Sandbox: name})
		}
		if err := f.save(r); err != nil {
			return fail(1, "%v", err)
		}
		fmt.Printf("%s %s for sandbox %s\n", verb, strings.Join(hosts, ","), name)
		return 0
	})
}

func (f *fake) policyRm(args []string) int {
	if len(args) == 0 || args[0] != "network" {
		return fail(1, "sbxfake implements only \"policy rm network\"")
	}
	flags, _, err := flagSet{"--sandbox": {"sandbox", true}, "--resource": {"resource", true}}.parse(args[1:], true)
	if err != nil {
		return fail(1, "%v", err)
	}
	res, name := last(flags["resource"]), last(flags["sandbox"])
	if res == "" {
		return fail(1, "--resource is required")
	}
	return f.locked(func() int {
		keep := func(rules []rule) []rule {
			var out []rule
			for _, ru := range rules {
				if ru.Resource != res || ru.Source != "local" {
					out = append(out, ru)
				}
			}
			return out
		}
		if name == "" {
			return boolCode(f.saveGlobalRules(keep(f.globalRules())))
		}
		r, ok := f.load(name)
		if !ok {
			return fail(1, "sandbox %s not found", name)
		}
		r.Rules = keep(r.Rules)
		return boolCode(f.save(r))
	})
}

func boolCode(err error) int {
	if err != nil {
		return fail(1, "%v", err)
	}
	return 0
}

// policyLs lists the rules, the sandbox's when one is named (global ones
// and its own). Under governance the first line says who manages policy,
// and inactive rules are left out unless --include-inactive.
func (f *fake) policyLs(args []string) int {
	flags, pos, err := flagSet{
		"--type": {"type", true}, "--source": {"source", true}, "--decision": {"decision", true},
		"--json": {"json", false}, "--wide": {"wide", false}, "--include-inactive": {"inactive", false},
	}.parse(args, true)
	if err != nil {
		return fail(1, "%v", err)
	}
	var r *record
	if len(pos) > 0 {
		rec, ok := f.load(pos[0])
		if !ok {
			return fail(1, "sandbox %s not found", pos[0])
		}
		r = rec
	}
	if t := last(flags["type"]); t != "" && t != "all" && t != "network" {
		return fail(1, "unknown --type %q", t)
	}
	var rows []rule
	for _, ru := range f.rulesFor(r) {
		switch {
		case last(flags["source"]) != "" && ru.Source != last(flags["source"]):
		case last(flags["decision"]) != "" && ru.Decision != last(flags["decision"]):
		case !f.active(ru) && len(flags["inactive"]) == 0:
		default:
			rows = append(rows, ru)
		}
	}
	org, governed := f.switchValue("governance")
	if len(flags["json"]) > 0 {
		type entry struct {
			Type      string   `json:"type"`
			Decision  string   `json:"decision"`
			Source    string   `json:"source"`
			Sandbox   string   `json:"sandbox,omitempty"`
			Resources []string `json:"resources"`
			Status    string   `json:"status"`
		}
		out := struct {
			Governance string  `json:"governance,omitempty"`
			Policies   []entry `json:"policies"`
		}{Policies: []entry{}}
		if governed {
			out.Governance = "Managed by " + org
		}
		for _, ru := range rows {
			status := "active"
			if !f.active(ru) {
				status = "inactive"
			}
			out.Policies = append(out.Policies, entry{"network", ru.Decision, ru.Source, ru.Sandbox, []string{ru.Resource}, status})
		}
		b, _ := json.MarshalIndent(out, "", "  ")
		fmt.Println(string(b))
		return 0
	}
	if governed {
		fmt.Printf("Governance: Managed by %s\n", org)
	}
	if len(rows) == 0 {
		fmt.Println("No policies found.")
		return 0
	}
	fmt.Printf("%-8s %-8s %-6s %-30s %s\n", "TYPE", "DECISION", "SOURCE", "SANDBOX", "RESOURCES")
	for _, ru := range rows {
		sb := ru.Sandbox
		if sb == "" {
			sb = "-"
		}
		fmt.Printf("%-8s %-8s %-6s %-30s %s\n", "network", ru.Decision, ru.Source, sb, ru.Resource)
	}
	return 0
}

// policyCheck answers whether the policy (a sandbox's, with --sandbox)
// lets the target through: "Allowed: TARGET" or "Denied: TARGET". Bare
// hosts are checked on port 443.
func (f *fake) policyCheck(args []string) int {
	if len(args) == 0 || args[0] != "network" {
		return fail(1, "sbxfake implements only \"policy check network\"")
	}
	flags, pos, err := flagSet{"--sandbox": {"sandbox", true}, "--json": {"json", false}, "--verbose": {"verbose", false}}.parse(args[1:], true)
	if err != nil {
		return fail(1, "%v", err)
	}
	if len(pos) != 1 {
		return fail(1, "\"sbx policy check network\" requires exactly one target")
	}
	target := pos[0]
	host, port := target, 443
	if u, err := url.Parse(target); err == nil && u.Scheme != "" && u.Host != "" {
		host = u.Hostname()
		port = map[string]int{"http": 80, "https": 443}[u.Scheme]
		if p := u.Port(); p != "" {
			port, _ = strconv.Atoi(p)
		}
	} else if h, p, ok := strings.Cut(target, ":"); ok {
		host = h
		if port, err = strconv.Atoi(p); err != nil {
			return fail(1, "bad port in %q", target)
		}
	}
	host = strings.ToLower(host)
	var r *record
	if name := last(flags["sandbox"]); name != "" {
		rec, ok := f.load(name)
		if !ok {
			return fail(1, "sandbox %s not found", name)
		}
		r = rec
	}
	ok := f.allowed(r, host, port)
	if len(flags["json"]) > 0 {
		decision := "deny"
		if ok {
			decision = "allow"
		}
		b, _ := json.Marshal(map[string]any{"target": target, "decision": decision})
		fmt.Println(string(b))
		return 0
	}
	if ok {
		fmt.Printf("Allowed: %s\n", target)
	} else {
		fmt.Printf("Denied: %s\n", target)
	}
	return 0
}
