package ipc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/sandbox-sidecar/sandbox-sidecar/internal/handoff"
)

// MaxDepth bounds how deeply msgpack containers may nest in a frame. The
// msgpack decoder recurses, so an unbounded depth would let a 16 MiB frame
// of nested one-element arrays exhaust the stack.
const MaxDepth = 32

// The decoding budget. A msgpack item (a map, an array, a key, a value)
// can be a single byte on the wire and still cost tens of bytes once
// decoded (an empty map is a Go map header), so a frame may hold only as
// many items as its size justifies: ItemBudget. What decoding costs is then
// bounded by RequestCost, which the server charges against its request
// budget before it reads the frame's body.
const (
	// MaxItemsPerFrame is the ceiling on msgpack items in one request
	// frame, whatever its size (docs/protocol.md, "Frames").
	MaxItemsPerFrame = 1 << 16
	// baseItemsPerFrame items are allowed in any frame, plus one for every
	// itemBytes bytes of it.
	baseItemsPerFrame = 256
	itemBytes         = 2
	// DecodedBytesPerItem bounds what decoding one item costs beside the
	// bytes it carries (measured: a one-entry map costs ~370 bytes for its
	// three items, an empty array ~45, a nil ~21; TestDecodeCostWithinBound
	// holds decoding to it).
	DecodedBytesPerItem = 128
	// SmallResponseBytes of each request's charge pay for a response that
	// reserved nothing (ReserveResponse): most results are a few hundred
	// bytes.
	SmallResponseBytes = 4 << 10
)

// ItemBudget is how many msgpack items a request frame of n bytes may
// hold: 256 plus one per 2 bytes, at most MaxItemsPerFrame.
func ItemBudget(n int) int { return min(MaxItemsPerFrame, baseItemsPerFrame+n/itemBytes) }

// RequestCost bounds the bytes a request frame of n bytes holds from its
// arrival until its response is written: the body, what decoding makes of
// it (copies of its strings and binaries, and DecodedBytesPerItem per
// item), and a small response.
func RequestCost(n int) int64 {
	return 2*int64(n) + int64(ItemBudget(n))*DecodedBytesPerItem + SmallResponseBytes
}

// errTooManyItems: a frame holds more items than its budget.
var errTooManyItems = errors.New("too many msgpack items")

// Request is a decoded request envelope.
type Request struct {
	V    uint64
	ID   uint64
	Op   string
	Args Args

	// Set by the server: the connection it came on, and what it holds
	// of the server's budgets until its response is written.
	c        *conn
	charge   int64         // of the request budget
	reserved int64         // of the connection's and the server's response budgets
	handoff  *handoff.Conn // set while it runs inline until released
	after    []func()      // AfterResponse's
}

// Response is what the server writes for one request.
type Response struct {
	V      int            `msgpack:"v"`
	ID     uint64         `msgpack:"id"`
	OK     bool           `msgpack:"ok"`
	Result any            `msgpack:"result,omitempty"`
	Error  map[string]any `msgpack:"error,omitempty"`
}

// success is a Response that succeeded, encoded with its result always
// present.
type success struct {
	V      int    `msgpack:"v"`
	ID     uint64 `msgpack:"id"`
	OK     bool   `msgpack:"ok"`
	Result any    `msgpack:"result"`
}

// Event is a frame sent before a request's final response (reserved for
// streamed output; see docs/protocol.md).
type Event struct {
	V     int    `msgpack:"v"`
	ID    uint64 `msgpack:"id"`
	Event string `msgpack:"event"`
	Data  []byte `msgpack:"data"`
}

// DecodeRequest decodes one frame body. On failure it returns the id it
// managed to read (0 if none) and a bad_request *Error saying what is wrong.
// A frame may hold at most ItemBudget(len(body)) items.
func DecodeRequest(body []byte) (Request, *Error) {
	var req Request
	if err := checkShape(body, ItemBudget(len(body))); err != nil {
		if errors.Is(err, errTooManyItems) {
			return req, Errorf(CodeBadRequest, "the frame holds more msgpack items than its size allows (%d for %d bytes: 256 plus one per 2 bytes, at most %d); send fewer, larger values",
				ItemBudget(len(body)), len(body), MaxItemsPerFrame).With("max_items", ItemBudget(len(body)))
		}
		return req, Errorf(CodeBadRequest, "malformed frame: %v", err)
	}
	r := bytes.NewReader(body)
	d := msgpack.NewDecoder(r)
	var vr bytes.Reader
	vd := msgpack.NewDecoder(&vr)
	n, err := d.DecodeMapLen()
	if err != nil || n < 0 {
		return req, Errorf(CodeBadRequest, "a frame must hold one msgpack map")
	}
	var haveV, haveID, haveOp bool
	var badField *Error
	for i := 0; i < n; i++ {
		key, err := d.DecodeString()
		if err != nil {
			return req, Errorf(CodeBadRequest, "envelope keys must be strings")
		}
		// Take each value whole (checkShape proved it complete) and decode
		// it on its own, so a mistyped field never leaves the main decoder
		// mid-value: the other fields, the id above all, are still read.
		// The value is a slice of body, not a copy: the decoder reads the
		// *bytes.Reader directly, so its position is exact.
		start := len(body) - r.Len()
		if err := d.Skip(); err != nil {
			return req, Errorf(CodeBadRequest, "malformed envelope field %q: %v", key, err)
		}
		vr.Reset(body[start : len(body)-r.Len()])
		vd.Reset(&vr)
		switch key {
		case "v":
			req.V, err = decodeUint(vd)
			haveV = err == nil
		case "id":
			req.ID, err = decodeUint(vd)
			haveID = err == nil
		case "op":
			req.Op, err = vd.DecodeString()
			haveOp = err == nil
		case "args":
			var v any
			v, err = vd.DecodeInterface()
			if err == nil {
				switch m := v.(type) {
				case nil:
				case map[string]any:
					req.Args = Args{m: m}
				default:
					err = errors.New("not a map")
				}
			}
		default:
			// Unknown envelope keys are ignored so that later versions can
			// add optional ones (docs/protocol.md, "Compatibility").
		}
		if err != nil && badField == nil {
			badField = Errorf(CodeBadRequest, "envelope field %q has the wrong type: %v", key, err)
		}
	}
	if !haveID {
		req.ID = 0 // never answer with a half-read id
	}
	switch {
	case badField != nil:
		return req, badField
	case !haveID:
		return req, Errorf(CodeBadRequest, `envelope field "id" (an unsigned integer) is missing`)
	case !haveV:
		return req, Errorf(CodeBadRequest, `envelope field "v" is missing; send "v": %d`, ProtocolVersion)
	case req.V != ProtocolVersion:
		return req, Errorf(CodeUnsupported, "protocol version %d is not spoken here; send \"v\": %d", req.V, ProtocolVersion)
	case !haveOp || req.Op == "":
		return req, Errorf(CodeBadRequest, `envelope field "op" (a string) is missing`)
	}
	if req.Args.m == nil {
		req.Args = Args{m: map[string]any{}}
	}
	return req, nil
}

// decodeUint reads a non-negative integer, whichever msgpack integer
// encoding the peer chose (many encoders use signed types for small
// positive numbers).
func decodeUint(d *msgpack.Decoder) (uint64, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, err
	}
	switch {
	case msgpcode.IsFixedNum(c) && int8(c) >= 0,
		c == msgpcode.Uint8, c == msgpcode.Uint16, c == msgpcode.Uint32, c == msgpcode.Uint64:
		return d.DecodeUint64()
	case msgpcode.IsFixedNum(c),
		c == msgpcode.Int8, c == msgpcode.Int16, c == msgpcode.Int32, c == msgpcode.Int64:
		n, err := d.DecodeInt64()
		if err == nil && n < 0 {
			err = fmt.Errorf("%d is negative", n)
		}
		return uint64(n), err
	}
	return 0, fmt.Errorf("not an integer (code 0x%02x)", c)
}

func truncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("truncated msgpack value")
	}
	return err
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

// EncodeResponse encodes a success (err == nil) or error response.
func EncodeResponse(id uint64, result any, err *Error) ([]byte, error) {
	frame, e := encodeResponseFrame(id, result, err)
	if e != nil {
		return nil, e
	}
	return frame[headerSize:], nil
}

// encodeResponseFrame encodes a response as a whole frame, length prefix
// included, in one buffer: written with one Write, never copied.
func encodeResponseFrame(id uint64, result any, err *Error) ([]byte, error) {
	var v any
	if err == nil {
		// A success always carries its result, {} when empty: Response's
		// omitempty would drop an empty map.
		if m, ok := result.(map[string]any); result == nil || (ok && m == nil) {
			result = map[string]any{}
		}
		v = success{V: ProtocolVersion, ID: id, OK: true, Result: result}
	} else {
		resp := Response{V: ProtocolVersion, ID: id}
		resp.Error = make(map[string]any, len(err.Details)+2)
		for k, v := range err.Details {
			resp.Error[k] = v
		}
		resp.Error["code"] = err.Code
		resp.Error["message"] = err.Message
		v = resp
	}
	buf := bytes.NewBuffer(make([]byte, headerSize, 512))
	if err := encodeTo(buf, v); err != nil {
		return nil, err
	}
	frame := buf.Bytes()
	binary.BigEndian.PutUint32(frame, uint32(len(frame)-headerSize))
	return frame, nil
}

func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	if err := encodeTo(&buf, v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func encodeTo(buf *bytes.Buffer, v any) error {
	enc := msgpack.NewEncoder(buf)
	enc.UseCompactInts(true)
	enc.UseCompactFloats(false)
	return enc.Encode(v)
}
