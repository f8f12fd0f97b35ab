package sbx

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/backendtest"
)

// TestSbxConformance runs the shared backend suite against the fake sbx on a
// host declared deny-all. The fake runs commands on the host, so the
// host-isolation checks are skipped; everything the backend itself does
// (command lines, timeouts, output, the file scripts, cleanup) is checked.
// The daemon's environment holds an SSH agent socket, which sbx would
// forward into every sandbox: no sbx call of the suite may see it. sbx
// stops sandboxes soon after their last session (a 40 ms grace here) and
// takes a while to boot them again, as it does after its 30 s.
func TestSbxConformance(t *testing.T) {
	t.Setenv("SSH_AUTH_SOCK", "/run/user/0/ssh-agent.sock")
	var starts atomic.Int64 // starts of a stopped sandbox, over the suite
	t.Cleanup(func() {
		if starts.Load() == 0 {
			t.Error("no sandbox of the suite was ever stopped and started again")
		}
	})
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		f := newFakeHost(t)
		b := f.backend(f.autoStop(40*time.Millisecond, 250*time.Millisecond))
		t.Cleanup(func() {
			f.checkSbxNeverSaw("SSH_AUTH_SOCK")
			for _, c := range f.calls() {
				if len(c) == 6 && c[0] == "exec" && c[5] == "true" {
					starts.Add(1)
				}
			}
		})
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
