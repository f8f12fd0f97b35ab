package service

// The image ops: image_ls and image_inspect for everyone (hello lists the
// names anyway), image_rm and the streamed import for admins only: an
// image is what every sandbox of it runs, so choosing one is the
// operator's act, as gc is.
//
// An import is streamed over the socket, since the packaged daemon cannot
// read the operator's paths (ProtectHome, PrivateTmp): image_import_begin
// opens an upload on this connection, each image_import_data carries the
// next piece (at most max_chunk_bytes, at the offset sent so far), and
// image_import_end waits for the store to finish. The pieces go through
// a pipe into the store's import, so the daemon holds one piece at a time;
// an upload dies with its connection, or after uploadIdle without data.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// ImageStore is what the image ops need of the store beyond what the
// manager reads (lifecycle.Images): importing an archive and removing an
// image. Errors wrap backend's image errors (ErrBadImage, ...).
type ImageStore interface {
	Import(ctx context.Context, r io.Reader, name string) (backend.Image, error)
	Remove(name string) error
}

// Bounds of the streamed import.
const (
	// maxUploads is how many imports may run at once on the daemon;
	// one connection has at most one.
	maxUploads = 2
	// uploadIdle aborts an upload that got no data for this long.
	uploadIdle = time.Minute
	// chunkMargin is what a frame needs besides an upload's data.
	chunkMargin = 4 << 10
)

// upload is one streamed import in progress.
type upload struct {
	id, name string
	conn     uint64
	pw       *io.PipeWriter
	cancel   context.CancelFunc
	idle     *time.Timer

	mu       sync.Mutex // one piece at a time, in order
	received int64

	done chan struct{} // closed when the store's import returned
	img  backend.Image
	err  error
}

type uploads struct {
	mu sync.Mutex
	m  map[string]*upload
}

func (s *Service) maxChunk() int { return max(s.lim.MaxFrame-chunkMargin, 1) }

func (s *Service) imageInfo(im backend.Image, counts map[string]int) api.ImageInfo {
	m := s.m
	name := im.DisplayName()
	info := api.ImageInfo{Name: name, Builtin: im.IsHost(), Default: name == m.DefaultImage(), Digest: im.Digest,
		SizeBytes: im.Bytes, Files: im.Files, Source: im.Source, Env: im.Env, Entrypoint: im.Entrypoint, Cmd: im.Cmd,
		WorkingDir: im.WorkingDir, User: im.User, Sandboxes: counts[name], PoolSize: m.ImagePoolSize(name),
		Base: im.Base, Origin: imageOrigin(im), Memory: im.Memory != ""}
	if !im.Created.IsZero() {
		info.CreatedAt = unixSeconds(im.Created)
	}
	if !im.Imported.IsZero() {
		info.ImportedAt = unixSeconds(im.Imported)
	}
	return info
}

func (s *Service) imageLs() (any, error) {
	counts := s.m.ImageUse()
	out := []api.ImageInfo{}
	for _, im := range s.m.ImageList() {
		out = append(out, s.imageInfo(im, counts))
	}
	return api.ImageListResult{Images: out}, nil
}

func (s *Service) imageInspect(r api.ImageRequest, a *audit) (any, error) {
	name := r.Name
	a.add("image", name)
	im, err := s.m.ResolveImage(name)
	if err != nil {
		return nil, err
	}
	return api.ImageInspectResult{Image: s.imageInfo(im, s.m.ImageUse())}, nil
}

func (s *Service) imageRm(c lifecycle.Caller, r api.ImageRequest, a *audit) (any, error) {
	name := r.Name
	if !s.takenBy(c, name) { // a snapshot is its taker's to remove too
		if err := s.imageAdmin(c, "image_rm"); err != nil {
			return nil, err
		}
	}
	a.add("image", name)
	if name == backend.HostImage {
		return nil, ipc.Errorf(ipc.CodeBadRequest, "%q is the built-in image (the host's /usr) and cannot be removed", backend.HostImage)
	}
	if s.images == nil {
		return nil, &backend.ImageNotFoundError{Name: name, Known: s.m.ImageNames()}
	}
	if _, err := s.m.ResolveImage(name); err != nil {
		return nil, err
	}
	if err := s.m.RemoveImage(name, func() error { return s.images.Remove(name) }); err != nil {
		return nil, err
	}
	return api.ImageRemoveResult{Removed: name}, nil
}

func (s *Service) imageAdmin(c lifecycle.Caller, op string) error {
	if !c.Admin {
		return ipc.Errorf(ipc.CodeUnauthorized, "%s is an operator's act, for admins (root, the daemon's user, or an admin uid or group in [server])", op)
	}
	return nil
}

func (s *Service) imageImportBegin(c lifecycle.Caller, peer *ipc.Peer, r api.ImageImportBeginRequest, a *audit) (any, error) {
	name := r.Name
	if err := s.imageAdmin(c, "image_import"); err != nil {
		return nil, err
	}
	a.add("image", name)
	if name == backend.HostImage {
		return nil, ipc.Errorf(ipc.CodeImageExists, "%q is the built-in image's name; choose another", backend.HostImage)
	}
	if s.images == nil {
		return nil, ipc.Errorf(ipc.CodeUnsupported, "this daemon has no image store (its backend cannot run images)")
	}
	s.up.mu.Lock()
	defer s.up.mu.Unlock()
	if s.up.m == nil {
		s.up.m = map[string]*upload{}
	}
	if len(s.up.m) >= maxUploads {
		return nil, ipc.Errorf(ipc.CodeBusy, "%d imports are running, the most this daemon runs at once; retry when one has finished", maxUploads)
	}
	for _, u := range s.up.m {
		if u.conn == peer.ConnID {
			return nil, ipc.Errorf(ipc.CodeBusy, "this connection is importing %s already; finish it (image_import_end) first", backend.ShortName(u.name))
		}
	}
	var b [8]byte
	rand.Read(b[:])
	pr, pw := io.Pipe()
	// The import is detached from this request: it lives until its end,
	// an abort, its connection's end or its idle timeout.
	ictx, cancel := context.WithCancel(context.Background())
	u := &upload{id: "up-" + hex.EncodeToString(b[:]), name: name, conn: peer.ConnID, pw: pw, cancel: cancel, done: make(chan struct{})}
	u.idle = time.AfterFunc(uploadIdle, func() { s.abortUpload(u, fmt.Errorf("no data for %v", uploadIdle)) })
	s.up.m[u.id] = u
	go func() {
		defer close(u.done)
		u.img, u.err = s.images.Import(ictx, pr, name)
		// Unblocks a piece being written into a store that gave up.
		pr.CloseWithError(fmt.Errorf("the import ended: %v", u.err))
	}()
	s.log.Info("image import begun", "image", name, "upload", u.id, "peer_uid", peer.UID)
	return api.ImageImportBeginResult{Upload: u.id, MaxChunkBytes: s.maxChunk()}, nil
}

// uploadFor finds connection peer's upload id.
func (s *Service) uploadFor(peer *ipc.Peer, id string) (*upload, error) {
	s.up.mu.Lock()
	defer s.up.mu.Unlock()
	u, ok := s.up.m[id]
	if !ok || u.conn != peer.ConnID {
		return nil, ipc.Errorf(ipc.CodeNotFound, "no upload %s on this connection (finished, aborted, idle for %v, or begun on another connection); begin the import again", backend.ShortName(id), uploadIdle)
	}
	return u, nil
}

func (s *Service) imageImportData(ctx context.Context, c lifecycle.Caller, peer *ipc.Peer, r api.ImageImportDataRequest) (any, error) {
	id, offset, data := r.Upload, r.Offset, r.Data
	if err := s.imageAdmin(c, "image_import"); err != nil {
		return nil, err
	}
	if len(data) > s.maxChunk() {
		return nil, ipc.Errorf(ipc.CodeBadRequest, "a piece of %d bytes is more than max_chunk_bytes (%d)", len(data), s.maxChunk())
	}
	u, err := s.uploadFor(peer, id)
	if err != nil {
		return nil, err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if offset != u.received {
		return nil, ipc.Errorf(ipc.CodeBadRequest, "piece at offset %d, but %d bytes were received; send the pieces in order", offset, u.received).With("received_bytes", u.received)
	}
	u.idle.Reset(uploadIdle)
	stop := context.AfterFunc(ctx, func() { s.abortUpload(u, fmt.Errorf("the request carrying a piece was cancelled")) })
	defer stop()
	if _, werr := u.pw.Write(data); werr != nil {
		<-u.done
		s.forgetUpload(u)
		if u.err != nil {
			return nil, u.err
		}
		return nil, ipc.Errorf(ipc.CodeBadImage, "the import ended before the archive did: %v", werr)
	}
	u.received += int64(len(data))
	return api.ImageImportDataResult{ReceivedBytes: u.received}, nil
}

func (s *Service) imageImportEnd(ctx context.Context, c lifecycle.Caller, peer *ipc.Peer, r api.ImageImportEndRequest, a *audit) (any, error) {
	id, abort := r.Upload, r.Abort
	if err := s.imageAdmin(c, "image_import"); err != nil {
		return nil, err
	}
	u, err := s.uploadFor(peer, id)
	if err != nil {
		return nil, err
	}
	a.add("image", u.name, "upload", u.id)
	if abort {
		s.abortUpload(u, fmt.Errorf("aborted by the client"))
		return api.ImageImportEndResult{ReceivedBytes: u.received}, nil
	}
	u.mu.Lock()
	received := u.received
	u.idle.Stop()
	u.pw.Close()
	u.mu.Unlock()
	select {
	case <-u.done:
	case <-ctx.Done():
		s.abortUpload(u, fmt.Errorf("the request waiting for it was cancelled"))
		return nil, ctx.Err()
	}
	s.forgetUpload(u)
	a.add("bytes", received)
	if u.err != nil {
		return nil, u.err
	}
	s.log.Info("image imported", "image", u.img.Name, "digest", u.img.Digest, "bytes", received, "root_bytes", u.img.Bytes, "files", u.img.Files)
	return api.ImageImportEndResult{Image: s.imageInfo(u.img, s.m.ImageUse()), ReceivedBytes: received}, nil
}

// abortUpload stops u's import; the store removes what it made.
func (s *Service) abortUpload(u *upload, why error) {
	u.pw.CloseWithError(fmt.Errorf("import aborted: %w", why))
	u.cancel()
	u.idle.Stop()
	go func() {
		<-u.done
		s.forgetUpload(u)
	}()
	s.log.Info("image import aborted", "image", u.name, "upload", u.id, "reason", why.Error())
}

func (s *Service) forgetUpload(u *upload) {
	s.up.mu.Lock()
	if s.up.m[u.id] == u {
		delete(s.up.m, u.id)
	}
	s.up.mu.Unlock()
}

// abortUploadsOf aborts the uploads of connection conn, which closed.
func (s *Service) abortUploadsOf(conn uint64) {
	s.up.mu.Lock()
	var mine []*upload
	for _, u := range s.up.m {
		if u.conn == conn {
			mine = append(mine, u)
		}
	}
	s.up.mu.Unlock()
	for _, u := range mine {
		s.abortUpload(u, fmt.Errorf("its connection closed"))
	}
}
