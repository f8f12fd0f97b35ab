package ipc

import (
	"errors"
	"fmt"
)

// ProtocolVersion is the only envelope version this package speaks.
const ProtocolVersion = 1

// Op names. They follow Airflow's sandbox backend contract so the mapping
// from a Python method to an op stays literal.
const (
	OpHello         = "hello"
	OpHealth        = "health"
	OpCreate        = "create"
	OpRunCommand    = "run_command"
	OpReadFile      = "read_file"
	OpWriteFile     = "write_file"
	OpListDirectory = "list_directory"
	OpDestroy       = "destroy"
	OpList          = "list"
	OpRenew         = "renew"
	OpAttach        = "attach"
	OpRelease       = "release"
	OpReadTags      = "read_tags"
	OpWriteTags     = "write_tags"
	OpDestroyRun    = "destroy_run"
	OpGC            = "gc"
	// The operator's image ops (docs/protocol.md, "Images").
	OpImageLs          = "image_ls"
	OpImageInspect     = "image_inspect"
	OpImageRm          = "image_rm"
	OpImageImportBegin = "image_import_begin"
	OpImageImportData  = "image_import_data"
	OpImageImportEnd   = "image_import_end"
	// Durable processes (docs/protocol.md, "Durable processes").
	OpStartCommand  = "start_command"
	OpReadOutput    = "read_output"
	OpWaitProcess   = "wait_process"
	OpSignalProcess = "signal_process"
	OpListProcesses = "list_processes"
	// Code contexts (docs/protocol.md, "Code contexts").
	OpRunCode        = "run_code"
	OpListContexts   = "list_contexts"
	OpRestartContext = "restart_context"
	OpDeleteContext  = "delete_context"
	// Paused sandboxes (docs/protocol.md, "pause and resume").
	OpPause  = "pause"
	OpResume = "resume"
)

// Error codes: stable strings a client may switch on. docs/protocol.md says
// for each whether retrying can help.
const (
	CodeBadRequest        = "bad_request"
	CodeFrameTooLarge     = "frame_too_large"
	CodeUnsupported       = "unsupported_version"
	CodeUnknownOp         = "unknown_op"
	CodeUnauthorized      = "unauthorized"
	CodeNotFound          = "not_found"
	CodeBadPath           = "bad_path"
	CodePathNotFound      = "path_not_found"
	CodeIsDirectory       = "is_a_directory"
	CodeNotDirectory      = "not_a_directory"
	CodeFileTooLarge      = "file_too_large"
	CodeTooManyEntries    = "too_many_entries"
	CodeQuotaExceeded     = "quota_exceeded"
	CodeOwnerMismatch     = "owner_mismatch"
	CodeHeldByOther       = "held_by_other"
	CodeBusy              = "busy"
	CodeSpecUnenforceable = "spec_unenforceable"
	CodeBackendUnavail    = "backend_unavailable"
	CodeShuttingDown      = "shutting_down"
	CodeInternal          = "internal"
	CodeImageNotFound     = "image_not_found"
	CodeImageInUse        = "image_in_use"
	CodeImageExists       = "image_exists"
	CodeBadImage          = "bad_image"
	CodeImageTooLarge     = "image_too_large"
	CodeNoShell           = "no_shell"
	CodeProcessNotFound   = "process_not_found"
	CodeProcessEnded      = "process_ended"
	CodeNotSupported      = "not_supported"
	CodeNoPython          = "no_python"
	CodeContextNotFound   = "context_not_found"
	CodeContextBusy       = "context_busy"
)

// Error is an error response: a stable code for machines, a sentence for
// people, and optional details (for example size_bytes for file_too_large).
type Error struct {
	Code    string
	Message string
	Details map[string]any
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Errorf makes an *Error with a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// With returns a copy of e carrying one more detail.
func (e *Error) With(key string, value any) *Error {
	c := *e
	c.Details = make(map[string]any, len(e.Details)+1)
	for k, v := range e.Details {
		c.Details[k] = v
	}
	c.Details[key] = value
	return &c
}

// AsError returns err as an *Error: itself if it is one (or wraps one), an
// internal error otherwise. The internal message does not leak err's text to
// the peer; the server logs it.
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: CodeInternal, Message: "internal error; the daemon's log has the details"}
}
