package backend

import "time"

// Why a command ended, as ExecResult.Reason reports it.
const (
	ReasonExited            = "exited"
	ReasonTimedOut          = "timed_out"
	ReasonOOMKilled         = "oom_killed"
	ReasonSandboxTerminated = "sandbox_terminated"
)

// Facts are what a backend observed about how one command ended, and
// nothing it has concluded from them. Classify concludes.
type Facts struct {
	// ExitCode is the status of the process the backend waited for: the
	// command's own where the sandbox's init keeps the budget (bwrap,
	// gVisor), GNU timeout's where a command runs under it (sbx, host).
	ExitCode int
	// Elapsed is how long the command took, measured on the host around
	// it, so never less than the guest's own timeout measured.
	Elapsed time.Duration
	// Applied is the budget given to GNU timeout; KillAfter its
	// --kill-after (SIGTERM to SIGKILL).
	Applied, KillAfter time.Duration
	// OuterFired: the command outlived Applied+KillAfter and the daemon's
	// own deadline, so the backend killed it from outside.
	OuterFired bool
	// GuestTimedOut: the sandbox's init, which keeps the budget itself,
	// says it stopped the command at Applied (ExitCode is then 124, or 137
	// when it needed SIGKILL).
	GuestTimedOut bool
	// Ended: the backend learned how the command ended (an exit status).
	// A command whose end is unknown (its sandbox died under it) cannot
	// have timed out.
	Ended bool
	// Terminated: the sandbox is gone (destroyed while the command ran, or
	// it died); the command ended with it.
	Terminated bool
	// OOMCounted says the backend reads an OOM-kill counter for the
	// sandbox; OOMBefore and OOMAfter are its values around the command.
	OOMCounted          bool
	OOMBefore, OOMAfter uint64
}

// Outcome is what Facts mean, as ExecResult reports it.
type Outcome struct {
	TimedOut, OOMKilled, SandboxTerminated bool
	OOMKills                               uint64
}

// Classify decides why a command ended, the same way for every backend:
//
//   - sandbox_terminated when the sandbox is gone, whatever else happened;
//   - nothing else when the backend does not know how it ended;
//   - timed_out when the backend killed it from outside, the sandbox's init
//     says it stopped it at its budget, or GNU timeout says it did: 124 (the command died to its SIGTERM) once Applied has
//     elapsed, 137 (it had to SIGKILL) once Applied+KillAfter has. A
//     command can exit 124 by itself and an OOM kill is also 137, so
//     neither counts earlier;
//   - oom_killed when the sandbox's OOM counter rose during the command and
//     it ended by SIGKILL (137): the kernel killed it, or a process it was
//     waiting for. One that survived the OOM kill of a child reports its
//     own exit code, and OOMKills says how many were killed;
//   - exited otherwise.
//
// A counter that went back (the group was remade) counts no kills.
func Classify(f Facts) Outcome {
	var o Outcome
	if f.OOMCounted && f.OOMAfter > f.OOMBefore {
		o.OOMKills = f.OOMAfter - f.OOMBefore
	}
	switch {
	case f.Terminated:
		o.SandboxTerminated = true
	case !f.Ended:
	case f.OuterFired, f.GuestTimedOut:
		o.TimedOut = true
	case f.ExitCode == ExitTimedOut && f.Elapsed >= f.Applied:
		o.TimedOut = true
	case f.ExitCode == ExitKilled && f.Elapsed >= f.Applied+f.KillAfter:
		o.TimedOut = true
	case f.ExitCode == ExitKilled && o.OOMKills > 0:
		o.OOMKilled = true
	}
	return o
}

// Apply sets res's verdict fields from o.
func (o Outcome) Apply(res *ExecResult) {
	res.TimedOut, res.OOMKilled, res.SandboxTerminated, res.OOMKills = o.TimedOut, o.OOMKilled, o.SandboxTerminated, o.OOMKills
}

// Reason is one word for o: sandbox_terminated, timed_out, oom_killed or
// exited.
func (o Outcome) Reason() string {
	switch {
	case o.SandboxTerminated:
		return ReasonSandboxTerminated
	case o.TimedOut:
		return ReasonTimedOut
	case o.OOMKilled:
		return ReasonOOMKilled
	}
	return ReasonExited
}
