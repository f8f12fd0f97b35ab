package backendtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
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
	{"CodeRestartKeepsTheContextFresh", testCodeRestart},
	{"CodeContextLostOnlyItself", testCodeLost},
	{"CodeRendersDataFramesAndFigures", testCodeLibraries},
	{"CodePreloadsAndReseeds", testCodePreload},
	{"CodeFloodsStayBounded", testCodeFloods},
	{"CodeOutOfMemoryLosesOnlyItsContext", testCodeOutOfMemory},
	{"CodeChildrenOutliveTheirCell", testCodeChildren},
	{"CodeCellCannotForgeAnothersResults", testCodeForgery},
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

// cellReq runs req in sb (a minute's budget and 1 MiB unless it says).
func (s *suite) cellReq(sb sandbox, req backend.CodeRequest) backend.CodeResult {
	s.Helper()
	if req.Timeout == 0 {
		req.Timeout = time.Minute
	}
	if req.MaxOutputBytes == 0 {
		req.MaxOutputBytes = 1 << 20
	}
	res, err := s.code().RunCode(s.ctx(), sb.id, req)
	if err != nil {
		s.Fatalf("RunCode(%q in %q): %v", req.Code, req.Context, err)
	}
	return res
}

// longCell is cellReq for a cell given within, past the suite's
// operation timeout.
func (s *suite) longCell(sb sandbox, within time.Duration, req backend.CodeRequest) backend.CodeResult {
	s.Helper()
	req.Timeout = within
	ctx, cancel := context.WithTimeout(s.Context(), within+time.Minute)
	defer cancel()
	res, err := s.code().RunCode(ctx, sb.id, req)
	if err != nil {
		s.Fatalf("RunCode(%q in %q): %v", req.Code, req.Context, err)
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
	// A cell past its budget is interrupted; its context lives on. (What
	// the budgeted cell needs is set by the cell before it: an interrupt
	// that came before the loop would prove nothing.)
	s.cell(sb, "", "import time\nz = 7", time.Minute)
	start := time.Now()
	res = s.cell(sb, "", "while True: time.sleep(0.05)", 500*time.Millisecond)
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

// A restarted context is still listed, idle and at execution_count 0;
// its variables, working directory and environment changes are gone, and
// its next cell is its first, in the interpreter as the context was made
// (the sandbox's environment and working directory). A cell it runs ends
// with its context lost; the other contexts are untouched.
func testCodeRestart(s *suite) {
	sb := s.create(backend.Spec{Env: map[string]string{"SPEC_VAR": "spec"}})
	const probe = "import os\n('x' in globals(), os.getcwd(), os.environ.get('SPEC_VAR'), 'ADDED' in os.environ)"
	made := s.cell(sb, "a", probe, time.Minute)
	if !strings.HasPrefix(text(made), "(False, '/") || !strings.HasSuffix(text(made), ", 'spec', False)") {
		s.Fatalf("a new context: %+v", made)
	}
	s.cell(sb, "a", "import os, tempfile\nx = 41\nos.environ['ADDED'] = '1'\nos.chdir(tempfile.gettempdir())", time.Minute)
	s.cell(sb, "other", "o = 1", time.Minute)
	if res := s.cell(sb, "a", probe, time.Minute); text(res) == text(made) {
		s.Fatalf("the cell that changed the context changed nothing: %+v", res)
	}
	if err := s.code().RestartContext(s.ctx(), sb.id, "a"); err != nil {
		s.Fatalf("RestartContext: %v", err)
	}
	list, err := s.code().ListContexts(s.ctx(), sb.id)
	if err != nil {
		s.Fatalf("ListContexts: %v", err)
	}
	want := []backend.ContextInfo{{Name: "a"}, {Name: "other", ExecutionCount: 1}}
	if fmt.Sprint(list) != fmt.Sprint(want) {
		s.Errorf("the contexts after a restart: %+v, want %+v", list, want)
	}
	if res := s.cell(sb, "a", probe, time.Minute); text(res) != text(made) || res.ExecutionCount != 1 || res.ContextLost {
		s.Errorf("a restarted context's first cell: %+v, want %s at execution_count 1", res, text(made))
	}
	if res := s.cell(sb, "other", "o", time.Minute); text(res) != "1" || res.ExecutionCount != 2 {
		s.Errorf("the other context after a restart: %+v", res)
	}

	// A restart while a cell runs: the cell ends with its context lost,
	// and the context stays, fresh.
	ran := make(chan backend.CodeResult, 1)
	go func() {
		res, err := s.code().RunCode(s.ctx(), sb.id, backend.CodeRequest{Context: "a", Code: "y = 1\nimport time\nwhile True: time.sleep(0.05)", Timeout: time.Minute, MaxOutputBytes: 1 << 20})
		if err != nil {
			s.Errorf("the cell running at the restart: %v", err)
		}
		ran <- res
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		list, err := s.code().ListContexts(s.ctx(), sb.id)
		if err != nil {
			s.Fatalf("ListContexts: %v", err)
		}
		if len(list) == 2 && list[0].Running {
			break
		}
		if time.Now().After(deadline) {
			s.Fatalf("the cell did not start: %+v", list)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := s.code().RestartContext(s.ctx(), sb.id, "a"); err != nil {
		s.Fatalf("RestartContext of a running context: %v", err)
	}
	select {
	case res := <-ran:
		if !res.ContextLost || res.TimedOut {
			s.Errorf("the cell running at the restart: %+v, want its context lost", res)
		}
	case <-time.After(time.Minute):
		s.Fatalf("the cell running at the restart did not end")
	}
	if list, err := s.code().ListContexts(s.ctx(), sb.id); err != nil || fmt.Sprint(list) != fmt.Sprint([]backend.ContextInfo{{Name: "a"}, {Name: "other", ExecutionCount: 2}}) {
		s.Errorf("the contexts after a running context's restart: %+v, %v", list, err)
	}
	if res := s.cell(sb, "a", "'y' in globals()", time.Minute); text(res) != "False" || res.ExecutionCount != 1 {
		s.Errorf("the context after a running cell's restart: %+v", res)
	}
	wantErr(s, "restarting an unknown context", s.code().RestartContext(s.ctx(), sb.id, "nope"), backend.ErrContextNotFound)
	wantErr(s, "restarting a context of a bad name", s.code().RestartContext(s.ctx(), sb.id, "a b"), backend.ErrContextNotFound)
}

func testCodeLost(s *suite) {
	sb := s.create(backend.Spec{})
	s.cell(sb, "victim", "v = 1", time.Minute)
	s.cell(sb, "other", "o = 2", time.Minute)
	// A cell that ignores the interrupt is killed at the grace: only its
	// context is lost. The handler is set by a cell before the budgeted
	// one, so an interrupt cannot come before it.
	s.cell(sb, "victim", "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)", time.Minute)
	res := s.cell(sb, "victim", "while True: time.sleep(0.05)", 300*time.Millisecond)
	if !res.ContextLost || !res.TimedOut {
		s.Errorf("a cell that ignores its interrupt: %+v", res)
	}
	if res := s.cell(sb, "victim", "globals().get('v')", time.Minute); len(res.Results) != 0 || res.ContextLost || res.ExecutionCount != 1 {
		s.Errorf("the lost context starts afresh: %+v", res)
	}
	// So is one that catches each interrupt and goes on.
	s.cell(sb, "victim", "v = 2\nimport time\ndef spin():\n    while True:\n        try:\n            time.sleep(0.05)\n        except KeyboardInterrupt:\n            pass", time.Minute)
	res = s.cell(sb, "victim", "spin()", 300*time.Millisecond)
	if !res.ContextLost || !res.TimedOut || res.OOMKilled || res.Reason() != "timed_out" {
		s.Errorf("a cell that catches its interrupts: %+v", res)
	}
	if res := s.cell(sb, "victim", "globals().get('v')", time.Minute); len(res.Results) != 0 || res.ContextLost || res.ExecutionCount != 1 {
		s.Errorf("the lost context starts afresh at execution_count 1: %+v", res)
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

// codeLibraries are what the rendering tests need in the sandbox.
var codeLibraries = []string{"numpy", "pandas", "matplotlib"}

// needLibraries fails the test when the sandbox lacks codeLibraries and
// the options say it has them, and skips it otherwise.
func (s *suite) needLibraries(sb sandbox) {
	s.Helper()
	res := s.cell(sb, "probe", fmt.Sprintf("import importlib.util\n[m for m in %s if importlib.util.find_spec(m) is None]", pyList(codeLibraries)), time.Minute)
	if err := s.code().DeleteContext(s.ctx(), sb.id, "probe"); err != nil {
		s.Fatalf("DeleteContext(probe): %v", err)
	}
	if missing := text(res); missing != "[]" {
		if s.opts.CodeLibraries {
			s.Fatalf("the sandbox's python3 lacks %s (Options.CodeLibraries says it has them): %+v", missing, res)
		}
		s.Skipf("the sandbox's python3 lacks %s", missing)
	}
}

// pyList is names as a Python list of strings.
func pyList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// pngMagic starts every PNG file.
const pngMagic = "\x89PNG\r\n\x1a\n"

func testCodeLibraries(s *suite) {
	sb := s.create(backend.Spec{})
	s.needLibraries(sb)
	// A DataFrame's value: HTML and text, as a notebook shows it.
	res := s.cell(sb, "", `import pandas as pd
df = pd.DataFrame({"city": ["Oslo", "Lima"], "temp": [3.5, 19.0]})
df`, time.Minute)
	if res.Error != nil || len(res.Results) != 1 {
		s.Fatalf("a DataFrame's value: %+v", res)
	}
	html, _ := res.Results[0]["text/html"].(string)
	plain, _ := res.Results[0]["text/plain"].(string)
	if !strings.Contains(html, "<table") || !strings.Contains(html, "Oslo") || !strings.Contains(plain, "city") || !strings.Contains(plain, "Lima") {
		s.Errorf("a DataFrame's bundle: text/html %q, text/plain %q", html, plain)
	}
	// A figure left open at the end of a cell comes back as a PNG after
	// what the cell displayed, and is closed.
	res = s.cell(sb, "", `import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot([1, 2, 3], [2, 4, 1])
display("before the figure")`, time.Minute)
	if res.Error != nil || len(res.Results) != 2 {
		s.Fatalf("a cell that leaves a figure open: %+v", res)
	}
	png := asBytes(res.Results[1]["image/png"])
	if res.Results[0]["text/plain"] != "'before the figure'" || !bytes.HasPrefix(png, []byte(pngMagic)) || len(png) < 1000 {
		s.Errorf("the figure: %d bytes of image/png starting %q, bundles %d", len(png), png[:min(len(png), 8)], len(res.Results))
	}
	if t, _ := res.Results[1]["text/plain"].(string); !strings.Contains(t, "Figure") {
		s.Errorf("the figure's text/plain: %q", t)
	}
	if res := s.cell(sb, "", "plt.get_fignums()", time.Minute); text(res) != "[]" || len(res.Results) != 1 {
		s.Errorf("the figure was not closed: %+v", res)
	}
	// Several objects in one display, in order, then the value.
	res = s.cell(sb, "", `display(df.head(1), pd.Series([7], name="s"), "three")
df.shape`, time.Minute)
	if res.Error != nil || len(res.Results) != 4 {
		s.Fatalf("display of three objects and a value: %+v", res)
	}
	first, _ := res.Results[0]["text/html"].(string)
	second, _ := res.Results[1]["text/plain"].(string)
	if !strings.Contains(first, "<table") || !strings.Contains(second, "Name: s") || res.Results[2]["text/plain"] != "'three'" || text(res) != "(2, 2)" {
		s.Errorf("display's bundles out of order: %+v", res.Results)
	}
}

func testCodePreload(s *suite) {
	sb := s.create(backend.Spec{})
	if s.opts.CodeLibraries {
		s.needLibraries(sb)
	}
	// A fresh context's first cell sees nothing of what the zygote and
	// the spare it was ran before it (the warm-ups of the preloaded
	// modules among them): a namespace of two names, no `_`, count 1.
	if res := s.cell(sb, "bare", "sorted(globals()), hasattr(__builtins__, '_')", time.Minute); text(res) != "(['__builtins__', '__name__'], False)" || res.ExecutionCount != 1 || res.Error != nil {
		s.Errorf("a fresh context's first cell saw more than a fresh namespace: %+v", res)
	}
	if len(s.opts.CodePreload) > 0 {
		// A fresh context's first cell, before it imports anything: what
		// the zygote imported is there, each module the sandbox has.
		// Where pandas is, the zygote's warm-ups showed a DataFrame: the
		// module pandas imports on its first HTML is imported.
		res := s.cell(sb, "fresh", fmt.Sprintf(`import sys, importlib.util
mods = %s
loaded = [m for m in mods if m in sys.modules]
loaded == [m for m in mods if importlib.util.find_spec(m) is not None], loaded, "pandas.io.formats.html" in sys.modules`, pyList(s.opts.CodePreload)), time.Minute)
		if !strings.HasPrefix(text(res), "(True, ") || res.ExecutionCount != 1 {
			s.Errorf("the preloaded modules in a fresh context (imported, all there are): %+v", res)
		}
		if s.opts.CodeLibraries && strings.Contains(pyList(s.opts.CodePreload), `"pandas"`) {
			if !strings.Contains(text(res), "'pandas'") {
				s.Errorf("pandas is preloaded and in the sandbox, yet not imported in a fresh context: %s", text(res))
			}
			if !strings.HasSuffix(text(res), ", True)") {
				s.Errorf("pandas is preloaded, yet the zygote did not warm it up (its HTML formatter not imported): %s", text(res))
			}
		}
	}
	// Two forks of one zygote draw their own numbers: Python's random
	// and, where it is, numpy's global generator (preloaded, its state is
	// the zygote's until the fork reseeds it).
	const draw = `import random
r = [random.getrandbits(62)]
try:
    import numpy
    r.append(int(numpy.random.randint(0, 2**62)))
except ImportError:
    pass
r`
	a, b := text(s.cell(sb, "a", draw, time.Minute)), text(s.cell(sb, "b", draw, time.Minute))
	as, bs := strings.Split(strings.Trim(a, "[]"), ", "), strings.Split(strings.Trim(b, "[]"), ", ")
	if len(as) != len(bs) || as[0] == "" || (s.opts.CodeLibraries && len(as) != 2) {
		s.Fatalf("draws: a %q, b %q", a, b)
	}
	for i := range as {
		if as[i] == bs[i] {
			s.Errorf("two contexts drew the same number (generator %d of random, numpy): a %q, b %q", i, a, b)
		}
	}
}

func testCodeFloods(s *suite) {
	sb := s.create(backend.Spec{})
	const maxOut = 1 << 20
	count := 0
	next := func(what string, res backend.CodeResult) {
		s.Helper()
		count++
		if res.ExecutionCount != count || res.ContextLost {
			s.Fatalf("%s: execution_count %d (want %d), context_lost %v", what, res.ExecutionCount, count, res.ContextLost)
		}
	}
	// A gibibyte to stdout, half through sys.stdout, half to descriptor 1:
	// the tail is kept, the rest dropped as it is read. Its time is not
	// what is tested: through gVisor's sentry, under -race and a loaded
	// CI host, the gibibyte took over a minute.
	res := s.longCell(sb, 4*time.Minute, backend.CodeRequest{Code: `import os, sys
chunk = "x" * (1 << 20)
for i in range(512):
    sys.stdout.write(chunk)
sys.stdout.flush()
raw = b"y" * (1 << 20)
for i in range(512):
    os.write(1, raw)
print("end")
"flooded"`, MaxOutputBytes: maxOut})
	next("a gibibyte to stdout", res)
	if !res.StdoutTruncated || len(res.Stdout) > maxOut || !bytes.HasSuffix(res.Stdout, []byte("yyyyend\n")) || text(res) != "'flooded'" || res.Error != nil {
		s.Errorf("a gibibyte to stdout: truncated %v, %d bytes kept ending %q, value %q, error %+v", res.StdoutTruncated, len(res.Stdout), res.Stdout[max(len(res.Stdout)-16, 0):], text(res), res.Error)
	}
	// A value whose repr is 200 MiB: its text/plain is cut, and says so.
	res = s.cellReq(sb, backend.CodeRequest{Code: `class Huge:
    def __repr__(self):
        return "y" * (200 << 20)
Huge()`, MaxOutputBytes: 8 << 20})
	next("a 200 MiB repr", res)
	if v := text(res); !res.ResultsTruncated || len(v) == 0 || len(v) > 4<<20 || strings.Trim(v, "y") != "" {
		s.Errorf("a 200 MiB repr: results_truncated %v, text/plain of %d bytes", res.ResultsTruncated, len(v))
	}
	// An image of 200 MiB is left out; the bundle keeps its text.
	res = s.cellReq(sb, backend.CodeRequest{Code: `class Giant:
    def _repr_png_(self):
        return b"\x89PNG\r\n\x1a\n" + bytes(200 << 20)
    def __repr__(self):
        return "Giant()"
Giant()`, MaxOutputBytes: 8 << 20})
	next("a 200 MiB image", res)
	if !res.ResultsTruncated || len(res.Results) != 1 || text(res) != "Giant()" || res.Results[0]["image/png"] != nil {
		s.Errorf("a 200 MiB image: %+v", res)
	}
	// Ten thousand displays: the first ones are kept, in order, the rest
	// said to be left out; the value still comes last.
	res = s.cellReq(sb, backend.CodeRequest{Code: "for i in range(10000):\n    display(i)\n'after'", MaxOutputBytes: maxOut})
	next("ten thousand displays", res)
	if !res.ResultsTruncated || len(res.Results) < 2 || len(res.Results) > 1000 || text(res) != "'after'" {
		s.Fatalf("ten thousand displays: %d bundles, results_truncated %v, last %q", len(res.Results), res.ResultsTruncated, text(res))
	}
	for i, b := range res.Results[:len(res.Results)-1] {
		if b["text/plain"] != strconv.Itoa(i) {
			s.Fatalf("display %d came back as %v", i, b)
		}
	}
	next("the context after the floods", s.cell(sb, "", "'alive'", time.Minute))
	if out := s.runOK(sb, "echo still"); out != "still\n" {
		s.Errorf("the sandbox after the floods: %q", out)
	}
}

func testCodeOutOfMemory(s *suite) {
	id := newID()
	_, err := s.b.Create(s.ctx(), id, backend.Spec{Resources: backend.Resources{MemoryBytes: 256 << 20}})
	if errors.Is(err, backend.ErrSpecUnenforceable) {
		s.Skipf("the backend, as configured, enforces no memory limit: %v", err)
	}
	if err != nil {
		s.Fatalf("Create with a 256 MiB memory limit: %v", err)
	}
	s.Cleanup(func() { _ = s.b.Destroy(context.Background(), id) })
	sb := sandbox{id: id}
	s.cell(sb, "other", "kept = 'other'", time.Minute)
	s.cell(sb, "hog", "small = 1", time.Minute)
	res := s.cell(sb, "hog", "big = bytearray(1 << 30)", time.Minute)
	if !res.ContextLost || !res.OOMKilled || res.TimedOut || res.Reason() != "oom_killed" {
		s.Errorf("a cell past the sandbox's memory: %+v (reason %s)", res, res.Reason())
	}
	other, err := s.code().RunCode(s.ctx(), sb.id, backend.CodeRequest{Context: "other", Code: "kept", Timeout: time.Minute, MaxOutputBytes: 1 << 20})
	if err != nil {
		s.Fatalf("the other context after the OOM kill: %v", err)
	}
	if text(other) != "'other'" || other.ExecutionCount != 2 {
		s.Errorf("the other context after the OOM kill: %+v", other)
	}
	if res := s.cell(sb, "hog", "'small' in globals()", time.Minute); text(res) != "False" || res.ExecutionCount != 1 {
		s.Errorf("the lost context starts afresh: %+v", res)
	}
	if out := s.runOK(sb, "echo still"); out != "still\n" {
		s.Errorf("the sandbox after the OOM kill: %q", out)
	}
}

func testCodeChildren(s *suite) {
	sb := s.create(backend.Spec{})
	// A child forked by a cell that comes back out of the cell's code is
	// no context: it ends there, and only the context answers.
	res := s.cell(sb, "", "import os\npid = os.fork()\n'child' if pid == 0 else 'parent'", time.Minute)
	if text(res) != "'parent'" || len(res.Results) != 1 || res.ContextLost || res.ExecutionCount != 1 {
		s.Errorf("a cell that forks: %+v", res)
	}
	// A child that outlives its cell, writing on: the cell comes back, the
	// next cell's output is its own, and the child ends with its context.
	res = s.cell(sb, "", `import os, time
if os.fork() == 0:
    open("child.tmp", "w").write(str(os.getpid()))
    os.rename("child.tmp", "child.pid")
    while True:
        try:
            os.write(1, b"late\n")
        except OSError:
            pass
        time.sleep(0.02)
while not os.path.exists("child.pid"):
    time.sleep(0.01)
"parent"`, time.Minute)
	if text(res) != "'parent'" || res.ContextLost || res.ExecutionCount != 2 {
		s.Errorf("a cell whose child outlives it: %+v", res)
	}
	child := strings.TrimSpace(s.runOK(sb, "cat child.pid"))
	if res := s.cell(sb, "", "print('next')", time.Minute); string(res.Stdout) != "next\n" || res.ExecutionCount != 3 {
		s.Errorf("the next cell's output: %q (count %d)", res.Stdout, res.ExecutionCount)
	}
	if out := s.runOK(sb, "kill -0 "+child+" && echo running"); out != "running\n" {
		s.Errorf("the child did not outlive its cell: %q", out)
	}
	if err := s.code().DeleteContext(s.ctx(), sb.id, backend.DefaultContext); err != nil {
		s.Fatalf("DeleteContext: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.run(sb, "kill -0 "+child).ExitCode == 0 {
		if time.Now().After(deadline) {
			s.Fatalf("the child %s of a deleted context still runs", child)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// forgeries are cells that attack their own context's plumbing.
const (
	// forgeFrames writes frames on the cell's own results stream (a
	// stream socket): a display, a "done" with a count of 99, and then a
	// frame that says it is 4 GiB long.
	forgeFrames = `import os, socket, struct, json
def frame(m):
    b = json.dumps(m).encode()
    return struct.pack(">I", len(b)) + b
for fd in range(3, 64):
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        continue
    if s.type == socket.SOCK_STREAM:
        s.sendall(frame({"t": "display", "data": {"text/plain": "forged"}}) + frame({"t": "done", "count": 99, "error": None, "dropped": 0}) + b"\xff\xff\xff\xff")
    s.detach()
"real"`
	// forgeDone says "done 99" on the context's control socket (a
	// seqpacket socket) while its cell runs.
	forgeDone = `import os, socket
for fd in range(3, 64):
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        continue
    if s.type == socket.SOCK_SEQPACKET:
        s.send(b"done 99")
    s.detach()
"real"`
)

func testCodeForgery(s *suite) {
	sb := s.create(backend.Spec{})
	s.cell(sb, "other", "secret = 'other'", time.Minute)
	s.cell(sb, "", "x = 1", time.Minute)
	// Frames on its own results stream: only its own cell's results are
	// what it wrote; the count is the agent's, the rest is left out.
	res := s.cell(sb, "", forgeFrames, time.Minute)
	if res.ExecutionCount != 2 || res.ContextLost || !res.ResultsTruncated {
		s.Errorf("a cell that forged its results: %+v", res)
	}
	if res := s.cell(sb, "", "x", time.Minute); text(res) != "1" || len(res.Results) != 1 || res.ResultsTruncated || res.ExecutionCount != 3 {
		s.Errorf("the cell after a forgery: %+v", res)
	}
	// Closed and replaced standard streams and a closed results stream:
	// its own cell's output and results are gone; the next cell's are not.
	res = s.cell(sb, "", `import os, sys
sys.stdout.close()
sys.stderr = None
import socket
for fd in range(3, 64):
    try:
        s = socket.socket(fileno=fd)
    except OSError:
        continue
    kind = s.type
    s.detach()
    if kind == socket.SOCK_STREAM:
        os.close(fd)
os.close(1)
os.close(2)
"unseen"`, time.Minute)
	if res.ContextLost || res.ExecutionCount != 4 || !res.ResultsTruncated {
		s.Errorf("a cell that closed its streams: %+v", res)
	}
	if res := s.cell(sb, "", "import sys, os\nprint('out')\nos.write(2, b'err')\nx + 1", time.Minute); string(res.Stdout) != "out\n" || string(res.Stderr) != "err" || text(res) != "2" || res.ExecutionCount != 5 {
		s.Errorf("the cell after closed streams: %+v", res)
	}
	// "done" on its own control socket: the agent did not expect it, and
	// the context is lost; it never answers for another cell.
	res = s.cell(sb, "", forgeDone, time.Minute)
	if !res.ContextLost {
		s.Errorf("a cell that forged its end: %+v", res)
	}
	if res := s.cell(sb, "", "'x' in globals()", time.Minute); text(res) != "False" || res.ExecutionCount != 1 {
		s.Errorf("the context after a forged end starts afresh: %+v", res)
	}
	// Nothing of it reached the other context.
	if res := s.cell(sb, "other", "secret", time.Minute); text(res) != "'other'" || res.ExecutionCount != 2 || res.ResultsTruncated {
		s.Errorf("the other context: %+v", res)
	}
	// No other process of the sandbox reads a context's memory or
	// descriptors (its results stream), nor the zygote's (its control
	// socket): they are not dumpable.
	pids := text(s.cell(sb, "other", "import os\n'%d %d' % (os.getpid(), os.getppid())", time.Minute))
	for _, pid := range strings.Fields(strings.Trim(pids, "'")) {
		probe := fmt.Sprintf("cat /proc/%s/environ >/dev/null 2>&1 && echo environ; readlink /proc/%s/fd/0 >/dev/null 2>&1 && echo fd0; true", pid, pid)
		if out := s.run(sb, probe); len(out.Stdout) != 0 {
			s.Errorf("a command read process %s of the contexts: %q", pid, out.Stdout)
		}
	}
	if out := s.runOK(sb, "echo still"); out != "still\n" {
		s.Errorf("the sandbox after the forgeries: %q", out)
	}
	// They share the sandbox's uid: a command can kill the interpreter.
	// Every context is lost with it, and the next cell starts another.
	zygote := strings.Fields(strings.Trim(pids, "'"))[1]
	s.runOK(sb, "kill -9 "+zygote)
	deadline := time.Now().Add(30 * time.Second)
	for {
		list, err := s.code().ListContexts(s.ctx(), sb.id)
		if err != nil {
			s.Fatalf("ListContexts: %v", err)
		}
		if len(list) == 0 {
			break
		}
		if time.Now().After(deadline) {
			s.Fatalf("the contexts outlived their interpreter: %+v", list)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if res := s.cell(sb, "other", "'secret' in globals()", time.Minute); text(res) != "False" || res.ExecutionCount != 1 {
		s.Errorf("a context after its interpreter was killed: %+v", res)
	}
}
