package runscpin

import (
	"os"
	"regexp"
	"testing"
)

// The script and this package must name one version, or the tests would
// look for a binary the script never builds.
func TestScriptPinsTheSameVersion(t *testing.T) {
	b, err := os.ReadFile("../../scripts/install-runsc.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^RUNSC_VERSION="\$\{RUNSC_VERSION:-([^}]+)\}"$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("scripts/install-runsc.sh has no RUNSC_VERSION default line")
	}
	if string(m[1]) != Version {
		t.Fatalf("scripts/install-runsc.sh pins %s, runscpin.Version is %s", m[1], Version)
	}
}
