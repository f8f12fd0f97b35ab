package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
	assert.Equal(t, limits.Defaults().FileSizeBytes, cfg.Limits.FileSize)

	p = writeConfig(t, "[limits]\nopen_files = 4096\nfile_size = 0\n")
	cfg = defaultConfig()
	require.NoError(t, loadConfigFile(&cfg, p, true))
	require.NoError(t, cfg.validate())
	assert.Equal(t, limits.Limits{OpenFiles: 4096}, cfg.Limits.sandboxLimits())

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
		"negative grace":    func(c *Config) { c.Lifecycle.ConnGrace = -1 },
		"unknown backend":   func(c *Config) { c.Server.Backend = "docker" },
		"unknown group":     func(c *Config) { c.Server.SocketGroup = "no-such-group-here" },
		"file over frame":   func(c *Config) { c.Limits.MaxFileBytes = int64(c.Server.MaxFrameBytes) },
		"pool over host":    func(c *Config) { c.Lifecycle.PoolSize = c.Lifecycle.MaxSandboxes + 1 },
		"mode without rw":   func(c *Config) { c.Server.SocketMode = 0o060 },
		"bad host policy":   func(c *Config) { c.Sbx.HostPolicy = "sometimes" },
		"bad log level":     func(c *Config) { c.Server.LogLevel = "loud" },
		"unknown admin uid": func(c *Config) { c.Access.AdminUIDs = List{"no-such-user-here"} },
		"open files tiny":   func(c *Config) { c.Limits.OpenFiles = 3 },
	} {
		cfg := defaultConfig()
		mutate(&cfg)
		assert.Error(t, cfg.validate(), name)
	}
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
