package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

func TestSessionOverSocket(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	hello := call(t, c, ipc.OpHello, map[string]any{"versions": []int{1}, "client": "e2e"})
	assert.EqualValues(t, 1, hello["version"])
	assert.Equal(t, "bwrap", hello["backend"])

	id := create(t, c, nil)
	script := "import json\nwith open('in.json') as f:\n    d = json.load(f)\nwith open('out.txt', 'w') as f:\n    f.write(str(sum(d['numbers'])))\nprint('done', d['numbers'])\n"
	call(t, c, ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "script.py", "data": []byte(script)})
	call(t, c, ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "/workspace/in.json", "data": []byte(`{"numbers": [1, 2, 39]}`)})
	res := run(t, c, id, "python3 script.py")
	require.Equal(t, 0, res.ExitCode, "stderr: %s", res.Stderr)
	assert.Equal(t, "done [1, 2, 39]\n", string(res.Stdout))
	got := call(t, c, ipc.OpReadFile, map[string]any{"sandbox": id, "path": "out.txt"})
	assert.Equal(t, []byte("42"), got["data"])

	// Files persist between calls, in the workspace and in /tmp.
	run(t, c, id, "echo kept > /tmp/t && mkdir -p sub && echo x > sub/f")
	res = run(t, c, id, "cat /tmp/t sub/f")
	assert.Equal(t, "kept\nx\n", string(res.Stdout))
	entries := call(t, c, ipc.OpListDirectory, map[string]any{"sandbox": id, "path": "."})["entries"].([]any)
	var names []string
	for _, e := range entries {
		m := e.(map[string]any)
		names = append(names, fmt.Sprintf("%v:%v", m["name"], m["is_dir"]))
	}
	assert.Equal(t, []string{"in.json:false", "out.txt:false", "script.py:false", "sub:true"}, names)

	// A second sandbox sees none of it.
	other := create(t, c, nil)
	res = run(t, c, other, "ls -A /workspace; cat /tmp/t 2>&1; echo rc=$?")
	assert.NotContains(t, string(res.Stdout), "script.py")
	assert.Contains(t, string(res.Stdout), "rc=1")
	e := callErr(t, c, ipc.OpReadFile, map[string]any{"sandbox": other, "path": "out.txt"})
	assert.Equal(t, ipc.CodePathNotFound, e.Code)

	// Destroy removes everything, and is idempotent.
	call(t, c, ipc.OpDestroy, map[string]any{"sandbox": id})
	call(t, c, ipc.OpDestroy, map[string]any{"sandbox": id})
	call(t, c, ipc.OpDestroy, map[string]any{"sandbox": "sc-0000000000000000"})
	assert.NotContains(t, d.workspaces(t), id)
	e = callErr(t, c, ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "true"})
	assert.Equal(t, ipc.CodeNotFound, e.Code)
}

func TestIsolationFromInside(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	id := create(t, c, nil)

	res := run(t, c, id, "ls /sys/class/net 2>/dev/null || awk 'NR>2{print $1}' /proc/net/dev")
	assert.Equal(t, "lo", strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(string(res.Stdout)), ":")), "only loopback")

	for _, p := range []string{"/root", "/home", d.socket, filepath.Dir(d.socket), d.stateDir, "/run", "/var/lib"} {
		res := run(t, c, id, "ls -A "+p+" >/dev/null 2>&1 && echo VISIBLE || echo hidden")
		assert.Equal(t, "hidden\n", string(res.Stdout), "%s must not be visible", p)
	}

	// The daemon's environment does not leak: the test daemon runs with
	// the test's environment, so look for variables it certainly has.
	res = run(t, c, id, "env")
	env := string(res.Stdout)
	for _, name := range []string{"SANDBOX_SIDECAR_SOCKET", "HOSTNAME=", "GOPATH", "GOROOT", "SSH_", "USER="} {
		assert.NotContains(t, env, name)
	}
	assert.Contains(t, env, "HOME=/workspace")

	// No capabilities, not host root, its own PID namespace.
	res = run(t, c, id, "grep CapEff /proc/self/status; id -u; ls /proc | grep -c '^[0-9]'")
	lines := strings.Fields(string(res.Stdout))
	require.Len(t, lines, 4, string(res.Stdout))
	assert.Equal(t, "0000000000000000", lines[1])
	assert.NotEqual(t, "0", lines[2])
	n, _ := strconv.Atoi(lines[3])
	assert.Less(t, n, 10, "the sandbox sees only its own processes")
}

func TestSpecEnvAndRefusals(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	id := create(t, c, map[string]any{"spec": map[string]any{"env": map[string]any{"GREETING": "hi"}, "block_network": true}})
	res := run(t, c, id, `echo "$GREETING $EXTRA"`, "env", map[string]any{"EXTRA": "there"})
	assert.Equal(t, "hi there\n", string(res.Stdout))

	for name, spec := range map[string]map[string]any{
		"egress hosts":  {"allow_egress_to": []string{"pypi.org"}},
		"egress cidrs":  {"allow_egress_to_cidrs": []string{"10.0.0.0/8"}},
		"network asked": {"block_network": false},
	} {
		e := callErr(t, c, ipc.OpCreate, map[string]any{"spec": spec})
		assert.Equal(t, ipc.CodeSpecUnenforceable, e.Code, name)
	}
	assert.Len(t, d.workspaces(t), 1, "refused specs made nothing")
}

func TestOutputFloodStaysBounded(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	id := create(t, c, nil)
	before := peakRSS(t, d.cmd.Process.Pid)
	start := time.Now()
	res := run(t, c, id, "head -c 209715200 /dev/zero | tr '\\0' 'a'; echo; echo THE-END", "max_output_bytes", 65536, "timeout_s", 120)
	elapsed := time.Since(start)
	after := peakRSS(t, d.cmd.Process.Pid)
	require.Equal(t, 0, res.ExitCode)
	assert.True(t, res.StdoutTruncated)
	assert.False(t, res.StderrTruncated)
	assert.LessOrEqual(t, len(res.Stdout), 65536)
	assert.True(t, strings.HasSuffix(string(res.Stdout), "THE-END\n"), "the tail is kept")
	growth := after - before
	t.Logf("200 MiB through a 64 KiB cap: %s, daemon peak RSS %d KiB -> %d KiB (+%d KiB)", elapsed, before, after, growth)
	assert.Less(t, growth, int64(64<<10), "daemon memory must stay bounded (KiB)")
}

// peakRSS reads VmHWM (KiB) of pid.
func peakRSS(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			n, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			return n
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

func TestTimeouts(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	id := create(t, c, nil)

	start := time.Now()
	res := run(t, c, id, "sleep 60", "timeout_s", 1)
	took := time.Since(start)
	assert.True(t, res.TimedOut)
	assert.InDelta(t, 1.0, res.AppliedTimeoutS, 0.001)
	assert.GreaterOrEqual(t, took, time.Second)
	assert.Less(t, took, 4*time.Second, "sleep 60 with timeout 1 returns in ~1-3 s")

	start = time.Now()
	res = run(t, c, id, "trap '' TERM; while :; do sleep 0.1; done", "timeout_s", 1)
	took = time.Since(start)
	assert.True(t, res.TimedOut, "a command ignoring SIGTERM is still stopped")
	assert.Less(t, took, 8*time.Second)

	// Sub-second timeouts are honoured, never "no timeout".
	res = run(t, c, id, "sleep 5", "timeout_s", 0.2)
	assert.True(t, res.TimedOut)

	// A backgrounded grandchild does not hold the call.
	sleep := "sleep " + sleepToken()
	start = time.Now()
	res = run(t, c, id, sleep+" & echo started", "timeout_s", 30)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.False(t, res.TimedOut)
	assert.Equal(t, "started\n", string(res.Stdout))
	call(t, c, ipc.OpDestroy, map[string]any{"sandbox": id})
	eventually(t, 5*time.Second, "every backgrounded sleep gone", func() bool { return len(processesMatching(sleep)) == 0 })
}

// rawCall sends one frame body on a raw connection and reads one response.
func rawRoundTrip(t *testing.T, conn net.Conn, body []byte) map[string]any {
	t.Helper()
	require.NoError(t, ipc.WriteFrame(conn, body, 1<<30))
	return readFrame(t, conn)
}

func readFrame(t *testing.T, conn net.Conn) map[string]any {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := ipc.ReadFrame(conn, ipc.DefaultMaxFrame)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, msgpack.Unmarshal(b, &m))
	return m
}

func codeOf(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func req(t *testing.T, id int, op string, args map[string]any) []byte {
	b, err := msgpack.Marshal(map[string]any{"v": 1, "id": id, "op": op, "args": args})
	require.NoError(t, err)
	return b
}

func TestBadInputOverRawSocket(t *testing.T) {
	d := startDaemon(t, "", "--max-frame-bytes", "1048576", "--max-file-bytes", "65536", "--max-output-bytes", "65536")
	c := d.client(t)
	id := create(t, c, nil)
	// Symlinks planted by the guest pointing out of its storage: reads
	// resolve them inside the sandbox (whose /etc has no shadow file, and
	// never the host's), writes refuse them.
	run(t, c, id, "ln -s /etc etclink && ln -s /etc/shadow pw && mkdir d")

	conn, err := net.Dial("unix", d.socket)
	require.NoError(t, err)
	defer conn.Close()

	// Frame-level garbage that keeps the stream in step.
	_, err = conn.Write([]byte{0, 0, 0, 0})
	require.NoError(t, err)
	assert.Equal(t, ipc.CodeBadRequest, codeOf(readFrame(t, conn)))
	arr, _ := msgpack.Marshal([]any{"v", 1})
	assert.Equal(t, ipc.CodeBadRequest, codeOf(rawRoundTrip(t, conn, arr)))
	assert.Equal(t, ipc.CodeBadRequest, codeOf(rawRoundTrip(t, conn, []byte("\xc1\xc1 definitely not msgpack"))))

	cases := []struct {
		name string
		op   string
		args map[string]any
		code string
	}{
		{"unknown op", "frobnicate", nil, ipc.CodeUnknownOp},
		{"missing sandbox", ipc.OpRunCommand, map[string]any{"command": "true"}, ipc.CodeBadRequest},
		{"mistyped sandbox", ipc.OpRunCommand, map[string]any{"sandbox": 7, "command": "true"}, ipc.CodeBadRequest},
		{"missing command", ipc.OpRunCommand, map[string]any{"sandbox": id}, ipc.CodeBadRequest},
		{"both command and argv", ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "true", "argv": []string{"true"}}, ipc.CodeBadRequest},
		{"unknown argument", ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "true", "timout_s": 1}, ipc.CodeBadRequest},
		{"negative timeout", ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "true", "timeout_s": -1}, ipc.CodeBadRequest},
		{"zero timeout", ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "true", "timeout_s": 0}, ipc.CodeBadRequest},
		{"NaN timeout", ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "true", "timeout_s": math.NaN()}, ipc.CodeBadRequest},
		{"inf timeout", ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "true", "timeout_s": math.Inf(1)}, ipc.CodeBadRequest},
		{"string timeout", ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "true", "timeout_s": "1"}, ipc.CodeBadRequest},
		{"negative max output", ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "true", "max_output_bytes": -5}, ipc.CodeBadRequest},
		{"relative cwd", ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "true", "cwd": "rel"}, ipc.CodeBadRequest},
		{"bad env name", ipc.OpRunCommand, map[string]any{"sandbox": id, "command": "true", "env": map[string]any{"A=B": "x"}}, ipc.CodeBadRequest},
		{"unknown sandbox", ipc.OpRunCommand, map[string]any{"sandbox": "sc-ffffffffffffffff", "command": "true"}, ipc.CodeNotFound},
		{"hostile sandbox id", ipc.OpReadFile, map[string]any{"sandbox": "../../etc", "path": "passwd"}, ipc.CodeNotFound},
		{"traversal", ipc.OpReadFile, map[string]any{"sandbox": id, "path": "../../etc/shadow"}, ipc.CodePathNotFound},
		{"absolute outside", ipc.OpReadFile, map[string]any{"sandbox": id, "path": "/etc/shadow"}, ipc.CodePathNotFound},
		{"workspace dotdot", ipc.OpReadFile, map[string]any{"sandbox": id, "path": "/workspace/../etc/shadow"}, ipc.CodePathNotFound},
		{"symlink to a host file", ipc.OpReadFile, map[string]any{"sandbox": id, "path": "pw"}, ipc.CodePathNotFound},
		{"through symlinked dir", ipc.OpReadFile, map[string]any{"sandbox": id, "path": "etclink/shadow"}, ipc.CodePathNotFound},
		{"the sandbox's own file outside", ipc.OpReadFile, map[string]any{"sandbox": id, "path": "etclink/passwd"}, ""},
		{"write through symlinked dir", ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "etclink/evil", "data": []byte("x")}, ipc.CodeBadPath},
		{"write outside", ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "/etc/evil", "data": []byte("x")}, ipc.CodeBadPath},
		{"list through symlink", ipc.OpListDirectory, map[string]any{"sandbox": id, "path": "etclink"}, ""},
		{"NUL in path", ipc.OpReadFile, map[string]any{"sandbox": id, "path": "a\x00b"}, ipc.CodeBadPath},
		{"read a directory", ipc.OpReadFile, map[string]any{"sandbox": id, "path": "d"}, ipc.CodeIsDirectory},
		{"missing file", ipc.OpReadFile, map[string]any{"sandbox": id, "path": "nope"}, ipc.CodePathNotFound},
		{"bad mode", ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "m", "data": []byte("x"), "mode": 0o4755}, ipc.CodeBadRequest},
		{"spec not a map", ipc.OpCreate, map[string]any{"spec": "no"}, ipc.CodeBadRequest},
		{"unknown spec field", ipc.OpCreate, map[string]any{"spec": map[string]any{"blok_network": true}}, ipc.CodeBadRequest},
		{"negative ttl", ipc.OpCreate, map[string]any{"ttl_s": -3}, ipc.CodeBadRequest},
	}
	for i, tc := range cases {
		m := rawRoundTrip(t, conn, req(t, 100+i, tc.op, tc.args))
		assert.EqualValues(t, 100+i, m["id"], tc.name)
		assert.Equal(t, tc.code, codeOf(m), "%s: %v", tc.name, m["error"])
	}
	_, err = os.Stat("/etc/evil")
	assert.True(t, os.IsNotExist(err), "nothing was written outside the sandbox")

	// A file too large is refused with its real size.
	call(t, c, ipc.OpWriteFile, map[string]any{"sandbox": id, "path": "big", "data": make([]byte, 5000)})
	m := rawRoundTrip(t, conn, req(t, 999, ipc.OpReadFile, map[string]any{"sandbox": id, "path": "big", "max_bytes": 100}))
	assert.Equal(t, ipc.CodeFileTooLarge, codeOf(m))
	assert.EqualValues(t, 5000, m["error"].(map[string]any)["size_bytes"])

	// A truncated frame: the daemon answers bad_request and closes.
	tconn, err := net.Dial("unix", d.socket)
	require.NoError(t, err)
	_, err = tconn.Write(append(binary.BigEndian.AppendUint32(nil, 50), "short"...))
	require.NoError(t, err)
	tconn.(*net.UnixConn).CloseWrite()
	assert.Equal(t, ipc.CodeBadRequest, codeOf(readFrame(t, tconn)))
	tconn.Close()

	// An oversize length: frame_too_large, and that connection closes.
	_, err = conn.Write(binary.BigEndian.AppendUint32(nil, 2<<20))
	require.NoError(t, err)
	assert.Equal(t, ipc.CodeFrameTooLarge, codeOf(readFrame(t, conn)))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = ipc.ReadFrame(conn, ipc.DefaultMaxFrame)
	assert.Error(t, err)

	// Through all of that the daemon kept serving everyone else.
	assert.Equal(t, "ok\n", string(run(t, c, id, "echo ok").Stdout))
	assert.True(t, d.proc.Running())
}

func TestPeerCredentials(t *testing.T) {
	if _, err := exec.LookPath("setpriv"); err != nil {
		requireHost(t)
		if os.Getenv("CI") == "true" {
			t.Fatal("needs setpriv (util-linux), and CI=true forbids skipping")
		}
		t.Skip("needs setpriv (util-linux)")
	}
	base := baseDir(t)
	// Mode 0666 lets any uid reach the socket, so the daemon's own
	// SO_PEERCRED policy is what refuses or admits.
	d := startDaemon(t, base, "--socket-mode", "0666", "--allow-uid", "4242,4343")

	asUID := func(uid int, args ...string) (string, int) {
		cmd := exec.Command("setpriv", append([]string{"--reuid", strconv.Itoa(uid), "--regid", strconv.Itoa(uid), "--clear-groups", daemonBin}, args...)...)
		cmd.Env = []string{"SANDBOX_SIDECAR_SOCKET=" + d.socket, "PATH=/usr/bin:/bin"}
		out, _ := cmd.CombinedOutput()
		return string(out), cmd.ProcessState.ExitCode()
	}

	out, code := asUID(65534, "health")
	assert.Equal(t, 2, code, out)
	assert.Contains(t, out, "unauthorized")
	// Told it is not allowed, never who is: the policy stays in the log.
	assert.NotContains(t, out, "4242", "the refused peer was told the policy")
	assert.NotContains(t, out, "allowed uids")
	eventually(t, 5*time.Second, "the refusal logged with its reason", func() bool {
		return strings.Contains(d.Logs(), "connection refused") && strings.Contains(d.Logs(), "allowed uids [4242 4343]")
	})

	out, code = asUID(4242, "create", "--ttl", "5m")
	require.Equal(t, 0, code, out)
	id := strings.TrimSpace(out)
	out, code = asUID(4242, "exec", "--sandbox", id, "--", "echo", "mine")
	assert.Equal(t, 0, code, out)
	assert.Contains(t, out, "mine")

	// Another allowed uid cannot see, use or destroy it.
	out, code = asUID(4343, "exec", "--sandbox", id, "--", "true")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, out, "not_found")
	out, _ = asUID(4343, "ls", "--json")
	assert.NotContains(t, out, id)
	asUID(4343, "rm", id)
	out, _ = asUID(4242, "ls", "--json")
	assert.Contains(t, out, id, "a foreign rm is a silent no-op")

	// Root is an admin: sees and may destroy it.
	c := d.client(t)
	var listed api.ListResult
	require.NoError(t, c.Call(context.Background(), ipc.OpList, nil, &listed))
	require.Len(t, listed.Sandboxes, 1)
	assert.EqualValues(t, 4242, listed.Sandboxes[0].UID)
	call(t, c, ipc.OpDestroy, map[string]any{"sandbox": id})
	assert.Empty(t, d.workspaces(t))
}

func TestCLI(t *testing.T) {
	d := startDaemon(t, "")
	out, _, code := d.cli(t, "health")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "ok")
	out, _, code = d.cli(t, "health", "--json")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, `"status": "ok"`)
	_, _, code = d.cli(t, "health", "--socket", filepath.Join(d.base, "nope.sock"))
	assert.Equal(t, 2, code, "unreachable is exit 2")

	out, _, code = d.cli(t, "exec", "--", "sh", "-c", "echo from-throwaway; exit 3")
	assert.Equal(t, 3, code)
	assert.Equal(t, "from-throwaway\n", out)
	eventually(t, 5*time.Second, "the throwaway sandbox destroyed", func() bool { return len(d.workspaces(t)) == 0 })

	out, _, code = d.cli(t, "create", "--ttl", "10m", "--owner", "etl/run_1")
	require.Equal(t, 0, code)
	id := strings.TrimSpace(out)
	out, _, _ = d.cli(t, "ls")
	assert.Contains(t, out, "RUN etl/run_1")
	assert.Contains(t, out, id)
	_, _, code = d.cli(t, "exec", "--sandbox", id, "--sh", "sleep 5", "--command-timeout", "500ms")
	assert.Equal(t, 124, code)
	out, _, code = d.cli(t, "rm", id)
	assert.Equal(t, 0, code)
	assert.Equal(t, id+"\n", out)
	// The spec's allow-lists from the command line reach the daemon, which
	// (no [egress] here) refuses them by name.
	_, errOut, code := d.cli(t, "create", "--allow-egress-to", "pypi.org", "--allow-egress-to-cidr", "10.1.0.0/16")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errOut, "spec_unenforceable")
	assert.Contains(t, errOut, "egress filtering is not enabled")

	for _, sub := range []string{"serve", "health", "ls", "exec", "rm", "version", "create", "gc"} {
		_, errOut, code := d.cli(t, sub, "--help")
		assert.Equal(t, 0, code, sub)
		assert.Contains(t, errOut, "Usage: sandbox-sidecar "+sub, sub)
	}
	out, _, code = d.cli(t, "version")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "sandbox-sidecar ")
}

func TestShutdownDestroysConnectionBound(t *testing.T) {
	d := startDaemon(t, "")
	c := d.client(t)
	bound := create(t, c, nil)
	kept := create(t, c, map[string]any{"ttl_s": 600})
	// A command in flight when SIGTERM arrives finishes.
	done := make(chan execResult, 1)
	sleep := fmt.Sprintf("sleep 1.%06d", time.Now().Nanosecond()/1000)
	go func() {
		var res execResult
		c.Call(context.Background(), ipc.OpRunCommand, map[string]any{"sandbox": bound, "command": sleep + "; echo finished", "timeout_s": 30}, &res)
		done <- res
	}()
	eventually(t, 10*time.Second, "the command running", func() bool { return len(processesMatching(sleep)) > 0 })
	d.stop() // asserts exit 0
	res := <-done
	assert.Equal(t, "finished\n", string(res.Stdout))
	ws := d.workspaces(t)
	assert.NotContains(t, ws, bound, "connection-bound sandboxes die with the daemon")
	assert.Contains(t, ws, kept, "expiring sandboxes are kept for the next start")
	d.restart()
	out, _, _ := d.cli(t, "ls", "--json")
	assert.Contains(t, out, kept)
}

func TestStartRefusals(t *testing.T) {
	d := startDaemon(t, "")
	// A second daemon on the same state directory is refused.
	cmd := exec.Command(daemonBin, "serve", "--config", "/dev/null", "--socket", filepath.Join(d.base, "run2", "s.sock"), "--state-dir", d.stateDir)
	out, err := cmd.CombinedOutput()
	assert.Error(t, err)
	assert.Contains(t, string(out), "already uses state directory")
	// A second daemon on the same socket (another state dir) is refused
	// and the first one's socket is left alone.
	cmd = exec.Command(daemonBin, "serve", "--config", "/dev/null", "--socket", d.socket, "--state-dir", filepath.Join(d.base, "state2"))
	out, err = cmd.CombinedOutput()
	assert.Error(t, err)
	assert.Contains(t, string(out), "another daemon is serving")
	_, _, code := d.cli(t, "health")
	assert.Equal(t, 0, code)
}
