package gvisor

// Images: a sandbox whose root comes from an image the operator imported.
// The OCI root is a small directory of mount points made once per image
// (.rootfs-<digest>), and every top-level entry of the image's unpacked
// root, and every entry of its /etc but passwd, group and hosts (the
// daemon's), is bound read-only onto it: the same unpacked root every
// bwrap sandbox of the image shares, never written by a sandbox.

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/statedir"
)

// imageSpec is the image a sandbox runs on, as spec.json keeps it.
type imageSpec struct {
	Name   string   `json:"name"`
	Digest string   `json:"digest"`
	Root   string   `json:"root"`
	Env    []string `json:"env,omitempty"`
	Shell  bool     `json:"shell"`
}

// guestOwned are the top-level names of the guest's root that never come
// from an image; etcOwn the /etc files that are the daemon's.
var (
	guestOwned = []string{"proc", "dev", "sys", "tmp", "workspace", "etc", strings.TrimPrefix(guestInit, "/")}
	etcOwn     = []string{"passwd", "group", "hosts"}
)

// checkImage says whether this backend can run sandboxes on im, and returns
// what spec.json keeps of it.
func (b *Backend) checkImage(im backend.Image) (*imageSpec, error) {
	if im.IsHost() {
		return nil, nil
	}
	if !b.static {
		return nil, fmt.Errorf("%w: image %s cannot run here: the sandboxes' init (%s) is dynamically linked and needs the host's loader, which an image does not have; install a statically linked build (CGO_ENABLED=0 go build -buildmode=exe)",
			backend.ErrSpecUnenforceable, backend.ShortName(im.Name), b.exe)
	}
	if fi, err := os.Stat(im.Root); err != nil || !fi.IsDir() || !filepath.IsAbs(im.Root) || im.Digest == "" {
		return nil, fmt.Errorf("%w: image %s has no unpacked root at %q; import it again", backend.ErrUnavailable, backend.ShortName(im.Name), im.Root)
	}
	return &imageSpec{Name: im.Name, Digest: im.Digest, Root: im.Root, Env: slices.Clone(im.Env), Shell: backend.HasShell(im.Root)}, nil
}

// imageRootfs returns the mount-point directory of image img, making it
// when this daemon has not yet.
func (b *Backend) imageRootfs(img *imageSpec) (string, error) {
	hex := strings.TrimPrefix(img.Digest, "sha256:")
	if len(hex) < 16 || strings.ContainsAny(hex, "/.") {
		return "", fmt.Errorf("%w: image %s has a bad digest %q", backend.ErrUnavailable, backend.ShortName(img.Name), img.Digest)
	}
	dir := filepath.Join(b.cfg.Dir, ".rootfs-"+hex[:32])
	b.imageMu.Lock()
	defer b.imageMu.Unlock()
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	if err := makeImageRootfs(dir, img.Root); err != nil {
		return "", fmt.Errorf("%w: cannot prepare the root of image %s: %v", backend.ErrUnavailable, backend.ShortName(img.Name), err)
	}
	return dir, nil
}

// makeImageRootfs makes dir: a mount point for each entry imageMounts
// binds, the image's top-level symlinks and /etc symlinks as themselves,
// the daemon's /etc files, and the directories the bundle mounts on.
func makeImageRootfs(dir, root string) error {
	tmp := dir + ".new"
	if err := statedir.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(tmp, "etc"), 0o755); err != nil {
		return err
	}
	for _, d := range []string{"proc", "dev", "sys", "tmp", "workspace"} {
		if err := os.Mkdir(filepath.Join(tmp, d), 0o755); err != nil {
			return err
		}
	}
	if err := stubEntries(root, tmp, guestOwned); err != nil {
		return err
	}
	if err := stubEntries(filepath.Join(root, "etc"), filepath.Join(tmp, "etc"), backend.ImageEtcLeftOut); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, name := range etcOwn {
		if err := os.WriteFile(filepath.Join(tmp, "etc", name), []byte(etcFiles[name]), 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, guestInit), nil, 0o755); err != nil {
		return err
	}
	// Whatever the daemon's umask (the packaged unit's is 0077).
	if err := exactModes(tmp); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

// stubEntries makes in dst, for each entry of src but skip, an empty
// mount point (a directory or file) or the same symlink.
func stubEntries(src, dst string, skip []string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if slices.Contains(skip, e.Name()) {
			continue
		}
		p := filepath.Join(dst, e.Name())
		switch t := e.Type(); {
		case t&os.ModeSymlink != 0:
			target, err := os.Readlink(filepath.Join(src, e.Name()))
			if err != nil {
				return err
			}
			err = os.Symlink(target, p)
			if err != nil {
				return err
			}
		case t.IsDir():
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
		case t.IsRegular():
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// imageMounts are the read-only binds of an image's entries.
func imageMounts(root string) ([]ociMount, error) {
	var out []ociMount
	add := func(src, dstDir string, skip []string) error {
		ents, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
		for _, e := range ents {
			if slices.Contains(skip, e.Name()) || !(e.Type().IsDir() || e.Type().IsRegular()) {
				continue
			}
			opts := []string{"rbind", "ro", "nosuid", "nodev"}
			if e.Type().IsRegular() {
				opts = []string{"bind", "ro", "nosuid", "nodev"}
			}
			out = append(out, ociMount{Destination: dstDir + e.Name(), Type: "bind", Source: filepath.Join(src, e.Name()), Options: opts})
		}
		return nil
	}
	if err := add(root, "/", guestOwned); err != nil {
		return nil, err
	}
	if err := add(filepath.Join(root, "etc"), "/etc/", backend.ImageEtcLeftOut); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return out, nil
}

// baseEnvOf is sb's commands' environment before the sandbox's and the
// request's: an image's config Env over baseEnv (HOME stays the workspace).
func (sb *sandbox) baseEnvOf() map[string]string {
	if sb.image == nil || len(sb.image.Env) == 0 {
		return baseEnv
	}
	env := maps.Clone(baseEnv)
	for k, v := range (backend.Image{Env: sb.image.Env}).EnvMap() {
		if k != "HOME" {
			env[k] = v
		}
	}
	return env
}
