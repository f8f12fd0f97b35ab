package main

// The daemon's image store as service's snapshots and exports see it.

import (
	"context"
	"fmt"
	"io"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/image"
	"github.com/sandbox-sidecar/sandbox-sidecar/service"
)

var (
	_ service.ImageSnapshotter = storeImages{}
	_ service.ImageExporter    = storeImages{}
)

// Snapshot makes a sandbox's files the store's image name, over the
// store's image the sandbox runs on (none for the host's root).
func (a storeImages) Snapshot(ctx context.Context, name string, src lifecycle.SnapshotSource) (backend.Image, error) {
	if src.Image != backend.HostImage && src.ImageDigest == "" {
		return backend.Image{}, fmt.Errorf("%w: sandbox %s runs on image %s, whose digest its record lacks (made by an older daemon); snapshot a newer sandbox", backend.ErrUnsupported, src.Sandbox, backend.ShortName(src.Image))
	}
	dirs := map[string]string{}
	if src.Files.Workspace != "" {
		dirs[image.WorkspaceDir] = src.Files.Workspace
	}
	if src.Files.Tmp != "" {
		dirs[image.TmpDir] = src.Files.Tmp
	}
	uid := src.UID
	in, err := a.s.Snapshot(ctx, name, image.SnapshotSource{BaseDigest: src.ImageDigest, Dirs: dirs, ReadAs: src.Files.ReadAs, Memory: src.Files.Memory,
		Origin: image.Origin{Sandbox: src.Sandbox, BaseImage: src.Image, BaseDigest: src.ImageDigest, UID: &uid}})
	if err != nil {
		return backend.Image{}, storeErr(err)
	}
	if err := letSandboxesIn(in.Root); err != nil {
		return backend.Image{}, fmt.Errorf("%w: snapshot %s was taken, but the sandboxes' uids cannot reach its root: %v", backend.ErrUnavailable, name, err)
	}
	return toImage(in), nil
}

// Export writes image name as one tar layer.
func (a storeImages) Export(ctx context.Context, name string, w io.Writer) (backend.Image, error) {
	in, err := a.s.Export(ctx, name, w)
	if err != nil {
		return backend.Image{}, storeErr(err)
	}
	return toImage(in), nil
}

// imageOrigin is the store's origin of a snapshot as the backend's.
func imageOrigin(o *image.Origin) *backend.ImageOrigin {
	if o == nil {
		return nil
	}
	return &backend.ImageOrigin{Sandbox: o.Sandbox, BaseImage: o.BaseImage, BaseDigest: o.BaseDigest, Taken: o.Taken, UID: o.UID}
}
