package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
)

// --- 3b. The first commands of a pool member --------------------------

// firstPositions are the commands of a sandbox the "first" scenario
// reports (1-based); it runs up to the last of them in each sandbox.
var firstPositions = []int{1, 2, 5, 10, 20}

// firstPool is the warm pool's size in the "first" scenario.
const firstPool = 2

// benchFirst times commands 1..20 in sandboxes just claimed from a warm
// pool: the pool is there so that an agent's first steps are fast, and a
// member warm for its tenth command but not its first misses the point.
// Two ways, in turn, on a daemon with default limits (a cgroup and a disk
// of its own per sandbox), its pool full before each:
//
//   - a pool member whose commands start as soon as it is claimed, as an
//     agent's do (the refill of the member it took is due then);
//   - a sandbox that has run many commands, after the same pause: what the
//     first commands after a pause cost in any sandbox (cold caches, a
//     runtime gone idle), not because the sandbox is new.
func benchFirst(o options, rep *report) error {
	rounds := 20
	if o.quick {
		rounds = 3
	}
	_, c, stop, err := startWithClient(o, "--pool-size", fmt.Sprint(firstPool))
	if err != nil {
		return err
	}
	defer stop()
	waitPool := func() error {
		if !waitPooledFor(c, firstPool, time.Minute) {
			return fmt.Errorf("the pool did not fill within a minute")
		}
		return nil
	}
	if err := waitPool(); err != nil {
		return err
	}
	argv := []string{"/usr/bin/true"}
	last := firstPositions[len(firstPositions)-1]
	used, err := create(c, map[string]any{"ttl_s": 3600})
	if err != nil {
		return err
	}
	for range 3 * last {
		if _, err := runCmd(c, used, argv); err != nil {
			return err
		}
	}
	ways := []struct {
		name string
		note string
		// claim returns the sandbox to run in and whether to destroy it.
		claim func() (id string, fresh bool, err error)
	}{
		{fmt.Sprintf("a sandbox from a warm pool of %d, run as soon as claimed", firstPool),
			fmt.Sprintf("target: the 1st ≤ the %dth + 1 ms", last),
			func() (string, bool, error) {
				id, err := create(c, nil)
				return id, true, err
			}},
		{fmt.Sprintf("a sandbox that ran %d before, after the same pause", 3*last),
			"what a pause costs any sandbox's first commands",
			func() (string, bool, error) { return used, false, nil }},
	}
	// times[w][k]: way w's (k+1)th commands.
	times := make([][][]time.Duration, len(ways))
	for w := range times {
		times[w] = make([][]time.Duration, last)
	}
	for round := range rounds {
		for k := range ways {
			// Each round starts one further along, so that no way
			// always follows the same other.
			w := (round + k) % len(ways)
			way := ways[w]
			if err := waitPool(); err != nil {
				return err
			}
			id, fresh, err := way.claim()
			if err != nil {
				return fmt.Errorf("%s: %w", way.name, err)
			}
			for i := range last {
				start := time.Now()
				if _, err := runCmd(c, id, argv); err != nil {
					return fmt.Errorf("%s: command %d: %w", way.name, i+1, err)
				}
				times[w][i] = append(times[w][i], time.Since(start))
			}
			if fresh {
				if err := call(c, ipc.OpDestroy, map[string]any{"sandbox": id}, nil); err != nil {
					return fmt.Errorf("%s: destroy: %w", way.name, err)
				}
			}
		}
	}
	for w, way := range ways {
		p50 := func(k int) time.Duration { return percentile(times[w][k-1], 50) }
		var curve []string
		for k := 1; k <= last; k++ {
			curve = append(curve, formatNumber(ms(p50(k))))
		}
		fmt.Fprintf(os.Stderr, "   p50 of commands 1..%d (ms), %s: %s\n", last, way.name, strings.Join(curve, " "))
		vals := map[string]float64{}
		for _, k := range firstPositions {
			vals[fmt.Sprintf("p50_%02d_ms", k)] = ms(p50(k))
		}
		vals[fmt.Sprintf("1st_minus_%dth_p50_ms", last)] = ms(p50(1) - p50(last))
		rep.add("first", fmt.Sprintf("commands 1..%d %v in %s", last, argv, way.name), vals, way.note)
	}
	return nil
}
