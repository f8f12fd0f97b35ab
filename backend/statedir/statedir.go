// Package statedir holds what every backend does to its state directory on
// the host: write a sandbox's settings so that a crash never leaves half of
// them, and remove a sandbox's files even when its guest made them hard to
// remove.
package statedir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// WriteJSON writes v as JSON to path through a temporary file, fsyncs it,
// renames it into place and fsyncs the directory: afterwards path holds
// either the old contents or all of the new, whatever crashes.
func WriteJSON(path string, v any) (err error) {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err == nil {
		err = f.Sync()
	}
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// RemoveAll removes path even when the guest left directories without
// write or search permission (chmod 000), which stop os.RemoveAll for a
// daemon that is not root. Call it once the guest's processes are gone.
func RemoveAll(path string) error {
	err := os.RemoveAll(path)
	if err == nil {
		return nil
	}
	// WalkDir calls fn for a directory before reading it, so fixing the mode
	// there lets the walk descend. Only real directories are touched (the
	// entry type comes from lstat-like information, never a symlink). The
	// guest's processes are dead by now, so nothing swaps a directory for a
	// symlink between the check and the chmod.
	_ = filepath.WalkDir(path, func(p string, d fs.DirEntry, walkErr error) error {
		if d != nil && d.IsDir() {
			if fi, err := os.Lstat(p); err == nil && fi.IsDir() && fi.Mode().Perm()&0o700 != 0o700 {
				_ = os.Chmod(p, fi.Mode().Perm()|0o700)
			}
		}
		return nil
	})
	return os.RemoveAll(path)
}

// ReadSettings reads the settings file name of sandbox id, in its directory
// dir, into v (JSON of at most maxBytes). A sandbox without one (never
// completely created), one whose file is too large or unreadable, and a
// directory that does not exist are all errors wrapping backend.ErrNotFound
// that tell the caller to create a new sandbox; an I/O error is returned as
// such.
func ReadSettings(dir, name, id string, maxBytes int, v any) error {
	f, err := os.Open(filepath.Join(dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		if _, statErr := os.Stat(dir); statErr == nil {
			return fmt.Errorf("%w: sandbox %q was never completely created (no %s); destroy it and create a new one", backend.ErrNotFound, id, name)
		}
		return backend.NotFound(id)
	}
	if err != nil {
		return fmt.Errorf("read settings of sandbox %s: %w", id, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, int64(maxBytes)+1))
	if err != nil {
		return fmt.Errorf("read settings of sandbox %s: %w", id, err)
	}
	if len(data) > maxBytes {
		return fmt.Errorf("%w: settings of sandbox %q are larger than %d bytes, so not ours; destroy it and create a new one", backend.ErrNotFound, id, maxBytes)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%w: settings of sandbox %q are unreadable (%v); destroy it and create a new one", backend.ErrNotFound, id, err)
	}
	return nil
}

// SandboxIDs returns, sorted, the ids of the sandboxes in the state
// directory dir, complete or not: every subdirectory whose name is a valid
// id. A directory that cannot be read is ErrUnavailable.
func SandboxIDs(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: list state directory %s: %v", backend.ErrUnavailable, dir, err)
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && backend.ValidID(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	slices.Sort(ids)
	return ids, nil
}
