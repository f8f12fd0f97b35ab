// Command sbxfake stands in for the Docker Sandboxes CLI (sbx) where there is
// no KVM: the sbx backend's tests build it and point the backend at it.
//
// It implements the part of sbx the backend uses, with sbx's observable
// behaviour, including its sharp edges:
//
//	create [--name N] [-m|--memory M] [--cpus N] [-t|--template I] [-q] AGENT PATH...
//	exec [-i] [-t] [-d] [-e K=V|-e K]... [--env-file F] [-u U] [-w DIR] SANDBOX CMD [ARG...]
//	ls [--json] [-q]
//	rm [-f] [--all] SANDBOX...
//	policy allow network [--sandbox N] HOST[,HOST...]
//	policy init allow-all|balanced|deny-all
//	version
//
// A "sandbox" is a record in $SBXFAKE_STATE/sandboxes; exec runs the command
// as a local process (in its own process group, as a command in a microVM is
// out of the CLI's reach; rm kills it, and everything it started, as
// removing a microVM does) with the first workspace as its working directory.
// sbx mounts a workspace at its host path, so guest paths and host paths are
// the same here. It is not a sandbox: the command runs on the host.
//
// Every invocation is appended to $SBXFAKE_STATE/calls.log as a JSON line
// {"args": [...]}, and every env file exec reads to envfiles.log as
// {"path": ..., "mode": "0600", "uid": ...}. Behaviours are switched by a
// file of that name in the state directory or by an environment variable
// SBXFAKE_<NAME>:
//
//	banner        ls prints "Starting sandboxd daemon…" before its output
//	ls-hang       ls never answers
//	create-delay  create takes this long (a duration such as "2s")
//	create-fail   create registers the sandbox, then fails (exit 1)
//	exec-hang     exec runs the command, then never exits
//	rm-fail       rm fails (exit 1) and removes nothing, as when its daemon is down
//	policy-fail   policy allow network fails (exit 1)
//
// Like sbx: exec on a missing sandbox exits 1 (as a failing command does),
// rm of a missing sandbox exits non-zero, and memory below 1 GiB is refused.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"
)

const (
	stateEnv   = "SBXFAKE_STATE"
	bannerText = "Starting sandboxd daemon…"
	hangFor    = time.Hour
	guestPATH  = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	tagEnv     = "SBXFAKE_SANDBOX"
)

func main() { os.Exit(run(os.Args[1:])) }

type fake struct{ state string }

func run(args []string) int {
	state := os.Getenv(stateEnv)
	if state == "" {
		fmt.Fprintln(os.Stderr, "sbxfake: set "+stateEnv+" to its state directory")
		return 2
	}
	f := &fake{state: state}
	for _, d := range []string{state, f.path("sandboxes")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "sbxfake:", err)
			return 2
		}
	}
	f.logCall(args)
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "Usage: sbx COMMAND")
		return 1
	}
	switch args[0] {
	case "create":
		return f.create(args[1:])
	case "exec":
		return f.exec(args[1:])
	case "ls", "list":
		return f.ls(args[1:])
	case "rm", "remove":
		return f.rm(args[1:])
	case "policy":
		return f.policy(args[1:])
	case "version":
		fmt.Println("sbx version v0.0.0-sbxfake")
		return 0
	}
	fmt.Fprintf(os.Stderr, "Error: unknown command %q for \"sbx\"\n", args[0])
	return 1
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
	line, _ := json.Marshal(map[string]any{"args": args, "pid": os.Getpid()})
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

// record is one sandbox.
type record struct {
	Name         string   `json:"name"`
	Agent        string   `json:"agent"`
	Status       string   `json:"status"`
	Workspaces   []string `json:"workspaces"`
	Template     string   `json:"template,omitempty"`
	Memory       string   `json:"memory,omitempty"`
	CPUs         string   `json:"cpus,omitempty"`
	AllowedHosts []string `json:"allowed_hosts,omitempty"`
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

// flagDef describes one flag: its canonical name and whether it takes a value.
type flagDef struct {
	canon string
	value bool
}

type flagSet map[string]flagDef

// parse reads flags and positional arguments the way sbx's cobra commands
// do: long flags with "=" or a separate value, combined short flags, "--"
// ending flags. Unless interspersed, the first positional argument ends the
// flags too (docker exec: the rest is the command).
func (fs flagSet) parse(args []string, interspersed bool) (map[string][]string, []string, error) {
	fs["-D"] = flagDef{"debug", false}
	fs["--debug"] = flagDef{"debug", false}
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
	validName   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.+-]{0,127}$`)
	memoryValue = regexp.MustCompile(`^([0-9]+)([kmgt]?)(i?b)?$`)
)

func fail(code int, format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "Error: "+format+"\n", args...)
	return code
}

func (f *fake) create(args []string) int {
	flags, pos, err := flagSet{
		"--name": {"name", true}, "-m": {"memory", true}, "--memory": {"memory", true},
		"--cpus": {"cpus", true}, "-t": {"template", true}, "--template": {"template", true},
		"-q": {"quiet", false}, "--quiet": {"quiet", false}, "--branch": {"branch", true},
	}.parse(args, true)
	if err != nil {
		return fail(1, "%v", err)
	}
	if len(pos) < 2 {
		return fail(1, "requires an agent and at least one workspace path")
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
	if !validName.MatchString(name) {
		return fail(1, "invalid sandbox name %q: use letters, numbers, hyphens, periods and plus signs", name)
	}
	memory := last(flags["memory"])
	if memory != "" {
		m := memoryValue.FindStringSubmatch(strings.ToLower(memory))
		if m == nil {
			return fail(1, "invalid memory size %q", memory)
		}
		n, _ := strconv.ParseInt(m[1], 10, 64)
		shift := map[string]uint{"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m[2]]
		if n<<shift < 1<<30 {
			return fail(1, "memory must be at least 1 GiB, got %s", memory)
		}
	}
	if cpus := last(flags["cpus"]); cpus != "" {
		if n, err := strconv.Atoi(cpus); err != nil || n < 0 {
			return fail(1, "invalid cpus %q", cpus)
		}
	}
	r := &record{Name: name, Agent: agent, Status: "creating", Workspaces: workspaces,
		Template: last(flags["template"]), Memory: memory, CPUs: last(flags["cpus"])}
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
	if v, ok := f.switchValue("create-delay"); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fail(1, "sbxfake: create-delay %q: %v", v, err)
		}
		time.Sleep(d)
	}
	if f.switchOn("create-fail") {
		f.setStatus(name, "failed")
		return fail(1, "failed to start sandbox %s: microVM exited during boot (sbxfake create-fail)", name)
	}
	f.setStatus(name, "running")
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
	if len(pos) < 2 {
		return fail(1, "\"sbx exec\" requires at least 2 arguments")
	}
	name, argv := pos[0], pos[1:]
	r, ok := f.load(name)
	if !ok {
		// sbx-releases#504: the same status as a failing command.
		return fail(1, "sandbox %s not found", name)
	}
	switch r.Status {
	case "running":
	case "stopped":
		f.setStatus(name, "running")
	default:
		return fail(1, "sandbox %s is %s", name, r.Status)
	}

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
	if len(flags["detach"]) > 0 {
		return 0
	}
	err = cmd.Wait()
	code := 0
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		} else {
			code = exitErr.ExitCode()
		}
	} else if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		code = 1
	}
	if f.switchOn("exec-hang") {
		time.Sleep(hangFor)
	}
	return code
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
// removing a microVM does, in rounds until none is left (one may fork while
// the first round runs).
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
		fmt.Println(bannerText)
	}
	if f.switchOn("ls-hang") {
		time.Sleep(hangFor)
	}
	recs := f.all()
	switch {
	case len(flags["json"]) > 0:
		type entry struct {
			Name       string   `json:"name"`
			Agent      string   `json:"agent"`
			Status     string   `json:"status"`
			Workspaces []string `json:"workspaces"`
		}
		out := struct {
			Sandboxes []entry `json:"sandboxes"`
		}{Sandboxes: []entry{}}
		for _, r := range recs {
			out.Sandboxes = append(out.Sandboxes, entry{r.Name, r.Agent, r.Status, r.Workspaces})
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

func (f *fake) policy(args []string) int {
	if len(args) >= 2 && args[0] == "init" {
		switch args[1] {
		case "allow-all", "balanced", "deny-all":
			_ = os.WriteFile(f.path("policy"), []byte(args[1]), 0o644)
			return 0
		}
		return fail(1, "unknown policy %q", args[1])
	}
	if f.switchOn("policy-fail") {
		return fail(1, "cannot reach the policy service (sbxfake policy-fail)")
	}
	if len(args) < 2 || args[0] != "allow" || args[1] != "network" {
		return fail(1, "sbxfake implements only \"policy init\" and \"policy allow network\"")
	}
	flags, pos, err := flagSet{"--sandbox": {"sandbox", true}}.parse(args[2:], true)
	if err != nil {
		return fail(1, "%v", err)
	}
	var hosts []string
	for _, p := range pos {
		for _, h := range strings.Split(p, ",") {
			if h = strings.TrimSpace(h); h != "" {
				hosts = append(hosts, h)
			}
		}
	}
	if len(hosts) == 0 {
		return fail(1, "requires at least one resource")
	}
	name := last(flags["sandbox"])
	if name == "" {
		lf, err := os.OpenFile(f.path("global-allow"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fail(1, "%v", err)
		}
		defer lf.Close()
		_, _ = fmt.Fprintln(lf, strings.Join(hosts, ","))
		return 0
	}
	return f.locked(func() int {
		r, ok := f.load(name)
		if !ok {
			return fail(1, "sandbox %s not found", name)
		}
		r.AllowedHosts = append(r.AllowedHosts, hosts...)
		if err := f.save(r); err != nil {
			return fail(1, "%v", err)
		}
		fmt.Printf("Allowed %s for sandbox %s\n", strings.Join(hosts, ","), name)
		return 0
	})
}
