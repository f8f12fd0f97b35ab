package ipc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

func mp(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	require.NoError(t, err)
	return b
}

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, WriteFrame(&buf, []byte("hello"), 16))
	assert.Equal(t, []byte{0, 0, 0, 5, 'h', 'e', 'l', 'l', 'o'}, buf.Bytes())
	body, err := ReadFrame(&buf, 16)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(body))
}

func TestFrameErrors(t *testing.T) {
	hdr := func(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }
	_, err := ReadFrame(bytes.NewReader(hdr(0)), 16)
	assert.ErrorIs(t, err, ErrEmptyFrame)
	_, err = ReadFrame(bytes.NewReader(hdr(17)), 16)
	assert.ErrorIs(t, err, ErrFrameTooLarge)
	_, err = ReadFrame(bytes.NewReader(append(hdr(10), "short"...)), 16)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	_, err = ReadFrame(bytes.NewReader([]byte{0, 0}), 16)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.ErrorIs(t, WriteFrame(io.Discard, make([]byte, 17), 16), ErrFrameTooLarge)
}

func TestDecodeRequest(t *testing.T) {
	ok := mp(t, map[string]any{"v": 1, "id": 7, "op": "health", "args": map[string]any{"x": "y"}, "future": true})
	req, e := DecodeRequest(ok)
	require.Nil(t, e)
	assert.Equal(t, uint64(7), req.ID)
	assert.Equal(t, "health", req.Op)
	assert.Equal(t, "y", req.Args.String("x", true))

	noArgs, e := DecodeRequest(mp(t, map[string]any{"v": 1, "id": 1, "op": "health"}))
	require.Nil(t, e)
	assert.NotNil(t, noArgs.Args.Map())

	deep := bytes.Repeat([]byte{0x91}, 100000) // nested one-element arrays
	deepMap := append([]byte{0x81, 0xa1, 'a'}, append(deep, 0xc0)...)

	cases := []struct {
		name   string
		body   []byte
		code   string
		id     uint64
		detail string
	}{
		{"array instead of map", mp(t, []any{1, 2}), CodeBadRequest, 0, "not a msgpack map"},
		{"garbage", []byte("\xc1\xc1garbage"), CodeBadRequest, 0, "not a msgpack map"},
		{"string", mp(t, "hello"), CodeBadRequest, 0, "not a msgpack map"},
		{"truncated map", mp(t, map[string]any{"v": 1, "id": 1, "op": "health"})[:5], CodeBadRequest, 0, "truncated"},
		{"trailing bytes", append(mp(t, map[string]any{"v": 1, "id": 1, "op": "x"}), 0x01), CodeBadRequest, 0, "after the map"},
		{"depth bomb", deepMap, CodeBadRequest, 0, "nested more than"},
		{"lying map length", []byte{0xdf, 0xff, 0xff, 0xff, 0xff}, CodeBadRequest, 0, "truncated"},
		{"lying string length", []byte{0x81, 0xdb, 0xff, 0xff, 0xff, 0xff, 'a'}, CodeBadRequest, 0, "truncated"},
		{"non-string key", mp(t, map[int]any{1: 2}), CodeBadRequest, 0, "keys must be strings"},
		{"missing id", mp(t, map[string]any{"v": 1, "op": "health"}), CodeBadRequest, 0, `"id"`},
		{"negative id", mp(t, map[string]any{"v": 1, "id": -1, "op": "health"}), CodeBadRequest, 0, `"id"`},
		{"string id", mp(t, map[string]any{"v": 1, "id": "1", "op": "health"}), CodeBadRequest, 0, `"id"`},
		{"missing v", mp(t, map[string]any{"id": 3, "op": "health"}), CodeBadRequest, 3, `"v"`},
		{"wrong v", mp(t, map[string]any{"v": 2, "id": 3, "op": "health"}), CodeUnsupported, 3, "version 2"},
		{"missing op", mp(t, map[string]any{"v": 1, "id": 3}), CodeBadRequest, 3, `"op"`},
		{"op not string", mp(t, map[string]any{"v": 1, "id": 3, "op": 5}), CodeBadRequest, 3, `"op"`},
		{"args not map", mp(t, map[string]any{"v": 1, "id": 3, "op": "x", "args": []int{1}}), CodeBadRequest, 3, `"args"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, e := DecodeRequest(tc.body)
			require.NotNil(t, e)
			assert.Equal(t, tc.code, e.Code)
			assert.Contains(t, e.Message, tc.detail)
			if tc.id != 0 {
				assert.Equal(t, tc.id, req.ID)
			}
		})
	}
}

func TestArgs(t *testing.T) {
	decode := func(m map[string]any) Args {
		req, e := DecodeRequest(mp(t, map[string]any{"v": 1, "id": 1, "op": "x", "args": m}))
		require.Nil(t, e)
		return req.Args
	}
	a := decode(map[string]any{"s": "str", "f": 1.5, "i": 3, "b": []byte{1}, "m": map[string]any{"k": "v"}, "l": []any{"a"}, "n": nil})
	assert.Equal(t, "str", a.String("s", true))
	assert.Equal(t, 1.5, a.Float("f", 0))
	assert.Equal(t, int64(3), a.Int("i", 0, 0, 10))
	assert.Equal(t, 3.0, a.Float("i", 0), "integers are numbers")
	b, _ := a.Bytes("b", true)
	assert.Equal(t, []byte{1}, b)
	assert.Equal(t, map[string]string{"k": "v"}, a.StringMap("m", 4))
	assert.Equal(t, []string{"a"}, a.StringList("l", 4))
	assert.False(t, a.Has("n"), "nil is absent")
	assert.Nil(t, a.Done("argument"))

	for name, tc := range map[string]struct {
		args map[string]any
		read func(a *Args)
		want string
	}{
		"unknown":    {map[string]any{"timout_s": 1}, func(a *Args) { a.Float("timeout_s", 1) }, `unknown argument "timout_s"`},
		"required":   {map[string]any{}, func(a *Args) { a.String("sandbox", true) }, `"sandbox" is required`},
		"empty":      {map[string]any{"sandbox": ""}, func(a *Args) { a.String("sandbox", true) }, "must not be empty"},
		"mistyped":   {map[string]any{"sandbox": 5}, func(a *Args) { a.String("sandbox", true) }, "must be a string, got an integer"},
		"nan":        {map[string]any{"t": nanValue()}, func(a *Args) { a.Float("t", 1) }, "finite"},
		"range":      {map[string]any{"m": 01000}, func(a *Args) { a.Int("m", 0, 0, 0o777) }, "between"},
		"map values": {map[string]any{"env": map[string]any{"A": 1}}, func(a *Args) { a.StringMap("env", 4) }, `entry "A" must be a string`},
		"list long":  {map[string]any{"l": []any{"a", "b"}}, func(a *Args) { a.StringList("l", 1) }, "at most 1"},
	} {
		t.Run(name, func(t *testing.T) {
			a := decode(tc.args)
			tc.read(&a)
			e := a.Done("argument")
			require.NotNil(t, e)
			assert.Equal(t, CodeBadRequest, e.Code)
			assert.Contains(t, e.Message, tc.want)
		})
	}
}

func nanValue() float64 {
	var zero float64
	return zero / zero
}

func TestEncodeResponse(t *testing.T) {
	body, err := EncodeResponse(9, map[string]any{"a": 1}, nil)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, msgpack.Unmarshal(body, &m))
	assert.EqualValues(t, 9, m["id"])
	assert.Equal(t, true, m["ok"])
	assert.NotContains(t, m, "error")

	// An empty result is sent as {}, never left out (docs/protocol.md:
	// a success carries "result": <map>).
	for _, empty := range []any{nil, map[string]any{}, map[string]any(nil)} {
		body, err = EncodeResponse(9, empty, nil)
		require.NoError(t, err)
		m = nil
		require.NoError(t, msgpack.Unmarshal(body, &m))
		assert.Contains(t, m, "result", "result %#v", empty)
		assert.Equal(t, map[string]any{}, m["result"], "result %#v", empty)
	}

	body, err = EncodeResponse(9, nil, Errorf(CodeFileTooLarge, "too big").With("size_bytes", 10))
	require.NoError(t, err)
	m = nil
	require.NoError(t, msgpack.Unmarshal(body, &m))
	assert.Equal(t, false, m["ok"])
	em := m["error"].(map[string]any)
	assert.Equal(t, CodeFileTooLarge, em["code"])
	assert.Equal(t, "too big", em["message"])
	assert.EqualValues(t, 10, em["size_bytes"])
}

func TestAsErrorHidesInternalText(t *testing.T) {
	e := AsError(errors.New("open /var/lib/secret: permission denied"))
	assert.Equal(t, CodeInternal, e.Code)
	assert.False(t, strings.Contains(e.Message, "/var/lib"))
}
