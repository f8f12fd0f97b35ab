package main

// The daemon's images: the image store (sandbox/image) for the backends
// that run an unpacked root (bwrap, gvisor), the operator's allowed templates for
// sbx (which pulls them itself), adapted to what lifecycle and service
// ask of them.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/sbx"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/image"
	"github.com/sandbox-sidecar/sandbox-sidecar/service"
)

// imagesDirName is the store's directory in the state directory.
const imagesDirName = "images"

// daemonImages are the images of one daemon: what the manager resolves
// (lifecycle.Images, nil: host only) and what the image ops change
// (service.ImageStore, nil: no import or rm).
type daemonImages struct {
	list  lifecycle.Images
	store service.ImageStore
}

// openImages opens the images backend be can run.
func openImages(cfg Config, be backend.Backend, log hclog.Logger) (daemonImages, error) {
	switch b := be.(type) {
	case *bwrap.Backend, *gvisor.Backend:
		st, err := image.Open(filepath.Join(cfg.Server.StateDir, imagesDirName),
			image.Limits{MaxBytes: cfg.Images.MaxBytes.Bytes(), MaxFiles: cfg.Images.MaxFiles}, log.Named("images"))
		if err != nil {
			return daemonImages{}, fmt.Errorf("image store: %w", err)
		}
		st.SetFailpoint(failpointFromEnv(log))
		s := storeImages{st}
		for _, in := range st.List() {
			if err := letSandboxesIn(in.Root); err != nil {
				log.Warn("the sandboxes' uids cannot reach an image's root; its sandboxes will fail", "image", in.Name, "error", err)
			}
		}
		return daemonImages{list: s, store: s}, nil
	case *sbx.Backend:
		return daemonImages{list: sbxTemplates{b}}, nil
	}
	return daemonImages{}, nil
}

// storeImages adapts the image store.
type storeImages struct{ s *image.Store }

func toImage(in image.Info) backend.Image {
	return backend.Image{Name: in.Name, Digest: in.Digest, Root: in.Root, Env: in.Env, Entrypoint: in.Entrypoint, Cmd: in.Cmd,
		WorkingDir: in.WorkingDir, User: in.User, Bytes: in.Bytes, Files: in.Files, Imported: in.Created, Source: in.Source,
		Base: in.Base, Origin: imageOrigin(in.Origin), Memory: in.Memory}
}

// storeErr gives the store's errors the backend's image errors, which
// service maps to their wire codes.
func storeErr(err error) error {
	for _, m := range []struct{ from, to error }{
		{image.ErrNotFound, backend.ErrImageNotFound},
		{image.ErrExists, backend.ErrImageExists},
		{image.ErrTooLarge, backend.ErrImageTooLarge},
		{image.ErrBadImage, backend.ErrBadImage},
		{image.ErrBadName, backend.ErrInvalidArgument},
		{image.ErrNoSpace, backend.ErrNoSpace},
	} {
		if errors.Is(err, m.from) {
			return fmt.Errorf("%w: %v", m.to, err)
		}
	}
	return err
}

func (a storeImages) Get(name string) (backend.Image, error) {
	in, err := a.s.Get(name)
	if err != nil {
		return backend.Image{}, storeErr(err)
	}
	return toImage(in), nil
}

func (a storeImages) List() []backend.Image {
	var out []backend.Image
	for _, in := range a.s.List() {
		out = append(out, toImage(in))
	}
	return out
}

func (a storeImages) Import(ctx context.Context, r io.Reader, name string) (backend.Image, error) {
	in, err := a.s.ImportArchive(ctx, r, name)
	if err != nil {
		return backend.Image{}, storeErr(err)
	}
	if err := letSandboxesIn(in.Root); err != nil {
		return backend.Image{}, fmt.Errorf("%w: image %s was imported, but the sandboxes' uids cannot reach its root: %v", backend.ErrUnavailable, name, err)
	}
	return toImage(in), nil
}

func (a storeImages) Remove(name string) error { return storeErr(a.s.Remove(name)) }

// GC removes what interrupted imports and removals left (service's gc).
func (a storeImages) GC() (int, error) { return a.s.GC() }

// sbxTemplates are the sbx backend's allowed templates, as images.
type sbxTemplates struct{ b *sbx.Backend }

func (t sbxTemplates) Get(name string) (backend.Image, error) {
	for _, im := range t.b.Images() {
		if im.Name == name {
			return im, nil
		}
	}
	return backend.Image{}, backend.ErrImageNotFound
}

func (t sbxTemplates) List() []backend.Image { return t.b.Images() }

// letSandboxesIn lets every uid search the directory holding an image's
// root (never list or write it): bwrap binds the root as the sandbox's uid,
// and the store makes that directory with the daemon's umask, which the
// packaged unit sets to 0077.
func letSandboxesIn(root string) error {
	dir := filepath.Dir(root)
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o011 == 0o011 {
		return nil
	}
	return os.Chmod(dir, fi.Mode().Perm()|0o711)
}
