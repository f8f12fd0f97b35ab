package bwrap

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
)

// writeTempPrefix names WriteFile's temporary files.
const writeTempPrefix = hostfs.TempPrefix

// guestArea is one of the two host directories file operations may reach.
type guestArea struct {
	name string // workDirName or tmpDirName
	rel  string // path relative to it, "." for the directory itself
}

// resolveGuestPath maps a path as the guest sees it onto the sandbox's
// /workspace or /tmp. Relative paths start at /workspace. Anything else is
// refused; so are NUL bytes and the empty path. Symlinks are not resolved
// here: os.Root does that, confined to the area.
func resolveGuestPath(p string) (guestArea, error) {
	const confined = "file operations are confined to /workspace and /tmp (relative paths start at /workspace); use run_command to read other paths"
	switch {
	case p == "":
		return guestArea{}, fmt.Errorf("%w: the path is empty; %s", backend.ErrBadPath, confined)
	case strings.IndexByte(p, 0) >= 0:
		return guestArea{}, fmt.Errorf("%w: the path contains a NUL byte; %s", backend.ErrBadPath, confined)
	case len(p) > backend.MaxGuestPathLen:
		return guestArea{}, fmt.Errorf("%w: the path is %d bytes long, more than the %d allowed", backend.ErrBadPath, len(p), backend.MaxGuestPathLen)
	}
	clean := p
	if !path.IsAbs(clean) {
		clean = guestWorkspace + "/" + clean
	}
	clean = path.Clean(clean)
	for _, a := range []struct{ guest, name string }{{guestWorkspace, workDirName}, {guestTmp, tmpDirName}} {
		if clean == a.guest {
			return guestArea{name: a.name, rel: "."}, nil
		}
		if rel, ok := strings.CutPrefix(clean, a.guest+"/"); ok {
			return guestArea{name: a.name, rel: rel}, nil
		}
	}
	return guestArea{}, fmt.Errorf("%w: %s is outside the sandbox's files; %s", backend.ErrBadPath, backend.ShortName(p), confined)
}

// openArea resolves p and opens its area as an os.Root.
func openArea(sb *sandbox, p string) (*os.Root, string, error) {
	a, err := resolveGuestPath(p)
	if err != nil {
		return nil, "", err
	}
	root, err := os.OpenRoot(filepath.Join(sb.dataDir(), a.name))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, "", backend.NotFound(sb.id)
		}
		return nil, "", fmt.Errorf("open the files of sandbox %s: %w", sb.id, err)
	}
	return root, a.rel, nil
}

// fileOp registers a file operation on sandbox id, so Destroy waits for it.
func (b *Backend) fileOp(ctx context.Context, id string) (*sandbox, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	sb, err := b.lookup(id)
	if err != nil {
		return nil, nil, err
	}
	_, done, err := sb.begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	if b.viaCaps && sb.own {
		// A non-root daemon reaches the guest's files as the guest's uid
		// (it cannot override their permissions) and what it creates is
		// then the guest's: the whole operation runs on this goroutine's
		// thread with the sandbox's filesystem ids (privilege.go).
		restore, err := lockFSIDs(sb.uid, sb.gid)
		if err != nil {
			done()
			return nil, nil, fmt.Errorf("%w: cannot take the host uid of sandbox %s: %v", backend.ErrUnavailable, id, err)
		}
		return sb, func() { restore(); done() }, nil
	}
	return sb, done, nil
}

// ReadFile returns the regular file at p. It checks the size of the opened
// file before reading and never reads more than maxBytes+1 bytes, so a file
// growing meanwhile still returns *backend.FileTooLargeError. FIFOs, sockets
// and devices are refused without being opened for blocking I/O.
func (b *Backend) ReadFile(ctx context.Context, id, p string, maxBytes int64) ([]byte, error) {
	if maxBytes < 0 {
		return nil, fmt.Errorf("%w: maxBytes %d is negative", backend.ErrInvalidArgument, maxBytes)
	}
	sb, done, err := b.fileOp(ctx, id)
	if err != nil {
		return nil, err
	}
	defer done()
	root, rel, err := openArea(sb, p)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return hostfs.Read(root, rel, p, maxBytes)
}

// WriteFile writes data to p, creating missing parent directories (0755).
// The data goes to a temporary file in the same directory that is then
// renamed over p, so a symlink at p is replaced, never written through, and a
// reader never sees half a file. mode 0 means 0644; only permission bits are
// used. The file and every directory created are owned by the sandbox's
// uid so the guest can change them.
func (b *Backend) WriteFile(ctx context.Context, id, p string, data []byte, mode os.FileMode) (err error) {
	sb, done, err := b.fileOp(ctx, id)
	if err != nil {
		return err
	}
	defer done()
	root, rel, err := openArea(sb, p)
	if err != nil {
		return err
	}
	defer root.Close()
	return hostfs.Write(root, rel, p, data, mode, hostfs.Owner{UID: sb.uid, GID: sb.gid})
}

// ListDirectory lists the directory at p, sorted by name. IsDir comes from
// the entry's own type, so a symlink to a directory is reported as not a
// directory (following it could leave the sandbox). More than maxEntries
// entries returns ErrTooManyEntries without reading the rest.
func (b *Backend) ListDirectory(ctx context.Context, id, p string, maxEntries int) ([]backend.DirEntry, error) {
	if maxEntries <= 0 {
		return nil, fmt.Errorf("%w: maxEntries must be positive, got %d", backend.ErrInvalidArgument, maxEntries)
	}
	sb, done, err := b.fileOp(ctx, id)
	if err != nil {
		return nil, err
	}
	defer done()
	root, rel, err := openArea(sb, p)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return hostfs.List(root, rel, p, maxEntries)
}
