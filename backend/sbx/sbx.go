// Package sbx is the backend that runs each sandbox as a Docker Sandboxes
// microVM, driven through the sbx CLI.
//
// It owns the directory it is given (Config.Dir): one subdirectory per
// sandbox holding spec.json (the sbx name, network and environment the
// sandbox was created with) and workspace/, which sbx mounts into the
// microVM at the same absolute path, so the guest's working directory is
// the host path of that directory. It owns the sbx sandboxes whose names
// start with its marker ("<marker>-<id>") and nothing else sbx knows about.
//
// Every sbx invocation runs through capture with a named timeout: sbx ls can
// hang, sbx create pulls images, and sbx exec may outlive its command. File
// operations run inside the guest (sbx exec -i with a small fixed script,
// the path passed as an argument, data on stdin and stdout), never on the
// host: the workspace is shared with the guest, and the daemon never follows
// a guest-made symlink on the host. It does not decide when sandboxes are
// made or removed; the lifecycle package does, and its journal, not sbx ls,
// is the record of which sandboxes should exist.
package sbx

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/registry"
	"github.com/sandbox-sidecar/sandbox-sidecar/capture"
)

// Name is the backend's name as reported to clients.
const Name = "sbx"

// Defaults for the zero fields of Config.
const (
	// DefaultTemplate is the container image a sandbox boots from: the
	// template sbx documents for its shell agent (Ubuntu, a non-root agent
	// user, bash, git, a CA store), fully qualified, because sbx does not
	// resolve a Docker Hub short name. It must have /bin/sh and GNU
	// coreutils (timeout, realpath, stat, head, mktemp).
	DefaultTemplate = "docker.io/docker/sandbox-templates:shell"
	// DefaultMemory is each microVM's memory.
	DefaultMemory = "2g"
	// DefaultCreateTimeout bounds sbx create: a first boot pulls the
	// template image, which takes minutes on a slow link.
	DefaultCreateTimeout = 600 * time.Second
	// DefaultKillAfter is how long a timed-out command has between SIGTERM
	// and SIGKILL inside the guest (GNU timeout's --kill-after).
	DefaultKillAfter = 2 * time.Second
	// DefaultExecGrace is how long past its timeout plus KillAfter an sbx
	// exec may run before the daemon kills it and destroys the sandbox.
	DefaultExecGrace = 10 * time.Second
	// DefaultListTimeout bounds every sbx ls (known to hang, sbx-releases#163).
	DefaultListTimeout = 30 * time.Second
	// DefaultStartTimeout bounds starting a microVM sbx stopped, before a
	// command or file operation (never counted in the command's budget).
	DefaultStartTimeout = 3 * time.Minute
	// DefaultAutoStopGrace is how long sbx keeps a local sandbox running
	// after its last session ends (sbx-releases#452).
	DefaultAutoStopGrace = 30 * time.Second
	// DefaultKVMDevice is the device sbx needs read-write access to.
	DefaultKVMDevice = "/dev/kvm"
)

// minMemoryBytes is sbx's smallest microVM (512 MiB since v0.43; it was
// 1 GiB).
const minMemoryBytes = 512 << 20

// Named bounds on the backend's own waits and reads.
const (
	// removeTimeout bounds sbx rm -f.
	removeTimeout = 2 * time.Minute
	// policyTimeout bounds sbx policy allow network.
	policyTimeout = 30 * time.Second
	// probeTimeout bounds the check Create runs in a new sandbox.
	probeTimeout = 2 * time.Minute
	// fileOpTimeout bounds one file operation (an sbx exec of a small script).
	fileOpTimeout = 5 * time.Minute
	// healthCacheTTL is how long a successful sbx ls vouches for the host;
	// failures are not cached, so recovery shows at once.
	healthCacheTTL = 30 * time.Second
	// outerKillGrace is SIGTERM to SIGKILL for an sbx process itself.
	outerKillGrace = time.Second
	// cliOutputBytes caps what is kept of sbx's own messages.
	cliOutputBytes = 64 << 10
	// listOutputBytes caps sbx ls --json; a larger listing is refused.
	listOutputBytes = 8 << 20
	// maxMarkerLen bounds Config.Marker, so names stay short.
	maxMarkerLen = 24
)

// HostPolicy is the global network policy the operator chose with
// "sbx policy init" on this host. The backend cannot read it reliably, so
// the operator declares it; it decides which network specs are enforceable.
type HostPolicy string

// The host policies an operator can declare.
const (
	// PolicyUnknown: the operator did not say (or chose "balanced"). Only
	// specs that state no network requirement are accepted.
	PolicyUnknown HostPolicy = "unknown"
	// PolicyDenyAll: "sbx policy init deny-all". Sandboxes have no network
	// unless a per-sandbox rule allows hosts.
	PolicyDenyAll HostPolicy = "deny-all"
	// PolicyAllowAll: "sbx policy init allow-all". Every sandbox reaches
	// everything; nothing can be blocked per sandbox.
	PolicyAllowAll HostPolicy = "allow-all"
)

// ParseHostPolicy turns a flag value into a HostPolicy; "" is PolicyUnknown.
func ParseHostPolicy(s string) (HostPolicy, error) {
	switch p := HostPolicy(strings.ToLower(strings.TrimSpace(s))); p {
	case "", PolicyUnknown:
		return PolicyUnknown, nil
	case PolicyDenyAll, PolicyAllowAll:
		return p, nil
	}
	return "", fmt.Errorf("sbx backend: host network policy %q is not one of unknown, deny-all, allow-all; declare what you ran \"sbx policy init\" with (declare unknown for balanced)", s)
}

// Config configures a Backend.
type Config struct {
	// Dir is the backend's state directory (the caller passes <state>/sbx);
	// sandbox <id> lives in Dir/<id>. Created mode 0700.
	Dir string
	// SbxPath is the sbx binary: a path, or a bare name looked up on PATH;
	// empty means "sbx" on PATH.
	SbxPath string
	// Env is added to the environment every sbx process gets
	// ("NAME=value", overriding what sbxEnv took from the daemon's). sbx
	// never gets the daemon's whole environment (see sbxEnv).
	Env []string
	// Template is the image sandboxes boot from (default DefaultTemplate).
	Template string
	// Templates are the other images a create may name (its image is
	// passed to sbx create --template as it is; sbx pulls it): only
	// these, so a client cannot make the host pull what it likes.
	Templates []string
	// Memory is each microVM's memory in sbx's notation: "2g", "1536m"
	// (default DefaultMemory). Less than 512 MiB is refused.
	Memory string
	// CPUs is each microVM's CPU count; 0 leaves sbx's default.
	CPUs int
	// CreateTimeout bounds sbx create (default DefaultCreateTimeout).
	CreateTimeout time.Duration
	// KillAfter is the in-guest timeout's --kill-after (default
	// DefaultKillAfter).
	KillAfter time.Duration
	// ExecGrace is the time beyond a command's Timeout+KillAfter after which
	// the daemon kills sbx exec and destroys the sandbox (default
	// DefaultExecGrace).
	ExecGrace time.Duration
	// ListTimeout bounds every sbx ls (default DefaultListTimeout).
	ListTimeout time.Duration
	// StartTimeout bounds starting a sandbox sbx stopped (default
	// DefaultStartTimeout); a command's own budget starts after it.
	StartTimeout time.Duration
	// AutoStopGrace is sbx's grace before it stops a sandbox without a
	// session (default DefaultAutoStopGrace, sbx's own). For half of it
	// after its last sbx call the backend takes a sandbox to be running;
	// after that it asks sbx ls before a command, and starts it if it
	// stopped. A value above sbx's grace would let a boot count against a
	// command's budget again; a small one (1ms) asks before every command.
	AutoStopGrace time.Duration
	// HostPolicy is the network policy the operator initialised sbx with.
	HostPolicy HostPolicy
	// Marker starts every sbx sandbox name this backend makes, so that
	// List and sweeps find only its own. Lowercase letters and digits, at
	// most 24; empty derives one from Dir (see DefaultMarker), which is
	// stable across restarts and distinct for every state directory.
	Marker string
	// KVMDevice is the device Health checks (default DefaultKVMDevice).
	KVMDevice string
	// Logger receives the backend's logs; nil discards them.
	Logger hclog.Logger
}

// Backend implements backend.Backend with sbx microVMs.
type Backend struct {
	cfg         Config
	sbx         string
	memory      string // normalised for sbx --memory
	memoryBytes int64
	log         hclog.Logger

	boxes *registry.Registry[*sandbox] // known sandboxes, loaded lazily from Dir

	env     []string   // every sbx process's whole environment (sbxEnv)
	version sbxVersion // what sbx version --json said at start
	noInput bool       // sbx takes the global --no-input: pass it on every call

	healthMu     sync.Mutex
	healthyUntil time.Time
}

var _ backend.Backend = (*Backend)(nil)

var validMarker = regexp.MustCompile(`^[a-z0-9]{1,24}$`)

// DefaultMarker returns the marker derived from a state directory: "sc"
// and the first 10 hex digits of the SHA-256 of its absolute path.
func DefaultMarker(dir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(dir)))
	return "sc" + hex.EncodeToString(sum[:5])
}

// New validates cfg, creates cfg.Dir, finds sbx and asks its version (sbx
// version --json, within 30 s): an sbx older than MinVersion is refused.
// It starts nothing; Health asks sbx whether it answers.
func New(cfg Config) (*Backend, error) {
	if cfg.Dir == "" || !filepath.IsAbs(cfg.Dir) {
		return nil, fmt.Errorf("sbx backend: Dir %q must be an absolute path to the state directory", cfg.Dir)
	}
	cfg.Dir = filepath.Clean(cfg.Dir)
	if cfg.Template == "" {
		cfg.Template = DefaultTemplate
	}
	for _, t := range append([]string{cfg.Template}, cfg.Templates...) {
		if err := checkTemplate(t); err != nil {
			return nil, err
		}
	}
	if cfg.Memory == "" {
		cfg.Memory = DefaultMemory
	}
	memory, bytes, err := parseMemory(cfg.Memory)
	if err != nil {
		return nil, err
	}
	if bytes < minMemoryBytes {
		return nil, fmt.Errorf("sbx backend: memory %q is less than 512 MiB, the smallest microVM sbx runs; use at least 512m (the default is %s)", cfg.Memory, DefaultMemory)
	}
	if cfg.CPUs < 0 {
		return nil, fmt.Errorf("sbx backend: CPUs %d must not be negative; use 0 for sbx's default", cfg.CPUs)
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"CreateTimeout", &cfg.CreateTimeout, DefaultCreateTimeout},
		{"KillAfter", &cfg.KillAfter, DefaultKillAfter},
		{"ExecGrace", &cfg.ExecGrace, DefaultExecGrace},
		{"ListTimeout", &cfg.ListTimeout, DefaultListTimeout},
		{"StartTimeout", &cfg.StartTimeout, DefaultStartTimeout},
		{"AutoStopGrace", &cfg.AutoStopGrace, DefaultAutoStopGrace},
	} {
		if *d.v < 0 {
			return nil, fmt.Errorf("sbx backend: %s (%v) must not be negative; use 0 for the default (%v)", d.name, *d.v, d.def)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if cfg.HostPolicy, err = ParseHostPolicy(string(cfg.HostPolicy)); err != nil {
		return nil, err
	}
	if cfg.Marker == "" {
		cfg.Marker = DefaultMarker(cfg.Dir)
	}
	if !validMarker.MatchString(cfg.Marker) {
		return nil, fmt.Errorf("sbx backend: marker %q must be 1 to %d lowercase letters or digits (no '-', so names split unambiguously)", cfg.Marker, maxMarkerLen)
	}
	for _, kv := range cfg.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.IndexByte(kv, 0) >= 0 {
			return nil, fmt.Errorf("sbx backend: Env entry %q is not NAME=value", backend.ShortName(k))
		}
	}
	if cfg.KVMDevice == "" {
		cfg.KVMDevice = DefaultKVMDevice
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}

	bin, err := findSbx(cfg.SbxPath)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("sbx backend: cannot create state directory %s; check its parent's permissions: %w", cfg.Dir, err)
	}
	if err := os.Chmod(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("sbx backend: cannot set mode 0700 on %s: %w", cfg.Dir, err)
	}
	b := &Backend{
		cfg:         cfg,
		sbx:         bin,
		memory:      memory,
		memoryBytes: bytes,
		log:         cfg.Logger.Named(Name),
		env:         sbxEnv(os.Environ(), cfg.Env),
	}
	b.boxes = registry.New(b.registryHooks())
	if err := b.checkVersion(context.Background()); err != nil {
		return nil, err
	}
	b.log.Info("sbx found", "path", bin, "version", b.version, "no_input", b.noInput)
	return b, nil
}

const installHint = "install Docker Sandboxes (see docs/sbx.md) or fix the sbx path"

// findSbx resolves the configured binary the way a shell does: a name
// without a '/' (the default "sbx", or empty) is looked up on PATH, and
// anything else is a path to an executable file.
func findSbx(configured string) (string, error) {
	if configured == "" {
		configured = "sbx"
	}
	if !strings.ContainsRune(configured, '/') {
		p, err := exec.LookPath(configured)
		if err != nil {
			return "", fmt.Errorf("%w: %s is not on PATH (%v); %s", backend.ErrUnavailable, configured, err, installHint)
		}
		return p, nil
	}
	if err := checkExecutable(configured); err != nil {
		return "", err
	}
	return configured, nil
}

func checkExecutable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("%w: sbx binary %s: %v; %s", backend.ErrUnavailable, p, err, installHint)
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%w: %s is not an executable file; %s", backend.ErrUnavailable, p, installHint)
	}
	return nil
}

var memoryPattern = regexp.MustCompile(`^([0-9]{1,12})([kmgt]?)(?:i?b)?$`)

// parseMemory reads a size in sbx's binary units ("2g", "1536m", "2GiB")
// and returns it as sbx is given it ("2g") and in bytes.
func parseMemory(s string) (string, int64, error) {
	m := memoryPattern.FindStringSubmatch(strings.ToLower(strings.TrimSpace(s)))
	if m == nil {
		return "", 0, fmt.Errorf("sbx backend: memory %q is not a size such as 2g or 1536m (binary units: k, m, g, t)", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("sbx backend: memory %q: %v", s, err)
	}
	shift := map[string]uint{"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m[2]]
	if n > (1<<62)>>shift {
		return "", 0, fmt.Errorf("sbx backend: memory %q is too large", s)
	}
	unit := m[2]
	if unit == "" {
		unit = "b"
	}
	return m[1] + unit, n << shift, nil
}

// Name reports "sbx".
func (b *Backend) Name() string { return Name }

// MaxCreateDuration is the longest a Create can take when its context does
// not end first: the governance check, sbx create, the per-sandbox network
// rule, the read-back of the policy, a start of the new microVM should sbx
// have stopped it already, and the first check in it. A caller bounding Create with a deadline should
// allow at least this much, or slow first boots are cut short (and cleaned
// up). The cleanup of a failed Create runs detached, under its own deadline.
func (b *Backend) MaxCreateDuration() time.Duration {
	return 2*policyTimeout + b.cfg.CreateTimeout + networkCheckTimeout + b.cfg.ListTimeout + b.cfg.StartTimeout + probeTimeout
}

// Health checks that the sbx binary is there, that the daemon's user may use
// the KVM device, and, at most once per healthCacheTTL while it keeps
// succeeding, that sbx ls answers within ListTimeout.
func (b *Backend) Health(ctx context.Context) error {
	if err := checkExecutable(b.sbx); err != nil {
		return err
	}
	if _, err := os.Stat(b.cfg.Dir); err != nil {
		return fmt.Errorf("%w: state directory %s: %v; restart the daemon to recreate it", backend.ErrUnavailable, b.cfg.Dir, err)
	}
	if err := checkKVM(b.cfg.KVMDevice); err != nil {
		return err
	}

	b.healthMu.Lock()
	defer b.healthMu.Unlock()
	if time.Now().Before(b.healthyUntil) {
		return nil
	}
	if _, err := b.listSbx(ctx); err != nil {
		return err
	}
	b.healthyUntil = time.Now().Add(healthCacheTTL)
	return nil
}

// checkKVM reports whether the daemon's user may open dev read-write, in
// words an operator can act on.
func checkKVM(dev string) error {
	err := unix.Access(dev, unix.R_OK|unix.W_OK)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %s does not exist: this host has no KVM, which sbx needs to run microVMs; enable virtualisation (VT-x/AMD-V, or nested virtualisation on a cloud VM) and load kvm_intel or kvm_amd, or use the bwrap backend", backend.ErrUnavailable, dev)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM), errors.Is(err, unix.EROFS):
		return fmt.Errorf("%w: %s is not readable and writable by the daemon's user (uid %d); add that user to the device's group (usermod -aG kvm <daemon user>, or SupplementaryGroups=kvm in the systemd unit) and restart the daemon; never give the Airflow worker's user KVM access", backend.ErrUnavailable, dev, os.Geteuid())
	}
	return fmt.Errorf("%w: cannot check %s: %v", backend.ErrUnavailable, dev, err)
}

// sbxCommand returns an exec.Cmd for sbx with the environment sbxEnv made,
// run from /.
func (b *Backend) sbxCommand(args []string) *exec.Cmd {
	cmd := exec.Command(b.sbx, args...)
	cmd.Env = b.env
	cmd.Dir = "/"
	return cmd
}

// defaultPATH is sbx's PATH when the daemon has none.
const defaultPATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// sbxPassedVars are the daemon's variables sbx gets as they are: the
// proxies it falls back on for pulls and for its sandboxes' egress, and
// TMPDIR. sbxPassedPrefixes name its own settings variables
// (DOCKER_SANDBOXES_PROXY, SANDBOXES_STORAGE_ROOT, SANDBOXD_LOG_LEVEL, ...).
var (
	sbxPassedVars = []string{"TMPDIR", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
		"http_proxy", "https_proxy", "no_proxy", "all_proxy"}
	sbxPassedPrefixes = []string{"DOCKER_SANDBOXES_", "SANDBOXES_", "SANDBOXD_"}
)

// sbxEnv is the whole environment of every sbx process: PATH, HOME (where
// sbx keeps its login and state), sbx's own settings variables and the
// proxies, from the daemon's environment parent, then extra (Config.Env),
// and nothing else. sbx forwards its caller's SSH agent into every sandbox
// (the ssh.agentForwardingEnabled setting, on by default), and an
// operator's credentials in the daemon's environment have no business in
// a microVM: SSH_AUTH_SOCK and everything not listed here stay out.
func sbxEnv(parent, extra []string) []string {
	vars := map[string]string{}
	for _, kv := range parent {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		pass := k == "PATH" || k == "HOME" || slices.Contains(sbxPassedVars, k)
		for _, p := range sbxPassedPrefixes {
			pass = pass || strings.HasPrefix(k, p)
		}
		if pass {
			vars[k] = v
		}
	}
	if vars["PATH"] == "" {
		vars["PATH"] = defaultPATH
	}
	if vars["HOME"] == "" {
		if u, err := user.Current(); err == nil && u.HomeDir != "" {
			vars["HOME"] = u.HomeDir
		}
	}
	for _, kv := range extra {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	env := make([]string, 0, len(vars))
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		env = append(env, k+"="+vars[k])
	}
	return env
}

// runSbx runs sbx with args to completion within limit (and ctx), keeping
// at most maxOutput bytes of each stream. err is set only when sbx could
// not be started or ctx ended; a non-zero exit or a timeout is in the
// Result.
func (b *Backend) runSbx(ctx context.Context, limit time.Duration, maxOutput int, stdin []byte, args ...string) (capture.Result, error) {
	return b.runSbxOutput(ctx, limit, maxOutput, stdin, nil, args...)
}

// runSbxOutput is runSbx that also hands output to out as it is read.
// The global --no-input goes first when sbx takes it, so a command that
// would prompt (a sign-in, a policy preset) fails at once instead.
func (b *Backend) runSbxOutput(ctx context.Context, limit time.Duration, maxOutput int, stdin []byte, out capture.OutputFunc, args ...string) (capture.Result, error) {
	if b.noInput {
		args = append([]string{"--no-input"}, args...)
	}
	return capture.Run(ctx, b.sbxCommand(args), capture.Options{
		Timeout:        limit,
		KillGrace:      outerKillGrace,
		MaxOutputBytes: maxOutput,
		Stdin:          stdin,
		Output:         out,
	})
}

// failure describes an sbx invocation that did not succeed, for an error
// message: its own words when it printed some, else its status.
func failure(res capture.Result, err error, limit time.Duration) string {
	switch {
	case err != nil:
		return err.Error()
	case res.TimedOut:
		return fmt.Sprintf("no answer within %v", limit)
	}
	msg := firstLine(res.Stderr)
	if msg == "" {
		msg = firstLine(res.Stdout)
	}
	if msg == "" {
		return fmt.Sprintf("exit status %d", res.ExitCode)
	}
	return fmt.Sprintf("exit status %d: %s", res.ExitCode, msg)
}

// firstLine returns the first non-empty line of b, cut to a readable length.
func firstLine(b []byte) string {
	for _, line := range strings.Split(string(b[:min(len(b), 4096)]), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			if len(line) > 300 {
				line = line[:300] + "..."
			}
			return strings.ToValidUTF8(line, "?")
		}
	}
	return ""
}

// checkTemplate refuses a template sbx cannot be given: not an image
// reference, or a reference without its registry's domain (a Docker Hub
// short name such as python:3.12-slim), which sbx does not resolve.
func checkTemplate(t string) error {
	if t == "" || strings.HasPrefix(t, "-") || strings.ContainsAny(t, " \t\n\x00") || t == backend.HostImage {
		return fmt.Errorf("sbx backend: template image %q is not an image reference", t)
	}
	if !hasRegistryDomain(t) {
		return fmt.Errorf("sbx backend: template image %q is a short name, and sbx does not resolve short names to Docker Hub; write it fully qualified, with its registry: docker.io/library/python:3.12-slim for an official image, docker.io/%s for another of Docker Hub's, or %s (the default)", t, shortExample(t), DefaultTemplate)
	}
	return nil
}

// hasRegistryDomain reports whether image reference ref names its registry:
// the part before the first '/' holds a '.' or a ':', or is localhost (the
// rule Docker's reference grammar uses to tell a registry from a path).
func hasRegistryDomain(ref string) bool {
	first, _, ok := strings.Cut(ref, "/")
	return ok && (strings.ContainsAny(first, ".:") || first == "localhost")
}

// shortExample is t with the path Docker Hub would give it.
func shortExample(t string) string {
	if !strings.Contains(t, "/") {
		return "library/" + t
	}
	return t
}

// templateFor is the sbx template of a create on image im: the default
// template for the host image (an sbx sandbox never runs on the host's
// /usr), else im's name when the operator allows it ([sbx] templates).
func (b *Backend) templateFor(im backend.Image) (string, error) {
	if im.IsHost() || im.Name == b.cfg.Template {
		return b.cfg.Template, nil
	}
	if slices.Contains(b.cfg.Templates, im.Name) {
		return im.Name, nil
	}
	return "", fmt.Errorf("%w: the sbx backend boots only the templates the operator allows ([sbx] template %q and templates %v), not %s", backend.ErrSpecUnenforceable, b.cfg.Template, b.cfg.Templates, backend.ShortName(im.Name))
}

// Images lists the templates a create may name, as images (the daemon's
// image list for this backend: sbx pulls them itself).
func (b *Backend) Images() []backend.Image {
	out := []backend.Image{{Name: b.cfg.Template, Source: "sbx template (the default)"}}
	for _, t := range b.cfg.Templates {
		if t != b.cfg.Template {
			out = append(out, backend.Image{Name: t, Source: "sbx template"})
		}
	}
	return out
}
