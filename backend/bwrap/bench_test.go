package bwrap

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
	"github.com/sandbox-sidecar/sandbox-sidecar/capture"
)

// BenchmarkExecInterleaved compares, in one run and alternating every
// iteration, two ways of running the same command:
//
//   - host: the program run directly on the host, no sandbox: the floor;
//   - init: Exec, through the sandbox's persistent init.
//
// It reports the p50 and p99 of each in milliseconds and init's p50 and
// p99 as a multiple of the host's. (Until every command went through init,
// a third way, a bubblewrap of its own per command, was measured too:
// docs/benchmarks-history.md keeps the outcome.) Run it with a fixed count,
// for example
//
//	CI=true go test -run '^$' -bench ExecInterleaved -benchtime 300x ./backend/bwrap
func BenchmarkExecInterleaved(b *testing.B) {
	workloads := []struct {
		name string
		argv []string
	}{
		{"true", []string{"/bin/true"}},
		// The pyenv python3 on PATH is not visible in the sandbox.
		{"python", []string{"/usr/bin/python3", "-c", "pass"}},
	}
	for _, m := range allModes {
		for _, w := range workloads {
			b.Run(m.name+"/"+w.name, func(b *testing.B) {
				be := newBenchBackend(b, m)
				ctx := context.Background()
				id := "bench-" + w.name
				if _, err := be.Create(ctx, id, backend.Spec{}); err != nil {
					b.Fatal(err)
				}
				defer be.Destroy(ctx, id)
				req := backend.ExecRequest{Argv: w.argv, Timeout: 30 * time.Second}
				viaInit := func() {
					res, err := be.Exec(ctx, id, req)
					if err != nil || res.ExitCode != 0 {
						b.Fatalf("Exec %q: %+v %v", w.argv, res, err)
					}
				}
				host := func() {
					res, err := capture.Run(ctx, exec.Command(w.argv[0], w.argv[1:]...), capture.Options{Timeout: req.Timeout})
					if err != nil || res.ExitCode != 0 {
						b.Fatalf("host %q: %+v %v", w.argv, res, err)
					}
				}
				viaInit() // the first command may wait for the init Create started: not what is measured
				runs := interleaved(b, []benchWay{{name: "host", f: host}, {name: "init", f: viaInit}})
				h, in := runs[0].d, runs[1].d
				b.ReportMetric(float64(percentile(in, 50))/float64(percentile(h, 50)), "ratio-p50")
				b.ReportMetric(float64(percentile(in, 99))/float64(percentile(h, 99)), "ratio-p99")
				b.ReportMetric(0, "ns/op") // the sum of two ways means nothing
			})
		}
	}
}

// percentile returns the p-th percentile of d (nearest rank).
func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, (len(s)*p+99)/100-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func newBenchBackend(b *testing.B, m testMode) *Backend {
	if _, err := exec.LookPath("bwrap"); err != nil {
		skipOrFail(b, "bubblewrap is not installed: %v", err)
	}
	if m.uid >= 0 && os.Geteuid() != 0 {
		skipOrFail(b, "uid %d needs root", m.uid)
	}
	dir := filepath.Join(b.TempDir(), "state")
	for p := filepath.Dir(dir); p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
		_ = os.Chmod(p, 0o711)
	}
	be, err := New(m.config(dir))
	if err != nil {
		skipOrFail(b, "%v", err)
	}
	return be
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i))
	}
	for p, want := range map[int]time.Duration{50: 50, 99: 99, 100: 100, 1: 1} {
		if got := percentile(d, p); got != want {
			t.Errorf("percentile(1..100, %d) = %d, want %d", p, got, want)
		}
	}
	if got := percentile([]time.Duration{7}, 99); got != 7 {
		t.Errorf("percentile of one = %v", got)
	}
}

// BenchmarkReadFileInterleaved compares, alternating every iteration, a
// 4 KiB ReadFile as it is served (opened inside the sandbox by its opener,
// the descriptor passed back) with the host-side read of the same file
// through os.Root that workspace reads used before (hostfs.Read), and
// reports each one's p50 and p99 in milliseconds:
//
//	CI=true go test -run '^$' -bench ReadFileInterleaved -benchtime 300x ./backend/bwrap
func BenchmarkReadFileInterleaved(b *testing.B) {
	be := newBenchBackend(b, daemonUID)
	ctx := context.Background()
	id := "bench-read"
	if _, err := be.Create(ctx, id, backend.Spec{}); err != nil {
		b.Fatal(err)
	}
	defer be.Destroy(ctx, id)
	if err := be.WriteFile(ctx, id, "f", make([]byte, 4096), 0); err != nil {
		b.Fatal(err)
	}
	guest := func() {
		if data, err := be.ReadFile(ctx, id, "f", 1<<20); err != nil || len(data) != 4096 {
			b.Fatalf("ReadFile: %d bytes, %v", len(data), err)
		}
	}
	host := func() {
		err := be.inArea(ctx, id, "f", func(sb *sandbox, root *os.Root, rel string) error {
			data, err := hostfs.Read(root, rel, "f", 1<<20)
			if err == nil && len(data) != 4096 {
				err = os.ErrInvalid
			}
			return err
		})
		if err != nil {
			b.Fatalf("host read: %v", err)
		}
	}
	guest() // starts init and its opener: not what is measured
	interleaved(b, []benchWay{{name: "host", f: host}, {name: "guest", f: guest}})
}

// benchWay is one way of doing what a benchmark compares, and how long
// each run of it took.
type benchWay struct {
	name string
	f    func()
	d    []time.Duration
}

// interleaved runs every way once per iteration, rotating the order so
// that no way always follows another, reports each one's p50 and p99, and
// returns the ways with their durations.
func interleaved(b *testing.B, ways []benchWay) []benchWay {
	i := 0
	for b.Loop() {
		for k := range ways {
			w := &ways[(i+k)%len(ways)]
			start := time.Now()
			w.f()
			w.d = append(w.d, time.Since(start))
		}
		i++
	}
	for _, w := range ways {
		b.ReportMetric(ms(percentile(w.d, 50)), w.name+"-p50-ms")
		b.ReportMetric(ms(percentile(w.d, 99)), w.name+"-p99-ms")
	}
	return ways
}

// BenchmarkInitStart starts and stops a sandbox's init (what a cold
// sandbox's first command pays), and times the warm-up command a pool
// member's Warm then has it run (warmInit), with the daemon's own binary as
// init unless SANDBOX_SIDECAR_BENCH_INIT names one:
//
//	CI=true go test -run '^$' -bench InitStart -benchtime 100x ./backend/bwrap
func BenchmarkInitStart(b *testing.B) {
	be := newBenchBackend(b, daemonUID)
	if p := os.Getenv("SANDBOX_SIDECAR_BENCH_INIT"); p != "" {
		dir := filepath.Join(b.TempDir(), "state")
		cfg := daemonUID.config(dir)
		cfg.InitPath = p
		var err error
		if be, err = New(cfg); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	const id = "bench-init-start"
	if _, err := be.Create(ctx, id, backend.Spec{}); err != nil {
		b.Fatal(err)
	}
	defer be.Destroy(ctx, id)
	sb, err := be.lookup(id)
	if err != nil {
		b.Fatal(err)
	}
	// Create began a start: wait for it and stop its init, so that every
	// round below starts one.
	if err := be.Warm(ctx, id); err != nil {
		b.Fatal(err)
	}
	forgetInit(be, sb)
	var starts, warmUps []time.Duration
	for b.Loop() {
		sb.initMu.Lock()
		start := time.Now()
		ip, err := be.startInit(ctx, sb, start.Add(initStartTimeout))
		if err != nil {
			sb.initMu.Unlock()
			b.Fatal(err)
		}
		started := time.Now()
		sb.init = ip
		err = be.warmInit(ctx, sb, ip)
		warmUps = append(warmUps, time.Since(started))
		starts = append(starts, started.Sub(start))
		sb.initMu.Unlock()
		if err != nil {
			b.Fatal(err)
		}
		forgetInit(be, sb)
	}
	b.ReportMetric(ms(percentile(starts, 50)), "start-p50-ms")
	b.ReportMetric(ms(percentile(starts, 99)), "start-p99-ms")
	b.ReportMetric(ms(percentile(warmUps, 50)), "warmup-p50-ms")
	b.ReportMetric(ms(percentile(warmUps, 99)), "warmup-p99-ms")
	b.ReportMetric(0, "ns/op")
}
