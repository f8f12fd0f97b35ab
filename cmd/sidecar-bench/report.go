package main

import (
	"fmt"
	"io"
	"os"
	"strings"
)

func printTable(w io.Writer, rep *report) {
	fmt.Fprintf(w, "\n%-10s %-58s %s\n", "SCENARIO", "MEASURE", "VALUES")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "%-10s %-58s %s\n", r.Scenario, r.Name, formatValues(r.Values))
	}
}

// writeMarkdown replaces the generated part of path (between the markers)
// with this run's table, keeping the hand-written analysis around it.
func writeMarkdown(path string, rep *report) error {
	const begin, end = "<!-- BEGIN GENERATED: sidecar-bench -->", "<!-- END GENERATED -->"
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", begin)
	fmt.Fprintf(&b, "Run: %s · Machine: %s · %s", rep.Date, rep.Machine, rep.Go)
	if rep.Quick {
		fmt.Fprintf(&b, " · **quick smoke run, not a measurement**")
	}
	fmt.Fprintf(&b, "\n\n| scenario | measure | values | note |\n|---|---|---|---|\n")
	for _, r := range rep.Results {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", r.Scenario, r.Name, formatValues(r.Values), r.Note)
	}
	fmt.Fprintf(&b, "%s\n", end)

	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	s := string(old)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	switch {
	case i >= 0 && j > i:
		s = s[:i] + b.String() + s[j+len(end)+1:]
	default:
		s = "# Benchmarks\n\nRegenerate with `make bench` (runs `sidecar-bench --md docs/benchmarks.md`).\n\n" + b.String() + s
	}
	return os.WriteFile(path, []byte(s), 0o644)
}
