package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// soakProc is a process an agent knows of: its own, or one its earlier
// incarnations started (procFile).
type soakProc struct {
	spec   procSpec
	id     string
	offset int64 // where its follower reads on
	ended  bool
	mine   bool // started by this incarnation
	// endSeen is the end the daemon reported (reason and exit code), ""
	// before: a process reported ended never runs again.
	endSeen string
}

// maxKnownProcs bounds what an agent remembers of its processes.
const maxKnownProcs = 48

// loadProcs opens the agent's process record and takes over the last
// processes its earlier incarnations started.
func (a *agent) loadProcs(path string) error {
	pf, err := readProcFile(path)
	if err != nil {
		return err
	}
	for _, name := range pf.order[max(0, len(pf.order)-maxKnownProcs/2):] {
		if s, ok := parseSpec(name, a.token); ok {
			a.procs = append(a.procs, &soakProc{spec: s, id: pf.started[name]})
		}
	}
	if a.procFile, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644); err != nil {
		return err
	}
	a.tolerated, err = os.OpenFile(path+".tolerated", os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	return err
}

// lostWithDaemon is a violation where processes must survive the
// daemon's kill -9, else a line in the agent's tolerated file, which the
// soak's summary counts.
func (a *agent) lostWithDaemon(what string, p *soakProc) {
	if a.survival {
		a.violation("process %s (%s) of %s %s", p.id, p.spec.Name, a.sandbox, what)
		return
	}
	fmt.Fprintln(a.tolerated, what)
}

func (a *agent) recordProc(format string, args ...any) {
	fmt.Fprintf(a.procFile, format+"\n", args...)
}

// running counts the processes this incarnation started and does not
// know to have ended (an earlier one's end within their budgets).
func (a *agent) running() int {
	n := 0
	for _, p := range a.procs {
		if p.mine && !p.ended {
			n++
		}
	}
	return n
}

func (a *agent) pick(filter func(*soakProc) bool) *soakProc {
	var c []*soakProc
	for _, p := range a.procs {
		if filter == nil || filter(p) {
			c = append(c, p)
		}
	}
	if len(c) == 0 {
		return nil
	}
	return c[rand.IntN(len(c))]
}

// procStep does one thing with durable processes: start one, follow one,
// signal one, wait for one, start one again by its name, or list them.
func (a *agent) procStep(seq int) {
	switch n := rand.IntN(10); {
	case n < 3 && a.running() < procsPerAgent:
		a.startProc(seq)
	case n < 6:
		if p := a.pick(nil); p != nil {
			a.follow(p)
		}
	case n < 7:
		if p := a.pick(func(p *soakProc) bool { return !p.ended && !p.spec.finite() }); p != nil {
			sig := signalNames[rand.IntN(len(signalNames))]
			a.recordProc("signal %s %s", p.id, sig)
			_, err := a.call(ipc.OpSignalProcess, api.SignalProcessRequest{Sandbox: a.sandbox, Process: p.id, Signal: sig}, nil)
			a.owned("signal_process", err)
			a.procError("signal_process", p, err, ipc.CodeProcessEnded)
		}
	case n < 8:
		if p := a.pick(nil); p != nil {
			var info api.ProcessInfo
			ok, err := a.call(ipc.OpWaitProcess, api.WaitProcessRequest{Sandbox: a.sandbox, Process: p.id, TimeoutS: 1}, &info)
			a.owned("wait_process", err)
			a.procError("wait_process", p, err)
			if ok {
				a.checkInfo(p, info)
			}
		}
	case n < 9:
		// A retried start: the name finds the process, nothing starts.
		if p := a.pick(nil); p != nil {
			var res api.StartCommandResult
			ok, err := a.call(ipc.OpStartCommand, api.StartCommandRequest{Sandbox: a.sandbox, Name: p.spec.Name, Command: "echo never"}, &res)
			a.owned("start_command", err)
			if ok && (!res.Existing || res.Process != p.id) {
				a.violation("a start by the name of %s (%s) in %s started %s (existing %v)", p.id, p.spec.Name, a.sandbox, res.Process, res.Existing)
			}
		}
	default:
		var res api.ListProcessesResult
		ok, err := a.call(ipc.OpListProcesses, api.SandboxRequest{Sandbox: a.sandbox}, &res)
		a.owned("list_processes", err)
		if !ok {
			return
		}
		listed := map[string]api.ProcessInfo{}
		for _, info := range res.Processes {
			listed[info.Process] = info
		}
		for _, p := range a.procs {
			info, found := listed[p.id]
			if !found {
				a.violation("process %s (%s) of %s is not listed: lost", p.id, p.spec.Name, a.sandbox)
				continue
			}
			a.checkInfo(p, info)
		}
	}
}

// startProc starts a process of a random kind, named for what it does.
func (a *agent) startProc(seq int) {
	var s procSpec
	switch k := rand.IntN(20); {
	case k < 10:
		s = procSpec{Kind: kindFinite, Lines: 50 + rand.IntN(350), Code: rand.IntN(6)}
	case k < 17:
		s = procSpec{Kind: kindInfinite, TimeoutS: 2 + rand.IntN(7)}
	default:
		s = procSpec{Kind: kindFlood, Lines: 3000 + rand.IntN(5000), Code: rand.IntN(6)}
	}
	s.Name = newSpecName(s.Kind, s.Lines, s.Code, s.TimeoutS, a.token, a.index, a.pid, seq)
	a.recordProc("intent %s", s.Name)
	var res api.StartCommandResult
	ok, err := a.call(ipc.OpStartCommand, api.StartCommandRequest{Sandbox: a.sandbox, Name: s.Name, Command: s.command(), TimeoutS: float64(s.TimeoutS)}, &res)
	a.owned("start_command", err)
	if !ok {
		return
	}
	if res.Existing {
		a.violation("a first start of %s in %s found a process already (%s)", s.Name, a.sandbox, res.Process)
	}
	a.recordProc("started %s %s", s.Name, res.Process)
	a.procs = append(a.procs, &soakProc{spec: s, id: res.Process, mine: true})
	if len(a.procs) > maxKnownProcs {
		a.procs = a.procs[1:]
	}
}

// follow reads a process's stdout on from where it was, a few times,
// waiting at its end for more, and checks every byte.
func (a *agent) follow(p *soakProc) {
	for range 3 {
		var r api.ReadOutputResult
		ok, err := a.call(ipc.OpReadOutput, api.ReadOutputRequest{Sandbox: a.sandbox, Process: p.id, Stream: "stdout", Offset: p.offset, WaitS: procFollowWait}, &r)
		a.owned("read_output", err)
		a.procError("read_output", p, err)
		if !ok {
			return
		}
		if why := judgeRead(p.spec, p.offset, r, p.spec.maxBytes()); why != "" {
			a.violation("process %s (%s) of %s: %s", p.id, p.spec.Name, a.sandbox, why)
			p.offset = r.NextOffset
			return
		}
		p.offset = r.NextOffset
		if !r.Running {
			a.checkEnd(p, r.Reason, r.ExitCode)
			if len(r.Data) == 0 {
				a.checkStreamEnd(p, r.NextOffset)
				return
			}
		} else {
			a.checkRunning(p)
		}
	}
}

// checkStreamEnd: a read that said the process ended and returned nothing
// more is at the end of its stream, or a follower stops short of its
// last bytes.
func (a *agent) checkStreamEnd(p *soakProc, next int64) {
	var info api.ProcessInfo
	ok, err := a.call(ipc.OpWaitProcess, api.WaitProcessRequest{Sandbox: a.sandbox, Process: p.id}, &info)
	a.owned("wait_process", err)
	if ok && !info.Running && info.StdoutBytes != next {
		a.violation("process %s (%s) of %s: a read at %d said it ended with nothing more, but its stdout has %d bytes: a follower stops short", p.id, p.spec.Name, a.sandbox, next, info.StdoutBytes)
	}
}

// checkInfo checks what the agent can of a process's description.
func (a *agent) checkInfo(p *soakProc, info api.ProcessInfo) {
	if info.Process != p.id || info.Name != p.spec.Name {
		a.violation("process %s (%s) of %s described as %s (%s)", p.id, p.spec.Name, a.sandbox, info.Process, info.Name)
	}
	if why := judgeBytes(p.spec, info); why != "" {
		a.violation("process %s (%s) of %s: %s", p.id, p.spec.Name, a.sandbox, why)
	}
	if !info.Running {
		a.checkEnd(p, info.Reason, info.ExitCode)
	} else {
		a.checkRunning(p)
	}
}

// checkRunning: a process reported running was never reported ended.
func (a *agent) checkRunning(p *soakProc) {
	if p.endSeen != "" {
		a.lostWithDaemon("was reported ended ("+p.endSeen+"), then running again", p)
		p.endSeen = ""
	}
}

// checkEnd checks an ended process's end as far as the agent knows: a
// reason and an exit code, and no sandbox_terminated in a sandbox that
// lives where processes survive the daemon. (The final check judges
// the rest, with every signal any incarnation sent.)
func (a *agent) checkEnd(p *soakProc, reason string, code *int) {
	p.ended = true
	switch {
	case code == nil || reason == "":
		a.violation("process %s (%s) of %s ended without an exit code or reason (%q)", p.id, p.spec.Name, a.sandbox, reason)
		return
	case reason == reasonTerminated:
		if p.endSeen == "" {
			a.lostWithDaemon("ended as sandbox_terminated in a sandbox that lives", p)
		}
	}
	if end := fmt.Sprintf("%s, exit code %d", reason, *code); p.endSeen != "" && p.endSeen != end {
		a.violation("process %s (%s) of %s was reported ended (%s), then ended again (%s)", p.id, p.spec.Name, a.sandbox, p.endSeen, end)
	}
	p.endSeen = fmt.Sprintf("%s, exit code %d", reason, *code)
}

// procError reports an error of a process op that is never right: the
// process unknown (lost), or a code but the ones allowed.
func (a *agent) procError(op string, p *soakProc, err error, allowed ...string) {
	var e *ipc.Error
	if !errors.As(err, &e) {
		return
	}
	switch {
	case e.Code == ipc.CodeProcessNotFound:
		a.violation("%s: process %s (%s) of %s is not found: lost", op, p.id, p.spec.Name, a.sandbox)
	case e.Code == ipc.CodeProcessEnded && contains(allowed, e.Code):
		p.ended = true
	case e.Code == ipc.CodeBadRequest || e.Code == ipc.CodeInternal:
		a.violation("%s on process %s of %s: %v", op, p.id, a.sandbox, err)
	}
}
