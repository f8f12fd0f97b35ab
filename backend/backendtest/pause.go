package backendtest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// The pause contract (backend.Pauser), for backends with Options.Pause;
// a backend that implements Pauser without Options.Pause must refuse it
// with ErrUnsupported. They need Options.Processes: a durable process is
// what shows a paused sandbox's processes not advancing.
var pauseTests = []struct {
	name string
	fn   func(*suite)
}{
	{"PauseStopsEveryProcessAndResumeGoesOn", testPauseStops},
	{"PauseRefusesABusySandbox", testPauseBusy},
	{"PausedSandboxIsDestroyed", testPauseDestroy},
	{"PausedSandboxSurvivesARestart", testPauseRestart},
	{"SnapshotAndForkLeaveAPausedSandboxPaused", testPauseSnapshot},
}

var pauseRefusedTests = []struct {
	name string
	fn   func(*suite)
}{
	{"PauseRefusedWhereUnsupported", testPauseUnsupported},
}

func (s *suite) pauser() backend.Pauser {
	s.Helper()
	p, ok := s.b.(backend.Pauser)
	if !ok {
		s.Fatalf("%T does not implement backend.Pauser", s.b)
	}
	return p
}

// counter is a durable process that prints 1, 2, 3, ... every 10 ms.
const counter = `i=0; while :; do i=$((i+1)); echo $i; sleep 0.01; done`

// written is how many stdout bytes process id has written so far.
func (s *suite) written(b backend.Backend, sb sandbox, id string) int64 {
	s.Helper()
	p, err := b.(backend.Processes).WaitProcess(s.ctx(), sb.id, id, 0)
	if err != nil {
		s.Fatalf("WaitProcess(%s): %v", id, err)
	}
	if !p.Running {
		s.Fatalf("process %s ended: %+v", id, p)
	}
	return p.StdoutBytes
}

// lastLine is the last whole line process id printed.
func (s *suite) lastLine(b backend.Backend, sb sandbox, id string) string {
	s.Helper()
	n := s.written(b, sb, id)
	from := max(n-64, 0)
	r, err := b.(backend.Processes).ReadOutput(s.ctx(), sb.id, id, false, from, 64, 0)
	if err != nil {
		s.Fatalf("ReadOutput(%s): %v", id, err)
	}
	lines := strings.Split(strings.TrimRight(string(r.Data), "\n"), "\n")
	return lines[len(lines)-1]
}

// waitAdvances waits until process id has written more than n bytes.
func (s *suite) waitAdvances(b backend.Backend, sb sandbox, id string, n int64, what string) {
	s.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for s.written(b, sb, id) <= n {
		if time.Now().After(deadline) {
			s.Fatalf("%s: process %s wrote nothing more than %d bytes in 20s", what, id, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stays checks that process id writes nothing for a while: its sandbox is
// paused.
func (s *suite) stays(b backend.Backend, sb sandbox, id string, what string) {
	s.Helper()
	at := s.written(b, sb, id)
	time.Sleep(300 * time.Millisecond)
	if now := s.written(b, sb, id); now != at {
		s.Errorf("%s: a paused sandbox's process went on writing (%d bytes, then %d)", what, at, now)
	}
}

// refusedOrWorks checks that err, from an operation on a paused sandbox,
// is ErrPaused or nothing (a backend may serve some operations from the
// host), and that it came back at once.
func (s *suite) refusedOrWorks(what string, took time.Duration, err error) {
	s.Helper()
	if err != nil && !errors.Is(err, backend.ErrPaused) {
		s.Errorf("%s on a paused sandbox: %v, want nil or ErrPaused", what, err)
	}
	if took > 5*time.Second {
		s.Errorf("%s on a paused sandbox took %v: it must not wait for the sandbox", what, took)
	}
}

func testPauseStops(s *suite) {
	pz := s.pauser()
	if err := pz.CanPause(); err != nil {
		s.Fatalf("CanPause: %v", err)
	}
	sb := s.create(backend.Spec{})
	s.write(sb, "kept.txt", []byte("kept\n"))
	p := s.start(sb, backend.ProcessRequest{Command: counter})
	s.waitAdvances(s.b, sb, p.ID, 0, "before the pause")
	if s.opts.Code {
		if res := s.cell(sb, "", "x = 41", time.Minute); res.Error != nil {
			s.Fatalf("a cell before the pause: %+v", res)
		}
	}
	var did backend.PauseInfo
	for i := range 2 {
		info, err := pz.Pause(s.ctx(), sb.id)
		if err != nil {
			s.Fatalf("Pause #%d: %v", i+1, err)
		}
		if i > 0 && info != did {
			s.Errorf("Pause of a paused sandbox: %+v, the first answered %+v", info, did)
		}
		did = info // memory released or not: what the backend does
	}
	if paused, err := pz.Paused(s.ctx(), sb.id); err != nil || paused == nil || *paused != did {
		s.Errorf("Paused after Pause: %+v, %v; want %+v, what the pause did", paused, err, did)
	}
	s.stays(s.b, sb, p.ID, "paused")
	line := s.lastLine(s.b, sb, p.ID)

	start := time.Now()
	_, err := s.b.Exec(s.ctx(), sb.id, backend.ExecRequest{Command: "true", Timeout: 10 * time.Second, MaxOutputBytes: 1024})
	s.refusedOrWorks("Exec", time.Since(start), err)
	start = time.Now()
	_, err = s.b.ReadFile(s.ctx(), sb.id, "kept.txt", 1024)
	s.refusedOrWorks("ReadFile", time.Since(start), err)
	start = time.Now()
	_, err = s.procs().StartProcess(s.ctx(), sb.id, backend.ProcessRequest{Command: "true"})
	s.refusedOrWorks("StartProcess", time.Since(start), err)
	s.stays(s.b, sb, p.ID, "paused, after operations were refused")

	for i := range 2 {
		if err := pz.Resume(s.ctx(), sb.id); err != nil {
			s.Fatalf("Resume #%d: %v", i+1, err)
		}
	}
	if paused, err := pz.Paused(s.ctx(), sb.id); err != nil || paused != nil {
		s.Errorf("Paused after Resume: %+v, %v", paused, err)
	}
	at := s.written(s.b, sb, p.ID)
	s.waitAdvances(s.b, sb, p.ID, at, "after the resume")
	s.checkGoesOn(s.b, sb, p.ID, line)
	if got := s.runOK(sb, "cat kept.txt"); got != "kept\n" {
		s.Errorf("after the resume, kept.txt is %q", got)
	}
	if s.opts.Code {
		if res := s.cell(sb, "", "x + 1", time.Minute); text(res) != "42" {
			s.Errorf("a context's state after the resume: %+v", res)
		}
	}
}

// checkGoesOn checks that the counter went on from where it stopped: the
// same process, every number once and in order, not one started again.
func (s *suite) checkGoesOn(b backend.Backend, sb sandbox, id, stoppedAt string) {
	s.Helper()
	r, err := b.(backend.Processes).ReadOutput(s.ctx(), sb.id, id, false, 0, 1<<20, 0)
	if err != nil {
		s.Fatalf("ReadOutput(%s): %v", id, err)
	}
	lines := strings.Split(strings.TrimRight(string(r.Data), "\n"), "\n")
	if !slices.Contains(lines, stoppedAt) {
		s.Fatalf("the counter's output lost where it stopped (%q)", stoppedAt)
	}
	for i, line := range lines {
		if n, err := strconv.Atoi(line); err != nil || n != i+1 {
			s.Fatalf("the counter's line %d is %q: the process did not go on where it was", i+1, line)
		}
	}
}

func testPauseBusy(s *suite) {
	pz := s.pauser()
	sb := s.create(backend.Spec{})
	done := make(chan error, 1)
	go func() {
		// It runs until the test opens its gate, whatever the host's load.
		_, err := s.b.Exec(s.ctx(), sb.id, backend.ExecRequest{Command: "touch started; while [ ! -e gate ]; do sleep 0.05; done", Timeout: time.Minute, MaxOutputBytes: 1024})
		done <- err
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := s.b.ReadFile(s.ctx(), sb.id, "started", 16); err == nil {
			break
		}
		if time.Now().After(deadline) {
			s.Fatalf("the command never started")
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, err := pz.Pause(s.ctx(), sb.id)
	wantErr(s, "Pause while a command runs", err, backend.ErrBusy)
	if paused, _ := pz.Paused(s.ctx(), sb.id); paused != nil {
		s.Errorf("a refused pause left the sandbox paused")
	}
	if err := s.b.WriteFile(s.ctx(), sb.id, "gate", nil, 0); err != nil {
		s.Fatalf("open the command's gate: %v", err)
	}
	if err := <-done; err != nil {
		s.Fatalf("the command: %v", err)
	}
	if _, err := pz.Pause(s.ctx(), sb.id); err != nil {
		s.Fatalf("Pause once the command ended: %v", err)
	}
	if err := pz.Resume(s.ctx(), sb.id); err != nil {
		s.Fatalf("Resume: %v", err)
	}
	s.runOK(sb, "true")
}

func testPauseDestroy(s *suite) {
	pz := s.pauser()
	sb := s.create(backend.Spec{})
	tok := sleepToken()
	s.start(sb, backend.ProcessRequest{Command: "sleep " + tok})
	s.runOK(sb, "true")
	if _, err := pz.Pause(s.ctx(), sb.id); err != nil {
		s.Fatalf("Pause: %v", err)
	}
	if err := s.b.Destroy(s.ctx(), sb.id); err != nil {
		s.Fatalf("Destroy of a paused sandbox: %v", err)
	}
	if s.opts.HostProcesses != nil {
		deadline := time.Now().Add(10 * time.Second)
		for len(s.opts.HostProcesses("sleep "+tok)) > 0 {
			if time.Now().After(deadline) {
				s.Errorf("a paused sandbox's process outlived its destroy: %v", s.opts.HostProcesses("sleep "+tok))
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if s.listed(sb.id) {
		s.Errorf("a destroyed paused sandbox is still listed")
	}
	if err := s.b.Adopt(s.ctx(), sb.id); !errors.Is(err, backend.ErrNotFound) {
		s.Errorf("Adopt of a destroyed paused sandbox: %v, want ErrNotFound", err)
	}
}

// A paused sandbox stays paused across a restart of the daemon (the
// backend abandoned, a new one on its state), and its processes go on
// where they were once it is resumed.
func testPauseRestart(s *suite) {
	if s.opts.Reopen == nil {
		s.Skip("the backend has no Reopen")
	}
	sb := s.create(backend.Spec{})
	p := s.start(sb, backend.ProcessRequest{Command: counter})
	s.waitAdvances(s.b, sb, p.ID, 0, "before the pause")
	if s.opts.Code {
		if res := s.cell(sb, "", "x = 41", time.Minute); res.Error != nil {
			s.Fatalf("a cell before the pause: %+v", res)
		}
	}
	did, err := s.pauser().Pause(s.ctx(), sb.id)
	if err != nil {
		s.Fatalf("Pause: %v", err)
	}
	line := s.lastLine(s.b, sb, p.ID)
	nb := s.opts.Reopen(s.T, s.b)
	after := &suite{T: s.T, b: nb, opts: s.opts}
	if err := nb.Adopt(s.ctx(), sb.id); err != nil {
		s.Fatalf("Adopt of a paused sandbox: %v", err)
	}
	pz := after.pauser()
	// What the pause did, as the new process finds it: a daemon killed
	// before its journal said so learns it here.
	if paused, err := pz.Paused(s.ctx(), sb.id); err != nil || paused == nil || *paused != did {
		s.Fatalf("Paused after a restart: %+v, %v; the sandbox was paused: %+v", paused, err, did)
	}
	after.stays(nb, sb, p.ID, "paused, after a restart")
	if err := pz.Resume(s.ctx(), sb.id); err != nil {
		s.Fatalf("Resume after a restart: %v", err)
	}
	at := after.written(nb, sb, p.ID)
	after.waitAdvances(nb, sb, p.ID, at, "resumed after a restart")
	after.checkGoesOn(nb, sb, p.ID, line)
	if s.opts.Code {
		if res := after.cell(sb, "", "x + 1", time.Minute); text(res) != "42" {
			s.Errorf("a context's state after a pause, a restart and a resume: %+v", res)
		}
	}
	after.runOK(sb, "true")
	if err := nb.(backend.Processes).SignalProcess(s.ctx(), sb.id, p.ID, syscall.SIGKILL); err != nil {
		s.Errorf("SignalProcess after the resume: %v", err)
	}
	if err := nb.Destroy(s.ctx(), sb.id); err != nil {
		s.Errorf("Destroy: %v", err)
	}
}

func testPauseUnsupported(s *suite) {
	pz, ok := s.b.(backend.Pauser)
	if !ok {
		s.Skip("the backend has no pause at all (the daemon refuses it)")
	}
	wantErr(s, "CanPause", pz.CanPause(), backend.ErrUnsupported)
	sb := s.create(backend.Spec{})
	_, err := pz.Pause(s.ctx(), sb.id)
	wantErr(s, "Pause", err, backend.ErrUnsupported)
	s.runOK(sb, "true")
}

// testPauseSnapshot snapshots and forks a paused sandbox (with
// Options.Snapshots): its files are handed over still, and it stays
// paused, its process where it stopped, until it is resumed.
func testPauseSnapshot(s *suite) {
	if !s.opts.Snapshots {
		s.Skip("the backend does not snapshot")
	}
	pz := s.pauser()
	sb := s.create(backend.Spec{})
	s.write(sb, "kept.txt", []byte("kept\n"))
	p := s.start(sb, backend.ProcessRequest{Command: counter})
	s.waitAdvances(s.b, sb, p.ID, 0, "before the pause")
	if _, err := pz.Pause(s.ctx(), sb.id); err != nil {
		s.Fatalf("Pause: %v", err)
	}
	var kept []byte
	err := s.snapshotter().SnapshotFiles(s.ctx(), sb.id, backend.SnapshotOptions{}, func(f backend.SandboxFiles) error {
		if !f.Frozen {
			s.Error("a paused sandbox's files handed over as not frozen")
		}
		return withReader(f, func() (err error) { kept, err = os.ReadFile(filepath.Join(f.Workspace, "kept.txt")); return err })
	})
	if err != nil || string(kept) != "kept\n" {
		s.Fatalf("SnapshotFiles of a paused sandbox: %v, kept.txt %q", err, kept)
	}
	s.stays(s.b, sb, p.ID, "after a snapshot")
	fork := newID()
	s.Cleanup(func() { _ = s.b.Destroy(context.Background(), fork) })
	res, err := s.forker().Fork(s.ctx(), sb.id, []string{fork}, backend.SnapshotOptions{})
	if err != nil {
		s.Fatalf("Fork of a paused sandbox: %v", err)
	}
	if got := s.runOK(sandbox{id: fork, info: res.Infos[0]}, "cat kept.txt"); got != "kept\n" {
		s.Errorf("the fork of a paused sandbox has kept.txt %q", got)
	}
	if paused, err := pz.Paused(s.ctx(), sb.id); err != nil || paused == nil {
		s.Errorf("Paused after a snapshot and a fork: %+v, %v", paused, err)
	}
	s.stays(s.b, sb, p.ID, "after a fork")
	if err := pz.Resume(s.ctx(), sb.id); err != nil {
		s.Fatalf("Resume: %v", err)
	}
	s.waitAdvances(s.b, sb, p.ID, s.written(s.b, sb, p.ID), "after the resume")
}
