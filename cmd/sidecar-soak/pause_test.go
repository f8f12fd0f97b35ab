package main

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

func TestJudgePause(t *testing.T) {
	paused := api.PauseResult{Sandbox: "sc-1", State: statePaused, PausedAt: 1.7e9}
	released := api.PauseResult{Sandbox: "sc-1", State: statePaused, PausedAt: 1.7e9, MemoryReleased: true}
	ready := api.PauseResult{Sandbox: "sc-1", State: stateReady}
	for _, c := range []struct {
		name     string
		op       string
		res      api.PauseResult
		err      error
		ok       bool
		releases bool // gVisor
	}{
		{"a pause", ipc.OpPause, paused, nil, true, false},
		{"a resume", ipc.OpResume, ready, nil, true, false},
		{"a pause while a command runs", ipc.OpPause, api.PauseResult{}, ipc.Errorf(ipc.CodeBusy, "runs a command"), true, false},
		{"the daemon stopping", ipc.OpResume, api.PauseResult{}, ipc.Errorf(ipc.CodeShuttingDown, "stopping"), true, false},
		{"a pause answering ready", ipc.OpPause, ready, nil, false, false},
		{"a pause without paused_at", ipc.OpPause, api.PauseResult{State: statePaused}, nil, false, false},
		{"a resume answering paused", ipc.OpResume, paused, nil, false, false},
		{"a resume with paused_at", ipc.OpResume, api.PauseResult{State: stateReady, PausedAt: 1}, nil, false, false},
		{"memory released on bwrap", ipc.OpPause, api.PauseResult{State: statePaused, PausedAt: 1, MemoryReleased: true}, nil, false, false},
		{"a busy resume", ipc.OpResume, api.PauseResult{}, ipc.Errorf(ipc.CodeBusy, "paused again"), false, false},
		{"not supported", ipc.OpPause, api.PauseResult{}, ipc.Errorf(ipc.CodeNotSupported, "no freezer"), false, false},
		{"internal", ipc.OpResume, api.PauseResult{}, ipc.Errorf(ipc.CodeInternal, "bug"), false, false},
		{"a freeze that failed", ipc.OpPause, api.PauseResult{}, ipc.Errorf(ipc.CodeBackendUnavail, "not every process stopped"), false, false},
		{"a pause on gVisor", ipc.OpPause, released, nil, true, true},
		{"a pause on gVisor that kept the memory", ipc.OpPause, paused, nil, false, true},
		{"a resume on gVisor", ipc.OpResume, ready, nil, true, true},
		{"a resume on gVisor answering memory released", ipc.OpResume, api.PauseResult{State: stateReady, MemoryReleased: true}, nil, false, true},
	} {
		why := judgePause(c.op, c.err == nil, c.res, c.err, c.releases)
		if c.ok {
			assert.Empty(t, why, c.name)
		} else {
			assert.NotEmpty(t, why, c.name)
		}
	}
}

// A call the daemon died in has no outcome: nothing to judge.
func TestJudgePauseWithoutAnAnswer(t *testing.T) {
	assert.Empty(t, judgePause(ipc.OpPause, false, api.PauseResult{}, nil, false))
	assert.Empty(t, judgePause(ipc.OpResume, false, api.PauseResult{}, errors.New("connection reset"), true))
	assert.NotEmpty(t, judgePause(ipc.OpPause, true, api.PauseResult{}, nil, false), "an answer without a state")
}

func TestPauseTallyReadsTheAgentsRecords(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(pausesPath(dir, 0), []byte("pause\nlisted\nresume\npause\nbusy\n"), 0o644))
	require.NoError(t, os.WriteFile(pausesPath(dir, 1), []byte("pause\nlisted\n"), 0o644))
	var tally pauseTally
	for i := range 3 { // agent 2 never paused: no file
		require.NoError(t, tally.read(pausesPath(dir, i)))
	}
	assert.Equal(t, pauseTally{pauses: 3, listed: 2, busy: 1, resumes: 1}, tally)
	assert.Equal(t, filepath.Join(dir, "pauses-1"), pausesPath(dir, 1))
}
