package backend

import (
	"fmt"
	"maps"
	"os"
	"path"
	"strings"
	"time"
)

// HostImage names the built-in image: the host's own /usr (and top-level
// library and binary directories), what every sandbox ran on before images.
const HostImage = "host"

// Image is the root filesystem a sandbox runs on: one the operator
// imported into the daemon's image store (sandbox/image, read-only and
// shared by every sandbox of that image), or the built-in HostImage. The
// zero Image is HostImage.
type Image struct {
	// Name is what the operator called it at import; "" or HostImage for
	// the built-in.
	Name string
	// Digest is the image's content digest ("sha256:..."); "" for host.
	Digest string
	// Root is the unpacked root directory on the host, never written to
	// by a sandbox; "" for host.
	Root string
	// Env is the image config's environment (NAME=value, PATH and such):
	// a command gets it under the sandbox's and the request's own.
	Env []string
	// What the image's config says besides; reported, not used (a
	// sandbox's commands are the client's, its workdir /workspace and its
	// user the sandbox's).
	Entrypoint, Cmd  []string
	WorkingDir, User string
	// Bytes and Files are the unpacked root's size; Created the image's
	// creation time; Source where it came from (an archive, a reference).
	Bytes, Files int64
	Created      time.Time
	Source       string
	// Imported is when this daemon imported it.
	Imported time.Time
	// Base is HostImage for an image that holds only a sandbox's own
	// files over the host's root (a snapshot of a sandbox on the built-in
	// image; RunsOnHost); "" otherwise.
	Base string
	// Origin says where a snapshot came from (nil for other images).
	Origin *ImageOrigin
	// Memory is a memory snapshot's directory of its sandbox's processes
	// and memory (SandboxFiles.Memory as the store keeps it), which a
	// backend that can restores a new sandbox from; "" for every other
	// image.
	Memory string
}

// IsHost reports whether im is the built-in host image.
func (im Image) IsHost() bool { return im.Name == "" || im.Name == HostImage }

// DisplayName is im's name, HostImage for the built-in.
func (im Image) DisplayName() string {
	if im.IsHost() {
		return HostImage
	}
	return im.Name
}

// EnvMap is the image's Env as a map; an entry without '=' or with a name
// ValidateEnv refuses is dropped (an image is input from outside).
func (im Image) EnvMap() map[string]string {
	if len(im.Env) == 0 {
		return nil
	}
	m := make(map[string]string, len(im.Env))
	for _, kv := range im.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsRune(k, 0) || strings.ContainsRune(v, 0) {
			continue
		}
		m[k] = v
	}
	return m
}

// ImageSpec is the image a sandbox runs on as a backend's spec.json keeps
// it: what a restarted daemon needs to build the same root again.
type ImageSpec struct {
	Name   string   `json:"name"`
	Digest string   `json:"digest"`
	Root   string   `json:"root"`
	Env    []string `json:"env,omitempty"`
	// Shell says the image has /bin/sh, so a command string can run.
	Shell bool `json:"shell"`
}

// EnvOver is base with im's config Env over it, except HOME (a sandbox's
// home stays its workspace): a command's environment before the sandbox's
// and the request's. base itself is returned, not copied, when im sets
// nothing.
func (im Image) EnvOver(base map[string]string) map[string]string {
	over := im.EnvMap()
	if len(over) == 0 {
		return base
	}
	env := maps.Clone(base)
	for k, v := range over {
		if k != "HOME" {
			env[k] = v
		}
	}
	return env
}

// ImageEtcLeftOut are the entries of an image's /etc that never enter its
// sandboxes: passwd, group and hosts are the daemon's own there, and the
// image's shadow databases (and the backups of all these) describe users
// that do not exist in the sandbox; the store makes every file readable,
// so they would be the guest's to read.
var ImageEtcLeftOut = []string{"passwd", "group", "hosts", "shadow", "gshadow", "passwd-", "group-", "shadow-", "gshadow-"}

// Errors about images; callers check them with errors.Is.
var (
	// ErrImageNotFound: no image of that name (ImageNotFoundError says
	// which exist).
	ErrImageNotFound = fmt.Errorf("image not found")
	// ErrImageInUse: a sandbox or the warm pool runs on the image.
	ErrImageInUse = fmt.Errorf("image in use")
	// ErrNoShell: a command string in a sandbox whose image has no
	// /bin/sh to run it; give an argv instead.
	ErrNoShell = fmt.Errorf("image has no shell")
	// ErrBadImage, ErrImageTooLarge, ErrImageExists: an import refused
	// (not an image, or a hostile one; over the store's caps; the name
	// taken by another digest).
	ErrBadImage      = fmt.Errorf("bad image")
	ErrImageTooLarge = fmt.Errorf("image too large")
	ErrImageExists   = fmt.Errorf("image name taken")
)

// ImageNotFoundError is an unknown image name, with the names there are.
type ImageNotFoundError struct {
	Name  string
	Known []string
}

func (e *ImageNotFoundError) Error() string {
	return fmt.Sprintf("no image %s on this host; the images are %s (an operator adds one with `sandbox-sidecar image import`)", ShortName(e.Name), strings.Join(e.Known, ", "))
}

func (e *ImageNotFoundError) Unwrap() error { return ErrImageNotFound }

// ImageInUseError is an image that cannot be removed, with who uses it.
type ImageInUseError struct {
	Name      string
	Sandboxes []string
	// Pool: a warm pool is configured for the image. Leftover counts
	// pool members of an earlier, larger pool, which the daemon is
	// removing.
	Pool     bool
	Leftover int
}

func (e *ImageInUseError) Error() string {
	var who []string
	if len(e.Sandboxes) > 0 {
		who = append(who, fmt.Sprintf("%d sandbox(es) (%s)", len(e.Sandboxes), strings.Join(e.Sandboxes[:min(len(e.Sandboxes), 5)], ", ")))
	}
	if e.Pool {
		who = append(who, "the warm pool (set its [images] pool size to 0 and restart)")
	}
	if e.Leftover > 0 {
		who = append(who, fmt.Sprintf("%d warm pool member(s) of an earlier pool size, which the daemon is removing (retry in a moment)", e.Leftover))
	}
	return fmt.Sprintf("image %s is used by %s; destroy those first", ShortName(e.Name), strings.Join(who, " and "))
}

func (e *ImageInUseError) Unwrap() error { return ErrImageInUse }

// HasShell reports whether the image root has an executable ShellPath,
// resolving symlinks as the sandbox would see them: an absolute target
// is read inside root, never on the host.
func HasShell(root string) bool {
	p, ok := resolveInRoot(root, ShellPath)
	if !ok {
		return false
	}
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// resolveInRoot returns the host path of guest path p in root, every
// symlink on the way followed inside root (at most 40, as the kernel).
func resolveInRoot(root, p string) (string, bool) {
	parts := strings.Split(strings.Trim(path.Clean("/"+p), "/"), "/")
	cur := "/"
	for hops := 0; len(parts) > 0; {
		name := parts[0]
		parts = parts[1:]
		if name == "" || name == "." {
			continue
		}
		next := path.Join(cur, name) // ".." stops at "/"
		fi, err := os.Lstat(root + next)
		if err != nil {
			return "", false
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return "", false
		}
		target, err := os.Readlink(root + next)
		if err != nil {
			return "", false
		}
		if strings.HasPrefix(target, "/") {
			cur = "/"
		}
		parts = append(strings.Split(strings.Trim(target, "/"), "/"), parts...)
	}
	return root + cur, true
}
