package bwrap

import (
	"context"
	"fmt"
	"slices"
	"strconv"
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
// context is a fork of that zygote (a spare it forked ahead, or, the
// spare killed, another). Without preloads Warm starts none, and the
// first cell starts it.
func TestBwrapWarmStartsTheCodeZygote(t *testing.T) {
	for _, mode := range allModes {
		t.Run(mode.name, func(t *testing.T) {
			b := newTestBackend(t, mode, func(c *Config) { c.Code.Preload = []string{"decimal"} })
			id := create(t, b, backend.Spec{})
			if err := b.Warm(context.Background(), id); err != nil {
				t.Fatalf("Warm: %v", err)
			}
			// The zygote, and the context it forked ahead.
			runtimes := sandboxZygotes(t, b, id)
			if len(runtimes) != 2 {
				t.Fatalf("after Warm, the sandbox runs %d code runtimes (%v), want the zygote and its spare context", len(runtimes), runtimes)
			}
			// A spare that dies (the sandbox's processes may kill it) is
			// not handed out: the first cell gets another fork.
			spare := strings.TrimSpace(runOK(t, b, id, fmt.Sprintf(`for p in %s; do [ "$(cut -d' ' -f4 /proc/$p/stat)" != 1 ] && echo $p; done; true`, strings.Join(runtimes, " "))))
			if spare == "" {
				t.Fatalf("no spare context among %v", runtimes)
			}
			runOK(t, b, id, "kill -9 "+spare)
			deadline := time.Now().Add(10 * time.Second)
			for run(t, b, id, "kill -0 "+spare).ExitCode == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("the killed spare %s was not reaped", spare)
				}
				time.Sleep(20 * time.Millisecond)
			}
			runtimes = sandboxZygotes(t, b, id)
			res := cell(t, b, id, "import os, sys\nos.getpid(), os.getppid(), 'decimal' in sys.modules")
			var pid, ppid int
			var imported bool
			if len(res.Results) == 1 {
				fmt.Sscanf(fmt.Sprint(res.Results[0]["text/plain"]), "(%d, %d, %t)", &pid, &ppid, &imported)
			}
			if !imported || strconv.Itoa(pid) == spare || !slices.Contains(runtimes, strconv.Itoa(ppid)) {
				t.Errorf("the first cell's context: %+v, want one of %v forked by the other (the warm zygote), decimal imported", res, runtimes)
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
