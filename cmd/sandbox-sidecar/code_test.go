package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// code prints each result's text, an image's type and size (and where
// --save-dir put it), the traceback on stderr, and exits as the cell ended.
func TestCodeShowResult(t *testing.T) {
	png := append([]byte("\x89PNG\r\n\x1a\n"), bytes.Repeat([]byte{7}, 2040)...)
	for _, c := range []struct {
		name           string
		res            api.RunCodeResult
		save           bool
		stdout, stderr string
		code           int
		err            string
	}{
		{
			name:   "values and displays",
			res:    api.RunCodeResult{Results: []api.Bundle{{"text/plain": "{'k': 1}", "text/html": "<b>k</b>"}, {"text/plain": "42\n"}}, ExecutionCount: 2, Reason: "ok"},
			stdout: "{'k': 1}\n42\n",
		},
		{
			name:   "an image, not saved",
			res:    api.RunCodeResult{Results: []api.Bundle{{"text/plain": "<Figure>", "image/png": png}}, ExecutionCount: 3, Reason: "ok"},
			stdout: "[image/png, 2.0 KiB: not saved: --save-dir DIR writes it to a file]\n",
		},
		{
			name:   "an image saved, an SVG as text",
			res:    api.RunCodeResult{Results: []api.Bundle{{"text/plain": "x"}, {"text/plain": "<Figure>", "image/png": png}, {"text/plain": "s", "image/svg+xml": "<svg/>"}}, ExecutionCount: 3, Reason: "ok"},
			save:   true,
			stdout: "x\n[image/png, 2.0 KiB: saved to DIR/work-3-2.png]\n[image/svg+xml, 6 B: saved to DIR/work-3-3.svg]\n",
		},
		{
			name: "an exception",
			res: api.RunCodeResult{Error: &api.CodeError{Name: "ZeroDivisionError", Value: "division by zero",
				Traceback: []string{"Traceback (most recent call last):\n", "  File \"<cell-1>\", line 1, in <module>\n", "ZeroDivisionError: division by zero\n"}}, Reason: "error"},
			stderr: "Traceback (most recent call last):\n  File \"<cell-1>\", line 1, in <module>\nZeroDivisionError: division by zero\n",
			code:   1,
		},
		{
			name:   "an exception without a traceback",
			res:    api.RunCodeResult{Error: &api.CodeError{Name: "KeyboardInterrupt"}, TimedOut: true, Reason: "timed_out"},
			stderr: "KeyboardInterrupt: \n",
			code:   codeTimedOut,
			err:    "timed out after 2s: the cell was interrupted; the context keeps its variables",
		},
		{
			name: "killed at the timeout",
			res:  api.RunCodeResult{TimedOut: true, ContextLost: true, Reason: "timed_out"},
			code: codeTimedOut,
			err:  "timed out after 2s, and the context did not stop at the interrupt: it was killed; its variables are gone, and its next cell starts a fresh one",
		},
		{
			name: "out of memory",
			res:  api.RunCodeResult{ContextLost: true, OOMKilled: true, Reason: "oom_killed"},
			code: codeOOM,
			err:  "the context was killed: the sandbox reached its memory limit (oom_killed); its variables are gone, and its next cell starts a fresh one",
		},
		{
			name: "lost",
			res:  api.RunCodeResult{ContextLost: true, Reason: "context_lost"},
			code: 1,
			err:  "the context's process died; its variables are gone, and its next cell starts a fresh one",
		},
		{
			name:   "bounds",
			res:    api.RunCodeResult{Results: []api.Bundle{{"application/json": map[string]any{}}}, ResultsTruncated: true, StdoutStreamDropped: new(int64(5)), StderrStreamDropped: new(int64(2)), Reason: "ok"},
			stdout: "[a result without text/plain]\n",
			stderr: "sandbox-sidecar code: 7 bytes of output were not shown: they came faster than this terminal read them\n" +
				"sandbox-sidecar code: some results were left out: too many, or larger than --max-output-bytes\n",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := ""
			if c.save {
				dir = filepath.Join(t.TempDir(), "figures")
			}
			var stdout, stderr bytes.Buffer
			err := showCodeResult(c.res, "work", 2*time.Second, dir, &stdout, &stderr)
			want := c.stdout
			if c.save {
				want = strings.ReplaceAll(want, "DIR/", dir+"/")
			}
			assert.Equal(t, want, stdout.String())
			assert.Equal(t, c.stderr, stderr.String())
			if c.code == 0 {
				require.NoError(t, err)
			} else {
				var ee *exitError
				require.ErrorAs(t, err, &ee)
				assert.Equal(t, c.code, ee.code)
				if c.err == "" {
					assert.Nil(t, ee.err)
				} else {
					assert.EqualError(t, ee, c.err)
				}
			}
			if c.save {
				data, err := os.ReadFile(filepath.Join(dir, "work-3-2.png"))
				require.NoError(t, err)
				assert.Equal(t, png, data)
				data, err = os.ReadFile(filepath.Join(dir, "work-3-3.svg"))
				require.NoError(t, err)
				assert.Equal(t, "<svg/>", string(data))
			}
		})
	}
}

// The cell comes from -c, else a FILE ("-": stdin), else stdin; bounded.
func TestCodeReadSource(t *testing.T) {
	file := filepath.Join(t.TempDir(), "cell.py")
	require.NoError(t, os.WriteFile(file, []byte("from_file = 1\n"), 0o644))
	stdin := func() *strings.Reader { return strings.NewReader("from_stdin = 1\n") }
	for _, c := range []struct {
		given        bool
		inline, file string
		want         string
	}{
		{true, "x = 1", "", "x = 1"},
		{true, "", "", ""},
		{false, "", file, "from_file = 1\n"},
		{false, "", "-", "from_stdin = 1\n"},
		{false, "", "", "from_stdin = 1\n"},
	} {
		got, err := readCode(c.given, c.inline, c.file, stdin())
		require.NoError(t, err)
		assert.Equal(t, c.want, got)
	}
	_, err := readCode(false, "", filepath.Join(t.TempDir(), "missing.py"), stdin())
	var ee *exitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 2, ee.code)
	_, err = readCode(false, "", "", bytes.NewReader(make([]byte, maxCodeBytes+1)))
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 2, ee.code)
	assert.EqualError(t, err, "the code in stdin is over 8.0 MiB; run a file of the sandbox with exec instead")
}

// Usage errors of code and contexts exit 2 before any dialing.
func TestCodeAndContextsUsage(t *testing.T) {
	t.Setenv(SocketEnv, filepath.Join(t.TempDir(), "missing.sock"))
	file := filepath.Join(t.TempDir(), "cell.py")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"code"}, "sandbox-sidecar code: want SANDBOX [FILE]\n"},
		{[]string{"code", "sc-1", file, "more"}, "sandbox-sidecar code: want SANDBOX [FILE]\n"},
		{[]string{"code", "sc-1", "-c", "1", file}, "sandbox-sidecar code: give the code with -c or as a FILE, not both\n"},
		{[]string{"code", "sc-1", "-c", "1", "--timeout", "0s"}, "sandbox-sidecar code: --timeout must be positive\n"},
		{[]string{"code", "sc-1", "-c", "1", "--max-output-bytes", "-1"}, "sandbox-sidecar code: --max-output-bytes must be >= 0\n"},
		{[]string{"contexts"}, "sandbox-sidecar contexts: want SANDBOX\n"},
		{[]string{"contexts", "rm", "sc-1"}, "sandbox-sidecar contexts: want SANDBOX CONTEXT\n"},
		{[]string{"contexts", "restart", "sc-1", "a", "b"}, "sandbox-sidecar contexts: want SANDBOX CONTEXT\n"},
	} {
		var stdout, stderr bytes.Buffer
		assert.Equal(t, 2, run(c.args, &stdout, &stderr), "%q", c.args)
		assert.Equal(t, c.want, stderr.String(), "%q", c.args)
		assert.Empty(t, stdout.String())
	}
	for _, args := range [][]string{{"code", "--help"}, {"contexts", "--help"}, {"contexts", "rm", "--help"}, {"contexts", "restart", "-h"}} {
		var stdout, stderr bytes.Buffer
		assert.Equal(t, 0, run(args, &stdout, &stderr), "%q", args)
		assert.Contains(t, stderr.String(), "Usage: sandbox-sidecar "+strings.Join(args[:len(args)-1], " "), "%q", args)
	}
}
