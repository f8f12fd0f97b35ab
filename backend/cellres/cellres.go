// Package cellres reads a code cell's results stream, as a sandbox's
// context writes it (backend/agent's pyrt.py): frames of a 4-byte
// big-endian length and a JSON object, "display" and "result" bundles and
// a last "done". What it reads is the guest's: every frame and every byte
// is bounded, a malformed frame ends the reading (not the daemon), and a
// stream past its bounds is read on, and dropped, to its end, so the
// context is never left blocked on it.
package cellres

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// MaxFrame bounds one frame: a bundle of a few values of pyrt.py's 4 MiB.
// A frame larger than what its reader may still keep is skipped unread, so
// the daemon holds at most the reader's maxBytes (base64 and JSON
// included) and frameOverhead.
const (
	MaxFrame      = 24 << 20
	frameOverhead = 256 << 10 // the last frame: an error's value and traceback (pyrt.py bounds them)
)

// binaryTypes travel base64-encoded and are bytes on the wire.
var binaryTypes = map[string]bool{"image/png": true, "image/jpeg": true}

// Results is what a results stream said.
type Results struct {
	Bundles   []backend.Bundle
	Truncated bool // bundles left out past the bounds (here or in the guest)
	Error     *backend.CodeError
	Count     int
	Done      bool // the "done" frame came: the cell ended in its context
	// Malformed says why the stream was not read to its end, if so.
	Malformed error
}

// Read reads r to its end (or its first malformed frame), keeping bundles
// while their values together stay within maxBytes.
func Read(r io.Reader, maxBytes int) Results {
	var res Results
	kept := 0
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if !errors.Is(err, io.EOF) {
				res.Malformed = fmt.Errorf("a frame cut short: %v", err)
			}
			return res
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > MaxFrame {
			res.Malformed = fmt.Errorf("a frame of %d bytes, more than %d", n, MaxFrame)
			_, _ = io.Copy(io.Discard, r)
			return res
		}
		if int64(n) > int64(maxBytes-kept)*4/3+frameOverhead {
			// Larger than what is left to keep (base64 and all): read
			// past, never held.
			if _, err := io.CopyN(io.Discard, r, int64(n)); err != nil {
				res.Malformed = fmt.Errorf("a frame cut short: %v", err)
				return res
			}
			res.Truncated = true
			continue
		}
		buf := make([]byte, n)
		if _, err := io.ReadFull(r, buf); err != nil {
			res.Malformed = fmt.Errorf("a frame cut short: %v", err)
			return res
		}
		var f struct {
			T       string             `json:"t"`
			Data    map[string]any     `json:"data"`
			Count   int                `json:"count"`
			Error   *backend.CodeError `json:"-"`
			RawErr  json.RawMessage    `json:"error"`
			Dropped int                `json:"dropped"`
		}
		dec := json.NewDecoder(bytes.NewReader(buf))
		dec.UseNumber()
		if err := dec.Decode(&f); err != nil {
			res.Malformed = fmt.Errorf("a frame that is not a JSON object: %v", err)
			_, _ = io.Copy(io.Discard, r)
			return res
		}
		switch f.T {
		case "display", "result":
			b, size, ok := bundle(f.Data)
			if !ok || kept+size > maxBytes {
				res.Truncated = true
				continue
			}
			kept += size
			res.Bundles = append(res.Bundles, b)
		case "done":
			res.Done, res.Count = true, f.Count
			res.Truncated = res.Truncated || f.Dropped > 0
			res.Error = codeError(f.RawErr)
		default:
			res.Malformed = fmt.Errorf("a frame of kind %q", f.T)
			_, _ = io.Copy(io.Discard, r)
			return res
		}
	}
}

// bundle checks one bundle's values and decodes its binary ones; size is
// the bytes its values take.
func bundle(data map[string]any) (backend.Bundle, int, bool) {
	if len(data) == 0 || len(data) > 32 {
		return nil, 0, false
	}
	out := backend.Bundle{}
	size := 0
	for mime, v := range data {
		if len(mime) > 128 {
			return nil, 0, false
		}
		s, isString := v.(string)
		switch {
		case binaryTypes[mime]:
			if !isString {
				return nil, 0, false
			}
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return nil, 0, false
			}
			out[mime], size = b, size+len(b)
		case mime == "application/json":
			raw, err := json.Marshal(v)
			if err != nil {
				return nil, 0, false
			}
			out[mime], size = jsonValue(v), size+len(raw)
		case isString:
			out[mime], size = s, size+len(s)
		default:
			return nil, 0, false
		}
	}
	return out, size, true
}

// jsonValue turns a decoded JSON value's numbers into int64 or float64.
func jsonValue(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		f, _ := x.Float64()
		return f
	case map[string]any:
		for k, e := range x {
			x[k] = jsonValue(e)
		}
	case []any:
		for i, e := range x {
			x[i] = jsonValue(e)
		}
	}
	return v
}

func codeError(raw json.RawMessage) *backend.CodeError {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var e struct {
		Name      string   `json:"name"`
		Value     string   `json:"value"`
		Traceback []string `json:"traceback"`
	}
	if json.Unmarshal(raw, &e) != nil || e.Name == "" {
		return &backend.CodeError{Name: "Error", Value: "the context reported an error it could not describe"}
	}
	if len(e.Traceback) > 200 {
		e.Traceback = e.Traceback[len(e.Traceback)-200:]
	}
	return &backend.CodeError{Name: e.Name, Value: e.Value, Traceback: e.Traceback}
}
