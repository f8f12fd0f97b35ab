package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Size is a number of bytes as operators write one: a plain integer
// (bytes) in TOML, or a string with a unit, "512m", "1G", "10GiB", "4096".
// Units are binary whatever their spelling, as Docker's `--memory 2g` and
// sbx's are: k, kb and kib all mean 1024. It prints in the largest unit
// that divides it exactly ("1GiB", "1536KiB", "1000B"), which parses back
// to the same number.
type Size int64

// sizeUnits are the accepted suffixes (lower case) and their shifts.
var sizeUnits = map[string]uint{
	"": 0, "b": 0,
	"k": 10, "kb": 10, "kib": 10,
	"m": 20, "mb": 20, "mib": 20,
	"g": 30, "gb": 30, "gib": 30,
	"t": 40, "tb": 40, "tib": 40,
	"p": 50, "pb": 50, "pib": 50,
}

// ParseSize reads a size: digits, optionally a decimal fraction, optional
// blanks, an optional unit. Negative sizes and sizes past int64 are refused.
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	shift, ok := sizeUnits[unit]
	if num == "" || !ok {
		return 0, fmt.Errorf("%q is not a size (write e.g. \"512m\", \"1G\", \"10GiB\" or a number of bytes; units are binary)", s)
	}
	if !strings.Contains(num, ".") {
		n, err := strconv.ParseUint(num, 10, 63)
		if err != nil || n > math.MaxInt64>>shift {
			return 0, fmt.Errorf("%q is too large a size", s)
		}
		return Size(n << shift), nil
	}
	// "1.5G": a fraction of a unit, rounded down to a byte.
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a size (write e.g. \"512m\", \"1.5G\" or a number of bytes)", s)
	}
	b := math.Floor(f * float64(uint64(1)<<shift))
	if b >= math.MaxInt64 {
		return 0, fmt.Errorf("%q is too large a size", s)
	}
	return Size(b), nil
}

func (z *Size) UnmarshalText(b []byte) error {
	v, err := ParseSize(string(b))
	if err != nil {
		return err
	}
	*z = v
	return nil
}

// MarshalText prints the size in the largest binary unit that divides it.
// A negative size (only a bad file can hold one, and validation refuses
// it) prints as a bare number.
func (z Size) MarshalText() ([]byte, error) { return []byte(z.String()), nil }

func (z Size) String() string {
	n := int64(z)
	if n <= 0 {
		return strconv.FormatInt(n, 10)
	}
	for _, u := range []struct {
		shift uint
		name  string
	}{{50, "PiB"}, {40, "TiB"}, {30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n&(1<<u.shift-1) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

func (z *Size) Set(s string) error { return z.UnmarshalText([]byte(s)) }

// Bytes is the size as a number of bytes.
func (z Size) Bytes() int64 { return int64(z) }
