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
func TestSbxConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		b, _ := newFakeBackend(t)
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
