package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// SocketEnv overrides the default socket path for every client subcommand
// (and the Python client).
const SocketEnv = "SANDBOX_SIDECAR_SOCKET"

// systemSocket is where the packaged daemon listens.
const systemSocket = "/run/sandbox-sidecar/sidecar.sock"

// defaultSocket is where serve listens: systemd's RuntimeDirectory when
// systemd runs it, /run/sandbox-sidecar/sidecar.sock for root, and a path
// in the user's runtime directory otherwise.
func defaultSocket() string {
	if p := os.Getenv(SocketEnv); p != "" {
		return p
	}
	if d := firstDir(os.Getenv("RUNTIME_DIRECTORY")); d != "" {
		return filepath.Join(d, "sidecar.sock")
	}
	if os.Geteuid() == 0 {
		return systemSocket
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "sandbox-sidecar", "sidecar.sock")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("sandbox-sidecar-%d", os.Geteuid()), "sidecar.sock")
}

// clientSocket is where client subcommands look: the env variable, else
// the system daemon's socket when it exists (a worker user is usually a
// client of the packaged daemon), else the per-user default.
func clientSocket() string {
	if p := os.Getenv(SocketEnv); p != "" {
		return p
	}
	if _, err := os.Stat(systemSocket); err == nil {
		return systemSocket
	}
	return defaultSocket()
}

// firstDir returns the first of systemd's colon-separated directories.
func firstDir(list string) string {
	d, _, _ := strings.Cut(list, ":")
	return d
}

// defaultStateDir is systemd's StateDirectory when systemd runs the
// daemon, /var/lib/sandbox-sidecar for root, and the user's state
// directory otherwise.
func defaultStateDir() string {
	if d := firstDir(os.Getenv("STATE_DIRECTORY")); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/lib/sandbox-sidecar"
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "sandbox-sidecar")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "state", "sandbox-sidecar")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("sandbox-sidecar-state-%d", os.Geteuid()))
}
