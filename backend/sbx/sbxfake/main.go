// Command sbxfake stands in for the Docker Sandboxes CLI (sbx) where there is
// no KVM: the sbx backend's tests build it and point the backend at it.
//
// It follows sbx as its reference documents it for Version (docs/sbx.md has
// the table of what was checked against which page), the part the backend
// uses, with sbx's observable behaviour and its sharp edges:
//
//	sbx [--no-input] [-D] COMMAND ...
//	version [--json]
//	login [--username U --password-stdin]
//	create [--name N] [-m|--memory M] [--cpus N] [-t|--template I] [--pull P]
//	       [--deny-network H]... [-q] AGENT PATH...
//	exec [-i] [-t] [-e K=V|-e K]... [--env-file F] [-u U] [-w DIR] SANDBOX CMD [ARG...]
//	ls [--json] [-q]
//	stop SANDBOX...
//	rm [-f|--force] [--all] SANDBOX...
//	policy init allow-all|balanced|deny-all
//	policy allow|deny network [--sandbox N] HOST[,HOST...]
//	policy ls [SANDBOX] [--source S] [--decision D] [--type T] [--json]
//	policy check network [--sandbox N] [--json] TARGET
//
// A "sandbox" is a record in $SBXFAKE_STATE/sandboxes; exec runs the command
// as a local process (in its own process group, as a command in a microVM is
// out of the CLI's reach; rm and a stop kill it, and everything it started,
// as removing or stopping a microVM does) with the first workspace as its
// working directory. sbx mounts a workspace at its host path, so guest paths
// and host paths are the same here. It is not a sandbox: the command runs on
// the host.
//
// Its state directory is $SBXFAKE_STATE, else $SANDBOXES_STORAGE_ROOT (sbx's
// storage root). Every invocation is appended to its calls.log as a JSON line
// {"args": [...], "env": [...]} (the environment it was given, so a test can
// see what sbx would), and every env file exec reads to envfiles.log as
// {"path": ..., "mode": "0600", "uid": ...}. Behaviours are switched by a
// file of that name in the state directory or by an environment variable
// SBXFAKE_<NAME>:
//
//	version          the version to report (default Version)
//	no-input-unsupported  the global --no-input is an unknown flag
//	signed-out       every command but version, login and policy init starts
//	                 an interactive sign-in and waits for it, or with
//	                 --no-input fails at once naming "sbx login"
//	policy-uninit    create and exec ask for a network preset, or with
//	                 --no-input fail naming "sbx policy init"
//	banner           ls prints a three-line daemon start-up banner first
//	ls-hang          ls never answers
//	create-delay     create takes this long (a duration such as "2s")
//	create-fail      create registers the sandbox, then fails (exit 1)
//	auto-stop-grace  a sandbox stops this long after its last session ended
//	                 (default 30s, sbx's; "off": never). A stop kills every
//	                 process of the sandbox; its files stay. It is noticed
//	                 at the next sbx call (there is no daemon).
//	boot-delay       exec of a stopped sandbox boots it first, taking this long
//	boot-fail        that boot fails; the sandbox stays stopped
//	exec-hang        exec runs the command, then never exits
//	rm-fail          rm fails (exit 1) and removes nothing, as when its daemon is down
//	policy-fail      policy allow network fails (exit 1)
//	governance       an organisation ("Managed by <value>") governs policy:
//	                 local and kit allow rules are inactive
//	org-allow        the organisation's allow rules (comma-separated hosts)
//	kit-allow        allow rules the agent's kit adds to every new sandbox
//	deny-ignored     create's --deny-network rules are not applied (a broken
//	                 sbx, for the backend's read-back)
//	registry-down    pulling an image fails; cached images still work
//	workspace-readonly  commands cannot write the workspaces (as a guest user
//	                 the mount does not let write)
//
// Like sbx: exec on a missing sandbox exits 1 (as a failing command does),
// rm of a missing sandbox exits non-zero, memory below 512 MiB is refused,
// a template without a registry domain is not resolved, and exec of a
// stopped sandbox starts it first.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// Version is the sbx release the fake follows.
const Version = "v0.55.0"

const (
	stateEnv     = "SBXFAKE_STATE"
	storageEnv   = "SANDBOXES_STORAGE_ROOT"
	hangFor      = time.Hour
	guestPATH    = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	tagEnv       = "SBXFAKE_SANDBOX"
	defaultGrace = 30 * time.Second
	// dropCapsArg re-executes the fake as the guest side of an exec that
	// must not write the workspace (workspace-readonly) when run as root.
	dropCapsArg = "__sbxfake-guest-without-dac"
)

// bannerLines is what sbx prints before ls's output when it has to start
// its daemon first.
var bannerLines = []string{
	"Starting sandboxd daemon…",
	"Waiting for sandboxd to be ready…",
	"sandboxd is ready.",
}

// Lines sbx prints when it needs an answer.
const (
	loginNeeded  = "ERROR: you are not signed in to Docker (your session expired). Run 'sbx login' to sign in, then retry."
	deviceCode   = "To sign in, open https://login.docker.com/activate and enter the code WDJB-MJHT\nWaiting for you to finish signing in…"
	policyNeeded = "ERROR: no network policy is set up. Run 'sbx policy init allow-all|balanced|deny-all' first."
	policyPrompt = "Initialize the global network policy for your sandboxes:\n  1. Open\n❯ 2. Balanced\n  3. Locked Down"
)

func main() {
	if len(os.Args) > 2 && os.Args[1] == dropCapsArg {
		os.Exit(guestWithoutDAC(os.Args[2:]))
	}
	os.Exit(run(os.Args[1:]))
}

type fake struct {
	state   string
	noInput bool
}

func run(args []string) int {
	state := os.Getenv(stateEnv)
	if state == "" {
		// sbx's own storage-root variable, which reaches sbx through a
		// daemon that passes sbx nothing else.
		state = os.Getenv(storageEnv)
	}
	if state == "" {
		fmt.Fprintln(os.Stderr, "sbxfake: set "+stateEnv+" or "+storageEnv+" to its state directory")
		return 2
	}
	f := &fake{state: state}
	for _, d := range []string{state, f.path("sandboxes"), f.path("sessions")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "sbxfake:", err)
			return 2
		}
	}
	f.logCall(args)
	// Global flags come before the command.
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		switch args[0] {
		case "--no-input":
			if f.switchOn("no-input-unsupported") {
				return fail(1, "unknown flag: --no-input")
			}
			f.noInput = true
		case "-D", "--debug":
		default:
			return fail(1, "unknown flag: %s", args[0])
		}
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "Usage: sbx COMMAND")
		return 1
	}
	cmd, rest := args[0], args[1:]
	if slices.Contains(rest, "--no-input") && cmd != "exec" {
		if f.switchOn("no-input-unsupported") {
			return fail(1, "unknown flag: --no-input")
		}
		f.noInput = true
	}
	switch cmd {
	case "version", "login", "exec": // exec asks once it has read its own flags
	case "policy":
		if len(rest) == 0 || rest[0] != "init" {
			if code, stop := f.needsSignIn(); stop {
				return code
			}
		}
	default:
		if code, stop := f.needsSignIn(); stop {
			return code
		}
	}
	switch cmd {
	case "version":
		return f.version(rest)
	case "login":
		return f.login(rest)
	case "create":
		return f.create(rest)
	case "exec":
		return f.exec(rest)
	case "ls", "list":
		return f.ls(rest)
	case "stop":
		return f.stop(rest)
	case "rm", "remove":
		return f.rm(rest)
	case "policy":
		return f.policy(rest)
	}
	return fail(1, "unknown command %q for \"sbx\"", cmd)
}

// needsSignIn does what sbx does when its login has expired: start an
// interactive sign-in and wait for it, or with --no-input fail at once.
func (f *fake) needsSignIn() (int, bool) {
	if !f.switchOn("signed-out") {
		return 0, false
	}
	if f.noInput {
		fmt.Fprintln(os.Stderr, loginNeeded)
		return 1, true
	}
	fmt.Fprintln(os.Stderr, deviceCode)
	time.Sleep(hangFor)
	return 1, true
}

// needsPolicy does what sbx does before it runs a sandbox when no network
// preset was chosen: ask, or with --no-input fail.
func (f *fake) needsPolicy() (int, bool) {
	if !f.switchOn("policy-uninit") {
		return 0, false
	}
	if f.noInput {
		fmt.Fprintln(os.Stderr, policyNeeded)
		return 1, true
	}
	fmt.Fprintln(os.Stderr, policyPrompt)
	time.Sleep(hangFor)
	return 1, true
}

func (f *fake) path(parts ...string) string {
	return filepath.Join(append([]string{f.state}, parts...)...)
}

// switchValue returns the behaviour switch name's value: the env variable
// SBXFAKE_<NAME>, else the content of the file <state>/<name>; found says
// whether either is set.
func (f *fake) switchValue(name string) (value string, found bool) {
	env := "SBXFAKE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	if v, ok := os.LookupEnv(env); ok && v != "" && v != "0" {
		return v, true
	}
	if b, err := os.ReadFile(f.path(name)); err == nil {
		return strings.TrimSpace(string(b)), true
	}
	return "", false
}

func (f *fake) switchOn(name string) bool { _, on := f.switchValue(name); return on }

// switchList is a comma-separated switch's entries.
func (f *fake) switchList(name string) []string {
	v, _ := f.switchValue(name)
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// switchDuration is a duration switch's value, or def when unset.
func (f *fake) switchDuration(name string, def time.Duration) (time.Duration, error) {
	v, ok := f.switchValue(name)
	if !ok {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("sbxfake: %s %q: %v", name, v, err)
	}
	return d, nil
}

// locked runs fn holding the state lock, so concurrent invocations see
// consistent records.
func (f *fake) locked(fn func() int) int {
	lk, err := os.OpenFile(f.path("lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sbxfake:", err)
		return 2
	}
	defer lk.Close()
	if err := syscall.Flock(int(lk.Fd()), syscall.LOCK_EX); err != nil {
		fmt.Fprintln(os.Stderr, "sbxfake:", err)
		return 2
	}
	defer syscall.Flock(int(lk.Fd()), syscall.LOCK_UN)
	return fn()
}

func (f *fake) logCall(args []string) {
	line, _ := json.Marshal(map[string]any{"args": args, "pid": os.Getpid(), "env": os.Environ()})
	f.locked(func() int {
		lf, err := os.OpenFile(f.path("calls.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return 2
		}
		defer lf.Close()
		_, _ = lf.Write(append(line, '\n'))
		return 0
	})
}

// version prints the version, as text or (since v0.42.0) JSON.
func (f *fake) version(args []string) int {
	flags, pos, err := flagSet{"--json": {"json", false}}.parse(args, true)
	if err != nil {
		return fail(1, "%v", err)
	}
	if len(pos) > 0 {
		return fail(1, "\"sbx version\" accepts no arguments")
	}
	v := Version
	if s, ok := f.switchValue("version"); ok {
		v = s
	}
	if len(flags["json"]) > 0 {
		if olderThan(v, 0, 42) {
			return fail(1, "unknown flag: --json")
		}
		b, _ := json.Marshal(map[string]string{"version": v, "commit": "0000000sbxfake", "os": "linux", "arch": "amd64"})
		fmt.Println(string(b))
		return 0
	}
	fmt.Printf("sbx version: %s 0000000sbxfake\n", v)
	return 0
}

// olderThan reports whether version v ("v0.41.2") is before major.minor.
func olderThan(v string, major, minor int) bool {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return true
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return true
	}
	return ma < major || (ma == major && mi < minor)
}

// login signs in: non-interactively with --password-stdin (a personal
// access token on stdin), otherwise through the device-code flow.
func (f *fake) login(args []string) int {
	flags, _, err := flagSet{"--username": {"username", true}, "-u": {"username", true}, "--password-stdin": {"password-stdin", false}}.parse(args, true)
	if err != nil {
		return fail(1, "%v", err)
	}
	if len(flags["password-stdin"]) == 0 {
		if f.noInput {
			return fail(1, "signing in needs a browser; pass --username and --password-stdin to sign in without one")
		}
		fmt.Fprintln(os.Stderr, deviceCode)
		time.Sleep(hangFor)
		return 1
	}
	if last(flags["username"]) == "" {
		return fail(1, "--password-stdin needs --username")
	}
	token, _ := io.ReadAll(io.LimitReader(os.Stdin, 64<<10))
	if len(bytes.TrimSpace(token)) == 0 {
		return fail(1, "no password on stdin")
	}
	_ = os.Remove(f.path("signed-out"))
	fmt.Println("Login Succeeded")
	return 0
}

// record is one sandbox.
type record struct {
	Name       string    `json:"name"`
	Agent      string    `json:"agent"`
	Status     string    `json:"status"` // running, stopped, starting, creating, failed
	Workspaces []string  `json:"workspaces"`
	Template   string    `json:"template,omitempty"`
	Memory     string    `json:"memory,omitempty"`
	CPUs       string    `json:"cpus,omitempty"`
	Pull       string    `json:"pull,omitempty"`
	LastUsed   time.Time `json:"last_used"`
	BootPID    int       `json:"boot_pid,omitempty"`
	Rules      []rule    `json:"rules,omitempty"` // scoped to this sandbox
}

func (f *fake) recordPath(name string) string { return f.path("sandboxes", name+".json") }

func (f *fake) load(name string) (*record, bool) {
	if !validName.MatchString(name) {
		return nil, false
	}
	b, err := os.ReadFile(f.recordPath(name))
	if err != nil {
		return nil, false
	}
	var r record
	if json.Unmarshal(b, &r) != nil {
		return nil, false
	}
	return &r, true
}

func (f *fake) save(r *record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp := f.recordPath(r.Name) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, f.recordPath(r.Name))
}

func (f *fake) all() []*record {
	entries, _ := os.ReadDir(f.path("sandboxes"))
	var out []*record
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			if r, ok := f.load(name); ok {
				out = append(out, r)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// grace is how long a sandbox keeps running once its last session ended.
func (f *fake) grace() (time.Duration, bool) {
	if v, _ := f.switchValue("auto-stop-grace"); v == "off" {
		return 0, false
	}
	d, err := f.switchDuration("auto-stop-grace", defaultGrace)
	if err != nil {
		return defaultGrace, true
	}
	return d, true
}

// sessionPath is the file that marks process pid's session in sandbox name.
func (f *fake) sessionPath(name string, pid int) string {
	return f.path("sessions", name+"."+strconv.Itoa(pid))
}

// liveSessions counts the sessions of sandbox name whose process lives.
func (f *fake) liveSessions(name string) int {
	matches, _ := filepath.Glob(f.path("sessions", name+".*"))
	n := 0
	for _, m := range matches {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(m), name+"."))
		if err == nil && alive(pid) {
			n++
		} else if err == nil {
			_ = os.Remove(m)
		}
	}
	return n
}

func alive(pid int) bool {
	return pid > 0 && (syscall.Kill(pid, 0) == nil || errors.Is(syscall.Kill(pid, 0), syscall.EPERM))
}

// refresh applies what sbx's daemon would have done since the record was
// written: a running sandbox without a session stops once its grace has
// passed, killing what still ran in it; a boot whose CLI died leaves it
// stopped. Called holding the lock.
func (f *fake) refresh(r *record) {
	switch r.Status {
	case "starting":
		if !alive(r.BootPID) {
			r.Status, r.BootPID = "stopped", 0
			_ = f.save(r)
		}
	case "running":
		grace, on := f.grace()
		if !on || f.liveSessions(r.Name) > 0 || time.Since(r.LastUsed) < grace {
			return
		}
		f.stopLocked(r)
	}
}

// stopLocked stops sandbox r: every process in it dies, its files stay.
func (f *fake) stopLocked(r *record) {
	f.killProcesses(r.Name)
	r.Status = "stopped"
	_ = f.save(r)
}

// flagDef describes one flag: its canonical name and whether it takes a value.
type flagDef struct {
	canon string
	value bool
}

type flagSet map[string]flagDef

// parse reads flags and positional arguments the way sbx's cobra commands
// do: long flags with "=" or a separate value, combined short flags, "--"
// ending flags. Unless interspersed, the first positional argument ends the
// flags too (docker exec: the rest is the command). The global flags may
// appear among a command's own.
func (fs flagSet) parse(args []string, interspersed bool) (map[string][]string, []string, error) {
	fs["-D"] = flagDef{"debug", false}
	fs["--debug"] = flagDef{"debug", false}
	fs["--no-input"] = flagDef{"no-input", false}
	flags := map[string][]string{}
	var pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return flags, append(pos, args[i+1:]...), nil
		case strings.HasPrefix(a, "--"):
			name, val, hasVal := strings.Cut(a, "=")
			d, ok := fs[name]
			if !ok {
				return nil, nil, fmt.Errorf("unknown flag: %s", name)
			}
			if d.value && !hasVal {
				if i+1 >= len(args) {
					return nil, nil, fmt.Errorf("flag needs an argument: %s", name)
				}
				i++
				val = args[i]
			}
			flags[d.canon] = append(flags[d.canon], val)
		case strings.HasPrefix(a, "-") && len(a) > 1:
			for j := 1; j < len(a); j++ {
				d, ok := fs["-"+a[j:j+1]]
				if !ok {
					return nil, nil, fmt.Errorf("unknown shorthand flag: %q in %s", a[j], a)
				}
				if !d.value {
					flags[d.canon] = append(flags[d.canon], "")
					continue
				}
				val := a[j+1:]
				if val == "" {
					if i+1 >= len(args) {
						return nil, nil, fmt.Errorf("flag needs an argument: %q in %s", a[j], a)
					}
					i++
					val = args[i]
				}
				flags[d.canon] = append(flags[d.canon], val)
				break
			}
		default:
			if !interspersed {
				return flags, append(pos, args[i:]...), nil
			}
			pos = append(pos, a)
		}
	}
	return flags, pos, nil
}

func last(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

var (
	validName   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.+-]{1,127}$`)
	memoryValue = regexp.MustCompile(`^([0-9]+)([kmgt]?)(i?b)?$`)
)

func fail(code int, format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "ERROR: "+format+"\n", args...)
	return code
}

// hasRegistryDomain reports whether image reference ref names its
// registry: the part before the first '/' holds a '.' or a ':' or is
// localhost. sbx resolves only such references.
func hasRegistryDomain(ref string) bool {
	first, _, ok := strings.Cut(ref, "/")
	return ok && (strings.ContainsAny(first, ".:") || first == "localhost")
}

// pull makes image available as policy says: always contacts the
// registry, missing only when the image is not cached, never not at all.
func (f *fake) pull(image, policy string) error {
	cache := f.path("images")
	data, _ := os.ReadFile(cache)
	cached := slices.Contains(strings.Split(string(data), "\n"), image)
	switch {
	case policy == "never" && !cached:
		return fmt.Errorf("image %s is not present locally and --pull=never forbids pulling it", image)
	case policy == "never", policy == "missing" && cached:
		return nil
	}
	lf, err := os.OpenFile(f.path("pulls.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err == nil {
		fmt.Fprintln(lf, image)
		lf.Close()
	}
	if !hasRegistryDomain(image) {
		return fmt.Errorf("failed to resolve image %s: pull access denied, repository does not exist or may require authorization", image)
	}
	if f.switchOn("registry-down") {
		return fmt.Errorf("failed to resolve image %s: dial tcp: connect: connection refused", image)
	}
	if !cached {
		cf, err := os.OpenFile(cache, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer cf.Close()
		fmt.Fprintln(cf, image)
	}
	return nil
}

func (f *fake) create(args []string) int {
	flags, pos, err := flagSet{
		"--name": {"name", true}, "-m": {"memory", true}, "--memory": {"memory", true},
		"--cpus": {"cpus", true}, "-t": {"template", true}, "--template": {"template", true},
		"-q": {"quiet", false}, "--quiet": {"quiet", false}, "--pull": {"pull", true},
		"--deny-network": {"deny-network", true},
	}.parse(args, true)
	if err != nil {
		return fail(1, "%v", err)
	}
	if len(pos) < 2 {
		return fail(1, "requires an agent and at least one workspace path")
	}
	if code, stop := f.needsPolicy(); stop {
		return code
	}
	agent, paths := pos[0], pos[1:]
	var workspaces []string
	for _, p := range paths {
		p = strings.TrimSuffix(p, ":ro")
		abs, err := filepath.Abs(p)
		if err != nil {
			return fail(1, "workspace %s: %v", p, err)
		}
		if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
			return fail(1, "workspace %s is not a directory", p)
		}
		workspaces = append(workspaces, abs)
	}
	name := last(flags["name"])
	if name == "" {
		name = agent + "-" + filepath.Base(workspaces[0])
	}
	if !validName.MatchString(name) || name == "default" {
		return fail(1, "invalid sandbox name %q: at least two characters, starting with a letter or number, containing only letters, numbers, hyphens and periods", name)
	}
	memory := last(flags["memory"])
	if memory != "" {
		m := memoryValue.FindStringSubmatch(strings.ToLower(memory))
		if m == nil {
			return fail(1, "invalid memory size %q", memory)
		}
		n, _ := strconv.ParseInt(m[1], 10, 64)
		shift := map[string]uint{"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m[2]]
		if n<<shift < 512<<20 {
			return fail(1, "memory must be at least 512 MiB, got %s", memory)
		}
	}
	if cpus := last(flags["cpus"]); cpus != "" {
		if n, err := strconv.Atoi(cpus); err != nil || n < 0 {
			return fail(1, "invalid cpus %q", cpus)
		}
	}
	policy := last(flags["pull"])
	switch policy {
	case "":
		policy = "always"
	case "always", "missing", "never":
	default:
		return fail(1, "invalid --pull %q: always, missing or never", policy)
	}
	template := last(flags["template"])
	if template == "" {
		template = "docker.io/docker/sandbox-templates:" + agent
	}
	var rules []rule
	if !f.switchOn("deny-ignored") {
		for _, h := range flags["deny-network"] {
			for _, p := range splitHosts(h) {
				if err := checkPattern(p); err != nil {
					return fail(1, "--deny-network %q: %v", p, err)
				}
				rules = append(rules, rule{Decision: "deny", Resource: p, Source: "local", Sandbox: name})
			}
		}
	}
	for _, h := range f.switchList("kit-allow") {
		rules = append(rules, rule{Decision: "allow", Resource: h, Source: "kit", Sandbox: name})
	}
	r := &record{Name: name, Agent: agent, Status: "creating", Workspaces: workspaces,
		Template: template, Memory: memory, CPUs: last(flags["cpus"]), Pull: policy, Rules: rules}
	if code := f.locked(func() int {
		if _, exists := f.load(name); exists {
			return fail(1, "sandbox %q already exists", name)
		}
		if err := f.save(r); err != nil {
			return fail(1, "%v", err)
		}
		return 0
	}); code != 0 {
		return code
	}
	if err := f.pull(template, policy); err != nil {
		f.setStatus(name, "failed")
		return fail(1, "create sandbox: %v", err)
	}
	if d, err := f.switchDuration("create-delay", 0); err != nil {
		return fail(1, "%v", err)
	} else {
		time.Sleep(d)
	}
	if f.switchOn("create-fail") {
		f.setStatus(name, "failed")
		return fail(1, "failed to start sandbox %s: microVM exited during boot (sbxfake create-fail)", name)
	}
	if f.switchOn("workspace-readonly") {
		for _, w := range workspaces {
			_ = os.Chmod(w, 0o555)
		}
	}
	f.locked(func() int {
		if r, ok := f.load(name); ok {
			r.Status, r.LastUsed = "running", time.Now()
			_ = f.save(r)
		}
		return 0
	})
	if len(flags["quiet"]) == 0 {
		fmt.Printf("Created sandbox %s\n", name)
	}
	return 0
}

func (f *fake) setStatus(name, status string) {
	f.locked(func() int {
		if r, ok := f.load(name); ok {
			r.Status = status
			_ = f.save(r)
		}
		return 0
	})
}

// startSession makes sure sandbox name runs, booting it when it was stopped
// (boot-delay), and registers this process's session in it, which keeps it
// from stopping until endSession. ok false: the message is printed and code
// is the exit status.
func (f *fake) startSession(name string) (r *record, code int, ok bool) {
	deadline := time.Now().Add(hangFor)
	for time.Now().Before(deadline) {
		boot := false
		code = f.locked(func() int {
			rec, found := f.load(name)
			if !found {
				// sbx-releases#504: the same status as a failing command.
				return fail(1, "sandbox %s not found", name)
			}
			f.refresh(rec)
			switch rec.Status {
			case "running":
				r = rec
				if err := os.WriteFile(f.sessionPath(name, os.Getpid()), nil, 0o644); err != nil {
					return fail(1, "%v", err)
				}
			case "stopped":
				rec.Status, rec.BootPID = "starting", os.Getpid()
				if err := f.save(rec); err != nil {
					return fail(1, "%v", err)
				}
				boot = true
			case "starting":
			default:
				return fail(1, "sandbox %s is %s", name, rec.Status)
			}
			return 0
		})
		switch {
		case code != 0:
			return nil, code, false
		case r != nil:
			return r, 0, true
		case boot:
			if code, ok := f.boot(name); !ok {
				return nil, code, false
			}
		default:
			time.Sleep(20 * time.Millisecond) // another CLI boots it
		}
	}
	return nil, fail(1, "sandbox %s did not start", name), false
}

// boot starts stopped sandbox name (marked starting by this process).
func (f *fake) boot(name string) (int, bool) {
	delay, err := f.switchDuration("boot-delay", 0)
	if err != nil {
		return fail(1, "%v", err), false
	}
	time.Sleep(delay)
	failed := f.switchOn("boot-fail")
	f.locked(func() int {
		if r, ok := f.load(name); ok && r.Status == "starting" {
			r.Status, r.BootPID, r.LastUsed = "running", 0, time.Now()
			if failed {
				r.Status = "stopped"
			}
			_ = f.save(r)
		}
		return 0
	})
	if failed {
		return fail(1, "failed to start sandbox %s: the microVM did not boot (sbxfake boot-fail)", name), false
	}
	return 0, true
}

// endSession ends this process's session in sandbox name: its grace starts.
func (f *fake) endSession(name string) {
	f.locked(func() int {
		_ = os.Remove(f.sessionPath(name, os.Getpid()))
		if r, ok := f.load(name); ok && r.Status == "running" {
			r.LastUsed = time.Now()
			_ = f.save(r)
		}
		return 0
	})
}

func (f *fake) exec(args []string) int {
	flags, pos, err := flagSet{
		"-i": {"interactive", false}, "--interactive": {"interactive", false},
		"-t": {"tty", false}, "--tty": {"tty", false},
		"-d": {"detach", false}, "--detach": {"detach", false},
		"-e": {"env", true}, "--env": {"env", true}, "--env-file": {"env-file", true},
		"-u": {"user", true}, "--user": {"user", true},
		"-w": {"workdir", true}, "--workdir": {"workdir", true},
		"--privileged": {"privileged", false}, "--detach-keys": {"detach-keys", true},
	}.parse(args, false)
	if err != nil {
		return fail(1, "%v", err)
	}
	if len(flags["no-input"]) > 0 {
		if f.switchOn("no-input-unsupported") {
			return fail(1, "unknown flag: --no-input")
		}
		f.noInput = true
	}
	if code, stop := f.needsSignIn(); stop {
		return code
	}
	if len(pos) < 2 {
		return fail(1, "\"sbx exec\" requires at least 2 arguments")
	}
	if len(flags["detach"]) > 0 {
		return fail(1, "detached execution (-d) is not supported")
	}
	if code, stop := f.needsPolicy(); stop {
		return code
	}
	name, argv := pos[0], pos[1:]
	r, code, ok := f.startSession(name)
	if !ok {
		return code
	}
	defer f.endSession(name)

	env := []string{f.sandboxTag(name), "PATH=" + guestPATH, "HOME=" + r.Workspaces[0], "LANG=C.UTF-8", "HOSTNAME=" + name}
	for _, file := range flags["env-file"] {
		f.logEnvFile(file)
		lines, err := readEnvFile(file)
		if err != nil {
			return fail(1, "%v", err)
		}
		env = append(env, lines...)
	}
	for _, kv := range flags["env"] {
		if strings.Contains(kv, "=") {
			env = append(env, kv)
		} else if v, ok := os.LookupEnv(kv); ok {
			env = append(env, kv+"="+v)
		}
	}
	dir := last(flags["workdir"])
	if dir == "" {
		dir = r.Workspaces[0]
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		fmt.Fprintf(os.Stderr, "OCI runtime exec failed: chdir to cwd (%q) set in config.json failed: no such file or directory\n", dir)
		return 126
	}
	bin, err := lookPath(argv[0], dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "OCI runtime exec failed: exec: %q: executable file not found in $PATH\n", argv[0])
		return 127
	}
	cmd := exec.Command(bin, argv[1:]...)
	cmd.Args[0] = argv[0]
	if f.switchOn("workspace-readonly") && os.Geteuid() == 0 {
		// Root writes a read-only directory anyway; the guest's user
		// would not. Run the command without the capabilities that let it.
		self, err := os.Executable()
		if err != nil {
			return fail(1, "%v", err)
		}
		cmd = exec.Command(self, append([]string{dropCapsArg, bin}, argv...)...)
	}
	cmd.Env = env
	cmd.Dir = dir
	if len(flags["interactive"]) > 0 {
		cmd.Stdin = os.Stdin
	}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// Its own group: killing the CLI does not reach a command in a microVM.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "OCI runtime exec failed: %v\n", err)
		return 126
	}
	err = cmd.Wait()
	code = 0
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		} else {
			code = exitErr.ExitCode()
		}
	} else if err != nil {
		fmt.Fprintln(os.Stderr, "ERROR:", err)
		code = 1
	}
	if f.switchOn("exec-hang") {
		time.Sleep(hangFor)
	}
	return code
}

// guestWithoutDAC runs args[0] with args[1:] as its argv after dropping,
// from the bounding set, the capabilities that let root write where a
// directory's mode forbids it: what a guest user's exec looks like here.
func guestWithoutDAC(args []string) int {
	for _, c := range []uintptr{unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH, unix.CAP_FOWNER} {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			fmt.Fprintln(os.Stderr, "sbxfake: drop capability:", err)
			return 126
		}
	}
	if len(args) < 2 {
		return 126
	}
	err := syscall.Exec(args[0], args[1:], os.Environ())
	fmt.Fprintln(os.Stderr, "sbxfake:", err)
	return 126
}

// lookPath finds file in the guest's PATH, as the runtime inside a microVM
// would; a name with a slash is taken as is (relative to dir).
func lookPath(file, dir string) (string, error) {
	if strings.Contains(file, "/") {
		if !filepath.IsAbs(file) {
			file = filepath.Join(dir, file)
		}
		return file, checkExec(file)
	}
	for _, d := range filepath.SplitList(guestPATH) {
		p := filepath.Join(d, file)
		if checkExec(p) == nil {
			return p, nil
		}
	}
	return "", fs.ErrNotExist
}

func checkExec(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fs.ErrPermission
	}
	return nil
}

// readEnvFile reads an env file as sbx (Docker's CLI) does: one
// NAME=value a line, leading whitespace (and a byte-order mark on the
// first line) trimmed, blank lines and # comments skipped, a bare NAME
// taken from the caller's environment; invalid UTF-8 and whitespace in a
// name are errors, and so is a line longer than the reader's 64 KiB buffer.
// The value is everything after the first '=', byte for byte.
func readEnvFile(file string) ([]string, error) {
	fh, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	var out []string
	sc := bufio.NewScanner(fh)
	for n := 1; sc.Scan(); n++ {
		raw := sc.Bytes()
		if n == 1 {
			raw = bytes.TrimPrefix(raw, []byte("\xef\xbb\xbf"))
		}
		if !utf8.Valid(raw) {
			return nil, fmt.Errorf("env file %s contains invalid utf8 bytes at line %d: %v", file, n, raw)
		}
		line := strings.TrimLeftFunc(string(raw), unicode.IsSpace)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, hasValue := strings.Cut(line, "=")
		if strings.IndexFunc(name, unicode.IsSpace) >= 0 {
			return nil, fmt.Errorf("variable '%s' contains whitespaces", name)
		}
		if name == "" {
			return nil, fmt.Errorf("no variable name on line '%s'", line)
		}
		if hasValue {
			out = append(out, name+"="+value)
		} else if v, ok := os.LookupEnv(name); ok {
			out = append(out, name+"="+v)
		}
	}
	return out, sc.Err()
}

// logEnvFile records, in envfiles.log, the mode an env file had when exec
// read it, for tests that check only the daemon could read it.
func (f *fake) logEnvFile(file string) {
	fi, err := os.Stat(file)
	if err != nil {
		return
	}
	line, _ := json.Marshal(map[string]any{"path": file, "mode": fmt.Sprintf("%04o", fi.Mode().Perm()), "uid": fi.Sys().(*syscall.Stat_t).Uid})
	lf, err := os.OpenFile(f.path("envfiles.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer lf.Close()
	lf.Write(append(line, '\n'))
}

// sandboxTag is the environment entry every command of sandbox name
// carries, so rm can find them all, however they were started. A command
// that clears its environment escapes it; this is a fake.
func (f *fake) sandboxTag(name string) string {
	return tagEnv + "=" + f.state + "/" + name
}

// killProcesses kills every process carrying sandbox name's tag, as
// removing or stopping a microVM does, in rounds until none is left (one
// may fork while the first round runs).
func (f *fake) killProcesses(name string) {
	tag := []byte(f.sandboxTag(name) + "\x00")
	for round := 0; round < 10; round++ {
		matches, _ := filepath.Glob("/proc/[0-9]*/environ")
		killed := 0
		for _, m := range matches {
			env, err := os.ReadFile(m)
			if err != nil || !(bytes.HasPrefix(env, tag) || bytes.Contains(env, append([]byte{0}, tag...))) {
				continue
			}
			pid, err := strconv.Atoi(filepath.Base(filepath.Dir(m)))
			if err != nil || pid == os.Getpid() {
				continue
			}
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed++
			}
		}
		if killed == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (f *fake) ls(args []string) int {
	flags, pos, err := flagSet{
		"--json": {"json", false}, "-q": {"quiet", false}, "--quiet": {"quiet", false},
	}.parse(args, true)
	if err != nil {
		return fail(1, "%v", err)
	}
	if len(pos) > 0 {
		return fail(1, "\"sbx ls\" accepts no arguments")
	}
	if f.switchOn("banner") {
		for _, l := range bannerLines {
			fmt.Println(l)
		}
	}
	if f.switchOn("ls-hang") {
		time.Sleep(hangFor)
	}
	var recs []*record
	f.locked(func() int {
		recs = f.all()
		for _, r := range recs {
			f.refresh(r)
		}
		return 0
	})
	switch {
	case len(flags["json"]) > 0:
		type entry struct {
			Name       string   `json:"name"`
			Agent      string   `json:"agent"`
			Status     string   `json:"status"`
			Workspaces []string `json:"workspaces"`
			LastUsed   string   `json:"last_used,omitempty"`
		}
		out := struct {
			Sandboxes []entry `json:"sandboxes"`
		}{Sandboxes: []entry{}}
		for _, r := range recs {
			e := entry{Name: r.Name, Agent: r.Agent, Status: r.Status, Workspaces: r.Workspaces}
			if !r.LastUsed.IsZero() {
				e.LastUsed = r.LastUsed.UTC().Format(time.RFC3339)
			}
			out.Sandboxes = append(out.Sandboxes, e)
		}
		b, _ := json.MarshalIndent(out, "", "  ")
		fmt.Println(string(b))
	case len(flags["quiet"]) > 0:
		for _, r := range recs {
			fmt.Println(r.Name)
		}
	default:
		fmt.Printf("%-40s %-8s %-10s %s\n", "SANDBOX", "AGENT", "STATUS", "WORKSPACE")
		for _, r := range recs {
			fmt.Printf("%-40s %-8s %-10s %s\n", r.Name, r.Agent, r.Status, strings.Join(r.Workspaces, ","))
		}
	}
	return 0
}

// stop stops sandboxes without removing them.
func (f *fake) stop(args []string) int {
	_, names, err := flagSet{}.parse(args, true)
	if err != nil {
		return fail(1, "%v", err)
	}
	if len(names) == 0 {
		return fail(1, "\"sbx stop\" requires at least 1 argument")
	}
	code := 0
	for _, name := range names {
		if c := f.locked(func() int {
			r, ok := f.load(name)
			if !ok {
				return fail(1, "sandbox %s not found", name)
			}
			f.stopLocked(r)
			return 0
		}); c != 0 {
			code = c
		}
	}
	return code
}

func (f *fake) rm(args []string) int {
	flags, names, err := flagSet{
		"-f": {"force", false}, "--force": {"force", false}, "--all": {"all", false},
	}.parse(args, true)
	if err != nil {
		return fail(1, "%v", err)
	}
	if len(flags["all"]) > 0 {
		for _, r := range f.all() {
			names = append(names, r.Name)
		}
	} else if len(names) == 0 {
		return fail(1, "\"sbx rm\" requires at least 1 argument")
	}
	if len(flags["force"]) == 0 {
		// Since v0.29 rm asks before it deletes.
		if f.noInput {
			return fail(1, "removing %s needs confirmation; pass --force", strings.Join(names, ", "))
		}
		fmt.Fprintf(os.Stderr, "Remove %s? [y/N] ", strings.Join(names, ", "))
		line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
		if strings.TrimSpace(line) != "y" {
			return fail(1, "not removed")
		}
	}
	if f.switchOn("rm-fail") {
		return fail(1, "cannot connect to the sandboxd daemon (sbxfake rm-fail)")
	}
	code := 0
	for _, name := range names {
		c := f.locked(func() int {
			if _, ok := f.load(name); !ok {
				return fail(1, "sandbox %s not found", name)
			}
			f.killProcesses(name)
			if err := os.Remove(f.recordPath(name)); err != nil {
				return fail(1, "%v", err)
			}
			return 0
		})
		if c != 0 {
			code = c
		} else {
			fmt.Println(name)
		}
	}
	return code
}
