// Package wire_test holds the Python client's field names to the wire's one
// definition, ipc/api: every key the client sends to an op is one of that
// op's arguments, every key of a nested map it sends (a spec, resources)
// is one of some op's, and every key it reads from an answer is one of some
// result's or of the envelope's. A typo in the client ("exit_cod") or a
// field renamed on one side fails here instead of reading as a silent None.
//
// Why a Go test running a Python scanner: each side is read by its own
// language's parser. The Go side reflects over api's types (their msgpack
// tags, nested structs included), so nothing is restated by hand; the
// Python side (wire_keys.py) parses the client with `ast`, so formatting
// and comments cannot fool it, and it fails closed: a read from a receiver
// it does not know to be something else is checked as a wire key.
package wire_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// use is one key the scanner found: the op it is sent to (empty: a read,
// or a nested map of any op) and where.
type use struct {
	Key string `json:"key"`
	Op  string `json:"op"`
	At  string `json:"at"`
}

type scan struct {
	Sent       []use `json:"sent"`
	SentAny    []use `json:"sent_any"`
	Read       []use `json:"read"`
	Unresolved []use `json:"unresolved"`
}

// keys adds t's msgpack keys to into; with deep, those of the structs it
// holds too.
func keys(t reflect.Type, deep bool, into map[string]bool, seen map[reflect.Type]bool) {
	for t.Kind() == reflect.Slice || t.Kind() == reflect.Map || t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || seen[t] {
		return
	}
	seen[t] = true
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("msgpack"), ",")
		if name == "" || name == "-" {
			continue
		}
		into[name] = true
		if deep {
			keys(f.Type, true, into, seen)
		}
	}
}

func keysOf(deep bool, types ...any) map[string]bool {
	out := map[string]bool{}
	for _, v := range types {
		keys(reflect.TypeOf(v), deep, out, map[reflect.Type]bool{})
	}
	return out
}

func python(t *testing.T) string {
	t.Helper()
	// Debian's, which the project's Python tests use; else the PATH's.
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("python3 is not installed (CI=true: this test must run)")
	}
	t.Skip("python3 is not installed")
	return ""
}

func scanClient(t *testing.T, src string) scan {
	t.Helper()
	cmd := exec.Command(python(t), "wire_keys.py", src)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("wire_keys.py %s: %v\n%s", src, err, stderr.String())
	}
	var s scan
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("wire_keys.py printed something else than its JSON: %v\n%s", err, out)
	}
	return s
}

// problems lists every key of s that is not the wire's.
func problems(s scan) []string {
	var out []string
	for _, u := range s.Unresolved {
		out = append(out, u.At+": the arguments of "+u.Op+" are neither a dict literal nor a name built from them here; write them so this test can check them")
	}
	perOp := map[string]map[string]bool{}
	for op, req := range api.Requests {
		perOp[op] = keysOf(false, req)
	}
	for _, u := range s.Sent {
		args, ok := perOp[u.Op]
		switch {
		case !ok:
			out = append(out, u.At+": op "+u.Op+" is not an op of ipc/api")
		case !args[u.Key]:
			out = append(out, u.At+": "+u.Op+" has no argument "+u.Key+" in ipc/api")
		}
	}
	var requests []any
	for _, req := range api.Requests {
		requests = append(requests, req)
	}
	anyArg := keysOf(true, requests...)
	for _, u := range s.SentAny {
		if !anyArg[u.Key] {
			out = append(out, u.At+": "+u.Key+" is no op's argument in ipc/api")
		}
	}
	// The envelope of every answer (ipc's types; the error map's code and
	// message are written by hand in ipc/envelope.go) and every result.
	var results []any
	for _, res := range api.Results {
		results = append(results, res)
	}
	readable := keysOf(true, append(results, ipc.Response{}, ipc.Event{})...)
	readable["code"], readable["message"] = true, true
	for _, u := range s.Read {
		if !readable[u.Key] {
			out = append(out, u.At+": reads "+u.Key+", which no result of ipc/api has")
		}
	}
	sort.Strings(out)
	return out
}

func TestPythonClientKeysAreTheWires(t *testing.T) {
	s := scanClient(t, "../src/sandbox_sidecar")
	// The scanner must see the client at all: a parser change that finds
	// nothing would pass every check below.
	ops := map[string]bool{}
	for _, u := range s.Sent {
		ops[u.Op] = true
	}
	for _, op := range []string{"create", "run_command", "start_command", "read_output", "wait_process", "signal_process", "list_processes",
		"run_code", "list_contexts", "restart_context", "delete_context"} {
		if !ops[op] {
			t.Errorf("the scan found no argument sent to %s: wire_keys.py no longer sees the client's calls", op)
		}
	}
	if len(s.Read) < 40 || len(s.SentAny) == 0 {
		t.Errorf("the scan found %d reads and %d nested keys: wire_keys.py no longer sees the client", len(s.Read), len(s.SentAny))
	}
	for _, p := range problems(s) {
		t.Error(p)
	}
}

// The check catches a typo in each kind of key: a client with one key
// misspelt fails it.
func TestPythonClientKeyTyposAreCaught(t *testing.T) {
	const src = "../src/sandbox_sidecar"
	files, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	texts := map[string][]byte{}
	for _, f := range files {
		if !strings.HasSuffix(f.Name(), ".py") {
			continue
		}
		text, err := os.ReadFile(src + "/" + f.Name())
		if err != nil {
			t.Fatal(err)
		}
		texts[f.Name()] = text
	}
	for _, c := range []struct{ file, from, to, want string }{
		{"processes.py", `result.get("exit_code")`, `result.get("exit_cod")`, "reads exit_cod"},
		{"processes.py", `result.get("next_offset")`, `result["nxt_offset"]`, "reads nxt_offset"},
		{"client.py", `"wait_s": wait_s`, `"wait": wait_s`, "read_output has no argument wait"},
		{"client.py", `{"sandbox": sandbox, "process": process, "signal": signal}`, `{"sandbox": sandbox, "process": process, "sig": signal}`, "signal_process has no argument sig"},
		{"backend.py", `wire["env"] = `, `wire["environment"] = `, "environment is no op's argument"},
		{"client.py", `"code": code,`, `"cell": code,`, "run_code has no argument cell"},
		{"client.py", `"delete_context", {"sandbox": sandbox, "context": context}`, `"delete_context", {"sandbox": sandbox, "name": context}`, "delete_context has no argument name"},
		{"code.py", `result.get("execution_count")`, `result.get("execution_counter")`, "reads execution_counter"},
		{"code.py", `value.get("traceback")`, `value.get("trace")`, "reads trace"},
	} {
		if !strings.Contains(string(texts[c.file]), c.from) {
			t.Fatalf("%s no longer has %s: update this test", c.file, c.from)
		}
		dir := t.TempDir()
		for name, text := range texts {
			if name == c.file {
				text = []byte(strings.Replace(string(text), c.from, c.to, 1))
			}
			if err := os.WriteFile(dir+"/"+name, text, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		found := problems(scanClient(t, dir))
		if !strings.Contains(strings.Join(found, "\n"), c.want) {
			t.Errorf("%s with %s instead of %s: want a problem %q, got %q", c.file, c.to, c.from, c.want, found)
		}
	}
}
