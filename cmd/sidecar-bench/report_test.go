package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTargetMet(t *testing.T) {
	values := map[string]float64{"p50_ratio": 0.3, "commands_per_s": 150, "p99_ms": 1000.5}
	cases := []struct {
		target target
		met    bool
	}{
		{atMost("p50_ratio", 0.3), true}, // a bound is inclusive
		{atMost("p50_ratio", 0.29), false},
		{atLeast("commands_per_s", 150), true},
		{atLeast("commands_per_s", 150.1), false},
		{atMost("p99_ms", 1000), false},
		{atMost("absent", 1), false},
	}
	for _, c := range cases {
		if got := c.target.metBy(values); got != c.met {
			t.Errorf("%v on %v: met %v, want %v", c.target, values, got, c.met)
		}
	}
	if metAll(nil, values) != nil {
		t.Error("a row without targets has a verdict")
	}
	if m := metAll([]target{atMost("p50_ratio", 0.3), atMost("p99_ms", 1000)}, values); m == nil || *m {
		t.Error("a row missing one of two targets counts as met")
	}
	if got := atLeast("req_per_s", 20000).String(); got != "req_per_s ≥ 20000" {
		t.Errorf("target text %q", got)
	}
}

func TestAddRefusesATargetOnAValueNotMeasured(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("a target on a value the row lacks was accepted")
		}
	}()
	var rep report
	rep.add("command", "ratio", map[string]float64{"p50_ratio": 0.2}, "", atMost("p99_ratio", 0.5))
}

func TestMarkdownReplacesOnlyTheGeneratedBlock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	before := "# Benchmarks\n\nHand-written intro.\n\n" + mdBegin + "\nan old table\n" + mdEnd + "\n\n## Notes\n\nHand-written notes.\n"
	if err := os.WriteFile(path, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	var rep report
	rep.Date, rep.Machine, rep.Go = "2026-12-05 10:00 UTC", "2 cores", "go1.26"
	rep.add("rpc", "health latency", map[string]float64{"p50_us": 30}, "the daemon's own cost", atMost("p50_us", 100))
	rep.add("gvisor", "ratio gvisor/bare runsc exec [/bin/true]", map[string]float64{"p50_ratio": 0.59}, "", atMost("p50_ratio", 0.5))
	rep.add("rpc", "health throughput", map[string]float64{"req_per_s": 26000}, "")
	if err := writeMarkdown(path, &rep); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, want := range []string{
		"# Benchmarks\n\nHand-written intro.\n\n" + mdBegin + "\n",
		"| rpc | health latency | p50_us=30 | p50_us ≤ 100 | met | the daemon's own cost |\n",
		"| gvisor | ratio gvisor/bare runsc exec [/bin/true] | p50_ratio=0.590 | p50_ratio ≤ 0.5 | **not met** |  |\n",
		"| rpc | health throughput | req_per_s=26000 |  |  |  |\n",
		"Targets: 1 of 2 rows with a target met; **not met**: gvisor: ratio gvisor/bare runsc exec [/bin/true].\n",
		mdEnd + "\n\n## Notes\n\nHand-written notes.\n",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("the rewritten page lacks %q:\n%s", want, doc)
		}
	}
	if strings.Contains(doc, "an old table") {
		t.Errorf("the old table is still there:\n%s", doc)
	}
	// Run again: the page keeps one block and its text around it.
	if err := writeMarkdown(path, &rep); err != nil {
		t.Fatal(err)
	}
	again, _ := os.ReadFile(path)
	if string(again) != doc {
		t.Errorf("a second write changed the page:\n%s", again)
	}
}

func TestMarkdownWithoutMarkersGoesOnTop(t *testing.T) {
	var rep report
	rep.add("rpc", "x", map[string]float64{"n": 1}, "")
	got := spliceGenerated("older text\n", markdownTable(&rep))
	if !strings.HasPrefix(got, "# Benchmarks\n") || !strings.HasSuffix(got, mdEnd+"\nolder text\n") {
		t.Errorf("page without markers:\n%s", got)
	}
	if strings.Contains(got, "Targets:") {
		t.Errorf("a run without targets counts them:\n%s", got)
	}
}
