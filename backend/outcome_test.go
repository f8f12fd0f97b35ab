package backend

import (
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	const s = time.Second
	ended := func(code int, elapsed time.Duration) Facts {
		return Facts{ExitCode: code, Elapsed: elapsed, Applied: s, KillAfter: 2 * s, Ended: true}
	}
	oom := func(f Facts, before, after uint64) Facts {
		f.OOMCounted, f.OOMBefore, f.OOMAfter = true, before, after
		return f
	}
	cases := []struct {
		name   string
		facts  Facts
		reason string
		kills  uint64
	}{
		{"finished", ended(0, 10*time.Millisecond), ReasonExited, 0},
		{"finished slowly", ended(0, 5*s), ReasonExited, 0},
		{"ordinary failure after the budget", ended(1, 1100*time.Millisecond), ReasonExited, 0},
		{"SIGTERM after the budget", ended(124, 1100*time.Millisecond), ReasonTimedOut, 0},
		{"the command exited 124 itself", ended(124, 10*time.Millisecond), ReasonExited, 0},
		{"SIGKILL after budget and kill-after", ended(137, 3100*time.Millisecond), ReasonTimedOut, 0},
		{"137 during the kill-after grace is not timeout's", ended(137, 1500*time.Millisecond), ReasonExited, 0},
		{"kill -9 before the budget", ended(137, 10*time.Millisecond), ReasonExited, 0},
		{"143 after the budget is the command's own", ended(143, 5*s), ReasonExited, 0},
		{"the daemon killed it from outside", func() Facts { f := ended(143, 9*s); f.OuterFired = true; return f }(), ReasonTimedOut, 0},
		{"outer deadline but the end is unknown", Facts{Applied: s, OuterFired: true}, ReasonExited, 0},
		{"end unknown, 124 after the budget", Facts{ExitCode: 124, Elapsed: 2 * s, Applied: s}, ReasonExited, 0},
		{"OOM-killed", oom(ended(137, 10*time.Millisecond), 3, 4), ReasonOOMKilled, 1},
		{"137 without an OOM kill", oom(ended(137, 10*time.Millisecond), 0, 0), ReasonExited, 0},
		{"a child OOM-killed, the command went on", oom(ended(1, 10*time.Millisecond), 3, 5), ReasonExited, 2},
		{"timed out with an OOM kill on the way", oom(ended(137, 4*s), 0, 1), ReasonTimedOut, 1},
		{"timed out by SIGTERM", oom(ended(124, 2*s), 0, 0), ReasonTimedOut, 0},
		{"a counter that went back (group remade)", oom(ended(137, 10*time.Millisecond), 5, 2), ReasonExited, 0},
		{"a counter the backend does not read", func() Facts { f := ended(137, 10*time.Millisecond); f.OOMAfter = 9; return f }(), ReasonExited, 0},
		{"sandbox destroyed under it", Facts{ExitCode: 137, Elapsed: 4 * s, Applied: s, Ended: true, Terminated: true}, ReasonSandboxTerminated, 0},
		{"sandbox died, OOM kills still counted", oom(Facts{Terminated: true}, 1, 3), ReasonSandboxTerminated, 2},
	}
	for _, tc := range cases {
		o := Classify(tc.facts)
		if o.Reason() != tc.reason || o.OOMKills != tc.kills {
			t.Errorf("%s: Classify(%+v) = %+v (%s), want %s with %d OOM kills", tc.name, tc.facts, o, o.Reason(), tc.reason, tc.kills)
		}
		var res ExecResult
		o.Apply(&res)
		if res.Reason() != o.Reason() || res.OOMKills != o.OOMKills {
			t.Errorf("%s: Apply gives %+v, reason %s", tc.name, res, res.Reason())
		}
	}
}
