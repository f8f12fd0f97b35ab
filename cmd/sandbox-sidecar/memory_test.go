package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
)

func TestConfigConnectionAndMemoryBounds(t *testing.T) {
	p := writeConfig(t, "[server]\nmax_connections = 100\nmax_connections_per_uid = 10\nfirst_frame_timeout = \"3s\"\n"+
		"max_request_bytes = 100000000\nmax_response_bytes = 200000000\nmax_response_bytes_per_connection = 50000000\n")
	cfg := defaultConfig()
	require.NoError(t, loadConfigFile(&cfg, p, true))
	require.NoError(t, cfg.validate())
	assert.Equal(t, 10, cfg.Server.MaxConnectionsPerUID)
	assert.EqualValues(t, 3e9, cfg.Server.FirstFrameTimeout)
	total, _ := memoryBound(cfg)
	assert.EqualValues(t, memoryBase+100*memoryPerConnection+100000000+200000000+int64(cfg.Lifecycle.MaxSandboxes)*memoryPerSandbox, total,
		"the bound docs/operations.md gives")

	def := defaultConfig()
	require.NoError(t, def.validate(), "the defaults hold together")
	assert.Equal(t, 0, def.Server.MaxConnectionsPerUID, "0: three quarters of max_connections")
	total, _ = memoryBound(def)
	assert.Less(t, total, int64(1<<30), "the default bound stays under 1 GiB")

	for name, text := range map[string]string{
		"per-uid above the host's":       "[server]\nmax_connections = 10\nmax_connections_per_uid = 11\n",
		"request budget below a frame":   "[server]\nmax_request_bytes = 1000000\n",
		"connection budget below a read": "[server]\nmax_response_bytes_per_connection = 17000000\n",
		"total below a connection's":     "[server]\nmax_response_bytes = 40000000\n",
		"no first-frame deadline":        "[server]\nfirst_frame_timeout = \"0s\"\n",
	} {
		cfg := defaultConfig()
		require.NoError(t, loadConfigFile(&cfg, writeConfig(t, text), true), name)
		assert.Error(t, cfg.validate(), name)
	}
	assert.Greater(t, ipc.RequestCost(ipc.DefaultMaxFrame), int64(1000000))
}
