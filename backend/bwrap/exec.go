package bwrap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/egress"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/seccomp"
)

// What the guest sees.
const (
	guestWorkspace = hostfs.GuestWorkspace
	guestTmp       = hostfs.GuestTmp
	guestUID       = 1000
	guestGID       = 1000
	guestHostname  = "sandbox"
	guestPath      = "/usr/local/bin:/usr/bin:/bin"
)

// outerKillGrace is SIGTERM to SIGKILL for a command's own bwrap.
const outerKillGrace = time.Second

// Files bound into every sandbox's /etc, read-only, when the host has them:
// what an interpreter and a TLS client need, nothing that names the host.
var etcFiles = []string{
	"/etc/alternatives",
	"/etc/ld.so.cache",
	"/etc/localtime",
	"/etc/ssl/certs",
	"/etc/ca-certificates",
	// Debian's matplotlib reads its defaults only from here (it moved
	// the file out of mpl-data): without it, importing matplotlib.pyplot
	// fails ("Could not find matplotlibrc file").
	"/etc/matplotlibrc",
}

// Files added when the sandbox shares the host's network, so names resolve.
var etcNetworkFiles = []string{
	"/etc/resolv.conf",
	"/etc/hosts",
	"/etc/nsswitch.conf",
	"/etc/host.conf",
	"/etc/gai.conf",
}

var (
	etcPasswd = "root:x:0:0:root:/root:/usr/sbin/nologin\n" +
		"sandbox:x:1000:1000:sandbox:/workspace:/bin/sh\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
	etcGroup = "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n"
	etcHosts = "127.0.0.1\tlocalhost\n127.0.1.1\tsandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n"
)

// Exec runs one command in the sandbox and returns its bounded output.
//
// The command runs as uid 1000 ("sandbox") in /workspace (or req.Cwd),
// exec'd directly by the sandbox's init (a command string under the
// sandbox's /bin/sh -c), with req.Timeout (rounded up to whole
// milliseconds, at least one) and KillGrace kept by init itself: SIGTERM
// to its process group at the budget, SIGKILL to every process of the
// sandbox once the grace is spent too (exit 124, or 137, and TimedOut).
// The daemon has it killed if it outlives that by ExecGrace. Its environment is PATH, HOME, LANG, then the sandbox's Env,
// then req.Env, and nothing else. A zero req.MaxOutputBytes keeps
// capture.DefaultMaxOutputBytes of each stream.
//
// The sandbox's init starts it (see initproc.go), and kills everything it
// started when it ends. Init runs one command at a time and, as the
// backend contract allows, a second Exec while one runs is refused with
// backend.ErrUnavailable (the lifecycle layer never sends one).
//
// A command stopped because Destroy ran, or because the sandbox's init
// died, returns SandboxTerminated and no error; the next Exec after an init
// died returns an error wrapping backend.ErrNotFound. One stopped because
// ctx ended returns the partial result and an error wrapping ctx.Err().
func (b *Backend) Exec(ctx context.Context, id string, req backend.ExecRequest) (backend.ExecResult, error) {
	sb, err := b.lookup(id)
	if err != nil {
		return backend.ExecResult{}, err
	}
	argv, cwd, err := backend.CheckExecRequest(req, guestWorkspace)
	if err != nil {
		return backend.ExecResult{}, err
	}
	if req.Command != "" && sb.image != nil && !sb.image.Shell {
		return backend.ExecResult{}, fmt.Errorf("%w: sandbox %s runs on image %s, which has no %s to run a command string; give the command as an argv", backend.ErrNoShell, id, backend.ShortName(sb.image.Name), backend.ShellPath)
	}
	env, err := backend.MergeEnv(sb.baseEnv(), sb.env, req.Env)
	if err != nil {
		return backend.ExecResult{}, err
	}
	applied := backend.GuestTimeout(req.Timeout)

	opCtx, done, err := sb.begin(ctx)
	if err != nil {
		return backend.ExecResult{}, err
	}
	defer done()

	ip, err := b.acquireInit(opCtx, sb, time.Now().Add(applied+b.cfg.KillGrace+b.cfg.ExecGrace))
	switch {
	case err == nil:
		defer sb.releaseInit(ctx, ip)
		return b.execInit(ctx, opCtx, sb, ip, req, argv, env, cwd, applied)
	case errors.Is(err, errInitBusy):
		// The contract: the caller never overlaps commands in one sandbox.
		return backend.ExecResult{}, fmt.Errorf("%w: sandbox %s is already running a command, and runs one at a time; wait for it to finish", backend.ErrUnavailable, id)
	case errors.Is(err, errInitDied), errors.Is(context.Cause(opCtx), errSandboxDestroyed):
		b.log.With("sandbox", id).Info("command not run: the sandbox is terminated", "reason", err)
		return backend.ExecResult{ExitCode: backend.ExitKilled, SandboxTerminated: true, AppliedTimeout: applied}, nil
	case ctx.Err() != nil:
		return backend.ExecResult{AppliedTimeout: applied}, fmt.Errorf("command in sandbox %s was not run because the request ended: %w", id, ctx.Err())
	}
	return backend.ExecResult{}, err
}

// InlineExec implements backend.InlineExecer: Exec releases the
// connection before each wait of its own: for init's lock (acquireInit,
// releaseInit) or its start, for room on init's socket (sendKind), for a
// command that outlasts the hot wait, and to terminate a sandbox
// (execInit).
func (b *Backend) InlineExec() {}

var _ backend.InlineExecer = (*Backend)(nil)

// baseEnv is every command's environment before the sandbox's and the
// request's.
var baseEnv = map[string]string{"PATH": guestPath, "HOME": guestWorkspace, "LANG": "C.UTF-8"}

// mergeEnv is the command's environment: baseEnv, then the sandbox's, then
// the request's.
func mergeEnv(sandboxEnv, requestEnv map[string]string) ([]string, error) {
	return backend.MergeEnv(baseEnv, sandboxEnv, requestEnv)
}

// setenvOptions turns NAME=value entries into bwrap's --setenv options.
func setenvOptions(env []string) []string {
	opts := make([]string, 0, 3*len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		opts = append(opts, "--setenv", k, v)
	}
	return opts
}

// bwrapOptions is everything bwrap is told about the sandbox: the isolation
// (every namespace unshared, no capabilities, a read-only /usr, synthetic
// /etc files, the sandbox's /workspace and /tmp), env (as --setenv options)
// and the working directory. They travel through --args (a memfd) rather
// than the command line, so environment values never show in the host's
// process list. The memfds with /etc/passwd, /etc/group and /etc/hosts are
// fds firstDataFD+1, +2 and +3 (dataFiles' order). The command is pid 1 of
// the sandbox's PID namespace, as its init must be.
func (b *Backend) bwrapOptions(sb *sandbox, env []string, cwd string, firstDataFD int) []string {
	o := []string{"--unshare-all"}
	if sb.network == networkHost || sb.network == networkAllowlist {
		// allowlist: bwrap starts in the namespace the daemon made.
		o = append(o, "--share-net")
	}
	o = append(o, "--as-pid-1")
	o = append(o,
		// No --die-with-parent: it ties the sandbox to bwrap's parent,
		// the daemon, and a sandbox outlives its daemon (reattach.go).
		// Init ties itself to bwrap instead (a parent-death signal of its
		// own), so killing bwrap still ends the sandbox.
		"--new-session", "--cap-drop", "ALL",
		"--uid", strconv.Itoa(guestUID), "--gid", strconv.Itoa(guestGID),
		"--hostname", guestHostname,
		"--clearenv") // before the --setenv options, which it would undo
	o = append(o, env...)
	if sb.image != nil {
		// The image's root, and of the host's /etc only passwd, group
		// and hosts, the daemon's own.
		o = append(o, sb.imageOpts...)
		o = append(o,
			"--perms", "0644", "--ro-bind-data", strconv.Itoa(firstDataFD+1), "/etc/passwd",
			"--perms", "0644", "--ro-bind-data", strconv.Itoa(firstDataFD+2), "/etc/group",
			"--perms", "0644", "--ro-bind-data", strconv.Itoa(firstDataFD+3), "/etc/hosts")
		if sb.network == networkAllowlist {
			// The egress resolver (the image's own resolv.conf is left
			// out); its nsswitch.conf and gai.conf are the image's.
			o = append(o, "--perms", "0644", "--ro-bind-data", strconv.Itoa(firstDataFD+5), "/etc/resolv.conf")
		}
		return append(o, b.guestMounts(sb, cwd, firstDataFD)...)
	}
	if b.testRoot != "" {
		o = append(o, "--bind", b.testRoot, "/")
	} else {
		o = append(o, "--ro-bind", "/usr", "/usr")
		o = append(o, b.rootLinks...)
	}
	o = append(o, "--perms", "0755", "--dir", "/etc")
	for _, f := range etcFiles {
		o = append(o, "--ro-bind-try", f, f)
	}
	o = append(o,
		"--perms", "0644", "--ro-bind-data", strconv.Itoa(firstDataFD+1), "/etc/passwd",
		"--perms", "0644", "--ro-bind-data", strconv.Itoa(firstDataFD+2), "/etc/group")
	if sb.network == networkHost {
		for _, f := range etcNetworkFiles {
			o = append(o, "--ro-bind-try", f, f)
		}
	} else {
		o = append(o, "--perms", "0644", "--ro-bind-data", strconv.Itoa(firstDataFD+3), "/etc/hosts")
	}
	if sb.network == networkAllowlist {
		// The egress resolver, the last of the data files.
		o = append(o, "--perms", "0644", "--ro-bind-data", strconv.Itoa(firstDataFD+5), "/etc/resolv.conf")
		o = append(o, "--ro-bind-try", "/etc/nsswitch.conf", "/etc/nsswitch.conf", "--ro-bind-try", "/etc/gai.conf", "/etc/gai.conf")
	}
	return append(o, b.guestMounts(sb, cwd, firstDataFD)...)
}

// guestMounts are the options every root shares: the seccomp filter,
// /proc, /dev, the sandbox's /workspace and /tmp, the working directory.
func (b *Backend) guestMounts(sb *sandbox, cwd string, firstDataFD int) []string {
	// The system-call filter, last of the data files: bwrap loads it just
	// before it execs the sandbox's first process, so it confines init and
	// everything init starts.
	return []string{"--seccomp", strconv.Itoa(firstDataFD + 4),
		"--proc", "/proc",
		"--dev", "/dev",
		"--bind", sb.workDir(), guestWorkspace,
		"--bind", sb.tmpDir(), guestTmp,
		"--chdir", cwd}
}

// dataFiles returns the memfds bwrap reads: its options, then the synthetic
// /etc/passwd, /etc/group and /etc/hosts, then the seccomp filter
// (seccomp.Guest(), sealed), then the egress path's /etc/resolv.conf, in
// that order. The caller closes them.
func dataFiles(opts []string) (files []*os.File, err error) {
	defer func() {
		if err != nil {
			closeFiles(files)
		}
	}()
	var args strings.Builder
	for _, o := range opts {
		args.WriteString(o)
		args.WriteByte(0)
	}
	for _, d := range []struct{ name, data string }{
		{"bwrap-args", args.String()},
		{"etc-passwd", etcPasswd},
		{"etc-group", etcGroup},
		{"etc-hosts", etcHosts},
	} {
		f, err := memFile(d.name, d.data)
		if err != nil {
			return files, err
		}
		files = append(files, f)
	}
	filter, err := seccomp.Memfd(seccomp.Guest())
	if err != nil {
		return files, err
	}
	files = append(files, filter)
	resolv, err := memFile("etc-resolv-conf", egress.ResolvConf())
	if err != nil {
		return files, err
	}
	return append(files, resolv), nil
}

// memFile returns an anonymous in-memory file holding data, positioned at
// its start. It is close-on-exec; exec.Cmd.ExtraFiles clears that for bwrap.
func memFile(name, data string) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.WriteString(data); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(0, 0); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		if f != nil {
			_ = f.Close()
		}
	}
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b[:min(len(b), 512)]), "\n")
	return s
}
