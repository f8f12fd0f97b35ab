package image

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"
)

// baseLayer is a small root: a shell-less tree with a file, a symlink, a
// hard link and an executable.
func baseLayer() []ent {
	return []ent{
		dirEnt("bin/"),
		{name: "bin/tool", typ: '0', body: "#!tool\n", mode: 0o755},
		dirEnt("etc/"),
		file("etc/os-release", "ID=test\n"),
		symlink("etc/alias", "os-release"),
		hardlink("etc/os-release.hard", "etc/os-release"),
		dirEnt("usr/"),
		dirEnt("usr/lib/"),
		file("usr/lib/libx.so", "ELF"),
	}
}

func checkBase(t *testing.T, info Info) {
	t.Helper()
	if got := readRoot(t, info, "etc/os-release"); got != "ID=test\n" {
		t.Errorf("os-release = %q", got)
	}
	if got := readRoot(t, info, "etc/alias"); got != "ID=test\n" {
		t.Errorf("through the symlink: %q", got)
	}
	if got := readRoot(t, info, "etc/os-release.hard"); got != "ID=test\n" {
		t.Errorf("hard link: %q", got)
	}
	a, _ := os.Stat(filepath.Join(info.Root, "etc/os-release"))
	b, _ := os.Stat(filepath.Join(info.Root, "etc/os-release.hard"))
	if !os.SameFile(a, b) {
		t.Errorf("hard link is not the same file")
	}
	fi, err := os.Stat(filepath.Join(info.Root, "bin/tool"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o555 {
		t.Errorf("bin/tool mode %v, want 0555 (no write bits)", fi.Mode())
	}
	if !fi.ModTime().Equal(testTime) {
		t.Errorf("bin/tool mtime %v, want %v", fi.ModTime(), testTime)
	}
	checkReadOnly(t, info.Root)
}

// checkReadOnly walks a root: directories 0755, files 0444 or 0555 (no
// write bit, no setuid/setgid/sticky), no device or FIFO.
func checkReadOnly(t *testing.T, root string) {
	t.Helper()
	rfi, err := os.Stat(root)
	if err != nil {
		t.Fatal(err)
	}
	if rfi.Mode().Perm() != 0o755 {
		t.Errorf("root mode %v, want 0755", rfi.Mode())
	}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := d.Info()
		m := fi.Mode()
		switch {
		case m&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0:
			t.Errorf("%s: special bits %v", p, m)
		case m&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe|fs.ModeSocket) != 0:
			t.Errorf("%s: special file %v", p, m)
		case m.IsDir() && m.Perm() != 0o755:
			t.Errorf("%s: directory mode %v, want 0755", p, m)
		case m.IsRegular() && m.Perm() != 0o444 && m.Perm() != 0o555:
			t.Errorf("%s: file mode %v, want 0444 or 0555", p, m)
		}
		return nil
	})
}

func TestImportFormats(t *testing.T) {
	img := imageOf(t, baseLayer())
	rootfs := tarOf(t, baseLayer()...)
	cases := []struct {
		name   string
		data   []byte
		source string
		config bool
	}{
		{"oci-layout", ociArchive(t, img), SourceOCILayout, true},
		{"docker-archive", dockerArchive(t, img), SourceDockerArchive, true},
		{"docker-legacy", legacyDockerArchive(t, rootfs), SourceDockerArchive, true},
		{"rootfs-tar", rootfs, SourceRootfsTar, false},
		{"rootfs-tar-gz", gz(t, rootfs), SourceRootfsTar, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, Limits{})
			info := e.mustImport(c.name, c.data)
			if info.Source != c.source {
				t.Errorf("source %q, want %q", info.Source, c.source)
			}
			if _, ok := digestHex(info.Digest); !ok {
				t.Errorf("digest %q", info.Digest)
			}
			if !filepath.IsAbs(info.Root) || !strings.HasPrefix(info.Root, e.store+"/") {
				t.Errorf("root %q not absolute under the store", info.Root)
			}
			checkBase(t, info)
			if c.config {
				if !slices.Equal(info.Env, testConfig.Env) || !slices.Equal(info.Cmd, testConfig.Cmd) ||
					!slices.Equal(info.Entrypoint, testConfig.Entrypoint) || info.WorkingDir != "/srv" || info.User != "1000:1000" {
					t.Errorf("config not carried: %+v", info)
				}
			} else if !slices.Equal(info.Env, []string{DefaultPath}) {
				t.Errorf("rootfs env %v", info.Env)
			}
			// 9 entries; bytes: tool 7 + os-release 8 (hard link once) + libx 3.
			if info.Files != 9 || info.Bytes != 18 {
				t.Errorf("files %d bytes %d, want 9 and 18", info.Files, info.Bytes)
			}
			if info.Created.IsZero() {
				t.Errorf("no created time")
			}
			got, err := e.s.Get(c.name)
			if err != nil || got.Digest != info.Digest || got.Root != info.Root {
				t.Errorf("Get = %+v, %v", got, err)
			}
			// Reopened, the store knows the image.
			s2 := e.open(Limits{})
			got, err = s2.Get(c.name)
			if err != nil || got.Digest != info.Digest || !slices.Equal(got.Env, info.Env) || got.Source != c.source || !got.Created.Equal(info.Created) {
				t.Errorf("after reopening: %+v, %v", got, err)
			}
			e.checkOutside()
		})
	}
}

func TestRootfsDigestIsOfTheUncompressedTar(t *testing.T) {
	e := newEnv(t, Limits{})
	raw := tarOf(t, baseLayer()...)
	a := e.mustImport("plain", raw)
	b := e.mustImport("zipped", gz(t, raw))
	if a.Digest != sha256Hash(raw).String() || b.Digest != a.Digest || a.Root != b.Root {
		t.Errorf("digests %s %s roots %s %s, want the tar's %s shared", a.Digest, b.Digest, a.Root, b.Root, sha256Hash(raw))
	}
}

func TestIdempotentAndShared(t *testing.T) {
	e := newEnv(t, Limits{})
	img := imageOf(t, baseLayer())
	a := e.mustImport("a", ociArchive(t, img))
	cfgName, _ := img.ConfigName()
	if a.Digest != cfgName.String() {
		t.Errorf("digest %s, want the config digest %s", a.Digest, cfgName)
	}
	// The same image again under the same name: no error, nothing changes.
	again := e.mustImport("a", ociArchive(t, img))
	if again.Digest != a.Digest || !again.Created.Equal(a.Created) {
		t.Errorf("re-import changed the record: %+v vs %+v", again, a)
	}
	// The same image through another format under another name: one root.
	b := e.mustImport("b", dockerArchive(t, img))
	if b.Digest != a.Digest || b.Root != a.Root {
		t.Errorf("b = %s at %s, want a's %s at %s", b.Digest, b.Root, a.Digest, a.Root)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.store, "images")); len(ents) != 1 {
		t.Errorf("%d image directories, want 1", len(ents))
	}
	// Another image under a taken name.
	other := imageOf(t, []ent{file("other", "x")})
	_, err := e.importBytes("a", ociArchive(t, other))
	if !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), "image rm a") {
		t.Errorf("another image under a: %v, want ErrExists saying how to replace", err)
	}
	if got, _ := e.s.Get("a"); got.Digest != a.Digest {
		t.Errorf("a re-pointed to %s", got.Digest)
	}
	// List is sorted.
	c := e.mustImport("0c", ociArchive(t, other))
	var names []string
	for _, i := range e.s.List() {
		names = append(names, i.Name)
	}
	if !slices.Equal(names, []string{"0c", "a", "b"}) {
		t.Errorf("List = %v", names)
	}
	// Removing one name keeps the shared root; removing the last removes it.
	if err := e.s.Remove("a"); err != nil {
		t.Fatal(err)
	}
	if !exists(b.Root, "etc/os-release") {
		t.Fatalf("root removed while b still names it")
	}
	if err := e.s.Remove("b"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b.Root); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("root still there after its last name went: %v", err)
	}
	if _, err := e.s.Get("b"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get(b) after remove: %v", err)
	}
	if err := e.s.Remove("b"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second remove: %v", err)
	}
	if !exists(c.Root, "other") {
		t.Errorf("unrelated image lost")
	}
	// Reopened: only 0c.
	s2 := e.open(Limits{})
	if l := s2.List(); len(l) != 1 || l[0].Name != "0c" {
		t.Errorf("after reopening: %+v", l)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.store, "tmp")); len(ents) != 0 {
		t.Errorf("tmp holds %d entries", len(ents))
	}
}

func TestNames(t *testing.T) {
	for _, n := range []string{"a", "python-3.12", "numpy_1.26", "0", strings.Repeat("x", 64)} {
		if err := CheckName(n); err != nil {
			t.Errorf("CheckName(%q) = %v", n, err)
		}
	}
	for _, n := range []string{"", "host", "Upper", "-lead", ".hidden", "a/b", "a b", "../x", "a:b", strings.Repeat("x", 65), "é"} {
		if err := CheckName(n); !errors.Is(err, ErrBadName) {
			t.Errorf("CheckName(%q) = %v, want ErrBadName", n, err)
		}
	}
	e := newEnv(t, Limits{})
	if _, err := e.importBytes("host", tarOf(t, file("x", "y"))); !errors.Is(err, ErrBadName) {
		t.Errorf("import as host: %v", err)
	}
	e.mustImport("alpha", tarOf(t, file("x", "y")))
	e.mustImport("beta", tarOf(t, file("x", "z")))
	_, err := e.s.Get("gamma")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "alpha, beta") || !strings.Contains(err.Error(), "host") {
		t.Errorf("Get(gamma) = %v, want ErrNotFound listing alpha, beta and host", err)
	}
}

func TestPullFromRegistry(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	if !strings.HasPrefix(host, "127.0.0.1:") {
		t.Fatalf("registry not on loopback: %s", host)
	}
	e := newEnv(t, Limits{})

	img := imageOf(t, baseLayer(), []ent{file("etc/os-release", "ID=second\n")})
	ref, err := name.ParseReference(host + "/test/base:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	info, err := e.s.ImportImage(context.Background(), pulled, "base", SourceRegistry)
	if err != nil {
		t.Fatal(err)
	}
	if info.Source != SourceRegistry || !slices.Equal(info.Env, testConfig.Env) {
		t.Errorf("info %+v", info)
	}
	if got := readRoot(t, info, "etc/os-release"); got != "ID=second\n" {
		t.Errorf("upper layer not applied: %q", got)
	}
	// A random image (random file content in several layers).
	rnd, err := random.Image(4096, 3)
	if err != nil {
		t.Fatal(err)
	}
	ref2, _ := name.ParseReference(host + "/test/random:1")
	if err := remote.Write(ref2, rnd); err != nil {
		t.Fatal(err)
	}
	pulled2, err := remote.Image(ref2)
	if err != nil {
		t.Fatal(err)
	}
	info2, err := e.s.ImportImage(context.Background(), pulled2, "random", "")
	if err != nil {
		t.Fatal(err)
	}
	if info2.Files != 3 || info2.Bytes != 3*4096 {
		t.Errorf("random image: %d files %d bytes, want 3 and %d", info2.Files, info2.Bytes, 3*4096)
	}
	// A pushed image with a hostile layer is refused on pull too.
	bad := imageOf(t, []ent{file("../../escape", "x")})
	ref3, _ := name.ParseReference(host + "/test/bad:1")
	if err := remote.Write(ref3, bad); err != nil {
		t.Fatal(err)
	}
	pulled3, err := remote.Image(ref3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.ImportImage(context.Background(), pulled3, "bad", SourceRegistry); !errors.Is(err, ErrBadImage) {
		t.Errorf("hostile pull: %v", err)
	}
	if _, err := e.s.Get("bad"); !errors.Is(err, ErrNotFound) {
		t.Errorf("hostile image named: %v", err)
	}
	e.checkOutside()
}

func TestConcurrentImports(t *testing.T) {
	e := newEnv(t, Limits{})
	img := imageOf(t, baseLayer())
	data := ociArchive(t, img)
	var wg sync.WaitGroup
	infos := make([]Info, 4)
	errs := make([]error, 4)
	for i := range infos {
		wg.Add(1)
		go func() {
			defer wg.Done()
			infos[i], errs[i] = e.importBytes(string(rune('a'+i)), data)
		}()
	}
	// Readers meanwhile.
	for range 50 {
		e.s.List()
		e.s.Get("a")
	}
	wg.Wait()
	for i := range infos {
		if errs[i] != nil {
			t.Fatalf("import %d: %v", i, errs[i])
		}
		if infos[i].Root != infos[0].Root {
			t.Errorf("import %d at %s, want the shared %s", i, infos[i].Root, infos[0].Root)
		}
	}
	if n, err := e.s.GC(); n != 0 || err != nil {
		t.Errorf("GC = %d, %v", n, err)
	}
}

func TestCancelled(t *testing.T) {
	e := newEnv(t, Limits{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := e.s.ImportArchive(ctx, strings.NewReader(string(tarOf(t, baseLayer()...))), "x")
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled import: %v", err)
	}
	// Cancelled in the middle: the hook cancels after the archive is
	// spooled, the unpack's next read stops.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	e.s.hook = func(stage string) {
		if stage == "spooled" {
			cancel()
		}
	}
	_, err = e.s.ImportArchive(ctx, strings.NewReader(string(tarOf(t, baseLayer()...))), "x")
	if !errors.Is(err, context.Canceled) {
		t.Errorf("import cancelled midway: %v", err)
	}
	e.checkEmpty()
}

func TestMultiPlatformLayout(t *testing.T) {
	amd := imageOf(t, []ent{file("arch", "amd64")})
	arm := imageOf(t, []ent{file("arch", "arm64")})
	dir := t.TempDir()
	p, err := layoutWriteEmpty(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(arm, layoutPlatform("arm64")); err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(amd, layoutPlatform("amd64")); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, Limits{})
	info := e.mustImport("multi", tarDir(t, dir))
	if got := readRoot(t, info, "arch"); got != "amd64" {
		t.Errorf("picked %q, want amd64", got)
	}
	// Two images without platforms: ambiguous.
	dir2 := t.TempDir()
	p2, _ := layoutWriteEmpty(dir2)
	p2.AppendImage(amd)
	p2.AppendImage(arm)
	if _, err := e.importBytes("two", tarDir(t, dir2)); !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "2 images") {
		t.Errorf("two images: %v", err)
	}
	// No image for this platform.
	dir3 := t.TempDir()
	p3, _ := layoutWriteEmpty(dir3)
	p3.AppendImage(arm, layoutPlatform("arm64"))
	if _, err := e.importBytes("arm", tarDir(t, dir3)); !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "linux/arm64") {
		t.Errorf("arm only: %v", err)
	}
}

// cutWriter passes the first n bytes of a response, then aborts the
// connection.
type cutWriter struct {
	http.ResponseWriter
	n int
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if len(p) > c.n {
		c.ResponseWriter.Write(p[:c.n])
		c.ResponseWriter.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}
	c.n -= len(p)
	return c.ResponseWriter.Write(p)
}

// TestPullConnectionLost: a registry that drops the connection in the
// middle of a layer fails the import as a read error, not a bad image, and
// nothing is kept.
func TestPullConnectionLost(t *testing.T) {
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	var cut atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cut.Load() && r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
			w = &cutWriter{ResponseWriter: w, n: 1000}
		}
		reg.ServeHTTP(w, r)
	}))
	defer srv.Close()
	ref, _ := name.ParseReference(strings.TrimPrefix(srv.URL, "http://") + "/test/big:1")
	rnd, err := random.Image(1<<20, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, rnd); err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := img.RawConfigFile(); err != nil { // fetched before the cut
		t.Fatal(err)
	}
	cut.Store(true)
	e := newEnv(t, Limits{})
	_, err = e.s.ImportImage(context.Background(), img, "big", SourceRegistry)
	if err == nil || errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "reading layer 1") {
		t.Errorf("connection lost: %v, want a read error that is not ErrBadImage", err)
	}
	e.checkEmpty()
}

// TestRemoveDuringReimport: the image a second import found in the store
// is removed before that import binds its name: the import unpacks it
// again instead of failing or binding a name to nothing.
func TestRemoveDuringReimport(t *testing.T) {
	e := newEnv(t, Limits{})
	data := tarOf(t, baseLayer()...)
	e.mustImport("a", data)
	e.s.hook = func(stage string) {
		if stage == "prechecked" {
			e.s.hook = nil
			if err := e.s.Remove("a"); err != nil {
				t.Error(err)
			}
		}
	}
	b := e.mustImport("b", data)
	checkBase(t, b)
	if l := e.s.List(); len(l) != 1 || l[0].Name != "b" {
		t.Errorf("List = %+v", l)
	}
	s2 := e.open(Limits{})
	if got, err := s2.Get("b"); err != nil || got.Root != b.Root {
		t.Errorf("after reopening: %+v, %v", got, err)
	}
	checkBase(t, b)
}

func TestZstd(t *testing.T) {
	e := newEnv(t, Limits{})
	raw := tarOf(t, baseLayer()...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil },
		tarball.WithCompression(compression.ZStd), tarball.WithMediaType(types.OCILayerZStd))
	if err != nil {
		t.Fatal(err)
	}
	info := e.mustImport("zstd-layer", ociArchive(t, imageOfLayers(t, l)))
	checkBase(t, info)
	// A zstd rootfs tar.
	var buf bytes.Buffer
	zw, _ := zstd.NewWriter(&buf)
	zw.Write(raw)
	zw.Close()
	info = e.mustImport("zstd-rootfs", buf.Bytes())
	if info.Source != SourceRootfsTar || info.Digest != sha256Hash(raw).String() {
		t.Errorf("zstd rootfs: %+v", info)
	}
	checkBase(t, info)
}
