// Command sidecar-bench measures sandbox-sidecar: RPC floor, command cost
// against a direct bubblewrap run with the same isolation, durable
// processes (start to first byte, a follower's wake-up) against a command,
// code contexts (a fresh context's first cell, a follow-up cell, pandas
// preloaded, their memory; bwrap, and gvisor where runsc is) against the
// commands they replace, provisioning (cold and from the warm pool), the
// first commands of a pool member, the gvisor backend against bwrap and a
// bare `runsc exec` (root and runsc only), output floods, scale and
// recovery. It starts its own
// daemons (temporary socket and state) unless pointed at one, measures
// every comparison side by side in one run, and writes a table, JSON, and
// docs/benchmarks.md.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"
)

type options struct {
	daemonBin string
	socket    string
	outJSON   string
	outMD     string
	only      string
	runsc     string
	quick     bool
	profile   string
	codeImage string // the code scenario's image with pandas (a rootfs tar or OCI layout)
	scenario  string // the one running, for profile directories
}

// result is one measured line of the report.
type result struct {
	Scenario string             `json:"scenario"`
	Name     string             `json:"name"`
	Values   map[string]float64 `json:"values"`
	Targets  []target           `json:"targets,omitempty"`
	Met      *bool              `json:"met,omitempty"` // every target met; nil without targets
	Note     string             `json:"note,omitempty"`
}

type report struct {
	Date    string   `json:"date"`
	Machine string   `json:"machine"`
	Go      string   `json:"go"`
	Quick   bool     `json:"quick"`
	Results []result `json:"results"`
}

func main() {
	var o options
	flag.StringVar(&o.daemonBin, "daemon-bin", "", "sandbox-sidecar binary to start (default: bin/sandbox-sidecar, else PATH)")
	flag.StringVar(&o.socket, "socket", "", "measure an already running daemon on this socket instead (memory and recovery scenarios need a daemon of our own and are skipped)")
	flag.StringVar(&o.outJSON, "json", "bench.json", "write machine-readable results here")
	flag.StringVar(&o.outMD, "md", "", "write the Markdown report here (e.g. docs/benchmarks.md)")
	flag.StringVar(&o.only, "only", "", "comma-separated scenarios to run (rpc,command,processes,code,provision,first,gvisor,output,scale,agents,recovery,sbx,snapshot,pause,gvpause)")
	flag.StringVar(&o.codeImage, "code-image", "", "an image with python3 and pandas (a rootfs tar or OCI layout, e.g. test/sandboximage's cached rootfs) for the code scenario's pandas rows (default: the host's python3 if it has pandas, else those rows are skipped)")
	flag.StringVar(&o.runsc, "runsc", "", "runsc for the gvisor scenario (default: $SANDBOX_SIDECAR_RUNSC, the pinned build scripts/install-runsc.sh caches, else PATH)")
	flag.BoolVar(&o.quick, "quick", false, "small counts: a smoke run, not a measurement")
	flag.StringVar(&o.profile, "profile", "", "profile every daemon the run starts (CPU, mutex, block, heap) into DIR/<n>-<scenario>/ (the daemon's "+"SANDBOX_SIDECAR_PROFILE testing hook)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "sidecar-bench:", err)
		os.Exit(1)
	}
}

// benchOpenFiles is the descriptor limit the daemons of a run get, as a
// systemd unit's would (systemd's default hard limit is 524288): each live
// sandbox holds ~4 of the daemon's descriptors (the scale rows'
// fds_per_sandbox), and the recovery scenario makes 10,000 of them.
const benchOpenFiles = 1 << 19

// raiseOpenFiles raises this process's descriptor limit to benchOpenFiles
// (the hard one too, as root), which the daemons it starts inherit: a
// shell's limit (20,000 on some machines) ends the recovery scenario with
// "too many open files". Setting it also keeps os/exec from handing the
// children the soft limit this process started with.
func raiseOpenFiles() {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return
	}
	if l.Max < benchOpenFiles && os.Geteuid() == 0 {
		l.Max = benchOpenFiles
	}
	l.Cur = min(l.Max, benchOpenFiles)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		fmt.Fprintf(os.Stderr, "sidecar-bench: could not raise the open-files limit to %d (%v); the recovery scenario may run out\n", l.Cur, err)
	}
}

func run(o options) error {
	if o.daemonBin == "" && o.socket == "" {
		if _, err := os.Stat("bin/sandbox-sidecar"); err == nil {
			o.daemonBin, _ = filepath.Abs("bin/sandbox-sidecar")
		} else if p, err := exec.LookPath("sandbox-sidecar"); err == nil {
			o.daemonBin = p
		} else {
			return fmt.Errorf("no daemon binary: build it (make build) or pass --daemon-bin or --socket")
		}
	}
	if o.daemonBin != "" {
		// Absolute: scenarios hand it to runsc, which resolves paths
		// elsewhere (make bench passes bin/sandbox-sidecar).
		abs, err := filepath.Abs(o.daemonBin)
		if err != nil {
			return err
		}
		o.daemonBin = abs
	}
	raiseOpenFiles()
	rep := &report{Date: time.Now().UTC().Format("2006-01-02 15:04 MST"), Machine: machine(), Go: runtime.Version(), Quick: o.quick}
	want := func(s string) bool { return o.only == "" || strings.Contains(","+o.only+",", ","+s+",") }
	scenarios := []struct {
		name string
		fn   func(o options, rep *report) error
	}{
		{"rpc", benchRPC},
		{"command", benchCommand},
		{"processes", benchProcesses},
		{"code", benchCode},
		{"provision", benchProvision},
		{"first", benchFirst},
		{"gvisor", benchGVisor},
		{"output", benchOutput},
		{"scale", benchScale},
		{"agents", benchAgents},
		{"recovery", benchRecovery},
		{"sbx", benchSbx},
		{"snapshot", benchSnapshot},
		{"pause", benchPause},
		{"gvpause", benchGVisorPause},
	}
	for _, s := range scenarios {
		if !want(s.name) {
			continue
		}
		fmt.Fprintf(os.Stderr, "== %s\n", s.name)
		o.scenario = s.name
		start := time.Now()
		if err := s.fn(o, rep); err != nil {
			return fmt.Errorf("scenario %s: %w", s.name, err)
		}
		fmt.Fprintf(os.Stderr, "   (%s)\n", time.Since(start).Round(time.Millisecond))
	}
	printTable(os.Stdout, rep)
	b, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(o.outJSON, append(b, '\n'), 0o644); err != nil {
		return err
	}
	if o.outMD != "" {
		return writeMarkdown(o.outMD, rep)
	}
	return nil
}

// add records a row; targets, if any, are what the row is held to (each
// must bound one of values), and the report says whether the run met them.
func (r *report) add(scenario, name string, values map[string]float64, note string, targets ...target) {
	checkTargets(name, values, targets)
	met := metAll(targets, values)
	r.Results = append(r.Results, result{Scenario: scenario, Name: name, Values: values, Targets: targets, Met: met, Note: note})
	if met != nil {
		fmt.Fprintf(os.Stderr, "   %-48s %s  [%s: %s]\n", name, formatValues(values), targetText(targets), plainMet(met))
		return
	}
	fmt.Fprintf(os.Stderr, "   %-48s %s\n", name, formatValues(values))
}

func formatValues(v map[string]float64) string {
	keys := make([]string, 0, len(v))
	for k := range v {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%s", k, formatNumber(v[k]))
	}
	return strings.Join(parts, " ")
}

func formatNumber(f float64) string {
	switch {
	case f == float64(int64(f)) && f < 1e12:
		return fmt.Sprintf("%d", int64(f))
	case f >= 100:
		return fmt.Sprintf("%.0f", f)
	case f >= 1:
		return fmt.Sprintf("%.2f", f)
	default:
		return fmt.Sprintf("%.3f", f)
	}
}

// percentile returns the p-th percentile (0..100) of d, sorted in place.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	i := int(float64(len(d)-1) * p / 100)
	return d[i]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				model = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
				break
			}
		}
	}
	kernel := "?"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		mem = strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])
	}
	return fmt.Sprintf("%d cores (%s), %s, Linux %s", runtime.NumCPU(), model, strings.Join(strings.Fields(mem), " "), kernel)
}
