// Package runscpin names the runsc build the tests and benchmarks use: the
// version scripts/install-runsc.sh pins and the path it caches the binary
// at. It is a leaf, for test code and the benchmark tool; the daemon itself
// takes runsc from its configuration or PATH.
package runscpin

// Version is the gVisor version scripts/install-runsc.sh builds (its
// RUNSC_VERSION default; a test checks the two agree).
const Version = "v0.0.0-20260905035102-160fafc42237"

// Path is where scripts/install-runsc.sh caches that build.
const Path = "/var/cache/sandbox-sidecar-test/runsc-" + Version
