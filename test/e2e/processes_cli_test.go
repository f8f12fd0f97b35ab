package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The CLI of durable processes against the real daemon: exec --detach,
// ps, logs (with -f, --from, --stderr and a flood past log_bytes), kill and
// wait with their exit codes, and every refusal.
func TestCLIDurableProcesses(t *testing.T) {
	base := baseDir(t)
	conf := filepath.Join(base, "config.toml")
	require.NoError(t, os.WriteFile(conf, []byte("[processes]\nlog_bytes = \"8KiB\"\n"), 0o644))
	d := startDaemon(t, base, "--config", conf)

	out, errOut, code := d.cli(t, "create", "--ttl", "10m")
	require.Equal(t, 0, code, errOut)
	id := strings.TrimSpace(out)

	_, errOut, code = d.cli(t, "exec", "--detach", "--", "true")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--detach needs --sandbox ID")
	_, errOut, code = d.cli(t, "exec", "--detach", "--sandbox", id, "--stream=false", "--", "true")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--stream and --max-output-bytes are a foreground command's")
	_, errOut, code = d.cli(t, "exec", "--sandbox", id, "--name", "job", "--", "true")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--name names a durable process")

	job := "for i in 1 2 3; do echo line $i; sleep 0.3; done; echo oops >&2; exit 4"
	out, errOut, code = d.cli(t, "exec", "--detach", "--sandbox", id, "--name", "job", "--sh", job)
	require.Equal(t, 0, code, errOut)
	assert.Regexp(t, `^p-[0-9a-f]{12}\n$`, out)
	assert.Empty(t, errOut)
	proc := strings.TrimSpace(out)
	out, errOut, code = d.cli(t, "exec", "--detach", "--sandbox", id, "--name", "job", "--sh", "echo never")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, proc+"\n", out, "the name finds the first")
	assert.Contains(t, errOut, `"job" already names process `+proc)

	// -f follows the process as it writes, to its end; flags may come
	// after the positional arguments.
	out, errOut, code = d.cli(t, "logs", id, proc, "-f")
	assert.Equal(t, 0, code, errOut)
	assert.Equal(t, "line 1\nline 2\nline 3\n", out)
	assert.Empty(t, errOut)
	out, _, code = d.cli(t, "logs", "--stderr", id, proc)
	assert.Equal(t, 0, code)
	assert.Equal(t, "oops\n", out)
	out, _, code = d.cli(t, "logs", "--from", "7", id, proc)
	assert.Equal(t, 0, code)
	assert.Equal(t, "line 2\nline 3\n", out)

	_, errOut, code = d.cli(t, "wait", id, proc)
	assert.Equal(t, 4, code, "wait exits with the process's exit code")
	assert.Regexp(t, `^`+proc+` \(job\): exited, exit code 4, after [0-9.]+m?s; stdout 21 B, stderr 5 B\n$`, errOut)

	// A sleeper: wait's timeout, kill with a signal, its exit code 128+N.
	out, _, code = d.cli(t, "exec", "--detach", "--sandbox", id, "--", "sleep", "600")
	require.Equal(t, 0, code)
	sleeper := strings.TrimSpace(out)
	_, errOut, code = d.cli(t, "wait", id, sleeper, "--timeout", "300ms")
	assert.Equal(t, 124, code)
	assert.Equal(t, sleeper+": still running after 300ms\n", errOut)
	_, errOut, code = d.cli(t, "kill", "--signal", "sigint", id, sleeper)
	assert.Equal(t, 0, code, errOut)
	_, errOut, code = d.cli(t, "wait", id, sleeper)
	assert.Equal(t, 130, code)
	assert.Contains(t, errOut, "killed, exit code 130")
	_, errOut, code = d.cli(t, "kill", id, sleeper)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "sandbox-sidecar kill: process_ended: ")
	_, errOut, code = d.cli(t, "kill", "--signal", "STOP", id, sleeper)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "bad_request")
	_, errOut, code = d.cli(t, "logs", id, "p-000000000000")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "sandbox-sidecar logs: process_not_found: ")
	_, errOut, code = d.cli(t, "logs", id)
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "want SANDBOX PROCESS")

	// --command-timeout is a detached process's budget (none without it).
	out, _, code = d.cli(t, "exec", "--detach", "--sandbox", id, "--command-timeout", "500ms", "--", "sleep", "600")
	require.Equal(t, 0, code)
	_, errOut, code = d.cli(t, "wait", id, strings.TrimSpace(out), "--timeout", "1m")
	assert.Equal(t, 143, code, "SIGTERM at the timeout ended it")
	assert.Contains(t, errOut, ": timed_out, exit code 143")

	// --stdin goes to the process.
	cmd := exec.Command(daemonBin, "exec", "--detach", "--sandbox", id, "--stdin", "--", "cat")
	cmd.Env = append(os.Environ(), "SANDBOX_SIDECAR_SOCKET="+d.socket)
	cmd.Stdin = strings.NewReader("from stdin\n")
	catOut, err := cmd.Output()
	require.NoError(t, err)
	out, _, code = d.cli(t, "logs", "-f", id, strings.TrimSpace(string(catOut)))
	assert.Equal(t, 0, code)
	assert.Equal(t, "from stdin\n", out)

	// A flood past log_bytes: the last 8 KiB, and a note of what is gone.
	out, _, code = d.cli(t, "exec", "--detach", "--sandbox", id, "--name", "flood", "--", "seq", "1", "100000")
	require.Equal(t, 0, code)
	flood := strings.TrimSpace(out)
	_, _, code = d.cli(t, "wait", id, flood)
	require.Equal(t, 0, code)
	out, errOut, code = d.cli(t, "logs", id, flood)
	assert.Equal(t, 0, code)
	assert.Len(t, out, 8<<10)
	assert.True(t, strings.HasSuffix(out, "\n99999\n100000\n"))
	total := 0 // the bytes seq 1 100000 writes
	for i := 1; i <= 100000; i++ {
		total += len(strconv.Itoa(i)) + 1
	}
	assert.Equal(t, "sandbox-sidecar logs: stdout bytes 0 to "+strconv.Itoa(total-8<<10)+" were dropped (the daemon keeps the last [processes] log_bytes of a stream)\n", errOut)

	// ps: a table of every process, oldest first, and its JSON.
	out, errOut, code = d.cli(t, "ps", id)
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 6, out)
	assert.Regexp(t, `^PROCESS +NAME +STATE +EXIT +REASON +STARTED +OUT +ERR +COMMAND$`, lines[0])
	assert.Regexp(t, `^`+proc+` +job +ended +4 +exited +\d+s ago +21 B +5 B +for i in 1 2 3; do echo line \$i;`, lines[1])
	assert.Regexp(t, `^`+sleeper+` +- +ended +130 +killed +\d+s ago +0 B +0 B +sleep 600$`, lines[2])
	assert.Regexp(t, `^`+flood+` +flood +ended +0 +exited +\d+s ago +[0-9.]+ KiB +0 B +seq 1 100000$`, lines[5])
	out, _, code = d.cli(t, "ps", "--json", id)
	require.Equal(t, 0, code)
	var listed []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &listed), out)
	require.Len(t, listed, 5)
	assert.Equal(t, map[string]any{"process": proc, "name": "job", "command": job, "running": false, "exit_code": 4.0, "reason": "exited",
		"started_at": listed[0]["started_at"], "ended_at": listed[0]["ended_at"], "stdout_bytes": 21.0, "stderr_bytes": 5.0}, listed[0])
	assert.Greater(t, listed[0]["ended_at"], listed[0]["started_at"])
	assert.Equal(t, []any{"sleep", "600"}, listed[1]["argv"])
	assert.Equal(t, float64(total), listed[4]["stdout_bytes"])

	out, errOut, code = d.cli(t, "create", "--ttl", "10m")
	require.Equal(t, 0, code, errOut)
	out, _, code = d.cli(t, "ps", strings.TrimSpace(out))
	assert.Equal(t, 0, code)
	assert.Equal(t, "no processes\n", out)

	for _, sub := range []string{"ps", "logs", "kill", "wait", "exec"} {
		_, errOut, code := d.cli(t, sub, "--help")
		assert.Equal(t, 0, code, sub)
		assert.Contains(t, errOut, "Usage: sandbox-sidecar "+sub, sub)
	}
	_, errOut, _ = d.cli(t, "exec", "--help")
	assert.Contains(t, errOut, "-detach")
	_, errOut, _ = d.cli(t, "logs", "--help")
	assert.Contains(t, errOut, "-from")
}

// cutProxy forwards a Unix socket to the daemon's, and can cut every
// connection through it and refuse new ones for a while: to a client, the
// daemon went away and came back.
type cutProxy struct {
	path, target string
	mu           sync.Mutex
	l            net.Listener
	conns        []net.Conn
}

func (p *cutProxy) listen(t *testing.T) {
	t.Helper()
	l, err := net.Listen("unix", p.path)
	require.NoError(t, err)
	p.mu.Lock()
	p.l = l
	p.mu.Unlock()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("unix", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { io.Copy(u, c); u.Close() }()
			go func() { io.Copy(c, u); c.Close() }()
		}
	}()
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.l.Close()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// lockedBuffer is a bytes.Buffer a command writes to while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// logs -f whose connection breaks mid-follow (and whose daemon cannot be
// reached for a while) reconnects and goes on from where it was: every
// line once, none lost.
func TestCLILogsFollowReconnects(t *testing.T) {
	d := startDaemon(t, "")
	out, errOut, code := d.cli(t, "create", "--ttl", "10m")
	require.Equal(t, 0, code, errOut)
	id := strings.TrimSpace(out)
	out, errOut, code = d.cli(t, "exec", "--detach", "--sandbox", id, "--sh", "for i in $(seq 1 40); do echo line $i; sleep 0.1; done")
	require.Equal(t, 0, code, errOut)
	proc := strings.TrimSpace(out)

	p := &cutProxy{path: filepath.Join(d.base, "run", "proxy.sock"), target: d.socket}
	p.listen(t)
	var stdout, stderr lockedBuffer
	cmd := exec.Command(daemonBin, "logs", "-f", id, proc)
	cmd.Env = append(os.Environ(), "SANDBOX_SIDECAR_SOCKET="+p.path)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	eventually(t, 30*time.Second, "line 3 followed", func() bool { return strings.Contains(stdout.String(), "line 3\n") })
	p.cut()
	time.Sleep(700 * time.Millisecond) // the daemon is unreachable meanwhile
	require.NotContains(t, stdout.String(), "line 40\n", "the cut came before the end")
	p.listen(t)
	select {
	case err := <-done:
		require.NoError(t, err, stderr.String())
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatalf("logs -f did not end; stdout %q, stderr %q", stdout.String(), stderr.String())
	}
	var want strings.Builder
	for i := 1; i <= 40; i++ {
		want.WriteString("line " + strconv.Itoa(i) + "\n")
	}
	assert.Equal(t, want.String(), stdout.String())
	assert.Regexp(t, regexp.MustCompile(`^sandbox-sidecar logs: the connection to the daemon broke \(.*\); reconnecting\n$`), stderr.String())
}
