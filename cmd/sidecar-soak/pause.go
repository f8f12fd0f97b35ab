package main

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// Pauses in the soak. An agent pauses its owned sandbox now and then,
// looks at the list, waits a moment and resumes it: by resume, or by its
// next use of the sandbox (any use resumes). Its processes then go on
// where they were, which the soak's process checks hold them to as
// always. A pause of a sandbox that runs a command (a client that went
// away mid-command leaves one) is refused as busy.

// Sandbox states pause and resume answer, and list shows.
const (
	statePaused = "paused"
	stateReady  = "ready"
)

// pauseMaxWait bounds how long an agent leaves its sandbox paused before
// its next step (which may resume it, or not: then a later one does).
const pauseMaxWait = 300 * time.Millisecond

// pausesPath is agent i's record of its pauses and resumes.
func pausesPath(work string, i int) string { return filepath.Join(work, fmt.Sprintf("pauses-%d", i)) }

// judgePause decides whether a pause's or a resume's outcome holds (ok:
// the daemon answered it; a call the daemon died in, or was stopped for,
// has no outcome to judge): an answer in the state asked for (a pause's with when it began), or an
// error the contract allows at any moment of a soak. busy is a pause's
// answer to a sandbox that runs a command; a resume is never busy but
// when the sandbox was paused again each time (not here: one agent per
// sandbox). not_supported, bad_request, internal and unknown_op never
// are: the soak's daemon offers pause.
//
// releases says the backend gives a paused sandbox's memory back (gVisor):
// a pause must then answer memory_released, and on bwrap never.
func judgePause(op string, ok bool, res api.PauseResult, err error, releases bool) string {
	var e *ipc.Error
	if errors.As(err, &e) {
		switch e.Code {
		case ipc.CodeBusy:
			if op == ipc.OpPause {
				return ""
			}
		case ipc.CodeShuttingDown, ipc.CodeNotFound:
			// The daemon stopping; not_found is the owned check's.
			return ""
		}
		return fmt.Sprintf("%s: %v", op, err)
	}
	if !ok || err != nil {
		return ""
	}
	want := stateReady
	if op == ipc.OpPause {
		want = statePaused
	}
	switch {
	case res.State != want:
		return fmt.Sprintf("%s answered state %q, not %q", op, res.State, want)
	case op == ipc.OpPause && res.PausedAt <= 0:
		return "pause answered no paused_at"
	case op == ipc.OpResume && res.PausedAt != 0:
		return fmt.Sprintf("resume answered paused_at %v for a running sandbox", res.PausedAt)
	case op == ipc.OpPause && res.MemoryReleased != releases:
		return fmt.Sprintf("pause answered memory_released %v; the backend gives a paused sandbox's memory back: %v", res.MemoryReleased, releases)
	case op == ipc.OpResume && res.MemoryReleased:
		return "resume answered memory_released for a running sandbox"
	}
	return ""
}

// pauseStep pauses the owned sandbox, checks how the list shows it, and
// resumes it after a moment, or leaves that to the next use.
func (a *agent) pauseStep() {
	var res api.PauseResult
	ok, err := a.call(ipc.OpPause, api.SandboxRequest{Sandbox: a.sandbox}, &res)
	a.owned("pause", err)
	if why := judgePause(ipc.OpPause, ok, res, err, a.releases); why != "" {
		a.violation("sandbox %s: %s", a.sandbox, why)
	}
	switch {
	case ipc.IsCode(err, ipc.CodeBusy):
		a.recordPause("busy")
		return
	case !ok:
		return
	}
	a.recordPause("pause")
	// Listed as paused, unless a request of a client that went away,
	// still on its way in the daemon, resumed it meanwhile.
	var l api.ListResult
	if ok, _ := a.call(ipc.OpList, nil, &l); ok {
		for _, s := range l.Sandboxes {
			switch {
			case s.Sandbox != a.sandbox:
			case s.State == statePaused:
				a.recordPause("listed")
			case s.State != stateReady:
				a.violation("sandbox %s, just paused, is listed %q", a.sandbox, s.State)
			}
		}
	}
	time.Sleep(time.Duration(rand.Int64N(int64(pauseMaxWait))))
	if rand.IntN(2) == 0 {
		return // the next use resumes it
	}
	var back api.PauseResult
	ok, err = a.call(ipc.OpResume, api.SandboxRequest{Sandbox: a.sandbox}, &back)
	a.owned("resume", err)
	if why := judgePause(ipc.OpResume, ok, back, err, a.releases); why != "" {
		a.violation("sandbox %s: %s", a.sandbox, why)
	}
	if ok {
		a.recordPause("resume")
	}
}

func (a *agent) recordPause(what string) { fmt.Fprintln(a.pauses, what) }

// pauseTally counts the agents' pauses, for the summary.
type pauseTally struct {
	pauses, busy, listed, resumes, atEnd int
}

func (t pauseTally) String() string {
	return fmt.Sprintf("%d pauses (%d listed paused; %d refused busy), %d resumed by resume, the others by their next use; %d paused at the end, resumed",
		t.pauses, t.listed, t.busy, t.resumes, t.atEnd)
}

// read adds an agent's record (its file, path) to t.
func (t *pauseTally) read(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		switch strings.TrimSpace(sc.Text()) {
		case "pause":
			t.pauses++
		case "busy":
			t.busy++
		case "listed":
			t.listed++
		case "resume":
			t.resumes++
		}
	}
	return sc.Err()
}
