package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/hashicorp/go-hclog"
)

// ent is one crafted tar entry.
type ent struct {
	name string
	typ  byte
	body string
	link string
	mode int64
}

func file(name, body string) ent { return ent{name: name, typ: tar.TypeReg, body: body, mode: 0o644} }
func dirEnt(name string) ent     { return ent{name: name, typ: tar.TypeDir, mode: 0o755} }
func symlink(name, target string) ent {
	return ent{name: name, typ: tar.TypeSymlink, link: target, mode: 0o777}
}
func hardlink(name, target string) ent {
	return ent{name: name, typ: tar.TypeLink, link: target, mode: 0o644}
}

var testTime = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

func tarOf(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, ModTime: testTime, Format: tar.FormatPAX}
		if e.typ == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if e.typ == tar.TypeChar || e.typ == tar.TypeBlock {
			hdr.Devmajor, hdr.Devminor = 1, 3
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("tar header %q: %v", e.name, err)
		}
		if hdr.Size > 0 {
			if _, err := io.WriteString(tw, e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gz(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// layerOf is a gzip layer of the crafted entries.
func layerOf(t testing.TB, ents ...ent) v1.Layer {
	t.Helper()
	return rawLayer(t, tarOf(t, ents...))
}

// rawLayer is a gzip layer of the bytes given as its uncompressed content.
func rawLayer(t testing.TB, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

var testConfig = v1.Config{
	Env:        []string{"PATH=/opt/bin:/usr/bin:/bin", "LANG=C.UTF-8"},
	Entrypoint: []string{"/bin/entry"},
	Cmd:        []string{"serve", "--port=1"},
	WorkingDir: "/srv",
	User:       "1000:1000",
}

// imageOf is an OCI image of the layers (each a list of entries).
func imageOf(t testing.TB, layers ...[]ent) v1.Image {
	t.Helper()
	var ls []v1.Layer
	for _, es := range layers {
		ls = append(ls, layerOf(t, es...))
	}
	return imageOfLayers(t, ls...)
}

func imageOfLayers(t testing.TB, ls ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, ls...)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, testConfig)
	if err != nil {
		t.Fatal(err)
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	return mutate.ConfigMediaType(img, types.OCIConfigJSON)
}

// layoutDir writes img as an OCI layout directory.
func layoutDir(t testing.TB, img v1.Image) string {
	t.Helper()
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tarDir is a tar stream of a directory's tree (what the CLI streams).
func tarDir(t testing.TB, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name = rel
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func ociArchive(t testing.TB, img v1.Image) []byte { return tarDir(t, layoutDir(t, img)) }

// dockerArchive is what `docker save` writes (via the library).
func dockerArchive(t testing.TB, img v1.Image) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := tarball.Write(name.MustParseReference("example.test/img:1"), img, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// legacyDockerArchive is the pre-25 `docker save` layout: <id>/layer.tar
// uncompressed, <config>.json, manifest.json.
func legacyDockerArchive(t testing.TB, layers ...[]byte) []byte {
	t.Helper()
	var diffIDs []v1.Hash
	var paths []string
	for i, l := range layers {
		diffIDs = append(diffIDs, sha256Hash(l))
		paths = append(paths, filepath.Join(string(rune('a'+i))+"layer", "layer.tar"))
	}
	cfg := v1.ConfigFile{OS: "linux", Architecture: "amd64", Config: testConfig,
		RootFS: v1.RootFS{Type: "layers", DiffIDs: diffIDs}}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfgName := sha256Hash(raw).Hex + ".json"
	man, _ := json.Marshal([]map[string]any{{"Config": cfgName, "RepoTags": []string{"example.test/img:1"}, "Layers": paths}})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(n string, b []byte) {
		if err := tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b))}); err != nil {
			t.Fatal(err)
		}
		tw.Write(b)
	}
	for i, l := range layers {
		tw.WriteHeader(&tar.Header{Name: filepath.Dir(paths[i]) + "/", Typeflag: tar.TypeDir, Mode: 0o755})
		add(paths[i], l)
	}
	add(cfgName, raw)
	add("manifest.json", man)
	tw.Close()
	return buf.Bytes()
}

// env is a store in parent/store next to parent/outside, a canary tree
// that no import may touch.
type env struct {
	t       testing.TB
	parent  string
	store   string
	outside string
	s       *Store
}

func newEnv(t testing.TB, lim Limits) *env {
	t.Helper()
	parent := t.TempDir()
	e := &env{t: t, parent: parent, store: filepath.Join(parent, "store"), outside: filepath.Join(parent, "outside")}
	if err := os.Mkdir(e.outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.outside, "canary"), []byte("canary"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.open(lim)
	return e
}

func testLogger(t testing.TB) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "image", Output: testWriter{t}, Level: hclog.Debug})
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

func (e *env) open(lim Limits) *Store {
	e.t.Helper()
	s, err := Open(e.store, lim, testLogger(e.t))
	if err != nil {
		e.t.Fatalf("Open: %v", err)
	}
	e.s = s
	return s
}

func (e *env) importBytes(name string, b []byte) (Info, error) {
	return e.s.ImportArchive(context.Background(), bytes.NewReader(b), name)
}

func (e *env) mustImport(name string, b []byte) Info {
	e.t.Helper()
	info, err := e.importBytes(name, b)
	if err != nil {
		e.t.Fatalf("import %s: %v", name, err)
	}
	return info
}

// checkOutside fails if anything outside the store changed.
func (e *env) checkOutside() {
	e.t.Helper()
	var got []string
	filepath.WalkDir(e.parent, func(p string, d fs.DirEntry, err error) error {
		if p == e.store {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(e.parent, p)
		got = append(got, rel)
		return nil
	})
	sort.Strings(got)
	want := []string{".", "outside", "outside/canary"}
	if !equalStrings(got, want) {
		e.t.Errorf("outside the store: %v, want %v", got, want)
	}
	if b, _ := os.ReadFile(filepath.Join(e.outside, "canary")); string(b) != "canary" {
		e.t.Errorf("canary changed: %q", b)
	}
}

// checkEmpty fails unless the store holds nothing: no name, no image, no
// debris.
func (e *env) checkEmpty() {
	e.t.Helper()
	if l := e.s.List(); len(l) != 0 {
		e.t.Errorf("store lists %v", l)
	}
	for _, d := range []string{"images", "names", "tmp"} {
		ents, err := os.ReadDir(filepath.Join(e.store, d))
		if err != nil {
			e.t.Fatal(err)
		}
		if len(ents) != 0 {
			var names []string
			for _, x := range ents {
				names = append(names, x.Name())
			}
			e.t.Errorf("%s/ holds %v", d, names)
		}
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func readRoot(t testing.TB, info Info, p string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(info.Root, p))
	if err != nil {
		t.Fatalf("read %s in the root: %v", p, err)
	}
	return string(b)
}

func exists(root, p string) bool {
	_, err := os.Lstat(filepath.Join(root, p))
	return err == nil
}

func layoutWriteEmpty(dir string) (layout.Path, error) { return layout.Write(dir, empty.Index) }

func layoutPlatform(arch string) layout.Option {
	return layout.WithPlatform(v1.Platform{OS: "linux", Architecture: arch})
}
