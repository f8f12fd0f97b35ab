package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestHostileImages feeds crafted layers, each as an OCI image and as a
// rootfs tar where it fits in one layer: each is refused with its error,
// the store keeps nothing, and nothing outside the store changes.
func TestHostileImages(t *testing.T) {
	outsideMarker := "OUTSIDE" // replaced by the env's outside directory
	cases := []struct {
		name   string
		layers [][]ent
		lim    Limits
		want   error
		msg    []string
	}{
		{name: "dotdot", layers: [][]ent{{file("../../outside/pwned", "x")}},
			want: ErrBadImage, msg: []string{`"../../outside/pwned"`, `".." in path`}},
		{name: "dotdot-inside", layers: [][]ent{{dirEnt("a/"), file("a/../../pwned", "x")}},
			want: ErrBadImage, msg: []string{`".." in path`}},
		{name: "absolute", layers: [][]ent{{file("OUTSIDE/pwned", "x")}},
			want: ErrBadImage, msg: []string{"absolute path"}},
		{name: "hardlink-outside", layers: [][]ent{{hardlink("h", "../outside/canary")}},
			want: ErrBadImage, msg: []string{`entry "h"`, `hard link target`, `".." in path`}},
		{name: "hardlink-absolute", layers: [][]ent{{hardlink("h", "OUTSIDE/canary")}},
			want: ErrBadImage, msg: []string{"hard link target", "absolute path"}},
		{name: "hardlink-before-target", layers: [][]ent{{hardlink("h", "later"), file("later", "x")}},
			want: ErrBadImage, msg: []string{`entry "h"`, "not unpacked before it"}},
		{name: "hardlink-to-symlink", layers: [][]ent{{symlink("s", "OUTSIDE/canary"), hardlink("h", "s")}},
			want: ErrBadImage, msg: []string{"symlink, not a regular file"}},
		{name: "hardlink-to-dir", layers: [][]ent{{dirEnt("d/"), hardlink("h", "d")}},
			want: ErrBadImage, msg: []string{"directory, not a regular file"}},
		{name: "hardlink-through-escaping-symlink", layers: [][]ent{{symlink("s", "OUTSIDE"), hardlink("h", "s/canary")}},
			want: ErrBadImage, msg: []string{`entry "h"`, "out of the image root"}},
		{name: "symlink-absolute-redirect", layers: [][]ent{{symlink("evil", "OUTSIDE"), file("evil/pwned", "x")}},
			want: ErrBadImage, msg: []string{`entry "evil/pwned"`, "out of the image root through a symlink"}},
		{name: "symlink-relative-redirect", layers: [][]ent{{symlink("evil", "../../../outside"), file("evil/pwned", "x")}},
			want: ErrBadImage, msg: []string{`entry "evil/pwned"`, "out of the image root"}},
		{name: "symlink-dotdot-redirect", layers: [][]ent{{dirEnt("a/"), symlink("a/up", "../.."), file("a/up/outside/pwned", "x")}},
			want: ErrBadImage, msg: []string{"out of the image root"}},
		{name: "symlink-redirect-dir", layers: [][]ent{{symlink("evil", "../outside"), dirEnt("evil/newdir/")}},
			want: ErrBadImage, msg: []string{`entry "evil/newdir/"`}},
		{name: "symlink-redirect-across-layers", layers: [][]ent{{symlink("lib", "OUTSIDE")}, {file("lib/pwned", "x")}},
			want: ErrBadImage, msg: []string{"layer 2", `entry "lib/pwned"`, "out of the image root"}},
		{name: "symlink-redirect-whiteout", layers: [][]ent{{symlink("evil", "OUTSIDE")}, {file("evil/.wh.canary", "")}},
			want: ErrBadImage, msg: []string{`entry "evil/.wh.canary"`, "out of the image root"}},
		{name: "symlink-redirect-opaque", layers: [][]ent{{symlink("evil", "OUTSIDE")}, {file("evil/.wh..wh..opq", "")}},
			want: ErrBadImage, msg: []string{`entry "evil/.wh..wh..opq"`, "not a directory"}},
		{name: "unsupported-type", layers: [][]ent{{{name: "vol", typ: tar.TypeCont, mode: 0o644}}},
			want: ErrBadImage, msg: []string{`entry "vol"`, "unsupported entry type"}},
		{name: "too-many-files", lim: Limits{MaxFiles: 5}, layers: [][]ent{{file("a", "1"), file("b", "2"), file("c", "3")}, {file("d", "4"), file("e", "5"), file("f", "6")}},
			want: ErrTooLarge, msg: []string{"max_files"}},
		{name: "too-many-bytes", lim: Limits{MaxBytes: 10}, layers: [][]ent{{file("a", "12345")}, {file("b", "123456")}},
			want: ErrTooLarge, msg: []string{"layer 2", `entry "b"`, "max_bytes"}},
	}
	for _, c := range cases {
		for _, format := range []string{"oci", "docker", "rootfs"} {
			if format == "rootfs" && len(c.layers) > 1 {
				continue
			}
			t.Run(c.name+"/"+format, func(t *testing.T) {
				e := newEnv(t, c.lim)
				var layers [][]ent
				for _, l := range c.layers {
					var es []ent
					for _, x := range l {
						x.name = strings.Replace(x.name, outsideMarker, e.outside, 1)
						x.link = strings.Replace(x.link, outsideMarker, e.outside, 1)
						es = append(es, x)
					}
					layers = append(layers, es)
				}
				var data []byte
				switch format {
				case "oci":
					data = ociArchive(t, imageOf(t, layers...))
				case "docker":
					data = dockerArchive(t, imageOf(t, layers...))
				default:
					data = tarOf(t, layers[0]...)
				}
				_, err := e.importBytes("hostile", data)
				if !errors.Is(err, c.want) {
					t.Fatalf("import: %v, want %v", err, c.want)
				}
				for _, m := range c.msg {
					if !strings.Contains(err.Error(), m) {
						t.Errorf("error %q does not say %q", err, m)
					}
				}
				t.Logf("refused: %v", err)
				e.checkEmpty()
				e.checkOutside()
			})
		}
	}
}

// TestNeutralised: device nodes and FIFOs are skipped, special and write
// bits dropped, symlinks kept as data; the import succeeds.
func TestNeutralised(t *testing.T) {
	e := newEnv(t, Limits{})
	data := tarOf(t,
		dirEnt("dev/"),
		ent{name: "dev/null", typ: tar.TypeChar, mode: 0o666},
		ent{name: "dev/sda", typ: tar.TypeBlock, mode: 0o660},
		ent{name: "run/fifo", typ: tar.TypeFifo, mode: 0o644},
		file("opt/deep/f", "made its parents"),
		ent{name: "bin/su", typ: tar.TypeReg, body: "su", mode: 0o4755},
		ent{name: "bin/wall", typ: tar.TypeReg, body: "wall", mode: 0o2755},
		ent{name: "etc/shadow", typ: tar.TypeReg, body: "root:*", mode: 0o640},
		ent{name: "etc/world", typ: tar.TypeReg, body: "w", mode: 0o666},
		ent{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		ent{name: "root/", typ: tar.TypeDir, mode: 0o700},
		ent{name: "ro/", typ: tar.TypeDir, mode: 0o555},
		symlink("etc/escape", e.outside+"/canary"),
		symlink("etc/up", "../../../../outside/canary"),
	)
	info := e.mustImport("neutral", data)
	for _, p := range []string{"dev/null", "dev/sda", "run/fifo", "run"} {
		if exists(info.Root, p) {
			t.Errorf("%s was created", p)
		}
	}
	wantModes := map[string]os.FileMode{
		"bin/su":     0o555,
		"bin/wall":   0o555,
		"etc/shadow": 0o444,
		"etc/world":  0o444,
		"tmp":        os.ModeDir | 0o755,
		"root":       os.ModeDir | 0o755,
		"ro":         os.ModeDir | 0o755,
		"opt":        os.ModeDir | 0o755, // made on the way
		"opt/deep":   os.ModeDir | 0o755,
	}
	for p, want := range wantModes {
		fi, err := os.Lstat(filepath.Join(info.Root, p))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode() & (os.ModeDir | os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky); got != want {
			t.Errorf("%s: mode %v, want %v", p, got, want)
		}
	}
	if l, _ := os.Readlink(filepath.Join(info.Root, "etc/escape")); l != e.outside+"/canary" {
		t.Errorf("symlink target %q not kept as data", l)
	}
	checkReadOnly(t, info.Root)
	e.checkOutside()
}

// TestWhiteouts applies the OCI spec's whiteouts across layers.
func TestWhiteouts(t *testing.T) {
	e := newEnv(t, Limits{})
	img := imageOf(t,
		[]ent{
			file("a/x", "x"), file("a/y", "y"),
			file("d/keep", "k"), file("d/old/deep", "o"),
			file("e/f", "f"),
			file("z/inner", "i"),
			file("same", "s"),
			file("root-level", "r"),
			file("link-target", "t"), hardlink("hl", "link-target"),
		},
		[]ent{
			file("a/.wh.x", ""),                      // x hidden, y stays
			dirEnt("d/"), file("d/.wh..wh..opq", ""), // d's lower content hidden
			file("d/new", "n"),                           // ...but not this layer's
			file("e/g", "g"), file("e/.wh..wh..opq", ""), // marker after this layer's entry
			file(".wh.z", ""),                         // a whole directory hidden
			file("fresh", "1"), file(".wh.fresh", ""), // same layer: not hidden
			file(".wh.never-existed", ""),
			file(".wh.link-target", ""), // the hard link survives its target's whiteout
		},
		[]ent{
			file("z/again", "a"), // re-created above the whiteout
		},
	)
	info := e.mustImport("wh", ociArchive(t, img))
	present := []string{"a/y", "d/new", "e/g", "same", "root-level", "fresh", "z/again", "hl"}
	absent := []string{"a/x", "a/.wh.x", "d/keep", "d/old", "d/.wh..wh..opq", "e/f", "e/.wh..wh..opq", "z/inner", ".wh.z", ".wh.fresh", "link-target"}
	for _, p := range present {
		if !exists(info.Root, p) {
			t.Errorf("%s missing", p)
		}
	}
	for _, p := range absent {
		if exists(info.Root, p) {
			t.Errorf("%s present", p)
		}
	}
	if got := readRoot(t, info, "hl"); got != "t" {
		t.Errorf("hard link content %q", got)
	}
	// Opaque at the root: only the upper layer's entries remain.
	img2 := imageOf(t, []ent{file("low", "l"), file("dir/low", "l")}, []ent{file(".wh..wh..opq", ""), file("dir/up", "u")})
	info2 := e.mustImport("opaque-root", ociArchive(t, img2))
	if exists(info2.Root, "low") || exists(info2.Root, "dir/low") || !exists(info2.Root, "dir/up") {
		t.Errorf("opaque root: low %v dir/low %v dir/up %v", exists(info2.Root, "low"), exists(info2.Root, "dir/low"), exists(info2.Root, "dir/up"))
	}
}

// TestReplacement: a later entry replaces an earlier one of another type,
// never writing through it; a symlink inside the root may be followed.
func TestReplacement(t *testing.T) {
	e := newEnv(t, Limits{})
	img := imageOf(t,
		[]ent{file("target", "original"), hardlink("hl", "target"), symlink("sl", "target"), file("d/x", "x"),
			dirEnt("real/"), symlink("alias", "real"), symlink("abs", "/real")},
		[]ent{file("hl", "new"), file("sl", "new"), file("d", "now a file"), dirEnt("target/"), file("alias/f", "via alias")},
	)
	info := e.mustImport("rep", ociArchive(t, img))
	if got := readRoot(t, info, "hl"); got != "new" {
		t.Errorf("hl %q", got)
	}
	fi, _ := os.Lstat(filepath.Join(info.Root, "sl"))
	if !fi.Mode().IsRegular() {
		t.Errorf("sl is %v, want a regular file", fi.Mode())
	}
	if fi, _ := os.Lstat(filepath.Join(info.Root, "target")); !fi.IsDir() {
		t.Errorf("target not replaced by a directory")
	}
	if got := readRoot(t, info, "d"); got != "now a file" {
		t.Errorf("d %q", got)
	}
	if got := readRoot(t, info, "real/f"); got != "via alias" {
		t.Errorf("real/f %q", got)
	}
	// An absolute symlink is not followed by the unpacker, even to a path
	// that would exist inside the root.
	img2 := imageOf(t, []ent{dirEnt("real/"), symlink("abs", "/real")}, []ent{file("abs/f", "x")})
	if _, err := e.importBytes("abs", ociArchive(t, img2)); !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), `entry "abs/f"`) {
		t.Errorf("write through an absolute symlink: %v", err)
	}
	// Through a symlink to a file: refused.
	img3 := imageOf(t, []ent{file("f", "x"), symlink("s", "f")}, []ent{file("s/y", "x")})
	if _, err := e.importBytes("sf", ociArchive(t, img3)); !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "non-directory") {
		t.Errorf("write through a symlink to a file: %v", err)
	}
	e.checkOutside()
}

func TestDigestMismatch(t *testing.T) {
	body := strings.Repeat("A", 600)
	raw := tarOf(t, file("data", body))
	layer := static.NewLayer(raw, types.OCIUncompressedLayer)
	img := imageOfLayers(t, layer)
	digest, _ := layer.Digest()

	tamper := func(t *testing.T, dir string, h string, f func([]byte) []byte) {
		p := filepath.Join(dir, "blobs", "sha256", h)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, f(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("layer content", func(t *testing.T) {
		e := newEnv(t, Limits{})
		dir := layoutDir(t, img)
		tamper(t, dir, digest.Hex, func(b []byte) []byte { return bytes.Replace(b, []byte("AAAA"), []byte("BBBB"), 1) })
		_, err := e.importBytes("x", tarDir(t, dir))
		if !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "content has digest") || !strings.Contains(err.Error(), digest.String()) {
			t.Errorf("tampered layer: %v", err)
		}
		e.checkEmpty()
	})
	t.Run("layer size", func(t *testing.T) {
		e := newEnv(t, Limits{})
		dir := layoutDir(t, img)
		tamper(t, dir, digest.Hex, func(b []byte) []byte { return append(b, make([]byte, 1024)...) })
		_, err := e.importBytes("x", tarDir(t, dir))
		if !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "the manifest says") {
			t.Errorf("grown layer: %v", err)
		}
		e.checkEmpty()
	})
	t.Run("config", func(t *testing.T) {
		e := newEnv(t, Limits{})
		dir := layoutDir(t, img)
		cfg, _ := img.ConfigName()
		tamper(t, dir, cfg.Hex, func(b []byte) []byte { return bytes.Replace(b, []byte("/srv"), []byte("/xyz"), 1) })
		_, err := e.importBytes("x", tarDir(t, dir))
		if !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "config has digest") {
			t.Errorf("tampered config: %v", err)
		}
		e.checkEmpty()
	})
	t.Run("manifest", func(t *testing.T) {
		e := newEnv(t, Limits{})
		dir := layoutDir(t, img)
		m, _ := img.Digest()
		cfg, _ := img.ConfigName()
		// Same size, one hex digit of the config digest changed.
		flip := strings.Replace(cfg.Hex, cfg.Hex[:1], map[bool]string{true: "1", false: "0"}[cfg.Hex[0] == '0'], 1)
		tamper(t, dir, m.Hex, func(b []byte) []byte { return bytes.Replace(b, []byte(cfg.Hex), []byte(flip), 1) })
		_, err := e.importBytes("x", tarDir(t, dir))
		if !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "manifest has digest") {
			t.Errorf("tampered manifest: %v", err)
		}
		e.checkEmpty()
	})
	t.Run("docker diff_id", func(t *testing.T) {
		e := newEnv(t, Limits{})
		data := legacyDockerArchive(t, raw)
		data = bytes.Replace(data, []byte(body), []byte(strings.Repeat("B", 600)), 1)
		_, err := e.importBytes("x", data)
		if !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "uncompressed content has digest") {
			t.Errorf("tampered docker layer: %v", err)
		}
		e.checkEmpty()
	})
}

func TestLimits(t *testing.T) {
	t.Run("gzip bomb", func(t *testing.T) {
		// 24 MiB of zeros in a file, a few KiB compressed: refused while
		// spooling (the archive cap is 1 MiB + 10 KiB + 16 MiB here),
		// nothing kept.
		e := newEnv(t, Limits{MaxBytes: 1 << 20, MaxFiles: 10})
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "zeros", Typeflag: tar.TypeReg, Size: 24 << 20, Mode: 0o644})
		tw.Write(make([]byte, 24<<20))
		tw.Close()
		bomb := gz(t, buf.Bytes())
		t.Logf("bomb: %d bytes compressed", len(bomb))
		_, err := e.importBytes("bomb", bomb)
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "archive over") {
			t.Errorf("bomb: %v", err)
		}
		e.checkEmpty()
		// The same as a layer of an image: refused at the entry.
		_, err = e.importBytes("bomb", ociArchive(t, imageOfLayers(t, static.NewLayer(bomb, types.OCILayer))))
		if !errors.Is(err, ErrTooLarge) {
			t.Errorf("bomb layer: %v", err)
		}
		e.checkEmpty()
	})
	t.Run("one file over", func(t *testing.T) {
		e := newEnv(t, Limits{MaxBytes: 100})
		_, err := e.importBytes("big", tarOf(t, file("a", strings.Repeat("x", 101))))
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), `entry "a"`) {
			t.Errorf("101 bytes: %v", err)
		}
		e.checkEmpty()
		if _, err := e.importBytes("fits", tarOf(t, file("a", strings.Repeat("x", 100)))); err != nil {
			t.Errorf("100 bytes: %v", err)
		}
	})
	t.Run("files counted in a rootfs", func(t *testing.T) {
		e := newEnv(t, Limits{MaxFiles: 3})
		_, err := e.importBytes("many", tarOf(t, file("a", ""), file("b", ""), file("c", ""), file("d", "")))
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "max_files") {
			t.Errorf("4 files: %v", err)
		}
		e.checkEmpty()
	})
	t.Run("negative", func(t *testing.T) {
		if _, err := Open(t.TempDir(), Limits{MaxBytes: -1}, nil); err == nil {
			t.Errorf("negative limits accepted")
		}
	})
}

func TestNotAnArchive(t *testing.T) {
	e := newEnv(t, Limits{})
	for name, data := range map[string][]byte{
		"garbage":   bytes.Repeat([]byte("not a tar "), 100),
		"empty":     nil,
		"empty tar": tarOf(t),
		"bad gzip":  append([]byte{0x1f, 0x8b}, bytes.Repeat([]byte{0}, 100)...),
		"truncated": tarOf(t, file("a", strings.Repeat("x", 2000)))[:1200],
	} {
		_, err := e.importBytes("x", data)
		if !errors.Is(err, ErrBadImage) {
			t.Errorf("%s: %v, want ErrBadImage", name, err)
		}
	}
	e.checkEmpty()
	// A docker manifest.json naming two images, and one that is broken.
	for m, want := range map[string]string{
		`[{"Config":"a.json","Layers":[]},{"Config":"a.json","Layers":[]}]`: "lists 2 images",
		`[{"Config":"a.json","Lay`: "manifest.json",
	} {
		data := tarOf(t, file("a.json", "{}"), file("manifest.json", m))
		if _, err := e.importBytes("x", data); !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), want) {
			t.Errorf("manifest.json %s: %v, want ErrBadImage saying %q", m, err, want)
		}
	}
	// A root filesystem with a /manifest.json of its own stays one.
	if info, err := e.importBytes("rootfs-with-manifest", tarOf(t, file("manifest.json", `{"name":"app"}`))); err != nil || info.Source != SourceRootfsTar {
		t.Errorf("rootfs with manifest.json: %+v, %v", info, err)
	}
	e.s.Remove("rootfs-with-manifest")
	e.checkEmpty()
}

func TestTrailingDataAndHugeMetadata(t *testing.T) {
	e := newEnv(t, Limits{})
	raw := append(tarOf(t, file("a", "1")), make([]byte, 2<<20)...)
	img := imageOfLayers(t, rawLayer(t, raw))
	if _, err := e.importBytes("trail", ociArchive(t, img)); !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "after the tar end") {
		t.Errorf("2 MiB after the tar end: %v", err)
	}
	// Padding a real tar writer leaves (under 1 MiB) is fine.
	ok := imageOfLayers(t, rawLayer(t, append(tarOf(t, file("a", "1")), make([]byte, 10240)...)))
	if _, err := e.importBytes("padded", ociArchive(t, ok)); err != nil {
		t.Errorf("padded layer: %v", err)
	}
	e.s.Remove("padded")
	// A config over 4 MiB is refused before it is read.
	big, err := mutate.Config(imageOf(t, []ent{file("a", "1")}), v1.Config{Env: []string{"X=" + strings.Repeat("x", maxMetaBytes)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.importBytes("bigcfg", ociArchive(t, big)); !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "at most") {
		t.Errorf("5 MiB config: %v", err)
	}
	e.checkEmpty()
}

// FuzzImportRootfs feeds arbitrary bytes as an archive: never a panic or a
// hang; a refusal keeps nothing; what is accepted is read-only.
func FuzzImportRootfs(f *testing.F) {
	f.Add(tarOf(f, baseLayer()...))
	f.Add(tarOf(f, symlink("s", ".."), file("s/x", "1")))
	f.Add(tarOf(f, file("a/.wh..wh..opq", ""), file(".wh.a", ""), hardlink("h", "a")))
	f.Add(gz(f, tarOf(f, file("x", "y"))))
	f.Fuzz(func(t *testing.T, data []byte) {
		e := newEnv(t, Limits{MaxBytes: 1 << 20, MaxFiles: 1000})
		info, err := e.importBytes("fuzz", data)
		if err != nil {
			if !errors.Is(err, ErrBadImage) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("unclassified error: %v", err)
			}
			e.checkEmpty()
		} else {
			checkReadOnly(t, info.Root)
		}
		e.checkOutside()
	})
}
