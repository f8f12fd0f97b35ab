package sandboximage

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// imageMarker is a file the test images carry in /etc, which no host has.
const imageMarker = "etc/sandbox-sidecar-image-test"

// imageEnv is the image config's environment the test images carry.
var imageEnv = []string{"PATH=/opt/image-test/bin:/usr/local/bin:/usr/bin:/bin", "IMAGE_TEST=from-the-image"}

// tarEntry is one entry of a tar the test makes in memory.
type tarEntry struct {
	name, link string
	data       []byte
	mode       int64
	typ        byte
}

func makeTar(t *testing.T, entries []tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Mode: e.mode, Typeflag: e.typ, Size: int64(len(e.data)), ModTime: time.Unix(1700000000, 0)}
		if hdr.Mode == 0 {
			hdr.Mode = 0o755
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func bytesLayer(t *testing.T, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// markerLayer adds imageMarker.
func markerLayer(t *testing.T) v1.Layer {
	return bytesLayer(t, makeTar(t, []tarEntry{
		{name: "etc/", typ: tar.TypeDir},
		{name: imageMarker, data: []byte("image\n"), mode: 0o644, typ: tar.TypeReg},
	}))
}

// withConfig gives img the test images' environment.
func withConfig(t *testing.T, img v1.Image) v1.Image {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg := cf.Config
	cfg.Env = imageEnv
	cfg.Cmd = []string{"/bin/sh"}
	out, err := mutate.Config(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// writeLayout writes img as an OCI image layout in a new directory.
func writeLayout(t *testing.T, img v1.Image) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return dir
}

// numpyLayout is the numpy image as an OCI layout: the debootstrapped
// rootfs as one layer, the marker as a second.
func numpyLayout(t *testing.T) string {
	t.Helper()
	rootfs := numpyRootfs(t)
	base, err := tarball.LayerFromFile(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, base, markerLayer(t))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	dir := writeLayout(t, withConfig(t, img))
	t.Logf("numpy image: OCI layout written in %s", time.Since(start).Round(time.Millisecond))
	return dir
}

// busyboxImage is an image of busybox-static alone: /bin/busybox and, with
// shell, its applets as symlinks (sh among them); no python, no libc.
func busyboxImage(t *testing.T, shell bool) v1.Image {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("needs busybox-static (/bin/busybox): %v", err)
		}
		t.Skipf("needs busybox-static (/bin/busybox): %v", err)
	}
	entries := []tarEntry{
		{name: "bin/", typ: tar.TypeDir}, {name: "usr/", typ: tar.TypeDir}, {name: "usr/bin/", typ: tar.TypeDir},
		{name: "etc/", typ: tar.TypeDir},
		{name: "bin/busybox", data: bb, typ: tar.TypeReg},
	}
	if shell {
		for _, a := range []string{"sh", "echo", "cat", "ls", "sleep", "true", "false", "env", "pwd", "test", "mkdir", "rm", "id", "head", "wc", "kill", "ps", "setsid", "sed", "dd", "chmod", "stat", "touch", "uname", "timeout", "printf", "tr"} {
			entries = append(entries, tarEntry{name: "bin/" + a, link: "busybox", typ: tar.TypeSymlink})
		}
	}
	img, err := mutate.AppendLayers(empty.Image, bytesLayer(t, makeTar(t, entries)), markerLayer(t))
	if err != nil {
		t.Fatal(err)
	}
	return withConfig(t, img)
}
