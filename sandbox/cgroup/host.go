package cgroup

import (
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// What a supervisor asks about its own place in the hierarchies before it
// decides where sandbox cgroups go, and how it gives back what it made.

// OwnV2Dir returns the calling process's own cgroup v2: its path in the
// hierarchy ("/system.slice/x.service") and its directory on disk, read
// from opts.SelfCgroup and opts.MountInfo (/proc/self/... when empty). A
// process without a v2 entry, or whose cgroup no cgroup2 mount shows,
// gets an error wrapping ErrUnavailable.
func OwnV2Dir(opts Options) (path, dir string, err error) {
	lay, err := readLayout(Options{MountInfo: opts.MountInfo, SelfCgroup: opts.SelfCgroup, UnderRoot: true})
	if err != nil {
		return "", "", err
	}
	path, ok := lay.own[""]
	if !ok {
		return "", "", fmt.Errorf("%w: the process has no cgroup v2 entry", ErrUnavailable)
	}
	for _, mt := range lay.mounts {
		if !mt.v2 {
			continue
		}
		if dir, err := onDisk(mt, path); err == nil {
			return path, dir, nil
		}
	}
	return path, "", fmt.Errorf("%w: cgroup %s is not under any cgroup2 mount", ErrUnavailable, path)
}

// BaseAtHierarchyTop returns a base directory of m that sits directly at
// the top of a mounted hierarchy, if one does: a manager placed under the
// caller's own cgroup (not UnderRoot) whose process has no cgroup of its
// own in a v1 hierarchy lands there, under a name every such process
// shares, which is then not its own.
func (m *Manager) BaseAtHierarchyTop() (string, bool) {
	for _, d := range m.Dirs() {
		if m.mountPoints[filepath.Dir(d)] {
			return d, true
		}
	}
	return "", false
}

// Release gives back what m made and no process uses: every sandbox group
// under the base that is empty, then the base directories when nothing is
// left in them. It never kills anything (rmdir refuses a group that holds
// a process) and does not count a group still in use, or already gone, as
// a failure; the errors are the others.
func (m *Manager) Release() error {
	m.releaseAnchor()
	names, _ := m.List()
	for _, base := range m.Dirs() {
		for _, name := range names {
			_ = unix.Rmdir(filepath.Join(base, name))
		}
	}
	var errs []error
	for _, d := range m.Dirs() {
		err := unix.Rmdir(d)
		if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EBUSY) {
			errs = append(errs, fmt.Errorf("remove the sandbox cgroup directory %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}
