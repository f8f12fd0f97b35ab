package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/sbx"
	"github.com/sandbox-sidecar/sandbox-sidecar/internal/failpoint"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
	"github.com/sandbox-sidecar/sandbox-sidecar/metrics"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/hostids"
	"github.com/sandbox-sidecar/sandbox-sidecar/service"
)

func runServe(args []string, stdout, stderr io.Writer) error {
	cfg, err := serveConfig(args, stderr)
	if err != nil {
		return err
	}
	return serve(cfg, stderr)
}

// serveConfig is serve's configuration: the defaults, then the config file,
// then the flags, validated.
func serveConfig(args []string, stderr io.Writer) (Config, error) {
	cfg := defaultConfig()
	path, explicit := configPathFromArgs(args)
	if err := loadConfigFile(&cfg, path, explicit); err != nil {
		return cfg, &exitError{code: 2, err: err}
	}
	fs := newFlags("serve", "[--config PATH] [flags]", stderr)
	fs.String("config", DefaultConfigPath, "config file (TOML; read when it exists; flags override it)")
	s, a, l, lim, bw := &cfg.Server, &cfg.Access, &cfg.Lifecycle, &cfg.Limits, &cfg.Bwrap
	fs.StringVar(&s.Socket, "socket", s.Socket, "Unix socket to listen on (env "+SocketEnv+"); ignored under systemd socket activation")
	fs.Var(&s.SocketMode, "socket-mode", "mode of the socket; its directory gets the matching r-x bits")
	fs.StringVar(&s.SocketGroup, "socket-group", s.SocketGroup, "group (name or gid) owning the socket; its members may connect (default: 'sandbox-sidecar' when that group exists and the daemon runs as root)")
	fs.StringVar(&s.StateDir, "state-dir", s.StateDir, "state directory (one daemon per directory)")
	fs.StringVar(&s.Backend, "backend", s.Backend, "sandbox backend: bwrap (namespaces, the default), gvisor (gVisor's runsc: a user-space kernel) or sbx (Docker Sandboxes microVMs; docs/sbx.md)")
	fs.StringVar(&s.LogFormat, "log-format", s.LogFormat, "log format: text or json")
	fs.StringVar(&s.LogLevel, "log-level", s.LogLevel, "log level: trace, debug, info, warn, error")
	fs.Var(&s.MaxFrameBytes, "max-frame-bytes", "largest frame accepted or sent (a size: 16m, 16777216)")
	fs.IntVar(&s.MaxConnections, "max-connections", s.MaxConnections, "most connections open at once")
	fs.Var(&s.ShutdownTimeout, "shutdown-timeout", "how long in-flight requests may run after SIGTERM")
	fs.IntVar(&s.MaxConnectionsPerUID, "max-connections-per-uid", s.MaxConnectionsPerUID, "most connections of one uid open at once (0: three quarters of max-connections)")
	fs.Var(&s.FirstFrameTimeout, "first-frame-timeout", "close a connection that has sent nothing for this long after connecting")
	fs.Var(&s.MaxRequestBytes, "max-request-bytes", "bytes held for requests (frames and what they decode to, until answered), all connections together (a size: 256m)")
	fs.Var(&s.MaxResponseBytes, "max-response-bytes", "bytes held for responses not yet written, all connections together (a size)")
	fs.Var(&s.MaxResponseBytesPerConnection, "max-response-bytes-per-connection", "bytes held for one connection's responses not yet written (a size: 64m)")
	fs.StringVar(&s.AuditFile, "audit-file", s.AuditFile, "also append the audit trail to this file as JSON lines")
	fs.StringVar(&s.NodeName, "node-name", s.NodeName, "this host's name in sandbox handles clients carry between hosts (default: $"+NodeNameEnv+", else the host name; on Kubernetes the node's name)")
	fs.Var(&listFlag{l: &a.AllowUIDs}, "allow-uid", "uids (or user names) allowed to connect, besides root, the daemon's uid and the socket group (repeatable, comma-separated)")
	fs.Var(&listFlag{l: &a.AllowGroups}, "allow-group", "groups (names or gids) whose members may connect, besides the socket group (repeatable)")
	fs.Var(&listFlag{l: &a.AdminUIDs}, "admin-uid", "uids that may list and destroy every sandbox, besides root and the daemon's uid (repeatable)")
	fs.Var(&listFlag{l: &a.AdminGroups}, "admin-group", "groups whose members may list and destroy every sandbox (repeatable)")
	fs.Var(&l.ConnGrace, "conn-grace", "how long a connection-bound sandbox outlives its connection")
	fs.Var(&l.MaxLifetime, "max-lifetime", "hard cap on any sandbox's life")
	fs.Var(&l.DefaultTTL, "default-ttl", "life of an owned sandbox created without ttl_s")
	fs.Var(&l.IdleTimeout, "idle-timeout", "destroy a sandbox that ran nothing for this long (0: never)")
	fs.Var(&l.MaxPaused, "max-paused", "destroy a sandbox paused for longer than this (0: a paused sandbox lives as long as its lease; the idle timeout never applies to one)")
	fs.Var(&l.ReapInterval, "reap-interval", "how often the reaper looks for expired and abandoned sandboxes")
	fs.IntVar(&l.MaxSandboxes, "max-sandboxes", l.MaxSandboxes, "most sandboxes on this host")
	fs.IntVar(&l.MaxSandboxesPerUID, "max-sandboxes-per-uid", l.MaxSandboxesPerUID, "most sandboxes per client uid")
	fs.IntVar(&l.MaxSandboxesPerOwner, "max-sandboxes-per-owner", l.MaxSandboxesPerOwner, "most sandboxes per owner (Airflow run)")
	fs.IntVar(&l.MaxCommands, "max-commands", l.MaxCommands, "most commands running at once on this host")
	fs.IntVar(&l.PoolSize, "pool-size", l.PoolSize, "ready sandboxes of the default image kept in a warm pool for fast creates (0: no pool)")
	im := &cfg.Images
	fs.StringVar(&im.Default, "images-default", im.Default, "the image of a create that names none: host (the host's /usr, the built-in) or an imported image's name")
	fs.Var(&im.MaxBytes, "images-max-bytes", "most bytes one image import may bring (its archive, and its unpacked root; a size: 8g; 0: the store's default)")
	fs.Int64Var(&im.MaxFiles, "images-max-files", im.MaxFiles, "most files one image's unpacked root may hold (0: the store's default)")
	fs.Func("image-pool", "NAME=N: keep N ready sandboxes of image NAME in the warm pool (repeatable; images.pools)", func(v string) error {
		n, size, ok := strings.Cut(v, "=")
		k, err := strconv.Atoi(size)
		if !ok || n == "" || err != nil || k < 0 {
			return fmt.Errorf("want NAME=N with N >= 0, got %q", v)
		}
		if im.Pools == nil {
			im.Pools = map[string]int{}
		}
		im.Pools[n] = k
		return nil
	})
	fs.Var(&lim.MaxOutputBytes, "max-output-bytes", "cap on max_output_bytes (per stream; a size: 4m)")
	fs.Var(&lim.MaxFileBytes, "max-file-bytes", "cap on one read_file or write_file (a size: 8m)")
	fs.Var(&lim.MaxTimeout, "max-timeout", "cap on a command's timeout")
	fs.Var(&lim.DefaultTimeout, "default-timeout", "a command's timeout when the request gives none")
	fs.Uint64Var(&lim.OpenFiles, "limit-open-files", lim.OpenFiles, "RLIMIT_NOFILE of every sandbox process (bwrap; 0: no limit)")
	fs.Var(&lim.FileSize, "limit-file-size", "RLIMIT_FSIZE, the largest file a sandbox process may write (a size: 1g; bwrap; 0: no limit)")
	fs.Var(&lim.Memory, "limit-memory", "memory of each sandbox (a size: 512m, 2g), page cache and tmpfs included; past it the kernel kills a process of the sandbox (bwrap, cgroup; 0: no limit)")
	fs.Var(&lim.HostMemory, "limit-host-memory", "memory of every sandbox together (a size: 16g), on the cgroup they all sit under; past it the kernel kills a process of one of them (bwrap, cgroup; 0: 75% of the host's memory)")
	fs.Float64Var(&lim.CPUs, "limit-cpus", lim.CPUs, "CPU time of each sandbox, in cores: 1.5 is one and a half CPUs (bwrap, cgroup; 0: no limit)")
	fs.IntVar(&lim.CPUWeight, "limit-cpu-weight", lim.CPUWeight, "each sandbox's share of contended CPU, 1..10000, 100 being a normal process's (bwrap, cgroup; 0: the kernel's default)")
	fs.Int64Var(&lim.PIDs, "limit-pids", lim.PIDs, "processes and threads of each sandbox; a fork bomb stops there (bwrap, cgroup; 0: no limit)")
	fs.Var(&lim.Disk, "limit-disk", "bytes (a size: 10g) each sandbox's /workspace and /tmp may hold, a filesystem of its own (bwrap, disk caps; 0: no cap)")
	fs.Int64Var(&lim.DiskInodes, "limit-disk-inodes", lim.DiskInodes, "files and directories each sandbox may hold (bwrap, disk caps; 0: one per 16 KiB of the disk cap)")
	fs.StringVar(&lim.Cgroups, "limit-cgroups", lim.Cgroups, "per-sandbox cgroups for memory, pids and CPU: auto (when the daemon is root or a systemd service with Delegate=yes; else a warning), required (refuse to start without) or off")
	fs.StringVar(&lim.DiskCaps, "limit-disk-caps", lim.DiskCaps, "per-sandbox disk caps: auto (when the daemon is root and can loop-mount; else a warning), required (refuse to start without) or off")
	fs.StringVar(&bw.OwnUIDs, "own-uids", bw.OwnUIDs, "a host uid (and gid) of its own for every sandbox, from the uid range, shared with nothing else on the host: auto (when the daemon is root, or holds CAP_SETUID, CAP_SETGID and CAP_KILL; else a warning), required (refuse to start without) or off (bwrap)")
	fs.Func("uid-range-start", fmt.Sprintf("first host uid of the range sandboxes get their own uids from; the daemon refuses a range holding a user, a group or a subordinate id range of /etc/sub[ug]id (default %d)", bw.UIDRangeStart), uint32Flag(&bw.UIDRangeStart))
	fs.Func("uid-range-size", fmt.Sprintf("how many uids the range holds: the most sandboxes that may exist at once (default %d)", bw.UIDRangeSize), uint32Flag(&bw.UIDRangeSize))
	fs.IntVar(&bw.SandboxUID, "sandbox-uid", bw.SandboxUID, "host uid of the sandboxes without one of their own (own_uids off, or made before the range) when the daemon runs as root")
	fs.IntVar(&bw.SandboxGID, "sandbox-gid", bw.SandboxGID, "host gid of the sandboxes without one of their own, when the daemon runs as root")
	fs.BoolVar(&bw.ShareHostNetwork, "bwrap-share-host-network", bw.ShareHostNetwork, "let sandboxes that ask for block_network=false share the host's network (bwrap)")
	var killGrace Duration
	fs.Var(&killGrace, "kill-grace", "time between SIGTERM and SIGKILL when a command times out (bwrap.kill_grace and sbx.kill_after)")
	af := &cfg.Airflow
	fs.StringVar(&af.APIURL, "airflow-api-url", af.APIURL, "Airflow's API server: destroy the sandboxes of DAG runs that finished (default: off)")
	fs.StringVar(&af.CredentialFile, "airflow-credential-file", af.CredentialFile, "file with a read-only Airflow API credential (a token, or user:password with --airflow-auth basic)")
	fs.StringVar(&af.Auth, "airflow-auth", af.Auth, "how the credential is sent: bearer or basic")
	fs.Var(&af.PollInterval, "airflow-poll-interval", "how often Airflow is asked for the state of the runs that own sandboxes here")
	fs.StringVar(&cfg.Metrics.Listen, "metrics-listen", cfg.Metrics.Listen, "serve Prometheus metrics on this host:port, e.g. 127.0.0.1:9464 (default: off)")
	sx := &cfg.Sbx
	fs.StringVar(&sx.Path, "sbx-path", sx.Path, "the sbx binary (sbx backend)")
	fs.StringVar(&sx.Template, "sbx-template", sx.Template, "image every sbx sandbox boots from, unless its create names another of sbx-templates")
	fs.Var(&listFlag{l: &sx.Templates}, "sbx-templates", "other images a create may name as its image, each passed to sbx create --template (repeatable, comma-separated; sbx pulls them)")
	fs.StringVar(&sx.Memory, "sbx-memory", sx.Memory, "memory of each microVM (at least 1g)")
	fs.IntVar(&sx.CPUs, "sbx-cpus", sx.CPUs, "CPUs of each microVM (0: sbx's default)")
	fs.Var(&sx.CreateTimeout, "sbx-create-timeout", "bound on sbx create (boot plus a first image pull)")
	fs.Var(&sx.ExecGrace, "sbx-exec-grace", "how long past timeout + kill grace sbx exec may run before the sandbox is destroyed")
	fs.Var(&sx.ListTimeout, "sbx-list-timeout", "bound on every sbx ls")
	fs.Var(&sx.StartTimeout, "sbx-start-timeout", "bound on starting a sandbox sbx stopped (auto-stop), before a command's own timeout starts")
	fs.Var(&sx.AutoStopGrace, "sbx-auto-stop-grace", "how long sbx keeps a sandbox running after its last session (sbx's grace, 30s by default); the daemon asks sbx ls before a command once half of it has passed")
	fs.StringVar(&sx.HostPolicy, "sbx-host-policy", sx.HostPolicy, "what `sbx policy init` was run with on this host: deny-all, allow-all or unknown")
	fs.StringVar(&sx.Marker, "sbx-marker", sx.Marker, "prefix of the sbx sandbox names this daemon makes (default: derived from the state directory)")
	fs.StringVar(&sx.KVMDevice, "sbx-kvm-device", sx.KVMDevice, "the KVM device the health check looks at")
	gv := &cfg.Gvisor
	fs.StringVar(&gv.RunscPath, "gvisor-runsc-path", gv.RunscPath, "the runsc binary (gvisor backend; empty: runsc on PATH)")
	fs.StringVar(&gv.Platform, "gvisor-platform", gv.Platform, "runsc platform: systrap (no KVM needed), ptrace, or kvm (only where KVM_CREATE_VM works)")
	fs.StringVar(&gv.SystrapFastPath, "gvisor-systrap-fast-path", gv.SystrapFastPath, "systrap's spinning hand-offs: auto (off on hosts of two CPUs or fewer), on (runsc's choice) or off")
	fs.Var(&listFlag{l: &gv.ExtraFlags}, "gvisor-extra-flag", "an extra runsc flag, such as --debug-log=/var/log/runsc/ (repeatable)")
	if err := parseFlags(fs, args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, &exitError{code: 2, err: fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "kill-grace" {
			cfg.Bwrap.KillGrace, cfg.Sbx.KillAfter, cfg.Gvisor.KillGrace = killGrace, killGrace, killGrace
		}
	})
	if err := cfg.validate(); err != nil {
		return cfg, &exitError{code: 2, err: fmt.Errorf("invalid configuration:\n%w", err)}
	}
	return cfg, nil
}

func newLogger(format, level string, w io.Writer) (hclog.Logger, error) {
	lvl := hclog.LevelFromString(level)
	if lvl == hclog.NoLevel {
		return nil, fmt.Errorf("unknown log level %q; use trace, debug, info, warn or error", level)
	}
	var json bool
	switch format {
	case "text":
	case "json":
		json = true
	default:
		return nil, fmt.Errorf("unknown log format %q; use text or json", format)
	}
	return hclog.New(&hclog.LoggerOptions{Name: "sandbox-sidecar", Level: lvl, JSONFormat: json, Output: w, TimeFormat: time.RFC3339Nano}), nil
}

// lookupGroup resolves a group name or number.
func lookupGroup(g string) (uint32, error) {
	if n, err := strconv.ParseUint(g, 10, 32); err == nil {
		return uint32(n), nil
	}
	gr, err := user.LookupGroup(g)
	if err != nil {
		return 0, fmt.Errorf("unknown group %q: %w", g, err)
	}
	n, err := strconv.ParseUint(gr.Gid, 10, 32)
	return uint32(n), err
}

func parseUIDs(l List) ([]uint32, error) {
	out := make([]uint32, 0, len(l))
	for _, s := range l {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			u, lerr := user.Lookup(s)
			if lerr != nil {
				return nil, fmt.Errorf("unknown user %q", s)
			}
			n, err = strconv.ParseUint(u.Uid, 10, 32)
			if err != nil {
				return nil, err
			}
		}
		out = append(out, uint32(n))
	}
	return out, nil
}

func parseGIDs(l List) ([]uint32, error) {
	out := make([]uint32, 0, len(l))
	for _, s := range l {
		g, err := lookupGroup(s)
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

// policyFor builds the connection policy: root and the daemon's own uid
// are admins; members of the socket group and the listed uids/groups may
// connect.
func policyFor(a AccessSection, socketGID int) (*service.Policy, error) {
	p := &service.Policy{AdminUIDs: []uint32{0, uint32(os.Geteuid())}}
	var err error
	if p.AllowUIDs, err = parseUIDs(a.AllowUIDs); err != nil {
		return nil, err
	}
	if p.AllowGIDs, err = parseGIDs(a.AllowGroups); err != nil {
		return nil, err
	}
	if socketGID >= 0 {
		p.AllowGIDs = append(p.AllowGIDs, uint32(socketGID))
	}
	admins, err := parseUIDs(a.AdminUIDs)
	if err != nil {
		return nil, err
	}
	p.AdminUIDs = append(p.AdminUIDs, admins...)
	if p.AdminGIDs, err = parseGIDs(a.AdminGroups); err != nil {
		return nil, err
	}
	return p, nil
}

func serve(cfg Config, stderr io.Writer) error {
	log, err := newLogger(cfg.Server.LogFormat, cfg.Server.LogLevel, stderr)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	// First of all, as it replaces the process: the runtime's tuning, and
	// sandbox disks mounted in a namespace of the daemon's own, so that
	// they never outlive it (see reexec).
	privateMounts := os.Geteuid() == 0 && cfg.Server.Backend == "bwrap" && cfg.Limits.DiskCaps != enforceOff && cfg.Limits.Disk > 0
	if err := reexec(privateMounts); err != nil {
		log.Warn("sandbox disks will be mounted in the host's mount namespace, where a daemon that dies leaves them mounted until it is started again", "error", err)
	}
	defer startProfiling(log)()
	fail := func(format string, args ...any) error {
		err := fmt.Errorf(format, args...)
		log.Error("cannot start", "error", err)
		notifyStatus(log, "failed to start: "+err.Error())
		return &exitError{code: 1}
	}
	node, err := resolveNodeName(cfg.Server.NodeName, os.Getenv, os.Hostname)
	if err != nil {
		return fail("%v", err)
	}

	// Under socket activation systemd made the socket: its group is the
	// socket group whatever the config says.
	activated, activatedMetrics, err := activatedListeners()
	if err != nil {
		return fail("%w", err)
	}
	socketGID, err := socketGroup(cfg.Server, activated)
	if err != nil {
		return fail("%w", err)
	}
	policy, err := policyFor(cfg.Access, socketGID)
	if err != nil {
		return fail("%w", err)
	}

	met, stopMetrics, err := startMetrics(cfg.Metrics, activatedMetrics, log)
	if err != nil {
		return fail("%w", err)
	}
	defer stopMetrics()
	d, err := openDaemon(cfg, log, daemonMode{observer: met.Observer()})
	if err != nil {
		return fail("%w", err)
	}
	defer d.close(log)
	if d.movedAside != "" {
		log.Error("THE JOURNAL WAS UNREADABLE and has been moved aside; starting with an empty journal and sweeping every sandbox of this daemon",
			"moved_to", d.movedAside)
	}
	mgr, be := d.mgr, d.be
	// Before serving: re-adopt what is still leased, destroy what lost its
	// reason to exist while the daemon was down, sweep what nobody knows.
	stopExtending := extendStartTimeout(log, "recovering sandboxes from the journal")
	rep, err := mgr.Recover(context.Background(), false)
	stopExtending()
	if err != nil {
		log.Error("recovery was incomplete; the reaper retries failed destroys", "error", err)
	}
	log.Info("recovery done", "adopted", rep.Adopted, "adopt_failed", rep.AdoptFailed, "destroyed", rep.Destroyed, "swept", rep.Swept, "failed", rep.Failed,
		"in_background", rep.Pending, "duration", rep.Duration)

	auditLog, closeAudit, err := auditLogger(cfg.Server, log, stderr)
	if err != nil {
		return fail("%w", err)
	}
	defer closeAudit()
	egressAuditor.set(auditLog, mgr.Describe)

	limits := cfg.serviceLimits()
	svc := service.New(service.Config{Manager: mgr, Policy: policy, Limits: limits, Logger: auditLog, Version: version, Node: node, Images: d.images.store})
	var lst net.Listener
	socketPath := cfg.Server.Socket
	if activated != nil {
		lst = activated
		socketPath = activated.Addr().String()
		log.Info("using the socket systemd passed (socket activation)", "socket", socketPath)
	} else {
		ul, err := ipc.Listen(ipc.ListenConfig{Path: socketPath, Mode: os.FileMode(cfg.Server.SocketMode), GID: socketGID})
		if err != nil {
			return fail("%w", err)
		}
		lst = ul
	}
	srv := ipc.NewServer(ipc.ServerConfig{Handler: met.WrapHandler(svc), Authorize: policy.Authorize, Logger: log.Named("ipc"),
		MaxFrame: int(cfg.Server.MaxFrameBytes), MaxConns: cfg.Server.MaxConnections, MaxConnsPerUID: cfg.Server.MaxConnectionsPerUID,
		FirstFrameTimeout: cfg.Server.FirstFrameTimeout.D(), MaxRequestBytes: cfg.Server.MaxRequestBytes.Bytes(),
		MaxResponseBytes: cfg.Server.MaxResponseBytes.Bytes(), MaxConnResponseBytes: cfg.Server.MaxResponseBytesPerConnection.Bytes()})
	applyMemoryBound(log, cfg)
	met.Bind(metrics.Sources{Backend: be.Name(), Version: version, PoolTarget: cfg.Lifecycle.PoolSize, JournalPath: d.journal.Path(),
		Sandboxes:   func() []lifecycle.Sandbox { return mgr.List(lifecycle.Caller{Admin: true}, "") },
		Connections: srv.Conns, Recovery: func() lifecycle.RecoveryReport { return mgr.Stats().Recovery }, Egress: d.enf.egressCounts,
		Processes: processStats(mgr, int64(cfg.Processes.LogBytes))})
	mgr.Start()
	stopRunWatch, err := startRunWatch(cfg.Airflow, mgr, log)
	if err != nil {
		return fail("%w", err)
	}
	defer stopRunWatch()

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(lst) }()
	log.Info("serving", "socket", socketPath, "backend", be.Name(), "state_dir", cfg.Server.StateDir, "version", version, "pid", os.Getpid())
	fmt.Fprintf(stderr, "sandbox-sidecar is listening on %s (backend %s). Try: sandbox-sidecar health --socket %s\n", socketPath, be.Name(), socketPath)
	stopNotify := startSystemd(log, socketPath, mgr, srv, rep)

	exit := 0
	select {
	case sig := <-sigs:
		log.Info("shutting down", "signal", sig.String(), "deadline", cfg.Server.ShutdownTimeout.D())
	case err := <-serveErr:
		log.Error("accept loop failed; shutting down", "error", err)
		exit = 1
	}
	stopNotify()
	notifyStopping(log)
	go func() {
		sig := <-sigs
		log.Warn("second signal; exiting without cleanup", "signal", sig.String())
		os.Exit(1)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownTimeout.D())
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		log.Warn("requests were still running at the shutdown deadline and were cancelled")
	}
	if err := mgr.Close(ctx); err != nil {
		log.Error("some sandboxes could not be destroyed; the next start sweeps them", "error", err)
	}
	d.close(log)
	log.Info("stopped")
	if exit != 0 {
		return &exitError{code: exit}
	}
	return nil
}

// socketGroup is the gid the socket is given (-1: the daemon's own): the
// group the socket systemd passed has, else server.socket_group, else the
// conventional "sandbox-sidecar" when it exists and the daemon may give the
// socket to it (root, or a member).
func socketGroup(s ServerSection, activated net.Listener) (int, error) {
	if activated != nil {
		if gid, ok := socketFileGID(activated); ok {
			return gid, nil
		}
	}
	if s.SocketGroup != "" {
		g, err := lookupGroup(s.SocketGroup)
		if err != nil {
			return -1, fmt.Errorf("server.socket_group: %w", err)
		}
		return int(g), nil
	}
	if g, err := lookupGroup("sandbox-sidecar"); err == nil && (os.Geteuid() == 0 || memberOf(g)) {
		return int(g), nil
	}
	return -1, nil
}

// auditLogger is where the audit trail goes: the daemon's log and, with
// server.audit_file, that file too as JSON lines; close closes the file.
func auditLogger(s ServerSection, log hclog.Logger, stderr io.Writer) (_ hclog.Logger, close func(), err error) {
	if s.AuditFile == "" {
		return log.Named("audit"), func() {}, nil
	}
	f, err := os.OpenFile(s.AuditFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("server.audit_file: %w", err)
	}
	opts := &hclog.LoggerOptions{Name: "sandbox-sidecar.audit", Level: hclog.Info, JSONFormat: s.LogFormat == "json", Output: stderr, TimeFormat: time.RFC3339Nano}
	il := hclog.NewInterceptLogger(opts)
	il.RegisterSink(hclog.NewSinkAdapter(&hclog.LoggerOptions{Name: "sandbox-sidecar.audit", Level: hclog.Info, JSONFormat: true, Output: f}))
	return il, func() { f.Close() }, nil
}

// memberOf reports whether the daemon's process has gid as its group or a
// supplementary group.
func memberOf(gid uint32) bool {
	if uint32(os.Getegid()) == gid {
		return true
	}
	groups, _ := os.Getgroups()
	for _, g := range groups {
		if uint32(g) == gid {
			return true
		}
	}
	return false
}

// sandboxInit is the executable the bwrap and gVisor backends run as every
// sandbox's init: the small static sandbox-sidecar-init installed with the
// daemon (initproc.Find), else "" (the daemon's own executable).
func sandboxInit(log hclog.Logger) string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	p := initproc.Find(exe)
	if p == "" {
		log.Info("no " + initproc.BinaryName + " installed with the daemon; the sandboxes run the daemon's own executable as their init")
	} else {
		log.Debug("the sandboxes' init", "path", p)
	}
	return p
}

// newBackend makes the configured backend; enf is what the bwrap backend
// may use to enforce [limits].
func newBackend(cfg Config, log hclog.Logger, enf *enforcement) (backend.Backend, error) {
	if enf == nil {
		enf = &enforcement{}
	}
	switch cfg.Server.Backend {
	case "bwrap":
		bc := bwrap.Config{
			Cgroups:          enf.cgroups,
			DiskCaps:         enf.diskCaps,
			Dir:              filepath.Join(cfg.Server.StateDir, "bwrap"),
			SandboxUID:       -1,
			SandboxGID:       -1,
			KillGrace:        cfg.Bwrap.KillGrace.D(),
			ShareHostNetwork: cfg.Bwrap.ShareHostNetwork,
			Limits:           cfg.Limits.sandboxLimits(),
			Logger:           log.Named("bwrap"),
			Failpoint:        failpointFromEnv(log),
			InitPath:         sandboxInit(log),
			Processes:        cfg.Processes.procLimits(),
			Code:             cfg.Code.codeConfig(),
		}
		if os.Geteuid() == 0 {
			bc.SandboxUID, bc.SandboxGID = cfg.Bwrap.SandboxUID, cfg.Bwrap.SandboxGID
		}
		if err := bwrapUIDs(&bc, cfg.Bwrap, log); err != nil {
			return nil, err
		}
		eg, err := newEgress(cfg.Egress, log)
		if err != nil {
			return nil, err
		}
		enf.egress, bc.Egress = eg, eg
		return bwrap.New(bc)
	case "sbx":
		policy, err := sbx.ParseHostPolicy(cfg.Sbx.HostPolicy)
		if err != nil {
			return nil, err
		}
		return sbx.New(sbx.Config{
			Dir: filepath.Join(cfg.Server.StateDir, "sbx"), SbxPath: cfg.Sbx.Path, Template: cfg.Sbx.Template, Templates: cfg.Sbx.Templates,
			Memory: cfg.Sbx.Memory, CPUs: cfg.Sbx.CPUs, CreateTimeout: cfg.Sbx.CreateTimeout.D(),
			KillAfter: cfg.Sbx.KillAfter.D(), ExecGrace: cfg.Sbx.ExecGrace.D(), ListTimeout: cfg.Sbx.ListTimeout.D(),
			StartTimeout: cfg.Sbx.StartTimeout.D(), AutoStopGrace: cfg.Sbx.AutoStopGrace.D(),
			HostPolicy: policy, Marker: cfg.Sbx.Marker, KVMDevice: cfg.Sbx.KVMDevice, Logger: log.Named("sbx"),
		})
	case "gvisor":
		eg, err := newEgress(cfg.Egress, log)
		if err != nil {
			return nil, err
		}
		enf.egress = eg
		return gvisor.New(gvisor.Config{
			Dir: filepath.Join(cfg.Server.StateDir, "gvisor"), RunscPath: cfg.Gvisor.RunscPath,
			Platform: cfg.Gvisor.Platform, ExtraFlags: cfg.Gvisor.ExtraFlags, KillGrace: cfg.Gvisor.KillGrace.D(),
			SystrapFastPath: cfg.Gvisor.SystrapFastPath, BufferedRestoreReads: cfg.Gvisor.BufferedRestoreReads,
			Limits: cfg.Limits.sandboxLimits(), Cgroups: enf.cgroups, Logger: log.Named("gvisor"),
			InitPath: sandboxInit(log), Egress: eg, Processes: cfg.Processes.procLimits(), Code: cfg.Code.codeConfig(),
			MaxCheckpointBytes: int64(cfg.Gvisor.MaxCheckpointBytes), Failpoint: failpointFromEnv(log),
		})
	}
	return nil, errors.New("unknown backend; this build has: bwrap, gvisor, sbx")
}

// uint32Flag parses a flag's value into *p.
func uint32Flag(p *uint32) func(string) error {
	return func(v string) error {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return fmt.Errorf("%q is not a number from 0 to %d", v, uint32(math.MaxUint32))
		}
		*p = uint32(n)
		return nil
	}
}

// bwrapUIDs decides bwrap.own_uids: a uid of its own for every sandbox
// when the daemon can give one (root, or CAP_SETUID, CAP_SETGID and
// CAP_KILL), else (auto) a warning and the shared ids, or (required) no
// start.
func bwrapUIDs(bc *bwrap.Config, bw BwrapSection, log hclog.Logger) error {
	if bw.OwnUIDs == enforceOff {
		return nil
	}
	r := hostids.Range{First: bw.UIDRangeStart, Size: bw.UIDRangeSize}
	err := bwrap.CanGiveOwnUIDs()
	switch {
	case err == nil:
		bc.UIDRange = r
		log.Info("every sandbox runs as a host uid of its own", "range", r.String())
		return nil
	case bw.OwnUIDs == enforceRequired:
		return fmt.Errorf("bwrap.own_uids = required: %w", err)
	}
	runsAs := fmt.Sprintf("uid %d", bc.SandboxUID)
	if bc.SandboxUID < 0 {
		runsAs = fmt.Sprintf("the daemon's own uid %d", os.Geteuid())
	}
	log.Warn("sandboxes do NOT get host uids of their own: every sandbox runs as "+runsAs+", which it shares with the others (and with whatever else runs as that uid)", "reason", err)
	return nil
}

// FailpointEnv arms failpoints (lifecycle.Fail*, bwrap.Fail*; see package
// internal/failpoint for the syntax): the daemon kills itself, waits or
// orders goroutines there. It exists for the crash and race tests; never
// set it in production.
const FailpointEnv = failpoint.Env

// failpointFromEnv returns the daemon's failpoints, parsed once: the
// lifecycle and the backend share them, so an "after" can order a point of
// one after a point of the other.
func failpointFromEnv(log hclog.Logger) func(string) {
	armed.once.Do(func() {
		f, err := failpoint.Parse(os.Getenv(FailpointEnv), log)
		if err != nil {
			log.Error("ignoring "+FailpointEnv, "error", err)
		}
		armed.f = f
	})
	return armed.f
}

var armed struct {
	once sync.Once
	f    func(string)
}
