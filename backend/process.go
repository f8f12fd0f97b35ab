package backend

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"
)

// Processes is implemented by backends that run durable processes: a
// process that outlives the request that started it, its client and a
// restart of the daemon, whose output is kept on the host and read back by
// byte offset, and whose end is recorded before it is reported. It ends
// with its sandbox. backend/procstore is the shared implementation over a
// sandbox's in-sandbox agent (backend/agent).
type Processes interface {
	// StartProcess starts req in sandbox id. A req.Name that names a
	// process of the sandbox already (running or ended) starts nothing
	// and returns that one with Existing set.
	StartProcess(ctx context.Context, id string, req ProcessRequest) (ProcessInfo, error)
	// ReadOutput reads at most maxBytes of one stream of a process from
	// offset; with wait > 0 and nothing there yet while the process runs,
	// it waits up to wait for bytes or the process's end.
	ReadOutput(ctx context.Context, id, proc string, stderr bool, offset int64, maxBytes int, wait time.Duration) (OutputRead, error)
	// WaitProcess waits up to wait for the process to end and describes
	// it (Running still set when it did not).
	WaitProcess(ctx context.Context, id, proc string, wait time.Duration) (ProcessInfo, error)
	// SignalProcess sends sig to the process's group.
	SignalProcess(ctx context.Context, id, proc string, sig syscall.Signal) error
	// ListProcesses describes every process the sandbox keeps a record of,
	// oldest first.
	ListProcesses(ctx context.Context, id string) ([]ProcessInfo, error)
}

// ProcessRequest is one durable process to start.
type ProcessRequest struct {
	// Name, when set, names the process within its sandbox (at most
	// MaxProcessNameLen bytes of letters, digits, '.', '_' and '-').
	Name string
	// Command or Argv, Stdin, Env and Cwd as for ExecRequest.
	Command string
	Argv    []string
	Stdin   []byte
	Env     map[string]string
	Cwd     string
	// Timeout is the process's budget; 0: none.
	Timeout time.Duration
}

// MaxProcessNameLen bounds a process's name.
const MaxProcessNameLen = 128

// ValidProcessName reports whether name may name a process.
func ValidProcessName(name string) bool {
	if name == "" || len(name) > MaxProcessNameLen {
		return false
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ProcessInfo describes a durable process.
type ProcessInfo struct {
	ID   string
	Name string
	// Command is the shell string it runs, or Argv its program.
	Command string
	Argv    []string
	Running bool
	// Existing: a start found the process by its name and started
	// nothing.
	Existing bool
	// Once ended: ExitCode (128+N for signal N) and Reason (exited,
	// killed, timed_out, oom_killed, sandbox_terminated).
	ExitCode           int
	Reason             string
	StartedAt, EndedAt time.Time
	// StdoutBytes and StderrBytes are how many bytes each stream has had.
	StdoutBytes, StderrBytes int64
}

// OutputRead is what ReadOutput found.
type OutputRead struct {
	Data []byte
	// Offset is where Data starts: the offset asked for, or the oldest
	// byte still kept when older ones were dropped (Dropped of them).
	Offset, Dropped int64
	// NextOffset is where the next read goes on.
	NextOffset int64
	// Process is the process as it was after the read.
	Process ProcessInfo
}

// Errors of the process operations.
var (
	// ErrProcessNotFound: the sandbox has no process of that id.
	ErrProcessNotFound = errors.New("no such process")
	// ErrProcessEnded: the process has ended (a signal cannot reach it).
	ErrProcessEnded = errors.New("the process has ended")
	// ErrTooManyProcesses: the sandbox runs as many processes as it may.
	ErrTooManyProcesses = errors.New("too many processes running in the sandbox")
	// ErrUnsupported: the backend cannot do this at all.
	ErrUnsupported = errors.New("not supported by this backend")
)

// ProcessQuotaError is a start refused because the sandbox runs Limit
// processes already; it is ErrTooManyProcesses.
type ProcessQuotaError struct{ Limit int }

func (e *ProcessQuotaError) Error() string {
	return fmt.Sprintf("the sandbox runs %d processes, the most it may run at once; wait for one to end or signal one", e.Limit)
}

// Is makes errors.Is(err, ErrTooManyProcesses) hold.
func (e *ProcessQuotaError) Is(target error) bool { return target == ErrTooManyProcesses }
