package hostback

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/backendtest"
)

// TestHostConformance: the test backend passes the suite every backend
// passes, without the checks of isolation it does not have.
func TestHostConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		b, err := New(Config{Dir: filepath.Join(t.TempDir(), "state"), KillGrace: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}, backendtest.Options{
		RealIsolation: false,
		KillGrace:     time.Second,
		Snapshots:     true,
		KillSandboxInit: func(b backend.Backend, id string) error {
			return b.(*Backend).Kill(id)
		},
	})
}
