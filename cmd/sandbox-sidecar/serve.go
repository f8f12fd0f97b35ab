package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
	"github.com/sandbox-sidecar/sandbox-sidecar/service"
)

// serveConfig is everything serve needs; flags fill it.
type serveConfig struct {
	Socket          string
	SocketMode      uint
	SocketGroup     string
	StateDir        string
	Backend         string
	LogFormat       string
	LogLevel        string
	AllowUIDs       listFlag
	AllowGroups     listFlag
	AdminUIDs       listFlag
	AdminGroups     listFlag
	MaxFrame        int
	MaxConns        int
	ShutdownTimeout time.Duration
	Lifecycle       lifecycle.Config
	Limits          service.Limits
	SandboxUID      int
	SandboxGID      int
	ShareHostNet    bool
	KillGrace       time.Duration
	AuditFile       string
}

func runServe(args []string, stdout, stderr io.Writer) error {
	var c serveConfig
	fs := newFlags("serve", "[flags]", stderr)
	fs.StringVar(&c.Socket, "socket", defaultSocket(), "Unix socket to listen on (env "+SocketEnv+")")
	fs.UintVar(&c.SocketMode, "socket-mode", 0o660, "mode of the socket; its directory gets the matching r-x bits")
	fs.StringVar(&c.SocketGroup, "socket-group", "", "group (name or gid) owning the socket; its members may connect (default: the daemon's group; 'sandbox-sidecar' when that group exists and the daemon runs as root)")
	fs.StringVar(&c.StateDir, "state-dir", defaultStateDir(), "state directory (one daemon per directory)")
	fs.StringVar(&c.Backend, "backend", "bwrap", "sandbox backend: bwrap")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: trace, debug, info, warn, error")
	fs.Var(&c.AllowUIDs, "allow-uid", "uids allowed to connect, besides root, the daemon's uid and the socket group (repeatable, comma-separated)")
	fs.Var(&c.AllowGroups, "allow-group", "groups (names or gids) whose members may connect, besides the socket group (repeatable)")
	fs.Var(&c.AdminUIDs, "admin-uid", "uids that may list and destroy every sandbox, besides root and the daemon's uid (repeatable)")
	fs.Var(&c.AdminGroups, "admin-group", "groups whose members may list and destroy every sandbox (repeatable)")
	fs.IntVar(&c.MaxFrame, "max-frame-bytes", ipc.DefaultMaxFrame, "largest frame accepted or sent")
	fs.IntVar(&c.MaxConns, "max-connections", ipc.DefaultMaxConns, "most connections open at once")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "how long in-flight requests may run after SIGTERM")
	fs.DurationVar(&c.Lifecycle.ConnGrace, "conn-grace", lifecycle.DefaultConnGrace, "how long a connection-bound sandbox outlives its connection")
	fs.DurationVar(&c.Lifecycle.MaxLifetime, "max-lifetime", lifecycle.DefaultMaxLifetime, "hard cap on any sandbox's life")
	fs.DurationVar(&c.Lifecycle.DefaultTTL, "default-ttl", lifecycle.DefaultTTL, "life of an owned sandbox created without ttl_s")
	fs.DurationVar(&c.Lifecycle.IdleTimeout, "idle-timeout", 30*time.Minute, "destroy a sandbox that ran nothing for this long (0: never)")
	fs.DurationVar(&c.Lifecycle.ReapInterval, "reap-interval", lifecycle.DefaultReapInterval, "how often the reaper looks for expired and abandoned sandboxes")
	fs.IntVar(&c.Lifecycle.MaxPerHost, "max-sandboxes", lifecycle.DefaultMaxPerHost, "most sandboxes on this host")
	fs.IntVar(&c.Lifecycle.MaxPerUID, "max-sandboxes-per-uid", lifecycle.DefaultMaxPerUID, "most sandboxes per client uid")
	fs.IntVar(&c.Lifecycle.MaxPerOwner, "max-sandboxes-per-owner", lifecycle.DefaultMaxPerOwner, "most sandboxes per owner (Airflow run)")
	fs.IntVar(&c.Lifecycle.MaxCmdsPerHost, "max-commands", lifecycle.DefaultMaxCmdsPerHost, "most commands running at once on this host")
	fs.IntVar(&c.Limits.MaxOutputBytes, "max-output-bytes", service.DefaultMaxOutputBytes, "cap on max_output_bytes (per stream)")
	fs.Int64Var(&c.Limits.MaxFileBytes, "max-file-bytes", service.DefaultMaxFileBytes, "cap on one read_file or write_file")
	fs.DurationVar(&c.Limits.MaxTimeout, "max-timeout", service.DefaultMaxTimeout, "cap on a command's timeout")
	fs.DurationVar(&c.Limits.DefaultTimeout, "default-timeout", service.DefaultTimeout, "a command's timeout when the request gives none")
	fs.IntVar(&c.SandboxUID, "sandbox-uid", 65534, "host uid that runs sandboxes when the daemon runs as root")
	fs.IntVar(&c.SandboxGID, "sandbox-gid", 65534, "host gid that runs sandboxes when the daemon runs as root")
	fs.BoolVar(&c.ShareHostNet, "bwrap-share-host-network", false, "let sandboxes that ask for block_network=false share the host's network (bwrap)")
	fs.DurationVar(&c.KillGrace, "kill-grace", 2*time.Second, "time between SIGTERM and SIGKILL when a command times out")
	fs.StringVar(&c.AuditFile, "audit-file", "", "also append the audit trail to this file as JSON lines")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &exitError{code: 2, err: fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	return serve(c, stderr)
}

func newLogger(c serveConfig, w io.Writer) (hclog.Logger, error) {
	level := hclog.LevelFromString(c.LogLevel)
	if level == hclog.NoLevel {
		return nil, fmt.Errorf("unknown log level %q; use trace, debug, info, warn or error", c.LogLevel)
	}
	var json bool
	switch c.LogFormat {
	case "text":
	case "json":
		json = true
	default:
		return nil, fmt.Errorf("unknown log format %q; use text or json", c.LogFormat)
	}
	return hclog.New(&hclog.LoggerOptions{Name: "sandbox-sidecar", Level: level, JSONFormat: json, Output: w, TimeFormat: time.RFC3339Nano}), nil
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

func parseUIDs(l listFlag) ([]uint32, error) {
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

func parseGIDs(l listFlag) ([]uint32, error) {
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
func policyFor(c serveConfig, socketGID int) (*service.Policy, error) {
	p := &service.Policy{AdminUIDs: []uint32{0, uint32(os.Geteuid())}}
	var err error
	if p.AllowUIDs, err = parseUIDs(c.AllowUIDs); err != nil {
		return nil, err
	}
	if p.AllowGIDs, err = parseGIDs(c.AllowGroups); err != nil {
		return nil, err
	}
	if socketGID >= 0 {
		p.AllowGIDs = append(p.AllowGIDs, uint32(socketGID))
	}
	admins, err := parseUIDs(c.AdminUIDs)
	if err != nil {
		return nil, err
	}
	p.AdminUIDs = append(p.AdminUIDs, admins...)
	if p.AdminGIDs, err = parseGIDs(c.AdminGroups); err != nil {
		return nil, err
	}
	return p, nil
}

func serve(c serveConfig, stderr io.Writer) error {
	log, err := newLogger(c, stderr)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	fail := func(format string, args ...any) error {
		err := fmt.Errorf(format, args...)
		log.Error("cannot start", "error", err)
		return &exitError{code: 1}
	}

	socketGID := -1
	switch {
	case c.SocketGroup != "":
		g, err := lookupGroup(c.SocketGroup)
		if err != nil {
			return fail("--socket-group: %w", err)
		}
		socketGID = int(g)
	case os.Geteuid() == 0:
		if g, err := lookupGroup("sandbox-sidecar"); err == nil {
			socketGID = int(g)
		}
	}
	policy, err := policyFor(c, socketGID)
	if err != nil {
		return fail("%w", err)
	}

	lock, err := lifecycle.LockStateDir(c.StateDir)
	if err != nil {
		return fail("%w", err)
	}
	defer lock.Unlock()

	be, err := newBackend(c, log)
	if err != nil {
		return fail("backend %s: %w", c.Backend, err)
	}
	journal, movedAside, err := lifecycle.OpenJournal(c.StateDir)
	if err != nil {
		return fail("%w", err)
	}
	defer journal.Close()
	if movedAside != "" {
		log.Error("THE JOURNAL WAS UNREADABLE and has been moved aside; starting with an empty journal and sweeping every sandbox of this daemon",
			"moved_to", movedAside)
	}
	mgr, err := lifecycle.New(func() lifecycle.Config {
		lc := c.Lifecycle
		lc.Backend = be
		lc.Journal = journal
		lc.Logger = log.Named("lifecycle")
		lc.Failpoint = failpointFromEnv(log)
		if lc.IdleTimeout == 0 {
			lc.IdleTimeout = -1
		}
		return lc
	}())
	if err != nil {
		return fail("%w", err)
	}
	if movedAside != "" {
		mgr.NoteJournalMovedAside(movedAside)
	}
	// Before serving: re-adopt what is still leased, destroy what lost its
	// reason to exist while the daemon was down, sweep what nobody knows.
	rep, err := mgr.Recover(context.Background(), false)
	if err != nil {
		log.Error("recovery was incomplete; the reaper retries failed destroys", "error", err)
	}
	log.Info("recovery done", "adopted", rep.Adopted, "destroyed", rep.Destroyed, "swept", rep.Swept, "failed", rep.Failed,
		"duration", rep.Duration)

	auditLog := log.Named("audit")
	if c.AuditFile != "" {
		f, err := os.OpenFile(c.AuditFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return fail("--audit-file: %w", err)
		}
		defer f.Close()
		il := hclog.NewInterceptLogger(&hclog.LoggerOptions{Name: "sandbox-sidecar.audit", Level: hclog.Info, JSONFormat: c.LogFormat == "json", Output: stderr, TimeFormat: time.RFC3339Nano})
		il.RegisterSink(hclog.NewSinkAdapter(&hclog.LoggerOptions{Name: "sandbox-sidecar.audit", Level: hclog.Info, JSONFormat: true, Output: f}))
		auditLog = il
	}

	c.Limits.MaxFrame = c.MaxFrame
	svc := service.New(service.Config{Manager: mgr, Policy: policy, Limits: c.Limits, Logger: auditLog, Version: version})
	lst, err := ipc.Listen(ipc.ListenConfig{Path: c.Socket, Mode: os.FileMode(c.SocketMode), GID: socketGID})
	if err != nil {
		return fail("%w", err)
	}
	srv := ipc.NewServer(ipc.ServerConfig{Handler: svc, Authorize: policy.Authorize, Logger: log.Named("ipc"), MaxFrame: c.MaxFrame, MaxConns: c.MaxConns})
	mgr.Start()

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(lst) }()
	log.Info("serving", "socket", c.Socket, "backend", be.Name(), "state_dir", c.StateDir, "version", version, "pid", os.Getpid())
	fmt.Fprintf(stderr, "sandbox-sidecar is listening on %s (backend %s). Try: sandbox-sidecar health --socket %s\n", c.Socket, be.Name(), c.Socket)

	exit := 0
	select {
	case sig := <-sigs:
		log.Info("shutting down", "signal", sig.String(), "deadline", c.ShutdownTimeout)
	case err := <-serveErr:
		log.Error("accept loop failed; shutting down", "error", err)
		exit = 1
	}
	go func() {
		sig := <-sigs
		log.Warn("second signal; exiting without cleanup", "signal", sig.String())
		os.Exit(1)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), c.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		log.Warn("requests were still running at the shutdown deadline and were cancelled")
	}
	if err := mgr.Close(ctx); err != nil {
		log.Error("some sandboxes could not be destroyed; the next start sweeps them", "error", err)
	}
	log.Info("stopped")
	if exit != 0 {
		return &exitError{code: exit}
	}
	return nil
}

func newBackend(c serveConfig, log hclog.Logger) (backend.Backend, error) {
	switch c.Backend {
	case "bwrap":
		cfg := bwrap.Config{
			Dir:              filepath.Join(c.StateDir, "bwrap"),
			SandboxUID:       -1,
			SandboxGID:       -1,
			KillGrace:        c.KillGrace,
			ShareHostNetwork: c.ShareHostNet,
			Logger:           log.Named("bwrap"),
		}
		if os.Geteuid() == 0 {
			cfg.SandboxUID, cfg.SandboxGID = c.SandboxUID, c.SandboxGID
			// bwrap runs as the sandbox uid and must reach each workspace to
			// bind it: let others search (not list) the state directory.
			if err := os.Chmod(c.StateDir, 0o711); err != nil {
				return nil, err
			}
		}
		return bwrap.New(cfg)
	}
	return nil, errors.New("unknown backend; this build has: bwrap")
}

// FailpointEnv names a lifecycle failpoint (lifecycle.Fail*) at which the
// daemon kills itself with SIGKILL. It exists for the crash-recovery tests;
// never set it in production.
const FailpointEnv = "SANDBOX_SIDECAR_FAILPOINT"

func failpointFromEnv(log hclog.Logger) func(string) {
	want := os.Getenv(FailpointEnv)
	if want == "" {
		return nil
	}
	log.Warn("crash failpoint armed: the daemon will SIGKILL itself", "failpoint", want)
	return func(name string) {
		if name == want {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
}
