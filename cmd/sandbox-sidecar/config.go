package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/proclog"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/procstore"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/sbx"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
	"github.com/sandbox-sidecar/sandbox-sidecar/runwatch"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/hostids"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
	"github.com/sandbox-sidecar/sandbox-sidecar/service"
)

// DefaultConfigPath is read when it exists and no --config is given.
const DefaultConfigPath = "/etc/sandbox-sidecar/config.toml"

// Config is everything serve needs. Defaults come from defaultConfig, then
// the config file (TOML, unknown keys refused), then flags.
type Config struct {
	Server    ServerSection    `toml:"server"`
	Access    AccessSection    `toml:"access"`
	Lifecycle LifecycleSection `toml:"lifecycle"`
	Limits    LimitsSection    `toml:"limits"`
	Bwrap     BwrapSection     `toml:"bwrap"`
	Egress    EgressSection    `toml:"egress"`
	Sbx       SbxSection       `toml:"sbx"`
	Gvisor    GvisorSection    `toml:"gvisor"`
	Metrics   MetricsSection   `toml:"metrics"`
	Airflow   AirflowSection   `toml:"airflow"`
	Images    ImagesSection    `toml:"images"`
	Processes ProcessesSection `toml:"processes"`
	Code      CodeSection      `toml:"code"`
}

// CodeSection configures code contexts (run_code; docs/operations.md,
// "Code contexts").
type CodeSection struct {
	// Preload names the Python modules every sandbox's contexts'
	// interpreter imports before it forks the first context (e.g.
	// ["numpy", "pandas"] on an analytics image); a module that does not
	// import is left out. ImagePreload replaces it per image.
	Preload      List            `toml:"preload"`
	ImagePreload map[string]List `toml:"image_preload"`
	// MaxContexts bounds a sandbox's contexts.
	MaxContexts int `toml:"max_contexts"`
}

// codeConfig is the bwrap and gvisor backends'.
func (c CodeSection) codeConfig() bwrap.CodeConfig {
	per := make(map[string][]string, len(c.ImagePreload))
	for image, mods := range c.ImagePreload {
		per[image] = mods
	}
	return bwrap.CodeConfig{Preload: c.Preload, ImagePreload: per, MaxContexts: c.MaxContexts}
}

// ProcessesSection bounds durable processes (start_command) per sandbox
// (docs/operations.md, "Durable processes").
type ProcessesSection struct {
	// LogBytes is each stream's ring: the last log_bytes of a process's
	// stdout and of its stderr are kept on the host.
	LogBytes Size `toml:"log_bytes"`
	// MaxRunning bounds the processes running in one sandbox at once;
	// MaxEnded the records of ended ones it keeps (the oldest are dropped).
	MaxRunning int `toml:"max_running"`
	MaxEnded   int `toml:"max_ended"`
}

// procLimits are the backends' per-sandbox bounds of durable processes.
func (p ProcessesSection) procLimits() procstore.Limits {
	return procstore.Limits{LogBytes: int64(p.LogBytes), MaxRunning: p.MaxRunning, MaxEnded: p.MaxEnded}
}

// ImagesSection configures the image store and the images sandboxes run
// on (docs/operations.md, "Images").
type ImagesSection struct {
	// Default is the image of a create that names none: "host" (the
	// built-in) or an imported name.
	Default string `toml:"default"`
	// MaxBytes and MaxFiles cap one import (its archive and its unpacked
	// root); 0: the store's defaults.
	MaxBytes Size  `toml:"max_bytes"`
	MaxFiles int64 `toml:"max_files"`
	// Pools is the warm pool's size per image (lifecycle.pool_size is the
	// default image's, unless named here).
	Pools map[string]int `toml:"pools"`
}

func (s ImagesSection) validate(maxSandboxes, poolSize int) []error {
	var errs []error
	total := poolSize
	if _, ok := s.Pools[s.defaultName()]; ok {
		total = 0
	}
	for name, n := range s.Pools {
		if n < 0 {
			errs = append(errs, fmt.Errorf("images.pools: %q has %d; give a size of 0 or more", name, n))
		}
		if name == "" || len(name) > 128 {
			errs = append(errs, fmt.Errorf("images.pools: %q is not an image name", name))
		}
		total += n
	}
	if total > maxSandboxes {
		errs = append(errs, fmt.Errorf("lifecycle.pool_size and images.pools together (%d) must be at most lifecycle.max_sandboxes (%d)", total, maxSandboxes))
	}
	if s.MaxBytes < 0 || s.MaxFiles < 0 {
		errs = append(errs, fmt.Errorf("images.max_bytes and images.max_files must not be negative (0: the store's defaults)"))
	}
	if len(s.Default) > 128 {
		errs = append(errs, fmt.Errorf("images.default: %q is not an image name", s.Default))
	}
	return errs
}

func (s ImagesSection) defaultName() string {
	if s.Default == "" {
		return "host"
	}
	return s.Default
}

type ServerSection struct {
	Socket          string   `toml:"socket"`
	SocketMode      Mode     `toml:"socket_mode"`
	SocketGroup     string   `toml:"socket_group"`
	StateDir        string   `toml:"state_dir"`
	Backend         string   `toml:"backend"`
	LogFormat       string   `toml:"log_format"`
	LogLevel        string   `toml:"log_level"`
	MaxFrameBytes   Size     `toml:"max_frame_bytes"`
	MaxConnections  int      `toml:"max_connections"`
	ShutdownTimeout Duration `toml:"shutdown_timeout"`
	AuditFile       string   `toml:"audit_file"`
	// MaxConnectionsPerUID bounds one uid's connections; 0 is three
	// quarters of max_connections.
	MaxConnectionsPerUID int `toml:"max_connections_per_uid"`
	// FirstFrameTimeout closes a connection that has sent nothing by then.
	FirstFrameTimeout Duration `toml:"first_frame_timeout"`
	// The memory the daemon holds for requests (frames and what they
	// decode to, until answered) and for responses not yet written, all
	// connections together, and for one connection's responses
	// (docs/operations.md, "Memory").
	MaxRequestBytes               Size `toml:"max_request_bytes"`
	MaxResponseBytes              Size `toml:"max_response_bytes"`
	MaxResponseBytesPerConnection Size `toml:"max_response_bytes_per_connection"`
	// NodeName names this host in what clients carry between hosts (the
	// Python backend's sandbox handles); empty means
	// $SANDBOX_SIDECAR_NODE_NAME, else the host name.
	NodeName string `toml:"node_name"`
}

type AccessSection struct {
	AllowUIDs   List `toml:"allow_uids"`
	AllowGroups List `toml:"allow_groups"`
	AdminUIDs   List `toml:"admin_uids"`
	AdminGroups List `toml:"admin_groups"`
}

type LifecycleSection struct {
	ConnGrace            Duration `toml:"conn_grace"`
	MaxLifetime          Duration `toml:"max_lifetime"`
	DefaultTTL           Duration `toml:"default_ttl"`
	IdleTimeout          Duration `toml:"idle_timeout"`
	ReapInterval         Duration `toml:"reap_interval"`
	MaxSandboxes         int      `toml:"max_sandboxes"`
	MaxSandboxesPerUID   int      `toml:"max_sandboxes_per_uid"`
	MaxSandboxesPerOwner int      `toml:"max_sandboxes_per_owner"`
	MaxCommands          int      `toml:"max_commands"`
	// MaxCommandsPerUID caps one uid's running commands (0: three
	// quarters of max_commands), so one uid cannot take every slot.
	MaxCommandsPerUID int `toml:"max_commands_per_uid"`
	// MaxProcesses and MaxProcessesPerUID cap the durable processes
	// running at once on the host and per uid (0: three quarters).
	MaxProcesses       int `toml:"max_processes"`
	MaxProcessesPerUID int `toml:"max_processes_per_uid"`
	PoolSize           int `toml:"pool_size"`

	// MaxPaused bounds how long a sandbox may stay paused (0: its lease
	// alone bounds it).
	MaxPaused Duration `toml:"max_paused"`
}

type LimitsSection struct {
	MaxOutputBytes Size     `toml:"max_output_bytes"`
	MaxFileBytes   Size     `toml:"max_file_bytes"`
	MaxTimeout     Duration `toml:"max_timeout"`
	DefaultTimeout Duration `toml:"default_timeout"`
	// Per-sandbox rlimits (bwrap backend): RLIMIT_NOFILE and RLIMIT_FSIZE
	// of every guest process; 0 means no limit.
	OpenFiles uint64 `toml:"open_files"`
	FileSize  Size   `toml:"file_size"`
	// Per-sandbox cgroup limits (bwrap backend; need Cgroups): memory in
	// bytes (or a size with a unit, "1G"), a CPU quota in cores, a CPU weight (1..10000), processes and
	// threads. 0 means no limit.
	Memory    Size    `toml:"memory"`
	CPUs      float64 `toml:"cpus"`
	CPUWeight int     `toml:"cpu_weight"`
	PIDs      int64   `toml:"pids"`
	// Per-sandbox disk cap (bwrap backend; needs DiskCaps): bytes and
	// inodes of the sandbox's own filesystem. 0 means none (inodes: the
	// filesystem's default).
	Disk       Size  `toml:"disk"`
	DiskInodes int64 `toml:"disk_inodes"`
	// HostMemory caps the memory of every sandbox together (bwrap; needs
	// Cgroups): the limit of the cgroup all sandbox groups sit under, in
	// bytes. 0: defaultHostMemoryPercent of the host's memory.
	HostMemory Size `toml:"host_memory"`
	// Cgroups and DiskCaps say what happens when the host cannot enforce
	// those limits: auto (warn and run without), required (refuse to
	// start), off (do not try).
	Cgroups  string `toml:"cgroups"`
	DiskCaps string `toml:"disk_caps"`
}

// How a mechanism behind [limits] is used: limits.cgroups and
// limits.disk_caps.
const (
	enforceAuto     = "auto"
	enforceRequired = "required"
	enforceOff      = "off"
)

// maxFrameBytes bounds server.max_frame_bytes: a frame is held in memory
// whole, and the wire's length prefix is 32 bits.
const maxFrameBytes = 1 << 30

// maxCPUs bounds limits.cpus: more cores than any machine has is a typo.
const maxCPUs = 8192

// sandboxLimits is what the [limits] section asks of each sandbox.
func (l LimitsSection) sandboxLimits() limits.Limits {
	return limits.Limits{
		MemoryBytes: l.Memory.Bytes(), CPUs: l.CPUs, CPUWeight: l.CPUWeight, PIDs: l.PIDs,
		OpenFiles: l.OpenFiles, FileSizeBytes: uint64(max(l.FileSize, 0)), DiskBytes: l.Disk.Bytes(), DiskInodes: l.DiskInodes,
	}
}

// validate checks the per-sandbox limits one key at a time, so that each
// message names the key it is about.
func (l LimitsSection) validate() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for _, f := range []struct {
		key string
		l   limits.Limits
	}{
		{"limits.memory", limits.Limits{MemoryBytes: l.Memory.Bytes()}},
		{"limits.cpus", limits.Limits{CPUs: l.CPUs}},
		{"limits.cpu_weight", limits.Limits{CPUWeight: l.CPUWeight}},
		{"limits.pids", limits.Limits{PIDs: l.PIDs}},
		{"limits.open_files", limits.Limits{OpenFiles: l.OpenFiles}},
		{"limits.file_size", limits.Limits{FileSizeBytes: uint64(max(l.FileSize, 0))}},
		{"limits.disk", limits.Limits{DiskBytes: l.Disk.Bytes()}},
		{"limits.disk_inodes", limits.Limits{DiskInodes: l.DiskInodes}},
	} {
		if err := f.l.Validate(); err != nil {
			bad("%s: %v", f.key, err)
		}
	}
	if l.FileSize < 0 {
		bad("limits.file_size must not be negative (0: no limit)")
	}
	if math.IsNaN(l.CPUs) || math.IsInf(l.CPUs, 0) || l.CPUs > maxCPUs {
		bad("limits.cpus %v: give 0 (none) or a number of cores up to %d", l.CPUs, maxCPUs)
	}
	switch {
	case l.HostMemory < 0:
		bad("limits.host_memory must not be negative (0: %d%% of the host's memory)", defaultHostMemoryPercent)
	case l.HostMemory > 0 && l.HostMemory < l.Memory:
		bad("limits.host_memory (%d) is less than one sandbox's limits.memory (%d): no sandbox could use its own limit", l.HostMemory, l.Memory)
	case l.HostMemory > 0 && l.HostMemory < 4<<20:
		bad("limits.host_memory %d is too small; give at least 4 MiB", l.HostMemory)
	}
	if l.DiskInodes > 0 && l.Disk == 0 {
		bad("limits.disk_inodes needs limits.disk: an inode cap comes with the sandbox's own filesystem")
	}
	for key, mode := range map[string]string{"limits.cgroups": l.Cgroups, "limits.disk_caps": l.DiskCaps} {
		switch mode {
		case enforceAuto, enforceRequired, enforceOff:
		default:
			bad("%s %q: give auto (enforce when the host can, warn when not), required (refuse to start without) or off", key, mode)
		}
	}
	if l.DiskCaps == enforceRequired && l.Disk == 0 {
		bad("limits.disk_caps = required needs a cap: set limits.disk")
	}
	return errs
}

type BwrapSection struct {
	// OwnUIDs is auto, required or off: a host uid of its own for every
	// sandbox, from [UIDRangeStart, +UIDRangeSize) (see bwrapUIDs).
	OwnUIDs       string `toml:"own_uids"`
	UIDRangeStart uint32 `toml:"uid_range_start"`
	UIDRangeSize  uint32 `toml:"uid_range_size"`
	// SandboxUID/GID: the ids of sandboxes without one of their own.
	SandboxUID       int      `toml:"sandbox_uid"`
	SandboxGID       int      `toml:"sandbox_gid"`
	ShareHostNetwork bool     `toml:"share_host_network"`
	KillGrace        Duration `toml:"kill_grace"`
}

// SbxSection configures the sbx (Docker Sandboxes microVM) backend; see
// docs/sbx.md.
type SbxSection struct {
	Path          string   `toml:"path"`
	Template      string   `toml:"template"`
	Templates     List     `toml:"templates"`
	Memory        string   `toml:"memory"`
	CPUs          int      `toml:"cpus"`
	CreateTimeout Duration `toml:"create_timeout"`
	KillAfter     Duration `toml:"kill_after"`
	ExecGrace     Duration `toml:"exec_grace"`
	ListTimeout   Duration `toml:"list_timeout"`
	StartTimeout  Duration `toml:"start_timeout"`
	AutoStopGrace Duration `toml:"auto_stop_grace"`
	HostPolicy    string   `toml:"host_policy"`
	Marker        string   `toml:"marker"`
	KVMDevice     string   `toml:"kvm_device"`
}

// GvisorSection configures the gvisor (runsc) backend; see
// docs/operations.md (gVisor).
type GvisorSection struct {
	// RunscPath is the runsc binary; empty means runsc on PATH.
	RunscPath string `toml:"runsc_path"`
	// Platform is runsc's platform: systrap (the default; no KVM needed),
	// ptrace, or kvm (refused at start unless KVM_CREATE_VM works here).
	Platform string `toml:"platform"`
	// ExtraFlags are added to every runsc command line.
	ExtraFlags List     `toml:"extra_flags"`
	KillGrace  Duration `toml:"kill_grace"`
	// SystrapFastPath is auto (off on hosts of two CPUs or fewer, runsc's
	// own choice otherwise), on or off: gvisor.Config.SystrapFastPath.
	SystrapFastPath string `toml:"systrap_fast_path"`
	// BufferedRestoreReads: gvisor.Config.BufferedRestoreReads.
	BufferedRestoreReads bool `toml:"buffered_restore_reads"`
	// MaxCheckpointBytes caps the checkpoint a paused sandbox keeps on
	// disk (its memory): gvisor.Config.MaxCheckpointBytes.
	MaxCheckpointBytes Size `toml:"max_checkpoint_bytes"`
}

func defaultConfig() Config {
	return Config{
		Server: ServerSection{
			Socket: defaultSocket(), SocketMode: 0o660, StateDir: defaultStateDir(), Backend: "bwrap",
			LogFormat: "text", LogLevel: "info", MaxFrameBytes: Size(ipc.DefaultMaxFrame), MaxConnections: ipc.DefaultMaxConns,
			ShutdownTimeout: Duration(30 * time.Second), FirstFrameTimeout: Duration(ipc.DefaultFirstFrameTimeout),
			MaxRequestBytes: Size(ipc.DefaultMaxRequestBytes), MaxResponseBytes: Size(ipc.DefaultMaxResponseBytes),
			MaxResponseBytesPerConnection: Size(ipc.DefaultMaxConnResponseBytes),
		},
		Lifecycle: LifecycleSection{
			ConnGrace: Duration(lifecycle.DefaultConnGrace), MaxLifetime: Duration(lifecycle.DefaultMaxLifetime),
			DefaultTTL: Duration(lifecycle.DefaultTTL), IdleTimeout: Duration(30 * time.Minute),
			ReapInterval: Duration(lifecycle.DefaultReapInterval), MaxSandboxes: lifecycle.DefaultMaxPerHost,
			MaxSandboxesPerUID: lifecycle.DefaultMaxPerUID, MaxSandboxesPerOwner: lifecycle.DefaultMaxPerOwner,
			MaxCommands: lifecycle.DefaultMaxCmdsPerHost, MaxProcesses: lifecycle.DefaultMaxProcsPerHost,
		},
		Processes: ProcessesSection{LogBytes: Size(procstore.DefaultLogBytes), MaxRunning: procstore.DefaultMaxRunning, MaxEnded: procstore.DefaultMaxEnded},
		Code:      CodeSection{Preload: List{}, ImagePreload: map[string]List{}, MaxContexts: agent.DefaultMaxContexts},
		Limits: LimitsSection{
			MaxOutputBytes: Size(service.DefaultMaxOutputBytes), MaxFileBytes: Size(service.DefaultMaxFileBytes),
			MaxTimeout: Duration(service.DefaultMaxTimeout), DefaultTimeout: Duration(service.DefaultTimeout),
			OpenFiles: limits.Defaults().OpenFiles, FileSize: Size(limits.Defaults().FileSizeBytes),
			Memory: Size(limits.Defaults().MemoryBytes), CPUs: limits.Defaults().CPUs, CPUWeight: limits.Defaults().CPUWeight,
			PIDs: limits.Defaults().PIDs, Disk: Size(limits.Defaults().DiskBytes), DiskInodes: limits.Defaults().DiskInodes,
			Cgroups: enforceAuto, DiskCaps: enforceAuto,
		},
		Bwrap: BwrapSection{
			OwnUIDs: enforceAuto, UIDRangeStart: hostids.DefaultFirst, UIDRangeSize: hostids.DefaultSize,
			SandboxUID: 65534, SandboxGID: 65534, KillGrace: Duration(2 * time.Second),
		},
		Egress: EgressSection{Hosts: map[string][]string{}, PrivateAllowed: []string{}, MaxConns: 256, IdleTimeout: Duration(5 * time.Minute)},
		Sbx: SbxSection{
			Path: "sbx", Template: sbx.DefaultTemplate, Templates: List{}, Memory: sbx.DefaultMemory,
			CreateTimeout: Duration(sbx.DefaultCreateTimeout), KillAfter: Duration(sbx.DefaultKillAfter),
			ExecGrace: Duration(sbx.DefaultExecGrace), ListTimeout: Duration(sbx.DefaultListTimeout),
			StartTimeout: Duration(sbx.DefaultStartTimeout), AutoStopGrace: Duration(sbx.DefaultAutoStopGrace),
			HostPolicy: string(sbx.PolicyUnknown), KVMDevice: sbx.DefaultKVMDevice,
		},
		Gvisor: GvisorSection{Platform: gvisor.PlatformSystrap, KillGrace: Duration(gvisor.DefaultKillGrace), SystrapFastPath: gvisor.FastPathAuto,
			MaxCheckpointBytes: Size(gvisor.DefaultMaxCheckpointBytes)},
		Airflow: AirflowSection{Auth: runwatch.AuthBearer, RunPath: runwatch.DefaultRunPath,
			PollInterval: Duration(runwatch.DefaultInterval), RequestTimeout: Duration(runwatch.DefaultRequestTimeout)},
		Images: ImagesSection{Default: "host", Pools: map[string]int{}},
	}
}

// loadConfigFile decodes path over cfg. A missing default file is not an
// error; a missing explicit one is. Unknown keys are refused with their
// line, so a typo never silently leaves a default in place.
//
// A file that parses but holds values of the wrong type or unknown keys
// yields a *fileProblems naming every one of them, and cfg holds the rest
// of the file decoded (each bad key left at its default), so that
// `config check` can also validate what is there. Any other error (a file
// that is not TOML, an unreadable file) leaves cfg undefined.
func loadConfigFile(cfg *Config, path string, explicit bool) error {
	b, err := os.ReadFile(path)
	if err != nil {
		if !explicit && errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("reading config: %w", err)
	}
	// Syntax first: a file that is not TOML has nothing more to report.
	var syntax map[string]any
	if err := toml.Unmarshal(b, &syntax); err != nil {
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			return fmt.Errorf("%s:%d:%d: %s", path, row, col, de.Error())
		}
		return fmt.Errorf("%s: %w", path, err)
	}
	// Then types: the decoder stops at the first bad value, so each one is
	// noted, its line blanked (keeping every other line where it is) and
	// the file decoded again, a bounded number of times.
	start := *cfg
	var problems []string
	for range maxConfigProblems {
		*cfg = start
		dec := toml.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		err := dec.Decode(cfg)
		if err == nil {
			break
		}
		var strict *toml.StrictMissingError
		if errors.As(err, &strict) {
			for _, e := range strict.Errors {
				row, col := e.Position()
				problems = append(problems, fmt.Sprintf("%s:%d:%d: unknown key %q", path, row, col, strings.Join(e.Key(), ".")))
			}
			break
		}
		var de *toml.DecodeError
		if !errors.As(err, &de) {
			return fmt.Errorf("%s: %w", path, err)
		}
		row, col := de.Position()
		msg := strings.TrimPrefix(de.Error(), "toml: ")
		if k := de.Key(); len(k) > 0 {
			msg = strings.Join(k, ".") + ": " + msg
		}
		problems = append(problems, fmt.Sprintf("%s:%d:%d: %s", path, row, col, msg))
		blanked, ok := blankLine(b, row)
		if !ok {
			break
		}
		// A value that spans lines cannot be blanked by one: stop at what
		// is known rather than report the wreck as a syntax error.
		if toml.Unmarshal(blanked, &syntax) != nil {
			*cfg = start
			break
		}
		b = blanked
	}
	if len(problems) > 0 {
		return &fileProblems{lines: problems}
	}
	return nil
}

// maxConfigProblems bounds the type errors one load reports.
const maxConfigProblems = 64

// fileProblems are the bad values and unknown keys of a config file that
// parses, one line each, with its position.
type fileProblems struct{ lines []string }

func (p *fileProblems) Error() string { return strings.Join(p.lines, "\n") }

// blankLine replaces line row (1-based) of b with spaces, keeping its
// newline so every other line keeps its number.
func blankLine(b []byte, row int) ([]byte, bool) {
	lines := bytes.SplitAfter(b, []byte("\n"))
	if row < 1 || row > len(lines) {
		return nil, false
	}
	out := make([]byte, 0, len(b))
	for i, l := range lines {
		if i == row-1 {
			nl := bytes.HasSuffix(l, []byte("\n"))
			l = bytes.Repeat([]byte(" "), len(bytes.TrimSuffix(l, []byte("\n"))))
			if nl {
				l = append(l, '\n')
			}
		}
		out = append(out, l...)
	}
	return out, true
}

// configPathFromArgs finds --config in args before flags are parsed, so
// the file can supply the flags' defaults.
func configPathFromArgs(args []string) (string, bool) {
	for i, a := range args {
		if a == "--" {
			break
		}
		for _, p := range []string{"--config", "-config"} {
			if a == p && i+1 < len(args) {
				return args[i+1], true
			}
			if v, ok := strings.CutPrefix(a, p+"="); ok {
				return v, true
			}
		}
	}
	return DefaultConfigPath, false
}

// validate checks what can be checked without side effects.
func (c *Config) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Server.Socket == "" {
		bad("server.socket must not be empty")
	}
	if c.Server.SocketMode&^0o777 != 0 || c.Server.SocketMode&0o600 != 0o600 {
		bad("server.socket_mode %s: the owner needs rw and only permission bits are allowed", c.Server.SocketMode)
	}
	if c.Server.StateDir == "" {
		bad("server.state_dir must not be empty")
	} else if sockDir := filepath.Dir(filepath.Clean(c.Server.Socket)); c.Server.Socket != "" && within(c.Server.StateDir, sockDir) {
		// The daemon makes the socket's directory its own (mode
		// socket_mode's directory bits, 0750): a state directory in it
		// would become unreachable to the sandboxes' uids, and every
		// sandbox's init would die at its first command.
		bad("server.state_dir %s is inside the socket's directory %s, which the daemon makes private to itself and the socket group; give the socket a directory of its own (e.g. %s)",
			c.Server.StateDir, sockDir, filepath.Join(sockDir, "run", filepath.Base(c.Server.Socket)))
	}
	if c.Server.NodeName != "" && !validNodeName(c.Server.NodeName) {
		bad("server.node_name %q: at most %d letters, digits, '.', '-' and '_'", c.Server.NodeName, maxNodeName)
	}
	switch c.Server.Backend {
	case "bwrap", "sbx", "gvisor":
	default:
		bad("server.backend %q: this build has bwrap, sbx and gvisor", c.Server.Backend)
	}
	switch c.Gvisor.Platform {
	case gvisor.PlatformSystrap, gvisor.PlatformPtrace, gvisor.PlatformKVM:
	default:
		bad("gvisor.platform %q: use systrap (the default), ptrace or kvm", c.Gvisor.Platform)
	}
	switch c.Gvisor.SystrapFastPath {
	case gvisor.FastPathAuto, gvisor.FastPathOn, gvisor.FastPathOff:
	default:
		bad("gvisor.systrap_fast_path %q: use auto (the default), on or off", c.Gvisor.SystrapFastPath)
	}
	if c.Gvisor.RunscPath != "" && !filepath.IsAbs(c.Gvisor.RunscPath) {
		bad("gvisor.runsc_path %q must be an absolute path (or empty for runsc on PATH)", c.Gvisor.RunscPath)
	}
	for _, f := range c.Gvisor.ExtraFlags {
		if !strings.HasPrefix(f, "--") {
			bad("gvisor.extra_flags: %q must start with --", f)
		}
	}
	errs = append(errs, c.Egress.validate()...)
	if c.Egress.Enabled && c.Server.Backend != "bwrap" && c.Server.Backend != "gvisor" {
		bad("egress.enabled: only the bwrap and gvisor backends have the egress path (server.backend is %q; sbx maps the lists to its own host policy)", c.Server.Backend)
	}
	if _, err := sbx.ParseHostPolicy(c.Sbx.HostPolicy); err != nil {
		bad("sbx.host_policy: %v", err)
	}
	if c.Sbx.CPUs < 0 {
		bad("sbx.cpus must not be negative (0: sbx's default)")
	}
	if _, err := newLogger(c.Server.LogFormat, c.Server.LogLevel, io.Discard); err != nil {
		bad("server: %v", err)
	}
	if c.Server.SocketGroup != "" {
		if _, err := lookupGroup(c.Server.SocketGroup); err != nil {
			bad("server.socket_group: %v", err)
		}
	}
	if _, err := parseUIDs(c.Access.AllowUIDs); err != nil {
		bad("access.allow_uids: %v", err)
	}
	if _, err := parseUIDs(c.Access.AdminUIDs); err != nil {
		bad("access.admin_uids: %v", err)
	}
	if _, err := parseGIDs(c.Access.AllowGroups); err != nil {
		bad("access.allow_groups: %v", err)
	}
	if _, err := parseGIDs(c.Access.AdminGroups); err != nil {
		bad("access.admin_groups: %v", err)
	}
	positive := map[string]int64{
		"server.max_frame_bytes":            int64(c.Server.MaxFrameBytes),
		"server.max_connections":            int64(c.Server.MaxConnections),
		"server.shutdown_timeout":           int64(c.Server.ShutdownTimeout),
		"server.first_frame_timeout":        int64(c.Server.FirstFrameTimeout),
		"lifecycle.conn_grace":              int64(c.Lifecycle.ConnGrace),
		"lifecycle.max_lifetime":            int64(c.Lifecycle.MaxLifetime),
		"lifecycle.default_ttl":             int64(c.Lifecycle.DefaultTTL),
		"lifecycle.reap_interval":           int64(c.Lifecycle.ReapInterval),
		"lifecycle.max_sandboxes":           int64(c.Lifecycle.MaxSandboxes),
		"lifecycle.max_sandboxes_per_uid":   int64(c.Lifecycle.MaxSandboxesPerUID),
		"lifecycle.max_sandboxes_per_owner": int64(c.Lifecycle.MaxSandboxesPerOwner),
		"lifecycle.max_commands":            int64(c.Lifecycle.MaxCommands),
		"lifecycle.max_processes":           int64(c.Lifecycle.MaxProcesses),
		"processes.max_running":             int64(c.Processes.MaxRunning),
		"processes.max_ended":               int64(c.Processes.MaxEnded),
		"code.max_contexts":                 int64(c.Code.MaxContexts),
		"limits.max_output_bytes":           int64(c.Limits.MaxOutputBytes),
		"limits.max_file_bytes":             int64(c.Limits.MaxFileBytes),
		"limits.max_timeout":                int64(c.Limits.MaxTimeout),
		"limits.default_timeout":            int64(c.Limits.DefaultTimeout),
		"bwrap.kill_grace":                  int64(c.Bwrap.KillGrace),
		"bwrap.sandbox_uid":                 int64(c.Bwrap.SandboxUID),
		"bwrap.sandbox_gid":                 int64(c.Bwrap.SandboxGID),
		"sbx.create_timeout":                int64(c.Sbx.CreateTimeout),
		"sbx.kill_after":                    int64(c.Sbx.KillAfter),
		"sbx.exec_grace":                    int64(c.Sbx.ExecGrace),
		"sbx.list_timeout":                  int64(c.Sbx.ListTimeout),
		"sbx.start_timeout":                 int64(c.Sbx.StartTimeout),
		"sbx.auto_stop_grace":               int64(c.Sbx.AutoStopGrace),
		"gvisor.kill_grace":                 int64(c.Gvisor.KillGrace),
		"gvisor.max_checkpoint_bytes":       int64(c.Gvisor.MaxCheckpointBytes),
	}
	for name, v := range positive {
		if v <= 0 {
			bad("%s must be greater than 0", name)
		}
	}
	if c.Lifecycle.PoolSize < 0 || c.Lifecycle.PoolSize > c.Lifecycle.MaxSandboxes {
		bad("lifecycle.pool_size must be between 0 (no pool) and lifecycle.max_sandboxes")
	}
	if c.Lifecycle.MaxCommandsPerUID < 0 || c.Lifecycle.MaxCommandsPerUID > c.Lifecycle.MaxCommands {
		bad("lifecycle.max_commands_per_uid must be between 0 (three quarters of lifecycle.max_commands) and lifecycle.max_commands")
	}
	if c.Code.MaxContexts > 1024 {
		bad("code.max_contexts %d: at most 1024", c.Code.MaxContexts)
	}
	for _, mods := range append([]List{c.Code.Preload}, mapValues(c.Code.ImagePreload)...) {
		for _, m := range mods {
			if !pythonModuleName(m) {
				bad("code.preload: %q is not a Python module's name (dotted identifiers)", m)
			}
		}
	}
	if c.Lifecycle.MaxProcessesPerUID < 0 || c.Lifecycle.MaxProcessesPerUID > c.Lifecycle.MaxProcesses {
		bad("lifecycle.max_processes_per_uid must be between 0 (three quarters of lifecycle.max_processes) and lifecycle.max_processes")
	}
	if c.Processes.LogBytes < proclog.MinCap || c.Processes.LogBytes > 1<<40 {
		bad("processes.log_bytes %s: between %s and 1 TiB", c.Processes.LogBytes, Size(proclog.MinCap))
	}
	if c.Lifecycle.IdleTimeout < 0 {
		bad("lifecycle.idle_timeout must not be negative (0 disables it)")
	}
	if c.Lifecycle.MaxPaused < 0 {
		bad("lifecycle.max_paused must not be negative (0: a paused sandbox lives as long as its lease)")
	}
	if c.Server.MaxFrameBytes > maxFrameBytes {
		bad("server.max_frame_bytes %s: at most %s", c.Server.MaxFrameBytes, Size(maxFrameBytes))
	}
	if c.Server.MaxFrameBytes > 0 && c.Limits.MaxFileBytes > c.Server.MaxFrameBytes-64<<10 {
		bad("limits.max_file_bytes (%s) must leave room in a frame (server.max_frame_bytes %s, minus 64 KiB)", c.Limits.MaxFileBytes, c.Server.MaxFrameBytes)
	}
	if c.Server.MaxFrameBytes > 0 && c.Limits.MaxOutputBytes > (c.Server.MaxFrameBytes-64<<10)/2 {
		bad("limits.max_output_bytes (%s, per stream) times two must fit in a frame (server.max_frame_bytes %s, minus 64 KiB)", c.Limits.MaxOutputBytes, c.Server.MaxFrameBytes)
	}
	errs = append(errs, c.Server.validateMemory(c.serviceLimits())...)
	errs = append(errs, c.Limits.validate()...)
	switch c.Bwrap.OwnUIDs {
	case enforceAuto, enforceRequired:
		if err := (hostids.Range{First: c.Bwrap.UIDRangeStart, Size: c.Bwrap.UIDRangeSize}).Validate(); err != nil {
			bad("bwrap.uid_range_start/uid_range_size: %v", err)
		}
	case enforceOff:
	default:
		bad("bwrap.own_uids %q: give auto (a uid of its own per sandbox when the daemon can: root, or CAP_SETUID, CAP_SETGID and CAP_KILL; else a warning), required (refuse to start without) or off", c.Bwrap.OwnUIDs)
	}
	errs = append(errs, c.Metrics.validate()...)
	errs = append(errs, c.Airflow.validate()...)
	errs = append(errs, c.Images.validate(c.Lifecycle.MaxSandboxes, c.Lifecycle.PoolSize)...)
	return errors.Join(errs...)
}

// serviceLimits is what the service bounds each request by.
func (c *Config) serviceLimits() service.Limits {
	return service.Limits{
		MaxOutputBytes: int(c.Limits.MaxOutputBytes), MaxFileBytes: c.Limits.MaxFileBytes.Bytes(),
		MaxTimeout: c.Limits.MaxTimeout.D(), DefaultTimeout: c.Limits.DefaultTimeout.D(), MaxFrame: int(c.Server.MaxFrameBytes),
	}
}

// validateMemory checks the connection and memory bounds of [server]: each
// budget must hold the largest thing charged to it, or that thing could
// never be served.
func (s ServerSection) validateMemory(lim service.Limits) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if s.MaxConnectionsPerUID < 0 || (s.MaxConnections > 0 && s.MaxConnectionsPerUID > s.MaxConnections) {
		bad("server.max_connections_per_uid %d: give 0 (three quarters of max_connections) or at most max_connections (%d)", s.MaxConnectionsPerUID, s.MaxConnections)
	}
	if s.MaxFrameBytes <= 0 || s.MaxFrameBytes > maxFrameBytes {
		return errs
	}
	if need := ipc.RequestCost(int(s.MaxFrameBytes)); s.MaxRequestBytes.Bytes() < need {
		bad("server.max_request_bytes %s must hold the largest frame and what it decodes to (%s for max_frame_bytes %s)", s.MaxRequestBytes, Size(need), s.MaxFrameBytes)
	}
	if need := max(s.MaxFrameBytes.Bytes()+4, service.LargestReservation(lim)); s.MaxResponseBytesPerConnection.Bytes() < need {
		bad("server.max_response_bytes_per_connection %s must hold the largest response (%s: a frame, a read_file of max_file_bytes or a run_command of max_output_bytes, twice over)", s.MaxResponseBytesPerConnection, Size(need))
	}
	if s.MaxResponseBytes < s.MaxResponseBytesPerConnection {
		bad("server.max_response_bytes %s must be at least server.max_response_bytes_per_connection (%s)", s.MaxResponseBytes, s.MaxResponseBytesPerConnection)
	}
	return errs
}

// Duration is a time.Duration written as "30s", "10m", "1h30m".
type Duration time.Duration

func (d Duration) D() time.Duration { return time.Duration(d) }

func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration (write e.g. \"30s\", \"10m\", \"1h\")", b)
	}
	*d = Duration(v)
	return nil
}

func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }
func (d *Duration) String() string              { return time.Duration(*d).String() }
func (d *Duration) Set(s string) error          { return d.UnmarshalText([]byte(s)) }

// Mode is a file mode written in octal, e.g. "0660".
type Mode uint32

func (m *Mode) UnmarshalText(b []byte) error {
	v, err := strconv.ParseUint(string(b), 8, 32)
	if err != nil {
		return fmt.Errorf("%q is not an octal mode (write e.g. \"0660\")", b)
	}
	*m = Mode(v)
	return nil
}

func (m Mode) MarshalText() ([]byte, error) { return []byte(fmt.Sprintf("%04o", uint32(m))), nil }
func (m Mode) String() string               { return fmt.Sprintf("%04o", uint32(m)) }
func (m *Mode) Set(s string) error          { return m.UnmarshalText([]byte(s)) }

// List is a list of strings; as a flag it is repeatable and
// comma-separable, and the first use replaces what the file said.
type List []string

// listFlag binds a List to a flag.
type listFlag struct {
	l   *List
	set bool
}

func (f *listFlag) String() string {
	if f.l == nil {
		return ""
	}
	return strings.Join(*f.l, ",")
}

func (f *listFlag) Set(v string) error {
	if !f.set {
		*f.l = nil
		f.set = true
	}
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*f.l = append(*f.l, s)
		}
	}
	return nil
}

// runConfig implements `config check` and `config show`.
func runConfig(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "check" && args[0] != "show") {
		fmt.Fprintf(stderr, "Usage: sandbox-sidecar config check|show [--config PATH]\n\ncheck validates the config file (unknown keys, types, values);\nshow prints the effective configuration (defaults, then the file).\n")
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h") {
			return nil
		}
		return &exitError{code: 2}
	}
	sub := args[0]
	fs := newFlags("config", sub+" [--config PATH]", stderr)
	path := fs.String("config", DefaultConfigPath, "config file")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	cfg := defaultConfig()
	explicit := *path != DefaultConfigPath || sub == "check"
	// check reports every problem at once: the file's bad values and
	// unknown keys, then what validation finds in the rest of it.
	var problems *fileProblems
	if err := loadConfigFile(&cfg, *path, explicit); err != nil && !(sub == "check" && errors.As(err, &problems)) {
		return &exitError{code: 1, err: err}
	}
	if err := cfg.validate(); err != nil || problems != nil {
		var all []error
		if problems != nil {
			all = append(all, problems)
		}
		if err != nil {
			all = append(all, fmt.Errorf("%s:\n%w", *path, err))
		}
		return &exitError{code: 1, err: errors.Join(all...)}
	}
	if sub == "show" {
		b, err := toml.Marshal(cfg)
		if err != nil {
			return err
		}
		if len(b) > 0 && b[len(b)-1] != '\n' {
			b = append(b, '\n')
		}
		_, err = stdout.Write(b)
		return err
	}
	fmt.Fprintf(stdout, "%s: OK\n", *path)
	return nil
}

// within says whether path is dir or below it (lexically, both made
// absolute).
func within(path, dir string) bool {
	p, err1 := filepath.Abs(path)
	d, err2 := filepath.Abs(dir)
	if err1 != nil || err2 != nil {
		return false
	}
	rel, err := filepath.Rel(d, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

func mapValues[K comparable, V any](m map[K]V) []V {
	out := make([]V, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// pythonModuleName reports whether s is a dotted Python identifier (ASCII
// only: it travels to the sandbox as a comma-separated list).
func pythonModuleName(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for _, part := range strings.Split(s, ".") {
		if part == "" || part[0] >= '0' && part[0] <= '9' {
			return false
		}
		for _, c := range []byte(part) {
			if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
				return false
			}
		}
	}
	return true
}
