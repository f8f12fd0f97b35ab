package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSetGODEBUGKeepsTheOperatorsSettings(t *testing.T) {
	assert.Equal(t, []string{"A=1", "GODEBUG=" + sysmonGODEBUG}, setGODEBUG([]string{"A=1"}, sysmonGODEBUG))
	assert.Equal(t, []string{"GODEBUG=" + sysmonGODEBUG, "B=2"}, setGODEBUG([]string{"GODEBUG=", "B=2"}, sysmonGODEBUG))
	assert.Equal(t, []string{"GODEBUG=madvdontneed=1," + sysmonGODEBUG}, setGODEBUG([]string{"GODEBUG=madvdontneed=1"}, sysmonGODEBUG))
}

func TestRestoreEnvGivesBackTheStartingGODEBUG(t *testing.T) {
	t.Setenv("GODEBUG", "x=1,"+sysmonGODEBUG)
	t.Setenv(sysmonEnv, "x=1")
	t.Setenv(mountNSEnv, "1")
	restoreEnv("x=1", true)
	assert.Equal(t, "x=1", os.Getenv("GODEBUG"))
	_, marked := os.LookupEnv(sysmonEnv)
	assert.False(t, marked)
	_, marked = os.LookupEnv(mountNSEnv)
	assert.False(t, marked)

	t.Setenv("GODEBUG", sysmonGODEBUG)
	t.Setenv(sysmonEnv, "")
	restoreEnv("", true)
	_, set := os.LookupEnv("GODEBUG")
	assert.False(t, set, "a daemon started without GODEBUG gives its children none")
}

// The built daemon re-executes itself once, as the same process, with
// its runtime's monitor kept awake (sysmonGODEBUG is in the environment
// the runtime read at start, which /proc shows), unless the operator's
// GODEBUG already says schedtrace; the processes it starts get the
// environment it was started with (restoreEnv, above).
func TestServeReexecutesWithTheRuntimesTuning(t *testing.T) {
	if _, err := exec.LookPath("bwrap"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("bubblewrap is not installed")
		}
		t.Skip("bubblewrap is not installed: the daemon is not started")
	}
	dir, bin := buildDaemon(t)
	for _, c := range []struct {
		name, godebug string
		tuned         bool
	}{{"default", "", true}, {"operator's own", "schedtrace=0", false}} {
		t.Run(c.name, func(t *testing.T) {
			state, run := filepath.Join(dir, c.name+"-state"), filepath.Join(dir, c.name+"-run")
			socket := filepath.Join(run, "s", "sidecar.sock")
			cmd := exec.Command(bin, "serve", "--config", "/dev/null", "--state-dir", state, "--socket", socket,
				"--limit-cgroups", "off", "--limit-disk-caps", "off")
			cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir, "LANG=C"}
			if c.godebug != "" {
				cmd.Env = append(cmd.Env, "GODEBUG="+c.godebug)
			}
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			log := startListening(t, cmd)
			environ, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "environ"))
			require.NoError(t, err, "the daemon is still the process started")
			env := strings.Split(string(environ), "\x00")
			if c.tuned {
				assert.Contains(t, env, "GODEBUG="+sysmonGODEBUG)
				assert.Contains(t, env, sysmonEnv+"=", "the marker carries the GODEBUG it was started with")
			} else {
				assert.Contains(t, env, "GODEBUG="+c.godebug)
				for _, kv := range env {
					assert.NotContains(t, kv, sysmonEnv, "not re-executed")
				}
			}
			require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
			require.NoError(t, runBounded(t, cmd, 0))
			assert.Equal(t, 1, strings.Count(log.String(), "is listening on"), "one daemon, started once:\n%s", log.String())
		})
	}
}
