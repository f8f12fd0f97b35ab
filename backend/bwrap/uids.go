package bwrap

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/registry"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/statedir"
)

// A sandbox with a host uid of its own keeps it in two places, written in
// this order at Create: the group of its directory Dir/<id> (before any
// file of the guest exists), then spec.json. New reads them back for every
// sandbox it finds, so no uid of a sandbox that still has files or
// processes is handed to another, whether or not the lifecycle journal
// knows the sandbox yet. The uid returns to the range only when Destroy
// removed every file of it.

// sandboxDirMode is Dir/<id>'s mode for a sandbox with a uid of its own
// (the directory is the daemon's, its group the sandbox's: the sandbox's
// bwrap may traverse it, no other uid may enter), and for one running as a
// shared uid (anyone may traverse it) or the daemon's own.
const (
	ownSandboxDirMode    = 0o750
	sharedSandboxDirMode = 0o711
	daemonSandboxDirMode = 0o700
)

// reserveExistingUIDs reserves the uid of every sandbox in Dir.
func (b *Backend) reserveExistingUIDs() {
	entries, err := os.ReadDir(b.cfg.Dir)
	if err != nil {
		b.log.Error("cannot list the state directory to reserve the uids of its sandboxes", "error", err)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range entries {
		id := e.Name()
		if !e.IsDir() || !backend.ValidID(id) {
			continue
		}
		uid, ok := b.recordedUID(id)
		if !ok {
			continue
		}
		if b.uids != nil && b.uids.Range().Contains(uid) && !b.uids.Reserve(uid) {
			// Two sandboxes claim one uid: neither is trusted with it by
			// the second; lookup refuses this one (destroy it).
			b.log.Error("two sandboxes in the state directory have the same host uid; the second is not re-adopted", "sandbox", id, "host_uid", uid)
			continue
		}
		b.uidOf[id] = uid
	}
	if len(b.uidOf) > 0 {
		b.log.Info("host uids of existing sandboxes reserved", "count", len(b.uidOf))
	}
}

// recordedUID is the own uid of sandbox id as its spec.json, or failing
// that (a sandbox half made) its directory's group, records it.
func (b *Backend) recordedUID(id string) (uint32, bool) {
	var spec persistedSpec
	if err := statedir.ReadSettings(b.sandboxDir(id), specName, id, registry.MaxSpecBytes, &spec); err == nil {
		if spec.UID != nil {
			return *spec.UID, true
		}
		return 0, false
	}
	fi, err := os.Lstat(b.sandboxDir(id))
	if err != nil {
		return 0, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || fi.Mode().Perm() != ownSandboxDirMode || b.uids == nil || !b.uids.Range().Contains(st.Gid) {
		return 0, false
	}
	return st.Gid, true
}

// checkAdoptedUID refuses to load sandbox id with uid unless New reserved
// uid for it. b.mu is held.
func (b *Backend) checkAdoptedUID(id string, uid uint32) error {
	if got, ok := b.uidOf[id]; !ok || got != uid {
		return fmt.Errorf("%w: sandbox %q has host uid %d, which the daemon did not reserve for it at start (another sandbox has it, or its settings changed); destroy it and create a new one", backend.ErrNotFound, id, uid)
	}
	if b.uids == nil && os.Geteuid() != 0 {
		return fmt.Errorf("%w: sandbox %q runs as host uid %d of its own, which needs a root daemon or the uid range (bwrap.uid_range_size); destroy it and create a new one", backend.ErrSpecUnenforceable, id, uid)
	}
	return nil
}

// releaseUID returns uid (nil: none) to the range and forgets it as id's,
// if it is still id's: a destroy that removed a half-made sandbox under
// its Create has released it already, and the range may have handed it to
// another sandbox since.
func (b *Backend) releaseUID(id string, uid *uint32) {
	if uid == nil || b.uids == nil {
		return
	}
	b.mu.Lock()
	got, ok := b.uidOf[id]
	held := ok && got == *uid
	if held {
		delete(b.uidOf, id)
	}
	b.mu.Unlock()
	if held {
		b.uids.Release(*uid)
	}
}

// freeUID returns uid (nil: none), allocated by a Create that fails
// before it recorded it as its sandbox's, to the range.
func (b *Backend) freeUID(uid *uint32) {
	if uid != nil && b.uids != nil {
		b.uids.Release(*uid)
	}
}

// prepareSandboxDir sets the mode (and, for a uid of its own, the group) of
// the sandbox's directory, just made.
func (b *Backend) prepareSandboxDir(sb *sandbox) error {
	switch {
	case sb.own && b.viaCaps:
		// The daemon may give its directory a group only as a member of it:
		// fsgid counts as one.
		if err := b.asIDs(-1, sb.gid, func() error { return os.Chown(sb.dir, -1, sb.gid) }); err != nil {
			return err
		}
		return os.Chmod(sb.dir, ownSandboxDirMode)
	case sb.own:
		if err := os.Chown(sb.dir, -1, sb.gid); err != nil {
			return err
		}
		return os.Chmod(sb.dir, ownSandboxDirMode)
	case sb.uid >= 0:
		return os.Chmod(sb.dir, sharedSandboxDirMode)
	}
	return os.Chmod(sb.dir, daemonSandboxDirMode)
}

// removeSandboxFiles removes the sandbox's directory. A non-root daemon
// removes what is inside the guest's directories as the sandbox's uid (it
// cannot override their permissions), then the rest as itself.
func (b *Backend) removeSandboxFiles(sb *sandbox) error {
	if b.viaCaps && sb.own && !sb.disk {
		for _, d := range []string{sb.workDir(), sb.tmpDir()} {
			if err := b.asOwner(sb, func() error { return removeContents(d) }); err != nil {
				return fmt.Errorf("remove the files in %s: %w", d, err)
			}
		}
	}
	return statedir.RemoveAll(sb.dir)
}

// removeContents removes everything inside dir, leaving dir; a missing dir
// is not an error.
func removeContents(dir string) error {
	fi, err := os.Lstat(dir)
	if os.IsNotExist(err) || err == nil && !fi.IsDir() {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o700 != 0o700 {
		_ = os.Chmod(dir, fi.Mode().Perm()|0o700)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := statedir.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
