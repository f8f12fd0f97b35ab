package bwrap

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// sandboxZygotes lists the sandbox's processes that run the code runtime
// (the zygote and its forks, the contexts), as a command in it sees them.
func sandboxZygotes(t *testing.T, b *Backend, id string) []string {
	t.Helper()
	return strings.Fields(runOK(t, b, id, `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null | grep -q '^python3 /proc/self/fd/4' && echo ${p#/proc/}; done; true`))
}

func cell(t *testing.T, b *Backend, id, code string) backend.CodeResult {
	t.Helper()
	res, err := b.RunCode(context.Background(), id, backend.CodeRequest{Code: code, Timeout: time.Minute, MaxOutputBytes: 1 << 20})
	if err != nil {
		t.Fatalf("RunCode(%q): %v", code, err)
	}
	return res
}

// A warm-pool member whose image's contexts preload modules has its code
// zygote started, and its preloads imported, by Warm: the first cell's
// context is a fork of that zygote. Without preloads Warm starts none,
// and the first cell starts it.
func TestBwrapWarmStartsTheCodeZygote(t *testing.T) {
	for _, mode := range allModes {
		t.Run(mode.name, func(t *testing.T) {
			b := newTestBackend(t, mode, func(c *Config) { c.Code.Preload = []string{"decimal"} })
			id := create(t, b, backend.Spec{})
			if err := b.Warm(context.Background(), id); err != nil {
				t.Fatalf("Warm: %v", err)
			}
			zygotes := sandboxZygotes(t, b, id)
			if len(zygotes) != 1 {
				t.Fatalf("after Warm, the sandbox runs %d code runtimes (%v), want the zygote", len(zygotes), zygotes)
			}
			res := cell(t, b, id, "import os, sys\nos.getppid(), 'decimal' in sys.modules")
			if want := fmt.Sprintf("(%s, True)", zygotes[0]); len(res.Results) != 1 || res.Results[0]["text/plain"] != want {
				t.Errorf("the first cell's context: %+v, want %s (a fork of the warm zygote, decimal imported)", res, want)
			}
			if err := b.Warm(context.Background(), id); err != nil {
				t.Fatalf("Warm again: %v", err)
			}

			plain := newTestBackend(t, mode)
			id = create(t, plain, backend.Spec{})
			if err := plain.Warm(context.Background(), id); err != nil {
				t.Fatalf("Warm: %v", err)
			}
			if z := sandboxZygotes(t, plain, id); len(z) != 0 {
				t.Errorf("Warm without preloads started a code runtime: %v", z)
			}
			if res := cell(t, plain, id, "6 * 7"); len(res.Results) != 1 || res.Results[0]["text/plain"] != "42" {
				t.Errorf("the first cell: %+v", res)
			}
		})
	}
}
