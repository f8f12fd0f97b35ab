package ipc

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The structure of a msgpack body is read here straight from its bytes
// (the format's type codes: github.com/msgpack/msgpack/blob/master/spec.md),
// without a decoder: every frame, the daemon's requests and the clients'
// responses, is walked once before it is decoded, and a walk through the
// decoder's reader interface cost a lone health call a tenth of its time
// (docs/benchmarks-history.md, "The RPC floor and the Go client").

var (
	errTruncated   = errors.New("truncated msgpack value")
	errNotAnItem   = errors.New("0xc1 is not a msgpack type code")
	errAfterTheMap = errors.New("bytes after the map")
)

// checkShape walks body without recursion and checks that it is exactly one
// msgpack map, nested at most MaxDepth deep, with nothing after it, and
// (when maxItems > 0) holding at most maxItems items: a container is
// refused as soon as its announced length would pass the budget, before
// anything is made for it.
func checkShape(body []byte, maxItems int) error {
	if len(body) == 0 {
		return errors.New("empty body")
	}
	if !isMap(body[0]) {
		return fmt.Errorf("the body is not a msgpack map (first byte 0x%02x)", body[0])
	}
	end, err := walkValue(body, 0, maxItems)
	switch {
	case err != nil:
		return err
	case end < len(body):
		return errAfterTheMap
	}
	return nil
}

// walkValue walks the one value at b[p:] and everything in it, and returns
// where it ends. Containers may nest MaxDepth deep, and when maxItems > 0
// the value may hold at most maxItems items (itself included).
func walkValue(b []byte, p, maxItems int) (end int, err error) {
	var stack [MaxDepth + 1]int
	remaining := append(stack[:0], 1) // items left to read at each open level
	items := 1
	for len(remaining) > 0 {
		top := len(remaining) - 1
		if remaining[top] == 0 {
			remaining = remaining[:top]
			continue
		}
		remaining[top]--
		n, size, err := nextItem(b[p:])
		if err != nil {
			return 0, err
		}
		p += size
		if n < 0 {
			continue
		}
		// (nextItem refused a container that announces more items than
		// there are bytes left.)
		if items += n; maxItems > 0 && items > maxItems {
			return 0, errTooManyItems
		}
		if len(remaining) >= MaxDepth {
			return 0, fmt.Errorf("containers nested more than %d deep", MaxDepth)
		}
		remaining = append(remaining, n)
	}
	return p, nil
}

// nextItem reads the item that b starts with. A container gives the number
// of items that follow in it (a map's keys and values both count) and the
// size of its header; any other value gives n = -1 and its whole size. A
// size past b's end is errTruncated.
func nextItem(b []byte) (n, size int, err error) {
	if len(b) == 0 {
		return 0, 0, errTruncated
	}
	c := b[0]
	switch {
	case c <= 0x7f || c >= 0xe0: // positive and negative fixint
		return -1, 1, nil
	case c <= 0x8f: // fixmap
		return count(b, uint64(c&0x0f), 1, true)
	case c <= 0x9f: // fixarray
		return count(b, uint64(c&0x0f), 1, false)
	case c <= 0xbf: // fixstr
		return sized(b, 1, uint64(c&0x1f))
	}
	switch c {
	case 0xc0, 0xc2, 0xc3: // nil, false, true
		return -1, 1, nil
	case 0xc1:
		return 0, 0, errNotAnItem
	case 0xc4, 0xd9: // bin 8, str 8
		return lengthThen(b, 1, 0)
	case 0xc5, 0xda: // bin 16, str 16
		return lengthThen(b, 2, 0)
	case 0xc6, 0xdb: // bin 32, str 32
		return lengthThen(b, 4, 0)
	case 0xc7: // ext 8: a length, a type, the data
		return lengthThen(b, 1, 1)
	case 0xc8: // ext 16
		return lengthThen(b, 2, 1)
	case 0xc9: // ext 32
		return lengthThen(b, 4, 1)
	case 0xcc, 0xd0: // uint 8, int 8
		return sized(b, 1, 1)
	case 0xcd, 0xd1: // uint 16, int 16
		return sized(b, 1, 2)
	case 0xca, 0xce, 0xd2: // float 32, uint 32, int 32
		return sized(b, 1, 4)
	case 0xcb, 0xcf, 0xd3: // float 64, uint 64, int 64
		return sized(b, 1, 8)
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16: a type, the data
		return sized(b, 2, 1<<(c-0xd4))
	case 0xdc, 0xde: // array 16, map 16
		if len(b) < 3 {
			return 0, 0, errTruncated
		}
		return count(b, uint64(binary.BigEndian.Uint16(b[1:])), 3, c == 0xde)
	default: // 0xdd, 0xdf: array 32, map 32
		if len(b) < 5 {
			return 0, 0, errTruncated
		}
		return count(b, uint64(binary.BigEndian.Uint32(b[1:])), 5, c == 0xdf)
	}
}

// count is a container of n entries (a map's count its keys and values)
// behind a header of hdr bytes. Every item takes at least a byte, so more
// items than bytes left is errTruncated: checked before n becomes an int,
// which on a 32-bit host a 32-bit count would overflow.
func count(b []byte, n uint64, hdr int, isMap bool) (int, int, error) {
	if isMap {
		n *= 2
	}
	if n > uint64(len(b)-hdr) {
		return 0, 0, errTruncated
	}
	return int(n), hdr, nil
}

// sized is a value of a header of hdr bytes and a body of n.
func sized(b []byte, hdr int, n uint64) (int, int, error) {
	if hdr > len(b) || n > uint64(len(b)-hdr) {
		return 0, 0, errTruncated
	}
	return -1, hdr + int(n), nil
}

// lengthThen is a value whose code is followed by a big-endian length of
// width bytes, extra bytes (an ext's type), then that many bytes. The
// length stays unsigned until it is known to fit what is left.
func lengthThen(b []byte, width, extra int) (int, int, error) {
	hdr := 1 + width + extra
	if hdr > len(b) {
		return 0, 0, errTruncated
	}
	var n uint64
	switch width {
	case 1:
		n = uint64(b[1])
	case 2:
		n = uint64(binary.BigEndian.Uint16(b[1:]))
	default:
		n = uint64(binary.BigEndian.Uint32(b[1:]))
	}
	return sized(b, hdr, n)
}
