package egress

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSetupStepErrorsSayWhich makes each step of a namespace's network
// setup fail in turn (the steps before it succeed on lo, the failing one
// names an interface that does not exist) and checks the error says which
// step, what it does and on what, with the kernel's reason underneath
// ("netlink step N" alone told an operator nothing).
func TestSetupStepErrorsSayWhich(t *testing.T) {
	needRoot(t)
	const missing = 4242 // no such interface in a new namespace
	wants := []string{
		"bring up lo (interface index %[1]d)",
		"bring up tun0 (interface index %[2]d) with MTU 65520",
		"add address 100.100.0.2/32 to tun0 (interface index %[2]d)",
		"add address fd00:5b5b::2/128 to tun0 (interface index %[2]d)",
		"add the IPv4 default route via 100.100.0.1 on tun0 (interface index %[2]d)",
		"add the IPv6 default route via fd00:5b5b::1 on tun0 (interface index %[2]d)",
	}
	err := onThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return err
		}
		nl, err := netlinkSocket()
		if err != nil {
			return err
		}
		defer unix.Close(nl)
		lo, err := ifIndex("lo")
		if err != nil {
			return err
		}
		if n := len(setupSteps(lo, lo)); n != len(wants) {
			t.Fatalf("%d setup steps, the test knows %d", n, len(wants))
		}
		// Step 1 is lo's own: it fails on a missing lo; the others on a
		// missing tun0 after lo stood in for it in the steps before.
		for k := range wants {
			good, bad := setupSteps(lo, lo), setupSteps(missing, missing)
			if k > 0 {
				bad = setupSteps(lo, missing)
			}
			steps := append(good[:k:k], bad[k])
			err := runSteps(nl, steps)
			want := fmt.Sprintf("network setup step %d of %d, %s: ", k+1, k+1, fmt.Sprintf(wants[k], missing, missing))
			if err == nil || !strings.HasPrefix(err.Error(), want) || !errors.Is(err, unix.ENODEV) {
				t.Errorf("step %d: %v; want %q and ENODEV", k+1, err, want)
			}
		}
		// The real steps, in a namespace without tun0: the lookup says so.
		if _, err := ifIndex(TUNName); err == nil || !strings.Contains(err.Error(), "look up interface tun0") {
			t.Errorf("ifIndex(tun0) = %v; want the lookup named", err)
		}
		return nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
}
