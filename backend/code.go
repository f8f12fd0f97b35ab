package backend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"
)

// CodeRunner is implemented by backends that run code contexts: Python
// whose variables persist between cells of one context, with results as
// MIME bundles (IPython's display protocol), each context a process of its
// sandbox forked from an interpreter that preloaded the operator's
// modules.
type CodeRunner interface {
	// RunCode runs one cell in req.Context (made on first use).
	RunCode(ctx context.Context, id string, req CodeRequest) (CodeResult, error)
	// ListContexts describes the sandbox's contexts, sorted by name.
	ListContexts(ctx context.Context, id string) ([]ContextInfo, error)
	// DeleteContext ends context name (its state is gone; a later cell
	// of that name starts afresh). ErrContextNotFound when there is none.
	DeleteContext(ctx context.Context, id, name string) error
	// RestartContext ends context name's process and state but keeps
	// the context: it stays listed, idle, at execution count 0, and its
	// next cell runs in a fresh interpreter (as the context was made: the
	// sandbox's environment, working directory and preloads); a cell it
	// runs ends with context_lost. ErrContextNotFound when there is none.
	RestartContext(ctx context.Context, id, name string) error
}

// CodeRequest is one cell to run.
type CodeRequest struct {
	// Context names the context (DefaultContext when empty).
	Context string
	Code    string
	// Env is added to the sandbox's for the context's interpreter, when
	// this cell starts it.
	Env map[string]string
	// Timeout is the cell's budget: at it the cell is interrupted
	// (KeyboardInterrupt); a context that has not stopped by the kill
	// grace is killed, and lost.
	Timeout time.Duration
	// MaxOutputBytes caps each of stdout and stderr (the tail is kept),
	// and the results' bytes together.
	MaxOutputBytes int
	// Output, when set, gets the output as it is read (ExecRequest's).
	Output func(stderr bool, p []byte)
}

// DefaultContext is the context of a cell that names none.
const DefaultContext = "default"

// Bundle is one result: MIME type to value (a string, bytes for the binary
// image types, any JSON value for application/json).
type Bundle map[string]any

// CodeError is a cell's exception, as Jupyter reports one.
type CodeError struct {
	Name, Value string
	Traceback   []string
}

// CodeResult is what a cell did.
type CodeResult struct {
	Stdout, Stderr                   []byte
	StdoutTruncated, StderrTruncated bool
	// Results are the display bundles in order and, last, the cell's
	// value when it is not None; ResultsTruncated says some were left out
	// (past their bounds).
	Results          []Bundle
	ResultsTruncated bool
	Error            *CodeError
	ExecutionCount   int
	Duration         time.Duration
	// TimedOut: the cell outlived its budget and was interrupted (or, with
	// ContextLost, killed). ContextLost: the context's process died (killed,
	// out of memory, or it ignored the interrupt): its state is gone, and
	// the next cell starts a fresh one. OOMKilled as for a command.
	TimedOut, ContextLost, OOMKilled bool
	OOMKills                         uint64
}

// Reason is one word for how the cell ended: context_lost, timed_out,
// oom_killed, error or ok.
func (r CodeResult) Reason() string {
	switch {
	case r.OOMKilled:
		return "oom_killed"
	case r.TimedOut:
		return "timed_out"
	case r.ContextLost:
		return "context_lost"
	case r.Error != nil:
		return "error"
	}
	return "ok"
}

// ContextInfo describes one context.
type ContextInfo struct {
	Name           string
	Running        bool
	ExecutionCount int
}

// Errors of the code operations.
var (
	// ErrNoPython: the sandbox's image has no python3.
	ErrNoPython = errors.New("the sandbox has no python3")
	// ErrContextNotFound: no context of that name.
	ErrContextNotFound = errors.New("no such context")
	// ErrContextBusy: the context runs another cell.
	ErrContextBusy = errors.New("the context runs another cell")
	// ErrTooManyContexts: the sandbox has as many contexts as it may.
	ErrTooManyContexts = errors.New("too many contexts in the sandbox")
)

// ContextQuotaError is a cell refused because the sandbox has Limit
// contexts already; it is ErrTooManyContexts.
type ContextQuotaError struct{ Limit int }

func (e *ContextQuotaError) Error() string {
	return fmt.Sprintf("the sandbox has %d code contexts, the most it may have; delete one (delete_context) or use one of them", e.Limit)
}

// Is makes errors.Is(err, ErrTooManyContexts) hold.
func (e *ContextQuotaError) Is(target error) bool { return target == ErrTooManyContexts }

// CodeConfig configures a sandbox's code contexts, on the backends whose
// agent runs them (bwrap, gvisor).
type CodeConfig struct {
	// Preload names the Python modules the contexts' interpreter imports
	// before it forks the first context; ImagePreload replaces it for the
	// sandboxes of an image (by the image's short name, "host" for the
	// built-in one).
	Preload      []string
	ImagePreload map[string][]string
	// MaxContexts bounds a sandbox's contexts (0: the agent's default, 8).
	MaxContexts int
}

// PreloadFor is the modules the contexts of a sandbox of image preload,
// comma-separated, as the agent takes them.
func (c CodeConfig) PreloadFor(image string) string {
	mods := c.Preload
	if m, ok := c.ImagePreload[image]; ok {
		mods = m
	}
	return strings.Join(mods, ",")
}

// CellFailure is the error of a cell a sandbox's agent could not run, from
// the errno it answered with (backend/agent's Reply.Failed) and its reason;
// limit is the sandbox's bound on contexts.
func CellFailure(errno syscall.Errno, reason string, limit int) error {
	switch errno {
	case syscall.ENOENT:
		return fmt.Errorf("%w: %s; run_code needs an image with python3 (the host image has it where the host does)", ErrNoPython, reason)
	case syscall.EAGAIN:
		return &ContextQuotaError{Limit: limit}
	case syscall.EBUSY:
		return fmt.Errorf("%w: %s", ErrContextBusy, reason)
	case syscall.EINVAL:
		return fmt.Errorf("%w: %s", ErrInvalidArgument, reason)
	}
	return fmt.Errorf("%w: the cell could not run: %s", ErrUnavailable, reason)
}
