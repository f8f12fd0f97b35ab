package backend

import (
	"fmt"
	"path/filepath"
	"time"
)

// CheckStateDir is the check a backend's New makes on its state directory
// (who names the backend in the error): dir must be absolute. It returns
// dir cleaned.
func CheckStateDir(who, dir string) (string, error) {
	if dir == "" || !filepath.IsAbs(dir) {
		return "", fmt.Errorf("%s backend: Dir %q must be an absolute path to the state directory", who, dir)
	}
	return filepath.Clean(dir), nil
}

// DefaultGraces checks a backend's two grace periods, *kill (a timed-out
// command's time between SIGTERM and SIGKILL) and *exec (how long past its
// timeout and kill grace the daemon waits for it), and sets each zero one
// to its default. Negative ones are refused, naming who.
func DefaultGraces(who string, kill, exec *time.Duration, defaultKill, defaultExec time.Duration) error {
	if *kill < 0 || *exec < 0 {
		return fmt.Errorf("%s backend: KillGrace (%v) and ExecGrace (%v) must not be negative; use 0 for the defaults", who, *kill, *exec)
	}
	if *kill == 0 {
		*kill = defaultKill
	}
	if *exec == 0 {
		*exec = defaultExec
	}
	return nil
}
