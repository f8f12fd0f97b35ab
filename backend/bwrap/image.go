package bwrap

// Images: a sandbox whose root filesystem is an image the operator
// imported (backend.Image) rather than the host's /usr.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// imageSpec is the image a sandbox runs on, as spec.json keeps it.
type imageSpec = backend.ImageSpec

// guestOwned are the top-level directories of the guest's root that never
// come from an image: bwrap makes them (/proc, /dev), the sandbox's own
// (/workspace, /tmp), or left out as they are on the host image (/sys).
// /etc is built entry by entry (imageEtc).
var guestOwned = []string{"proc", "dev", "sys", "tmp", "workspace", "etc"}

// checkImage says whether this backend can run sandboxes on im now, and
// returns what spec.json keeps of it.
func (b *Backend) checkImage(im backend.Image) (*imageSpec, error) {
	if im.RunsOnHost() {
		// The host's root (a snapshot of a sandbox on it only seeds the
		// sandbox's own directories).
		return nil, nil
	}
	if !b.static {
		return nil, fmt.Errorf("%w: image %s cannot run here: the daemon's binary (each sandbox's init) is dynamically linked and needs the host's loader, which an image does not have; install a statically linked build (CGO_ENABLED=0 go build -buildmode=exe)",
			backend.ErrSpecUnenforceable, backend.ShortName(im.Name))
	}
	fi, err := os.Stat(im.Root)
	if err != nil || !fi.IsDir() || !filepath.IsAbs(im.Root) {
		return nil, fmt.Errorf("%w: image %s has no unpacked root at %q (%v); import it again", backend.ErrUnavailable, backend.ShortName(im.Name), im.Root, err)
	}
	// bwrap runs as the sandbox's uid: it must reach the root to bind it.
	// Any uid of the range stands for all of them (none owns the store).
	other, otherGID := b.cfg.SandboxUID, b.cfg.SandboxGID
	if b.uids != nil {
		other, otherGID = int(b.cfg.UIDRange.First), int(b.cfg.UIDRange.First)
	}
	if other >= 0 {
		if err := checkReachable(im.Root, other, otherGID); err != nil {
			return nil, fmt.Errorf("%w: image %s cannot be bound by the sandboxes' uids: %v", backend.ErrUnavailable, backend.ShortName(im.Name), err)
		}
	}
	return &imageSpec{Name: im.Name, Digest: im.Digest, Root: im.Root, Env: slices.Clone(im.Env), Shell: backend.HasShell(im.Root)}, nil
}

// imageRootOptions returns the bwrap options that build the guest's root
// from image root: every top-level entry but guestOwned, read-only (a
// symlink recreated as itself, never followed on the host), and /etc as a
// directory of the image's entries but etcSkip (backend.ImageEtcLeftOut:
// passwd, group and hosts, which the caller binds, the shadow databases;
// and resolv.conf where the daemon gives its own).
// The root itself is never bound whole: bwrap could not make its mount
// points (/workspace, /etc/passwd) in a read-only tree shared by every
// sandbox of the image.
func imageRootOptions(root string, etcSkip []string) ([]string, error) {
	var o []string
	top, err := entries(root, guestOwned)
	if err != nil {
		return nil, err
	}
	o = append(o, top...)
	o = append(o, "--perms", "0755", "--dir", "/etc")
	etc, err := entries(filepath.Join(root, "etc"), etcSkip)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	return append(o, prefixDest(etc, "/etc")...), nil
}

// entries returns bwrap options recreating the entries of dir at "/" (the
// caller prefixes them), except those named in skip: a directory or a
// regular file read-only bound, a symlink made again with its target.
// Devices, FIFOs and sockets are left out.
func entries(dir string, skip []string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	var o []string
	for _, e := range ents {
		name := e.Name()
		if slices.Contains(skip, name) {
			continue
		}
		host := filepath.Join(dir, name)
		switch t := e.Type(); {
		case t&os.ModeSymlink != 0:
			target, err := os.Readlink(host)
			if err != nil {
				return nil, err
			}
			o = append(o, "--symlink", target, "/"+name)
		case t.IsDir(), t.IsRegular():
			o = append(o, "--ro-bind", host, "/"+name)
		}
	}
	return o, nil
}

// prefixDest moves the destinations of entries' options under dir.
func prefixDest(opts []string, dir string) []string {
	out := slices.Clone(opts)
	for i := 0; i+2 < len(out); i += 3 {
		out[i+2] = dir + out[i+2]
	}
	return out
}

// baseEnv is sb's commands' environment before the sandbox's and the
// request's: baseEnv, with an image's config Env over it (its PATH and
// such; HOME stays the workspace).
func (sb *sandbox) baseEnv() map[string]string {
	if sb.image == nil {
		return baseEnv
	}
	return backend.Image{Env: sb.image.Env}.EnvOver(baseEnv)
}

// readImageRoot sets sb.imageOpts from its image's root.
func (sb *sandbox) readImageRoot() error {
	if sb.image == nil {
		return nil
	}
	skip := backend.ImageEtcLeftOut
	if sb.network == networkAllowlist {
		// The daemon's egress resolver is the sandbox's resolv.conf.
		skip = append(slices.Clone(skip), "resolv.conf")
	}
	opts, err := imageRootOptions(sb.image.Root, skip)
	if err != nil {
		return fmt.Errorf("%w: cannot read the root of image %s for sandbox %s: %v; import the image again", backend.ErrUnavailable, backend.ShortName(sb.image.Name), sb.id, err)
	}
	sb.imageOpts = opts
	return nil
}
