package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

const testToken = "sk0badf00d"

func testSpec(kind string, lines, code, timeoutS int) procSpec {
	s := procSpec{Kind: kind, Lines: lines, Code: code, TimeoutS: timeoutS}
	s.Name = newSpecName(kind, lines, code, timeoutS, testToken, 3, 4242, 17)
	return s
}

func TestSpecNamesRoundTrip(t *testing.T) {
	for _, s := range []procSpec{testSpec(kindFinite, 120, 3, 0), testSpec(kindFlood, 5000, 0, 0), testSpec(kindInfinite, 0, 0, 7)} {
		got, ok := parseSpec(s.Name, testToken)
		require.True(t, ok, s.Name)
		assert.Equal(t, s, got)
		assert.LessOrEqual(t, len(s.Name), 128, "a process name's bound")
	}
	for _, bad := range []string{"", "fin.1.2.3", "fin.1.2.3.other-1-2-3", "nope.1.2.3." + testToken + "-1", "fin.x.2.3." + testToken + "-1"} {
		_, ok := parseSpec(bad, testToken)
		assert.False(t, ok, bad)
	}
}

// The shell loops write exactly the stream the checks expect, and exit
// as their names say.
func TestCommandsWriteTheirStream(t *testing.T) {
	for _, s := range []procSpec{testSpec(kindFinite, 45, 3, 0), testSpec(kindFlood, 2500, 0, 0)} {
		var out bytes.Buffer
		cmd := exec.Command("/bin/sh", "-c", s.command())
		cmd.Stdout = &out
		err := cmd.Run()
		var ee *exec.ExitError
		if s.Code != 0 {
			require.True(t, errors.As(err, &ee), "%s: %v", s.Name, err)
			assert.Equal(t, s.Code, ee.ExitCode())
		} else {
			require.NoError(t, err)
		}
		assert.EqualValues(t, s.streamBytes(), out.Len(), s.Name)
		assert.EqualValues(t, -1, s.badByte(0, out.Bytes()))
		// Any piece of it, from any offset, checks.
		b := out.Bytes()
		assert.EqualValues(t, -1, s.badByte(1000, b[1000:1500]))
		// A byte changed, one missing, or a piece at the wrong offset shows.
		c := bytes.Clone(b)
		c[777] ^= 1
		assert.EqualValues(t, 777, s.badByte(0, c))
		assert.NotEqualValues(t, -1, s.badByte(500, append(bytes.Clone(b[500:600]), b[601:700]...)))
		assert.NotEqualValues(t, -1, s.badByte(501, b[500:600]))
	}
}

func TestJudgeEnd(t *testing.T) {
	fin, inf := testSpec(kindFinite, 100, 3, 0), testSpec(kindInfinite, 0, 0, 5)
	code := func(c int) *int { return &c }
	ended := func(reason string, c int) api.ProcessInfo {
		return api.ProcessInfo{Reason: reason, ExitCode: code(c)}
	}
	term, kill := map[int]bool{15: true}, map[int]bool{9: true}
	for _, c := range []struct {
		name                 string
		s                    procSpec
		p                    api.ProcessInfo
		sent                 map[int]bool
		overdue, survival    bool
		violation, tolerated bool
	}{
		{"finite exited with its code", fin, ended("exited", 3), nil, false, true, false, false},
		{"finite exited with another code", fin, ended("exited", 0), nil, false, true, true, false},
		{"running, not yet due", fin, api.ProcessInfo{Running: true}, nil, false, true, false, false},
		{"running past its end, survival", fin, api.ProcessInfo{Running: true}, nil, true, true, true, false},
		{"running past its end, no survival", fin, api.ProcessInfo{Running: true}, nil, true, false, false, true},
		{"ended without a code", fin, api.ProcessInfo{Reason: "exited"}, nil, false, false, true, false},
		{"sandbox_terminated, survival", fin, ended("sandbox_terminated", 137), nil, false, true, true, false},
		{"sandbox_terminated, no survival", inf, ended("sandbox_terminated", 137), nil, false, false, false, true},
		{"sandbox_terminated with another code", inf, ended("sandbox_terminated", 1), nil, false, false, true, false},
		{"endless loop exited", inf, ended("exited", 0), nil, false, false, true, false},
		{"killed by the signal sent", inf, ended("killed", 143), term, false, true, false, false},
		{"killed by a signal not sent", inf, ended("killed", 130), term, false, false, true, false},
		{"KILL sent", inf, ended("killed", 137), kill, false, true, false, false},
		{"SIGKILL not sent, survival", inf, ended("killed", 137), term, false, true, true, false},
		{"SIGKILL not sent, no survival", inf, ended("killed", 137), nil, false, false, false, true},
		{"timed out on TERM", inf, ended("timed_out", 143), nil, false, true, false, false},
		{"timed out on KILL", inf, ended("timed_out", 137), nil, false, true, false, false},
		{"timed out with an odd code", inf, ended("timed_out", 124), nil, false, true, true, false},
		{"finite timed out", fin, ended("timed_out", 143), nil, false, true, true, false},
		{"oom", fin, ended("oom_killed", 137), nil, false, true, true, false},
		{"unknown reason", fin, ended("vanished", 1), nil, false, false, true, false},
	} {
		v, tol := judgeEnd(c.s, c.p, c.sent, c.overdue, c.survival, true)
		assert.Equal(t, c.violation, v != "", "%s: violation %q", c.name, v)
		assert.Equal(t, c.tolerated, tol != "", "%s: tolerated %q", c.name, tol)
	}
}

// A start the daemon never answered may have been given up: killed (137),
// no end time, no output. Answered, or with output, it is a loss.
func TestJudgeEndOfAStartCutByADaemonKill(t *testing.T) {
	fin := testSpec(kindFinite, 100, 3, 0)
	code, at := 137, 1.5
	givenUp := api.ProcessInfo{Reason: "killed", ExitCode: &code}
	v, tol := judgeEnd(fin, givenUp, nil, false, true, false)
	assert.Empty(t, v)
	assert.NotEmpty(t, tol)
	v, _ = judgeEnd(fin, givenUp, nil, false, true, true)
	assert.NotEmpty(t, v, "an answered start")
	wrote := givenUp
	wrote.StdoutBytes = fin.lineLen()
	v, _ = judgeEnd(fin, wrote, nil, false, true, false)
	assert.NotEmpty(t, v, "it ran")
	timed := givenUp
	timed.EndedAt = &at
	v, _ = judgeEnd(fin, timed, nil, false, true, false)
	assert.NotEmpty(t, v, "its end has a time: something killed it")
}

func TestJudgeBytes(t *testing.T) {
	fin, inf := testSpec(kindFinite, 100, 3, 0), testSpec(kindInfinite, 0, 0, 5)
	l := fin.lineLen()
	code := 3
	assert.Empty(t, judgeBytes(fin, api.ProcessInfo{Reason: "exited", ExitCode: &code, StdoutBytes: 100 * l}))
	assert.NotEmpty(t, judgeBytes(fin, api.ProcessInfo{Reason: "exited", ExitCode: &code, StdoutBytes: 99 * l}), "an exit before its last line")
	assert.NotEmpty(t, judgeBytes(fin, api.ProcessInfo{Running: true, StdoutBytes: 101 * l}), "more than it writes")
	assert.Empty(t, judgeBytes(fin, api.ProcessInfo{Running: true, StdoutBytes: 40 * l}))
	assert.NotEmpty(t, judgeBytes(inf, api.ProcessInfo{Reason: "killed", StdoutBytes: 4*inf.lineLen() + 3}), "half a line")
	assert.Empty(t, judgeBytes(inf, api.ProcessInfo{Reason: "sandbox_terminated", StdoutBytes: 4*inf.lineLen() + 3}), "the keeper died mid-write")
	assert.NotEmpty(t, judgeBytes(inf, api.ProcessInfo{Running: true, StderrBytes: 12}), "stderr")
}

func TestJudgeRead(t *testing.T) {
	s := testSpec(kindFlood, 5000, 0, 0)
	out, err := exec.Command("/bin/sh", "-c", s.command()).Output()
	require.NoError(t, err)
	written := int64(len(out))
	require.Greater(t, written, int64(procLogBytes))
	oldest := written - procLogBytes
	read := func(asked, at, n int64) api.ReadOutputResult {
		return api.ReadOutputResult{Data: out[at : at+n], Offset: at, Dropped: at - asked, NextOffset: at + n}
	}
	assert.Empty(t, judgeRead(s, 0, read(0, oldest, 1000), written), "the bytes past the ring are dropped")
	assert.Empty(t, judgeRead(s, oldest+5, read(oldest+5, oldest+5, 1000), written))
	assert.NotEmpty(t, judgeRead(s, 0, read(0, oldest+10, 1000), written), "bytes the ring keeps were dropped")
	r := read(100, oldest, 1000)
	r.Dropped--
	assert.NotEmpty(t, judgeRead(s, 100, r, written), "offset and dropped disagree")
	r = read(0, oldest, 1000)
	r.NextOffset++
	assert.NotEmpty(t, judgeRead(s, 0, r, written), "next_offset past the data")
	r = read(0, oldest, 1000)
	r.Data = bytes.Clone(r.Data)
	r.Data[10] = '#'
	assert.NotEmpty(t, judgeRead(s, 0, r, written), "a byte not the process's")
	assert.NotEmpty(t, judgeRead(testSpec(kindFinite, 10, 0, 0), 0, api.ReadOutputResult{Offset: 5, Dropped: 5, NextOffset: 5}, 10*testSpec(kindFinite, 10, 0, 0).lineLen()), "a stream smaller than the ring drops nothing")
}

func TestProcFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "procs-0")
	require.NoError(t, os.WriteFile(path, []byte("intent a\nstarted a p-1\nintent b\nsignal p-1 TERM\nsignal p-1 KILL\nstarted c p-3\nbroken line here too\n"), 0o644))
	pf, err := readProcFile(path)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b"}, pf.intents)
	assert.Equal(t, []string{"a", "c"}, pf.order)
	assert.Equal(t, map[string]string{"a": "p-1", "c": "p-3"}, pf.started)
	assert.Equal(t, map[int]bool{15: true, 9: true}, pf.sentTo("p-1"))
	assert.Empty(t, pf.sentTo("p-3"))
	pf, err = readProcFile(filepath.Join(t.TempDir(), "none"))
	require.NoError(t, err)
	assert.Empty(t, pf.order)
}
