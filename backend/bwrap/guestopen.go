package bwrap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap/bwwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
)

// Bounds on opening a path as the guest (opener.go).
const (
	// guestOpenTimeout bounds one open: init starting (when the sandbox
	// has none running yet), the request handed over and the answer.
	guestOpenTimeout = 10 * time.Second
	// guestOpenTries is how often an open whose opener vanished before it
	// answered is tried: a command's end kills the opener with every guest
	// process, the guest may kill it too, and init starts another.
	guestOpenTries = 3
)

var (
	// errOpenerGone: the reply socket closed without an answer.
	errOpenerGone = errors.New("the sandbox's opener went away before it answered")
	// errNoGuest: the sandbox's init is dead, so there is no guest to
	// open a path as; its storage is still there until Destroy.
	errNoGuest = errors.New("the sandbox is terminated")
)

// inGuest runs fn on p opened inside sandbox id as its guest sees it (for
// what: bwwire.OpenRead or OpenList), the file operation tracked until fn
// returns. fn gets a descriptor, never a name: the daemon reads what the
// sandbox's kernel resolved, and closes it after.
func (b *Backend) inGuest(ctx context.Context, id, p string, what uint32, fn func(f *os.File) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	guest, err := hostfs.GuestPath(p)
	if err != nil {
		return err
	}
	sb, err := b.lookup(id)
	if err != nil {
		return err
	}
	opCtx, done, err := sb.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	f, err := b.openInGuest(opCtx, sb, p, guest, what)
	if errors.Is(err, errNoGuest) {
		return b.inTerminated(ctx, sb, p, what, err, fn)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return fn(f)
}

// inTerminated runs fn on p of a terminated sandbox (its init died, so
// nothing can open a path as its guest): its /workspace and /tmp are still
// there until Destroy, and a path in them is opened on the host, confined
// to them as writes are (hostfs.OpenArea: no symlink or '..' leads out).
// Any other path is the error the guest open got: the sandbox is gone.
func (b *Backend) inTerminated(ctx context.Context, sb *sandbox, p string, what uint32, gone error, fn func(f *os.File) error) error {
	if _, err := hostfs.ResolveGuestPath(p); err != nil {
		return gone
	}
	flag := os.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY
	if what == bwwire.OpenList {
		flag |= unix.O_DIRECTORY
	}
	return b.inArea(ctx, sb.id, p, func(sb *sandbox, root *os.Root, rel string) error {
		f, err := root.OpenFile(rel, flag, 0)
		if err != nil {
			return hostfs.Error(p, err)
		}
		defer f.Close()
		return fn(f)
	})
}

// openInGuest opens guest (the client's p) in sb as its guest.
func (b *Backend) openInGuest(ctx context.Context, sb *sandbox, p, guest string, what uint32) (*os.File, error) {
	deadline := time.Now().Add(guestOpenTimeout)
	for try := 1; ; try++ {
		ip, err := b.initForFiles(ctx, sb, deadline)
		if err != nil {
			return nil, err
		}
		f, errno, err := ip.open(ctx, bwwire.OpenRequest{What: what, Path: guest}, deadline)
		switch {
		case err == nil && errno == 0:
			return f, nil
		case err == nil:
			return nil, hostfs.GuestError(p, errno)
		case errors.Is(err, errOpenerGone) && try < guestOpenTries && time.Now().Before(deadline):
			continue
		case ctx.Err() != nil:
			if errors.Is(context.Cause(ctx), errSandboxDestroyed) {
				return nil, backend.NotFound(sb.id)
			}
			return nil, fmt.Errorf("opening %s in sandbox %s was stopped: %w", backend.ShortName(p), sb.id, ctx.Err())
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, fmt.Errorf("%w: sandbox %s did not open %s within %v; the sandbox may be overloaded (or the path blocks when opened); retry, or use run_command", backend.ErrUnavailable, sb.id, backend.ShortName(p), guestOpenTimeout)
		}
		if !ip.alive() {
			return nil, fmt.Errorf("%w: sandbox %q was terminated (its init died) while it opened %s; destroy it and create a new one: %w", backend.ErrNotFound, sb.id, backend.ShortName(p), errNoGuest)
		}
		return nil, fmt.Errorf("%w: sandbox %s could not open %s: %v; retry", backend.ErrUnavailable, sb.id, backend.ShortName(p), err)
	}
}

// initForFiles returns sb's running init for a file operation, starting
// it if this process has none yet. Unlike acquireInit it does not take the
// init for a command (file operations run beside one) and leaves telling a
// command about a dead init to Exec.
func (b *Backend) initForFiles(ctx context.Context, sb *sandbox, deadline time.Time) (*initProc, error) {
	sb.initMu.Lock()
	defer sb.initMu.Unlock()
	switch {
	case sb.paused:
		return nil, sb.errPaused()
	case sb.initGone, sb.init != nil && !sb.init.alive():
		return nil, fmt.Errorf("%w: sandbox %q was terminated (its init process died): only its /workspace and /tmp can still be read; destroy it and create a new one: %w", backend.ErrNotFound, sb.id, errNoGuest)
	case sb.init == nil:
		ip, err := b.startInit(ctx, sb, deadline)
		if err != nil {
			return nil, err
		}
		sb.init = ip
	}
	return sb.init, nil
}

// open asks ip's opener to open req.path and waits for its answer until
// deadline or ctx: the descriptor, or the errno the guest's open got. An
// answer that is not one (bad header, a descriptor with an errno, several)
// is an error, and whatever came with it is closed.
func (ip *initProc) open(ctx context.Context, req bwwire.OpenRequest, deadline time.Time) (*os.File, unix.Errno, error) {
	mine, theirs, err := seqpacketPair("sandbox-open")
	if err != nil {
		return nil, 0, err
	}
	defer mine.Close()
	// The request waits on the socket for the opener: it reads it from
	// the socket it is handed, so nothing else can answer in its place.
	if _, err := mine.Write(req.Encode()); err != nil {
		theirs.Close()
		return nil, 0, err
	}
	err = ip.sendKind(bwwire.MsgOpen, nil, []int{int(theirs.Fd())}, deadline, nil)
	theirs.Close()
	if err != nil {
		return nil, 0, err
	}
	stop := context.AfterFunc(ctx, func() { _ = mine.SetReadDeadline(time.Now()) })
	defer stop()
	if err := mine.SetReadDeadline(deadline); err != nil {
		return nil, 0, err
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	rc, err := mine.SyscallConn()
	if err != nil {
		return nil, 0, err
	}
	buf := make([]byte, 2*bwwire.MsgSize)
	oob := make([]byte, unix.CmsgSpace(4*4))
	var n, oobn, flags int
	var recvErr error
	err = rc.Read(func(fd uintptr) bool {
		n, oobn, flags, _, recvErr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_CMSG_CLOEXEC)
		return !errors.Is(recvErr, unix.EAGAIN)
	})
	if err == nil {
		err = recvErr
	}
	if errors.Is(err, unix.ECONNRESET) {
		// The socket went with the request unread: the opener died
		// before it (or was gone when init passed the socket on).
		err = errOpenerGone
	}
	if err != nil {
		return nil, 0, err
	}
	fds := bwwire.ReceivedFDs(oob[:oobn])
	m, err := bwwire.DecodeMsg(buf[:n])
	switch {
	case n == 0 && oobn == 0:
		err = errOpenerGone
	case err != nil:
	case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0:
		err = fmt.Errorf("%w: truncated answer", bwwire.ErrBadMessage)
	case m.Kind != bwwire.MsgOpened:
		err = fmt.Errorf("%w: kind %d in answer to an open", bwwire.ErrBadMessage, m.Kind)
	case m.A == 0 && len(fds) == 1:
		return os.NewFile(uintptr(fds[0]), req.Path), 0, nil
	case m.A != 0 && len(fds) == 0:
		return nil, unix.Errno(m.A), nil
	default:
		err = fmt.Errorf("%w: errno %d with %d descriptors", bwwire.ErrBadMessage, m.A, len(fds))
	}
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
	return nil, 0, err
}
