package gvisor

import (
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/statedir"
)

// What the guest sees.
const (
	guestWorkspace = hostfs.GuestWorkspace
	guestTmp       = hostfs.GuestTmp
	guestUID       = gvwire.GuestUID
	guestGID       = gvwire.GuestGID
	guestHostname  = "sandbox"
	guestPath      = "/usr/local/bin:/usr/bin:/bin"
	// guestInit is where the sandboxes' init (Config.InitPath, or the
	// daemon's own executable) is bound, read-only.
	guestInit = gvwire.GuestInit
	// guestProcs is where the sandbox's procs/ is bound (procs.go).
	guestProcs = gvwire.GuestProcs
)

// Files bound into every sandbox's /etc, read-only, when the host has them:
// what an interpreter and a TLS client need, nothing that names the host.
var etcBinds = []string{
	"/etc/alternatives",
	"/etc/ld.so.cache",
	"/etc/localtime",
	"/etc/ssl/certs",
	"/etc/ca-certificates",
	// Debian's matplotlib reads its defaults only from here (it moved
	// the file out of mpl-data): without it, importing matplotlib.pyplot
	// fails ("Could not find matplotlibrc file").
	"/etc/matplotlibrc",
}

// The synthetic /etc files of the shared root.
var etcFiles = map[string]string{
	"passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\n" +
		"sandbox:x:1000:1000:sandbox:/workspace:/bin/sh\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
	"group": "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n",
	"hosts": "127.0.0.1\tlocalhost\n127.0.1.1\tsandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	// Empty: a sandbox without a network has no resolver. An allowlist
	// sandbox's own file (the daemon's resolver) is bound over it.
	"resolv.conf": "",
}

// makeRootfs (re)makes the shared read-only root at dir: the host's
// top-level links (/bin -> usr/bin on a merged /usr), the synthetic /etc
// files and every mount point the bundles use. It is rebuilt at every
// start, so it always matches this daemon's view of the host.
func makeRootfs(dir, host string) error {
	tmp := dir + ".new"
	if err := statedir.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	for _, d := range []string{"usr", "etc", "proc", "dev", "sys", "tmp", "workspace", "root", guestProcs[1:]} {
		if err := os.Mkdir(filepath.Join(tmp, d), 0o755); err != nil {
			return err
		}
	}
	for _, name := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
		fi, err := os.Lstat(filepath.Join(host, name))
		switch {
		case err != nil:
			continue
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(filepath.Join(host, name))
			if err != nil {
				return err
			}
			if err := os.Symlink(target, filepath.Join(tmp, name)); err != nil {
				return err
			}
		case fi.IsDir():
			if err := os.Mkdir(filepath.Join(tmp, name), 0o755); err != nil {
				return err
			}
		}
	}
	for name, data := range etcFiles {
		if err := os.WriteFile(filepath.Join(tmp, "etc", name), []byte(data), 0o644); err != nil {
			return err
		}
	}
	for _, p := range etcBinds {
		fi, err := os.Stat(filepath.Join(host, p))
		if err != nil {
			continue
		}
		dst := filepath.Join(tmp, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if fi.IsDir() {
			err = os.Mkdir(dst, 0o755)
		} else {
			err = os.WriteFile(dst, nil, 0o644)
		}
		if err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, guestInit), nil, 0o755); err != nil {
		return err
	}
	if err := exactModes(tmp); err != nil {
		return err
	}
	// One that is the same stays: the sandboxes a previous daemon left
	// run on it. Removing a mount point detaches what is mounted on it in
	// every namespace (the gofers' bind mounts of the workspaces), and a
	// gVisor sandbox that was checkpointed or restored opens its files
	// again by path.
	if same, err := sameTree(tmp, dir); err == nil && same {
		return statedir.RemoveAll(tmp)
	}
	if err := statedir.RemoveAll(dir); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

// sameTree reports whether the trees at a and b hold the same names,
// types, modes, link targets and file contents (the small files of a
// shared root).
func sameTree(a, b string) (bool, error) {
	type entry struct {
		mode fs.FileMode
		data string
	}
	read := func(root string) (map[string]entry, error) {
		m := map[string]entry{}
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			e := entry{mode: fi.Mode()}
			switch {
			case fi.Mode()&fs.ModeSymlink != 0:
				e.data, err = os.Readlink(p)
			case fi.Mode().IsRegular():
				var b []byte
				b, err = os.ReadFile(p)
				e.data = string(b)
			}
			rel, _ := filepath.Rel(root, p)
			m[rel] = e
			return err
		})
		return m, err
	}
	ma, err := read(a)
	if err != nil {
		return false, err
	}
	mb, err := read(b)
	if err != nil {
		return false, err
	}
	return maps.Equal(ma, mb), nil
}

// exactModes gives everything under dir the mode makeRootfs asks for
// (directories 0755, files 0644, init's mount point 0755) whatever the
// daemon's umask: the packaged unit's UMask=0077 would otherwise leave the
// guest's / and /etc/passwd to root alone, and every command would fail
// with "permission denied".
func exactModes(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var mode fs.FileMode
		switch {
		case d.IsDir():
			mode = 0o755
		case d.Type().IsRegular() && p == filepath.Join(dir, guestInit):
			mode = 0o755
		case d.Type().IsRegular():
			mode = 0o644
		default: // symlinks have no mode of their own
			return nil
		}
		return os.Chmod(p, mode)
	})
}

// The parts of an OCI runtime spec (config.json) the backend writes.
type ociSpec struct {
	OCIVersion string      `json:"ociVersion"`
	Process    ociProcess  `json:"process"`
	Root       ociRoot     `json:"root"`
	Hostname   string      `json:"hostname"`
	Mounts     []ociMount  `json:"mounts"`
	Linux      ociLinux    `json:"linux"`
	Annots     annotations `json:"annotations,omitempty"`
}

type annotations map[string]string

type ociProcess struct {
	User            ociUser     `json:"user"`
	Args            []string    `json:"args"`
	Env             []string    `json:"env"`
	Cwd             string      `json:"cwd"`
	NoNewPrivileges bool        `json:"noNewPrivileges"`
	Capabilities    ociCaps     `json:"capabilities"`
	Rlimits         []ociRlimit `json:"rlimits,omitempty"`
}

type ociUser struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type ociCaps struct {
	Bounding    []string `json:"bounding"`
	Effective   []string `json:"effective"`
	Permitted   []string `json:"permitted"`
	Inheritable []string `json:"inheritable"`
	Ambient     []string `json:"ambient"`
}

type ociRlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	Namespaces []ociNamespace `json:"namespaces"`
}

type ociNamespace struct {
	Type string `json:"type"`
	Path string `json:"path,omitempty"`
}

// initCaps are init's capabilities inside the sandbox: enough to start
// commands as the guest uid, to kill them, and to look at any path of the
// guest's files (lstat). Commands lose them when init switches to the guest
// uid, and noNewPrivileges keeps setuid binaries (and file capabilities) of
// the host's /usr from giving any back.
var initCaps = []string{"CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_DAC_READ_SEARCH"}

// spec is sb's OCI runtime spec.
func (b *Backend) spec(sb *sandbox) (ociSpec, error) {
	mounts := []ociMount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
	}
	root := filepath.Join(b.cfg.Dir, rootfsName)
	if sb.image != nil {
		// The image's entries on its mount-point root, and nothing of
		// the host's /usr or /etc.
		var err error
		if root, err = b.imageRootfs(sb.image); err != nil {
			return ociSpec{}, err
		}
		ms, err := imageMounts(sb.image.Root)
		if err != nil {
			return ociSpec{}, fmt.Errorf("%w: cannot read the root of image %s: %v; import it again", backend.ErrUnavailable, backend.ShortName(sb.image.Name), err)
		}
		mounts = append(mounts, ms...)
	} else {
		mounts = append(mounts, b.hostMounts()...)
	}
	return b.specWith(sb, root, mounts), nil
}

// hostMounts are the host image's: its /usr, top-level directories and
// the etcBinds it has.
func (b *Backend) hostMounts() []ociMount {
	mounts := []ociMount{
		{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro", "nosuid", "nodev"}},
	}
	for _, name := range []string{"lib", "lib32", "lib64", "libx32", "bin", "sbin"} {
		if fi, err := os.Lstat("/" + name); err == nil && fi.IsDir() {
			mounts = append(mounts, ociMount{Destination: "/" + name, Type: "bind", Source: "/" + name, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
		}
	}
	for _, p := range etcBinds {
		if _, err := os.Stat(p); err == nil {
			mounts = append(mounts, ociMount{Destination: p, Type: "bind", Source: p, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
		}
	}
	return mounts
}

// specWith is sb's spec on root with mounts before the sandbox's own.
func (b *Backend) specWith(sb *sandbox, root string, mounts []ociMount) ociSpec {
	mounts = append(mounts,
		ociMount{Destination: guestInit, Type: "bind", Source: b.exe, Options: []string{"bind", "ro", "nodev"}},
		ociMount{Destination: guestWorkspace, Type: "bind", Source: sb.workDir(), Options: []string{"rbind", "rw", "nosuid", "nodev"}},
		ociMount{Destination: guestTmp, Type: "bind", Source: sb.tmpDir(), Options: []string{"rbind", "rw", "nosuid", "nodev"}},
		ociMount{Destination: guestProcs, Type: "bind", Source: sb.procsDir(), Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
	)
	// The network namespace: a new one of runsc's (--network=none: only
	// lo), or the one the daemon made for an allowlist sandbox.
	netns := ociNamespace{Type: "network"}
	if sb.network == networkAllowlist {
		netns.Path = netnsPath
		mounts = append(mounts, ociMount{Destination: "/etc/resolv.conf", Type: "bind", Source: filepath.Join(sb.dir, resolvName), Options: []string{"bind", "ro", "nosuid", "nodev"}})
	}
	var rlimits []ociRlimit
	for _, r := range []struct {
		name  string
		value uint64
	}{{"RLIMIT_NOFILE", sb.limits.OpenFiles}, {"RLIMIT_FSIZE", sb.limits.FileSizeBytes}} {
		if r.value > 0 {
			rlimits = append(rlimits, ociRlimit{Type: r.name, Hard: r.value, Soft: r.value})
		}
	}
	rlimits = append(rlimits, ociRlimit{Type: "RLIMIT_CORE"})
	env := []string{gvwire.InitEnv + "=1", "PATH=" + guestPath}
	if fp := os.Getenv(agent.KeeperFailpointEnv); fp != "" {
		env = append(env, agent.KeeperFailpointEnv+"="+fp) // tests only
	}
	return ociSpec{
		OCIVersion: "1.0.2",
		Process: ociProcess{
			User:            ociUser{UID: 0, GID: 0},
			Args:            []string{guestInit},
			Env:             env,
			Cwd:             "/",
			NoNewPrivileges: true,
			Capabilities:    ociCaps{Bounding: initCaps, Effective: initCaps, Permitted: initCaps, Inheritable: []string{}, Ambient: []string{}},
			Rlimits:         rlimits,
		},
		Root:     ociRoot{Path: root, Readonly: true},
		Hostname: guestHostname,
		Mounts:   mounts,
		Linux: ociLinux{Namespaces: []ociNamespace{
			{Type: "pid"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}, netns,
		}},
	}
}

// writeBundle writes sb's bundle directory with its config.json.
func (b *Backend) writeBundle(sb *sandbox) error {
	if err := os.MkdirAll(sb.bundleDir(), 0o700); err != nil {
		return err
	}
	p := filepath.Join(sb.bundleDir(), "config.json")
	_ = os.Remove(p + ".tmp") // a crash's leftover would stop WriteJSON
	if sb.network == networkAllowlist {
		if err := writeResolvConf(sb); err != nil {
			return err
		}
	}
	spec, err := b.spec(sb)
	if err != nil {
		return err
	}
	return statedir.WriteJSON(p, spec)
}
