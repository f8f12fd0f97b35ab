// Package api is the one Go definition of the wire's results: a type per
// op, with the msgpack keys docs/protocol.md documents. The daemon
// (service) returns these types, and the Go client (ipc.Client's typed
// methods), the CLI, the end-to-end tests, the escape battery and the bench
// tool decode into them, so a field added here appears everywhere, and
// TestDocumented holds docs/protocol.md against it.
//
// The daemon decodes each request into the request types below (ipc.Decode,
// driven by their msgpack and wire tags), so a request's keys and bounds are
// written once, here. This package imports nothing of the project.
package api

import (
	"fmt"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
)

// HelloResult is hello's result.
type HelloResult struct {
	Version       int    `msgpack:"version"`
	ServerVersion string `msgpack:"server_version"`
	Backend       string `msgpack:"backend"`
	// Node names this host (server.node_name, $SANDBOX_SIDECAR_NODE_NAME or
	// the host name): a sandbox lives on one host.
	Node     string      `msgpack:"node"`
	Admin    bool        `msgpack:"admin"`
	Features []string    `msgpack:"features"`
	Peer     Peer        `msgpack:"peer"`
	Limits   HelloLimits `msgpack:"limits"`
	// Images names the images a create may ask for (host first), and
	// DefaultImage the one it gets when it names none.
	Images       []string `msgpack:"images"`
	DefaultImage string   `msgpack:"default_image"`
}

// Peer is the peer as the kernel reported it.
type Peer struct {
	UID uint32 `msgpack:"uid"`
	GID uint32 `msgpack:"gid"`
	PID int32  `msgpack:"pid"`
}

// HelloLimits are the daemon's request limits.
type HelloLimits struct {
	MaxFrameBytes      int     `msgpack:"max_frame_bytes"`
	MaxOutputBytes     int     `msgpack:"max_output_bytes"`
	DefaultOutputBytes int     `msgpack:"default_output_bytes"`
	MaxFileBytes       int64   `msgpack:"max_file_bytes"`
	MaxTimeoutS        float64 `msgpack:"max_timeout_s"`
	DefaultTimeoutS    float64 `msgpack:"default_timeout_s"`
	MaxListEntries     int     `msgpack:"max_list_entries"`
}

// HealthResult is health's result.
type HealthResult struct {
	Status        string  `msgpack:"status"`
	Version       string  `msgpack:"version"`
	Backend       string  `msgpack:"backend"`
	BackendError  string  `msgpack:"backend_error,omitempty"`
	Sandboxes     int     `msgpack:"sandboxes"`
	Commands      int     `msgpack:"commands"`
	UptimeSeconds float64 `msgpack:"uptime_s"`
	// PendingDestroy counts sandboxes whose destroy failed and is retried.
	PendingDestroy int            `msgpack:"pending_destroy"`
	Pooled         int            `msgpack:"pooled"`
	Recovery       RecoveryReport `msgpack:"recovery"`
	// Limits names, for each per-sandbox limit, what enforces it on this
	// host or "off"; only from a backend that reports them. Read-only.
	Limits map[string]string `msgpack:"limits,omitempty"`
	// BackendInfo is what the backend says about itself (gvisor: its
	// runsc binary, version and platform); only from a backend that does.
	BackendInfo map[string]string `msgpack:"backend_info,omitempty"`
	// Memory says what the host can hold: only from a backend that bounds
	// every sandbox's memory together.
	Memory *MemoryReport `msgpack:"memory,omitempty"`
	// Quarantined lists the sandboxes kept after a restart that the
	// backend could not adopt; Damaged those whose data is damaged. Either
	// makes the status degraded. A non-admin sees only its own uid's.
	Quarantined []QuarantinedSandbox `msgpack:"quarantined,omitempty"`
	Damaged     []DamagedSandbox     `msgpack:"damaged,omitempty"`
	// Images names the images a create may ask for, as hello does.
	Images []string `msgpack:"images"`

	// Paused counts the paused sandboxes (counted in Sandboxes too).
	Paused int `msgpack:"paused"`
}

// MemoryReport is health's memory section: what every sandbox together
// may use, uses, and how many sandboxes that holds at their own limit.
type MemoryReport struct {
	HostBytes       int64 `msgpack:"host_bytes"`
	LimitBytes      int64 `msgpack:"sandboxes_limit_bytes"`
	UsedBytes       int64 `msgpack:"sandboxes_used_bytes"`
	PerSandboxBytes int64 `msgpack:"per_sandbox_bytes"`
	// FitsSandboxes is how many sandboxes may each use their whole memory
	// limit at once (LimitBytes / PerSandboxBytes, or the host's memory
	// when there is no common limit); 0 when sandboxes have no limit.
	FitsSandboxes int64 `msgpack:"fits_sandboxes"`
	// MaxSandboxes is the host's sandbox quota, to compare with.
	MaxSandboxes int `msgpack:"max_sandboxes"`
}

// QuarantinedSandbox is one quarantined sandbox, as health reports it.
type QuarantinedSandbox struct {
	Sandbox string `msgpack:"sandbox"`
	UID     uint32 `msgpack:"uid"`
	Owner   string `msgpack:"owner"`
	Reason  string `msgpack:"reason"`
	// GaveUp: the background retries stopped; an operator should look.
	GaveUp bool `msgpack:"gave_up"`
}

// DamagedSandbox is one sandbox whose data the backend reports damaged.
type DamagedSandbox struct {
	Sandbox string `msgpack:"sandbox"`
	Problem string `msgpack:"problem"`
}

// RecoveryReport is what start-up recovery did, as health reports it.
type RecoveryReport struct {
	Adopted   int `msgpack:"adopted"`
	Destroyed int `msgpack:"destroyed"`
	Swept     int `msgpack:"swept"`
	Failed    int `msgpack:"failed"`
	// AdoptFailed counts kept sandboxes the backend could not adopt at
	// start (quarantined, not destroyed).
	AdoptFailed int `msgpack:"adopt_failed"`
	// Pending counts recovery's destroys still running in the background
	// (the daemon serves while they finish).
	Pending    int     `msgpack:"pending"`
	MovedAside string  `msgpack:"journal_moved_aside,omitempty"`
	DurationS  float64 `msgpack:"duration_s"`
}

// CreateResult is create's result.
type CreateResult struct {
	Sandbox   string  `msgpack:"sandbox"`
	Workdir   string  `msgpack:"workdir"`
	Network   string  `msgpack:"network"`
	ExpiresAt float64 `msgpack:"expires_at"`
	ConnBound bool    `msgpack:"conn_bound"`
	// Image is the image the sandbox runs on.
	Image string `msgpack:"image"`
}

// Resources are create's resources as asked; a key left out is the
// daemon's default.
type Resources struct {
	MemoryBytes int64   `msgpack:"memory_bytes,omitempty" wire:"positive"`
	CPUs        float64 `msgpack:"cpus,omitempty" wire:"positive,max=8192"`
	PIDs        int64   `msgpack:"pids,omitempty" wire:"positive,max=4194304"`
	DiskBytes   int64   `msgpack:"disk_bytes,omitempty" wire:"positive"`
}

// RunCommandResult is run_command's result.
type RunCommandResult struct {
	ExitCode          int     `msgpack:"exit_code"`
	Stdout            []byte  `msgpack:"stdout"`
	Stderr            []byte  `msgpack:"stderr"`
	TimedOut          bool    `msgpack:"timed_out"`
	StdoutTruncated   bool    `msgpack:"stdout_truncated"`
	StderrTruncated   bool    `msgpack:"stderr_truncated"`
	SandboxTerminated bool    `msgpack:"sandbox_terminated"`
	OOMKilled         bool    `msgpack:"oom_killed"`
	OOMKills          uint64  `msgpack:"oom_kills"`
	Reason            string  `msgpack:"reason"`
	AppliedTimeoutS   float64 `msgpack:"applied_timeout_s"`
	DurationS         float64 `msgpack:"duration_s"`
	// With Stream: the bytes of each stream sent as no event (the client
	// read slower than the daemon's window allowed); still in the tails.
	StdoutStreamDropped *int64 `msgpack:"stdout_stream_dropped,omitempty"`
	StderrStreamDropped *int64 `msgpack:"stderr_stream_dropped,omitempty"`
}

// ReadFileResult is read_file's result. For a ranged read (Offset or
// Length asked) SizeBytes is the whole file's size, Data one piece of it.
type ReadFileResult struct {
	Data      []byte `msgpack:"data"`
	SizeBytes int64  `msgpack:"size_bytes"`
	Offset    *int64 `msgpack:"offset,omitempty"`
	EOF       *bool  `msgpack:"eof,omitempty"`
}

// WriteFileResult is write_file's result; SizeBytes (the file's size
// after) for a write with Append or Offset.
type WriteFileResult struct {
	BytesWritten int   `msgpack:"bytes_written"`
	SizeBytes    int64 `msgpack:"size_bytes,omitempty"`
}

// ListDirectoryResult is list_directory's result.
type ListDirectoryResult struct {
	Entries []DirEntry `msgpack:"entries"`
}

// DirEntry is one entry of a listing.
type DirEntry struct {
	Name  Name `msgpack:"name"`
	IsDir bool `msgpack:"is_dir"`
}

// Name is a file name on the wire: a string, or bytes when it is not valid
// UTF-8 (a strict msgpack decoder would refuse such a string). It decodes
// from either.
type Name string

var (
	_ msgpack.CustomEncoder = Name("")
	_ msgpack.CustomDecoder = (*Name)(nil)
)

// EncodeMsgpack implements msgpack.CustomEncoder.
func (n Name) EncodeMsgpack(enc *msgpack.Encoder) error {
	if utf8.ValidString(string(n)) {
		return enc.EncodeString(string(n))
	}
	return enc.EncodeBytes([]byte(n))
}

// DecodeMsgpack implements msgpack.CustomDecoder.
func (n *Name) DecodeMsgpack(dec *msgpack.Decoder) error {
	v, err := dec.DecodeInterface()
	if err != nil {
		return err
	}
	switch s := v.(type) {
	case string:
		*n = Name(s)
	case []byte:
		*n = Name(s)
	default:
		return fmt.Errorf("a name is a string or bytes, not %T", v)
	}
	return nil
}

// DestroyResult is destroy's result: nothing.
type DestroyResult struct{}

// RenewResult is renew's result.
type RenewResult struct {
	ExpiresAt  float64 `msgpack:"expires_at"`
	RemainingS float64 `msgpack:"remaining_s"`
}

// AttachResult is attach's result.
type AttachResult struct {
	RemainingS float64 `msgpack:"remaining_s"`
	ExpiresAt  float64 `msgpack:"expires_at"`
	Workdir    string  `msgpack:"workdir"`
	// Network is the airflow_network tag's JSON string.
	Network string `msgpack:"network"`
	Holder  string `msgpack:"holder"`
}

// ReleaseResult is release's result.
type ReleaseResult struct {
	Released bool `msgpack:"released"`
}

// TagsResult is read_tags's and write_tags's result.
type TagsResult struct {
	Tags map[string]string `msgpack:"tags"`
}

// DestroyRunResult is destroy_run's result.
type DestroyRunResult struct {
	Destroyed []string `msgpack:"destroyed"`
}

// ListResult is list's result.
type ListResult struct {
	Sandboxes []SandboxInfo `msgpack:"sandboxes"`
}

// SandboxInfo is one sandbox as list reports it.
type SandboxInfo struct {
	Sandbox    string            `msgpack:"sandbox"`
	UID        uint32            `msgpack:"uid"`
	Owner      string            `msgpack:"owner"`
	Holder     string            `msgpack:"holder"`
	Labels     map[string]string `msgpack:"labels"`
	State      string            `msgpack:"state"`
	Workdir    string            `msgpack:"workdir"`
	Network    string            `msgpack:"network"`
	ConnBound  bool              `msgpack:"conn_bound"`
	CreatedAt  float64           `msgpack:"created_at"`
	ExpiresAt  float64           `msgpack:"expires_at"`
	LastUsed   float64           `msgpack:"last_used"`
	RemainingS float64           `msgpack:"remaining_s"`
	Tags       map[string]string `msgpack:"tags"`
	Resources  Resources         `msgpack:"resources"`
	// Quarantine is why the sandbox is quarantined (only in that state).
	Quarantine string `msgpack:"quarantine,omitempty"`
	// PausedAt is when a paused sandbox (state "paused") was paused.
	PausedAt float64 `msgpack:"paused_at,omitempty"`
	// Image is the image the sandbox runs on.
	Image string `msgpack:"image"`
}

// ImageInfo is one image as image_ls and image_inspect report it.
type ImageInfo struct {
	Name string `msgpack:"name" json:"name"`
	// Builtin: the host image, which is not in the store.
	Builtin bool `msgpack:"builtin" json:"builtin"`
	// Default: a create that names no image gets this one.
	Default bool   `msgpack:"default" json:"default"`
	Digest  string `msgpack:"digest,omitempty" json:"digest,omitempty"`
	// SizeBytes and Files are the unpacked root's.
	SizeBytes  int64    `msgpack:"size_bytes" json:"size_bytes"`
	Files      int64    `msgpack:"files" json:"files"`
	CreatedAt  float64  `msgpack:"created_at,omitempty" json:"created_at,omitempty"`
	ImportedAt float64  `msgpack:"imported_at,omitempty" json:"imported_at,omitempty"`
	Source     string   `msgpack:"source,omitempty" json:"source,omitempty"`
	Env        []string `msgpack:"env,omitempty" json:"env,omitempty"`
	Entrypoint []string `msgpack:"entrypoint,omitempty" json:"entrypoint,omitempty"`
	Cmd        []string `msgpack:"cmd,omitempty" json:"cmd,omitempty"`
	WorkingDir string   `msgpack:"working_dir,omitempty" json:"working_dir,omitempty"`
	User       string   `msgpack:"user,omitempty" json:"user,omitempty"`
	// Sandboxes counts the sandboxes on it now; PoolSize is its warm
	// pool's configured size.
	Sandboxes int `msgpack:"sandboxes" json:"sandboxes"`
	PoolSize  int `msgpack:"pool_size" json:"pool_size"`
	// Base is "host" for an image holding only a sandbox's files over the
	// host's root; Origin says where a snapshot came from.
	Base   string       `msgpack:"base,omitempty" json:"base,omitempty"`
	Origin *ImageOrigin `msgpack:"origin,omitempty" json:"origin,omitempty"`
	// Memory: a snapshot that keeps its sandbox's processes and memory
	// (a gVisor checkpoint); a sandbox created from it starts with them.
	Memory bool `msgpack:"memory,omitempty" json:"memory,omitempty"`
}

// ImageListResult is image_ls's result.
type ImageListResult struct {
	Images []ImageInfo `msgpack:"images"`
}

// ImageInspectResult is image_inspect's result.
type ImageInspectResult struct {
	Image ImageInfo `msgpack:"image"`
}

// ImageRemoveResult is image_rm's result.
type ImageRemoveResult struct {
	Removed string `msgpack:"removed"`
}

// ImageImportBeginResult is image_import_begin's result: the upload's id
// and the most data one image_import_data may carry.
type ImageImportBeginResult struct {
	Upload        string `msgpack:"upload"`
	MaxChunkBytes int    `msgpack:"max_chunk_bytes"`
}

// ImageImportDataResult is image_import_data's result.
type ImageImportDataResult struct {
	ReceivedBytes int64 `msgpack:"received_bytes"`
}

// ImageImportEndResult is image_import_end's result: the imported image.
type ImageImportEndResult struct {
	Image         ImageInfo `msgpack:"image"`
	ReceivedBytes int64     `msgpack:"received_bytes"`
}

// GCResult is gc's result.
type GCResult struct {
	Swept  []string `msgpack:"swept"`
	Reaped int      `msgpack:"reaped"`
	DryRun bool     `msgpack:"dry_run"`
}

// StartCommandResult is start_command's result: the process, started now
// or (Existing) found by its name.
type StartCommandResult struct {
	Process  string `msgpack:"process"`
	Name     string `msgpack:"name"`
	Existing bool   `msgpack:"existing"`
	// Running: it runs (false for an existing one that ended, or a
	// program that could not be run: its exit code says why).
	Running bool `msgpack:"running"`
}

// ProcessInfo is one durable process as wait_process and list_processes
// describe it. ExitCode, Reason and EndedAt once it ended.
type ProcessInfo struct {
	Process     string   `msgpack:"process"`
	Name        string   `msgpack:"name"`
	Command     string   `msgpack:"command,omitempty"`
	Argv        []string `msgpack:"argv,omitempty"`
	Running     bool     `msgpack:"running"`
	ExitCode    *int     `msgpack:"exit_code,omitempty"`
	Reason      string   `msgpack:"reason,omitempty"`
	StartedAt   float64  `msgpack:"started_at"`
	EndedAt     *float64 `msgpack:"ended_at,omitempty"`
	StdoutBytes int64    `msgpack:"stdout_bytes"`
	StderrBytes int64    `msgpack:"stderr_bytes"`
}

// ReadOutputResult is read_output's result: Data is the stream's bytes
// from Offset (the offset asked for, or the oldest byte still kept; Dropped
// bytes between them are gone); the next read asks for NextOffset. Running,
// and once ended ExitCode and Reason, as after the read.
type ReadOutputResult struct {
	Data       []byte `msgpack:"data"`
	Offset     int64  `msgpack:"offset"`
	Dropped    int64  `msgpack:"dropped"`
	NextOffset int64  `msgpack:"next_offset"`
	Running    bool   `msgpack:"running"`
	ExitCode   *int   `msgpack:"exit_code,omitempty"`
	Reason     string `msgpack:"reason,omitempty"`
}

// ListProcessesResult is list_processes's result, oldest first.
type ListProcessesResult struct {
	Processes []ProcessInfo `msgpack:"processes"`
}

// SignalProcessResult is signal_process's result: nothing.
type SignalProcessResult struct{}

// RunCodeResult is run_code's result: stdout and stderr as run_command's,
// Results the cell's MIME bundles (display calls in order, then its
// value), Error its exception (nil when none).
type RunCodeResult struct {
	Stdout           []byte     `msgpack:"stdout"`
	Stderr           []byte     `msgpack:"stderr"`
	StdoutTruncated  bool       `msgpack:"stdout_truncated"`
	StderrTruncated  bool       `msgpack:"stderr_truncated"`
	Results          []Bundle   `msgpack:"results"`
	ResultsTruncated bool       `msgpack:"results_truncated"`
	Error            *CodeError `msgpack:"error"`
	ExecutionCount   int        `msgpack:"execution_count"`
	DurationS        float64    `msgpack:"duration_s"`
	TimedOut         bool       `msgpack:"timed_out"`
	ContextLost      bool       `msgpack:"context_lost"`
	OOMKilled        bool       `msgpack:"oom_killed"`
	Reason           string     `msgpack:"reason"`
	// With Stream: as run_command's.
	StdoutStreamDropped *int64 `msgpack:"stdout_stream_dropped,omitempty"`
	StderrStreamDropped *int64 `msgpack:"stderr_stream_dropped,omitempty"`
}

// Bundle is one result of a cell: MIME type to value (str; bytes for
// image/png and image/jpeg; any JSON value for application/json).
type Bundle map[string]any

// CodeError is a cell's exception, as Jupyter reports one.
type CodeError struct {
	Name      string   `msgpack:"name"`
	Value     string   `msgpack:"value"`
	Traceback []string `msgpack:"traceback"`
}

// ContextInfo is one code context as list_contexts reports it.
type ContextInfo struct {
	Context        string `msgpack:"context"`
	Running        bool   `msgpack:"running"`
	ExecutionCount int    `msgpack:"execution_count"`
}

// ListContextsResult is list_contexts's result, by name.
type ListContextsResult struct {
	Contexts []ContextInfo `msgpack:"contexts"`
}

// ContextResult is restart_context's and delete_context's result: nothing.
type ContextResult struct{}

// Results maps each op to its result type, for the documentation test and
// for tools that walk the wire.
var Results = map[string]any{
	"hello":          HelloResult{},
	"health":         HealthResult{},
	"create":         CreateResult{},
	"run_command":    RunCommandResult{},
	"read_file":      ReadFileResult{},
	"write_file":     WriteFileResult{},
	"list_directory": ListDirectoryResult{},
	"destroy":        DestroyResult{},
	"renew":          RenewResult{},
	"attach":         AttachResult{},
	"release":        ReleaseResult{},
	"read_tags":      TagsResult{},
	"write_tags":     TagsResult{},
	"destroy_run":    DestroyRunResult{},
	"list":           ListResult{},
	"gc":             GCResult{},

	"image_ls":           ImageListResult{},
	"image_inspect":      ImageInspectResult{},
	"image_rm":           ImageRemoveResult{},
	"image_import_begin": ImageImportBeginResult{},
	"image_import_data":  ImageImportDataResult{},
	"image_import_end":   ImageImportEndResult{},

	"start_command":  StartCommandResult{},
	"read_output":    ReadOutputResult{},
	"wait_process":   ProcessInfo{},
	"signal_process": SignalProcessResult{},
	"list_processes": ListProcessesResult{},

	"run_code":        RunCodeResult{},
	"list_contexts":   ListContextsResult{},
	"restart_context": ContextResult{},
	"delete_context":  ContextResult{},
}

// Requests, as a Go client sends them and as the daemon decodes them
// (ipc.Decode, once, at the boundary): one type per op, whose fields are
// the op's only arguments. A field left at its zero value is left out, so
// the daemon's default applies; a pointer is for an argument whose zero
// means something else than its absence. The `wire` tags say what the
// daemon requires of a value beyond its type (ipc.Decode's comment lists
// them); TestDocumented holds the keys against docs/protocol.md.

// Bounds the daemon applies to requests' lists and maps (the wire tags
// below spell the same numbers; TestWireTagsUseTheBounds holds them).
const (
	MaxEnv    = 256
	MaxArgv   = 4096
	MaxEgress = 256
	MaxLabels = 16
	MaxTags   = 32
	// MaxCPUs and MaxPIDs bound what a create's resources may name at
	// all: more CPUs than a kernel supports, more processes than
	// PID_MAX_LIMIT.
	MaxCPUs = 8192
	MaxPIDs = 1 << 22
)

// HelloRequest is hello's arguments.
type HelloRequest struct {
	Versions []int  `msgpack:"versions,omitempty" wire:"max=16"`
	Client   string `msgpack:"client,omitempty"`
}

// NoArgs is the arguments of an op that takes none (health, image_ls).
type NoArgs struct{}

// CreateRequest is create's arguments.
type CreateRequest struct {
	Spec      *Spec             `msgpack:"spec,omitempty"`
	Resources *Resources        `msgpack:"resources,omitempty"`
	Labels    map[string]string `msgpack:"labels,omitempty" wire:"max=16"`
	TTLS      float64           `msgpack:"ttl_s,omitempty" wire:"positive"`
	// Image names the image to run on (hello's images); left out, the
	// daemon's default.
	Image string `msgpack:"image,omitempty"`
}

// Spec is what create's spec may ask.
type Spec struct {
	Env                map[string]string `msgpack:"env,omitempty" wire:"max=256"`
	BlockNetwork       *bool             `msgpack:"block_network,omitempty"`
	AllowEgressTo      []string          `msgpack:"allow_egress_to,omitempty" wire:"max=256"`
	AllowEgressToCIDRs []string          `msgpack:"allow_egress_to_cidrs,omitempty" wire:"max=256"`
	Owner              string            `msgpack:"owner,omitempty"`
}

// RunCommandRequest is run_command's arguments: exactly one of Command
// and Argv.
type RunCommandRequest struct {
	Sandbox  string            `msgpack:"sandbox" wire:"required"`
	Command  string            `msgpack:"command,omitempty"`
	Argv     []string          `msgpack:"argv,omitempty" wire:"max=4096,nonempty"`
	Stdin    []byte            `msgpack:"stdin,omitempty"`
	Env      map[string]string `msgpack:"env,omitempty" wire:"max=256"`
	Cwd      string            `msgpack:"cwd,omitempty" wire:"path"`
	TimeoutS float64           `msgpack:"timeout_s,omitempty" wire:"positive"`
	// MaxOutputBytes: nil for the daemon's default.
	MaxOutputBytes *int `msgpack:"max_output_bytes,omitempty" wire:"min=0,max=2147483647"`
	// Stream asks for the output as stdout/stderr events while the
	// command runs (ipc.Client.CallStream).
	Stream bool `msgpack:"stream,omitempty"`
}

// ReadFileRequest is read_file's arguments.
type ReadFileRequest struct {
	Sandbox string `msgpack:"sandbox" wire:"required"`
	Path    string `msgpack:"path" wire:"required,path"`
	// MaxBytes: nil for the daemon's cap.
	MaxBytes *int64 `msgpack:"max_bytes,omitempty" wire:"min=0"`
	// Offset and Length make it a ranged read (instead of MaxBytes): at
	// most Length bytes (nil: the daemon's cap) from Offset.
	Offset *int64 `msgpack:"offset,omitempty" wire:"min=0"`
	Length *int64 `msgpack:"length,omitempty" wire:"min=0"`
}

// WriteFileRequest is write_file's arguments.
type WriteFileRequest struct {
	Sandbox string `msgpack:"sandbox" wire:"required"`
	Path    string `msgpack:"path" wire:"required,path"`
	Data    []byte `msgpack:"data" wire:"required"`
	// Mode: nil for 0o644.
	Mode *int `msgpack:"mode,omitempty" wire:"min=0,max=0o777"`
	// Append, or an Offset, writes into the existing file instead of
	// replacing it (and keeps its mode).
	Append bool   `msgpack:"append,omitempty"`
	Offset *int64 `msgpack:"offset,omitempty" wire:"min=0"`
}

// ListDirectoryRequest is list_directory's arguments.
type ListDirectoryRequest struct {
	Sandbox string `msgpack:"sandbox" wire:"required"`
	Path    string `msgpack:"path" wire:"required,path"`
}

// SandboxRequest is the arguments of destroy and read_tags.
type SandboxRequest struct {
	Sandbox string `msgpack:"sandbox" wire:"required"`
}

// RenewRequest is renew's arguments.
type RenewRequest struct {
	Sandbox string  `msgpack:"sandbox" wire:"required"`
	TTLS    float64 `msgpack:"ttl_s" wire:"required,positive"`
}

// AttachRequest is attach's arguments.
type AttachRequest struct {
	Sandbox string `msgpack:"sandbox" wire:"required"`
	Owner   string `msgpack:"owner" wire:"required"`
	Holder  string `msgpack:"holder" wire:"required"`
}

// ReleaseRequest is release's arguments.
type ReleaseRequest struct {
	Sandbox string `msgpack:"sandbox" wire:"required"`
	Holder  string `msgpack:"holder" wire:"required"`
}

// WriteTagsRequest is write_tags's arguments.
type WriteTagsRequest struct {
	Sandbox string            `msgpack:"sandbox" wire:"required"`
	Tags    map[string]string `msgpack:"tags" wire:"required,max=32"`
}

// DestroyRunRequest is destroy_run's arguments.
type DestroyRunRequest struct {
	Owner string `msgpack:"owner" wire:"required"`
}

// ListRequest is list's arguments: an optional filter.
type ListRequest struct {
	Owner string `msgpack:"owner,omitempty"`
}

// GCRequest is gc's arguments.
type GCRequest struct {
	DryRun bool `msgpack:"dry_run,omitempty"`
}

// ImageRequest is the arguments of image_inspect and image_rm.
type ImageRequest struct {
	Name string `msgpack:"name" wire:"required"`
}

// ImageImportBeginRequest is image_import_begin's arguments: the name the
// image gets.
type ImageImportBeginRequest struct {
	Name string `msgpack:"name" wire:"required"`
}

// ImageImportDataRequest is image_import_data's arguments: the next piece
// of the archive, at Offset (the bytes sent so far).
type ImageImportDataRequest struct {
	Upload string `msgpack:"upload" wire:"required"`
	Offset int64  `msgpack:"offset" wire:"min=0,max=0x4000000000000000"`
	Data   []byte `msgpack:"data" wire:"required"`
}

// ImageImportEndRequest is image_import_end's arguments: the archive is
// whole (or, with Abort, given up).
type ImageImportEndRequest struct {
	Upload string `msgpack:"upload" wire:"required"`
	Abort  bool   `msgpack:"abort,omitempty"`
}

// StartCommandRequest is start_command's arguments: run_command's (without
// its output's bounds) and a Name that makes the start happen once.
// Without TimeoutS the process has no budget: it runs until it ends, is
// signalled or its sandbox ends.
type StartCommandRequest struct {
	Sandbox  string            `msgpack:"sandbox" wire:"required"`
	Command  string            `msgpack:"command,omitempty"`
	Argv     []string          `msgpack:"argv,omitempty" wire:"max=4096,nonempty"`
	Stdin    []byte            `msgpack:"stdin,omitempty"`
	Env      map[string]string `msgpack:"env,omitempty" wire:"max=256"`
	Cwd      string            `msgpack:"cwd,omitempty" wire:"path"`
	TimeoutS float64           `msgpack:"timeout_s,omitempty" wire:"positive"`
	Name     string            `msgpack:"name,omitempty"`
}

// ReadOutputRequest is read_output's arguments. Stream is "stdout" or
// "stderr"; MaxBytes nil for the daemon's default output bytes; WaitS how
// long to wait for bytes (or the end) when there are none at Offset yet.
type ReadOutputRequest struct {
	Sandbox  string  `msgpack:"sandbox" wire:"required"`
	Process  string  `msgpack:"process" wire:"required"`
	Stream   string  `msgpack:"stream" wire:"required"`
	Offset   int64   `msgpack:"offset,omitempty" wire:"min=0"`
	MaxBytes *int    `msgpack:"max_bytes,omitempty" wire:"min=1,max=2147483647"`
	WaitS    float64 `msgpack:"wait_s,omitempty" wire:"positive"`
}

// WaitProcessRequest is wait_process's arguments: TimeoutS 0 (left out)
// answers at once.
type WaitProcessRequest struct {
	Sandbox  string  `msgpack:"sandbox" wire:"required"`
	Process  string  `msgpack:"process" wire:"required"`
	TimeoutS float64 `msgpack:"timeout_s,omitempty" wire:"positive"`
}

// SignalProcessRequest is signal_process's arguments: Signal is one of
// TERM, KILL, INT, HUP, USR1, USR2.
type SignalProcessRequest struct {
	Sandbox string `msgpack:"sandbox" wire:"required"`
	Process string `msgpack:"process" wire:"required"`
	Signal  string `msgpack:"signal" wire:"required"`
}

// RunCodeRequest is run_code's arguments: Code runs in Context (made on
// first use; "default" when left out).
type RunCodeRequest struct {
	Sandbox        string  `msgpack:"sandbox" wire:"required"`
	Code           string  `msgpack:"code" wire:"required"`
	Context        string  `msgpack:"context,omitempty"`
	TimeoutS       float64 `msgpack:"timeout_s,omitempty" wire:"positive"`
	MaxOutputBytes *int    `msgpack:"max_output_bytes,omitempty" wire:"min=0,max=2147483647"`
	Stream         bool    `msgpack:"stream,omitempty"`
}

// ContextRequest names one code context of a sandbox.
type ContextRequest struct {
	Sandbox string `msgpack:"sandbox" wire:"required"`
	Context string `msgpack:"context" wire:"required"`
}

// Requests maps each op to its arguments' type.
var Requests = map[string]any{
	"hello":          HelloRequest{},
	"health":         NoArgs{},
	"create":         CreateRequest{},
	"run_command":    RunCommandRequest{},
	"read_file":      ReadFileRequest{},
	"write_file":     WriteFileRequest{},
	"list_directory": ListDirectoryRequest{},
	"destroy":        SandboxRequest{},
	"renew":          RenewRequest{},
	"attach":         AttachRequest{},
	"release":        ReleaseRequest{},
	"read_tags":      SandboxRequest{},
	"write_tags":     WriteTagsRequest{},
	"destroy_run":    DestroyRunRequest{},
	"list":           ListRequest{},
	"gc":             GCRequest{},

	"image_ls":           NoArgs{},
	"image_inspect":      ImageRequest{},
	"image_rm":           ImageRequest{},
	"image_import_begin": ImageImportBeginRequest{},
	"image_import_data":  ImageImportDataRequest{},
	"image_import_end":   ImageImportEndRequest{},

	"start_command":  StartCommandRequest{},
	"read_output":    ReadOutputRequest{},
	"wait_process":   WaitProcessRequest{},
	"signal_process": SignalProcessRequest{},
	"list_processes": SandboxRequest{},

	"run_code":        RunCodeRequest{},
	"list_contexts":   SandboxRequest{},
	"restart_context": ContextRequest{},
	"delete_context":  ContextRequest{},
}
