package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]Size{
		"0": 0, "4096": 4096, "1000B": 1000, "1k": 1 << 10, "1KB": 1 << 10, "1KiB": 1 << 10,
		"512m": 512 << 20, "512 MiB": 512 << 20, "1G": 1 << 30, "1g": 1 << 30, "2gb": 2 << 30, "10GiB": 10 << 30,
		"1.5G": 3 << 29, "0.5k": 512, "1T": 1 << 40, " 3m ": 3 << 20, "8191P": 8191 << 50,
	} {
		got, err := ParseSize(in)
		if assert.NoError(t, err, in) {
			assert.Equal(t, want, got, in)
		}
	}
	for _, in := range []string{"", "m", "-1", "-1G", "1X", "1 G B", "1e9", "1..5G", "8192P", "99999999999999999999", "1GiBs", "0x10", "1,000"} {
		_, err := ParseSize(in)
		assert.Error(t, err, "%q", in)
	}
}

func TestSizePrintsInTheLargestExactUnitAndParsesBack(t *testing.T) {
	for z, want := range map[Size]string{
		0: "0", 1000: "1000B", 1 << 10: "1KiB", 1536 << 10: "1536KiB", 1 << 30: "1GiB", 3 << 29: "1536MiB", 16 << 20: "16MiB",
		-5: "-5",
	} {
		assert.Equal(t, want, z.String())
		if z >= 0 {
			back, err := ParseSize(want)
			require.NoError(t, err)
			assert.Equal(t, z, back)
		}
	}
}

func TestConfigSizesTakeUnitsOrBytes(t *testing.T) {
	p := writeConfig(t, "[server]\nmax_frame_bytes = \"32m\"\nmax_request_bytes = \"512m\"\nmax_response_bytes_per_connection = 100663296\n[limits]\nmemory = \"1G\"\ndisk = \"10GiB\"\nfile_size = 1048576\nmax_file_bytes = \"8MiB\"\nmax_output_bytes = \"1m\"\n")
	cfg := defaultConfig()
	require.NoError(t, loadConfigFile(&cfg, p, true))
	require.NoError(t, cfg.validate())
	assert.Equal(t, Size(32<<20), cfg.Server.MaxFrameBytes)
	assert.Equal(t, Size(512<<20), cfg.Server.MaxRequestBytes)
	assert.Equal(t, Size(96<<20), cfg.Server.MaxResponseBytesPerConnection)
	assert.Equal(t, int64(1<<30), cfg.Limits.sandboxLimits().MemoryBytes)
	assert.Equal(t, int64(10<<30), cfg.Limits.sandboxLimits().DiskBytes)
	assert.Equal(t, uint64(1<<20), cfg.Limits.sandboxLimits().FileSizeBytes)
	assert.Equal(t, Size(8<<20), cfg.Limits.MaxFileBytes)

	// A bad unit names the key and its line.
	cfg = defaultConfig()
	err := loadConfigFile(&cfg, writeConfig(t, "[limits]\n\nmemory = \"1 gigabyte\"\n"), true)
	require.Error(t, err)
	assert.Contains(t, err.Error(), ":3:")
	assert.Contains(t, err.Error(), "limits.memory")
	assert.Contains(t, err.Error(), "is not a size")

	// A negative file size is refused by validation, not wrapped around.
	cfg = defaultConfig()
	require.NoError(t, loadConfigFile(&cfg, writeConfig(t, "[limits]\nfile_size = -1\n"), true))
	assert.ErrorContains(t, cfg.validate(), "limits.file_size")

	// The flags take units too.
	cfg, err = serveConfig([]string{"--config", "/dev/null", "--limit-memory", "512m", "--limit-disk", "2g", "--max-frame-bytes", "16MiB"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, Size(512<<20), cfg.Limits.Memory)
	assert.Equal(t, Size(2<<30), cfg.Limits.Disk)
	var stderr bytes.Buffer
	assert.Equal(t, 2, run([]string{"serve", "--config", "/dev/null", "--limit-memory", "lots"}, &bytes.Buffer{}, &stderr))
	assert.Contains(t, stderr.String(), "is not a size")
}

func TestCreateFlagsTakeSizes(t *testing.T) {
	var r resourceFlags
	fs := newFlags("create", "", &bytes.Buffer{})
	r.register(fs)
	require.NoError(t, fs.Parse([]string{"--memory", "512m", "--disk", "1G", "--pids", "10"}))
	assert.Equal(t, &api.Resources{MemoryBytes: 512 << 20, DiskBytes: 1 << 30, PIDs: 10}, r.arg())
	assert.Error(t, fs.Parse([]string{"--memory", "-1"}))
}

func TestConfigCheckReportsATypeErrorWithEveryOtherProblem(t *testing.T) {
	p := writeConfig(t, strings.Join([]string{
		"[server]",
		"max_connections = \"many\"", // 2: type
		"backend = \"docker\"",       // 3: validation
		"[lifecycle]",
		"max_sandboxes = true", // 5: type
		"pool_size = -1",       // 6: validation
		"colour = \"blue\"",    // 7: unknown key
		"[limits]",
		"memory = \"1 ton\"",   // 9: type (a bad size)
		"cgroups = \"always\"", // 10: validation
		"",
	}, "\n"))
	var out, errOut bytes.Buffer
	assert.Equal(t, 1, run([]string{"config", "check", "--config", p}, &out, &errOut))
	msg := errOut.String()
	for _, want := range []string{
		p + ":2:", "server.max_connections",
		p + ":5:", "lifecycle.max_sandboxes",
		p + ":7:", `unknown key "lifecycle.colour"`,
		p + ":9:", "limits.memory",
		`server.backend "docker"`, "lifecycle.pool_size", `limits.cgroups "always"`,
	} {
		assert.Contains(t, msg, want)
	}

	// serve still refuses such a file before it starts.
	assert.Equal(t, 2, run([]string{"serve", "--config", p}, &bytes.Buffer{}, &bytes.Buffer{}))

	// A value spanning lines stops the report at what is known instead of
	// inventing a syntax error.
	p = writeConfig(t, "[access]\nallow_uids = [\n  1000,\n]\n[server]\nbackend = \"docker\"\n")
	errOut.Reset()
	assert.Equal(t, 1, run([]string{"config", "check", "--config", p}, &out, &errOut))
	assert.Contains(t, errOut.String(), "access.allow_uids")
	assert.NotContains(t, errOut.String(), "expected")
}
