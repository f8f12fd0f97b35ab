package backendtest

import (
	"bytes"
	"strings"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// The code contexts' contract (backend.CodeRunner), for backends with
// Options.Code: the host's python3 runs the cells (the suite skips them
// where the sandbox has none).
var codeTests = []struct {
	name string
	fn   func(*suite)
}{
	{"CodeKeepsStateAndReturnsValues", testCodeState},
	{"CodeDisplaysRichResults", testCodeDisplay},
	{"CodeErrorsAndInterrupts", testCodeErrors},
	{"CodeContextsShareNothing", testCodeContexts},
	{"CodeContextLostOnlyItself", testCodeLost},
}

func (s *suite) code() backend.CodeRunner {
	s.Helper()
	c, ok := s.b.(backend.CodeRunner)
	if !ok {
		s.Fatalf("%T does not implement backend.CodeRunner", s.b)
	}
	return c
}

func (s *suite) cell(sb sandbox, context, code string, timeout time.Duration) backend.CodeResult {
	s.Helper()
	res, err := s.code().RunCode(s.ctx(), sb.id, backend.CodeRequest{Context: context, Code: code, Timeout: timeout, MaxOutputBytes: 1 << 20})
	if err != nil {
		s.Fatalf("RunCode(%q): %v", code, err)
	}
	return res
}

// text is the text/plain of a cell's last result.
func text(res backend.CodeResult) string {
	if len(res.Results) == 0 {
		return ""
	}
	s, _ := res.Results[len(res.Results)-1]["text/plain"].(string)
	return s
}

func testCodeState(s *suite) {
	sb := s.create(backend.Spec{})
	if res := s.cell(sb, "", "x = 41\nprint('set')", time.Minute); res.Error != nil || string(res.Stdout) != "set\n" || len(res.Results) != 0 || res.ExecutionCount != 1 {
		s.Fatalf("the first cell: %+v", res)
	}
	res := s.cell(sb, "", "x + 1", time.Minute)
	if text(res) != "42" || res.ExecutionCount != 2 || res.Error != nil {
		s.Errorf("x + 1 in the same context: %+v", res)
	}
	if res := s.cell(sb, "", "import os, subprocess; subprocess.run(['echo', 'from a child']); os.write(2, b'raw\\n'); None", time.Minute); string(res.Stdout) != "from a child\n" || string(res.Stderr) != "raw\n" || len(res.Results) != 0 {
		s.Errorf("a subprocess's output and a raw write: %+v", res)
	}
	if res := s.cell(sb, "", "_ * 2", time.Minute); text(res) != "84" {
		s.Errorf("_ is the last value: %+v", res)
	}
	list, err := s.code().ListContexts(s.ctx(), sb.id)
	if err != nil || len(list) != 1 || list[0].Name != backend.DefaultContext || list[0].ExecutionCount != 4 {
		s.Errorf("ListContexts: %+v %v", list, err)
	}
}

func testCodeDisplay(s *suite) {
	sb := s.create(backend.Spec{})
	code := `
class Rich:
    def _repr_html_(self): return "<b>rich</b>"
    def _repr_png_(self): return b"\x89PNG fake"
    def __repr__(self): return "Rich()"
display(Rich())
display("plain", {"k": 1})
Rich()
`
	res := s.cell(sb, "", code, time.Minute)
	if res.Error != nil || len(res.Results) != 4 {
		s.Fatalf("display and a rich value: %+v", res)
	}
	first := res.Results[0]
	if first["text/html"] != "<b>rich</b>" || first["text/plain"] != "Rich()" || !bytes.Equal(asBytes(first["image/png"]), []byte("\x89PNG fake")) {
		s.Errorf("a rich object's bundle: %+v", first)
	}
	if res.Results[1]["text/plain"] != "'plain'" || res.Results[2]["text/plain"] != "{'k': 1}" {
		s.Errorf("plain values in order: %+v", res.Results[1:3])
	}
	if res.Results[3]["text/html"] != "<b>rich</b>" {
		s.Errorf("the value last: %+v", res.Results[3])
	}
	mime := s.cell(sb, "", `
class M:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/markdown": "**md**", "application/json": {"a": [1, 2]}}
M()`, time.Minute)
	if len(mime.Results) != 1 || mime.Results[0]["text/markdown"] != "**md**" || mime.Results[0]["application/json"] == nil {
		s.Errorf("_repr_mimebundle_: %+v", mime)
	}
}

func asBytes(v any) []byte {
	b, _ := v.([]byte)
	return b
}

func testCodeErrors(s *suite) {
	sb := s.create(backend.Spec{})
	res := s.cell(sb, "", "y = 1\n1/0", time.Minute)
	if res.Error == nil || res.Error.Name != "ZeroDivisionError" || !strings.Contains(strings.Join(res.Error.Traceback, ""), "1/0") {
		s.Errorf("an exception: %+v", res.Error)
	}
	if res := s.cell(sb, "", "y", time.Minute); text(res) != "1" {
		s.Errorf("what ran before the exception stays: %+v", res)
	}
	if res := s.cell(sb, "", "def (", time.Minute); res.Error == nil || res.Error.Name != "SyntaxError" {
		s.Errorf("a syntax error: %+v", res.Error)
	}
	// A cell past its budget is interrupted; its context lives on.
	start := time.Now()
	res = s.cell(sb, "", "import time\nz = 7\nwhile True: time.sleep(0.05)", 500*time.Millisecond)
	if !res.TimedOut || res.ContextLost || res.Error == nil || res.Error.Name != "KeyboardInterrupt" {
		s.Errorf("an interrupted cell: %+v", res)
	}
	if took := time.Since(start); took > 500*time.Millisecond+s.opts.KillGrace+s.opts.Slack {
		s.Errorf("the interrupt took %v", took)
	}
	if res := s.cell(sb, "", "z + y", time.Minute); text(res) != "8" || res.ContextLost {
		s.Errorf("the context after an interrupt: %+v", res)
	}
}

func testCodeContexts(s *suite) {
	sb := s.create(backend.Spec{})
	s.cell(sb, "a", "secret = 'a'\nimport random\nr = random.random()", time.Minute)
	res := s.cell(sb, "b", "import random\n(globals().get('secret'), random.random())", time.Minute)
	if !strings.HasPrefix(text(res), "(None, ") {
		s.Errorf("context b sees a's variables: %q", text(res))
	}
	ra := s.cell(sb, "a", "r", time.Minute)
	if text(ra) == "" || strings.Contains(text(res), text(ra)) {
		s.Errorf("two forks drew the same random number: a %q, b %q", text(ra), text(res))
	}
	if err := s.code().DeleteContext(s.ctx(), sb.id, "a"); err != nil {
		s.Fatalf("DeleteContext: %v", err)
	}
	if res := s.cell(sb, "a", "globals().get('secret')", time.Minute); len(res.Results) != 0 || res.ExecutionCount != 1 {
		s.Errorf("a deleted context starts afresh: %+v", res)
	}
	wantErr(s, "deleting an unknown context", s.code().DeleteContext(s.ctx(), sb.id, "nope"), backend.ErrContextNotFound)
}

func testCodeLost(s *suite) {
	sb := s.create(backend.Spec{})
	s.cell(sb, "victim", "v = 1", time.Minute)
	s.cell(sb, "other", "o = 2", time.Minute)
	// A cell that ignores the interrupt is killed at the grace: only its
	// context is lost.
	res := s.cell(sb, "victim", "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: time.sleep(0.05)", 300*time.Millisecond)
	if !res.ContextLost || !res.TimedOut {
		s.Errorf("a cell that ignores its interrupt: %+v", res)
	}
	if res := s.cell(sb, "victim", "globals().get('v')", time.Minute); len(res.Results) != 0 || res.ContextLost {
		s.Errorf("the lost context starts afresh: %+v", res)
	}
	if res := s.cell(sb, "other", "o", time.Minute); text(res) != "2" {
		s.Errorf("the other context lives on: %+v", res)
	}
	if out := s.runOK(sb, "echo still"); out != "still\n" {
		s.Errorf("the sandbox after a lost context: %q", out)
	}
	// A command's clean-up (it kills what the command left) spares the
	// contexts.
	if res := s.cell(sb, "other", "o + 1", time.Minute); text(res) != "3" {
		s.Errorf("a context after a command: %+v", res)
	}
}
