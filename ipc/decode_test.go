package ipc

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// decodeAs decodes args, given as a client would encode them, into a new
// value of req's type.
func decodeAs(t testing.TB, args map[string]any, req any) (any, *Error) {
	t.Helper()
	body, err := msgpack.Marshal(map[string]any{"v": 1, "id": 1, "op": "x", "args": args})
	require.NoError(t, err)
	r, e := DecodeRequest(body)
	require.Nil(t, e)
	dst := reflect.New(reflect.TypeOf(req))
	e = Decode(&r.Args, dst.Interface())
	return dst.Elem().Interface(), e
}

func TestDecodeReadsEveryKindOfField(t *testing.T) {
	a := NewArgs(map[string]any{
		"sandbox": "sc-1", "argv": []any{"ls", "-l"}, "env": map[string]any{"A": "b"},
		"cwd": []byte("caf\xe9"), "stdin": "in", "timeout_s": int64(3), "max_output_bytes": uint8(0), "stream": true,
	})
	var r api.RunCommandRequest
	require.Nil(t, Decode(&a, &r))
	assert.Equal(t, api.RunCommandRequest{Sandbox: "sc-1", Argv: []string{"ls", "-l"}, Env: map[string]string{"A": "b"},
		Cwd: "caf\xe9", Stdin: []byte("in"), TimeoutS: 3, MaxOutputBytes: new(0), Stream: true}, r)

	a = NewArgs(map[string]any{"spec": map[string]any{"block_network": false, "allow_egress_to": []any{"x.org"}},
		"resources": map[string]any{"cpus": 0.5, "pids": 7}, "ttl_s": 1.5})
	var c api.CreateRequest
	require.Nil(t, Decode(&a, &c))
	assert.Equal(t, api.CreateRequest{Spec: &api.Spec{BlockNetwork: new(false), AllowEgressTo: []string{"x.org"}},
		Resources: &api.Resources{CPUs: 0.5, PIDs: 7}, TTLS: 1.5}, c)

	// Left out, and nil, are the same: absent.
	a = NewArgs(map[string]any{"sandbox": "sc-1", "path": "f", "max_bytes": nil})
	var rf api.ReadFileRequest
	require.Nil(t, Decode(&a, &rf))
	assert.Nil(t, rf.MaxBytes)
	assert.Nil(t, rf.Offset)
}

func TestDecodeRefusesWithAMessageThatNamesTheArgument(t *testing.T) {
	cases := []struct {
		req  any
		args map[string]any
		want string
	}{
		{api.RunCommandRequest{}, map[string]any{}, `argument "sandbox" is required`},
		{api.RunCommandRequest{}, map[string]any{"sandbox": ""}, `argument "sandbox" must not be empty`},
		{api.RunCommandRequest{}, map[string]any{"sandbx": "sc-1"}, `unknown argument "sandbx"; this op takes argv, command, cwd,`},
		{api.RunCommandRequest{}, map[string]any{"sandbox": "s", "argv": []any{}}, `argument "argv" must not be empty`},
		{api.RunCommandRequest{}, map[string]any{"sandbox": "s", "argv": []any{1}}, `argument "argv" item 0 must be a string, got an integer`},
		{api.RunCommandRequest{}, map[string]any{"sandbox": "s", "timeout_s": -1}, `argument "timeout_s" must be greater than 0, got -1`},
		{api.RunCommandRequest{}, map[string]any{"sandbox": "s", "timeout_s": "1"}, `argument "timeout_s" must be a number, got a string`},
		{api.RunCommandRequest{}, map[string]any{"sandbox": "s", "max_output_bytes": -1}, `argument "max_output_bytes" must be between 0 and 2147483647, got -1`},
		{api.RunCommandRequest{}, map[string]any{"sandbox": "s", "env": map[string]any{"A": 1}}, `argument "env" entry "A" must be a string, got an integer`},
		{api.RunCommandRequest{}, map[string]any{"sandbox": "s", "stream": 1}, `argument "stream" must be a boolean, got an integer`},
		{api.WriteFileRequest{}, map[string]any{"sandbox": "s", "path": "p"}, `argument "data" is required`},
		{api.WriteFileRequest{}, map[string]any{"sandbox": "s", "path": "p", "data": "", "mode": 0o1000}, `argument "mode" must be between 0 and 511`},
		{api.ReadFileRequest{}, map[string]any{"sandbox": "s", "path": []byte{}}, `argument "path" must not be empty`},
		{api.RenewRequest{}, map[string]any{"sandbox": "s"}, `argument "ttl_s" (a number) is required`},
		{api.RenewRequest{}, map[string]any{"sandbox": "s", "ttl_s": 0}, `argument "ttl_s" must be greater than 0, got 0`},
		{api.WriteTagsRequest{}, map[string]any{"sandbox": "s"}, `argument "tags" (a map of strings) is required`},
		{api.CreateRequest{}, map[string]any{"spec": "x"}, `argument "spec" must be a map, got a string`},
		{api.CreateRequest{}, map[string]any{"spec": map[string]any{"blok_network": true}}, `unknown spec field "blok_network"; "spec" takes allow_egress_to,`},
		{api.CreateRequest{}, map[string]any{"spec": map[string]any{"env": []any{}}}, `in "spec": argument "env" must be a map of strings, got a list`},
		{api.CreateRequest{}, map[string]any{"resources": map[string]any{"pids": 0}}, `in "resources": argument "pids" must be greater than 0 and at most 4194304, got 0; leave it out`},
		{api.CreateRequest{}, map[string]any{"labels": map[string]any{"a": "1", "b": "2", "c": "3", "d": "4", "e": "5", "f": "6", "g": "7", "h": "8", "i": "9", "j": "10", "k": "11", "l": "12", "m": "13", "n": "14", "o": "15", "p": "16", "q": "17"}},
			`argument "labels" has 17 entries, at most 16 allowed`},
		{api.NoArgs{}, map[string]any{"x": 1}, `unknown argument "x"; this op takes no arguments`},
	}
	for _, c := range cases {
		_, e := decodeAs(t, c.args, c.req)
		if assert.NotNil(t, e, "%T %v", c.req, c.args) {
			assert.Equal(t, CodeBadRequest, e.Code)
			assert.Contains(t, e.Message, c.want)
		}
	}
}

// Every request type of ipc/api is one Decode can read (a field of a kind
// it does not know would panic at the first request).
func TestDecodeKnowsEveryRequestType(t *testing.T) {
	for op, req := range api.Requests {
		a := NewArgs(nil)
		dst := reflect.New(reflect.TypeOf(req))
		e := Decode(&a, dst.Interface())
		if e != nil {
			assert.True(t, strings.Contains(e.Message, "is required"), "op %s: %s", op, e.Message)
		}
	}
}

// FuzzDecodeRequestTypes decodes arbitrary arguments into every request
// type: never a panic, every refusal a bad_request with a message, and
// what is accepted survives a round trip through the Go client's encoding.
func FuzzDecodeRequestTypes(f *testing.F) {
	seed := func(v map[string]any) []byte { b, _ := msgpack.Marshal(v); return b }
	f.Add(seed(map[string]any{"sandbox": "sc-1", "command": "echo hi", "timeout_s": 1.5, "stdin": []byte{0, 1}}))
	f.Add(seed(map[string]any{"spec": map[string]any{"env": map[string]any{"A": "b"}}, "resources": map[string]any{"cpus": 2}}))
	f.Add(seed(map[string]any{"sandbox": "s", "path": []byte{0xff}, "offset": 3, "length": 9}))
	f.Add(seed(map[string]any{"versions": []any{1, 2}}))
	ops := slices.Sorted(func(yield func(string) bool) {
		for op := range api.Requests {
			if !yield(op) {
				return
			}
		}
	})
	f.Fuzz(func(t *testing.T, body []byte) {
		if checkShape(body, ItemBudget(len(body))) != nil {
			return
		}
		var m map[string]any
		if msgpack.Unmarshal(body, &m) != nil {
			return
		}
		for _, op := range ops {
			typ := reflect.TypeOf(api.Requests[op])
			a := NewArgs(m)
			dst := reflect.New(typ)
			if e := Decode(&a, dst.Interface()); e != nil {
				if e.Code != CodeBadRequest || e.Message == "" {
					t.Fatalf("op %s: %#v", op, e)
				}
				continue
			}
			enc, err := msgpack.Marshal(dst.Interface())
			if err != nil {
				t.Fatalf("op %s: re-encoding: %v", op, err)
			}
			var again map[string]any
			if err := msgpack.Unmarshal(enc, &again); err != nil {
				t.Fatal(err)
			}
			b := NewArgs(again)
			dst2 := reflect.New(typ)
			if e := Decode(&b, dst2.Interface()); e != nil {
				t.Fatalf("op %s: the re-encoded request is refused: %v", op, e)
			}
			if !reflect.DeepEqual(normalise(dst.Elem().Interface()), normalise(dst2.Elem().Interface())) {
				t.Fatalf("op %s: %#v became %#v", op, dst.Elem().Interface(), dst2.Elem().Interface())
			}
		}
	})
}

// normalise is v as msgpack sees it: omitempty drops empty lists and maps,
// so an empty one and a nil one are the same request.
func normalise(v any) any {
	b, _ := msgpack.Marshal(v)
	var m map[string]any
	_ = msgpack.Unmarshal(b, &m)
	return m
}
