// Command sidecar-soak is a chaos soak of a real sandbox-sidecar daemon:
// concurrent agent processes run commands, write and read back files, make
// and drop sandboxes, start, follow, signal, wait for and abandon durable
// processes (start_command & co), pause and resume their sandboxes, keep
// a count in a code context, and fork and snapshot their sandboxes, while a controller SIGKILLs
// agents mid-request, has clients vanish during run_command, SIGKILLs the
// daemon and restarts it at once on the same state, and SIGSTOPs it for
// seconds. Then it checks the invariants, and exits 1 if any fails:
//
//   - no hang: no request of an agent outlived its deadline;
//   - every owned sandbox survived (never not_found), and every file whose
//     write the daemon acknowledged reads back intact;
//   - every durable process whose start the daemon answered is still known
//     (never lost); each that should have ended has, with an exit code and
//     reason its kind and the signals sent to it allow; every byte of its
//     output up to the log's cap reads back as the process wrote it (each
//     writes numbered lines of a fixed length, so a byte at any offset is
//     known; a read that says it ended with nothing more is at its end),
//     and a start by a name taken finds that process;
//   - a pause answers paused (or busy while a command runs), a resume
//     ready, the list shows a paused sandbox paused, and the processes of
//     a sandbox paused and resumed go on as the checks above demand;
//   - every count a code context answers is one the agent's record allows
//     (code.go), and so is one last cell's at the end; a cell past its
//     budget is interrupted and its context kept;
//   - a fork, and a sandbox created from a snapshot, hold the owned
//     sandbox's acknowledged files; with the images left removed, the
//     image store holds nothing (snapshot.go);
//   - after the agents are gone, what the daemon lists is exactly the owned
//     sandboxes, and exactly what is on disk (connection-bound ones reaped);
//   - after a clean stop: no process of a sandbox (by the sandboxes' marker
//     or their cgroups), no cgroup of one, no loop device attached to one
//     of its images, no mount under the state directory; after the final
//     destroy, no durable process of the soak's left (by their names).
//
// Durable processes and code contexts are meant to survive a daemon's
// kill -9. With --expect-process-survival=false (for a daemon whose
// sandboxes' agents still die with it) a process ended as
// sandbox_terminated, killed by a SIGKILL no agent sent, or reported
// running past its end, and a count that starts again, are tolerated and
// counted instead of being violations.
//
// It needs root, bubblewrap and the loop driver (the daemon's default
// limits: a cgroup and a disk of its own per sandbox). `make soak` runs it
// for a few minutes; -duration sets how long. -backend gvisor -runsc PATH
// soaks the gVisor backend instead: the same agents and checks, a pause
// there must answer memory_released (a checkpoint), and its sandboxes'
// host processes are found by the runsc root they name.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

type options struct {
	daemonBin string
	duration  time.Duration
	agents    int
	work      string
	keep      bool
	survival  bool
	backend   string // bwrap or gvisor
	runsc     string // with gvisor: the runsc binary
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "agent" {
		os.Exit(agentMain(os.Args[2:]))
	}
	var o options
	flag.StringVar(&o.daemonBin, "daemon-bin", "bin/sandbox-sidecar", "the sandbox-sidecar binary to soak")
	flag.DurationVar(&o.duration, "duration", 3*time.Minute, "how long the chaos runs")
	flag.IntVar(&o.agents, "agents", 8, "concurrent agent processes, each owning one sandbox")
	flag.StringVar(&o.work, "work", "", "working directory (default: a fresh temporary one)")
	flag.BoolVar(&o.keep, "keep", false, "keep the working directory (state, logs) afterwards")
	flag.BoolVar(&o.survival, "expect-process-survival", true, "durable processes survive the daemon's kill -9: one lost with the daemon is a violation (false: tolerated and counted)")
	flag.StringVar(&o.backend, "backend", "bwrap", "the daemon's backend: bwrap or gvisor")
	flag.StringVar(&o.runsc, "runsc", os.Getenv("SANDBOX_SIDECAR_RUNSC"), "with --backend gvisor: the runsc binary (scripts/install-runsc.sh builds the pinned one)")
	flag.Parse()
	violations, err := soak(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sidecar-soak:", err)
		os.Exit(2)
	}
	if len(violations) > 0 {
		fmt.Fprintf(os.Stderr, "sidecar-soak: %d violation(s) of the invariants:\n", len(violations))
		seen := map[string]int{}
		var order []string
		for _, v := range violations {
			if seen[v]++; seen[v] == 1 {
				order = append(order, v)
			}
		}
		for i, v := range order {
			if i == maxShown {
				fmt.Fprintf(os.Stderr, "  ... and %d more distinct ones\n", len(order)-maxShown)
				break
			}
			fmt.Fprintf(os.Stderr, "  - %s (x%d)\n", v, seen[v])
		}
		os.Exit(1)
	}
	fmt.Println("sidecar-soak: every invariant held")
}

// Bounds of the soak.
const (
	requestTimeout = 45 * time.Second // longer than any SIGSTOP plus a restart
	connGrace      = time.Second
	settleTimeout  = 60 * time.Second
	diskBytes      = 32 << 20
	maxShown       = 30 // distinct violations printed
)

// daemon is the daemon under soak, restarted on the same state.
type daemon struct {
	bin, socket, state, logPath, config string
	// backendArgs select the backend; backendDir is its directory in the
	// state directory, match finds its sandboxes' host processes.
	backendArgs []string
	backendDir  string
	match       procMatcher
	// sharedMounts are mounts under the state directory that the live
	// sandboxes share, left by a stop that keeps them: runsc's empty
	// network namespace, pinned in its root.
	sharedMounts           []string
	cmd                    *exec.Cmd
	done                   chan struct{}
	restarts, kills, stops int
}

func (d *daemon) start() error {
	logf, err := os.OpenFile(d.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := append([]string{"serve", "--config", d.config, "--socket", d.socket, "--state-dir", d.state, "--log-format", "json",
		"--reap-interval", "200ms", "--conn-grace", connGrace.String()}, d.backendArgs...)
	cmd := exec.Command(d.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	logf.Close()
	d.cmd, d.done = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(d.done)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("unix", d.socket, time.Second); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-d.done:
			return fmt.Errorf("the daemon exited at start; see %s", d.logPath)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("the daemon did not serve within 30s; see %s", d.logPath)
}

func (d *daemon) kill9() {
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.done
	d.kills++
}

func (d *daemon) stop() error {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		if !d.cmd.ProcessState.Success() {
			return fmt.Errorf("the daemon did not exit cleanly: %v", d.cmd.ProcessState)
		}
		return nil
	case <-time.After(60 * time.Second):
		d.kill9()
		return errors.New("the daemon did not stop within 60s of SIGTERM")
	}
}

func (d *daemon) call(op string, args any, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	c, err := ipc.Dial(ctx, d.socket)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Call(ctx, op, args, out)
}

func soak(o options) (violations []string, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the soak needs root (cgroups and disk caps, as in production)")
	}
	bin, err := filepath.Abs(o.daemonBin)
	if err != nil {
		return nil, err
	}
	work := o.work
	if work == "" {
		if work, err = os.MkdirTemp("", "sidecar-soak"); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chmod(work, 0o755); err != nil {
		return nil, err
	}
	if !o.keep {
		defer os.RemoveAll(work)
	}
	d := &daemon{bin: bin, socket: filepath.Join(work, "run", "sidecar.sock"), state: filepath.Join(work, "state"),
		logPath: filepath.Join(work, "daemon.log"), config: filepath.Join(work, "config.toml"), backendDir: o.backend}
	switch o.backend {
	case "bwrap":
		d.backendArgs, d.match = []string{"--limit-disk", strconv.Itoa(diskBytes)}, bwrapProcesses(d.state)
	case "gvisor":
		// gVisor enforces no disk cap; a pause is a checkpoint that
		// gives the sandbox's memory back.
		if o.runsc == "" {
			return nil, errors.New("--backend gvisor needs --runsc (or SANDBOX_SIDECAR_RUNSC): scripts/install-runsc.sh builds the pinned one")
		}
		d.backendArgs, d.match = []string{"--backend", "gvisor", "--gvisor-runsc-path", o.runsc}, gvisorProcesses(d.state)
		d.sharedMounts = []string{filepath.Join(d.state, "gvisor", ".runsc", "null-netns")}
	default:
		return nil, fmt.Errorf("--backend %q: bwrap or gvisor", o.backend)
	}
	conf := fmt.Sprintf("[processes]\nlog_bytes = %d\nmax_ended = %d\n", procLogBytes, procMaxEnded)
	if err := os.WriteFile(d.config, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	// The run's token names its processes, so the leak check finds any
	// of them anywhere on the host.
	token := fmt.Sprintf("sk%08x", rand.Uint32())
	// A kept sandbox outlives its daemon: what the soak's still run ends
	// with it (deferred after the removal above, so it runs first).
	defer d.killSandboxes()
	if err := d.start(); err != nil {
		return nil, err
	}
	var hello api.HelloResult
	if err := d.call(ipc.OpHello, api.HelloRequest{Versions: []int{1}}, &hello); err != nil {
		return nil, fmt.Errorf("hello: %w", err)
	}
	if !contains(hello.Features, "pause") {
		return nil, fmt.Errorf("the daemon does not offer pause (features %v): the soak pauses sandboxes, which needs sandbox cgroups with a freezer", hello.Features)
	}
	if !contains(hello.Features, "code") {
		return nil, fmt.Errorf("the daemon does not offer code contexts (features %v): the soak keeps state in them", hello.Features)
	}
	fmt.Printf("soak: %d agents for %v (processes expected to survive kill -9: %v); work %s\n", o.agents, o.duration, o.survival, work)

	// Each agent owns one sandbox for the whole soak.
	owned := make([]string, o.agents)
	for i := range owned {
		var res api.CreateResult
		if err := d.call(ipc.OpCreate, api.CreateRequest{Spec: &api.Spec{Owner: fmt.Sprintf("soak/agent-%d", i)}, TTLS: 3600}, &res); err != nil {
			return nil, fmt.Errorf("create the owned sandbox of agent %d: %w", i, err)
		}
		owned[i] = res.Sandbox
	}

	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	agents := make([]*exec.Cmd, o.agents)
	var agentsMu sync.Mutex
	startAgent := func(i int) error {
		cmd := exec.Command(self, "agent", "-socket", d.socket, "-sandbox", owned[i], "-ack", ackPath(work, i),
			"-violations", filepath.Join(work, fmt.Sprintf("violations-%d", i)), "-index", strconv.Itoa(i),
			"-procs", procsPath(work, i), "-pauses", pausesPath(work, i), "-code", codePath(work, i), "-copies", copiesPath(work, i), "-token", token, "-expect-process-survival="+strconv.FormatBool(o.survival),
			"-memory-released="+strconv.FormatBool(o.backend == "gvisor"))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		agentsMu.Lock()
		agents[i] = cmd
		agentsMu.Unlock()
		go func() { _ = cmd.Wait() }()
		return nil
	}
	for i := range agents {
		if err := startAgent(i); err != nil {
			return nil, err
		}
	}

	// The chaos: one event every 1-4 s.
	interrupted := make(chan os.Signal, 1)
	signal.Notify(interrupted, os.Interrupt, syscall.SIGTERM)
	agentKills := 0
	end := time.Now().Add(o.duration)
	for time.Now().Before(end) {
		select {
		case <-interrupted:
			end = time.Now()
			continue
		case <-time.After(time.Duration(1000+rand.IntN(3000)) * time.Millisecond):
		}
		switch n := rand.IntN(10); {
		case n < 6: // an agent dies mid-request
			i := rand.IntN(o.agents)
			agentsMu.Lock()
			_ = agents[i].Process.Kill()
			agentsMu.Unlock()
			agentKills++
			if err := startAgent(i); err != nil {
				return nil, err
			}
		case n < 8: // the daemon dies; restarted at once on the same state
			d.kill9()
			if err := d.start(); err != nil {
				return nil, fmt.Errorf("restart after kill -9: %w", err)
			}
			d.restarts++
		default: // the daemon stops answering for a while
			_ = d.cmd.Process.Signal(syscall.SIGSTOP)
			time.Sleep(time.Duration(1000+rand.IntN(2000)) * time.Millisecond)
			_ = d.cmd.Process.Signal(syscall.SIGCONT)
			d.stops++
		}
	}
	agentsMu.Lock()
	for _, a := range agents {
		_ = a.Process.Kill()
	}
	agentsMu.Unlock()
	time.Sleep(200 * time.Millisecond)
	fmt.Printf("soak: chaos done: %d agent kills, %d daemon kill -9 and restarts, %d SIGSTOPs\n", agentKills, d.kills, d.stops)

	bad := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	var pauses pauseTally
	requests := 0
	for i := range owned {
		b, _ := os.ReadFile(filepath.Join(work, fmt.Sprintf("violations-%d", i)))
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if line != "" {
				bad("agent %d: %s", i, line)
			}
		}
		if err := pauses.read(pausesPath(work, i)); err != nil {
			bad("agent %d's pauses: %v", i, err)
		}
		b, _ = os.ReadFile(filepath.Join(work, fmt.Sprintf("requests-%d", i)))
		for _, line := range strings.Fields(string(b)) {
			n, _ := strconv.Atoi(line)
			requests += n
		}
	}
	fmt.Printf("soak: %d requests answered\n", requests)

	// Every owned sandbox is there (adopted: a quarantine resolves within
	// the settle time) and every acknowledged file intact.
	ownedSet := map[string]bool{}
	for _, id := range owned {
		ownedSet[id] = true
	}
	settled := func() (string, bool) {
		var l api.ListResult
		if err := d.call(ipc.OpList, nil, &l); err != nil {
			return err.Error(), false
		}
		got := map[string]string{}
		for _, s := range l.Sandboxes {
			got[s.Sandbox] = s.State
		}
		for id := range ownedSet {
			if got[id] == statePaused {
				// Its agent was killed with it paused: a paused sandbox
				// stays so, across restarts, until used or resumed.
				var res api.PauseResult
				err := d.call(ipc.OpResume, api.SandboxRequest{Sandbox: id}, &res)
				if why := judgePause(ipc.OpResume, err == nil, res, err, o.backend == "gvisor"); why != "" {
					bad("sandbox %s at the end: %s", id, why)
				}
				if err != nil {
					return err.Error(), false
				}
				pauses.atEnd++
				got[id] = res.State
			}
			if got[id] != "ready" {
				return fmt.Sprintf("owned sandbox %s is %q", id, got[id]), false
			}
		}
		if len(got) != len(ownedSet) {
			return fmt.Sprintf("the daemon lists %d sandboxes, not the %d owned ones (connection-bound ones not reaped?)", len(got), len(ownedSet)), false
		}
		return "", true
	}
	why, ok := "", false
	for deadline := time.Now().Add(settleTimeout); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if why, ok = settled(); ok {
			break
		}
	}
	if !ok {
		bad("after %v: %s", settleTimeout, why)
	}
	onDisk := d.sandboxDirs()
	if fmt.Sprint(onDisk) != fmt.Sprint(sortedKeys(ownedSet)) {
		bad("on disk: %v; want exactly the owned sandboxes %v", onDisk, sortedKeys(ownedSet))
	}
	checked := 0
	for i, id := range owned {
		acks, err := readAcks(ackPath(work, i))
		if err != nil {
			bad("agent %d's acknowledgements: %v", i, err)
			continue
		}
		for path, may := range acks {
			var res api.ReadFileResult
			if err := d.call(ipc.OpReadFile, api.ReadFileRequest{Sandbox: id, Path: path}, &res); err != nil {
				bad("sandbox %s: acknowledged file %s: %v", id, path, err)
				continue
			}
			if !contains(may, string(res.Data)) {
				bad("sandbox %s: acknowledged file %s holds %q, want %q", id, path, res.Data, may[0])
			}
			checked++
		}
	}
	fmt.Printf("soak: %d acknowledged files checked\n", checked)
	fmt.Printf("soak: %s\n", pauses)
	procViolations, tally := checkProcesses(d, work, owned, token, o.survival)
	violations = append(violations, procViolations...)
	fmt.Printf("soak: %s\n", tally)
	codeViolations, codeTally := checkCodeAtEnd(d, work, owned, o.survival)
	violations = append(violations, codeViolations...)
	fmt.Printf("soak: %s\n", codeTally)
	imageViolations, imageTally := checkImagesAtEnd(d, work, len(owned))
	violations = append(violations, imageViolations...)
	fmt.Printf("soak: %s\n", imageTally)
	ids := knownIDs(work, owned)

	// The leak check must see the live sandboxes' processes, by their
	// marker and by their cgroups, or it would find no leak either.
	for _, id := range owned {
		_ = d.call(ipc.OpRunCommand, api.RunCommandRequest{Sandbox: id, Command: "true", TimeoutS: 30}, nil)
	}
	if marked, inCgroup := liveMarked(d.match, owned); marked < len(owned) || inCgroup < len(owned) {
		bad("the leak check is blind: with %d sandboxes running, it finds %d processes by their marker and %d in their cgroups", len(owned), marked, inCgroup)
	}

	// A clean stop leaves nothing behind but the state directory and the
	// owned sandboxes, whose inits (and durable processes) outlive the
	// daemon until the next one re-attaches to them.
	if err := d.stop(); err != nil {
		bad("%v", err)
	}
	violations = append(violations, leaks(d.state, d.backendDir, d.match, d.sharedMounts, without(ids, owned), owned...)...)

	// The owned sandboxes come back once more, then go for good.
	if err := d.start(); err != nil {
		return violations, err
	}
	for _, id := range owned {
		if err := d.call(ipc.OpDestroy, api.SandboxRequest{Sandbox: id}, nil); err != nil {
			bad("destroy %s at the end: %v", id, err)
		}
	}
	if left := d.sandboxDirs(); len(left) > 0 {
		bad("after destroying every sandbox, on disk: %v", left)
	}
	if err := d.stop(); err != nil {
		bad("%v", err)
	}
	violations = append(violations, leaks(d.state, d.backendDir, d.match, nil, ids)...)
	for _, p := range processesWhere(func(_, cl, _ string) bool { return strings.Contains(cl, token) }) {
		bad("a durable process of the soak is left after every sandbox was destroyed: %s", p)
	}
	if len(violations) > 0 && !o.keep {
		fmt.Fprintf(os.Stderr, "soak: the daemon's log (last lines):\n%s\n", tail(d.logPath, 40))
	}
	return violations, nil
}

func ackPath(work string, i int) string { return filepath.Join(work, fmt.Sprintf("acks-%d", i)) }

// readAcks returns, for each path whose write the daemon acknowledged, the
// contents it may hold: the last acknowledged one, then any asked for
// after it whose answer the agent did not live to see.
func readAcks(path string) (map[string][]string, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	acked, later := map[string]string{}, map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		switch f := strings.Fields(sc.Text()); {
		case len(f) == 3 && f[0] == "file":
			acked[f[1]] = f[2]
			delete(later, f[1])
		case len(f) == 3 && f[0] == "intent":
			later[f[1]] = append(later[f[1]], f[2])
		}
	}
	out := map[string][]string{}
	for p, c := range acked {
		out[p] = append([]string{c}, later[p]...)
	}
	return out, sc.Err()
}

// knownIDs is every sandbox id the soak learnt of: the owned ones and the
// connection-bound ones the agents made.
func knownIDs(work string, owned []string) []string {
	ids := append([]string(nil), owned...)
	matches, _ := filepath.Glob(filepath.Join(work, "acks-*"))
	for _, m := range matches {
		b, _ := os.ReadFile(m)
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "created" {
				ids = append(ids, f[1])
			}
		}
	}
	return ids
}

// sandboxDirs lists the sandboxes' directories of the daemon's backend.
func (d *daemon) sandboxDirs() []string {
	entries, _ := os.ReadDir(filepath.Join(d.state, d.backendDir))
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "sc-") {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// without is ids less those in drop.
func without(ids, drop []string) []string {
	var out []string
	for _, id := range ids {
		if !contains(drop, id) {
			out = append(out, id)
		}
	}
	return out
}

// killSandboxes ends what the soak's sandboxes still run: a kept sandbox
// outlives its daemon.
func (d *daemon) killSandboxes() {
	if d.backendDir == "bwrap" {
		bwrap.KillSandboxes(filepath.Join(d.state, "bwrap"))
		return
	}
	for _, p := range processesWhere(func(env, cl, _ string) bool { _, ok := d.match(env, cl); return ok }) {
		var pid int
		if _, err := fmt.Sscan(p, &pid); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
