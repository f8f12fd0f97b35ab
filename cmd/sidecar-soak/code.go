package main

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// Code contexts in the soak. Each agent keeps a counter in a context of
// its owned sandbox (codeCounting): every cell adds one to it and shows
// the new value. The agent's record (codePath) says what it sent and what
// came back, across its incarnations, and each answer is judged against
// all of it: the context's state outlives the agent's kills, clients that
// go away, pauses, the daemon's SIGSTOPs and its kill -9 (a context is a
// process of the sandbox, re-attached like a durable one). Now and then
// the agent restarts the context (its count starts again), or runs a cell
// past its budget in another context (codeSpin): interrupted, that
// context lives on. At the end the soak runs one more counting cell in
// every owned sandbox and judges it against the whole record.

const (
	codeCounting = "count"
	codeSpin     = "spin"
	// countCell adds one to the context's counter and shows it.
	countCell = "n = globals().get('n', 0) + 1\nn"
	// spinCell runs well past spinBudget, in small sleeps an interrupt
	// ends.
	spinCell   = "import time\nfor _ in range(200):\n    time.sleep(0.05)"
	spinBudget = 0.3
)

// codePath is agent i's record of its counting cells.
func codePath(work string, i int) string { return filepath.Join(work, fmt.Sprintf("code-%d", i)) }

// codeLedger is what an agent's record says of its counting context. A
// cell whose answer never came (the agent or the daemon died, or the
// client gave up) may have run, or may still run later, at most once:
// pending counts the cells sent (the one being answered too) not yet
// accounted for by an answer.
type codeLedger struct {
	last    int  // the last answered value; 0 for a fresh context
	pending int  // cells sent and not yet accounted for by an answer
	reset   bool // a restart was asked for whose answer never came
	// tolerateLoss: the context need not survive the daemon's kill -9
	// (--expect-process-survival=false), so any answer may be a fresh
	// count.
	tolerateLoss bool

	// For the summary; tolerated: fresh counts only tolerateLoss allowed.
	answered, restarts, interrupted, tolerated int
}

// sent takes in a counting cell about to be sent.
func (l *codeLedger) sent() { l.pending++ }

// restartSent takes in a restart about to be asked for.
func (l *codeLedger) restartSent() { l.reset = true }

// restarted takes in a restart the daemon answered (or a cell that
// answered context_lost): the count starts again, and no earlier cell
// can run in the new context... except one still on its way (pending).
func (l *codeLedger) restarted() {
	l.last, l.reset = 0, false
	l.restarts++
}

// judge checks an answered counting cell's value v (the cell was taken
// in by sent) against the record and takes it in. "" when it holds.
func (l *codeLedger) judge(v int) string {
	l.answered++
	// v counts this cell, and the pending ones that ran before it.
	ran := 0
	switch {
	case v > l.last && v <= l.last+l.pending:
		ran = v - l.last
	case (l.reset || l.tolerateLoss) && v >= 1 && v <= l.pending:
		ran = v
		if !l.reset {
			l.tolerated++
		}
	default:
		why := fmt.Sprintf("the counting context answered %d after %d (%d cells unanswered since, a restart asked %v): its state was lost or a cell ran twice",
			v, l.last, l.pending-1, l.reset)
		l.last, l.pending, l.reset = v, 0, false
		return why
	}
	l.last, l.pending, l.reset = v, l.pending-ran, false
	return ""
}

// readCodeLedger replays an agent's record: "sent", "got V", "restart",
// "restarted" (also for a context reported lost).
func readCodeLedger(path string, tolerateLoss bool) (*codeLedger, error) {
	l := &codeLedger{tolerateLoss: tolerateLoss}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return l, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		word, arg, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		switch word {
		case "sent":
			l.sent()
		case "got":
			v, err := strconv.Atoi(arg)
			if err != nil {
				return nil, fmt.Errorf("%s: %q", path, sc.Text())
			}
			_ = l.judge(v) // judged when it came
		case "restart":
			l.restartSent()
		case "restarted":
			l.restarted()
		case "interrupted":
			l.interrupted++
		}
	}
	return l, sc.Err()
}

// judgeCodeError says whether an error a code request got is one the
// contract allows at any moment of the soak ("" when it is): a context
// busy with a cell an earlier incarnation left running, a sandbox busy
// or at its command quota, a daemon stopping; not_found is the owned
// check's.
func judgeCodeError(op string, err error) string {
	var e *ipc.Error
	if !errors.As(err, &e) {
		return ""
	}
	switch e.Code {
	case ipc.CodeContextBusy, ipc.CodeBusy, ipc.CodeQuotaExceeded, ipc.CodeShuttingDown, ipc.CodeNotFound:
		return ""
	}
	return fmt.Sprintf("%s: %v", op, err)
}

// cellValue is a cell's last result as an int, if it is one.
func cellValue(res api.RunCodeResult) (int, bool) {
	if len(res.Results) == 0 {
		return 0, false
	}
	text, _ := res.Results[len(res.Results)-1]["text/plain"].(string)
	v, err := strconv.Atoi(text)
	return v, err == nil
}

// codeStep runs a counting cell (mostly), a restart of the counting
// context, or a cell past its budget in the spinning one.
func (a *agent) codeStep() {
	switch k := rand.IntN(10); {
	case k == 0:
		a.recordCode("restart")
		a.code.restartSent()
		ok, err := a.call(ipc.OpRestartContext, api.ContextRequest{Sandbox: a.sandbox, Context: codeCounting}, nil)
		a.owned("restart_context", err)
		switch {
		case ok:
			a.recordCode("restarted")
			a.code.restarted()
		case ipc.IsCode(err, ipc.CodeContextNotFound):
			// Never used yet, or lost and not yet used again: nothing
			// to restart, and its next cell starts a fresh count.
			a.recordCode("restarted")
			a.code.restarted()
		default:
			if why := judgeCodeError("restart_context", err); why != "" {
				a.violation("sandbox %s: %s", a.sandbox, why)
			}
		}
	case k == 1:
		var res api.RunCodeResult
		ok, err := a.call(ipc.OpRunCode, api.RunCodeRequest{Sandbox: a.sandbox, Code: spinCell, Context: codeSpin, TimeoutS: spinBudget}, &res)
		a.owned("run_code", err)
		if why := judgeCodeError("run_code", err); why != "" {
			a.violation("sandbox %s: %s", a.sandbox, why)
		}
		if !ok {
			return
		}
		if !res.TimedOut || res.ContextLost || res.Error == nil || res.Error.Name != "KeyboardInterrupt" {
			a.violation("sandbox %s: a cell past its budget: timed_out %v, context_lost %v, error %+v, reason %q",
				a.sandbox, res.TimedOut, res.ContextLost, res.Error, res.Reason)
			return
		}
		a.recordCode("interrupted")
		a.code.interrupted++
	default:
		a.recordCode("sent")
		a.code.sent()
		var res api.RunCodeResult
		ok, err := a.call(ipc.OpRunCode, api.RunCodeRequest{Sandbox: a.sandbox, Code: countCell, Context: codeCounting, TimeoutS: 30}, &res)
		a.owned("run_code", err)
		if why := judgeCodeError("run_code", err); why != "" {
			a.violation("sandbox %s: %s", a.sandbox, why)
		}
		if !ok {
			return
		}
		if res.ContextLost {
			a.violation("sandbox %s: the counting context was lost running a cell that adds one (reason %q)", a.sandbox, res.Reason)
			a.recordCode("restarted")
			a.code.restarted()
			return
		}
		v, isInt := cellValue(res)
		if !isInt || res.Error != nil {
			a.violation("sandbox %s: a counting cell answered %+v, error %+v", a.sandbox, res.Results, res.Error)
			return
		}
		a.recordCode("got %d", v)
		if why := a.code.judge(v); why != "" {
			a.violation("sandbox %s: %s", a.sandbox, why)
		}
	}
}

func (a *agent) recordCode(format string, args ...any) {
	fmt.Fprintf(a.codeFile, format+"\n", args...)
}

// checkCodeAtEnd runs one more counting cell in each owned sandbox and
// judges it against its agent's whole record; it returns the violations
// and the summary's line.
func checkCodeAtEnd(d *daemon, work string, owned []string, survival bool) ([]string, string) {
	var bad []string
	var answered, restarts, interrupted, tolerated int
	for i, id := range owned {
		l, err := readCodeLedger(codePath(work, i), !survival)
		if err != nil {
			bad = append(bad, fmt.Sprintf("agent %d's code record: %v", i, err))
			continue
		}
		answered, restarts, interrupted, tolerated = answered+l.answered, restarts+l.restarts, interrupted+l.interrupted, tolerated+l.tolerated
		l.sent()
		var res api.RunCodeResult
		err = d.call(ipc.OpRunCode, api.RunCodeRequest{Sandbox: id, Code: countCell, Context: codeCounting, TimeoutS: 30}, &res)
		if err != nil {
			bad = append(bad, fmt.Sprintf("sandbox %s: the last counting cell: %v", id, err))
			continue
		}
		v, isInt := cellValue(res)
		if !isInt || res.ContextLost {
			bad = append(bad, fmt.Sprintf("sandbox %s: the last counting cell answered %+v (context_lost %v)", id, res.Results, res.ContextLost))
			continue
		}
		if why := l.judge(v); why != "" {
			bad = append(bad, fmt.Sprintf("sandbox %s at the end: %s", id, why))
		}
	}
	line := fmt.Sprintf("%d counting cells answered and judged, each context's count checked at the end; %d restarts; %d cells interrupted at their budget, their context kept",
		answered, restarts, interrupted)
	if !survival {
		line += fmt.Sprintf("; tolerated: %d counts started again", tolerated)
	}
	return bad, line
}
