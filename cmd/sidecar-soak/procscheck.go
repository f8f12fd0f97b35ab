package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// procsPath is agent i's record of its processes.
func procsPath(work string, i int) string { return filepath.Join(work, fmt.Sprintf("procs-%d", i)) }

// procTally counts how the soak's processes ended, for the summary.
type procTally struct {
	started, ended, running, readBytes int64
	byReason                           map[string]int
	tolerated                          map[string]int
}

func (t procTally) String() string {
	reasons := make([]string, 0, len(t.byReason))
	for r, n := range t.byReason {
		reasons = append(reasons, fmt.Sprintf("%s %d", r, n))
	}
	sort.Strings(reasons)
	s := fmt.Sprintf("%d processes started, %d ended (%s), %d running; %d bytes of their output read back and checked",
		t.started, t.ended, strings.Join(reasons, ", "), t.running, t.readBytes)
	if len(t.tolerated) > 0 {
		var tol []string
		for w, n := range t.tolerated {
			tol = append(tol, fmt.Sprintf("%d %s", n, w))
		}
		sort.Strings(tol)
		s += "; tolerated (the contract allows them): " + strings.Join(tol, "; ")
	}
	return s
}

// checkProcesses checks every durable process the agents started in the
// owned sandboxes, once the chaos is over: each one the daemon said it
// started is still known (never lost), each that should have ended by now
// has, with the exit code and reason its kind and the signals sent to it
// allow, and every byte of its stdout the log keeps reads back as the
// process wrote it, none dropped below the log's ring. It waits (bounded)
// for the processes that should end to end.
func checkProcesses(d *daemon, work string, owned []string, token string, survival bool) (violations []string, tally procTally) {
	bad := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	tally.byReason, tally.tolerated = map[string]int{}, map[string]int{}
	// Wait until every process due to end has, or the slack is spent.
	lists := make([]*api.ListProcessesResult, len(owned))
	for deadline := time.Now().Add(procEndSlack + 15*time.Second); ; time.Sleep(500 * time.Millisecond) {
		due := false
		for i, id := range owned {
			lists[i] = &api.ListProcessesResult{}
			if err := d.call(ipc.OpListProcesses, api.SandboxRequest{Sandbox: id}, lists[i]); err != nil {
				lists[i] = nil
				continue
			}
			for _, p := range lists[i].Processes {
				if s, ok := parseSpec(p.Name, token); ok && p.Running && time.Now().After(s.expectedEnd(unixTime(p.StartedAt))) {
					due = true
				}
			}
		}
		if !due || time.Now().After(deadline) {
			break
		}
	}
	for i, id := range owned {
		pf, err := readProcFile(procsPath(work, i))
		if err != nil {
			bad("agent %d's process record: %v", i, err)
			continue
		}
		b, _ := os.ReadFile(procsPath(work, i) + ".tolerated")
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if line != "" {
				tally.tolerated["seen by an agent: "+line]++
			}
		}
		list := lists[i]
		if list == nil {
			bad("sandbox %s: list_processes failed", id)
			continue
		}
		byID := map[string]api.ProcessInfo{}
		for _, p := range list.Processes {
			byID[p.Process] = p
		}
		for _, name := range pf.order {
			pid := pf.started[name]
			p, ok := byID[pid]
			switch {
			case !ok:
				bad("sandbox %s: process %s (%s), whose start the daemon answered, is not listed: lost", id, pid, name)
			case p.Name != name:
				bad("sandbox %s: process %s is named %q, not %q", id, pid, p.Name, name)
			}
		}
		for _, p := range list.Processes {
			s, ok := parseSpec(p.Name, token)
			if !ok {
				bad("sandbox %s: process %s has a name no agent gave: %q", id, p.Process, p.Name)
				continue
			}
			tally.started++
			overdue := p.Running && time.Now().After(s.expectedEnd(unixTime(p.StartedAt)).Add(procEndSlack))
			violation, tolerated := judgeEnd(s, p, pf.sentTo(p.Process), overdue, survival, pf.started[p.Name] == p.Process)
			if violation != "" {
				bad("sandbox %s: process %s (%s): %s", id, p.Process, p.Name, violation)
			}
			if tolerated != "" {
				tally.tolerated[tolerated]++
			}
			if why := judgeBytes(s, p); why != "" {
				bad("sandbox %s: process %s (%s): %s", id, p.Process, p.Name, why)
			}
			if p.Running {
				tally.running++
			} else {
				tally.ended++
				tally.byReason[p.Reason]++
			}
			n, why := readAll(d, id, s, p)
			tally.readBytes += n
			if why != "" {
				bad("sandbox %s: process %s (%s): %s", id, p.Process, p.Name, why)
			}
		}
	}
	return violations, tally
}

// readAll reads a process's stdout from 0 to what it had written when
// listed, and checks it: the bytes below the log's ring are dropped, every
// one after is the stream's.
func readAll(d *daemon, id string, s procSpec, p api.ProcessInfo) (n int64, violation string) {
	offset := int64(0)
	for offset < p.StdoutBytes {
		var r api.ReadOutputResult
		if err := d.call(ipc.OpReadOutput, api.ReadOutputRequest{Sandbox: id, Process: p.Process, Stream: "stdout", Offset: offset}, &r); err != nil {
			return n, fmt.Sprintf("read_output at %d: %v", offset, err)
		}
		written := p.StdoutBytes
		if p.Running {
			written = s.maxBytes()
		}
		if why := judgeRead(s, offset, r, written); why != "" {
			return n, why
		}
		if offset == 0 && !p.Running {
			if want := max(0, p.StdoutBytes-procLogBytes); r.Dropped != want {
				return n, fmt.Sprintf("%d bytes dropped of %d written, not the %d past the log's %d", r.Dropped, p.StdoutBytes, want, procLogBytes)
			}
		}
		if len(r.Data) == 0 {
			if r.NextOffset < p.StdoutBytes {
				return n, fmt.Sprintf("read at %d: nothing, %d bytes short of the %d listed", offset, p.StdoutBytes-r.NextOffset, p.StdoutBytes)
			}
			break
		}
		n += int64(len(r.Data))
		offset = r.NextOffset
	}
	return n, ""
}

func unixTime(s float64) time.Time { return time.Unix(0, int64(s*1e9)) }
