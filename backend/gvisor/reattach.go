package gvisor

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/registry"
)

// A sandbox's gVisor sandbox outlives the daemon that booted it: a daemon
// killed with -9, stopped, restarted or upgraded leaves every kept
// sandbox's runsc sandbox, its init and the durable processes it runs where
// they are (`runsc run --detach` ties none of them to the daemon). The
// init's stdin and stdout are two named FIFOs in the sandbox's directory
// (0700, the daemon's), not pipes: the sentry holds their other ends for
// as long as it runs, so the next daemon opens them again, which a pipe
// whose ends died with the daemon would not allow. Init reads EOF when the
// daemon writing to it is gone, drops what it held of a frame and waits
// for the next writer (gvinit); its writes meanwhile fail (EPIPE, no
// reader), or stay in the FIFO unread. The next daemon, when it loads the
// sandbox (load), opens both FIFOs (the kernel refuses a writer with ENXIO
// when no process holds the read end: no sentry, no init), sends an attach
// frame with a nonce of its own and skips what its predecessor left unread
// until init's attached frame with that nonce: the stream is then its own.
// It asks init which processes run, and ends the records of those that
// never got a keeper (a daemon killed between a record and its start).
//
// An init it cannot re-attach (no answer, another version's, an egress
// allow-list whose network died with the daemon that served it, a cgroup
// gone) is stopped with its processes, which read as sandbox_terminated;
// the sandbox boots afresh at its next use, as it did before durable
// processes.

// The FIFOs in Dir/<id> that are the init's stdin and stdout.
const (
	toInitName   = "init.in"
	fromInitName = "init.out"
)

// Bounds of a re-attach.
const (
	// reattachTimeout bounds the attach handshake and the list of
	// running processes after it.
	reattachTimeout = 5 * time.Second
	// maxStaleBytes bounds what a re-attaching daemon skips of what its
	// predecessor left unread: a FIFO's buffer (64 KiB unless raised,
	// 1 MiB at most by default) and what init writes before it reads the
	// attach frame.
	maxStaleBytes = 8 << 20
)

func (sb *sandbox) toInitPath() string   { return filepath.Join(sb.dir, toInitName) }
func (sb *sandbox) fromInitPath() string { return filepath.Join(sb.dir, fromInitName) }

// initFIFOs makes sb's FIFOs anew (a boot's: nothing a previous init left
// in them may reach the new one) and opens them: the runsc ends (init's
// stdin and stdout) and the daemon's. Each open is non-blocking: a FIFO's
// reader is opened before its writer, so neither waits for the other.
func initFIFOs(sb *sandbox) (runscIn, runscOut, toInit, fromInit *os.File, err error) {
	for _, p := range []string{sb.toInitPath(), sb.fromInitPath()} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, nil, nil, nil, err
		}
		if err := unix.Mkfifo(p, 0o600); err != nil {
			return nil, nil, nil, nil, err
		}
	}
	var files []*os.File
	// The daemon's ends in its runtime's poller (non-blocking); runsc's
	// blocking, as pipes' would be: init puts them in its own poller,
	// which refuses a host FIFO it is given non-blocking.
	open := func(p string, flag int, blocking bool) *os.File {
		if err != nil {
			return nil
		}
		var fd int
		if fd, err = unix.Open(p, flag|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
			return nil
		}
		if blocking {
			if err = unix.SetNonblock(fd, false); err != nil {
				_ = unix.Close(fd)
				return nil
			}
		}
		f := os.NewFile(uintptr(fd), p)
		files = append(files, f)
		return f
	}
	runscIn = open(sb.toInitPath(), unix.O_RDONLY, true)
	toInit = open(sb.toInitPath(), unix.O_WRONLY, false)
	fromInit = open(sb.fromInitPath(), unix.O_RDONLY, false)
	runscOut = open(sb.fromInitPath(), unix.O_WRONLY, true)
	if err != nil {
		for _, f := range files {
			f.Close()
		}
		return nil, nil, nil, nil, err
	}
	return runscIn, runscOut, toInit, fromInit, nil
}

// initLive reports whether a process holds the reading end of sb's init
// FIFO: a live sentry, whose init a daemon may attach to.
func initLive(sb *sandbox) bool {
	fd, err := unix.Open(sb.toInitPath(), unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false // ENXIO: no reader; ENOENT: never booted (or by an older daemon)
	}
	_ = unix.Close(fd)
	return true
}

// errNoLiveInit: nothing reads sb's init FIFO.
var errNoLiveInit = errors.New("no live init")

// attachInit re-attaches to the live init a previous daemon left in sb:
// errNoLiveInit when there is none. The connection it returns reads init's
// frames already.
func (b *Backend) attachInit(sb *sandbox) (_ *initConn, err error) {
	toInit, err := os.OpenFile(sb.toInitPath(), os.O_WRONLY|syscall.O_NONBLOCK|unix.O_NOFOLLOW, 0)
	if errors.Is(err, unix.ENXIO) || errors.Is(err, os.ErrNotExist) {
		return nil, errNoLiveInit
	}
	if err != nil {
		return nil, err
	}
	fromInit, err := os.OpenFile(sb.fromInitPath(), os.O_RDONLY|syscall.O_NONBLOCK|unix.O_NOFOLLOW, 0)
	if err != nil {
		toInit.Close()
		return nil, err
	}
	c := &initConn{toInit: toInit, fromInit: fromInit, dead: make(chan struct{}), lstated: make(chan [2]uint32, 1)}
	// runsc's and init's stderr, kept: what is already there still says
	// why something went wrong.
	if c.log, err = os.OpenFile(filepath.Join(sb.dir, logName), os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600); err != nil {
		c.log = nil
	}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	nonce := make([]byte, gvwire.NonceSize)
	_, _ = rand.Read(nonce)
	if err := c.send(gvwire.KindAttach, nonce); err != nil {
		return nil, fmt.Errorf("cannot write to its init: %w", err)
	}
	if c.pending, err = skipToAttached(fromInit, nonce, time.Now().Add(reattachTimeout)); err != nil {
		return nil, err
	}
	if err := fromInit.SetReadDeadline(time.Time{}); err != nil {
		return nil, err
	}
	go c.readLoop()
	return c, nil
}

// skipToAttached reads r until init's attached frame for nonce and returns
// what followed it in the last read (the start of the frames after it).
// Init's protocol version is part of the frame: another version's init
// never matches and is refused at the deadline.
func skipToAttached(r *os.File, nonce []byte, deadline time.Time) ([]byte, error) {
	if err := r.SetReadDeadline(deadline); err != nil {
		return nil, err
	}
	marker := gvwire.AttachedMarker(nonce)
	buf := make([]byte, 0, 64<<10)
	chunk := make([]byte, 64<<10)
	seen := 0
	for {
		n, err := r.Read(chunk)
		buf = append(buf, chunk[:n]...)
		seen += n
		if i := bytes.Index(buf, marker); i >= 0 {
			return bytes.Clone(buf[i+len(marker):]), nil
		}
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, fmt.Errorf("its init did not answer an attach within %v (another version's, or hung)", reattachTimeout)
		case errors.Is(err, io.EOF):
			return nil, errors.New("its init closed its stream")
		case err != nil:
			return nil, err
		case seen > maxStaleBytes:
			return nil, fmt.Errorf("its init's stream held more than %d bytes before its answer", maxStaleBytes)
		}
		// Keep only what may begin the marker.
		if len(buf) >= len(marker) {
			buf = append(buf[:0], buf[len(buf)-len(marker)+1:]...)
		}
	}
}

// adoptLiveInit re-attaches to sb's init if a previous daemon left one
// running, with what it needs of this daemon (its cgroup), and ends the
// records of processes that never got a keeper. An init it cannot keep is
// stopped, with its processes, and nil returned: the sandbox boots
// afresh at its next use. Either way, when it returns nil every process
// of sb without an exit record has ended (procstore's AgentReplaced),
// unless sb is checkpointed (a paused sandbox's processes live in its
// checkpoint).
func (b *Backend) adoptLiveInit(sb *sandbox, checkpointed bool) *initConn {
	log := b.log.With("sandbox", sb.id)
	lost := func(running map[string]bool) {
		st := b.store(sb)
		if running == nil {
			if checkpointed {
				return
			}
			// Its init is gone: so is every process it ran.
			if err := st.AgentReplaced(); err != nil {
				log.Warn("cannot end the durable processes of an init that is gone", "error", err)
			}
			return
		}
		ids := make([]string, 0, len(running))
		for id := range running {
			ids = append(ids, id)
		}
		if n, err := st.Unstarted(ids); n > 0 || err != nil {
			log.Warn("ended processes whose start the previous daemon left half done (it died mid-start)", "count", n, "error", err)
		}
	}
	c, err := b.attachInit(sb)
	if errors.Is(err, errNoLiveInit) {
		lost(nil)
		return nil
	}
	drop := func(why string, err error) *initConn {
		log.Warn("the init a previous daemon left cannot be kept ("+why+"); it is stopped and its processes end", "error", err, "log", c.logTail())
		if c != nil {
			c.close()
		}
		if out, derr := b.cli(context.Background(), cliTimeout, "delete", "--force", sb.containerID()); derr != nil && !notExist(out) {
			log.Warn("cannot remove the gVisor sandbox of an init it could not keep", "error", derr)
		}
		b.killRunscStrays(sb.bundleDir())
		lost(nil)
		return nil
	}
	switch {
	case err != nil:
		c = nil
		return drop("it does not answer", err)
	case sb.network == networkAllowlist:
		return drop("its egress allow-list was served by the daemon that died", nil)
	}
	if b.cfg.Cgroups != nil {
		cg, err := b.cfg.Cgroups.Open(sb.containerID())
		if err != nil {
			return drop("its cgroup", err)
		}
		sb.cg = cg
	}
	ctx, cancel := context.WithTimeout(context.Background(), reattachTimeout)
	defer cancel()
	ans, err := c.procCall(ctx, gvwire.KindProcList, func(seq uint32) []byte { return gvwire.U32s(seq) })
	if err != nil {
		return drop("it does not list its processes", err)
	}
	ids, err := ans.IDs()
	if err != nil {
		return drop("it lists its processes wrong", err)
	}
	running := map[string]bool{}
	for _, id := range ids {
		running[id] = true
	}
	lost(running)
	b.watchMemory(sb, c)
	log.Info("re-attached to the sandbox's init, which outlived the previous daemon", "processes_running", len(ids))
	return c
}

// liveContainers are the runsc sandboxes of this backend's root whose init
// a re-attach may reach and keep: each listed under a sandbox's id, with
// the sandbox's settings, not an allowlist sandbox's (its network died
// with the daemon that served it), and its init FIFO read by a live
// process.
func (b *Backend) liveContainers(ctx context.Context) map[string]bool {
	ids, err := b.runscList(ctx)
	if err != nil {
		b.log.Warn("cannot list runsc sandboxes to find the inits a previous daemon left", "error", err)
		return nil
	}
	live := map[string]bool{}
	for _, id := range ids {
		if !backend.ValidID(id) {
			continue
		}
		var spec persistedSpec
		if err := registry.LoadSpec(b.sandboxDir(id), id, specVersion, &spec); err != nil || spec.Network == networkAllowlist {
			continue
		}
		if initLive(&sandbox{dir: b.sandboxDir(id)}) {
			live[id] = true
		}
	}
	return live
}

// detachInit lets go of sb's init without stopping it, at the daemon's
// shutdown: a live init goes on, with its sandbox's processes, until the
// next daemon re-attaches to it or destroys the sandbox. One that cannot
// (dead, or an allowlist sandbox's, whose network goes with this daemon)
// is stopped. It reports whether one was left running.
func (b *Backend) detachInit(sb *sandbox) bool {
	sb.initMu.Lock()
	c := sb.init
	sb.init, sb.gone, sb.goneReported = nil, true, true
	alive := c != nil && c.alive() && sb.network != networkAllowlist
	sb.detached = alive
	sb.initMu.Unlock()
	if c == nil {
		return false
	}
	c.close()
	if alive {
		return true
	}
	_, _ = b.cli(context.Background(), cliTimeout, "delete", "--force", sb.containerID())
	return false
}
