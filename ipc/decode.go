package ipc

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Decode fills *dst, a request type of ipc/api, from a's arguments: each
// field under its msgpack key, read with Args' accessors (so a wrong type
// gets their exact bad_request message); a key the type does not name is
// refused. A request is decoded once, here, at the boundary;
// the handler gets the typed struct and never looks at Args again.
//
// A field's `wire` tag says what a value must be beyond its type:
//
//	required   the key must be given (a string must also be non-empty)
//	nonempty   given or not, a given list must not be empty
//	positive   a given number must be greater than 0
//	min=N      an integer's least value (default 0 for an unsigned meaning)
//	max=N      an integer's greatest value, or a list's or map's most entries
//	path       a string that may also arrive as bytes (a file name that is
//	           not UTF-8, as list_directory returns it)
//
// Presence is the type's to say: a pointer (*bool, *int64, *float64, *T) is
// nil when the key is absent (or nil), so a handler can tell "not given"
// from a zero. A nested struct is read from a map of its own, whose
// unknown keys are refused with the keys it takes.
func Decode(a *Args, dst any) *Error {
	v := reflect.ValueOf(dst)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		panic(fmt.Sprintf("ipc.Decode: %T is not a pointer to a struct", dst))
	}
	decodeStruct(a, v.Elem(), "")
	return a.Err()
}

// field is how Decode reads one struct field.
type field struct {
	index    int
	key      string
	kind     fieldKind
	required bool
	nonempty bool
	positive bool
	path     bool
	min, max int64
	hasMax   bool
	sub      *plan // for fieldStruct
}

type fieldKind int

const (
	fieldString fieldKind = iota
	fieldBytes
	fieldBool
	fieldOptBool
	fieldFloat
	fieldOptFloat
	fieldInt
	fieldOptInt
	fieldStrings
	fieldStringMap
	fieldInts
	fieldStruct
)

// plan is the fields of one request type, worked out once per type.
type plan struct {
	fields []field
	keys   []string // sorted, for the message that names what a map takes
}

var plans sync.Map // reflect.Type -> *plan

func planFor(t reflect.Type) *plan {
	if p, ok := plans.Load(t); ok {
		return p.(*plan)
	}
	p := &plan{}
	for i := range t.NumField() {
		sf := t.Field(i)
		key, _, _ := strings.Cut(sf.Tag.Get("msgpack"), ",")
		if key == "" || key == "-" || !sf.IsExported() {
			continue
		}
		f := field{index: i, key: key, min: math.MinInt64, max: math.MaxInt64}
		for opt := range strings.SplitSeq(sf.Tag.Get("wire"), ",") {
			name, val, _ := strings.Cut(opt, "=")
			switch name {
			case "":
			case "required":
				f.required = true
			case "nonempty":
				f.nonempty = true
			case "positive":
				f.positive = true
			case "path":
				f.path = true
			case "min", "max":
				n, err := strconv.ParseInt(val, 0, 64)
				if err != nil {
					panic(fmt.Sprintf("ipc: %s.%s: bad wire tag %q", t, sf.Name, opt))
				}
				if name == "min" {
					f.min = n
				} else {
					f.max, f.hasMax = n, true
				}
			default:
				panic(fmt.Sprintf("ipc: %s.%s: unknown wire tag option %q", t, sf.Name, opt))
			}
		}
		f.kind = kindOf(t, sf)
		if f.kind == fieldStruct {
			st := sf.Type
			if st.Kind() == reflect.Pointer {
				st = st.Elem()
			}
			f.sub = planFor(st)
		}
		p.fields = append(p.fields, f)
		p.keys = append(p.keys, key)
	}
	slices.Sort(p.keys)
	actual, _ := plans.LoadOrStore(t, p)
	return actual.(*plan)
}

func kindOf(t reflect.Type, sf reflect.StructField) fieldKind {
	ft := sf.Type
	switch ft.Kind() {
	case reflect.String:
		return fieldString
	case reflect.Bool:
		return fieldBool
	case reflect.Float64:
		return fieldFloat
	case reflect.Int, reflect.Int64:
		return fieldInt
	case reflect.Struct:
		return fieldStruct
	case reflect.Map:
		if ft.Key().Kind() == reflect.String && ft.Elem().Kind() == reflect.String {
			return fieldStringMap
		}
	case reflect.Slice:
		switch ft.Elem().Kind() {
		case reflect.Uint8:
			return fieldBytes
		case reflect.String:
			return fieldStrings
		case reflect.Int, reflect.Int64:
			return fieldInts
		}
	case reflect.Pointer:
		switch ft.Elem().Kind() {
		case reflect.Bool:
			return fieldOptBool
		case reflect.Float64:
			return fieldOptFloat
		case reflect.Int, reflect.Int64:
			return fieldOptInt
		case reflect.Struct:
			return fieldStruct
		}
	}
	panic(fmt.Sprintf("ipc: %s.%s: Decode cannot read a %s", t, sf.Name, ft))
}

// decodeStruct reads every field of v's type from a; in names the map it
// is nested in ("" at the top), for the messages. A key the type does not
// name is refused first: a misspelt "sandbx" is named as such, not
// reported as a missing "sandbox".
func decodeStruct(a *Args, v reflect.Value, in string) {
	p := planFor(v.Type())
	var unknown []string
	for k := range a.m {
		if _, found := slices.BinarySearch(p.keys, k); !found {
			unknown = append(unknown, strconv.Quote(k))
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		what, takes := "argument", "this op takes "
		if in != "" {
			what, takes = in+" field", strconv.Quote(in)+" takes "
		}
		if len(p.keys) == 0 {
			takes = "this op takes no arguments"
		} else {
			takes += strings.Join(p.keys, ", ")
		}
		a.Failf("unknown %s %s; %s", what, strings.Join(unknown, ", "), takes)
		return
	}
	for i := range p.fields {
		if a.Err() != nil {
			return
		}
		decodeField(a, &p.fields[i], v.Field(p.fields[i].index))
	}
}

func decodeField(a *Args, f *field, out reflect.Value) {
	key := f.key
	switch f.kind {
	case fieldString:
		var s string
		if f.path {
			b, ok := a.Bytes(key, f.required)
			if ok && f.required && len(b) == 0 {
				a.Failf("argument %q must not be empty", key)
			}
			s = string(b)
		} else {
			s = a.String(key, f.required)
		}
		out.SetString(s)
	case fieldBytes:
		b, _ := a.Bytes(key, f.required)
		out.SetBytes(b)
	case fieldBool:
		if f.required && !a.Has(key) {
			a.Failf("argument %q (a boolean) is required", key)
			return
		}
		out.SetBool(a.Bool(key, false))
	case fieldOptBool:
		if b := a.OptBool(key); b != nil {
			out.Set(reflect.ValueOf(b))
		}
	case fieldFloat, fieldOptFloat:
		if !a.Has(key) {
			if f.required {
				a.Failf("argument %q (a number) is required", key)
			}
			return
		}
		x := a.Float(key, 0)
		if a.Err() == nil && f.positive && (x <= 0 || f.hasMax && x > float64(f.max)) {
			f.notPositive(a, fmt.Sprint(x))
		}
		if f.kind == fieldFloat {
			out.SetFloat(x)
		} else {
			out.Set(reflect.ValueOf(&x))
		}
	case fieldInt, fieldOptInt:
		if !a.Has(key) {
			if f.required {
				a.Failf("argument %q (an integer) is required", key)
			}
			return
		}
		n := a.Int(key, 0, math.MinInt64, math.MaxInt64)
		switch {
		case a.Err() != nil:
			return
		case f.positive && (n <= 0 || n > f.max):
			f.notPositive(a, fmt.Sprint(n))
		case n < f.min || n > f.max:
			a.Failf("argument %q must be between %d and %d, got %d", key, f.min, f.max, n)
		}
		if f.kind == fieldInt {
			out.SetInt(n)
		} else {
			pv := reflect.New(out.Type().Elem())
			pv.Elem().SetInt(n)
			out.Set(pv)
		}
	case fieldStrings:
		l := a.StringList(key, f.maxLen())
		if a.Err() == nil && l != nil {
			if f.nonempty && len(l) == 0 {
				a.Failf("argument %q must not be empty", key)
			}
			out.Set(reflect.ValueOf(l))
		} else if f.required && a.Err() == nil {
			a.Failf("argument %q is required", key)
		}
	case fieldInts:
		l := a.IntList(key, f.maxLen())
		if a.Err() == nil && l != nil {
			s := reflect.MakeSlice(out.Type(), len(l), len(l))
			for i, n := range l {
				s.Index(i).SetInt(n)
			}
			out.Set(s)
		}
	case fieldStringMap:
		m := a.StringMap(key, f.maxLen())
		switch {
		case a.Err() != nil:
		case m != nil:
			out.Set(reflect.ValueOf(m))
		case f.required:
			a.Failf("argument %q (a map of strings) is required", key)
		}
	case fieldStruct:
		if !a.Has(key) {
			if f.required {
				a.Failf("argument %q (a map) is required", key)
			}
			return
		}
		sub := a.Sub(key)
		if a.Err() != nil {
			return
		}
		target := out
		if out.Kind() == reflect.Pointer {
			target = reflect.New(out.Type().Elem())
			out.Set(target)
			target = target.Elem()
		}
		decodeStruct(sub, target, key)
		if err := sub.Err(); err != nil {
			msg := err.Message
			if !strings.HasPrefix(msg, "unknown ") {
				msg = fmt.Sprintf("in %q: %s", key, msg)
			}
			a.Failf("%s", msg)
		}
	}
}

// notPositive refuses a number that a positive field may not hold.
func (f *field) notPositive(a *Args, got string) {
	bound := ""
	if f.hasMax {
		bound = fmt.Sprintf(" and at most %d", f.max)
	}
	hint := ""
	if !f.required {
		hint = "; leave it out for the daemon's default"
	}
	a.Failf("argument %q must be greater than 0%s, got %s%s", f.key, bound, got, hint)
}

// maxLen is a list's or map's bound: its max tag, or what a frame can hold.
func (f *field) maxLen() int {
	if f.hasMax {
		return int(f.max)
	}
	return MaxItemsPerFrame
}
