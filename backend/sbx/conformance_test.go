package sbx

import (
	"testing"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/backendtest"
)

// TestSbxConformance runs the shared backend suite against the fake sbx on a
// host declared deny-all. The fake runs commands on the host, so the
// host-isolation checks are skipped; everything the backend itself does
// (command lines, timeouts, output, the file scripts, cleanup) is checked.
// The daemon's environment holds an SSH agent socket, which sbx would
// forward into every sandbox: no sbx call of the suite may see it.
func TestSbxConformance(t *testing.T) {
	t.Setenv("SSH_AUTH_SOCK", "/run/user/0/ssh-agent.sock")
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		b, f := newFakeBackend(t)
		t.Cleanup(func() { f.checkSbxNeverSaw("SSH_AUTH_SOCK") })
		return b
	}, backendtest.Options{
		RealIsolation:      false,
		AcceptBlockNetwork: true,
		AcceptOpenNetwork:  false,
		AcceptEgressHosts:  true,
		KillGrace:          testKillAfter,
		Reopen: func(t *testing.T, b backend.Backend) backend.Backend {
			nb, err := New(b.(*Backend).cfg)
			if err != nil {
				t.Fatal(err)
			}
			return nb
		},
	})
}
