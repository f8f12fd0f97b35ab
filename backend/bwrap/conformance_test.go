package bwrap

import (
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/backendtest"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

// conformanceKillGrace shortens the SIGTERM-to-SIGKILL grace so the
// suite's timeout checks run quickly.
const conformanceKillGrace = 500 * time.Millisecond

// conformancePreload is what the suite's contexts preload: a module of
// the standard library no interpreter imports at start, and numpy and
// pandas where the sandbox has them (the host often has not).
var conformancePreload = []string{"decimal", "numpy", "pandas"}

// TestBwrapConformance runs the shared backend suite in both ways the daemon
// runs bwrap. It needs bubblewrap (and root for the uid-65534 mode): it skips
// without them on a workstation and fails under CI=true.
//
// A third run adds every per-sandbox limit a root daemon enforces: a cgroup
// per sandbox and /workspace and /tmp on a filesystem of its own, which
// every file operation must reach as well.
func TestBwrapConformance(t *testing.T) {
	type run struct {
		name    string
		mode    testMode
		tweak   func(t *testing.T, c *Config)
		freezes bool // a cgroup per sandbox: snapshots freeze it, and it pauses
	}
	runs := []run{{name: daemonUID.name, mode: daemonUID}, {name: rangeUID.name, mode: rangeUID},
		{name: rangeUID.name + "-limits", mode: rangeUID, freezes: true, tweak: func(t *testing.T, c *Config) {
			testDiskCaps(t)
			l := limits.Defaults()
			l.DiskBytes = 64 << 20
			c.Cgroups, c.Limits, c.DiskCaps = testCgroups(t), l, true
		}}}
	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			backendtest.Run(t, func(t *testing.T) backend.Backend {
				return newTestBackend(t, r.mode, func(c *Config) {
					c.KillGrace = conformanceKillGrace
					c.Code.Preload = conformancePreload
					if r.tweak != nil {
						r.tweak(t, c)
					}
				})
			}, backendtest.Options{
				Workdir:            guestWorkspace,
				RealIsolation:      true,
				GuestView:          true,
				AcceptBlockNetwork: true,
				KillGrace:          conformanceKillGrace,
				// Each command runs alone in the sandbox's PID namespace
				// and init ends everything when it ends.
				KillsEscapeesAtTimeout: true,
				HostProcesses:          processesContaining,
				Processes:              true,
				Code:                   true,
				Snapshots:              true,
				Freezes:                r.freezes,
				CodePreload:            conformancePreload,
				Pause:                  r.freezes,
				KillSandboxInit: func(b backend.Backend, id string) error {
					return syscall.Kill(initPID(t, b.(*Backend), id), syscall.SIGKILL)
				},
				Reopen: func(t *testing.T, b backend.Backend) backend.Backend {
					nb, err := New(b.(*Backend).cfg)
					if err != nil {
						t.Fatal(err)
					}
					return nb
				},
			})
		})
	}
}
