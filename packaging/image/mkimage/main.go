// Command mkimage writes the daemon's container image as an OCI archive
// (a tar of an OCI image layout, what `podman load` and `skopeo copy
// oci-archive:` read) from a root filesystem tarball and the daemon's
// binary, without pulling anything from a registry. packaging/image/build.sh
// (`make image`) runs it; see docs/operations.md, "Container image".
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Where the daemon listens in the image, and what it reads.
const (
	socketDir  = "/run/sandbox-sidecar"
	socketPath = socketDir + "/sidecar.sock"
	stateDir   = "/var/lib/sandbox-sidecar"
)

func main() {
	rootfs := flag.String("rootfs", "", "the root filesystem, an uncompressed tar (debootstrap's, with bubblewrap)")
	binary := flag.String("binary", "", "the daemon, a static binary")
	out := flag.String("out", "", "the OCI archive to write")
	ref := flag.String("ref", "sandbox-sidecar:dev", "the image's name and tag (org.opencontainers.image.ref.name)")
	version := flag.String("version", "dev", "the daemon's version (a label)")
	flag.Parse()
	if *rootfs == "" || *binary == "" || *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: mkimage --rootfs ROOTFS.tar --binary sandbox-sidecar --out IMAGE.tar [--ref NAME:TAG] [--version V]")
		os.Exit(2)
	}
	created := time.Unix(0, 0).UTC()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			created = time.Unix(n, 0).UTC()
		}
	}
	if err := build(*rootfs, *binary, *out, *ref, *version, created); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func build(rootfs, binary, out, ref, version string, created time.Time) error {
	base, err := tarball.LayerFromFile(rootfs, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return fmt.Errorf("the root filesystem: %w", err)
	}
	daemon, err := daemonLayer(binary, created)
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, base, daemon)
	if err != nil {
		return err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = "amd64", "linux", v1.Time{Time: created}
	cf.Config = v1.Config{
		Entrypoint: []string{"/usr/bin/sandbox-sidecar"},
		Cmd:        []string{"serve"},
		Env: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			// serve listens here and every client subcommand (and the
			// Python client) looks here, in this container and in a
			// worker's that mounts the directory.
			"SANDBOX_SIDECAR_SOCKET=" + socketPath,
		},
		User:       "0:0",
		WorkingDir: "/",
		StopSignal: "SIGTERM",
		Volumes:    map[string]struct{}{socketDir: {}, stateDir: {}},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "sandbox-sidecar",
			"org.opencontainers.image.version":     version,
			"org.opencontainers.image.description": "runs AI-agent code in bubblewrap sandboxes for Airflow workers",
		},
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "mkimage")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
		return err
	}
	return tarDir(dir, out, created)
}

// daemonLayer holds the binary and the directories it uses.
func daemonLayer(binary string, created time.Time) (v1.Layer, error) {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range []struct {
		name string
		mode int64
		data []byte
	}{
		{"run/", 0o755, nil},
		{"run/sandbox-sidecar/", 0o755, nil},
		{"var/lib/sandbox-sidecar/", 0o700, nil},
		{"etc/sandbox-sidecar/", 0o755, nil},
		{"usr/bin/sandbox-sidecar", 0o755, bin},
	} {
		h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: created, Format: tar.FormatPAX}
		if e.data == nil {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// tarDir writes dir's files into a tar at out, in name order, with fixed
// times and owners (the same inputs give the same archive).
func tarDir(dir, out string, created time.Time) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			names = append(names, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	for _, p := range names {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: created, Mode: 0o644, Format: tar.FormatPAX}
		if fi.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
		} else {
			h.Typeflag, h.Size = tar.TypeReg, fi.Size()
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.IsDir() {
			src, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, src)
			src.Close()
			if err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}
