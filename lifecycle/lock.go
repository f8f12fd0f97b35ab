package lifecycle

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// StateLock is an exclusive hold on a state directory: one daemon per
// directory. The kernel drops it when the process dies, however it dies.
type StateLock struct {
	f *os.File
}

// LockStateDir creates dir (0700) if needed and takes its lock without
// waiting. If another process holds it, the error names that process.
func LockStateDir(dir string) (*StateLock, error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", filepath.Dir(dir), err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("creating state directory %s: %w", dir, err)
	}
	if err := unix.Access(dir, unix.W_OK); err != nil {
		return nil, fmt.Errorf("state directory %s is not writable by uid %d: %w; fix its owner or mode, or choose another --state-dir", dir, os.Geteuid(), err)
	}
	path := filepath.Join(dir, "lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := ""
		if b, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil {
				holder = fmt.Sprintf(" (pid %d)", pid)
			}
		}
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("another sandbox-sidecar%s already uses state directory %s; stop it first (systemctl stop sandbox-sidecar) or choose another --state-dir", holder, dir)
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	// Record who holds it, for the message above; the lock itself is the
	// flock, not this content.
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &StateLock{f: f}, nil
}

// Unlock releases the lock.
func (l *StateLock) Unlock() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
