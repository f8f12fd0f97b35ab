// Package backend defines what a sandbox implementation must do and the
// errors it reports. It owns no sandboxes itself: the lifecycle package
// decides when to create and destroy them, and one subpackage per
// implementation (bwrap, later sbx and gvisor) does the work.
//
// A backend never imports ipc or lifecycle. It may keep per-sandbox state on
// disk under the directory it was given, but the lifecycle journal, not the
// backend, is the record of which sandboxes should exist.
package backend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/capture"
)

// Backend is the whole story of a sandbox: make it, run things in it, move
// files in and out, and remove it. Every method must honour ctx, must be safe
// for concurrent use on different sandboxes, and must bound what it reads
// from the guest.
type Backend interface {
	// Name is the short, stable name reported to clients ("bwrap", "sbx").
	Name() string

	// Create provisions sandbox id. The id is chosen by the caller (so it can
	// be journaled before anything exists) and satisfies ValidID. A spec the
	// backend cannot enforce returns an error wrapping ErrSpecUnenforceable
	// and creates nothing. A failure part-way removes whatever was made.
	Create(ctx context.Context, id string, spec Spec) (Info, error)

	// Exec runs one command to completion (or timeout) and returns its
	// bounded output. A sandbox that does not exist returns ErrNotFound.
	// Calls for one sandbox do not overlap: the caller (lifecycle, which
	// owns command concurrency) sends the next only once the previous has
	// returned, and a backend may refuse an overlapping one with
	// ErrUnavailable. File operations may overlap a command.
	Exec(ctx context.Context, id string, req ExecRequest) (ExecResult, error)

	// ReadFile returns the file at path (see ResolvePath for what a path
	// may be). A file larger than maxBytes returns *FileTooLargeError.
	ReadFile(ctx context.Context, id, path string, maxBytes int64) ([]byte, error)

	// WriteFile writes data to path, creating parent directories.
	WriteFile(ctx context.Context, id, path string, data []byte, mode os.FileMode) error

	// ListDirectory lists the entries of the directory at path, sorted by name.
	ListDirectory(ctx context.Context, id, path string, maxEntries int) ([]DirEntry, error)

	// Destroy removes every process and every byte of sandbox id. It is
	// idempotent: destroying an unknown or already-removed sandbox succeeds.
	Destroy(ctx context.Context, id string) error

	// Adopt re-establishes, after the daemon restarted, what sandbox id
	// needs to serve again: its files reachable (a disk of its own mounted,
	// and attached nowhere else), its resource controls (a cgroup) and a
	// clean start for its long-lived processes (an init, started on first
	// use). Recovery calls it for every journaled sandbox it keeps, before
	// the daemon serves, and again, in the background, for one it had to
	// quarantine. It is idempotent: adopting an adopted sandbox succeeds.
	// ErrNotFound: the sandbox is gone. ErrHeldElsewhere: its data is still
	// held outside this daemon (a dead daemon's mount); nothing was
	// touched, and a later call may succeed. Any other error: it cannot
	// serve now, with the reason.
	Adopt(ctx context.Context, id string) error

	// List returns the ids of every sandbox this backend instance can find
	// that carries its marker, whether or not the caller knows about it.
	// Recovery uses it to sweep orphans.
	List(ctx context.Context) ([]string, error)

	// Health reports whether the backend can create sandboxes right now.
	// A nil error means healthy.
	Health(ctx context.Context) error
}

// Optional capabilities: a backend implements those that apply to it, and
// the daemon asks for them with a type assertion.

// SlowCreator is implemented by backends whose Create may need longer than
// lifecycle's default create budget (a microVM's first boot pulls an
// image); the daemon then gives creates MaxCreateDuration.
type SlowCreator interface {
	MaxCreateDuration() time.Duration
}

// Closer is implemented by backends that hold something on the host for
// live sandboxes (processes, cgroups, mounts). The daemon calls Close once
// at shutdown, after destroying what it destroys: the sandboxes that stay
// are re-adopted by the next start from their files.
type Closer interface {
	Close() error
}

// RangedFiles is implemented by backends that move a file in pieces, so a
// file larger than one frame (or than what a daemon holds in memory at
// once) can be read and written: export_file, and a write_file of more than
// one frame.
type RangedFiles interface {
	// ReadFileRange returns at most length bytes of the regular file at
	// path from offset (none past its end), and the file's size when it
	// was opened. A directory is ErrIsDirectory; a FIFO, socket or device
	// ErrBadPath. length 0 reads nothing and reports the size alone.
	ReadFileRange(ctx context.Context, id, path string, offset, length int64) (data []byte, size int64, err error)

	// WriteFileAt writes data into the existing regular file at path, at
	// offset, or at its end when offset is negative (append); offset may
	// not lie past the end. It never follows a symlink at path and
	// returns the file's size after the write.
	WriteFileAt(ctx context.Context, id, path string, data []byte, offset int64) (size int64, err error)
}

// LimitReporter is implemented by backends that enforce per-sandbox
// limits. LimitsInForce names, for each limit ("memory", "pids", "cpu",
// "disk", "open_files", "file_size", "syscalls"), the mechanism enforcing
// it on this host ("cgroup v2", "rlimit", "seccomp", "microvm", ...),
// "off" when it is not enforced, or "none" when it could be but the daemon
// is configured without that limit; health reports it.
type LimitReporter interface {
	LimitsInForce() map[string]string
}

// Describer is implemented by backends with facts about themselves that
// health reports (the gvisor backend: its runsc version and platform).
type Describer interface {
	Describe() map[string]string
}

// MemoryReporter is implemented by backends that bound the memory of every
// sandbox together (bwrap, on a cgroup all sandbox groups sit under);
// health reports it, so an operator can read what the host can hold.
type MemoryReporter interface {
	MemoryInForce() (HostMemory, error)
}

// HostMemory is what every sandbox together may use of the host's memory.
type HostMemory struct {
	// HostBytes is the host's memory (MemTotal).
	HostBytes int64
	// LimitBytes caps every sandbox together; 0: no such limit.
	LimitBytes int64
	// UsedBytes is what they use now, page cache and tmpfs included.
	UsedBytes int64
	// PerSandboxBytes is one sandbox's memory limit by default; 0: none.
	PerSandboxBytes int64
}

// EnvChecker is implemented by backends that can pass only some
// environments to a guest (sbx writes them to an env file, one variable a
// line). The lifecycle asks it about the env of a create it serves from
// the warm pool, which never reaches the backend's Create; an error wraps
// ErrInvalidArgument.
type EnvChecker interface {
	CheckEnv(env map[string]string) error
}

// ProblemReporter is implemented by backends that can tell a sandbox whose
// data is damaged (its disk has filesystem errors, or went read-only).
// Problems maps each such sandbox's id to what is wrong; health reports them
// and says degraded.
type ProblemReporter interface {
	Problems() map[string]string
}

// Warmer is implemented by backends whose sandboxes have a long-lived part
// they would otherwise start at the first command (bwrap's init, in its
// namespaces and cgroup). Warm starts it now, and pays what else a first
// command would pay once (bwrap's init runs a command of its own), so that
// the sandbox's first command costs what any later one does; the lifecycle
// calls it for every
// warm pool member it makes, before the member can be claimed, and for
// every member recovery re-adopted (whose part died with the previous
// daemon), on the pool filler once the daemon serves. (bwrap's Create
// begins its init's start itself, in the background.) It is idempotent and
// bounded by ctx. An error means the sandbox cannot serve now: the pool
// destroys such a member; a created sandbox stays its client's, whose
// first command tries again. A sandbox whose warm part later dies is
// terminated as it would be after any command.
type Warmer interface {
	Warm(ctx context.Context, id string) error
}

// ImagePruner is implemented by backends that derive state of their own
// from an image, made once per image for all its sandboxes (the gvisor
// backend's mount-point root of each image). PruneImages removes that
// state of every image whose digest is not in keep, except what one of the
// backend's own sandboxes (on disk, or being created) still uses, and
// returns how many images' state it removed. It is idempotent, and state
// it removed is made again by the next sandbox that needs it. The
// lifecycle calls it after an image rm and at start (for what a crash
// between a store's removal and this call left), with the digests of every
// image still in the store and of every sandbox it knows.
type ImagePruner interface {
	PruneImages(keep []string) (removed int, err error)
}

// InlineExecer is implemented by a backend whose Exec calls
// handoff.Release(ctx) (internal/handoff) before anything that may wait
// longer than a few milliseconds, and watches handoff.From(ctx).FD() in
// any wait it makes before that: a command for it may start on the
// goroutine that read its request from the connection (bwrap, whose short
// commands end inside a hot wait of a few milliseconds).
type InlineExecer interface {
	InlineExec()
}

// StaticInitReporter is implemented by backends that run an init of the
// daemon's inside every sandbox (bwrap, gVisor). StaticInit reports whether
// that init is statically linked (no ELF interpreter): only then does it run
// in a sandbox whose root is not the host's, such as an image without
// glibc. A backend whose init is dynamic refuses such roots with an error
// that says so.
type StaticInitReporter interface {
	StaticInit() bool
}

// ProcessEnder is implemented by backends whose sandboxes' processes
// outlive the daemon (bwrap: a kept sandbox's init and durable processes go
// on until the next daemon re-attaches). EndProcesses ends every process of
// sandbox id and leaves its files: the lifecycle calls it at shutdown for
// the sandboxes recovery doomed whose destroy did not run (they stay
// journaled, and the next start destroys them), so a connection-bound
// sandbox's processes never outlive the daemon that doomed it.
type ProcessEnder interface {
	EndProcesses(ctx context.Context, id string) error
}

// StaleReleaser is implemented by backends whose sandboxes hold host
// resources that a daemon killed with -9 can leave held (a loop device
// attached to a sandbox's disk image in the dead daemon's mount namespace,
// kept alive by a process that outlived it). gc calls it; it returns what
// it released (or, with dryRun, would release) and what is still held.
type StaleReleaser interface {
	ReleaseStale(ctx context.Context, dryRun bool) (released, held []string, err error)
}

// Spec is what a client requires of a new sandbox. The zero value means
// "no requirements stated": the backend's defaults apply (no network).
type Spec struct {
	// Env is set in every command run in the sandbox.
	Env map[string]string
	// BlockNetwork asks for no network access at all. Nil means unstated.
	BlockNetwork *bool
	// AllowEgressTo lists hostnames the sandbox may reach.
	AllowEgressTo []string
	// AllowEgressToCIDRs lists IPv4 CIDRs the sandbox may reach.
	AllowEgressToCIDRs []string
	// Resources asks for limits tighter than the daemon's; zero fields
	// take the daemon's configured limits. Asking for more than the daemon
	// allows, or for a limit the backend cannot enforce on this host, is
	// refused with ErrSpecUnenforceable, never silently capped or dropped.
	Resources Resources
	// Image is the sandbox's root filesystem; the zero Image is the
	// built-in host image. A backend that cannot run an image refuses it
	// with ErrSpecUnenforceable.
	Image Image
	// Seed, when set, is what the new sandbox's /workspace and /tmp start
	// with (a fork's source); zero seeds them from Image (Image.Seed).
	Seed Seed
}

// Resources are per-sandbox limits. Zero means "the daemon's default".
type Resources struct {
	// MemoryBytes caps the sandbox's memory; an allocation past it kills
	// the guest process (ExecResult.OOMKilled).
	MemoryBytes int64
	// CPUs is a CPU quota in cores (1.5 = one and a half CPUs' time).
	CPUs float64
	// PIDs caps the sandbox's processes and threads.
	PIDs int64
	// DiskBytes caps what the sandbox's workspace and /tmp may hold;
	// writes past it fail with ENOSPC inside.
	DiskBytes int64
}

// IsZero reports whether nothing was asked for.
func (r Resources) IsZero() bool { return r == Resources{} }

// Info describes a sandbox just created.
type Info struct {
	// Workdir is the sandbox's working directory as seen from inside.
	Workdir string
	// Network describes the network the sandbox got ("none", "host").
	Network string
	// HostUID is the host uid the sandbox's processes run as and its files
	// belong to, when it is the sandbox's alone (the bwrap backend's uid
	// range); 0 when the backend gives sandboxes no uid of their own.
	HostUID uint32
}

// ExecRequest is one command to run.
type ExecRequest struct {
	// Command is a shell string run with sh -c. Exactly one of Command and
	// Argv is set.
	Command string
	Argv    []string
	// Stdin is fed to the command; nil means an empty stdin.
	Stdin []byte
	// Env is added to (and overrides) the sandbox's Spec.Env.
	Env map[string]string
	// Cwd is the working directory inside the sandbox; empty means Workdir.
	Cwd string
	// Timeout is the command's budget; it is always > 0.
	Timeout time.Duration
	// MaxOutputBytes caps each of stdout and stderr; the tail is kept.
	MaxOutputBytes int
	// Output, when set, also gets the command's output as it is read
	// (stderr false for stdout), whatever is kept. It is called from the
	// backend's drain goroutines and must not block: a slow consumer
	// drops (capture.Window).
	Output func(stderr bool, p []byte)
}

// ExecResult is what a command did.
type ExecResult struct {
	ExitCode        int
	Stdout          []byte
	Stderr          []byte
	StdoutTruncated bool
	StderrTruncated bool
	// TimedOut means the command outlived its budget and was stopped;
	// ExitCode then carries no meaning.
	TimedOut bool
	// SandboxTerminated means the sandbox is gone (destroyed to stop the
	// command, or it died); the caller must create a new one.
	SandboxTerminated bool
	// OOMKilled means the kernel killed the command, or the process it
	// was waiting for, because the sandbox reached its memory limit;
	// ExitCode is then 137. A command that only lost a child to the OOM
	// killer and went on reports its own exit code and OOMKills > 0.
	OOMKilled bool
	// OOMKills counts the processes of the sandbox the kernel killed for
	// memory while the command ran (0 where the backend cannot tell).
	OOMKills uint64
	// AppliedTimeout is the budget actually used.
	AppliedTimeout time.Duration
	Duration       time.Duration
}

// Reason is one word for why the command ended: sandbox_terminated,
// timed_out, oom_killed or exited, in that order of precedence.
func (r ExecResult) Reason() string {
	return Outcome{TimedOut: r.TimedOut, OOMKilled: r.OOMKilled, SandboxTerminated: r.SandboxTerminated}.Reason()
}

// DirEntry is one entry of a directory listing.
type DirEntry struct {
	Name  string
	IsDir bool
}

// Errors a backend reports; callers check them with errors.Is. Wrap them
// with a sentence that says what to do next.
var (
	// ErrNotFound: the sandbox does not exist (or no longer does).
	ErrNotFound = errors.New("sandbox not found")
	// ErrSpecUnenforceable: the spec asks for something this backend cannot
	// guarantee on this host.
	ErrSpecUnenforceable = errors.New("spec cannot be enforced")
	// ErrBadPath: the path is not allowed (escapes the sandbox, not absolute
	// inside an allowed root, contains NUL, ...).
	ErrBadPath = errors.New("path not allowed")
	// ErrPathNotFound: nothing exists at the path.
	ErrPathNotFound = errors.New("no such file or directory")
	// ErrIsDirectory: a file was expected, a directory found.
	ErrIsDirectory = errors.New("is a directory")
	// ErrNotDirectory: a directory was expected, something else found.
	ErrNotDirectory = errors.New("not a directory")
	// ErrTooManyEntries: a listing exceeded the caller's bound.
	ErrTooManyEntries = errors.New("too many directory entries")
	// ErrInvalidArgument: the request itself is malformed (an environment
	// variable name containing '=', a relative working directory, a NUL
	// byte, an empty command, ...). Retrying it unchanged cannot help; the
	// caller must fix the request.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrHeldElsewhere: the sandbox's data is still held outside this
	// daemon (its disk image attached in a dead daemon's mount namespace);
	// using it now could corrupt it, and a later attempt may succeed.
	ErrHeldElsewhere = errors.New("sandbox data held elsewhere")
	// ErrDamaged: the sandbox's data is damaged (filesystem errors on its
	// disk, its workspace missing from a mounted disk); it is kept for an
	// operator to look at, never reported as not found.
	ErrDamaged = errors.New("sandbox data damaged")
	// ErrUnavailable: the backend cannot work right now (binary missing,
	// kernel feature off); retrying later may help.
	ErrUnavailable = errors.New("backend unavailable")
)

// FileTooLargeError reports a file larger than the caller allowed.
type FileTooLargeError struct {
	Path     string
	Size     int64
	MaxBytes int64
}

func (e *FileTooLargeError) Error() string {
	return fmt.Sprintf("%s is %d bytes, more than the %d allowed", e.Path, e.Size, e.MaxBytes)
}

// Bounds an environment must respect to be passed to a program: the
// kernel's MAX_ARG_STRLEN for one entry, and a share of ARG_MAX in all.
const (
	maxEnvEntryBytes = 128<<10 - 1
	maxEnvBytes      = 1 << 20
)

// ValidateEnv checks that env can be passed to a program, as every backend
// must: names non-empty without '=' or NUL, values without NUL, each entry
// and the whole within the kernel's limits. whose ("the sandbox's", "the
// command's") starts the messages, which name the variable, never its
// value. The error wraps ErrInvalidArgument.
func ValidateEnv(env map[string]string, whose string) error {
	total := 0
	for k, v := range env {
		switch {
		case k == "" || strings.ContainsAny(k, "=\x00"):
			return fmt.Errorf("%w: %s environment variable name %s is empty or contains '=' or NUL; rename it", ErrInvalidArgument, whose, ShortName(k))
		case strings.IndexByte(v, 0) >= 0:
			return fmt.Errorf("%w: %s environment variable %s has a NUL byte in its value, which cannot be passed to a program", ErrInvalidArgument, whose, ShortName(k))
		case len(k)+1+len(v) > maxEnvEntryBytes:
			return fmt.Errorf("%w: %s environment variable %s is %d bytes, more than the %d one variable may be; put the value in a file instead", ErrInvalidArgument, whose, ShortName(k), len(k)+1+len(v), maxEnvEntryBytes)
		}
		total += len(k) + len(v) + 2
	}
	if total > maxEnvBytes {
		return fmt.Errorf("%w: %s environment totals %d bytes, more than the %d allowed; put large values in files instead", ErrInvalidArgument, whose, total, maxEnvBytes)
	}
	return nil
}

// ShortName quotes a name that came from a client or a guest for a
// message: at most 64 bytes, valid UTF-8.
func ShortName(s string) string {
	const limit = 64
	if len(s) > limit {
		s = s[:limit] + "..."
	}
	return fmt.Sprintf("%q", strings.ToValidUTF8(s, "?"))
}

// validID is what a sandbox id may look like: it becomes a path component
// and a process name, so it is short and plain. Compiled on first use, not
// at start: its bounded repetition makes it 0.15 ms of every process that
// links this package, a sandbox's init among them.
var validID = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`) })

// NotFound is the error for a sandbox id this host does not have.
func NotFound(id string) error {
	return fmt.Errorf("%w: sandbox %q does not exist on this host (destroyed, or never created); create a new one", ErrNotFound, id)
}

// ValidID reports whether id may name a sandbox.
func ValidID(id string) bool { return validID().MatchString(id) }

// OutputFunc adapts an ExecRequest's Output to capture's; nil stays nil.
func OutputFunc(out func(stderr bool, p []byte)) capture.OutputFunc {
	if out == nil {
		return nil
	}
	return func(s capture.Stream, p []byte) { out(s == capture.Stderr, p) }
}
