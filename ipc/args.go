package ipc

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// Args are a request's arguments with typed accessors. Every accessor
// records the key as used; Done reports keys the op does not know, so a
// misspelt argument is an error rather than silently ignored. The first
// error sticks: check Err (or Done) once after reading every argument.
type Args struct {
	m    map[string]any
	used map[string]bool
	err  *Error
}

// NewArgs wraps a decoded map (nil is an empty map).
func NewArgs(m map[string]any) Args {
	if m == nil {
		m = map[string]any{}
	}
	return Args{m: m}
}

// Map returns the raw arguments.
func (a *Args) Map() map[string]any { return a.m }

// Asked returns, sorted, every key asked for so far, present or not: the
// arguments an op reads (a test holds them against ipc/api's requests).
func (a *Args) Asked() []string {
	out := make([]string, 0, len(a.used))
	for k := range a.used {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (a *Args) get(key string) (any, bool) {
	if a.used == nil {
		a.used = map[string]bool{}
	}
	a.used[key] = true
	v, ok := a.m[key]
	if ok && v == nil {
		// An explicit nil is the same as an absent argument.
		return nil, false
	}
	return v, ok
}

func (a *Args) fail(key, want string, got any) {
	if a.err == nil {
		a.err = Errorf(CodeBadRequest, "argument %q must be %s, got %s", key, want, typeName(got))
	}
}

// Failf records a validation error for an argument.
func (a *Args) Failf(format string, args ...any) {
	if a.err == nil {
		a.err = Errorf(CodeBadRequest, format, args...)
	}
}

// Has reports whether key was given (and not nil).
func (a *Args) Has(key string) bool {
	_, ok := a.get(key)
	return ok
}

// String returns a string argument; required ones must be present and
// non-empty.
func (a *Args) String(key string, required bool) string {
	v, ok := a.get(key)
	if !ok {
		if required {
			a.Failf("argument %q is required", key)
		}
		return ""
	}
	s, ok := v.(string)
	if !ok {
		a.fail(key, "a string", v)
		return ""
	}
	if required && s == "" {
		a.Failf("argument %q must not be empty", key)
	}
	return s
}

// Bytes returns a binary argument; a string is accepted too.
func (a *Args) Bytes(key string, required bool) ([]byte, bool) {
	v, ok := a.get(key)
	if !ok {
		if required {
			a.Failf("argument %q is required", key)
		}
		return nil, false
	}
	switch b := v.(type) {
	case []byte:
		return b, true
	case string:
		return []byte(b), true
	}
	a.fail(key, "bytes", v)
	return nil, false
}

// Bool returns a boolean argument, or def when absent.
func (a *Args) Bool(key string, def bool) bool {
	v, ok := a.get(key)
	if !ok {
		return def
	}
	b, ok := v.(bool)
	if !ok {
		a.fail(key, "a boolean", v)
		return def
	}
	return b
}

// OptBool returns a boolean argument, or nil when absent.
func (a *Args) OptBool(key string) *bool {
	if !a.Has(key) {
		return nil
	}
	b := a.Bool(key, false)
	return &b
}

// Float returns a finite number argument (integers accepted), or def when
// absent. NaN and infinities are refused.
func (a *Args) Float(key string, def float64) float64 {
	v, ok := a.get(key)
	if !ok {
		return def
	}
	f, ok := toFloat(v)
	if !ok {
		a.fail(key, "a number", v)
		return def
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		a.Failf("argument %q must be a finite number", key)
		return def
	}
	return f
}

// Int returns an integer argument within [min, max], or def when absent.
func (a *Args) Int(key string, def, min, max int64) int64 {
	v, ok := a.get(key)
	if !ok {
		return def
	}
	n, ok := toInt(v)
	if !ok {
		a.fail(key, "an integer", v)
		return def
	}
	if n < min || n > max {
		a.Failf("argument %q must be between %d and %d, got %d", key, min, max, n)
		return def
	}
	return n
}

// StringList returns a list of strings, at most maxLen long.
func (a *Args) StringList(key string, maxLen int) []string {
	v, ok := a.get(key)
	if !ok {
		return nil
	}
	l, ok := v.([]any)
	if !ok {
		a.fail(key, "a list of strings", v)
		return nil
	}
	if len(l) > maxLen {
		a.Failf("argument %q has %d items, at most %d allowed", key, len(l), maxLen)
		return nil
	}
	out := make([]string, 0, len(l))
	for i, x := range l {
		s, ok := x.(string)
		if !ok {
			a.Failf("argument %q item %d must be a string, got %s", key, i, typeName(x))
			return nil
		}
		out = append(out, s)
	}
	return out
}

// IntList returns a list of integers, at most maxLen long.
func (a *Args) IntList(key string, maxLen int) []int64 {
	v, ok := a.get(key)
	if !ok {
		return nil
	}
	l, ok := v.([]any)
	if !ok {
		a.fail(key, "a list of integers", v)
		return nil
	}
	if len(l) > maxLen {
		a.Failf("argument %q has %d items, at most %d allowed", key, len(l), maxLen)
		return nil
	}
	out := make([]int64, 0, len(l))
	for i, x := range l {
		n, ok := toInt(x)
		if !ok {
			a.Failf("argument %q item %d must be an integer, got %s", key, i, typeName(x))
			return nil
		}
		out = append(out, n)
	}
	return out
}

// StringMap returns a map of string to string, at most maxLen entries.
func (a *Args) StringMap(key string, maxLen int) map[string]string {
	v, ok := a.get(key)
	if !ok {
		return nil
	}
	return a.toStringMap(key, v, maxLen)
}

func (a *Args) toStringMap(key string, v any, maxLen int) map[string]string {
	m, ok := v.(map[string]any)
	if !ok {
		a.fail(key, "a map of strings", v)
		return nil
	}
	if len(m) > maxLen {
		a.Failf("argument %q has %d entries, at most %d allowed", key, len(m), maxLen)
		return nil
	}
	out := make(map[string]string, len(m))
	for k, x := range m {
		switch s := x.(type) {
		case string:
			out[k] = s
		default:
			a.Failf("argument %q entry %q must be a string, got %s", key, k, typeName(x))
			return nil
		}
	}
	return out
}

// Sub returns a nested map argument as Args of its own (empty when absent).
// Keys of the nested map are checked by the returned Args' Done.
func (a *Args) Sub(key string) *Args {
	v, ok := a.get(key)
	if !ok {
		return &Args{m: map[string]any{}}
	}
	m, ok := v.(map[string]any)
	if !ok {
		a.fail(key, "a map", v)
		return &Args{m: map[string]any{}}
	}
	return &Args{m: m}
}

// Err returns the first validation error, if any.
func (a *Args) Err() *Error { return a.err }

// Done returns the first validation error, or a bad_request naming the
// arguments the op does not know.
func (a *Args) Done(what string) *Error {
	if a.err != nil {
		return a.err
	}
	var unknown []string
	for k := range a.m {
		if !a.used[k] {
			unknown = append(unknown, fmt.Sprintf("%q", k))
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return Errorf(CodeBadRequest, "unknown %s %s", what, strings.Join(unknown, ", "))
	}
	return nil
}

func toFloat(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, true
	case float32:
		return float64(n), true
	}
	if i, ok := toInt(v); ok {
		return float64(i), true
	}
	return 0, false
}

func toInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int8:
		return int64(n), true
	case int16:
		return int64(n), true
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case int:
		return int64(n), true
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	case uint64:
		if n > math.MaxInt64 {
			return 0, false
		}
		return int64(n), true
	case uint:
		return toInt(uint64(n))
	}
	return 0, false
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "nil"
	case string:
		return "a string"
	case []byte:
		return "bytes"
	case bool:
		return "a boolean"
	case float32, float64:
		return "a float"
	case []any:
		return "a list"
	case map[string]any:
		return "a map"
	}
	if _, ok := toInt(v); ok {
		return "an integer"
	}
	return fmt.Sprintf("%T", v)
}
