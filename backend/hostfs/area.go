package hostfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// The two guest directories file operations may reach, and the names of
// the host directories (under a sandbox's data directory) bound there.
// The bubblewrap and gVisor backends share this layout.
const (
	GuestWorkspace = "/workspace"
	GuestTmp       = "/tmp"
	WorkDirName    = "work" // bound at /workspace
	TmpDirName     = "tmp"  // bound at /tmp
)

// Area is one of the two host directories file operations may reach.
type Area struct {
	Name string // WorkDirName or TmpDirName
	Rel  string // path relative to it, "." for the directory itself
}

// GuestPath is where p leads as the guest names it, for a backend that
// opens it inside the sandbox as its guest: a relative path starts at
// /workspace. It is not cleaned: '..' after a symlink is the guest
// kernel's business, as in a shell. Only what cannot be a path is refused.
func GuestPath(p string) (string, error) {
	switch {
	case p == "":
		return "", fmt.Errorf("%w: the path is empty; give an absolute path in the sandbox, or one relative to %s", backend.ErrBadPath, GuestWorkspace)
	case strings.IndexByte(p, 0) >= 0:
		return "", fmt.Errorf("%w: the path contains a NUL byte", backend.ErrBadPath)
	}
	if !path.IsAbs(p) {
		p = GuestWorkspace + "/" + p
	}
	if len(p) > backend.MaxGuestPathLen {
		return "", fmt.Errorf("%w: the path is %d bytes long, more than the %d allowed", backend.ErrBadPath, len(p), backend.MaxGuestPathLen)
	}
	return p, nil
}

// ResolveGuestPath maps a path as the guest sees it onto the sandbox's
// /workspace or /tmp, the only places a write may go (a backend that opens
// reads inside the sandbox, as its guest, takes any path for those). Relative paths start at /workspace. Anything else is
// refused; so are NUL bytes and the empty path. Symlinks are not resolved
// here: os.Root does that, confined to the area.
func ResolveGuestPath(p string) (Area, error) {
	const confined = "writes (and reads, on a backend without a view of its own) are confined to /workspace and /tmp (relative paths start at /workspace); use run_command for other paths"
	switch {
	case p == "":
		return Area{}, fmt.Errorf("%w: the path is empty; %s", backend.ErrBadPath, confined)
	case strings.IndexByte(p, 0) >= 0:
		return Area{}, fmt.Errorf("%w: the path contains a NUL byte; %s", backend.ErrBadPath, confined)
	case len(p) > backend.MaxGuestPathLen:
		return Area{}, fmt.Errorf("%w: the path is %d bytes long, more than the %d allowed", backend.ErrBadPath, len(p), backend.MaxGuestPathLen)
	}
	clean := p
	if !path.IsAbs(clean) {
		clean = GuestWorkspace + "/" + clean
	}
	clean = path.Clean(clean)
	for _, a := range []struct{ guest, name string }{{GuestWorkspace, WorkDirName}, {GuestTmp, TmpDirName}} {
		if clean == a.guest {
			return Area{Name: a.name, Rel: "."}, nil
		}
		if rel, ok := strings.CutPrefix(clean, a.guest+"/"); ok {
			return Area{Name: a.name, Rel: rel}, nil
		}
	}
	return Area{}, fmt.Errorf("%w: %s is outside the sandbox's files; %s", backend.ErrBadPath, backend.ShortName(p), confined)
}

// OpenArea resolves the guest path p of sandbox id, whose work/ and tmp/
// directories are in dataDir, and opens its area as an os.Root; it returns
// the root and p relative to it. A missing area is backend.NotFound(id):
// the sandbox is being destroyed.
func OpenArea(dataDir, id, p string) (*os.Root, string, error) {
	a, err := ResolveGuestPath(p)
	if err != nil {
		return nil, "", err
	}
	root, err := os.OpenRoot(filepath.Join(dataDir, a.Name))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, "", backend.NotFound(id)
		}
		return nil, "", fmt.Errorf("open the files of sandbox %s: %w", id, err)
	}
	return root, a.Rel, nil
}
