package service

// Snapshots, forks and image exports.
//
// snapshot makes a sandbox's files an image of the store: the sandbox's
// own act (its uid, not only admins), since an Airflow task prepares an
// environment its later runs start from; the image runs sandboxes for that
// uid and admins alone, and that uid may remove it.
//
// An export is a pull's reverse, for `image push` (the CLI pushes: the
// packaged daemon has no network): image_export_begin starts writing the
// image as one tar layer into a pipe, each image_export_data takes the
// next piece (at most max_chunk_bytes) at the offset received so far, and
// image_export_end ends it. The daemon holds one piece at a time; an
// export belongs to its connection and dies with it, or after
// exportIdle without a request.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// ImageSnapshotter is the store's side of a snapshot: it makes the files
// it is handed an image named name. Errors wrap backend's image errors,
// or backend.ErrNoSpace.
type ImageSnapshotter interface {
	Snapshot(ctx context.Context, name string, src lifecycle.SnapshotSource) (backend.Image, error)
}

// ImageExporter writes an image of the store as one tar layer.
type ImageExporter interface {
	Export(ctx context.Context, name string, w io.Writer) (backend.Image, error)
}

// Bounds of exports.
const (
	// maxExports is how many exports may run at once on the daemon; one
	// connection has at most one.
	maxExports = 2
	// exportIdle ends an export that got no request for this long.
	exportIdle = time.Minute
)

// dispatchSnapshots serves the ops of this file; ok is false for any other.
func (s *Service) dispatchSnapshots(ctx context.Context, c lifecycle.Caller, peer *ipc.Peer, req *ipc.Request, a *audit) (res any, err error, ok bool) {
	args := &req.Args
	switch req.Op {
	case ipc.OpSnapshot:
		res, err = with(args, func(r api.SnapshotRequest) (any, error) { return s.snapshot(ctx, c, r, a) })
	case ipc.OpFork:
		res, err = with(args, func(r api.ForkRequest) (any, error) { return s.fork(ctx, c, r, a) })
	case ipc.OpImageExportBegin:
		res, err = with(args, func(r api.ImageExportBeginRequest) (any, error) { return s.imageExportBegin(c, peer, r, a) })
	case ipc.OpImageExportData:
		res, err = with(args, func(r api.ImageExportDataRequest) (any, error) { return s.imageExportData(c, peer, r) })
	case ipc.OpImageExportEnd:
		res, err = with(args, func(r api.ImageExportEndRequest) (any, error) { return s.imageExportEnd(c, peer, r, a) })
	default:
		return nil, nil, false
	}
	return res, err, true
}

// snapshots reports whether this daemon takes snapshots: its backend hands
// over files and its store keeps them (hello's feature "snapshots").
func (s *Service) snapshots() bool {
	_, be := s.m.Backend().(backend.Snapshotter)
	_, st := s.images.(ImageSnapshotter)
	return be && st
}

func (s *Service) snapshot(ctx context.Context, c lifecycle.Caller, r api.SnapshotRequest, a *audit) (any, error) {
	a.sandbox(r.Sandbox)
	a.add("image", r.Name)
	snap, ok := s.images.(ImageSnapshotter)
	if !ok {
		return nil, ipc.Errorf(ipc.CodeNotSupported, "this daemon has no image store to keep a snapshot in (the %s backend runs no images)", s.m.Backend().Name())
	}
	if r.Name == backend.HostImage {
		return nil, ipc.Errorf(ipc.CodeBadRequest, "%q is the built-in image's name; choose another", backend.HostImage)
	}
	start := time.Now()
	res, err := s.m.Snapshot(ctx, c, r.Sandbox, backend.SnapshotOptions{Memory: r.Memory}, func(src lifecycle.SnapshotSource) (backend.Image, error) {
		return snap.Snapshot(ctx, r.Name, src)
	})
	if err != nil {
		return nil, err
	}
	took := time.Since(start)
	im := res.Image
	a.add("digest", im.Digest, "bytes", im.Bytes, "files", im.Files, "frozen", res.Frozen)
	out := api.SnapshotResult{Image: im.Name, Digest: im.Digest, SizeBytes: im.Bytes, Files: im.Files, Frozen: res.Frozen,
		DurationMS: float64(took.Microseconds()) / 1000}
	if im.Origin != nil {
		out.BaseImage = im.Origin.BaseImage
	}
	return out, nil
}

func (s *Service) fork(ctx context.Context, c lifecycle.Caller, r api.ForkRequest, a *audit) (any, error) {
	a.sandbox(r.Sandbox)
	a.add("count", r.Count)
	req := lifecycle.ForkRequest{Count: r.Count, TTL: seconds(r.TTLS), Opts: backend.SnapshotOptions{Memory: r.Memory}}
	if r.Owner != "" {
		req.Owner = &r.Owner
	}
	res, err := s.m.Fork(ctx, c, r.Sandbox, req)
	if err != nil {
		return nil, err
	}
	out := api.ForkResult{Sandboxes: []string{}, Frozen: res.Frozen}
	for _, sb := range res.Sandboxes {
		out.Sandboxes = append(out.Sandboxes, sb.ID)
		out.ExpiresAt = unixSeconds(sb.ExpiresAt)
	}
	a.add("forks", out.Sandboxes, "frozen", res.Frozen)
	return out, nil
}

// imageOrigin is the wire's form of im's origin.
func imageOrigin(im backend.Image) *api.ImageOrigin {
	o := im.Origin
	if o == nil {
		return nil
	}
	out := &api.ImageOrigin{Sandbox: o.Sandbox, BaseImage: o.BaseImage, BaseDigest: o.BaseDigest, UID: o.UID}
	if !o.Taken.IsZero() {
		out.TakenAt = unixSeconds(o.Taken)
	}
	return out
}

// takenBy reports whether c took snapshot image name (and so may remove
// it without being an admin).
func (s *Service) takenBy(c lifecycle.Caller, name string) bool {
	im, err := s.m.ResolveImage(name)
	return err == nil && im.Origin != nil && im.Origin.UID != nil && *im.Origin.UID == c.UID
}

// export is one image export in progress.
type export struct {
	id, name string
	conn     uint64
	pr       *io.PipeReader
	cancel   context.CancelFunc
	idle     *time.Timer

	mu   sync.Mutex // one piece at a time, in order
	sent int64
	eof  bool

	done chan struct{} // closed when the store's export returned
	err  error
}

type exports struct {
	mu sync.Mutex
	m  map[string]*export
}

func (s *Service) imageExportBegin(c lifecycle.Caller, peer *ipc.Peer, r api.ImageExportBeginRequest, a *audit) (any, error) {
	if err := s.imageAdmin(c, "image_export"); err != nil {
		return nil, err
	}
	a.add("image", r.Name)
	ex, ok := s.images.(ImageExporter)
	if !ok {
		return nil, ipc.Errorf(ipc.CodeNotSupported, "this daemon has no image store (its backend runs no images)")
	}
	im, err := s.m.ResolveImage(r.Name)
	if err != nil {
		return nil, err
	}
	if im.IsHost() {
		return nil, ipc.Errorf(ipc.CodeBadRequest, "%q is the built-in image, the host's own root: it is not the daemon's to export", backend.HostImage)
	}
	s.ex.mu.Lock()
	defer s.ex.mu.Unlock()
	if s.ex.m == nil {
		s.ex.m = map[string]*export{}
	}
	if len(s.ex.m) >= maxExports {
		return nil, ipc.Errorf(ipc.CodeBusy, "%d exports are running, the most this daemon runs at once; retry when one has finished", maxExports)
	}
	for _, e := range s.ex.m {
		if e.conn == peer.ConnID {
			return nil, ipc.Errorf(ipc.CodeBusy, "this connection is exporting %s already; finish it (image_export_end) first", backend.ShortName(e.name))
		}
	}
	var b [8]byte
	rand.Read(b[:])
	pr, pw := io.Pipe()
	ictx, cancel := context.WithCancel(context.Background())
	e := &export{id: "ex-" + hex.EncodeToString(b[:]), name: im.Name, conn: peer.ConnID, pr: pr, cancel: cancel, done: make(chan struct{})}
	e.idle = time.AfterFunc(exportIdle, func() { s.endExport(e, fmt.Errorf("no request for %v", exportIdle)) })
	s.ex.m[e.id] = e
	go func() {
		defer close(e.done)
		_, e.err = ex.Export(ictx, im.Name, pw)
		pw.CloseWithError(e.err)
	}()
	s.log.Info("image export begun", "image", im.Name, "export", e.id, "peer_uid", peer.UID)
	return api.ImageExportBeginResult{Export: e.id, MaxChunkBytes: s.maxChunk(), Image: s.imageInfo(im, s.m.ImageUse())}, nil
}

func (s *Service) exportFor(peer *ipc.Peer, id string) (*export, error) {
	s.ex.mu.Lock()
	defer s.ex.mu.Unlock()
	e, ok := s.ex.m[id]
	if !ok || e.conn != peer.ConnID {
		return nil, ipc.Errorf(ipc.CodeNotFound, "no export %s on this connection (ended, idle for %v, or begun on another connection); begin it again", backend.ShortName(id), exportIdle)
	}
	return e, nil
}

func (s *Service) imageExportData(c lifecycle.Caller, peer *ipc.Peer, r api.ImageExportDataRequest) (any, error) {
	if err := s.imageAdmin(c, "image_export"); err != nil {
		return nil, err
	}
	e, err := s.exportFor(peer, r.Export)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if r.Offset != e.sent {
		return nil, ipc.Errorf(ipc.CodeBadRequest, "a piece at offset %d, but %d bytes were sent; ask for the pieces in order", r.Offset, e.sent).With("sent_bytes", e.sent)
	}
	e.idle.Reset(exportIdle)
	if e.eof {
		return api.ImageExportDataResult{Data: []byte{}, EOF: true}, nil
	}
	buf := make([]byte, s.maxChunk())
	n, rerr := io.ReadFull(e.pr, buf)
	switch {
	case rerr == nil:
	case errors.Is(rerr, io.EOF), errors.Is(rerr, io.ErrUnexpectedEOF):
		e.eof = true
	default:
		<-e.done
		s.forgetExport(e)
		if e.err != nil {
			return nil, e.err
		}
		return nil, fmt.Errorf("image export %s: %w", e.name, rerr)
	}
	e.sent += int64(n)
	return api.ImageExportDataResult{Data: buf[:n], EOF: e.eof}, nil
}

func (s *Service) imageExportEnd(c lifecycle.Caller, peer *ipc.Peer, r api.ImageExportEndRequest, a *audit) (any, error) {
	if err := s.imageAdmin(c, "image_export"); err != nil {
		return nil, err
	}
	e, err := s.exportFor(peer, r.Export)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	sent, whole := e.sent, e.eof
	e.mu.Unlock()
	a.add("image", e.name, "export", e.id, "bytes", sent, "whole", whole)
	s.endExport(e, errors.New("ended by the client"))
	return api.ImageExportEndResult{SentBytes: sent}, nil
}

// endExport stops e's export and forgets it.
func (s *Service) endExport(e *export, why error) {
	e.cancel()
	e.pr.CloseWithError(why)
	e.idle.Stop()
	s.forgetExport(e)
}

func (s *Service) forgetExport(e *export) {
	s.ex.mu.Lock()
	if s.ex.m[e.id] == e {
		delete(s.ex.m, e.id)
	}
	s.ex.mu.Unlock()
}

// endExportsOf ends the exports of connection conn, which closed.
func (s *Service) endExportsOf(conn uint64) {
	s.ex.mu.Lock()
	var mine []*export
	for _, e := range s.ex.m {
		if e.conn == conn {
			mine = append(mine, e)
		}
	}
	s.ex.mu.Unlock()
	for _, e := range mine {
		s.endExport(e, errors.New("its connection closed"))
	}
}
