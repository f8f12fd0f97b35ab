// Command sandbox-sidecar is the daemon that owns a worker host's sandboxes
// (serve) and its administration CLI (health, ls, exec, rm, ...). Every
// subcommand but serve is a client of a running daemon's socket.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

// exitError carries an exit code out of a subcommand.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

var commands map[string]command

func init() {
	commands = map[string]command{
		"serve":    {"run the daemon in the foreground", runServe},
		"health":   {"check a running daemon (exit 0 healthy, 1 degraded, 2 unreachable)", runHealth},
		"ls":       {"list sandboxes, grouped by Airflow run", runList},
		"create":   {"create a sandbox that lives until its ttl and print its id", runCreate},
		"exec":     {"run a command in a sandbox (a throwaway one unless --sandbox is given), or start a durable process (--detach)", runExec},
		"ps":       {"list a sandbox's durable processes", runPs},
		"logs":     {"print a durable process's output from a byte offset (-f: follow it until it ends)", runLogs},
		"kill":     {"send a signal to a durable process's group", runKill},
		"wait":     {"wait for a durable process's end and exit with its exit code", runWait},
		"code":     {"run Python in a sandbox's code context, whose variables persist from one run to the next", runCode},
		"contexts": {"list a sandbox's code contexts (contexts rm ends one, contexts restart drops its variables)", runContexts},
		"write":    {"write stdin to a file in a sandbox", runWrite},
		"read":     {"print a file of a sandbox to stdout", runRead},
		"rm":       {"destroy sandboxes (or every sandbox of a run with --run)", runRemove},
		"pause":    {"pause sandboxes: every process stops, using no CPU, until the sandbox is used or resumed", runPause},
		"resume":   {"resume paused sandboxes: their processes go on where they were", runResume},
		"gc":       {"destroy orphaned sandboxes now (via the daemon, or offline when none runs)", runGC},
		"image":    {"import, pull, list, inspect and remove the images sandboxes run on", runImage},
		"version":  {"print the version", runVersion},
		"config":   {"check or show the configuration file", runConfig},
	}
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "sandbox-sidecar %s: runs AI-agent code in sandboxes on behalf of Airflow workers.\n\nUsage: sandbox-sidecar <command> [flags]\n\nCommands:\n", version)
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "\nRun 'sandbox-sidecar <command> --help' for a command's flags.\n")
}

func main() {
	// In a sandbox's init process (the daemon's own binary, started by
	// bubblewrap) this runs the init and never returns.
	bwrap.InitMain()
	// The same for a gVisor sandbox's init, started by runsc.
	gvisor.InitMain()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	name := args[0]
	switch name {
	case "-h", "--help", "help":
		usage(stdout)
		return 0
	case "--version", "-version":
		name = "version"
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "sandbox-sidecar: unknown command %q\n\n", name)
		usage(stderr)
		return 2
	}
	err := cmd.run(args[1:], stdout, stderr)
	var ee *exitError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ee):
		if ee.err != nil {
			fmt.Fprintf(stderr, "sandbox-sidecar %s: %v\n", name, ee.err)
		}
		return ee.code
	default:
		fmt.Fprintf(stderr, "sandbox-sidecar %s: %v\n", name, err)
		return 1
	}
}

// newFlags returns a FlagSet whose --help prints the summary and flags.
func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: sandbox-sidecar %s %s\n\n%s.\n\nFlags:\n", name, synopsis, commands[name].summary)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses and turns usage errors into exit code 2.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &exitError{code: 2}
	}
	return nil
}

func runVersion(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("version", "", stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "sandbox-sidecar %s\n", version)
	return nil
}
