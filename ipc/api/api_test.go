package api_test

import (
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// sections splits docs/protocol.md at its "### " headings, keyed by the
// ops a heading names in backticks ("### `attach` and `release`").
func sections(t *testing.T) map[string]string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	name := regexp.MustCompile("`([a-z_]+)`")
	for _, part := range strings.Split(string(doc), "\n### ")[1:] {
		heading, body, _ := strings.Cut(part, "\n")
		if i := strings.Index(body, "\n## "); i >= 0 {
			body = body[:i] // the next top-level section is not this op's
		}
		for _, m := range name.FindAllStringSubmatch(heading, -1) {
			out[m[1]] += body
		}
	}
	return out
}

// keys returns every msgpack key of t and of the structs it holds.
func keys(t reflect.Type, seen map[reflect.Type]bool) []string {
	for t.Kind() == reflect.Slice || t.Kind() == reflect.Map || t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || seen[t] {
		return nil
	}
	seen[t] = true
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("msgpack"), ",")
		if name == "" || name == "-" {
			continue
		}
		out = append(out, name)
		out = append(out, keys(f.Type, seen)...)
	}
	return out
}

// TestDocumented fails when a result field of the wire is missing from its
// op's section of docs/protocol.md.
func TestDocumented(t *testing.T) {
	docs := sections(t)
	for what, types := range map[string]map[string]any{"result field": api.Results, "argument": api.Requests} {
		for op, typ := range types {
			body, ok := docs[op]
			if !ok {
				t.Errorf("op %s has no section in docs/protocol.md", op)
				continue
			}
			for _, k := range keys(reflect.TypeOf(typ), map[reflect.Type]bool{}) {
				if !regexp.MustCompile(`\b` + regexp.QuoteMeta(k) + `\b`).MatchString(body) {
					t.Errorf("%s's %s %q is not in its section of docs/protocol.md", op, what, k)
				}
			}
		}
	}
}

// TestEveryOpHasAResult: a new op gets its request and result types here.
func TestEveryOpHasAResult(t *testing.T) {
	ops := []string{ipc.OpHello, ipc.OpHealth, ipc.OpCreate, ipc.OpRunCommand, ipc.OpReadFile, ipc.OpWriteFile,
		ipc.OpListDirectory, ipc.OpDestroy, ipc.OpList, ipc.OpRenew, ipc.OpAttach, ipc.OpRelease, ipc.OpReadTags,
		ipc.OpWriteTags, ipc.OpDestroyRun, ipc.OpGC, ipc.OpImageLs, ipc.OpImageInspect, ipc.OpImageRm,
		ipc.OpImageImportBegin, ipc.OpImageImportData, ipc.OpImageImportEnd,
		ipc.OpStartCommand, ipc.OpReadOutput, ipc.OpWaitProcess, ipc.OpSignalProcess, ipc.OpListProcesses,
		ipc.OpRunCode, ipc.OpListContexts, ipc.OpRestartContext, ipc.OpDeleteContext,
		ipc.OpSnapshot, ipc.OpFork, ipc.OpImageExportBegin, ipc.OpImageExportData, ipc.OpImageExportEnd,
		ipc.OpPause, ipc.OpResume}
	var missing []string
	for _, op := range ops {
		_, res := api.Results[op]
		_, req := api.Requests[op]
		if !res || !req {
			missing = append(missing, op)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 || len(api.Results) != len(ops) || len(api.Requests) != len(ops) {
		t.Errorf("ops without a request or result type: %v (%d results, %d requests for %d ops)", missing, len(api.Results), len(api.Requests), len(ops))
	}
}

// A name that is not UTF-8 travels as bytes, and both forms decode.
func TestNameOnTheWire(t *testing.T) {
	for _, name := range []api.Name{"plain.txt", "caf\xe9"} {
		b, err := msgpack.Marshal(api.DirEntry{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		var raw map[string]any
		if err := msgpack.Unmarshal(b, &raw); err != nil {
			t.Fatal(err)
		}
		_, isString := raw["name"].(string)
		if isString != (name == "plain.txt") {
			t.Errorf("%q went as %T", name, raw["name"])
		}
		var back api.DirEntry
		if err := msgpack.Unmarshal(b, &back); err != nil || back.Name != name {
			t.Errorf("%q came back as %q, %v", name, back.Name, err)
		}
	}
}

// TestImageInfoPrintsAsTheWire: the CLI prints image_ls's and
// image_inspect's answers (image ls --json, image inspect) by encoding
// ImageInfo as JSON, so its keys must be the wire's (size_bytes, origin's
// base_image), not Go's field names.
func TestImageInfoPrintsAsTheWire(t *testing.T) {
	for _, typ := range []reflect.Type{reflect.TypeFor[api.ImageInfo](), reflect.TypeFor[api.ImageOrigin]()} {
		for i := range typ.NumField() {
			f := typ.Field(i)
			if j, m := f.Tag.Get("json"), f.Tag.Get("msgpack"); j != m {
				t.Errorf("%s.%s: json tag %q, msgpack tag %q", typ.Name(), f.Name, j, m)
			}
		}
	}
}
