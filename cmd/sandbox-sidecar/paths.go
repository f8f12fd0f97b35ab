package main

import (
	"fmt"
	"os"
	"path/filepath"
)

// SocketEnv overrides the default socket path for every client subcommand
// (and the Python client).
const SocketEnv = "SANDBOX_SIDECAR_SOCKET"

// defaultSocket is /run/sandbox-sidecar/sidecar.sock for root, and a path
// in the user's runtime directory otherwise.
func defaultSocket() string {
	if p := os.Getenv(SocketEnv); p != "" {
		return p
	}
	if os.Geteuid() == 0 {
		return "/run/sandbox-sidecar/sidecar.sock"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "sandbox-sidecar", "sidecar.sock")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("sandbox-sidecar-%d", os.Geteuid()), "sidecar.sock")
}

// defaultStateDir is /var/lib/sandbox-sidecar for root, and the user's
// state directory otherwise.
func defaultStateDir() string {
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
