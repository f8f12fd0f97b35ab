package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// ImportArchive imports the archive read from r under name. It detects the
// format: an OCI layout as a tar stream (oci-layout and index.json at the
// top: what skopeo, podman and docker 25+ save), a legacy `docker save`
// tar (manifest.json), or else a plain rootfs tar; the stream may be gzip-
// or zstd-compressed. The archive is spooled under the store first (the
// formats need random access), capped by Limits.
//
// Importing is idempotent by digest: content already in the store is not
// unpacked again, and the new name shares its root. A name already bound
// to other content is ErrExists. Imports run one at a time; ctx bounds the
// wait and the import.
func (s *Store) ImportArchive(ctx context.Context, r io.Reader, name string) (Info, error) {
	if err := CheckName(name); err != nil {
		return Info{}, err
	}
	return s.runImport(ctx, name, func(w *work) (Info, error) {
		sp, err := s.spool(ctx, r, filepath.Join(w.dir, "archive.tar"))
		if err != nil {
			return Info{}, err
		}
		s.at("spooled")
		switch sp.kind {
		case SourceOCILayout:
			return s.importOCI(ctx, w, sp, name)
		case SourceDockerArchive:
			return s.importDocker(ctx, w, sp, name)
		default:
			return s.importRootfs(ctx, w, sp, name)
		}
	})
}

// ImportImage imports img (typically pulled by the caller with
// go-containerregistry's remote package) under name; source is recorded
// in Info.Source (SourceRegistry for a pull). Every layer's compressed
// digest and size is checked against the manifest and its uncompressed
// digest against the config, and the config against the manifest.
func (s *Store) ImportImage(ctx context.Context, img v1.Image, name string, source string) (Info, error) {
	if err := CheckName(name); err != nil {
		return Info{}, err
	}
	if source == "" {
		source = SourceRegistry
	}
	return s.runImport(ctx, name, func(w *work) (Info, error) {
		return s.importV1(ctx, w, img, name, source, nil, nil)
	})
}

// runImport takes the import slot and a work directory, runs fn, and
// removes the work directory whatever happened.
func (s *Store) runImport(ctx context.Context, name string, fn func(*work) (Info, error)) (Info, error) {
	select {
	case s.importSem <- struct{}{}:
	case <-ctx.Done():
		return Info{}, fmt.Errorf("image store: waiting for another import: %w", ctx.Err())
	}
	defer func() { <-s.importSem }()
	w, err := s.newWork("import-")
	if err != nil {
		return Info{}, fmt.Errorf("image store: %w", err)
	}
	defer w.close()
	start := time.Now()
	info, err := fn(w)
	if err != nil {
		s.log.Warn("image import failed", "name", name, "error", err, "duration", time.Since(start))
		return Info{}, err
	}
	s.log.Info("image imported", "name", name, "digest", info.Digest, "source", info.Source,
		"bytes", info.Bytes, "files", info.Files, "duration", time.Since(start))
	return info, nil
}

// work is a directory under tmp/ that GC leaves alone while it exists.
type work struct {
	s   *Store
	dir string
}

func (s *Store) newWork(prefix string) (*work, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, err := os.MkdirTemp(s.tmpDir(), prefix)
	if err != nil {
		return nil, err
	}
	s.busy[filepath.Base(d)] = true
	return &work{s: s, dir: d}, nil
}

func (w *work) close() {
	if err := os.RemoveAll(w.dir); err != nil {
		w.s.log.Warn("image store: cannot remove an import's work directory (GC retries)", "dir", w.dir, "error", err)
	}
	w.s.mu.Lock()
	delete(w.s.busy, filepath.Base(w.dir))
	w.s.mu.Unlock()
}

// badf builds an ErrBadImage error.
func badf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadImage, fmt.Sprintf(format, args...))
}

// ctxReader fails reads once ctx is done, so a cancelled import stops at
// its next read.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// srcReader remembers the errors of the caller's reader, so that a read
// error of the source (a client gone) is not reported as a bad image.
type srcReader struct {
	r   io.Reader
	err error
}

func (s *srcReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}

// capReader fails with ErrTooLarge once more than max bytes were read.
type capReader struct {
	r    io.Reader
	n    int64
	max  int64
	what string
}

func (c *capReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n > c.max {
		return n, fmt.Errorf("%w: %s over %d bytes", ErrTooLarge, c.what, c.max)
	}
	return n, err
}

// decompressor sniffs gzip or zstd magic and returns a reader of the
// decompressed stream (or br itself), and a function releasing it.
func decompressor(br *bufio.Reader) (io.Reader, func(), error) {
	magic, _ := br.Peek(4)
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, badf("gzip: %v", err)
		}
		return zr, func() { zr.Close() }, nil
	case len(magic) == 4 && bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		// The window bound keeps a hostile frame from making the decoder
		// allocate gigabytes; real images use a few MiB.
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(64<<20), zstd.WithDecoderMaxMemory(256<<20))
		if err != nil {
			return nil, nil, badf("zstd: %v", err)
		}
		return zr, zr.Close, nil
	}
	return br, func() {}, nil
}

// spooled is an archive copied (decompressed) into the work directory.
type spooled struct {
	path    string
	digest  v1.Hash // of the decompressed tar stream
	kind    string  // a Source* constant
	entries map[string]archEntry
}

type archEntry struct {
	typ  byte
	size int64
}

// spool copies r, decompressed, to p (capped), hashes it, lists its
// entries and decides its format.
func (s *Store) spool(ctx context.Context, r io.Reader, p string) (*spooled, error) {
	src := &srcReader{r: ctxReader{ctx, r}}
	br := bufio.NewReaderSize(src, 64<<10)
	dec, release, err := decompressor(br)
	if err != nil {
		return nil, err
	}
	defer release()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	cr := &capReader{r: dec, max: s.lim.archiveCap(), what: "archive"}
	buf := make([]byte, 256<<10)
	if _, err := io.CopyBuffer(io.MultiWriter(f, h), cr, buf); err != nil {
		switch {
		case errors.Is(err, ErrTooLarge):
			return nil, err
		case ctx.Err() != nil:
			return nil, fmt.Errorf("image store: import cancelled: %w", ctx.Err())
		case src.err != nil:
			return nil, fmt.Errorf("image store: reading the archive: %w", src.err)
		case isResourceErr(err):
			return nil, fmt.Errorf("image store: spooling the archive: %w", err)
		}
		return nil, badf("archive stream: %v", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	sp := &spooled{path: p, digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}}
	if err := s.scan(sp); err != nil {
		return nil, err
	}
	return sp, nil
}

// scan lists the spooled tar's entries (skipping their data) and decides
// the format. A tar bigger than an image archive is a rootfs.
func (s *Store) scan(sp *spooled) error {
	f, err := os.Open(sp.path)
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	sp.entries = map[string]archEntry{}
	overflow := false
	var n int64
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if n == 0 {
				return badf("not a tar archive (nor a gzip or zstd of one): %v", err)
			}
			return badf("malformed tar after %d entries: %v", n, err)
		}
		// No count cap here: the archive's size is capped, and the
		// unpacker counts a rootfs's entries against max_files.
		n++
		if overflow {
			continue
		}
		if n > maxArchiveEntries {
			overflow, sp.entries = true, nil
			continue
		}
		sp.entries[archName(hdr.Name)] = archEntry{typ: hdr.Typeflag, size: hdr.Size}
	}
	if n == 0 {
		return badf("the archive is empty")
	}
	sp.kind = SourceRootfsTar
	if overflow {
		return nil
	}
	if sp.hasReg("oci-layout") && sp.hasReg("index.json") {
		var ol struct {
			Version string `json:"imageLayoutVersion"`
		}
		if data, err := s.readArchived(sp, "oci-layout"); err == nil && json.Unmarshal(data, &ol) == nil && ol.Version != "" {
			sp.kind = SourceOCILayout
			return nil
		}
	}
	if sp.hasReg("manifest.json") {
		// A JSON array is docker's (and then must parse); a root
		// filesystem that happens to have a /manifest.json of another
		// shape stays a root filesystem.
		data, err := s.readArchived(sp, "manifest.json")
		if err != nil {
			return err
		}
		if t := bytes.TrimLeft(data, " \t\r\n"); len(t) > 0 && t[0] == '[' {
			if _, err := s.dockerManifest(sp); err != nil {
				return err
			}
			sp.kind = SourceDockerArchive
		}
	}
	return nil
}

func (sp *spooled) hasReg(name string) bool {
	e, ok := sp.entries[name]
	return ok && isReg(e)
}

func isReg(e archEntry) bool { return e.typ == tar.TypeReg || e.typ == tar.TypeRegA }

// archName is an archive member's name as the formats look it up.
func archName(n string) string {
	return path.Clean("/" + n)[1:]
}

// readArchived returns a small regular member of the spooled archive.
func (s *Store) readArchived(sp *spooled, name string) ([]byte, error) {
	e, ok := sp.entries[name]
	if !ok || !isReg(e) {
		return nil, badf("%s: missing or not a regular file", name)
	}
	if e.size > maxMetaBytes {
		return nil, badf("%s: %d bytes, at most %d", name, e.size, maxMetaBytes)
	}
	f, err := os.Open(sp.path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err != nil {
			return nil, badf("%s: %v", name, err)
		}
		if archName(hdr.Name) == name && isReg(archEntry{typ: hdr.Typeflag}) {
			return io.ReadAll(io.LimitReader(tr, maxMetaBytes))
		}
	}
}

// dockerDescriptor is one image of a docker-save manifest.json.
type dockerDescriptor struct {
	Config string
	Layers []string
}

func (s *Store) dockerManifest(sp *spooled) ([]dockerDescriptor, error) {
	data, err := s.readArchived(sp, "manifest.json")
	if err != nil {
		return nil, err
	}
	var m []dockerDescriptor
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, badf("manifest.json: %v", err)
	}
	if len(m) == 0 || m[0].Config == "" {
		return nil, badf("manifest.json names no image")
	}
	return m, nil
}

// importRootfs unpacks a spooled rootfs tar as a one-layer image.
func (s *Store) importRootfs(ctx context.Context, w *work, sp *spooled, name string) (Info, error) {
	rec := imageRecord{Digest: sp.digest.String(), Env: []string{DefaultPath}}
	layers := []layerSource{{
		label:  "rootfs tar",
		open:   func() (io.ReadCloser, error) { return os.Open(sp.path) },
		raw:    true,
		diffID: sp.digest,
	}}
	return s.importLayers(ctx, w, name, SourceRootfsTar, rec, layers)
}

// importDocker imports a legacy docker-save archive through tarball.Image.
func (s *Store) importDocker(ctx context.Context, w *work, sp *spooled, name string) (Info, error) {
	m, err := s.dockerManifest(sp)
	if err != nil {
		return Info{}, err
	}
	if len(m) != 1 {
		return Info{}, badf("manifest.json lists %d images; save one image per archive", len(m))
	}
	// tarball reads the config whole: check its size first.
	if e, ok := sp.entries[archName(m[0].Config)]; !ok || !isReg(e) || e.size > maxMetaBytes {
		return Info{}, badf("config %q: missing, not a regular file or over %d bytes", m[0].Config, maxMetaBytes)
	}
	if len(m[0].Layers) > maxLayers {
		return Info{}, badf("%d layers, at most %d", len(m[0].Layers), maxLayers)
	}
	img, err := tarball.Image(func() (io.ReadCloser, error) { return os.Open(sp.path) }, nil)
	if err != nil {
		return Info{}, badf("docker archive: %v", err)
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		return Info{}, badf("docker archive config: %v", err)
	}
	sum := sha256.Sum256(raw)
	cfg, err := parseConfig(raw, len(m[0].Layers))
	if err != nil {
		return Info{}, err
	}
	rec := recordFromConfig(v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}, cfg)
	var layers []layerSource
	for i, diffID := range cfg.RootFS.DiffIDs {
		layers = append(layers, layerSource{
			label: fmt.Sprintf("layer %d (%s)", i+1, m[0].Layers[i]),
			open: func() (io.ReadCloser, error) {
				l, err := img.LayerByDiffID(diffID)
				if err != nil {
					return nil, err
				}
				return l.Uncompressed()
			},
			raw:    true,
			diffID: diffID,
		})
	}
	return s.importLayers(ctx, w, name, SourceDockerArchive, rec, layers)
}

// importOCI extracts the layout's files from the spool and imports the
// one image in it for this platform.
func (s *Store) importOCI(ctx context.Context, w *work, sp *spooled, name string) (Info, error) {
	dir := filepath.Join(w.dir, "layout")
	if err := extractLayout(ctx, sp.path, dir); err != nil {
		return Info{}, err
	}
	// The layout holds every blob now; the spooled copy is not needed.
	if err := os.Remove(sp.path); err != nil {
		return Info{}, fmt.Errorf("image store: %w", err)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return Info{}, badf("OCI layout: %v", err)
	}
	blobSize := func(h v1.Hash) (int64, error) {
		fi, err := os.Lstat(filepath.Join(dir, "blobs", h.Algorithm, h.Hex))
		if err != nil {
			return 0, badf("blob %s: missing from the layout", h)
		}
		return fi.Size(), nil
	}
	img, desc, err := pickImage(p, blobSize)
	if err != nil {
		return Info{}, err
	}
	return s.importV1(ctx, w, img, name, SourceOCILayout, &desc.Digest, blobSize)
}

// extractLayout writes the layout's members (oci-layout, index.json,
// blobs/<alg>/<hex>) from the spooled tar into dir; it skips everything
// else (docker's manifest.json, repositories) and refuses links.
func extractLayout(ctx context.Context, archive, dir string) error {
	if err := os.Mkdir(dir, modePrivate); err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	for _, d := range []string{"blobs", "blobs/sha256"} {
		if err := os.Mkdir(filepath.Join(dir, d), modePrivate); err != nil {
			return fmt.Errorf("image store: %w", err)
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	defer root.Close()
	f, err := os.Open(archive)
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(ctxReader{ctx, f})
	buf := make([]byte, 256<<10)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("image store: import cancelled: %w", ctx.Err())
			}
			return badf("OCI archive: %v", err)
		}
		n := archName(hdr.Name)
		var blob bool
		switch {
		case n == "oci-layout" || n == "index.json":
		case strings.HasPrefix(n, "blobs/sha256/"):
			if _, ok := digestHex("sha256:" + strings.TrimPrefix(n, "blobs/sha256/")); !ok {
				return badf("OCI archive entry %q: not a sha256 blob name", hdr.Name)
			}
			blob = true
		default:
			continue
		}
		if !isReg(archEntry{typ: hdr.Typeflag}) {
			return badf("OCI archive entry %q: not a regular file (type %q)", hdr.Name, hdr.Typeflag)
		}
		if !blob && hdr.Size > maxMetaBytes {
			return badf("OCI archive entry %q: %d bytes, at most %d", hdr.Name, hdr.Size, maxMetaBytes)
		}
		out, err := root.OpenFile(n, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			if errors.Is(err, fs.ErrExist) {
				return badf("OCI archive entry %q appears twice", hdr.Name)
			}
			return fmt.Errorf("image store: %w", err)
		}
		_, err = io.CopyBuffer(out, tr, buf)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("image store: import cancelled: %w", ctx.Err())
			}
			return fmt.Errorf("image store: extracting %q: %w", hdr.Name, err)
		}
	}
}

const maxIndexDepth = 4

// pickImage chooses the image of a layout: the one image manifest for
// linux/GOARCH (descending into nested indexes, skipping attestations),
// or the one manifest with no platform.
func pickImage(p layout.Path, blobSize func(v1.Hash) (int64, error)) (v1.Image, v1.Descriptor, error) {
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, v1.Descriptor{}, badf("index.json: %v", err)
	}
	type cand struct {
		idx  v1.ImageIndex
		desc v1.Descriptor
	}
	var exact, unknown []cand
	var seen []string
	var walk func(idx v1.ImageIndex, depth int) error
	walk = func(idx v1.ImageIndex, depth int) error {
		if depth > maxIndexDepth {
			return badf("image indexes nested over %d deep", maxIndexDepth)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return badf("image index: %v", err)
		}
		if len(im.Manifests) > 1000 {
			return badf("image index lists %d manifests, at most 1000", len(im.Manifests))
		}
		for _, d := range im.Manifests {
			if err := checkMetaBlob(d, blobSize); err != nil {
				return err
			}
			switch d.MediaType {
			case types.OCIImageIndex, types.DockerManifestList:
				child, err := idx.ImageIndex(d.Digest)
				if err != nil {
					return badf("image index %s: %v", d.Digest, err)
				}
				if err := walk(child, depth+1); err != nil {
					return err
				}
			case types.OCIManifestSchema1, types.DockerManifestSchema2:
				if d.Annotations["vnd.docker.reference.type"] == "attestation-manifest" {
					continue
				}
				c := cand{idx, d}
				switch {
				case d.Platform == nil:
					unknown = append(unknown, c)
					seen = append(seen, "no platform")
				case d.Platform.OS == "linux" && d.Platform.Architecture == runtime.GOARCH:
					exact = append(exact, c)
					seen = append(seen, d.Platform.String())
				default:
					seen = append(seen, d.Platform.String())
				}
			}
		}
		return nil
	}
	if err := walk(idx, 0); err != nil {
		return nil, v1.Descriptor{}, err
	}
	pick := exact
	if len(pick) == 0 {
		pick = unknown
	}
	switch len(pick) {
	case 0:
		return nil, v1.Descriptor{}, badf("no image for linux/%s in the layout (found: %s)", runtime.GOARCH, strings.Join(seen, ", "))
	case 1:
	default:
		return nil, v1.Descriptor{}, badf("the layout holds %d images for linux/%s; export one image per archive", len(pick), runtime.GOARCH)
	}
	img, err := pick[0].idx.Image(pick[0].desc.Digest)
	if err != nil {
		return nil, v1.Descriptor{}, badf("image %s: %v", pick[0].desc.Digest, err)
	}
	return img, pick[0].desc, nil
}

// checkMetaBlob refuses a manifest or index blob the library would read
// whole if it is large, or not the size its descriptor says.
func checkMetaBlob(d v1.Descriptor, blobSize func(v1.Hash) (int64, error)) error {
	if d.Size > maxMetaBytes {
		return badf("%s %s: %d bytes, at most %d", d.MediaType, d.Digest, d.Size, maxMetaBytes)
	}
	if blobSize == nil {
		return nil
	}
	n, err := blobSize(d.Digest)
	if err != nil {
		return err
	}
	if n != d.Size {
		return badf("blob %s: %d bytes, its descriptor says %d", d.Digest, n, d.Size)
	}
	return nil
}

// importV1 imports an image whose manifest names its blobs by digest (a
// layout, a registry pull): wantManifest, when known, is the digest the
// manifest must have; blobSize, when known, gives a blob's size before the
// library reads it.
func (s *Store) importV1(ctx context.Context, w *work, img v1.Image, name, source string, wantManifest *v1.Hash, blobSize func(v1.Hash) (int64, error)) (Info, error) {
	rawManifest, err := img.RawManifest()
	if err != nil {
		return Info{}, badf("manifest: %v", err)
	}
	if len(rawManifest) > maxMetaBytes {
		return Info{}, badf("manifest: %d bytes, at most %d", len(rawManifest), maxMetaBytes)
	}
	if wantManifest != nil {
		if got := sha256Hash(rawManifest); got != *wantManifest {
			return Info{}, badf("manifest has digest %s, its index says %s", got, wantManifest)
		}
	}
	m, err := v1.ParseManifest(bytes.NewReader(rawManifest))
	if err != nil {
		return Info{}, badf("manifest: %v", err)
	}
	mt := m.MediaType
	if mt == "" {
		if mt, err = img.MediaType(); err != nil {
			return Info{}, badf("manifest media type: %v", err)
		}
	}
	if mt != types.OCIManifestSchema1 && mt != types.DockerManifestSchema2 {
		return Info{}, badf("manifest media type %q is not an image manifest (OCI or Docker schema 2)", mt)
	}
	if len(m.Layers) > maxLayers {
		return Info{}, badf("%d layers, at most %d", len(m.Layers), maxLayers)
	}
	if err := checkMetaBlob(m.Config, blobSize); err != nil {
		return Info{}, err
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		return Info{}, badf("config: %v", err)
	}
	if int64(len(raw)) != m.Config.Size {
		return Info{}, badf("config %s: %d bytes, the manifest says %d", m.Config.Digest, len(raw), m.Config.Size)
	}
	if got := sha256Hash(raw); got != m.Config.Digest {
		return Info{}, badf("config has digest %s, the manifest says %s", got, m.Config.Digest)
	}
	cfg, err := parseConfig(raw, len(m.Layers))
	if err != nil {
		return Info{}, err
	}
	var total int64
	layers := make([]layerSource, 0, len(m.Layers))
	for i, d := range m.Layers {
		switch d.MediaType {
		case types.OCILayer, types.OCILayerZStd, types.OCIUncompressedLayer, types.DockerLayer, types.DockerUncompressedLayer:
		default:
			return Info{}, badf("layer %d (%s): media type %q is not a distributable tar layer", i+1, d.Digest, d.MediaType)
		}
		if d.Size < 0 {
			return Info{}, badf("layer %d (%s): negative size", i+1, d.Digest)
		}
		total += d.Size
		if total > s.lim.archiveCap() {
			return Info{}, fmt.Errorf("%w: compressed layers over %d bytes", ErrTooLarge, s.lim.archiveCap())
		}
		if blobSize != nil {
			if n, err := blobSize(d.Digest); err != nil {
				return Info{}, err
			} else if n != d.Size {
				return Info{}, badf("layer %d (%s): blob is %d bytes, the manifest says %d", i+1, d.Digest, n, d.Size)
			}
		}
		layers = append(layers, layerSource{
			label: fmt.Sprintf("layer %d (%s)", i+1, d.Digest),
			open: func() (io.ReadCloser, error) {
				l, err := img.LayerByDigest(d.Digest)
				if err != nil {
					return nil, err
				}
				return l.Compressed()
			},
			digest: &d.Digest,
			size:   d.Size,
			diffID: cfg.RootFS.DiffIDs[i],
		})
	}
	return s.importLayers(ctx, w, name, source, recordFromConfig(m.Config.Digest, cfg), layers)
}

func sha256Hash(b []byte) v1.Hash {
	sum := sha256.Sum256(b)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
}

// parseConfig parses an image config and checks it fits a layer count.
func parseConfig(raw []byte, layers int) (*v1.ConfigFile, error) {
	cfg, err := v1.ParseConfigFile(bytes.NewReader(raw))
	if err != nil {
		return nil, badf("config: %v", err)
	}
	if cfg.OS != "" && cfg.OS != "linux" {
		return nil, badf("config: an image for %q, not linux", cfg.OS)
	}
	if len(cfg.RootFS.DiffIDs) != layers {
		return nil, badf("config lists %d layer digests (rootfs.diff_ids), the manifest %d layers", len(cfg.RootFS.DiffIDs), layers)
	}
	for i, d := range cfg.RootFS.DiffIDs {
		if d.Algorithm != "sha256" || !hexRE.MatchString(d.Hex) {
			return nil, badf("config: diff_id %d %q is not a sha256 digest", i+1, d)
		}
	}
	return cfg, nil
}

func recordFromConfig(digest v1.Hash, cfg *v1.ConfigFile) imageRecord {
	c := cfg.Config
	rec := imageRecord{
		Digest:     digest.String(),
		Env:        c.Env,
		Entrypoint: c.Entrypoint,
		Cmd:        c.Cmd,
		WorkingDir: c.WorkingDir,
		User:       c.User,
	}
	// A snapshot pushed from another host says so in its labels (the
	// push writes them): its base, and where it came from. Nothing else
	// is taken from labels, and no uid: an imported image is everyone's.
	if c.Labels[LabelBase] == BaseHost {
		rec.Base = BaseHost
	}
	if sb := c.Labels[LabelSandbox]; sb != "" {
		o := &Origin{Sandbox: sb, BaseImage: c.Labels[LabelBaseImage], BaseDigest: c.Labels[LabelBaseDigest]}
		o.Taken, _ = time.Parse(time.RFC3339Nano, c.Labels[LabelTaken])
		rec.Origin = o
	}
	return rec
}

// layerSource is one layer to unpack and how to check it.
type layerSource struct {
	label string
	open  func() (io.ReadCloser, error)
	// raw: open returns the uncompressed tar; else compression is sniffed.
	raw bool
	// digest and size, when set, are checked against the opened stream.
	digest *v1.Hash
	size   int64
	// diffID is checked against the uncompressed stream.
	diffID v1.Hash
}

// importLayers unpacks layers (unless the digest is in the store already)
// and binds name.
func (s *Store) importLayers(ctx context.Context, w *work, name, source string, rec imageRecord, layers []layerSource) (Info, error) {
	if _, ok := digestHex(rec.Digest); !ok {
		return Info{}, badf("digest %q is not sha256", rec.Digest)
	}
	have, info, err := s.precheck(name, rec.Digest)
	if err != nil || info != nil {
		if info != nil {
			return *info, nil
		}
		return Info{}, err
	}
	s.at("prechecked")
	if have {
		info, err := s.commit(w, name, source, rec, false)
		if !errors.Is(err, errImageGone) {
			return info, err
		}
		// Removed since the precheck (its last name went): unpack it.
		s.log.Info("image import: the image was removed meanwhile, unpacking it again", "name", name, "digest", rec.Digest)
	}
	imgDir := filepath.Join(w.dir, "image")
	rootPath := filepath.Join(imgDir, "rootfs")
	if err := os.Mkdir(imgDir, modeTraverse); err != nil {
		return Info{}, fmt.Errorf("image store: %w", err)
	}
	if err := os.Mkdir(rootPath, modeRoot); err != nil {
		return Info{}, fmt.Errorf("image store: %w", err)
	}
	if err := os.Chmod(rootPath, modeRoot); err != nil {
		return Info{}, fmt.Errorf("image store: %w", err)
	}
	u, err := newUnpacker(rootPath, s.lim, s.log)
	if err != nil {
		return Info{}, err
	}
	defer u.close()
	for _, l := range layers {
		if err := s.applyLayer(ctx, u, l); err != nil {
			return Info{}, err
		}
		s.at("layer")
	}
	if u.skipped > 0 {
		s.log.Warn("image import: device nodes and FIFOs skipped (a sandbox gets its own /dev)",
			"name", name, "count", u.skipped, "first", strings.Join(u.skippedNames, ", "))
	}
	if rec.Bytes, rec.Files, err = measure(rootPath); err != nil {
		return Info{}, fmt.Errorf("image store: %w", err)
	}
	return s.commit(w, name, source, rec, true)
}

// maxTrailing bounds the data allowed after a layer's tar end (tar pads
// to its record size; more is refused, not read without end).
const maxTrailing = 1 << 20

// applyLayer opens one layer, unpacks it, and checks its digests: a layer
// whose digest does not match is refused (its entries were written only
// inside the work directory, which the failed import removes).
func (s *Store) applyLayer(ctx context.Context, u *unpacker, l layerSource) error {
	rc, err := l.open()
	if err != nil {
		return badf("%s: %v", l.label, err)
	}
	defer rc.Close()
	src := &srcReader{r: ctxReader{ctx, rc}}
	var (
		in    io.Reader = src
		ch              = sha256.New()
		count *capReader
	)
	if l.digest != nil {
		count = &capReader{r: in, max: l.size, what: l.label + " (its manifest size)"}
		in = io.TeeReader(count, ch)
	}
	tarStream := in
	release := func() {}
	if !l.raw {
		br := bufio.NewReaderSize(in, 64<<10)
		if tarStream, release, err = decompressor(br); err != nil {
			return fmt.Errorf("%s: %w", l.label, err)
		}
	}
	defer release()
	dh := sha256.New()
	ur := io.TeeReader(tarStream, dh)
	fail := func(err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("image store: import cancelled: %w", ctx.Err())
		}
		// The source failed (a registry connection dropped, a read
		// error): not the image's fault.
		if src.err != nil && !errors.Is(src.err, ErrTooLarge) {
			return fmt.Errorf("image store: reading %s: %w", l.label, src.err)
		}
		if errors.Is(err, ErrTooLarge) && count != nil && count.n > count.max {
			return badf("%s: blob is larger than its manifest says (%d bytes)", l.label, l.size)
		}
		return err
	}
	if err := u.layer(ur, l.label); err != nil {
		return fail(err)
	}
	// Hash what follows the tar's end, boundedly.
	if n, err := io.Copy(io.Discard, io.LimitReader(ur, maxTrailing+1)); err != nil {
		return fail(badf("%s: after the tar end: %v", l.label, err))
	} else if n > maxTrailing {
		return badf("%s: over %d bytes after the tar end", l.label, maxTrailing)
	}
	if l.digest != nil {
		if _, err := io.Copy(io.Discard, in); err != nil {
			return fail(badf("%s: %v", l.label, err))
		}
		if count.n != l.size {
			return badf("%s: blob is %d bytes, its manifest says %d", l.label, count.n, l.size)
		}
		if got := (v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(ch.Sum(nil))}); got != *l.digest {
			return badf("%s: content has digest %s, the manifest says %s", l.label, got, l.digest)
		}
	}
	if got := (v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(dh.Sum(nil))}); got != l.diffID {
		return badf("%s: uncompressed content has digest %s, the config says %s", l.label, got, l.diffID)
	}
	return nil
}

// precheck answers before any unpacking: is the name bound already (to
// this digest: done, info returned; to another: ErrExists), and is the
// digest in the store (no need to unpack).
func (s *Store) precheck(name, digest string) (have bool, info *Info, err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if n, ok := s.names[name]; ok {
		if n.Digest == digest {
			i := s.info(n)
			return true, &i, nil
		}
		return false, nil, s.exists(n, digest)
	}
	_, have = s.images[digest]
	return have, nil, nil
}

func (s *Store) exists(n nameRecord, digest string) error {
	return fmt.Errorf("%w: %q is %s, not %s; remove it first (image rm %s) or import under another name",
		ErrExists, n.Name, n.Digest, digest, n.Name)
}

// errImageGone: commit was asked to bind a name to an image in the store,
// which was removed since the precheck.
var errImageGone = errors.New("image store: the image was removed meanwhile")

// commit places the unpacked image (unless the store has its digest) and
// binds the name, in that order, each step durable before the next.
func (s *Store) commit(w *work, name, source string, rec imageRecord, unpacked bool) (Info, error) {
	imgDir := filepath.Join(w.dir, "image")
	rec.Version = recordVersion
	if unpacked {
		rec.Unpacked = time.Now().UTC()
		data, err := json.MarshalIndent(rec, "", "  ")
		if err != nil {
			return Info{}, fmt.Errorf("image store: %w", err)
		}
		if err := writeFileAtomic(imgDir, "image.json", data); err != nil {
			return Info{}, fmt.Errorf("image store: %w", err)
		}
		// One syncfs makes every unpacked file durable (cheaper than an
		// fsync per file), before the rename makes the image visible.
		if err := syncFS(imgDir); err != nil {
			return Info{}, fmt.Errorf("image store: sync: %w", err)
		}
		s.at("unpacked")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n, ok := s.names[name]; ok {
		if n.Digest == rec.Digest {
			return s.info(n), nil
		}
		return Info{}, s.exists(n, rec.Digest)
	}
	if _, ok := s.images[rec.Digest]; !ok {
		if !unpacked {
			return Info{}, errImageGone
		}
		hex, _ := digestHex(rec.Digest)
		if err := os.Rename(imgDir, s.imageDir(hex)); err != nil {
			return Info{}, fmt.Errorf("image store: placing the image: %w", err)
		}
		if err := syncDir(s.imagesDir()); err != nil {
			return Info{}, fmt.Errorf("image store: %w", err)
		}
		s.images[rec.Digest] = rec
		s.at("placed")
	}
	nrec := nameRecord{Version: recordVersion, Name: name, Digest: rec.Digest, Source: source, Created: time.Now().UTC()}
	data, err := json.MarshalIndent(nrec, "", "  ")
	if err != nil {
		return Info{}, fmt.Errorf("image store: %w", err)
	}
	if err := writeFileAtomic(s.namesDir(), name+".json", data); err != nil {
		// The image stays, unnamed: GC removes it unless another import
		// names it first.
		return Info{}, fmt.Errorf("image store: binding %q: %w", name, err)
	}
	s.names[name] = nrec
	return s.info(nrec), nil
}

func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// measure sums a root's regular-file bytes (each inode once) and entries.
func measure(root string) (bytes, files int64, err error) {
	seen := map[uint64]bool{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		files++
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		bytes += fi.Size()
		return nil
	})
	return bytes, files, err
}

// isResourceErr reports errors of the host (disk full, I/O), which are not
// the image's fault.
func isResourceErr(err error) bool {
	for _, e := range []error{syscall.ENOSPC, syscall.EDQUOT, syscall.EIO, syscall.EROFS, syscall.ENOMEM, syscall.EMFILE, syscall.ENFILE} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
