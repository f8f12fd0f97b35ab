package gvisor

import "github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvinit"

// The sandbox's side of the conversation (its init and opener) lives in
// gvinit, the frames both sides speak in gvwire, so that the init's own
// binary (cmd/sandbox-sidecar-init) links only them and not this package.

// IsInit reports whether this process is a gVisor sandbox's init
// (gvinit.IsInit).
func IsInit() bool { return gvinit.IsInit() }

// InitMain runs a sandbox's init, or its opener, and never returns when
// this process is one; otherwise it returns at once (gvinit.Main). The
// daemon's main function calls it first thing, and so does every test
// binary that creates gVisor sandboxes: without the small static init
// (initproc.Find), a sandbox's init is the daemon's own executable.
func InitMain() { gvinit.Main() }
