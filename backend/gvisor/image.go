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
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/moby/sys/mountinfo"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/registry"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/statedir"
)

// imageSpec is the image a sandbox runs on, as spec.json keeps it.
type imageSpec = backend.ImageSpec

// guestOwned are the top-level names of the guest's root that never come
// from an image; etcOwn the /etc files that are the daemon's.
var (
	guestOwned = []string{"proc", "dev", "sys", "tmp", "workspace", "etc", strings.TrimPrefix(guestInit, "/"), strings.TrimPrefix(guestProcs, "/")}
	etcOwn     = []string{"passwd", "group", "hosts", "resolv.conf"}
	// imageEtcSkip are the image's /etc entries neither stubbed nor bound:
	// those that never enter a guest, and resolv.conf (the daemon's).
	imageEtcSkip = append(slices.Clone(backend.ImageEtcLeftOut), "resolv.conf")
)

// checkImage says whether this backend can run sandboxes on im, and returns
// what spec.json keeps of it.
func (b *Backend) checkImage(im backend.Image) (*imageSpec, error) {
	if im.RunsOnHost() {
		// The host's root (a snapshot of a sandbox on it only seeds the
		// sandbox's own directories).
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

// imageRootfsPrefix begins the name, in Dir, of an image's mount-point
// root: .rootfs-<the first 32 hex digits of its digest>.
const imageRootfsPrefix = rootfsName + "-"

// imageRootfsName is the name in Dir of the mount-point root of the image
// of digest; false for a digest that cannot name one.
func imageRootfsName(digest string) (string, bool) {
	hex := strings.TrimPrefix(digest, "sha256:")
	if len(hex) < 16 || strings.ContainsAny(hex, "/.") {
		return "", false
	}
	return imageRootfsPrefix + hex[:min(len(hex), 32)], true
}

// imageRootfs returns the mount-point directory of image img, making it
// when this daemon has not yet.
func (b *Backend) imageRootfs(img *imageSpec) (string, error) {
	b.imageMu.Lock()
	defer b.imageMu.Unlock()
	return b.imageRootfsLocked(img)
}

// imageRootfsLocked is imageRootfs with b.imageMu held.
func (b *Backend) imageRootfsLocked(img *imageSpec) (string, error) {
	name, ok := imageRootfsName(img.Digest)
	if !ok {
		return "", fmt.Errorf("%w: image %s has a bad digest %q", backend.ErrUnavailable, backend.ShortName(img.Name), img.Digest)
	}
	dir := filepath.Join(b.cfg.Dir, name)
	if _, err := os.Stat(dir); err == nil {
		// One made by an older daemon may lack the daemon's resolv.conf
		// (or hold the image's, a symlink perhaps): the mount point an
		// allowlist sandbox binds its own over.
		// Nor the mount point of the sandbox's processes.
		err := ownResolvConf(dir)
		if err == nil {
			err = os.Mkdir(filepath.Join(dir, guestProcs), 0o755)
			if errors.Is(err, fs.ErrExist) {
				err = nil
			} else if err == nil {
				err = os.Chmod(filepath.Join(dir, guestProcs), 0o755) // whatever the umask
			}
		}
		if err != nil {
			return "", fmt.Errorf("%w: cannot prepare the root of image %s: %v", backend.ErrUnavailable, backend.ShortName(img.Name), err)
		}
		return dir, nil
	}
	if err := makeImageRootfs(dir, img.Root); err != nil {
		return "", fmt.Errorf("%w: cannot prepare the root of image %s: %v", backend.ErrUnavailable, backend.ShortName(img.Name), err)
	}
	return dir, nil
}

// holdImageRootfs is imageRootfs for a create: until release, PruneImages
// keeps the root, which the create's sandbox has no settings on disk yet
// to claim.
func (b *Backend) holdImageRootfs(img *imageSpec) (release func(), err error) {
	b.imageMu.Lock()
	defer b.imageMu.Unlock()
	dir, err := b.imageRootfsLocked(img)
	if err != nil {
		return nil, err
	}
	name := filepath.Base(dir)
	b.imageHolds[name]++
	return func() {
		b.imageMu.Lock()
		defer b.imageMu.Unlock()
		if b.imageHolds[name]--; b.imageHolds[name] <= 0 {
			delete(b.imageHolds, name)
		}
	}, nil
}

var _ backend.ImagePruner = (*Backend)(nil)

// PruneImages removes the mount-point roots of the images whose digests
// are not in keep, but never one that a sandbox in Dir runs on (its
// settings name the image) or a create is making, nor one with anything
// mounted below it; and what an interrupted making of one left
// (.rootfs-<hex>.new). A root it removed is made again by the next sandbox
// of its image, should the image come back.
func (b *Backend) PruneImages(keep []string) (int, error) {
	b.imageMu.Lock()
	defer b.imageMu.Unlock()
	wanted := map[string]bool{}
	for _, d := range keep {
		if name, ok := imageRootfsName(d); ok {
			wanted[name] = true
		}
	}
	used, err := b.imagesInUse()
	if err != nil {
		return 0, fmt.Errorf("gvisor backend: images' roots kept: %w", err)
	}
	ents, err := os.ReadDir(b.cfg.Dir)
	if err != nil {
		return 0, fmt.Errorf("gvisor backend: images' roots kept: %w", err)
	}
	removed := 0
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, imageRootfsPrefix) {
			continue
		}
		_, partial := strings.CutSuffix(name, ".new")
		if !partial && (wanted[name] || used[name] || b.imageHolds[name] > 0) {
			continue
		}
		dir := filepath.Join(b.cfg.Dir, name)
		// Only mount points and stubs live here; a mount on one (no
		// runsc of ours makes any in the daemon's namespace) would make
		// RemoveAll delete what it shows.
		if mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir)); err != nil || len(mounts) > 0 {
			errs = append(errs, fmt.Errorf("%s kept: something is mounted below it (%d mounts, %v)", dir, len(mounts), err))
			continue
		}
		if err := statedir.RemoveAll(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		if !partial {
			removed++
			b.log.Info("removed the root of an image no longer in the store", "dir", name)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("gvisor backend: %w", err)
	}
	return removed, nil
}

// imagesInUse are the names of the mount-point roots that sandboxes in
// Dir run on, as their settings say; a sandbox without readable settings
// runs on nothing (a create in progress holds its root instead). An error
// reading the state directory or a settings file is returned: nothing is
// known to be unused then. b.imageMu is held.
func (b *Backend) imagesInUse() (map[string]bool, error) {
	ids, err := statedir.SandboxIDs(b.cfg.Dir)
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	for _, id := range ids {
		var spec struct {
			Image *struct {
				Digest string `json:"digest"`
			} `json:"image"`
		}
		err := statedir.ReadSettings(b.sandboxDir(id), registry.SpecName, id, registry.MaxSpecBytes, &spec)
		if errors.Is(err, backend.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if spec.Image != nil {
			if name, ok := imageRootfsName(spec.Image.Digest); ok {
				used[name] = true
			}
		}
	}
	return used, nil
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
	for _, d := range []string{"proc", "dev", "sys", "tmp", "workspace", strings.TrimPrefix(guestProcs, "/")} {
		if err := os.Mkdir(filepath.Join(tmp, d), 0o755); err != nil {
			return err
		}
	}
	if err := stubEntries(root, tmp, guestOwned); err != nil {
		return err
	}
	if err := stubEntries(filepath.Join(root, "etc"), filepath.Join(tmp, "etc"), imageEtcSkip); err != nil && !errors.Is(err, os.ErrNotExist) {
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

// ownResolvConf makes dir/etc/resolv.conf the daemon's empty regular file
// if it is anything else.
func ownResolvConf(dir string) error {
	p := filepath.Join(dir, "etc", "resolv.conf")
	if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm() == 0o644 {
		return nil
	}
	if err := os.RemoveAll(p); err != nil {
		return err
	}
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		return err
	}
	return os.Chmod(p, 0o644)
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
	if err := add(filepath.Join(root, "etc"), "/etc/", imageEtcSkip); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return out, nil
}

// baseEnvOf is sb's commands' environment before the sandbox's and the
// request's: an image's config Env over baseEnv (HOME stays the workspace).
func (sb *sandbox) baseEnvOf() map[string]string {
	if sb.image == nil {
		return baseEnv
	}
	return backend.Image{Env: sb.image.Env}.EnvOver(baseEnv)
}
