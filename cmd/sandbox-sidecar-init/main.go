// Command sandbox-sidecar-init is the init the daemon runs inside every
// sandbox (bubblewrap's and gVisor's), built static (CGO_ENABLED=0
// -buildmode=exe) so that it needs nothing of the host: a sandbox whose
// root is an image without glibc runs it as well as one on the host's
// root. It is small on purpose: only the two backends' sandbox sides
// (backend/bwrap/bwinit, backend/gvisor/gvinit) and the wire they speak,
// never a backend's daemon side, so a sandbox starts it in little more
// than an empty Go program's time and an idle one holds a third of the
// daemon's memory (docs/design.md, "A static init"). TestInitLinksOnlyWhatItRuns
// keeps it so.
//
// The daemon finds it next to its own executable, or in
// ../libexec/sandbox-sidecar/ from there (initproc.Find), opens it once at
// start and hands it to each sandbox by descriptor. Run by hand it only
// says what it is.
package main

import (
	"fmt"
	"os"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap/bwinit"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvinit"
)

func main() {
	bwinit.Main()
	gvinit.Main()
	fmt.Fprintln(os.Stderr, "sandbox-sidecar-init: this is the init the sandbox-sidecar daemon runs inside its sandboxes; it is not run by hand")
	os.Exit(2)
}
