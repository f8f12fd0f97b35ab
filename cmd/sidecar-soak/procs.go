package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// Durable processes in the soak. Every process an agent starts writes a
// stream that checks itself: line i is its name, a space, i in eight
// digits and a newline, so every line has the same length and the byte at
// any absolute offset is known; a gap, a repeat or a stranger's byte shows
// wherever a read starts. Its name also says what it does (kind, lines,
// exit code, budget), so the soak's final check needs nothing but the
// sandbox's list and the agents' files to judge every process.

// Process kinds.
const (
	kindFinite   = "fin"   // writes its lines over a second or two, then exits with its code
	kindFlood    = "flood" // writes more than the log keeps at once, then exits with its code
	kindInfinite = "inf"   // writes a line every 0.2 s until signalled or its budget ends
)

// Bounds of the soak's processes.
const (
	procLogBytes   = 64 << 10 // [processes] log_bytes of the soaked daemon
	procMaxEnded   = 1024     // [processes] max_ended: no record is dropped during a soak
	procsPerAgent  = 3        // processes an agent keeps running at once
	procFollowWait = 1.0      // read_output's wait_s
	// procEndSlack is how long after its expected end a process may
	// still run in the final check (a loaded machine, a SIGSTOPped daemon).
	procEndSlack = 20 * time.Second
)

// procSpec is what a process's name says of it.
type procSpec struct {
	Name     string
	Kind     string
	Lines    int // lines it writes (fin, flood)
	Code     int // exit code (fin, flood)
	TimeoutS int // budget in seconds (inf)
}

// newSpecName names a process of the soak: kind.lines.code.timeout.tag,
// where tag is the run's token, the agent's index, pid and step.
func newSpecName(kind string, lines, code, timeoutS int, token string, index, pid, seq int) string {
	return fmt.Sprintf("%s.%d.%d.%d.%s-%d-%d-%d", kind, lines, code, timeoutS, token, index, pid, seq)
}

// parseSpec reads a process's name back; ok false for a name that is not
// one of this run's (token).
func parseSpec(name, token string) (procSpec, bool) {
	f := strings.SplitN(name, ".", 5)
	if len(f) != 5 || !strings.HasPrefix(f[4], token+"-") {
		return procSpec{}, false
	}
	s := procSpec{Name: name, Kind: f[0]}
	var err1, err2, err3 error
	s.Lines, err1 = strconv.Atoi(f[1])
	s.Code, err2 = strconv.Atoi(f[2])
	s.TimeoutS, err3 = strconv.Atoi(f[3])
	if err1 != nil || err2 != nil || err3 != nil {
		return procSpec{}, false
	}
	switch s.Kind {
	case kindFinite, kindFlood, kindInfinite:
		return s, true
	}
	return procSpec{}, false
}

// lineLen is the length of every line of the process's stream.
func (s procSpec) lineLen() int64 { return int64(len(s.Name)) + 10 }

// finite: the process ends by itself, having written Lines lines.
func (s procSpec) finite() bool { return s.Kind != kindInfinite }

// streamBytes is what a finite process writes in all.
func (s procSpec) streamBytes() int64 { return int64(s.Lines) * s.lineLen() }

// maxBytes is the most the process can write: all its lines, or a line
// every 0.2 s of its budget and the grace after it.
func (s procSpec) maxBytes() int64 {
	if s.finite() {
		return s.streamBytes()
	}
	return int64(s.TimeoutS*5+20) * s.lineLen()
}

// command is the shell loop that writes the stream.
func (s procSpec) command() string {
	line := fmt.Sprintf("printf '%%s %%08d\\n' %s $i", s.Name)
	switch s.Kind {
	case kindFinite:
		return fmt.Sprintf("i=0; while [ $i -lt %d ]; do %s; i=$((i+1)); if [ $((i %% 20)) -eq 0 ]; then sleep 0.1; fi; done; exit %d", s.Lines, line, s.Code)
	case kindFlood:
		return fmt.Sprintf("i=0; while [ $i -lt %d ]; do %s; i=$((i+1)); done; exit %d", s.Lines, line, s.Code)
	}
	return fmt.Sprintf("i=0; while :; do %s; i=$((i+1)); sleep 0.2; done", line)
}

// expectedEnd bounds when a process started at started should have ended.
func (s procSpec) expectedEnd(started time.Time) time.Time {
	switch s.Kind {
	case kindInfinite:
		// Its budget, then SIGTERM, then SIGKILL after the kill grace.
		return started.Add(time.Duration(s.TimeoutS)*time.Second + 5*time.Second)
	case kindFinite:
		return started.Add(time.Duration(s.Lines/20)*150*time.Millisecond + 5*time.Second)
	}
	return started.Add(10 * time.Second)
}

// badByte is the first offset, from offset on, at which data is not the
// process's stream, or -1 when all of it is.
func (s procSpec) badByte(offset int64, data []byte) int64 {
	l := s.lineLen()
	var line int64 = -1
	var want string
	for i, b := range data {
		o := offset + int64(i)
		if o/l != line {
			line = o / l
			want = fmt.Sprintf("%s %08d\n", s.Name, line)
		}
		if want[o%l] != b {
			return o
		}
	}
	return -1
}

// Process end reasons (api.ProcessInfo.Reason).
const (
	reasonExited     = "exited"
	reasonKilled     = "killed"
	reasonTimedOut   = "timed_out"
	reasonOOM        = "oom_killed"
	reasonTerminated = "sandbox_terminated"
)

// signalNumbers are the signals agents send, by name.
var signalNumbers = map[string]int{"TERM": 15, "KILL": 9, "INT": 2, "HUP": 1, "USR1": 10, "USR2": 12}

var signalNames = []string{"TERM", "KILL", "INT", "HUP", "USR1", "USR2"}

// judgeEnd decides whether what a sandbox says of a process's end holds
// for what the process is (s) and the signals agents meant to send it
// (sent, by number). overdue: it still runs past s.expectedEnd. survival:
// processes are expected to survive a daemon's kill -9 (--expect-process-
// survival); without it, a process lost with the daemon is tolerated
// (said in tolerated), since the daemon's sandbox agent then dies with it.
//
// answered says whether the daemon answered the process's start: one it
// did not (it was killed mid-start) may have been given up, and then
// reads as killed (137) with no end time and no output, having never run.
func judgeEnd(s procSpec, p api.ProcessInfo, sent map[int]bool, overdue, survival, answered bool) (violation, tolerated string) {
	lost := func(what string) (string, string) {
		if survival {
			return what, ""
		}
		return "", what
	}
	if p.Running {
		if overdue {
			return lost("still running after it should have ended: its exit is not known")
		}
		return "", ""
	}
	if p.ExitCode == nil {
		return fmt.Sprintf("ended (%s) without an exit code", p.Reason), ""
	}
	code := *p.ExitCode
	switch p.Reason {
	case reasonTerminated:
		if code != 137 {
			return fmt.Sprintf("sandbox_terminated with exit code %d, not 137", code), ""
		}
		return lost("ended as sandbox_terminated in a sandbox that lived")
	case reasonExited:
		if !s.finite() {
			return fmt.Sprintf("a loop without end exited (%d)", code), ""
		}
		if code != s.Code {
			return fmt.Sprintf("exited %d, not %d", code, s.Code), ""
		}
		return "", ""
	case reasonKilled:
		if code > 128 && sent[code-128] {
			return "", ""
		}
		if code == 137 && !answered && p.EndedAt == nil && p.StdoutBytes == 0 {
			return "", "a start cut by a daemon kill, given up and never run"
		}
		if code == 137 {
			return lost("killed by SIGKILL that no agent sent")
		}
		return fmt.Sprintf("killed (exit code %d) by no signal an agent sent", code), ""
	case reasonTimedOut:
		if s.finite() {
			return fmt.Sprintf("timed out (%d) without a budget", code), ""
		}
		// Its budget's TERM (143) or KILL (137) ended it, or a signal an
		// agent sent after the budget's TERM did.
		if code != 128+15 && code != 128+9 && !(code > 128 && sent[code-128]) {
			return fmt.Sprintf("timed out with exit code %d, not 143 or 137 (nor a signal an agent sent)", code), ""
		}
		return "", ""
	case reasonOOM:
		return "oom_killed: the soak's processes use no memory to speak of", ""
	}
	return fmt.Sprintf("ended with an unknown reason %q (exit code %d)", p.Reason, code), ""
}

// judgeBytes decides whether a process's stdout count holds for what it
// is: a finite one that exited wrote every line; any other wrote whole
// lines, and no more than it has, unless its sandbox's agent died while
// it wrote (the log then keeps its last whole write, maybe mid-line);
// none writes to stderr.
func judgeBytes(s procSpec, p api.ProcessInfo) string {
	n := p.StdoutBytes
	switch {
	case p.StderrBytes != 0:
		return fmt.Sprintf("%d bytes on stderr, where it writes none", p.StderrBytes)
	case s.finite() && n > s.streamBytes():
		return fmt.Sprintf("stdout has %d bytes, more than the %d it writes", n, s.streamBytes())
	case s.finite() && !p.Running && p.Reason == reasonExited && n != s.streamBytes():
		return fmt.Sprintf("exited having written %d bytes, not %d", n, s.streamBytes())
	case p.Reason != reasonTerminated && n%s.lineLen() != 0:
		return fmt.Sprintf("stdout has %d bytes, not whole lines of %d", n, s.lineLen())
	}
	return ""
}

// judgeRead decides whether a read_output of a process from asked holds:
// its data at its offset is the stream, the offset is the asked one but
// for bytes dropped past the log's ring, and none is dropped that the ring
// should hold (written: the most the stream can have had at the read).
func judgeRead(s procSpec, asked int64, r api.ReadOutputResult, written int64) string {
	if r.Offset != asked+r.Dropped {
		return fmt.Sprintf("read at %d: data at %d with %d dropped", asked, r.Offset, r.Dropped)
	}
	if r.NextOffset != r.Offset+int64(len(r.Data)) {
		return fmt.Sprintf("read at %d: next_offset %d after %d bytes at %d", asked, r.NextOffset, len(r.Data), r.Offset)
	}
	if r.Dropped > 0 && r.Offset > written-procLogBytes {
		return fmt.Sprintf("read at %d: %d bytes dropped that the log's %d should keep (%d written)", asked, r.Dropped, procLogBytes, written)
	}
	if o := s.badByte(r.Offset, r.Data); o >= 0 {
		return fmt.Sprintf("read at %d: byte %d is not the process's", asked, o)
	}
	return ""
}

// procFile is an agent's record of its processes, which outlives the
// agent: "intent NAME" before a start, "started NAME ID" once answered,
// "signal ID SIG" before a signal is sent.
type procFile struct {
	intents []string
	started map[string]string   // name -> id
	signals map[string][]string // id -> signal names
	order   []string            // started names, oldest first
}

func readProcFile(path string) (procFile, error) {
	pf := procFile{started: map[string]string{}, signals: map[string][]string{}}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return pf, nil
	}
	if err != nil {
		return pf, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		switch f := strings.Fields(sc.Text()); {
		case len(f) == 2 && f[0] == "intent":
			pf.intents = append(pf.intents, f[1])
		case len(f) == 3 && f[0] == "started":
			if _, ok := pf.started[f[1]]; !ok {
				pf.order = append(pf.order, f[1])
			}
			pf.started[f[1]] = f[2]
		case len(f) == 3 && f[0] == "signal":
			pf.signals[f[1]] = append(pf.signals[f[1]], f[2])
		}
	}
	return pf, sc.Err()
}

// sentTo is the signals meant for process id, by number.
func (pf procFile) sentTo(id string) map[int]bool {
	out := map[int]bool{}
	for _, name := range pf.signals[id] {
		out[signalNumbers[name]] = true
	}
	return out
}
