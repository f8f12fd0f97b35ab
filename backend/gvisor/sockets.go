package gvisor

import (
	"io/fs"
	"os"
	"path/filepath"
)

// controlSocketDirs are where runsc binds a sandbox's control socket,
// runsc-<container>.sock: its root first, and when a file of that name is
// there already, the next of these (runsc/sandbox, createControlSocket).
// A sentry that dies without runsc's own clean-up (killed, or ended by a
// checkpoint) leaves its socket; the next boot of the same container (a
// resume's restore) binds one directory further, and once all four hold
// one it cannot start at all ("unable to find location to write socket
// file"): a paused sandbox that can never resume.
var controlSocketDirs = []string{"", "/var/run", "/run", "/tmp"}

// removeStaleControlSockets removes the control sockets named for
// container, in the runsc root and the host directories runsc falls back
// to. Only while no sentry of container runs: before its boot or
// restore, after its runsc sandbox was deleted. Only sockets: a file of
// another kind there is not runsc's.
func (b *Backend) removeStaleControlSockets(container string) {
	name := "runsc-" + container + ".sock"
	for _, dir := range controlSocketDirs {
		if dir == "" {
			dir = b.runscRoot()
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Lstat(p); err == nil && fi.Mode().Type() == fs.ModeSocket {
			if err := os.Remove(p); err != nil {
				b.log.Warn("cannot remove a stale runsc control socket; runsc binds the next directory", "path", p, "error", err)
			}
		}
	}
}
