package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/hostids"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	require.NoError(t, os.WriteFile(p, []byte(text), 0o600))
	return p
}

func TestConfigUnknownKeysNamedWithTheirLine(t *testing.T) {
	p := writeConfig(t, "[server]\nsocket = \"/run/x/s.sock\"\n\n[lifecycle]\nconn_grace = \"5s\"\nmax_sandboxs = 3\n[bwrap]\nshare_network = true\n")
	cfg := defaultConfig()
	err := loadConfigFile(&cfg, p, true)
	require.Error(t, err)
	assert.Contains(t, err.Error(), p+":6:")
	assert.Contains(t, err.Error(), `"lifecycle.max_sandboxs"`)
	assert.Contains(t, err.Error(), p+":8:")
	assert.Contains(t, err.Error(), `"bwrap.share_network"`)
}

func TestConfigValuesAndErrors(t *testing.T) {
	p := writeConfig(t, "[server]\nsocket_mode = \"0600\"\nbackend = \"bwrap\"\n[lifecycle]\nconn_grace = \"5s\"\npool_size = 2\n[access]\nallow_uids = [\"1000\", \"root\"]\n")
	cfg := defaultConfig()
	require.NoError(t, loadConfigFile(&cfg, p, true))
	assert.Equal(t, Mode(0o600), cfg.Server.SocketMode)
	assert.Equal(t, 5*time.Second, cfg.Lifecycle.ConnGrace.D())
	assert.Equal(t, 2, cfg.Lifecycle.PoolSize)
	assert.Equal(t, List{"1000", "root"}, cfg.Access.AllowUIDs)
	assert.Equal(t, 24*time.Hour, cfg.Lifecycle.MaxLifetime.D(), "unset keys keep their defaults")
	require.NoError(t, cfg.validate())
	assert.Equal(t, limits.Defaults().OpenFiles, cfg.Limits.OpenFiles, "sandbox rlimits default to limits.Defaults()")
	assert.Equal(t, limits.Defaults().FileSizeBytes, uint64(cfg.Limits.FileSize))

	assert.Equal(t, "auto", cfg.Gvisor.SystrapFastPath, "systrap's fast path defaults to auto")
	p = writeConfig(t, "[gvisor]\nsystrap_fast_path = \"off\"\n")
	cfg = defaultConfig()
	require.NoError(t, loadConfigFile(&cfg, p, true))
	require.NoError(t, cfg.validate())
	assert.Equal(t, "off", cfg.Gvisor.SystrapFastPath)
	assert.False(t, cfg.Gvisor.BufferedRestoreReads, "a resume reads around the page cache by default")
	p = writeConfig(t, "[gvisor]\nbuffered_restore_reads = true\n")
	cfg = defaultConfig()
	require.NoError(t, loadConfigFile(&cfg, p, true))
	assert.True(t, cfg.Gvisor.BufferedRestoreReads)

	p = writeConfig(t, "[lifecycle]\nmax_commands = 8\nmax_commands_per_uid = 5\n")
	cfg = defaultConfig()
	require.NoError(t, loadConfigFile(&cfg, p, true))
	require.NoError(t, cfg.validate())
	assert.Equal(t, 5, cfg.Lifecycle.MaxCommandsPerUID)

	p = writeConfig(t, "[limits]\nopen_files = 4096\nfile_size = 0\n")
	cfg = defaultConfig()
	require.NoError(t, loadConfigFile(&cfg, p, true))
	require.NoError(t, cfg.validate())
	want := limits.Defaults()
	want.OpenFiles, want.FileSizeBytes = 4096, 0
	assert.Equal(t, want, cfg.Limits.sandboxLimits())

	for name, text := range map[string]string{
		"bad duration": "[lifecycle]\nconn_grace = \"soon\"\n",
		"bad mode":     "[server]\nsocket_mode = \"rw\"\n",
		"wrong type":   "[lifecycle]\nmax_sandboxes = \"many\"\n",
		"not toml":     "[server\n",
	} {
		cfg := defaultConfig()
		err := loadConfigFile(&cfg, writeConfig(t, text), true)
		assert.Error(t, err, name)
		assert.Contains(t, err.Error(), ":", name)
	}

	for name, mutate := range map[string]func(*Config){
		"negative grace":                func(c *Config) { c.Lifecycle.ConnGrace = -1 },
		"unknown backend":               func(c *Config) { c.Server.Backend = "docker" },
		"unknown group":                 func(c *Config) { c.Server.SocketGroup = "no-such-group-here" },
		"file over frame":               func(c *Config) { c.Limits.MaxFileBytes = c.Server.MaxFrameBytes },
		"pool over host":                func(c *Config) { c.Lifecycle.PoolSize = c.Lifecycle.MaxSandboxes + 1 },
		"mode without rw":               func(c *Config) { c.Server.SocketMode = 0o060 },
		"bad host policy":               func(c *Config) { c.Sbx.HostPolicy = "sometimes" },
		"bad log level":                 func(c *Config) { c.Server.LogLevel = "loud" },
		"unknown admin uid":             func(c *Config) { c.Access.AdminUIDs = List{"no-such-user-here"} },
		"open files tiny":               func(c *Config) { c.Limits.OpenFiles = 3 },
		"host memory below one sandbox": func(c *Config) { c.Limits.HostMemory = c.Limits.Memory - 1 },
		"negative host memory":          func(c *Config) { c.Limits.HostMemory = -1 },
		"per-uid commands over host":    func(c *Config) { c.Lifecycle.MaxCommandsPerUID = c.Lifecycle.MaxCommands + 1 },
		"negative per-uid commands":     func(c *Config) { c.Lifecycle.MaxCommandsPerUID = -1 },
		"state in the socket's dir":     func(c *Config) { c.Server.Socket, c.Server.StateDir = "/tmp/x/s.sock", "/tmp/x/state" },
		"state is the socket's dir":     func(c *Config) { c.Server.Socket, c.Server.StateDir = "/tmp/x/s.sock", "/tmp/x/" },
		"bad systrap fast path":         func(c *Config) { c.Gvisor.SystrapFastPath = "sometimes" },
	} {
		cfg := defaultConfig()
		mutate(&cfg)
		assert.Error(t, cfg.validate(), name)
	}
}

// The socket's directory and the state directory side by side are fine;
// a state directory inside the socket's is refused, naming a way out.
func TestConfigStateDirBesideTheSocket(t *testing.T) {
	cfg := defaultConfig()
	cfg.Server.Socket, cfg.Server.StateDir = "/tmp/x/run/s.sock", "/tmp/x/state"
	require.NoError(t, cfg.validate())
	cfg.Server.StateDir = "/tmp/x/runner" // a sibling sharing a prefix
	require.NoError(t, cfg.validate())
	cfg.Server.Socket, cfg.Server.StateDir = "/tmp/x/s.sock", "/tmp/x/state"
	err := cfg.validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "give the socket a directory of its own (e.g. /tmp/x/run/s.sock)")
}

func TestConfigMissingFiles(t *testing.T) {
	cfg := defaultConfig()
	assert.NoError(t, loadConfigFile(&cfg, filepath.Join(t.TempDir(), "none.toml"), false), "a missing default file is fine")
	assert.Error(t, loadConfigFile(&cfg, filepath.Join(t.TempDir(), "none.toml"), true), "a missing explicit file is not")
}

func TestConfigCommand(t *testing.T) {
	good := writeConfig(t, "[lifecycle]\npool_size = 1\n")
	var out, errOut bytes.Buffer
	assert.Equal(t, 0, run([]string{"config", "check", "--config", good}, &out, &errOut), errOut.String())
	assert.Contains(t, out.String(), "OK")

	out.Reset()
	assert.Equal(t, 0, run([]string{"config", "show", "--config", good}, &out, &errOut))
	assert.Contains(t, out.String(), "pool_size = 1")
	assert.Contains(t, out.String(), "[sbx]")

	bad := writeConfig(t, "[lifecycle]\npool_sise = 1\n")
	errOut.Reset()
	assert.Equal(t, 1, run([]string{"config", "check", "--config", bad}, &out, &errOut))
	assert.Contains(t, errOut.String(), bad+":2:")

	// The file supplies defaults; flags override it.
	p := writeConfig(t, "[server]\nlog_level = \"debug\"\n")
	path, explicit := configPathFromArgs([]string{"--log-format", "json", "--config=" + p})
	assert.True(t, explicit)
	assert.Equal(t, p, path)
	path, explicit = configPathFromArgs([]string{"--", "--config", p})
	assert.False(t, explicit)
	assert.Equal(t, DefaultConfigPath, path)
}

func TestConfigSandboxLimits(t *testing.T) {
	// Defaults: limits.Defaults(), enforced when the host can.
	cfg := defaultConfig()
	require.NoError(t, cfg.validate())
	want := limits.Defaults()
	assert.Equal(t, want, cfg.Limits.sandboxLimits())
	assert.Equal(t, enforceAuto, cfg.Limits.Cgroups)
	assert.Equal(t, enforceAuto, cfg.Limits.DiskCaps)

	// The file.
	p := writeConfig(t, "[limits]\nmemory = 536870912\ncpus = 2\ncpu_weight = 50\npids = 128\ndisk = 268435456\ndisk_inodes = 10000\ncgroups = \"required\"\ndisk_caps = \"off\"\n")
	cfg = defaultConfig()
	require.NoError(t, loadConfigFile(&cfg, p, true))
	require.NoError(t, cfg.validate())
	assert.Equal(t, limits.Limits{MemoryBytes: 512 << 20, CPUs: 2, CPUWeight: 50, PIDs: 128, OpenFiles: want.OpenFiles,
		FileSizeBytes: want.FileSizeBytes, DiskBytes: 256 << 20, DiskInodes: 10000}, cfg.Limits.sandboxLimits())
	assert.Equal(t, enforceRequired, cfg.Limits.Cgroups)
	assert.Equal(t, enforceOff, cfg.Limits.DiskCaps)

	// The flags, over the file.
	cfg, err := serveConfig([]string{"--config", p, "--limit-memory", "268435456", "--limit-cpus", "0.5", "--limit-cpu-weight", "200",
		"--limit-pids", "64", "--limit-disk", "0", "--limit-disk-inodes", "0", "--limit-cgroups", "off", "--limit-disk-caps", "auto"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, limits.Limits{MemoryBytes: 256 << 20, CPUs: 0.5, CPUWeight: 200, PIDs: 64, OpenFiles: want.OpenFiles,
		FileSizeBytes: want.FileSizeBytes}, cfg.Limits.sandboxLimits())
	assert.Equal(t, enforceOff, cfg.Limits.Cgroups)
	assert.Equal(t, enforceAuto, cfg.Limits.DiskCaps)

	// Every bad value is refused with its key.
	for key, mutate := range map[string]func(*LimitsSection){
		"limits.memory":      func(l *LimitsSection) { l.Memory = 1 << 20 },
		"limits.cpus":        func(l *LimitsSection) { l.CPUs = 0.001 },
		"limits.cpu_weight":  func(l *LimitsSection) { l.CPUWeight = 10001 },
		"limits.pids":        func(l *LimitsSection) { l.PIDs = 3 },
		"limits.disk":        func(l *LimitsSection) { l.Disk = 1 << 20 },
		"limits.disk_inodes": func(l *LimitsSection) { l.DiskInodes = -1 },
		"limits.open_files":  func(l *LimitsSection) { l.OpenFiles = 3 },
		"limits.cgroups":     func(l *LimitsSection) { l.Cgroups = "yes" },
		"limits.disk_caps":   func(l *LimitsSection) { l.DiskCaps = "" },
	} {
		cfg := defaultConfig()
		mutate(&cfg.Limits)
		err := cfg.validate()
		if assert.Error(t, err, key) {
			assert.Contains(t, err.Error(), key)
			assert.Equal(t, 1, strings.Count(err.Error(), "\n")+1, "only %s is wrong: %v", key, err)
		}
	}
	for name, mutate := range map[string]func(*LimitsSection){
		"negative memory":            func(l *LimitsSection) { l.Memory = -1 },
		"negative cpus":              func(l *LimitsSection) { l.CPUs = -1 },
		"NaN cpus":                   func(l *LimitsSection) { l.CPUs = math.NaN() },
		"infinite cpus":              func(l *LimitsSection) { l.CPUs = math.Inf(1) },
		"absurd cpus":                func(l *LimitsSection) { l.CPUs = 1e12 },
		"inodes without disk":        func(l *LimitsSection) { l.Disk, l.DiskInodes = 0, 1000 },
		"disk caps required, no cap": func(l *LimitsSection) { l.Disk, l.DiskCaps = 0, enforceRequired },
	} {
		cfg := defaultConfig()
		mutate(&cfg.Limits)
		assert.ErrorContains(t, cfg.validate(), "limits.", name)
	}
	// Zero is "no limit" for every one of them.
	cfg = defaultConfig()
	cfg.Limits.Memory, cfg.Limits.CPUs, cfg.Limits.CPUWeight, cfg.Limits.PIDs, cfg.Limits.Disk = 0, 0, 0, 0, 0
	assert.NoError(t, cfg.validate())

	// A flag with a bad value: serve refuses to start, naming the key.
	var stderr bytes.Buffer
	assert.Equal(t, 2, run([]string{"serve", "--config", "/dev/null", "--limit-memory", "1000"}, io.Discard, &stderr))
	assert.Contains(t, stderr.String(), "limits.memory")
}

func TestConfigShowAndCheckSandboxLimits(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run([]string{"config", "show", "--config", "/dev/null"}, &out, &errOut), errOut.String())
	d := limits.Defaults()
	for _, line := range []string{
		fmt.Sprintf("memory = '%s'", Size(d.MemoryBytes)), "cpus = 1.0", fmt.Sprintf("cpu_weight = %d", d.CPUWeight),
		fmt.Sprintf("pids = %d", d.PIDs), fmt.Sprintf("disk = '%s'", Size(d.DiskBytes)), "disk_inodes = 0",
		"cgroups = 'auto'", "disk_caps = 'auto'",
	} {
		assert.Contains(t, out.String(), "\n"+line+"\n")
	}
	bad := writeConfig(t, "[limits]\ncgroups = \"always\"\npids = 2\n")
	errOut.Reset()
	assert.Equal(t, 1, run([]string{"config", "check", "--config", bad}, &out, &errOut))
	assert.Contains(t, errOut.String(), `limits.cgroups "always"`)
	assert.Contains(t, errOut.String(), "limits.pids")
}

func TestConfigOwnUIDs(t *testing.T) {
	cfg := defaultConfig()
	assert.Equal(t, enforceAuto, cfg.Bwrap.OwnUIDs)
	assert.Equal(t, uint32(hostids.DefaultFirst), cfg.Bwrap.UIDRangeStart)
	assert.Equal(t, uint32(hostids.DefaultSize), cfg.Bwrap.UIDRangeSize)

	p := writeConfig(t, "[bwrap]\nown_uids = \"required\"\nuid_range_start = 1610612736\nuid_range_size = 4096\n")
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run([]string{"config", "show", "--config", p}, &out, &errOut), errOut.String())
	for _, line := range []string{"own_uids = 'required'", "uid_range_start = 1610612736", "uid_range_size = 4096"} {
		assert.Contains(t, out.String(), line)
	}

	for name, mutate := range map[string]func(*BwrapSection){
		"unknown mode":      func(b *BwrapSection) { b.OwnUIDs = "sometimes" },
		"empty range":       func(b *BwrapSection) { b.UIDRangeSize = 0 },
		"range holds 65534": func(b *BwrapSection) { b.UIDRangeStart, b.UIDRangeSize = 60000, 10000 },
		"system ids":        func(b *BwrapSection) { b.UIDRangeStart = 10 },
	} {
		cfg := defaultConfig()
		mutate(&cfg.Bwrap)
		assert.ErrorContains(t, cfg.validate(), "bwrap.", name)
	}
	// off needs no valid range.
	cfg.Bwrap.OwnUIDs, cfg.Bwrap.UIDRangeSize = enforceOff, 0
	assert.NoError(t, cfg.validate())
	// A flag sets the range.
	var stderr bytes.Buffer
	assert.Equal(t, 2, run([]string{"serve", "--config", "/dev/null", "--uid-range-size", "-3"}, io.Discard, &stderr))
	assert.Contains(t, stderr.String(), "uid-range-size")
}
