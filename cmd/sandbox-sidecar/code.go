package main

// The CLI of code contexts (the daemon's run_code and the ops around it):
// code runs a cell of Python in one of a sandbox's contexts, its output
// shown as it comes and then its results; contexts lists a sandbox's
// contexts, contexts rm ends one and contexts restart drops its state.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

const (
	// codeCallGrace is the daemon budget of code beyond the cell's own
	// timeout: the interrupt's kill grace and the answer's way back.
	codeCallGrace = 2 * time.Minute
	// maxCodeBytes bounds the code read from a file or stdin.
	maxCodeBytes = 8 << 20
	// code's exit codes beyond 1 (the cell raised, or its context was
	// lost), as exec's: the cell reached its timeout, or its context was
	// killed for the sandbox's memory.
	codeTimedOut = 124
	codeOOM      = 137
)

// imageTypes are the results code shows as images (saved by --save-dir),
// in the order a bundle holding several is looked at, with their files'
// extensions.
var imageTypes = []struct{ mime, ext string }{
	{"image/png", "png"},
	{"image/jpeg", "jpg"},
	{"image/svg+xml", "svg"},
}

func runCode(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	var contextName, inline, saveDir string
	var cellTimeout time.Duration
	var maxOut int
	fs := newFlags("code", "SANDBOX [--context C] [--timeout D] [--save-dir DIR] [-c CODE | FILE | < code]", stderr)
	cf.registerConn(fs)
	fs.StringVar(&contextName, "context", "default", "the code context to run in, made on first use: its variables persist from one run to the next")
	fs.DurationVar(&cellTimeout, "timeout", time.Minute, fmt.Sprintf("the cell's budget: at it the cell gets a KeyboardInterrupt and code exits %d", codeTimedOut))
	fs.StringVar(&inline, "c", "", "the code to run (instead of a FILE, or stdin)")
	fs.StringVar(&saveDir, "save-dir", "", "write each image result (PNG, JPEG, SVG) to a file in this directory, named CONTEXT-CELL-N.EXT, and print its path")
	fs.IntVar(&maxOut, "max-output-bytes", 1<<20, "per-stream output cap (the tail is kept), and the cap of the results' bytes together")
	pos, err := positionals(fs, args)
	if err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if len(pos) == 0 || len(pos) > 2 {
		return &exitError{code: 2, err: errors.New("want SANDBOX [FILE]")}
	}
	if given["c"] && len(pos) == 2 {
		return &exitError{code: 2, err: errors.New("give the code with -c or as a FILE, not both")}
	}
	if cellTimeout <= 0 {
		return &exitError{code: 2, err: errors.New("--timeout must be positive")}
	}
	if maxOut < 0 {
		return &exitError{code: 2, err: errors.New("--max-output-bytes must be >= 0")}
	}
	file := ""
	if len(pos) == 2 {
		file = pos[1]
	}
	code, err := readCode(given["c"], inline, file, os.Stdin)
	if err != nil {
		return err
	}
	cf.timeout = cellTimeout + codeCallGrace
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		req := api.RunCodeRequest{Sandbox: pos[0], Code: code, Context: contextName, TimeoutS: cellTimeout.Seconds(), MaxOutputBytes: &maxOut, Stream: true}
		live := func(event string, data []byte) {
			switch event {
			case "stdout":
				stdout.Write(data)
			case "stderr":
				stderr.Write(data)
			}
		}
		var res api.RunCodeResult
		if err := cl.CallStream(ctx, ipc.OpRunCode, req, &res, live); err != nil {
			return err
		}
		return showCodeResult(res, contextName, cellTimeout, saveDir, stdout, stderr)
	})
}

// readCode is the cell: -c's string when given, else FILE's contents
// ("-" is stdin), else stdin's; at most maxCodeBytes.
func readCode(inlineGiven bool, inline, file string, stdin io.Reader) (string, error) {
	if inlineGiven {
		return inline, nil
	}
	from, what := stdin, "stdin"
	if file != "" && file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return "", &exitError{code: 2, err: err}
		}
		defer f.Close()
		from, what = f, file
	}
	data, err := io.ReadAll(io.LimitReader(from, maxCodeBytes+1))
	if err != nil {
		return "", fmt.Errorf("reading the code from %s: %w", what, err)
	}
	if len(data) > maxCodeBytes {
		return "", &exitError{code: 2, err: fmt.Errorf("the code in %s is over %s; run a file of the sandbox with exec instead", what, humanBytes(maxCodeBytes))}
	}
	return string(data), nil
}

// showCodeResult prints a cell's results after its (streamed) output:
// each one's text/plain, an image's type and size (and the file it was
// saved to, with saveDir); the traceback on stderr. Its error says how the
// cell ended when not well: exit 1 for an exception or a lost context,
// codeTimedOut at the timeout, codeOOM when the context ran out of memory.
func showCodeResult(res api.RunCodeResult, contextName string, timeout time.Duration, saveDir string, stdout, stderr io.Writer) error {
	if n := derefInt(res.StdoutStreamDropped) + derefInt(res.StderrStreamDropped); n > 0 {
		fmt.Fprintf(stderr, "sandbox-sidecar code: %d bytes of output were not shown: they came faster than this terminal read them\n", n)
	}
	for i, b := range res.Results {
		if mime, ext, data, ok := bundleImage(b); ok {
			where := "not saved: --save-dir DIR writes it to a file"
			if saveDir != "" {
				path := filepath.Join(saveDir, fmt.Sprintf("%s-%d-%d.%s", contextName, res.ExecutionCount, i+1, ext))
				if err := os.MkdirAll(saveDir, 0o755); err != nil {
					return err
				}
				if err := os.WriteFile(path, data, 0o644); err != nil {
					return err
				}
				where = "saved to " + path
			}
			fmt.Fprintf(stdout, "[%s, %s: %s]\n", mime, humanBytes(int64(len(data))), where)
			continue
		}
		text, ok := b["text/plain"].(string)
		if !ok {
			text = "[a result without text/plain]"
		}
		fmt.Fprint(stdout, text)
		if !strings.HasSuffix(text, "\n") {
			fmt.Fprintln(stdout)
		}
	}
	if res.ResultsTruncated {
		fmt.Fprintln(stderr, "sandbox-sidecar code: some results were left out: too many, or larger than --max-output-bytes")
	}
	if e := res.Error; e != nil {
		if len(e.Traceback) > 0 {
			fmt.Fprint(stderr, strings.Join(e.Traceback, ""))
		} else {
			fmt.Fprintf(stderr, "%s: %s\n", e.Name, e.Value)
		}
	}
	lost := "its variables are gone, and its next cell starts a fresh one"
	switch {
	case res.OOMKilled:
		return &exitError{code: codeOOM, err: fmt.Errorf("the context was killed: the sandbox reached its memory limit (oom_killed); %s", lost)}
	case res.TimedOut && res.ContextLost:
		return &exitError{code: codeTimedOut, err: fmt.Errorf("timed out after %s, and the context did not stop at the interrupt: it was killed; %s", timeout, lost)}
	case res.TimedOut:
		return &exitError{code: codeTimedOut, err: fmt.Errorf("timed out after %s: the cell was interrupted; the context keeps its variables", timeout)}
	case res.ContextLost:
		return &exitError{code: 1, err: fmt.Errorf("the context's process died; %s", lost)}
	case res.Error != nil:
		return &exitError{code: 1}
	}
	return nil
}

// bundleImage is a result's image: its MIME type, a file extension and
// its bytes.
func bundleImage(b api.Bundle) (mime, ext string, data []byte, ok bool) {
	for _, t := range imageTypes {
		switch v := b[t.mime].(type) {
		case []byte:
			return t.mime, t.ext, v, true
		case string:
			return t.mime, t.ext, []byte(v), true
		}
	}
	return "", "", nil, false
}

// listedContext is what contexts --json prints of a context.
type listedContext struct {
	Context        string `json:"context"`
	Running        bool   `json:"running"`
	ExecutionCount int    `json:"execution_count"`
}

func runContexts(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "rm":
			return endContext("rm", "end a code context: its process and its variables", args[1:], stderr)
		case "restart":
			return endContext("restart", "drop a code context's variables: its next cell starts a fresh interpreter", args[1:], stderr)
		case "ls":
			args = args[1:]
		}
	}
	var cf clientFlags
	var asJSON bool
	fs := newFlags("contexts", "SANDBOX [--json]   (or: contexts rm SANDBOX CONTEXT, contexts restart SANDBOX CONTEXT)", stderr)
	cf.register(fs, processCallTimeout)
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	pos, err := parsePositional(fs, args, "SANDBOX")
	if err != nil {
		return err
	}
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		res, err := cl.ListContexts(ctx, pos[0])
		if err != nil {
			return err
		}
		if asJSON {
			out := make([]listedContext, 0, len(res.Contexts))
			for _, c := range res.Contexts {
				out = append(out, listedContext{Context: c.Context, Running: c.Running, ExecutionCount: c.ExecutionCount})
			}
			return writeJSON(stdout, out)
		}
		if len(res.Contexts) == 0 {
			fmt.Fprintln(stdout, "no contexts")
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CONTEXT\tSTATE\tCELLS")
		for _, c := range res.Contexts {
			state := "idle"
			if c.Running {
				state = "running"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\n", c.Context, state, c.ExecutionCount)
		}
		return tw.Flush()
	})
}

// endContext is contexts rm and contexts restart: either ends the
// context's process and state; after a restart the context's next cell
// makes it again, from nothing.
func endContext(sub, summary string, args []string, stderr io.Writer) error {
	var cf clientFlags
	fs := flag.NewFlagSet("contexts "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: sandbox-sidecar contexts %s SANDBOX CONTEXT\n\n%s.\n\nFlags:\n", sub, summary)
		fs.PrintDefaults()
	}
	cf.register(fs, processCallTimeout)
	pos, err := parsePositional(fs, args, "SANDBOX", "CONTEXT")
	if err != nil {
		return err
	}
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		req := api.ContextRequest{Sandbox: pos[0], Context: pos[1]}
		if sub == "restart" {
			return cl.RestartContext(ctx, req)
		}
		return cl.DeleteContext(ctx, req)
	})
}
