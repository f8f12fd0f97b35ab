package e2e

import (
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
)

// systemSocketDir holds the packaged daemon's socket, which the CLI tries
// before its fallback.
const systemSocketDir = "/run/sandbox-sidecar"

// Another local user creates the CLI's fallback socket directory
// ($TMPDIR/sandbox-sidecar-<uid>) before the victim's daemon does, listens
// there, and answers the victim's CLI with a forged result. The CLI checks
// the directory's owner and the server's credentials, and refuses.
func TestCLIRefusesASocketAnotherUserPlanted(t *testing.T) {
	requireHost(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Fatal("needs setpriv (util-linux)")
	}
	const attacker, victim = "4242", "4343"
	tmp := filepath.Join(baseDir(t), "tmp")
	require.NoError(t, os.Mkdir(tmp, 0o777))
	require.NoError(t, os.Chmod(tmp, 0o1777)) // a shared /tmp
	dir := filepath.Join(tmp, "sandbox-sidecar-"+victim)
	sock := filepath.Join(dir, "sidecar.sock")

	// The forger answers request 1 with a health that says all is well.
	forged, err := ipc.EncodeResponse(1, map[string]any{"status": "ok", "backend": "forged", "sandboxes": 0, "commands": 0, "version": "forged", "uptime_s": 1}, nil)
	require.NoError(t, err)
	script := `
import os, socket, sys
d, p, resp = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
os.mkdir(d, 0o755)
s = socket.socket(socket.AF_UNIX)
s.bind(p)
os.chmod(p, 0o777)
s.listen(4)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    try:
        n = int.from_bytes(c.recv(4), "big")
        got = 0
        while got < n:
            b = c.recv(n - got)
            if not b:
                break
            got += len(b)
        c.sendall(len(resp).to_bytes(4, "big") + resp)
    except OSError:
        pass  # a client that hung up on it
    c.close()
`
	forger := exec.Command("setpriv", "--reuid", attacker, "--regid", attacker, "--clear-groups", "/usr/bin/python3", "-c", script, dir, sock, hex.EncodeToString(forged))
	out, err := forger.StdoutPipe()
	require.NoError(t, err)
	forger.Stderr = os.Stderr
	require.NoError(t, forger.Start())
	t.Cleanup(func() { forger.Process.Kill(); forger.Wait() })
	buf := make([]byte, 64)
	n, _ := out.Read(buf)
	require.Contains(t, string(buf[:n]), "listening")

	asVictim := func(args ...string) (string, int) {
		argv := append([]string{"setpriv", "--reuid", victim, "--regid", victim, "--clear-groups", daemonBin}, args...)
		if _, err := os.Stat(systemSocketDir); err == nil {
			// A host running the packaged daemon: the CLI would take its
			// socket before the fallback, so the CLI runs in a mount
			// namespace of its own where an empty tmpfs hides it.
			argv = append([]string{"unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
				`mount -t tmpfs -o size=16k,mode=0755 sandbox-sidecar-test "$0" && exec "$@"`, systemSocketDir}, argv...)
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = []string{"TMPDIR=" + tmp, "PATH=/usr/bin:/bin", "HOME=/nonexistent"}
		done := make(chan struct{})
		var b []byte
		go func() { b, _ = cmd.CombinedOutput(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		return string(b), cmd.ProcessState.ExitCode()
	}
	got, code := asVictim("health")
	assert.Equal(t, 2, code, got)
	assert.NotContains(t, got, "forged", "the CLI took the forger's answer")
	assert.Contains(t, got, "refusing the daemon socket "+sock)
	assert.True(t, strings.Contains(got, "belongs to uid "+attacker), got)

	// A directory of the victim's own with the forger's server in it (the
	// forger got the name first some other way): the server's credentials
	// give it away.
	require.NoError(t, os.Chown(dir, 4343, 4343))
	got, code = asVictim("health")
	assert.Equal(t, 2, code, got)
	assert.NotContains(t, got, "forged")
	assert.Contains(t, got, "its server runs as uid "+attacker)

	// Naming the forger's uid trusts it (an operator who means it).
	got, code = asVictim("health", "--daemon-uid", attacker)
	assert.Equal(t, 0, code, got)
	assert.Contains(t, got, "forged")
}

// One uid cannot take every connection slot (three quarters of them by
// default), and a connection that says nothing is closed after the
// first-frame deadline; one that has spoken may stay idle.
func TestConnectionsPerUIDAndFirstFrameDeadline(t *testing.T) {
	if _, err := exec.LookPath("setpriv"); err != nil {
		requireHost(t)
		t.Fatal("needs setpriv (util-linux)")
	}
	d := startDaemon(t, "", "--max-connections", "8", "--socket-mode", "0666", "--allow-uid", "4242", "--first-frame-timeout", "1s")
	hello, err := msgpack.Marshal(map[string]any{"v": 1, "id": 1, "op": ipc.OpHello})
	require.NoError(t, err)
	var held []net.Conn
	for range 6 { // three quarters of 8
		conn, err := net.Dial("unix", d.socket)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		m := rawRoundTrip(t, conn, hello)
		require.Equal(t, true, m["ok"], "%v", m)
		held = append(held, conn)
	}
	conn, err := net.Dial("unix", d.socket)
	require.NoError(t, err)
	defer conn.Close()
	m := readFrame(t, conn)
	e, _ := m["error"].(map[string]any)
	assert.Equal(t, ipc.CodeBusy, e["code"], "a seventh connection of one uid: %v", m)
	assert.EqualValues(t, 6, e["max_connections_per_uid"])

	// Another uid still gets in.
	cmd := exec.Command("setpriv", "--reuid", "4242", "--regid", "4242", "--clear-groups", daemonBin, "health")
	cmd.Env = []string{"SANDBOX_SIDECAR_SOCKET=" + d.socket, "PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	assert.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "ok")

	// A silent connection is closed after the first-frame deadline.
	// Once the daemon has seen one of the six close, a connection gets the
	// freed slot (until then it is refused busy: try again).
	held[0].Close()
	var silent net.Conn
	var start time.Time
	eventually(t, 10*time.Second, "a slot freed", func() bool {
		c, err := net.Dial("unix", d.socket)
		require.NoError(t, err)
		start = time.Now()
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := ipc.ReadFrame(c, ipc.DefaultMaxFrame); err != nil {
			silent = c // no busy frame: admitted
			return true
		}
		c.Close()
		return false
	})
	defer silent.Close()
	m = readFrame(t, silent)
	e, _ = m["error"].(map[string]any)
	assert.Equal(t, ipc.CodeBadRequest, e["code"], "%v", m)
	assert.Contains(t, e["message"], "no request within 1s of connecting")
	assert.GreaterOrEqual(t, time.Since(start), 900*time.Millisecond)

	// The ones that spoke are still served after being idle for longer.
	m = rawRoundTrip(t, held[1], hello)
	assert.Equal(t, true, m["ok"], "%v", m)
}
