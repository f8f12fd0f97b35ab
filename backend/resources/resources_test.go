package resources

import (
	"errors"
	"strings"
	"testing"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/limits"
)

func TestEffective(t *testing.T) {
	daemon := limits.Limits{MemoryBytes: 1 << 30, CPUs: 2, PIDs: 256, DiskBytes: 1 << 30}
	all := Enforced{Cgroups: true, Disk: true}

	l, err := Effective(daemon, backend.Resources{}, all)
	if err != nil || l != daemon {
		t.Fatalf("no request: %+v, %v; want the daemon's %+v", l, err, daemon)
	}
	l, err = Effective(daemon, backend.Resources{MemoryBytes: 64 << 20, CPUs: 0.5, PIDs: 16, DiskBytes: 64 << 20}, all)
	want := limits.Limits{MemoryBytes: 64 << 20, CPUs: 0.5, PIDs: 16, DiskBytes: 64 << 20}
	if err != nil || l != want {
		t.Fatalf("lowered: %+v, %v; want %+v", l, err, want)
	}

	for _, tc := range []struct {
		name string
		r    backend.Resources
		can  Enforced
		says string
	}{
		{"above the ceiling", backend.Resources{MemoryBytes: 2 << 30}, all, "memory_bytes 2.147483648e+09 exceeds the daemon's maximum"},
		{"negative", backend.Resources{PIDs: -1}, all, "pids -1 is negative"},
		{"refused by limits.Validate", backend.Resources{MemoryBytes: 1 << 20}, all, "below 16 MiB"},
		{"no cgroups", backend.Resources{CPUs: 1}, Enforced{Disk: true}, "cpus cannot be limited on this host"},
		{"no disk caps", backend.Resources{DiskBytes: 1}, Enforced{Cgroups: true}, "disk_bytes cannot be limited on this host"},
		{"named backend", backend.Resources{DiskBytes: 1}, Enforced{Cgroups: true, Who: "the gvisor backend"}, "disk_bytes cannot be limited by the gvisor backend on this host"},
	} {
		_, err := Effective(daemon, tc.r, tc.can)
		if !errors.Is(err, backend.ErrSpecUnenforceable) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: err = %v; want ErrSpecUnenforceable saying %q", tc.name, err, tc.says)
		}
	}
	// DropDisk leaves the daemon's disk limits out; without it they stay.
	daemon.DiskInodes = 1000
	if l, err := Effective(daemon, backend.Resources{}, Enforced{Cgroups: true, DropDisk: true}); err != nil || l.DiskBytes != 0 || l.DiskInodes != 0 {
		t.Errorf("DropDisk: %+v, %v; want no disk limits", l, err)
	}
	if l, err := Effective(daemon, backend.Resources{}, Enforced{Cgroups: true}); err != nil || l.DiskBytes != daemon.DiskBytes || l.DiskInodes != 1000 {
		t.Errorf("without DropDisk: %+v, %v; want the daemon's disk limits", l, err)
	}
	// Both refusals are reported, not just the first.
	_, err = Effective(daemon, backend.Resources{PIDs: -1, DiskBytes: 1}, Enforced{Cgroups: true})
	if err == nil || !strings.Contains(err.Error(), "pids") || !strings.Contains(err.Error(), "disk_bytes") {
		t.Errorf("two refusals: err = %v; want both named", err)
	}
}

func TestWithoutManager(t *testing.T) {
	cg, err := MakeCgroup(t.Context(), nil, "x", "x", limits.Limits{MemoryBytes: 1 << 20})
	if cg != nil || err != nil {
		t.Errorf("MakeCgroup without a manager = %v, %v; want nil, nil", cg, err)
	}
	if err := RemoveCgroup(nil, "x", "x"); err != nil {
		t.Errorf("RemoveCgroup without a manager = %v", err)
	}
	if n := SweepCgroups(nil, nil, nil); n != 0 {
		t.Errorf("SweepCgroups without a manager = %d", n)
	}
}
