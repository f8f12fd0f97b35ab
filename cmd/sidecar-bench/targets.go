package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// A target bounds one value of a row: what the project asks of that
// measurement (the command path and provisioning since issue #19, gVisor
// since #17, memory and recovery since the daemon's first benchmarks).
// The report says beside each row whether this run met it, so the table
// answers "against what" by itself. A bound is inclusive.
type target struct {
	Key     string  `json:"key"`
	Bound   float64 `json:"bound"`
	AtLeast bool    `json:"at_least,omitempty"` // otherwise at most
}

func atMost(key string, bound float64) target  { return target{Key: key, Bound: bound} }
func atLeast(key string, bound float64) target { return target{Key: key, Bound: bound, AtLeast: true} }

func (t target) String() string {
	op := "≤"
	if t.AtLeast {
		op = "≥"
	}
	return fmt.Sprintf("%s %s %s", t.Key, op, strconv.FormatFloat(t.Bound, 'f', -1, 64))
}

// metBy says whether values meet t. A value the row does not have meets
// nothing (report.add refuses such a target before it gets here).
func (t target) metBy(values map[string]float64) bool {
	v, ok := values[t.Key]
	if !ok {
		return false
	}
	if t.AtLeast {
		return v >= t.Bound
	}
	return v <= t.Bound
}

// metAll is nil for a row without targets, else whether every one is met.
func metAll(ts []target, values map[string]float64) *bool {
	if len(ts) == 0 {
		return nil
	}
	met := true
	for _, t := range ts {
		met = met && t.metBy(values)
	}
	return &met
}

// checkTargets refuses a target naming a value the row does not measure:
// a renamed key would otherwise read as a target silently not met. The
// smoke run in scripts/test.sh adds every row, so it catches one.
func checkTargets(name string, values map[string]float64, ts []target) {
	for _, t := range ts {
		if _, ok := values[t.Key]; !ok {
			keys := make([]string, 0, len(values))
			for k := range values {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			panic(fmt.Sprintf("sidecar-bench: row %q has a target on %q but measures only %s", name, t.Key, strings.Join(keys, ", ")))
		}
	}
}

func targetText(ts []target) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = t.String()
	}
	return strings.Join(parts, ", ")
}

func metText(met *bool) string {
	switch {
	case met == nil:
		return ""
	case *met:
		return "met"
	default:
		return "**not met**"
	}
}
