package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The CLI of code contexts against the real daemon: code with -c, a FILE
// and stdin, its output as it comes, its results (an image's type and size,
// and --save-dir), its exit codes (an exception, a timeout); contexts, rm
// and restart, and their refusals.
func TestCLICodeContexts(t *testing.T) {
	d := startDaemon(t, "")
	out, errOut, code := d.cli(t, "create", "--ttl", "10m")
	require.Equal(t, 0, code, errOut)
	id := strings.TrimSpace(out)

	out, errOut, code = d.cli(t, "code", id, "-c", "x = 41\nprint('set')")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, "set\n", out)
	assert.Empty(t, errOut)

	// stdin, and the value of the last expression.
	cmd := exec.Command(daemonBin, "code", id)
	cmd.Env = append(os.Environ(), "SANDBOX_SIDECAR_SOCKET="+d.socket)
	cmd.Stdin = strings.NewReader("x + 1\n")
	stdinOut, err := cmd.Output()
	require.NoError(t, err)
	assert.Equal(t, "42\n", string(stdinOut))

	// A FILE whose cell shows an image and a value.
	cell := filepath.Join(d.base, "cell.py")
	require.NoError(t, os.WriteFile(cell, []byte("class Picture:\n"+
		"    def _repr_png_(self): return b'\\x89PNG\\r\\n\\x1a\\n' + bytes(2040)\n"+
		"    def __repr__(self): return '<Picture>'\n"+
		"display(Picture())\n'drawn'\n"), 0o644))
	out, errOut, code = d.cli(t, "code", id, cell)
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, "[image/png, 2.0 KiB: not saved: --save-dir DIR writes it to a file]\n'drawn'\n", out)
	saveDir := filepath.Join(d.base, "figures")
	out, errOut, code = d.cli(t, "code", "--save-dir", saveDir, id, cell)
	require.Equal(t, 0, code, errOut)
	saved := filepath.Join(saveDir, "default-4-1.png")
	assert.Equal(t, "[image/png, 2.0 KiB: saved to "+saved+"]\n'drawn'\n", out)
	png, err := os.ReadFile(saved)
	require.NoError(t, err)
	assert.Equal(t, append([]byte("\x89PNG\r\n\x1a\n"), make([]byte, 2040)...), png)

	// Output shows as the cell writes it, before the cell ends.
	var stdout, stderr lockedBuffer
	cmd = exec.Command(daemonBin, "code", id, "-c", "import sys, time\nprint('one', flush=True)\ntime.sleep(3)\nsys.stderr.write('two\\n')\n'three'")
	cmd.Env = append(os.Environ(), "SANDBOX_SIDECAR_SOCKET="+d.socket)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	eventually(t, 30*time.Second, "the first line shown", func() bool { return stdout.String() == "one\n" })
	select {
	case err := <-done:
		t.Fatalf("code ended (%v) when its first line showed: not streamed", err)
	default:
	}
	select {
	case err := <-done:
		require.NoError(t, err, stderr.String())
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatal("code did not end")
	}
	assert.Equal(t, "one\n'three'\n", stdout.String())
	assert.Equal(t, "two\n", stderr.String())

	// An exception: its traceback, exit code 1; the context goes on.
	out, errOut, code = d.cli(t, "code", id, "-c", "y = x\n1 / 0")
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	assert.True(t, strings.HasPrefix(errOut, "Traceback (most recent call last):\n"), errOut)
	assert.True(t, strings.HasSuffix(errOut, "ZeroDivisionError: division by zero\n"), errOut)
	// The timeout interrupts the cell and keeps the context.
	_, errOut, code = d.cli(t, "code", "--timeout", "1s", id, "-c", "while True:\n    pass")
	assert.Equal(t, 124, code)
	assert.Contains(t, errOut, "KeyboardInterrupt")
	assert.True(t, strings.HasSuffix(errOut, "sandbox-sidecar code: timed out after 1s: the cell was interrupted; the context keeps its variables\n"), errOut)
	out, _, code = d.cli(t, "code", id, "-c", "y")
	assert.Equal(t, 0, code)
	assert.Equal(t, "41\n", out)

	// Contexts share nothing; contexts lists them.
	out, _, code = d.cli(t, "code", "--context", "other", id, "-c", "'x' in globals()")
	assert.Equal(t, 0, code)
	assert.Equal(t, "False\n", out)
	out, errOut, code = d.cli(t, "contexts", id)
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 3, out)
	assert.Regexp(t, `^CONTEXT +STATE +CELLS$`, lines[0])
	assert.Regexp(t, `^default +idle +8$`, lines[1])
	assert.Regexp(t, `^other +idle +1$`, lines[2])
	out, _, code = d.cli(t, "contexts", "--json", id)
	require.Equal(t, 0, code)
	var listed []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &listed), out)
	assert.Equal(t, []map[string]any{
		{"context": "default", "running": false, "execution_count": 8.0},
		{"context": "other", "running": false, "execution_count": 1.0},
	}, listed)

	// restart drops the variables; rm ends a context.
	_, errOut, code = d.cli(t, "contexts", "restart", id, "default")
	require.Equal(t, 0, code, errOut)
	out, _, code = d.cli(t, "code", id, "-c", "'x' in globals()")
	assert.Equal(t, 0, code)
	assert.Equal(t, "False\n", out)
	_, errOut, code = d.cli(t, "contexts", "rm", id, "other")
	require.Equal(t, 0, code, errOut)
	out, _, code = d.cli(t, "contexts", "ls", id)
	assert.Equal(t, 0, code)
	assert.Regexp(t, `^CONTEXT +STATE +CELLS\ndefault +idle +1\n$`, out)
	_, errOut, code = d.cli(t, "contexts", "rm", id, "other")
	assert.Equal(t, 1, code)
	assert.True(t, strings.HasPrefix(errOut, "sandbox-sidecar contexts: context_not_found: "), errOut)
	_, errOut, code = d.cli(t, "code", "--context", "no such", id, "-c", "1")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "sandbox-sidecar code: bad_request: ")
	_, errOut, code = d.cli(t, "code", "sc-0000000000000000", "-c", "1")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "sandbox-sidecar code: not_found: ")

	out, errOut, code = d.cli(t, "create", "--ttl", "10m")
	require.Equal(t, 0, code, errOut)
	out, _, code = d.cli(t, "contexts", strings.TrimSpace(out))
	assert.Equal(t, 0, code)
	assert.Equal(t, "no contexts\n", out)

	var help bytes.Buffer
	for _, sub := range []string{"code", "contexts"} {
		_, errOut, code := d.cli(t, sub, "--help")
		assert.Equal(t, 0, code, sub)
		help.WriteString(errOut)
	}
	assert.Contains(t, help.String(), "-save-dir")
	assert.Contains(t, help.String(), "contexts rm SANDBOX CONTEXT")
}
