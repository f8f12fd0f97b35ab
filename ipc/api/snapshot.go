package api

// Snapshots, forks and image exports (docs/protocol.md, "Snapshots and
// forks", "image_export"). Their types register themselves in Results and
// Requests below, kept apart from the rest of the ops.

// SnapshotRequest is snapshot's arguments: the sandbox whose files become
// image Name. Memory keeps its processes and their memory too (a gVisor
// checkpoint; other backends refuse it with not_supported).
type SnapshotRequest struct {
	Sandbox string `msgpack:"sandbox" wire:"required"`
	Name    string `msgpack:"name" wire:"required"`
	Memory  bool   `msgpack:"memory,omitempty"`
}

// SnapshotResult is snapshot's result: the new image, where it came from,
// and whether the sandbox's processes were frozen while its files were
// copied.
type SnapshotResult struct {
	Image      string  `msgpack:"image"`
	Digest     string  `msgpack:"digest"`
	SizeBytes  int64   `msgpack:"size_bytes"`
	Files      int64   `msgpack:"files"`
	BaseImage  string  `msgpack:"base_image"`
	Frozen     bool    `msgpack:"frozen"`
	DurationMS float64 `msgpack:"duration_ms"`
}

// ForkRequest is fork's arguments: Count new sandboxes as copies of
// Sandbox, with its owner and lease unless Owner or TTLS is given.
type ForkRequest struct {
	Sandbox string  `msgpack:"sandbox" wire:"required"`
	Count   int     `msgpack:"count" wire:"required,min=1,max=16"`
	Owner   string  `msgpack:"owner,omitempty"`
	TTLS    float64 `msgpack:"ttl_s,omitempty" wire:"positive"`
	Memory  bool    `msgpack:"memory,omitempty"`
}

// ForkResult is fork's result: the new sandboxes' ids, in order, and
// whether the source was frozen while its files were copied.
type ForkResult struct {
	Sandboxes []string `msgpack:"sandboxes"`
	ExpiresAt float64  `msgpack:"expires_at"`
	Frozen    bool     `msgpack:"frozen"`
}

// ImageOrigin is where a snapshot came from (ImageInfo.Origin).
type ImageOrigin struct {
	Sandbox    string  `msgpack:"sandbox" json:"sandbox"`
	BaseImage  string  `msgpack:"base_image" json:"base_image"`
	BaseDigest string  `msgpack:"base_digest,omitempty" json:"base_digest,omitempty"`
	TakenAt    float64 `msgpack:"taken_at,omitempty" json:"taken_at,omitempty"`
	// UID is the uid that took it (absent for one pulled from a
	// registry): only it and admins run sandboxes on it or remove it.
	UID *uint32 `msgpack:"uid,omitempty" json:"uid,omitempty"`
}

// ImageExportBeginRequest is image_export_begin's arguments.
type ImageExportBeginRequest struct {
	Name string `msgpack:"name" wire:"required"`
}

// ImageExportBeginResult is image_export_begin's result: the export's id,
// the most one image_export_data answers with, and the image.
type ImageExportBeginResult struct {
	Export        string    `msgpack:"export"`
	MaxChunkBytes int       `msgpack:"max_chunk_bytes"`
	Image         ImageInfo `msgpack:"image"`
}

// ImageExportDataRequest is image_export_data's arguments: the next piece
// from Offset (the bytes received so far).
type ImageExportDataRequest struct {
	Export string `msgpack:"export" wire:"required"`
	Offset int64  `msgpack:"offset" wire:"min=0,max=0x4000000000000000"`
}

// ImageExportDataResult is image_export_data's result: Data from the
// offset asked; EOF once the layer is whole.
type ImageExportDataResult struct {
	Data []byte `msgpack:"data"`
	EOF  bool   `msgpack:"eof"`
}

// ImageExportEndRequest is image_export_end's arguments.
type ImageExportEndRequest struct {
	Export string `msgpack:"export" wire:"required"`
}

// ImageExportEndResult is image_export_end's result: the bytes sent.
type ImageExportEndResult struct {
	SentBytes int64 `msgpack:"sent_bytes"`
}

func init() {
	for op, types := range map[string][2]any{
		"snapshot":           {SnapshotRequest{}, SnapshotResult{}},
		"fork":               {ForkRequest{}, ForkResult{}},
		"image_export_begin": {ImageExportBeginRequest{}, ImageExportBeginResult{}},
		"image_export_data":  {ImageExportDataRequest{}, ImageExportDataResult{}},
		"image_export_end":   {ImageExportEndRequest{}, ImageExportEndResult{}},
	} {
		Requests[op], Results[op] = types[0], types[1]
	}
}
