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
		line := fmt.Sprintf("%-10s %-58s %s", r.Scenario, r.Name, formatValues(r.Values))
		if r.Met != nil {
			line += fmt.Sprintf("  [%s: %s]", targetText(r.Targets), plainMet(r.Met))
		}
		fmt.Fprintln(w, line)
	}
	if s := targetSummary(rep, plainMet); s != "" {
		fmt.Fprintf(w, "\n%s\n", s)
	}
}

func plainMet(met *bool) string {
	if met != nil && !*met {
		return "NOT MET"
	}
	return metText(met)
}

// targetSummary counts the rows with targets and names those not met, or
// is empty when no row has one.
func targetSummary(rep *report, name func(*bool) string) string {
	var with int
	var missed []string
	for _, r := range rep.Results {
		if r.Met == nil {
			continue
		}
		with++
		if !*r.Met {
			missed = append(missed, r.Scenario+": "+r.Name)
		}
	}
	if with == 0 {
		return ""
	}
	s := fmt.Sprintf("Targets: %d of %d rows with a target %s", with-len(missed), with, name(ptr(true)))
	if len(missed) > 0 {
		s += fmt.Sprintf("; %s: %s", name(ptr(false)), strings.Join(missed, "; "))
	}
	return s + "."
}

func ptr[T any](v T) *T { return &v }

const mdBegin, mdEnd = "<!-- BEGIN GENERATED: sidecar-bench -->", "<!-- END GENERATED -->"

// markdownTable is the generated block: the run, the machine, the rows
// with their targets and whether this run met them, and a count.
func markdownTable(rep *report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", mdBegin)
	fmt.Fprintf(&b, "Run: %s · Machine: %s · %s", rep.Date, rep.Machine, rep.Go)
	if rep.Quick {
		fmt.Fprintf(&b, " · **quick smoke run, not a measurement**")
	}
	fmt.Fprintf(&b, "\n\n| scenario | measure | values | target | met? | note |\n|---|---|---|---|---|---|\n")
	for _, r := range rep.Results {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", r.Scenario, r.Name, formatValues(r.Values), targetText(r.Targets), metText(r.Met), r.Note)
	}
	if s := targetSummary(rep, metText); s != "" {
		fmt.Fprintf(&b, "\n%s\n", s)
	}
	fmt.Fprintf(&b, "%s\n", mdEnd)
	return b.String()
}

// writeMarkdown replaces the generated part of path (between the markers)
// with this run's table, keeping the hand-written text around it.
func writeMarkdown(path string, rep *report) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	return os.WriteFile(path, []byte(spliceGenerated(string(old), markdownTable(rep))), 0o644)
}

// spliceGenerated puts block (markers included) where doc's markers are,
// or at the top of a doc that has none.
func spliceGenerated(doc, block string) string {
	i, j := strings.Index(doc, mdBegin), strings.Index(doc, mdEnd)
	if i >= 0 && j > i {
		rest := doc[j+len(mdEnd):]
		rest = strings.TrimPrefix(rest, "\n")
		return doc[:i] + block + rest
	}
	return "# Benchmarks\n\nRegenerate with `make bench` (runs `sidecar-bench --md docs/benchmarks.md`).\n\n" + block + doc
}
