package ipc

import (
	"encoding/binary"
	"math"

	"github.com/vmihailenco/msgpack/v5"
)

// decodeWire decodes a response or event frame's body (one checkShape
// passed) into w. The envelope the daemon writes is read straight from
// its bytes; a body with anything else in it (an error, a type the fast
// reading does not expect) goes through msgpack's decoder instead, which
// gives the same w for what both read (TestDecodeWireAgreesWithMsgpack).
// w.Result and w.Data may share body's memory: a frame's body is its own.
func decodeWire(body []byte, w *wireResponse) error {
	if decodeWireFast(body, w) {
		return nil
	}
	*w = wireResponse{}
	return msgpack.Unmarshal(body, w)
}

// decodeWireFast is decodeWire's reading of the usual envelope; false:
// leave it to msgpack.
func decodeWireFast(b []byte, w *wireResponse) bool {
	n, p, err := nextItem(b)
	if err != nil || n < 0 || !isMap(b[0]) {
		return false
	}
	for range n / 2 {
		if p >= len(b)-1 { // a key and a value take a byte each
			return false
		}
		key, next, ok := wireString(b, p)
		if !ok {
			return false
		}
		if p = next; p >= len(b) {
			return false
		}
		switch key {
		case "v":
			w.V, p, ok = wireUint(b, p)
		case "id":
			w.ID, p, ok = wireUint(b, p)
		case "ok":
			w.OK, p, ok = wireBool(b, p)
		case "result":
			var end int
			if end, err = walkValue(b, p, 0); err != nil {
				return false
			}
			w.Result = nil
			if b[p] != 0xc0 { // nil decodes to no result
				w.Result = msgpack.RawMessage(b[p:end])
			}
			p = end
		case "event":
			if b[p] == 0xc0 {
				w.Event, p = "", p+1
			} else {
				w.Event, p, ok = wireString(b, p)
			}
		case "data":
			w.Data, p, ok = wireBytes(b, p)
		case "error":
			return false // rare: msgpack makes the map
		default:
			// An envelope key this client does not know: skipped, as
			// msgpack skips a field the struct does not have.
			if p, err = walkValue(b, p, 0); err != nil {
				return false
			}
		}
		if !ok {
			return false
		}
	}
	return p == len(b)
}

// wireString reads a str at b[p:].
func wireString(b []byte, p int) (string, int, bool) {
	if c := b[p]; !(c >= 0xa0 && c <= 0xbf || c >= 0xd9 && c <= 0xdb) {
		return "", 0, false
	}
	body, next, ok := lengthPrefixed(b, p)
	return string(body), next, ok
}

// wireBytes reads a bin (or a str, or nil) at b[p:], as msgpack decodes
// one into a []byte.
func wireBytes(b []byte, p int) ([]byte, int, bool) {
	if b[p] == 0xc0 {
		return nil, p + 1, true
	}
	return lengthPrefixed(b, p)
}

// lengthPrefixed is the body of the str or bin at b[p:] (false for any
// other type), capped so that appending to it cannot reach past it.
func lengthPrefixed(b []byte, p int) ([]byte, int, bool) {
	var hdr int
	switch c := b[p]; {
	case c >= 0xa0 && c <= 0xbf: // fixstr
		hdr = 1
	case c == 0xc4 || c == 0xd9: // bin 8, str 8
		hdr = 2
	case c == 0xc5 || c == 0xda: // bin 16, str 16
		hdr = 3
	case c == 0xc6 || c == 0xdb: // bin 32, str 32
		hdr = 5
	default:
		return nil, 0, false
	}
	_, size, err := nextItem(b[p:])
	if err != nil {
		return nil, 0, false
	}
	return b[p+hdr : p+size : p+size], p + size, true
}

// wireUint reads an unsigned integer (or a signed one that is not
// negative) at b[p:].
func wireUint(b []byte, p int) (uint64, int, bool) {
	c := b[p]
	switch {
	case c <= 0x7f:
		return uint64(c), p + 1, true
	case c == 0xcc || c == 0xd0:
		if p+2 > len(b) || c == 0xd0 && int8(b[p+1]) < 0 {
			return 0, 0, false
		}
		return uint64(b[p+1]), p + 2, true
	case c == 0xcd || c == 0xd1:
		if p+3 > len(b) || c == 0xd1 && int16(binary.BigEndian.Uint16(b[p+1:])) < 0 {
			return 0, 0, false
		}
		return uint64(binary.BigEndian.Uint16(b[p+1:])), p + 3, true
	case c == 0xce || c == 0xd2:
		if p+5 > len(b) || c == 0xd2 && int32(binary.BigEndian.Uint32(b[p+1:])) < 0 {
			return 0, 0, false
		}
		return uint64(binary.BigEndian.Uint32(b[p+1:])), p + 5, true
	case c == 0xcf || c == 0xd3:
		if p+9 > len(b) || c == 0xd3 && binary.BigEndian.Uint64(b[p+1:]) > math.MaxInt64 {
			return 0, 0, false
		}
		return binary.BigEndian.Uint64(b[p+1:]), p + 9, true
	}
	return 0, 0, false
}

// wireBool reads a bool at b[p:].
func wireBool(b []byte, p int) (bool, int, bool) {
	switch b[p] {
	case 0xc2:
		return false, p + 1, true
	case 0xc3:
		return true, p + 1, true
	}
	return false, 0, false
}
