package backendtest

import (
	"context"
	"strings"
	"syscall"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// The durable processes' contract (backend.Processes), for backends with
// Options.Processes.
var processTests = []struct {
	name string
	fn   func(*suite)
}{
	{"ProcessRunsToItsEndAndIsRecorded", testProcessRecorded},
	{"ProcessNamesStartOnce", testProcessNames},
	{"ProcessOutputIsFollowed", testProcessFollow},
	{"ProcessSignals", testProcessSignals},
	{"ProcessTimeout", testProcessTimeout},
	{"ProcessOutlivesCommandsAndItsRequest", testProcessOutlivesCommands},
	{"ProcessEndsWithItsSandbox", testProcessEndsWithSandbox},
	{"ProcessErrors", testProcessErrors},
}

func (s *suite) procs() backend.Processes {
	s.Helper()
	p, ok := s.b.(backend.Processes)
	if !ok {
		s.Fatalf("%T does not implement backend.Processes", s.b)
	}
	return p
}

func (s *suite) start(sb sandbox, req backend.ProcessRequest) backend.ProcessInfo {
	s.Helper()
	p, err := s.procs().StartProcess(s.ctx(), sb.id, req)
	if err != nil {
		s.Fatalf("StartProcess(%s, %q %q): %v", sb.id, req.Command, req.Argv, err)
	}
	if p.ID == "" {
		s.Fatalf("StartProcess: no id")
	}
	return p
}

// waitEnd waits for a process's end and returns it.
func (s *suite) waitEnd(sb sandbox, id string) backend.ProcessInfo {
	s.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		p, err := s.procs().WaitProcess(s.ctx(), sb.id, id, 10*time.Second)
		if err != nil {
			s.Fatalf("WaitProcess(%s): %v", id, err)
		}
		if !p.Running {
			return p
		}
		if time.Now().After(deadline) {
			s.Fatalf("process %s still runs after a minute", id)
		}
	}
}

// output reads all of one stream of a process that has ended.
func (s *suite) output(sb sandbox, id string, stderr bool) string {
	s.Helper()
	var out []byte
	offset := int64(0)
	for {
		r, err := s.procs().ReadOutput(s.ctx(), sb.id, id, stderr, offset, 1<<16, 0)
		if err != nil {
			s.Fatalf("ReadOutput(%s, %d): %v", id, offset, err)
		}
		out = append(out, r.Data...)
		if len(r.Data) == 0 {
			return string(out)
		}
		offset = r.NextOffset
	}
}

func testProcessRecorded(s *suite) {
	sb := s.create(backend.Spec{})
	p := s.start(sb, backend.ProcessRequest{Command: "echo hello; echo oops >&2; read line; echo got $line; exit 3", Stdin: []byte("input\n")})
	end := s.waitEnd(sb, p.ID)
	if end.ExitCode != 3 || end.Reason != "exited" || end.StartedAt.IsZero() || end.EndedAt.Before(end.StartedAt) {
		s.Errorf("the end: %+v", end)
	}
	if got := s.output(sb, p.ID, false); got != "hello\ngot input\n" {
		s.Errorf("stdout %q", got)
	}
	if got := s.output(sb, p.ID, true); got != "oops\n" {
		s.Errorf("stderr %q", got)
	}
	if end.StdoutBytes != int64(len("hello\ngot input\n")) || end.StderrBytes != 5 {
		s.Errorf("byte counts %d/%d", end.StdoutBytes, end.StderrBytes)
	}
	argv := s.start(sb, backend.ProcessRequest{Argv: []string{"sh", "-c", "pwd; echo $FOO"}, Cwd: "/tmp", Env: map[string]string{"FOO": "bar"}})
	s.waitEnd(sb, argv.ID)
	if got := s.output(sb, argv.ID, false); got != "/tmp\nbar\n" {
		s.Errorf("an argv in /tmp with FOO: %q", got)
	}
	list, err := s.procs().ListProcesses(s.ctx(), sb.id)
	if err != nil {
		s.Fatalf("ListProcesses: %v", err)
	}
	if len(list) != 2 || list[0].ID != p.ID || list[1].ID != argv.ID || list[0].Command == "" || len(list[1].Argv) != 3 {
		s.Errorf("the list, oldest first: %+v", list)
	}
	missing := s.start(sb, backend.ProcessRequest{Argv: []string{"no-such-program-here"}})
	if end := s.waitEnd(sb, missing.ID); end.ExitCode != 127 {
		s.Errorf("a program that is not there: %+v", end)
	}
}

func testProcessNames(s *suite) {
	sb := s.create(backend.Spec{})
	first := s.start(sb, backend.ProcessRequest{Name: "train", Command: "echo once >> runs.txt; echo started; sleep 60"})
	again := s.start(sb, backend.ProcessRequest{Name: "train", Command: "echo twice >> runs.txt; echo started; sleep 60"})
	if !again.Existing || again.ID != first.ID || first.Existing {
		s.Errorf("a second start of train: %+v (first %+v)", again, first)
	}
	if r, err := s.procs().ReadOutput(s.ctx(), sb.id, first.ID, false, 0, 100, 20*time.Second); err != nil || string(r.Data) != "started\n" {
		s.Fatalf("train's first line: %+v, %v", r, err)
	}
	if err := s.procs().SignalProcess(s.ctx(), sb.id, first.ID, syscall.SIGKILL); err != nil {
		s.Fatalf("SignalProcess: %v", err)
	}
	s.waitEnd(sb, first.ID)
	ended := s.start(sb, backend.ProcessRequest{Name: "train", Command: "true"})
	if !ended.Existing || ended.ID != first.ID || ended.Running {
		s.Errorf("a start of an ended train: %+v", ended)
	}
	if got := s.runOK(sb, "cat runs.txt"); got != "once\n" {
		s.Errorf("train ran %q", got)
	}
	if _, err := s.procs().StartProcess(s.ctx(), sb.id, backend.ProcessRequest{Name: "no/slash", Command: "true"}); err == nil {
		s.Errorf("a name with a slash was taken")
	}
}

func testProcessFollow(s *suite) {
	sb := s.create(backend.Spec{})
	p := s.start(sb, backend.ProcessRequest{Command: "echo first; sleep 1; echo second; sleep 1; echo third"})
	var got []byte
	offset := int64(0)
	for {
		start := time.Now()
		r, err := s.procs().ReadOutput(s.ctx(), sb.id, p.ID, false, offset, 1<<16, 20*time.Second)
		if err != nil {
			s.Fatalf("ReadOutput: %v", err)
		}
		if len(r.Data) == 0 && r.Process.Running && time.Since(start) < 15*time.Second {
			s.Errorf("a read with wait came back empty after %v while the process ran", time.Since(start))
		}
		if r.Offset != offset || r.Dropped != 0 || r.NextOffset != offset+int64(len(r.Data)) {
			s.Errorf("offsets: asked %d, got %+v", offset, r)
		}
		got, offset = append(got, r.Data...), r.NextOffset
		if !r.Process.Running && len(r.Data) == 0 {
			break
		}
	}
	if string(got) != "first\nsecond\nthird\n" {
		s.Errorf("followed %q", got)
	}
	// A reader that comes back later reads from where it was.
	r, err := s.procs().ReadOutput(s.ctx(), sb.id, p.ID, false, 6, 100, 0)
	if err != nil || string(r.Data) != "second\nthird\n" || r.Offset != 6 {
		s.Errorf("a read from offset 6: %+v, %v", r, err)
	}
}

func testProcessSignals(s *suite) {
	sb := s.create(backend.Spec{})
	p := s.start(sb, backend.ProcessRequest{Command: "trap 'echo got-usr1' USR1; echo trapped; while :; do sleep 0.1; done"})
	set, err := s.procs().ReadOutput(s.ctx(), sb.id, p.ID, false, 0, 100, 20*time.Second)
	if err != nil || string(set.Data) != "trapped\n" {
		s.Fatalf("the trap was not set: %+v, %v", set, err)
	}
	if err := s.procs().SignalProcess(s.ctx(), sb.id, p.ID, syscall.SIGUSR1); err != nil {
		s.Fatalf("SignalProcess(USR1): %v", err)
	}
	r, err := s.procs().ReadOutput(s.ctx(), sb.id, p.ID, false, set.NextOffset, 100, 10*time.Second)
	if err != nil || !strings.Contains(string(r.Data), "got-usr1") || !r.Process.Running {
		s.Errorf("after USR1: %+v, %v", r, err)
	}
	if err := s.procs().SignalProcess(s.ctx(), sb.id, p.ID, syscall.SIGTERM); err != nil {
		s.Fatalf("SignalProcess(TERM): %v", err)
	}
	end := s.waitEnd(sb, p.ID)
	if end.Reason != "killed" || end.ExitCode != 128+int(syscall.SIGTERM) {
		s.Errorf("after TERM: %+v", end)
	}
	wantErr(s, "a signal to an ended process", s.procs().SignalProcess(s.ctx(), sb.id, p.ID, syscall.SIGTERM), backend.ErrProcessEnded)
}

func testProcessTimeout(s *suite) {
	sb := s.create(backend.Spec{})
	p := s.start(sb, backend.ProcessRequest{Command: "trap '' TERM; sleep 60", Timeout: 300 * time.Millisecond})
	end := s.waitEnd(sb, p.ID)
	if end.Reason != "timed_out" || end.ExitCode != 137 {
		s.Errorf("a process past its budget that ignores TERM: %+v", end)
	}
	if took := end.EndedAt.Sub(end.StartedAt); took > 300*time.Millisecond+s.opts.KillGrace+s.opts.Slack {
		s.Errorf("it ended after %v", took)
	}
}

// A process is not a command's: a command's end (which kills what the
// command left, its own background jobs included) never touches it, and
// the request that started it going away does not either.
func testProcessOutlivesCommands(s *suite) {
	sb := s.create(backend.Spec{})
	ctx, cancel := context.WithCancel(s.ctx())
	p, err := s.procs().StartProcess(ctx, sb.id, backend.ProcessRequest{Command: "while :; do date +%s%N > beat.tmp && mv beat.tmp beat.txt; sleep 0.05; done"})
	cancel()
	if err != nil {
		s.Fatalf("StartProcess: %v", err)
	}
	tok := sleepToken()
	s.runOK(sb, "sleep "+tok+" & echo started")
	s.runOK(sb, "setsid sleep "+tok+" & echo started")
	if got := string(s.run(sb, countSleeps(tok)).Stdout); strings.TrimSpace(got) != "0" {
		s.Errorf("a command's background jobs outlived it next to a durable process: %q", got)
	}
	// It beats every 50 ms; a loaded host (a CPU quota, other packages'
	// tests) may delay its first beat and stretch the next, so each wait
	// lasts up to the suite's slack.
	beat := func() string { return string(s.run(sb, "cat beat.txt 2>/dev/null").Stdout) }
	beatsAfter := func(prev string) (string, bool) {
		for deadline := time.Now().Add(s.opts.Slack); ; time.Sleep(50 * time.Millisecond) {
			if b := beat(); b != "" && b != prev {
				return b, true
			}
			if time.Now().After(deadline) {
				return prev, false
			}
		}
	}
	if first, ok := beatsAfter(""); !ok {
		s.Errorf("the durable process never beat within %v", s.opts.Slack)
	} else if _, ok := beatsAfter(first); !ok {
		s.Errorf("the durable process stopped beating after commands ran (%q for %v)", first, s.opts.Slack)
	}
	info, err := s.procs().WaitProcess(s.ctx(), sb.id, p.ID, 0)
	if err != nil || !info.Running {
		s.Errorf("the process after commands and its request's end: %+v, %v", info, err)
	}
	if err := s.procs().SignalProcess(s.ctx(), sb.id, p.ID, syscall.SIGKILL); err != nil {
		s.Errorf("SignalProcess: %v", err)
	}
	s.waitEnd(sb, p.ID)
}

func testProcessEndsWithSandbox(s *suite) {
	sb := s.create(backend.Spec{})
	tok := sleepToken()
	s.start(sb, backend.ProcessRequest{Command: "sleep " + tok})
	if err := s.b.Destroy(s.ctx(), sb.id); err != nil {
		s.Fatalf("Destroy: %v", err)
	}
	if s.opts.HostProcesses != nil {
		deadline := time.Now().Add(5 * time.Second)
		for len(s.opts.HostProcesses("sleep "+tok)) > 0 {
			if time.Now().After(deadline) {
				s.Errorf("the process outlived its sandbox: %v", s.opts.HostProcesses("sleep "+tok))
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	_, err := s.procs().ListProcesses(s.ctx(), sb.id)
	wantErr(s, "the processes of a destroyed sandbox", err, backend.ErrNotFound)
}

func testProcessErrors(s *suite) {
	sb := s.create(backend.Spec{})
	_, err := s.procs().WaitProcess(s.ctx(), sb.id, "p-000000000000", 0)
	wantErr(s, "an unknown process", err, backend.ErrProcessNotFound)
	_, err = s.procs().ReadOutput(s.ctx(), sb.id, "../etc", false, 0, 10, 0)
	wantErr(s, "a process id that is a path", err, backend.ErrProcessNotFound)
	wantErr(s, "a signal to an unknown process", s.procs().SignalProcess(s.ctx(), sb.id, "p-000000000000", syscall.SIGTERM), backend.ErrProcessNotFound)
	_, err = s.procs().StartProcess(s.ctx(), sb.id, backend.ProcessRequest{})
	wantErr(s, "a start with no command", err, backend.ErrInvalidArgument)
	_, err = s.procs().StartProcess(s.ctx(), "sc-0000000000000000", backend.ProcessRequest{Command: "true"})
	wantErr(s, "a start in an unknown sandbox", err, backend.ErrNotFound)
	p := s.start(sb, backend.ProcessRequest{Command: "true"})
	s.waitEnd(sb, p.ID)
	_, err = s.procs().ReadOutput(s.ctx(), sb.id, p.ID, false, -1, 10, 0)
	wantErr(s, "a negative offset", err, backend.ErrInvalidArgument)
}
