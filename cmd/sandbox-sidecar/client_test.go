package main

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// clientCommands are the CLI's commands that talk to a daemon, each with
// arguments that pass its own checks, so that dialing is what fails.
func clientCommands(t *testing.T) map[string][]string {
	tarball := filepath.Join(t.TempDir(), "root.tar")
	require.NoError(t, os.WriteFile(tarball, nil, 0o644))
	return map[string][]string{
		"ls":               {"ls"},
		"ls --json":        {"ls", "--json"},
		"create":           {"create", "--ttl", "1m"},
		"exec":             {"exec", "--", "true"},
		"exec --sh":        {"exec", "--sandbox", "sc-1", "--sh", "true"},
		"write":            {"write", "sc-1", "f"},
		"read":             {"read", "sc-1", "f"},
		"rm":               {"rm", "sc-1"},
		"rm --run":         {"rm", "--run", "dag/run"},
		"image ls":         {"image", "ls"},
		"image inspect":    {"image", "inspect", "python"},
		"image rm":         {"image", "rm", "python"},
		"image import":     {"image", "import", "--name", "x", tarball},
		"exec --detach":    {"exec", "--detach", "--sandbox", "sc-1", "--name", "job", "--", "true"},
		"ps":               {"ps", "sc-1"},
		"logs":             {"logs", "sc-1", "p-1"},
		"logs -f":          {"logs", "-f", "sc-1", "p-1"},
		"kill":             {"kill", "sc-1", "p-1"},
		"wait":             {"wait", "sc-1", "p-1"},
		"code -c":          {"code", "sc-1", "-c", "1"},
		"code FILE":        {"code", "--context", "c", "sc-1", tarball},
		"contexts":         {"contexts", "sc-1"},
		"contexts rm":      {"contexts", "rm", "sc-1", "c"},
		"contexts restart": {"contexts", "restart", "sc-1", "c"},
		"snapshot":         {"snapshot", "sc-1", "prepared"},
		"fork":             {"fork", "sc-1", "3"},
		"image push":       {"image", "push", "python", "127.0.0.1:5000/python:1"},
	}
}

// TestClientCommandsWithoutDaemon: every client command that cannot reach
// the daemon exits 2 and says why on stderr, prefixed by its name, with
// nothing on stdout (health prints its own report: unreachable).
func TestClientCommandsWithoutDaemon(t *testing.T) {
	dir := t.TempDir()
	refused := filepath.Join(dir, "refused.sock")
	l, err := net.Listen("unix", refused)
	require.NoError(t, err)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, l.Close()) // the file stays, nobody listens: ECONNREFUSED
	sockets := map[string]string{
		"no socket":      filepath.Join(dir, "missing.sock"),
		"nobody listens": refused,
	}
	for sockName, socket := range sockets {
		t.Setenv(SocketEnv, socket)
		for name, args := range clientCommands(t) {
			t.Run(sockName+"/"+name, func(t *testing.T) {
				var stdout, stderr bytes.Buffer
				code := run(args, &stdout, &stderr)
				assert.Equal(t, 2, code)
				assert.Empty(t, stdout.String())
				assert.True(t, strings.HasPrefix(stderr.String(), "sandbox-sidecar "+args[0]+": connecting to "+socket+": "), "stderr: %q", stderr.String())
				assert.Contains(t, stderr.String(), "is the daemon running?")
				assert.Equal(t, 1, strings.Count(stderr.String(), "\n"), "one line: %q", stderr.String())
			})
		}
		t.Run(sockName+"/health", func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			assert.Equal(t, 2, run([]string{"health"}, &stdout, &stderr))
			assert.True(t, strings.HasPrefix(stdout.String(), "unreachable: connecting to "+socket+": "), "stdout: %q", stdout.String())
			assert.Empty(t, stderr.String())

			stdout.Reset()
			assert.Equal(t, 2, run([]string{"health", "--json"}, &stdout, &stderr))
			var rep map[string]string
			require.NoError(t, json.Unmarshal(stdout.Bytes(), &rep), "%s", stdout.String())
			assert.Equal(t, "unreachable", rep["status"])
			assert.Equal(t, socket, rep["socket"])
			assert.Contains(t, rep["error"], "connecting to "+socket)
			assert.Empty(t, stderr.String())
		})
	}
}

// TestClientCommandsBadDaemonUID: a --daemon-uid that names nobody is a
// usage error (exit 2) of every client command, before any dialing.
func TestClientCommandsBadDaemonUID(t *testing.T) {
	t.Setenv(SocketEnv, filepath.Join(t.TempDir(), "missing.sock"))
	for name, args := range clientCommands(t) {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			// Client flags go right after the (sub)command's name.
			at := 1
			if args[0] == "image" || args[0] == "contexts" && len(args) > 2 {
				at = 2
			}
			withFlag := append(append(append([]string{}, args[:at]...), "--daemon-uid", "no-such-user-here"), args[at:]...)
			assert.Equal(t, 2, run(withFlag, &stdout, &stderr))
			assert.Equal(t, "sandbox-sidecar "+args[0]+": --daemon-uid: unknown user \"no-such-user-here\"\n", stderr.String())
		})
	}
	var stdout, stderr bytes.Buffer
	assert.Equal(t, 2, run([]string{"health", "--daemon-uid", "no-such-user-here"}, &stdout, &stderr))
	assert.Equal(t, "unreachable: --daemon-uid: unknown user \"no-such-user-here\"\n", stdout.String())
}
