package main

// The CLI of durable processes (the daemon's start_command and the ops
// around it): exec --detach starts one, ps lists a sandbox's, logs reads
// one's output by byte offset (and follows it), kill signals one, wait waits
// for one's end and exits with its exit code.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

const (
	// followWait is how long one read_output of logs -f waits for bytes
	// or the end on the daemon (a long poll; at most the protocol's 600 s).
	followWait = 30 * time.Second
	// maxWaitCall is the longest wait_process the protocol allows at once;
	// wait asks again until its own --timeout.
	maxWaitCall = 600 * time.Second
	// processCallTimeout is the daemon budget of ps, logs and kill, and of
	// each call of logs -f and wait beyond the wait it asks for.
	processCallTimeout = time.Minute
	// waitTimedOut is wait's exit code when the process still runs at its
	// --timeout, as timeout(1)'s and exec's.
	waitTimedOut = 124
)

// startDetached is exec --detach: the command becomes a durable process
// of an existing sandbox (start_command) and its id is printed. set holds
// the exec flags given on the command line.
func startDetached(cf clientFlags, set map[string]bool, req api.StartCommandRequest, cmdTimeout time.Duration, readStdin bool, stdout, stderr io.Writer) error {
	if req.Sandbox == "" {
		return &exitError{code: 2, err: errors.New("--detach needs --sandbox ID: a throwaway sandbox ends when exec returns, and its processes with it; create one first (sandbox-sidecar create --ttl 2h)")}
	}
	if set["stream"] || set["max-output-bytes"] {
		return &exitError{code: 2, err: errors.New("--stream and --max-output-bytes are a foreground command's: a detached process's output is kept on the host (up to the daemon's [processes] log_bytes per stream); read it with sandbox-sidecar logs")}
	}
	if set["command-timeout"] {
		// A detached process has no budget unless one is asked for.
		if cmdTimeout <= 0 {
			return &exitError{code: 2, err: errors.New("--command-timeout must be positive")}
		}
		req.TimeoutS = cmdTimeout.Seconds()
	}
	if cf.timeout == 0 {
		cf.timeout = processCallTimeout
	}
	if readStdin {
		data, err := io.ReadAll(io.LimitReader(os.Stdin, 8<<20))
		if err != nil {
			return err
		}
		req.Stdin = data
	}
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		res, err := cl.StartCommand(ctx, req)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, res.Process)
		state := "running"
		if !res.Running {
			state = "ended"
		}
		switch {
		case res.Existing:
			fmt.Fprintf(stderr, "sandbox-sidecar exec: %q already names process %s (%s); nothing was started\n", res.Name, res.Process, state)
		case !res.Running:
			fmt.Fprintf(stderr, "sandbox-sidecar exec: process %s ended at once; `sandbox-sidecar wait %s %s` gives its exit code, `logs --stderr` why\n", res.Process, req.Sandbox, res.Process)
		}
		return nil
	})
}

// parsePositional parses flags given before, between or after the
// positional arguments (`logs SANDBOX PROCESS -f`) and wants exactly the
// ones named.
func parsePositional(fs *flag.FlagSet, args []string, names ...string) ([]string, error) {
	pos, err := positionals(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) != len(names) {
		return nil, &exitError{code: 2, err: fmt.Errorf("want %s", strings.Join(names, " "))}
	}
	return pos, nil
}

// positionals parses flags given before, between or after the positional
// arguments and returns those, however many.
func positionals(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// listedProcess is what ps --json prints of a process.
type listedProcess struct {
	Process     string   `json:"process"`
	Name        string   `json:"name"`
	Command     string   `json:"command,omitempty"`
	Argv        []string `json:"argv,omitempty"`
	Running     bool     `json:"running"`
	ExitCode    *int     `json:"exit_code"`
	Reason      string   `json:"reason,omitempty"`
	StartedAt   float64  `json:"started_at"`
	EndedAt     *float64 `json:"ended_at"`
	StdoutBytes int64    `json:"stdout_bytes"`
	StderrBytes int64    `json:"stderr_bytes"`
}

func runPs(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	var asJSON bool
	fs := newFlags("ps", "SANDBOX [--json]", stderr)
	cf.register(fs, processCallTimeout)
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	pos, err := parsePositional(fs, args, "SANDBOX")
	if err != nil {
		return err
	}
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		res, err := cl.ListProcesses(ctx, pos[0])
		if err != nil {
			return err
		}
		if asJSON {
			out := make([]listedProcess, 0, len(res.Processes))
			for _, p := range res.Processes {
				out = append(out, listedProcess{Process: p.Process, Name: p.Name, Command: p.Command, Argv: p.Argv, Running: p.Running,
					ExitCode: p.ExitCode, Reason: p.Reason, StartedAt: p.StartedAt, EndedAt: p.EndedAt, StdoutBytes: p.StdoutBytes, StderrBytes: p.StderrBytes})
			}
			return writeJSON(stdout, out)
		}
		if len(res.Processes) == 0 {
			fmt.Fprintln(stdout, "no processes")
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "PROCESS\tNAME\tSTATE\tEXIT\tREASON\tSTARTED\tOUT\tERR\tCOMMAND")
		for _, p := range res.Processes {
			state, exit, reason := "running", "-", "-"
			if !p.Running {
				state = "ended"
				if p.ExitCode != nil {
					exit = fmt.Sprint(*p.ExitCode)
				}
				if p.Reason != "" {
					reason = p.Reason
				}
			}
			name := p.Name
			if name == "" {
				name = "-"
			}
			started := time.Since(unixTime(p.StartedAt)).Round(time.Second).String() + " ago"
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Process, name, state, exit, reason, started,
				humanBytes(p.StdoutBytes), humanBytes(p.StderrBytes), commandLine(p.Command, p.Argv))
		}
		return tw.Flush()
	})
}

func unixTime(s float64) time.Time { return time.UnixMilli(int64(s * 1000)) }

// commandLine is what a process runs, as one line: its shell string, or
// its argv quoted as a shell would need it.
func commandLine(command string, argv []string) string {
	if command != "" || len(argv) == 0 {
		return strings.ReplaceAll(command, "\n", "\\n")
	}
	quoted := make([]string, len(argv))
	for i, a := range argv {
		quoted[i] = shellQuote(a)
	}
	return strings.Join(quoted, " ")
}

// shellQuote leaves a word of safe characters as it is and single-quotes
// anything else.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// session is a connection that logs -f and wait open again when it
// breaks (the daemon restarted, or the connection was cut): what they ask
// for is addressed by byte offset or is the process's end, so a call made
// again on the new connection neither loses nor repeats anything.
type session struct {
	cf     *clientFlags
	cl     *ipc.Client
	name   string // the subcommand, for its notes on stderr
	stderr io.Writer
}

// openSession dials once: a daemon that cannot be reached at the start is
// exit code 2, as for every client command.
func openSession(cf *clientFlags, name string, stderr io.Writer) (*session, error) {
	cl, err := cf.dialWithin(cf.timeout)
	if err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			return nil, err
		}
		return nil, &exitError{code: 2, err: err}
	}
	return &session{cf: cf, cl: cl, name: name, stderr: stderr}, nil
}

func (s *session) close() {
	if s.cl != nil {
		s.cl.Close()
	}
}

// call runs fn within budget. When the connection breaks it dials again,
// for up to --timeout, and runs fn again; a refusal of the daemon's own
// (but shutting_down and busy, which a restarted daemon answers
// differently) is returned as it is.
func (s *session) call(budget time.Duration, fn func(ctx context.Context, cl *ipc.Client) error) error {
	var lost time.Time
	for {
		if s.cl != nil {
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			err := fn(ctx, s.cl)
			cancel()
			if err == nil || !reconnectable(err) {
				return err
			}
			s.cl.Close()
			s.cl = nil
			if lost.IsZero() {
				lost = time.Now()
				fmt.Fprintf(s.stderr, "sandbox-sidecar %s: the connection to the daemon broke (%v); reconnecting\n", s.name, err)
			}
		}
		left := s.cf.timeout - time.Since(lost)
		if left <= 0 {
			return fmt.Errorf("the daemon was not back within %s (--timeout)", s.cf.timeout)
		}
		cl, err := s.cf.dialWithin(min(left, 5*time.Second))
		if err != nil {
			time.Sleep(min(left, 250*time.Millisecond))
			continue
		}
		s.cl = cl
	}
}

// reconnectable: the error is the connection's, or a refusal that a new
// connection (to the daemon once it is back) may not meet.
func reconnectable(err error) bool {
	var e *ipc.Error
	if errors.As(err, &e) {
		return e.Code == ipc.CodeShuttingDown || e.Code == ipc.CodeBusy
	}
	return true
}

func (c *clientFlags) dialWithin(d time.Duration) (*ipc.Client, error) {
	trusted, err := c.trustedDaemonUIDs()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return ipc.DialWith(ctx, c.socket, ipc.DialOptions{TrustedUIDs: trusted})
}

func runLogs(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	var follow, errStream bool
	var from int64
	fs := newFlags("logs", "SANDBOX PROCESS [-f] [--from N] [--stderr]", stderr)
	cf.register(fs, processCallTimeout)
	fs.BoolVar(&follow, "f", false, "follow: go on printing as the process writes, until it ends (reconnecting, for up to --timeout, when the connection breaks)")
	fs.BoolVar(&follow, "follow", false, "the same as -f")
	fs.Int64Var(&from, "from", 0, "start at this byte offset of the stream (offsets count from the process's start)")
	fs.BoolVar(&errStream, "stderr", false, "print the process's stderr instead of its stdout (to this command's stdout)")
	pos, err := parsePositional(fs, args, "SANDBOX", "PROCESS")
	if err != nil {
		return err
	}
	if from < 0 {
		return &exitError{code: 2, err: errors.New("--from must be a byte offset >= 0")}
	}
	stream := "stdout"
	if errStream {
		stream = "stderr"
	}
	s, err := openSession(&cf, "logs", stderr)
	if err != nil {
		return err
	}
	defer s.close()
	req := api.ReadOutputRequest{Sandbox: pos[0], Process: pos[1], Stream: stream, Offset: from}
	budget := cf.timeout
	if follow {
		req.WaitS = followWait.Seconds()
		budget += followWait
	}
	for {
		var r api.ReadOutputResult
		err := s.call(budget, func(ctx context.Context, cl *ipc.Client) (err error) {
			r, err = cl.ReadOutput(ctx, req)
			return err
		})
		if err != nil {
			return err
		}
		if r.Dropped > 0 {
			fmt.Fprintf(stderr, "sandbox-sidecar logs: %s bytes %d to %d were dropped (the daemon keeps the last [processes] log_bytes of a stream)\n", stream, r.Offset-r.Dropped, r.Offset)
		}
		if _, err := stdout.Write(r.Data); err != nil {
			return err
		}
		req.Offset = r.NextOffset
		if len(r.Data) == 0 && (!follow || !r.Running) {
			return nil
		}
	}
}

func runKill(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	var sig string
	fs := newFlags("kill", "SANDBOX PROCESS [--signal TERM|KILL|INT|HUP|USR1|USR2]", stderr)
	cf.register(fs, processCallTimeout)
	fs.StringVar(&sig, "signal", "TERM", "the signal for the process's group: TERM, KILL, INT, HUP, USR1 or USR2 (SIGTERM and term are the same)")
	pos, err := parsePositional(fs, args, "SANDBOX", "PROCESS")
	if err != nil {
		return err
	}
	sig = strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(sig)), "SIG")
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		return cl.SignalProcess(ctx, api.SignalProcessRequest{Sandbox: pos[0], Process: pos[1], Signal: sig})
	})
}

func runWait(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	var waitFor time.Duration
	fs := newFlags("wait", "SANDBOX PROCESS [--timeout D]", stderr)
	cf.registerConn(fs)
	fs.DurationVar(&waitFor, "timeout", 0, fmt.Sprintf("wait at most this long (0: until the process ends); still running then is exit code %d", waitTimedOut))
	pos, err := parsePositional(fs, args, "SANDBOX", "PROCESS")
	if err != nil {
		return err
	}
	if waitFor < 0 {
		return &exitError{code: 2, err: errors.New("--timeout must be >= 0")}
	}
	// The daemon's budget for each call (and for coming back after a
	// break), beyond the wait it is asked for.
	cf.timeout = processCallTimeout
	s, err := openSession(&cf, "wait", stderr)
	if err != nil {
		return err
	}
	defer s.close()
	var deadline time.Time
	if waitFor > 0 {
		deadline = time.Now().Add(waitFor)
	}
	for {
		wait := maxWaitCall
		if !deadline.IsZero() {
			wait = min(wait, time.Until(deadline))
		}
		req := api.WaitProcessRequest{Sandbox: pos[0], Process: pos[1]}
		if wait > 0 {
			req.TimeoutS = wait.Seconds()
		}
		var p api.ProcessInfo
		err := s.call(wait+cf.timeout, func(ctx context.Context, cl *ipc.Client) (err error) {
			p, err = cl.WaitProcess(ctx, req)
			return err
		})
		if err != nil {
			return err
		}
		label := p.Process
		if p.Name != "" {
			label += fmt.Sprintf(" (%s)", p.Name)
		}
		if !p.Running {
			code := 1
			if p.ExitCode != nil {
				code = *p.ExitCode
			}
			took := "-"
			if p.EndedAt != nil {
				took = unixTime(*p.EndedAt).Sub(unixTime(p.StartedAt)).Round(time.Millisecond).String()
			}
			fmt.Fprintf(stderr, "%s: %s, exit code %d, after %s; stdout %s, stderr %s\n", label, p.Reason, code, took, humanBytes(p.StdoutBytes), humanBytes(p.StderrBytes))
			if code == 0 {
				return nil
			}
			return &exitError{code: code}
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			fmt.Fprintf(stderr, "%s: still running after %s\n", label, waitFor)
			return &exitError{code: waitTimedOut}
		}
	}
}
