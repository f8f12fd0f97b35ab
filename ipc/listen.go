package ipc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// ListenConfig says where and how to create the daemon's socket.
type ListenConfig struct {
	// Path of the socket. Its directory must be the daemon's own: it is
	// created (or tightened) before the socket exists.
	Path string
	// Mode of the socket file, e.g. 0660.
	Mode fs.FileMode
	// GID owning the directory and socket; -1 leaves the daemon's group.
	GID int
}

// DirMode is the mode the socket's directory gets for a socket mode: the
// owner always has rwx; group and others get r-x exactly when the socket
// grants them anything, so the directory never lets in someone the socket
// would not.
func DirMode(sock fs.FileMode) fs.FileMode {
	m := fs.FileMode(0o700)
	if sock&0o070 != 0 {
		m |= 0o050
	}
	if sock&0o007 != 0 {
		m |= 0o005
	}
	return m
}

// Listen creates the socket safely. It makes the directory (0700 first,
// then the group and mode from DirMode, so it is never more open than
// intended), refuses a directory it does not own or that others may write
// to (a shared directory such as /tmp), and replaces an existing socket
// only when connecting to it is refused (a stale socket from a dead
// daemon). Hold the state-directory lock before calling it, so two daemons
// cannot both decide the socket is stale.
func Listen(cfg ListenConfig) (*net.UnixListener, error) {
	if cfg.Path == "" {
		return nil, errors.New("no socket path configured")
	}
	if len(cfg.Path) > 107 {
		return nil, fmt.Errorf("socket path %s is %d bytes; Unix sockets allow 107: choose a shorter path", cfg.Path, len(cfg.Path))
	}
	dir := filepath.Dir(cfg.Path)
	if err := prepareDir(dir, DirMode(cfg.Mode), cfg.GID); err != nil {
		return nil, err
	}
	if err := removeStale(cfg.Path); err != nil {
		return nil, err
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: cfg.Path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", cfg.Path, err)
	}
	l.SetUnlinkOnClose(true)
	// The directory already keeps out everyone the final mode would, so
	// the moment between bind(2) and chmod(2) exposes nothing.
	if err := os.Chmod(cfg.Path, cfg.Mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("setting mode of %s: %w", cfg.Path, err)
	}
	if cfg.GID >= 0 {
		if err := os.Lchown(cfg.Path, -1, cfg.GID); err != nil {
			l.Close()
			return nil, fmt.Errorf("setting group %d on %s: %w (is the daemon a member of that group?)", cfg.GID, cfg.Path, err)
		}
	}
	return l, nil
}

func prepareDir(dir string, mode fs.FileMode, gid int) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(dir), err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("creating socket directory %s: %w", dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("socket directory %s is not a directory (a symlink?); remove it or choose another socket path", dir)
	case st != nil && int(st.Uid) != os.Geteuid():
		return fmt.Errorf("socket directory %s belongs to uid %d, not to this daemon (uid %d); give the socket a directory of its own", dir, st.Uid, os.Geteuid())
	case fi.Mode().Perm()&0o002 != 0 || fi.Mode()&fs.ModeSticky != 0:
		return fmt.Errorf("socket directory %s is shared (world-writable or sticky); give the socket a directory of its own, e.g. %s", dir, filepath.Join(dir, "sandbox-sidecar", "sidecar.sock"))
	}
	if gid >= 0 {
		if err := os.Lchown(dir, -1, gid); err != nil {
			return fmt.Errorf("setting group %d on %s: %w (is the daemon a member of that group?)", gid, dir, err)
		}
	}
	if err := os.Chmod(dir, mode); err != nil {
		return fmt.Errorf("setting mode of %s: %w", dir, err)
	}
	return nil
}

// removeStale removes path if it is a socket nobody answers on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket; remove it or choose another socket path", path)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err == nil {
		c.Close()
		return fmt.Errorf("another daemon is serving on %s; stop it first or choose another socket path", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("cannot tell whether %s is stale: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	return nil
}
