package main

import (
	"bufio"
	"context"
	"fmt"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
)

// daemon is a sandbox-sidecar the benchmark started (or, with only a
// socket, one it did not: then pid is 0 and memory is not measured).
type daemon struct {
	bin, dir, socket, stateDir string
	args                       []string
	env                        []string // added to the daemon's environment
	cmd                        *exec.Cmd
	pid                        int
	done                       chan struct{}
}

// profiled counts the daemons started with a profile, to name their
// directories.
var profiled int

// startDaemon runs `serve` in a fresh temporary directory.
func startDaemon(o options, extra ...string) (*daemon, error) {
	return startDaemonEnv(o, nil, extra...)
}

// startDaemonEnv is startDaemon with env added to the daemon's environment.
func startDaemonEnv(o options, env []string, extra ...string) (*daemon, error) {
	if o.socket != "" {
		return &daemon{socket: o.socket}, nil
	}
	dir, err := os.MkdirTemp("", "sidecar-bench")
	if err != nil {
		return nil, err
	}
	os.Chmod(dir, 0o755) // the sandbox uid must reach the state directory
	d := &daemon{bin: o.daemonBin, dir: dir, socket: filepath.Join(dir, "run", "s.sock"), stateDir: filepath.Join(dir, "state"), env: env}
	if o.profile != "" {
		profiled++
		d.env = append(d.env, fmt.Sprintf("SANDBOX_SIDECAR_PROFILE=%s", filepath.Join(o.profile, fmt.Sprintf("%02d-%s", profiled, o.scenario))))
	}
	d.args = append([]string{"serve", "--socket", d.socket, "--state-dir", d.stateDir, "--log-level", "error",
		"--max-sandboxes", "1200", "--max-sandboxes-per-uid", "1200", "--max-sandboxes-per-owner", "1200",
		"--max-commands", "128", "--max-connections", "4096", "--idle-timeout", "0"}, extra...)
	if _, err := d.start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return d, nil
}

// start launches the daemon and returns how long it took to serve.
func (d *daemon) start() (time.Duration, error) {
	begin := time.Now()
	d.cmd = exec.Command(d.bin, d.args...)
	d.cmd.Env = append(os.Environ(), d.env...)
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		return 0, err
	}
	if err := d.cmd.Start(); err != nil {
		return 0, err
	}
	d.pid = d.cmd.Process.Pid
	ready := make(chan struct{})
	d.done = make(chan struct{})
	var tail strings.Builder
	go func() {
		sc := bufio.NewScanner(stderr)
		signalled := false
		for sc.Scan() {
			if !signalled && strings.Contains(sc.Text(), "is listening on") {
				close(ready)
				signalled = true
			}
			if tail.Len() < 4096 {
				tail.WriteString(sc.Text() + "\n")
			}
		}
		io.Copy(io.Discard, stderr)
		d.cmd.Wait()
		close(d.done)
	}()
	select {
	case <-ready:
		return time.Since(begin), nil
	case <-d.done:
		return 0, fmt.Errorf("daemon exited before serving:\n%s", tail.String())
	case <-time.After(2 * time.Minute):
		d.cmd.Process.Kill()
		return 0, fmt.Errorf("daemon did not serve within 2 minutes")
	}
}

func (d *daemon) stop() {
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(2 * time.Minute):
		d.cmd.Process.Kill()
		<-d.done
	}
	// A kept sandbox outlives its daemon: end what it still runs.
	bwrap.KillSandboxes(filepath.Join(d.stateDir, "bwrap"))
	gvisor.KillSandboxes(filepath.Join(d.stateDir, "gvisor"))
	os.RemoveAll(d.dir)
}

// kill9 kills the daemon with SIGKILL, as a crash would, and then kills
// every process the daemon left and waits for them to end: the recovery
// rows measure a restart that destroys or adopts sandboxes whose inits are
// gone (the inits of kept sandboxes outlive a daemon, and a restart that
// re-attaches to them costs a connect each; this measures the restart
// that remakes them). Without it the restart would compete with the
// kernel's teardown of every sandbox the killed daemon had, and a
// bubblewrap caught in its setup by the kill can wait forever for a parent
// that is gone. It returns how long that took (at most two minutes).
func (d *daemon) kill9() time.Duration {
	d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.done
	begin := time.Now()
	killOrphans(begin.Add(2 * time.Minute))
	return time.Since(begin)
}

var subreaper sync.Once

// becomeSubreaper makes this process the one a killed daemon's processes
// are re-parented to, so that kill9 finds them (killOrphans). Call it
// before starting a daemon that kill9 will kill.
func becomeSubreaper() {
	subreaper.Do(func() {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			fmt.Fprintf(os.Stderr, "sidecar-bench: cannot become a subreaper (%v): restarts after a kill -9 will not wait for the killed daemon's sandboxes to end\n", err)
		}
	})
}

// killOrphans kills and reaps this process's children until it has none
// or the deadline passes. It must run only while no child this process
// still means to wait for (a running daemon, a command) exists.
func killOrphans(deadline time.Time) {
	for time.Now().Before(deadline) {
		for _, pid := range children() {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if err == syscall.ECHILD {
				return
			}
			if err == syscall.EINTR {
				continue
			}
			if err != nil || pid == 0 {
				break
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// children lists this process's children (every thread's).
func children() []int {
	var out []int
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", t.Name(), "children"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}

func (d *daemon) client() (*ipc.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return ipc.Dial(ctx, d.socket)
}

// status reads a KiB field (VmRSS, VmHWM) of the daemon's /proc status.
func (d *daemon) status(field string) float64 {
	if d.pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, field+":") {
			n, _ := strconv.ParseFloat(strings.Fields(line)[1], 64)
			return n
		}
	}
	return 0
}

func (d *daemon) fds() float64 {
	if d.pid == 0 {
		return 0
	}
	e, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", d.pid))
	return float64(len(e))
}

// resetPeak resets VmHWM (writing 5 to clear_refs), so a scenario's peak
// is its own.
func (d *daemon) resetPeak() {
	if d.pid != 0 {
		os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", d.pid), []byte("5"), 0)
	}
}

// startWithClient is startDaemon and one client of it; stop closes both.
func startWithClient(o options, extra ...string) (d *daemon, c *ipc.Client, stop func(), err error) {
	if d, err = startDaemon(o, extra...); err != nil {
		return nil, nil, nil, err
	}
	if c, err = d.client(); err != nil {
		d.stop()
		return nil, nil, nil, err
	}
	return d, c, func() { c.Close(); d.stop() }, nil
}
