package bwrap

import (
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/backendtest"
)

// conformanceKillGrace shortens the SIGTERM-to-SIGKILL grace so the
// suite's timeout checks run quickly.
const conformanceKillGrace = 500 * time.Millisecond

// TestBwrapConformance runs the shared backend suite in both ways the daemon
// runs bwrap. It needs bubblewrap (and root for the uid-65534 mode): it skips
// without them on a workstation and fails under CI=true.
func TestBwrapConformance(t *testing.T) {
	for _, mode := range allModes {
		t.Run(mode.name, func(t *testing.T) {
			backendtest.Run(t, func(t *testing.T) backend.Backend {
				return newTestBackend(t, mode, func(c *Config) { c.KillGrace = conformanceKillGrace })
			}, backendtest.Options{
				Workdir:            guestWorkspace,
				RealIsolation:      true,
				AcceptBlockNetwork: true,
				KillGrace:          conformanceKillGrace,
				// Each command runs alone in the sandbox's PID namespace
				// and init ends everything when it ends.
				KillsEscapeesAtTimeout: true,
				HostProcesses:          processesContaining,
				KillSandboxInit: func(b backend.Backend, id string) error {
					return syscall.Kill(initPID(t, b.(*Backend), id), syscall.SIGKILL)
				},
			})
		})
	}
}
