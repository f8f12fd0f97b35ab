package main

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

// FuzzLoadConfig feeds arbitrary files to the config loader, as
// `serve --config` and `config check` read them. Whatever the file holds,
// loading and validating must not panic, a refusal must say where (the
// file's name starts every message), and a configuration that loads and
// validates must survive `config show` (marshal, load again) unchanged.
func FuzzLoadConfig(f *testing.F) {
	f.Add([]byte(""))
	f.Add([]byte("[server]\nsocket = \"/run/s.sock\"\nsocket_mode = \"0660\"\nmax_frame_bytes = 16777216\nshutdown_timeout = \"30s\"\n"))
	f.Add([]byte("[lifecycle]\nconn_grace = \"10s\"\nmax_lifetime = \"24h\"\nidle_timeout = \"0s\"\nmax_sandboxes = 64\n"))
	f.Add([]byte("[limits]\nmax_output_bytes = 4194304\nmax_file_bytes = 8388608\nmax_timeout = \"1h\"\n"))
	f.Add([]byte("[bwrap]\nsandbox_uid = 65534\nsandbox_gid = 65534\nshare_host_network = false\nkill_grace = \"2s\"\n"))
	f.Add([]byte("[access]\nallow_uids = [\"1000\", \"airflow\"]\nadmin_groups = [\"root\"]\n"))
	f.Add([]byte("[server]\nsocket_mode = \"0999\"\n[server.nested]\nx = 1\n"))
	f.Add([]byte("[lifecycle]\nconn_grace = \"forever\"\n"))
	f.Add([]byte("[bwrap]\nsandbox_uid = -1\nkill_grace = 5\n"))
	f.Add([]byte("unknown = 1\n[[server]]\n"))
	f.Add([]byte("[limits]\nmax_file_bytes = 9223372036854775807\nmax_output_bytes = -1\n"))
	f.Add([]byte("[limits]\nmemory = 1073741824\ncpus = 1.5\ncpu_weight = 100\npids = 256\ndisk = 0\ncgroups = \"required\"\ndisk_caps = \"off\"\n"))
	f.Add([]byte("[limits]\ncpus = nan\ndisk_inodes = 100\n"))

	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		// Fuzz workers are separate processes: one file each.
		path := filepath.Join(dir, fmt.Sprintf("config-%d.toml", os.Getpid()))
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := defaultConfig()
		if err := loadConfigFile(&cfg, path, true); err != nil {
			if !strings.Contains(err.Error(), path) && !strings.HasPrefix(err.Error(), "reading config") {
				t.Fatalf("a refusal must name the file: %v", err)
			}
			return
		}
		if err := cfg.validate(); err != nil {
			return
		}
		shown, err := toml.Marshal(cfg)
		if err != nil {
			t.Fatalf("config show cannot print a valid configuration: %v", err)
		}
		if err := os.WriteFile(path, shown, 0o600); err != nil {
			t.Fatal(err)
		}
		again := defaultConfig()
		if err := loadConfigFile(&again, path, true); err != nil {
			t.Fatalf("what config show printed does not load: %v\n%s", err, shown)
		}
		if !reflect.DeepEqual(normalize(cfg), normalize(again)) {
			t.Fatalf("config show changed the configuration:\nbefore %+v\nafter  %+v\n%s", cfg, again, shown)
		}
	})
}

// normalize maps empty lists to nil: TOML cannot tell them apart.
func normalize(c Config) Config {
	for _, l := range []*List{&c.Access.AllowUIDs, &c.Access.AllowGroups, &c.Access.AdminUIDs, &c.Access.AdminGroups, &c.Gvisor.ExtraFlags} {
		if len(*l) == 0 {
			*l = nil
		}
	}
	return c
}
