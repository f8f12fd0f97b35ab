package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// clientFlags are the flags every client subcommand has.
type clientFlags struct {
	socket     string
	timeout    time.Duration
	daemonUIDs List
}

func (c *clientFlags) register(fs *flag.FlagSet, timeout time.Duration) {
	c.registerConn(fs)
	fs.DurationVar(&c.timeout, "timeout", timeout, "give up on the daemon after this long")
}

// registerConn registers the flags that say which daemon to trust, for a
// command whose --timeout means something else (wait: how long to wait for
// the process).
func (c *clientFlags) registerConn(fs *flag.FlagSet) {
	fs.StringVar(&c.socket, "socket", clientSocket(), "daemon socket (env "+SocketEnv+")")
	if v := os.Getenv(DaemonUIDEnv); v != "" {
		c.daemonUIDs = List(strings.Split(v, ","))
	}
	fs.Var(&listFlag{l: &c.daemonUIDs}, "daemon-uid", "a uid (or user name) the daemon may run as, besides root, the "+daemonUser+" user and yourself (repeatable; env "+DaemonUIDEnv+")")
}

// DaemonUIDEnv names uids (or user names, comma-separated) the CLI trusts
// to run the daemon, besides root, the packaged daemon's user and the
// caller.
const DaemonUIDEnv = "SANDBOX_SIDECAR_DAEMON_UID"

// daemonUser is the packaged daemon's user.
const daemonUser = "sandbox-sidecar"

// trustedDaemonUIDs is who the CLI lets answer on the socket: root (the
// root daemon, and systemd, which makes an activated socket), the packaged
// daemon's user, the caller itself (a daemon of its own), and those named.
func (c *clientFlags) trustedDaemonUIDs() ([]uint32, error) {
	uids := []uint32{0, uint32(os.Getuid())}
	if u, err := user.Lookup(daemonUser); err == nil {
		if n, err := strconv.ParseUint(u.Uid, 10, 32); err == nil {
			uids = append(uids, uint32(n))
		}
	}
	named, err := parseUIDs(c.daemonUIDs)
	if err != nil {
		return nil, &exitError{code: 2, err: fmt.Errorf("--daemon-uid: %w", err)}
	}
	return append(uids, named...), nil
}

func (c *clientFlags) dial() (*ipc.Client, context.Context, context.CancelFunc, error) {
	trusted, err := c.trustedDaemonUIDs()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	cl, err := ipc.DialWith(ctx, c.socket, ipc.DialOptions{TrustedUIDs: trusted})
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return cl, ctx, cancel, nil
}

// withDaemon dials the daemon, runs fn on the connection within the
// command's --timeout, and hangs up. A daemon it cannot reach (or may not
// trust) is exit code 2 with the dial's error, the same for every command.
func (c *clientFlags) withDaemon(fn func(ctx context.Context, cl *ipc.Client) error) error {
	cl, ctx, cancel, err := c.dial()
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	defer cancel()
	defer cl.Close()
	return fn(ctx, cl)
}

func runHealth(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	var asJSON bool
	fs := newFlags("health", "[--json]", stderr)
	cf.register(fs, 10*time.Second)
	fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	// A map, not api.HealthResult: --json prints whatever the daemon
	// reports, fields this CLI does not know included.
	var rep map[string]any
	err := cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		return cl.Call(ctx, ipc.OpHealth, nil, &rep)
	})
	if err != nil {
		if asJSON {
			writeJSON(stdout, map[string]any{"status": "unreachable", "error": err.Error(), "socket": cf.socket})
		} else {
			fmt.Fprintf(stdout, "unreachable: %v\n", err)
		}
		return &exitError{code: 2}
	}
	if asJSON {
		writeJSON(stdout, rep)
	} else {
		paused := ""
		if n := toFloat(rep["paused"]); n > 0 {
			paused = fmt.Sprintf(" (%.0f paused)", n)
		}
		fmt.Fprintf(stdout, "%v: backend %v, %v sandboxes%s, %v commands running, version %v, up %.0fs\n",
			rep["status"], rep["backend"], rep["sandboxes"], paused, rep["commands"], rep["version"], toFloat(rep["uptime_s"]))
		if e, ok := rep["backend_error"]; ok {
			fmt.Fprintf(stdout, "backend: %v\n", e)
		}
		if m, ok := rep["memory"].(map[string]any); ok {
			fmt.Fprintf(stdout, "memory: sandboxes use %.0f MiB of the %.0f MiB they may use together (host: %.0f MiB); %v fit at their %.0f MiB limit each (max_sandboxes %v)\n",
				toFloat(m["sandboxes_used_bytes"])/(1<<20), toFloat(m["sandboxes_limit_bytes"])/(1<<20), toFloat(m["host_bytes"])/(1<<20),
				m["fits_sandboxes"], toFloat(m["per_sandbox_bytes"])/(1<<20), m["max_sandboxes"])
		}
	}
	if rep["status"] != "ok" {
		return &exitError{code: 1}
	}
	return nil
}

// writeJSON prints v as indented JSON, what every --json prints.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(jsonable(v))
}

// jsonable turns msgpack's decoded values into what encoding/json takes
// (map[string]any keys are fine; bytes become strings).
func jsonable(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = jsonable(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonable(e)
		}
		return out
	case []byte:
		return string(x)
	}
	return v
}

func toFloat(v any) float64 {
	switch n := v.(type) {
	case float64:
		return n
	case float32:
		return float64(n)
	case int8, int16, int32, int64, uint8, uint16, uint32, uint64:
		var f float64
		fmt.Sscan(fmt.Sprint(n), &f)
		return f
	}
	return 0
}

// listedSandbox is what ls --json prints of a sandbox.
type listedSandbox struct {
	Sandbox    string            `json:"sandbox"`
	UID        uint32            `json:"uid"`
	Owner      string            `json:"owner"`
	Holder     string            `json:"holder"`
	Labels     map[string]string `json:"labels"`
	State      string            `json:"state"`
	Workdir    string            `json:"workdir"`
	Network    string            `json:"network"`
	ConnBound  bool              `json:"conn_bound"`
	CreatedAt  float64           `json:"created_at"`
	ExpiresAt  float64           `json:"expires_at"`
	LastUsed   float64           `json:"last_used"`
	RemainingS float64           `json:"remaining_s"`
	Image      string            `json:"image"`
}

func listed(s api.SandboxInfo) listedSandbox {
	return listedSandbox{Sandbox: s.Sandbox, UID: s.UID, Owner: s.Owner, Holder: s.Holder, Labels: s.Labels, State: s.State,
		Workdir: s.Workdir, Network: s.Network, ConnBound: s.ConnBound, CreatedAt: s.CreatedAt, ExpiresAt: s.ExpiresAt,
		LastUsed: s.LastUsed, RemainingS: s.RemainingS, Image: s.Image}
}

func runList(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	var asJSON bool
	var owner string
	fs := newFlags("ls", "[--owner DAG_ID/RUN_ID] [--json]", stderr)
	cf.register(fs, 10*time.Second)
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	fs.StringVar(&owner, "owner", "", "only sandboxes of this owner (Airflow run)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		res, err := cl.List(ctx, owner)
		if err != nil {
			return err
		}
		if asJSON {
			out := make([]listedSandbox, 0, len(res.Sandboxes))
			for _, s := range res.Sandboxes {
				out = append(out, listed(s))
			}
			return writeJSON(stdout, out)
		}
		if len(res.Sandboxes) == 0 {
			fmt.Fprintln(stdout, "no sandboxes")
			return nil
		}
		groups := map[string][]api.SandboxInfo{}
		var owners []string
		for _, s := range res.Sandboxes {
			if _, ok := groups[s.Owner]; !ok {
				owners = append(owners, s.Owner)
			}
			groups[s.Owner] = append(groups[s.Owner], s)
		}
		sort.Strings(owners)
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		for i, o := range owners {
			if i > 0 {
				fmt.Fprintln(tw)
			}
			title := o
			if title == "" {
				title = "(no run: connection-bound or ad hoc)"
			}
			fmt.Fprintf(tw, "RUN %s\n", title)
			fmt.Fprintln(tw, "  SANDBOX\tUID\tSTATE\tIMAGE\tHOLDER\tTASK\tAGE\tREMAINING")
			for _, s := range groups[o] {
				task := s.Labels["task_id"]
				if task == "" {
					task = "-"
				}
				holder := s.Holder
				if holder == "" {
					holder = "-"
				}
				age := time.Since(time.UnixMilli(int64(s.CreatedAt * 1000))).Round(time.Second)
				remaining := (time.Duration(s.RemainingS) * time.Second).Round(time.Second).String()
				if s.ConnBound {
					remaining += " (conn)"
				}
				fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Sandbox, s.UID, s.State, cmp.Or(s.Image, "-"), holder, task, age, remaining)
			}
		}
		return tw.Flush()
	})
}

// envFlag collects KEY=VALUE pairs.
type envFlag map[string]string

func (e envFlag) String() string { return "" }
func (e envFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", v)
	}
	e[k] = val
	return nil
}

// resourceFlags are a sandbox's limits below the daemon's (create's
// resources); zero leaves the daemon's.
type resourceFlags struct {
	memory, disk Size
	pids         int64
	cpus         float64
}

func (r *resourceFlags) register(fs *flag.FlagSet) {
	fs.Var(&r.memory, "memory", "the sandbox's memory (a size: 512m, 2g; binary units), at most the daemon's (0: the daemon's)")
	fs.Float64Var(&r.cpus, "cpus", 0, "the sandbox's CPU quota in cores, at most the daemon's (0: the daemon's)")
	fs.Int64Var(&r.pids, "pids", 0, "the sandbox's processes and threads, at most the daemon's (0: the daemon's)")
	fs.Var(&r.disk, "disk", "bytes the sandbox's /workspace and /tmp may hold (a size: 10g), at most the daemon's (0: the daemon's)")
}

// arg is create's resources argument, or nil when nothing was asked for.
func (r *resourceFlags) arg() *api.Resources {
	res := api.Resources{MemoryBytes: r.memory.Bytes(), CPUs: r.cpus, PIDs: r.pids, DiskBytes: r.disk.Bytes()}
	if res == (api.Resources{}) {
		return nil
	}
	return &res
}

func runCreate(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	var ttl time.Duration
	var owner, image string
	var res resourceFlags
	var egressTo, egressCIDRs List
	env := envFlag{}
	fs := newFlags("create", "[--ttl 1h] [--owner DAG_ID/RUN_ID] [--image NAME] [--env K=V] [--memory SIZE] [--cpus N] [--pids N] [--disk SIZE] [--allow-egress-to NAME] [--allow-egress-to-cidr CIDR]", stderr)
	fs.StringVar(&image, "image", "", "the image the sandbox runs on (sandbox-sidecar image ls; default: the daemon's [images] default)")
	cf.register(fs, 10*time.Minute)
	fs.DurationVar(&ttl, "ttl", time.Hour, "how long the sandbox lives (capped by the daemon's --max-lifetime)")
	fs.StringVar(&owner, "owner", "", "Airflow run that owns the sandbox (\"<dag_id>/<run_id>\")")
	fs.Var(env, "env", "environment variable for every command (repeatable)")
	fs.Var(&listFlag{l: &egressTo}, "allow-egress-to", "a host name the sandbox may reach (name, *.name, name:port; repeatable, comma-separable): its network is the daemon's egress path ([egress] enabled)")
	fs.Var(&listFlag{l: &egressCIDRs}, "allow-egress-to-cidr", "an IPv4 or IPv6 CIDR the sandbox may reach (repeatable, comma-separable), as --allow-egress-to")
	res.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if ttl <= 0 {
		return &exitError{code: 2, err: errors.New("--ttl must be positive")}
	}
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		created, err := cl.Create(ctx, api.CreateRequest{Spec: &api.Spec{Env: env, Owner: owner, AllowEgressTo: egressTo, AllowEgressToCIDRs: egressCIDRs}, TTLS: ttl.Seconds(), Resources: res.arg(), Image: image})
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, created.Sandbox)
		return nil
	})
}

func runExec(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	var sandbox, shell, cwd, image string
	var cmdTimeout time.Duration
	var maxOut int
	var stdin, stream, detach bool
	var name string
	var resources resourceFlags
	env := envFlag{}
	fs := newFlags("exec", "[--sandbox ID] [flags] -- COMMAND [ARG...]   (or --sh 'shell string'; --detach --sandbox ID [--name NAME] starts a durable process)", stderr)
	cf.register(fs, 0)
	fs.StringVar(&sandbox, "sandbox", "", "sandbox to run in (default: a throwaway sandbox, destroyed afterwards)")
	fs.StringVar(&shell, "sh", "", "run this shell string with sh -c instead of an argv")
	fs.StringVar(&cwd, "cwd", "", "working directory inside the sandbox")
	fs.StringVar(&image, "image", "", "the image of the throwaway sandbox (default: the daemon's [images] default)")
	fs.DurationVar(&cmdTimeout, "command-timeout", time.Minute, "the command's timeout (with --detach: none unless given)")
	fs.BoolVar(&detach, "detach", false, "start a durable process in the --sandbox and print its id: it outlives this command (see ps, logs, wait, kill)")
	fs.StringVar(&name, "name", "", "with --detach: the process's name in its sandbox; a start whose name is taken starts nothing and prints the process that has it")
	fs.IntVar(&maxOut, "max-output-bytes", 1<<20, "per-stream output cap (the tail is kept)")
	fs.BoolVar(&stdin, "stdin", false, "send this process's stdin to the command")
	fs.BoolVar(&stream, "stream", true, "show output as it comes (false: all of it when the command ends, the last --max-output-bytes per stream)")
	fs.Var(env, "env", "environment variable for the command (repeatable)")
	resources.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	argv := fs.Args()
	if sandbox != "" && image != "" {
		return &exitError{code: 2, err: errors.New("--image picks a throwaway sandbox's image; give it to create instead of --sandbox")}
	}
	if sandbox != "" && resources.arg() != nil {
		return &exitError{code: 2, err: errors.New("--memory, --cpus, --pids and --disk size a throwaway sandbox; give them to create instead of --sandbox")}
	}
	if (shell == "") == (len(argv) == 0) {
		return &exitError{code: 2, err: errors.New("give a command after --, or --sh 'string' (not both)")}
	}
	if detach {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		req := api.StartCommandRequest{Sandbox: sandbox, Command: shell, Argv: argv, Env: env, Cwd: cwd, Name: name}
		return startDetached(cf, set, req, cmdTimeout, stdin, stdout, stderr)
	}
	if name != "" {
		return &exitError{code: 2, err: errors.New("--name names a durable process: give --detach too")}
	}
	if cf.timeout == 0 {
		cf.timeout = cmdTimeout + 2*time.Minute
	}
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		if sandbox == "" {
			res, err := cl.Create(ctx, api.CreateRequest{Resources: resources.arg(), Image: image})
			if err != nil {
				return err
			}
			sandbox = res.Sandbox
			defer cl.Destroy(context.WithoutCancel(ctx), sandbox)
		}
		req := api.RunCommandRequest{Sandbox: sandbox, TimeoutS: cmdTimeout.Seconds(), MaxOutputBytes: &maxOut, Env: env, Cwd: cwd}
		if shell != "" {
			req.Command = shell
		} else {
			req.Argv = argv
		}
		if stdin {
			data, err := io.ReadAll(io.LimitReader(os.Stdin, 8<<20))
			if err != nil {
				return err
			}
			req.Stdin = data
		}
		var res api.RunCommandResult
		if stream {
			req.Stream = true
			live := func(event string, data []byte) {
				switch event {
				case "stdout":
					stdout.Write(data)
				case "stderr":
					stderr.Write(data)
				}
			}
			if err := cl.CallStream(ctx, ipc.OpRunCommand, req, &res, live); err != nil {
				return err
			}
			if n := derefInt(res.StdoutStreamDropped) + derefInt(res.StderrStreamDropped); n > 0 {
				fmt.Fprintf(stderr, "sandbox-sidecar exec: %d bytes of output were not shown: they came faster than this terminal read them\n", n)
			}
			// Everything else was shown as it came; the kept tails would repeat it.
			res.StdoutTruncated, res.StderrTruncated = false, false
		} else {
			var err error
			if res, err = cl.RunCommand(ctx, req); err != nil {
				return err
			}
			stdout.Write(res.Stdout)
			stderr.Write(res.Stderr)
		}
		switch {
		case res.SandboxTerminated:
			return &exitError{code: 125, err: errors.New("the sandbox was terminated; create a new one")}
		case res.TimedOut:
			return &exitError{code: 124, err: fmt.Errorf("timed out after %.3gs", res.AppliedTimeoutS)}
		case res.OOMKilled:
			return &exitError{code: res.ExitCode, err: errors.New("killed: the sandbox reached its memory limit (oom_killed)")}
		}
		if res.StdoutTruncated || res.StderrTruncated {
			fmt.Fprintf(stderr, "sandbox-sidecar exec: output truncated to the last %d bytes per stream\n", maxOut)
		}
		if res.ExitCode != 0 {
			return &exitError{code: res.ExitCode}
		}
		return nil
	})
}

func runWrite(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	var mode uint
	fs := newFlags("write", "SANDBOX PATH < data", stderr)
	cf.register(fs, time.Minute)
	fs.UintVar(&mode, "mode", 0o644, "file mode")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return &exitError{code: 2, err: errors.New("want SANDBOX PATH")}
	}
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		// In pieces: standard input of any size, a piece in memory at a time.
		_, err := cl.ImportFile(ctx, fs.Arg(0), fs.Arg(1), os.Stdin, uint32(mode), 0)
		return err
	})
}

func runRead(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	maxBytes := Size(8 << 20)
	fs := newFlags("read", "SANDBOX PATH", stderr)
	cf.register(fs, time.Minute)
	fs.Var(&maxBytes, "max-bytes", "refuse files larger than this (a size: 8m)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return &exitError{code: 2, err: errors.New("want SANDBOX PATH")}
	}
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		// In pieces, so a file larger than a frame can be read too.
		_, err := cl.ExportFile(ctx, fs.Arg(0), fs.Arg(1), stdout, maxBytes.Bytes(), 0)
		return err
	})
}

func runRemove(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	var run string
	fs := newFlags("rm", "SANDBOX... | --run DAG_ID/RUN_ID", stderr)
	cf.register(fs, 2*time.Minute)
	fs.StringVar(&run, "run", "", "destroy every sandbox of this owner (Airflow run)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if (fs.NArg() == 0) == (run == "") {
		return &exitError{code: 2, err: errors.New("name sandboxes, or one run with --run")}
	}
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		if run != "" {
			res, err := cl.DestroyRun(ctx, run)
			for _, id := range res.Destroyed {
				fmt.Fprintln(stdout, id)
			}
			return err
		}
		var errs []error
		for _, id := range fs.Args() {
			if err := cl.Destroy(ctx, id); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", id, err))
				continue
			}
			fmt.Fprintln(stdout, id)
		}
		return errors.Join(errs...)
	})
}

func derefInt(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}
