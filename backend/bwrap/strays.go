package bwrap

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// markerEnv is set in the environment of every bwrap process this backend
// starts (never in the guest's: bwrap's --clearenv drops it), naming the
// sandbox opaquely (see marker). It is how strays are found: bubblewrap has a window
// at start-up in which its PID-namespace init does not yet carry the
// parent-death signal, so a daemon killed at that moment can leave a
// sandbox's init and its command running with nobody to reap them.
const markerEnv = "SANDBOX_SIDECAR_SANDBOX"

// marker is the value of markerEnv for the sandbox directory dir: a hash
// of the backend's directory and the sandbox's name, so neither a host path
// nor anything else of the host shows in it (a guest can read its init's
// environment).
func marker(dir string) string {
	return markerPrefix(filepath.Dir(dir)) + filepath.Base(dir)
}

// markerPrefix starts the marker of every sandbox directory under dir.
func markerPrefix(dir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(dir)))
	return hex.EncodeToString(sum[:8]) + "-"
}

// environBound caps what is read of one process's environment.
const environBound = 64 << 10

// markedProcess is a process carrying our marker, identified by pid and
// start time together (a pid alone may have been reused).
type markedProcess struct {
	pid       int
	startTime uint64
	marker    string
	// asUID, when set, is the uid whose filesystem ids a non-root daemon
	// takes to see the process (b.findMarked).
	asUID *uint32
}

// findMarked lists processes whose marker names dir (or, with prefix, any
// directory under dir).
func findMarked(dir string, prefix bool) []markedProcess {
	want := marker(dir)
	if prefix {
		want = markerPrefix(dir)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []markedProcess
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		got, ok := readMarker(pid)
		if !ok {
			continue
		}
		if got != want && !(prefix && strings.HasPrefix(got, want)) {
			continue
		}
		st, err := startTime(pid)
		if err != nil {
			continue
		}
		out = append(out, markedProcess{pid: pid, startTime: st, marker: got})
	}
	return out
}

// startFlagName is the file in a sandbox's directory that says its init's
// start is under way: written before bwrap is, removed once the init is
// ready (or, on a failed start, once everything of it is known dead).
//
// Only such a start can leave a stray of a daemon that died: a ready
// init and everything it runs die with their bwrap (the parent-death
// signal, and the kernel's kill of a PID namespace whose init ends), and
// a stop that finds a survivor kills it before it returns (stopInit).
// So a daemon's start-up, which must end every stray of a sandbox it may
// adopt before that sandbox's next init starts, needs to look only where
// a flag is left. That matters to a non-root daemon, which looks once per
// uid (findMarked below), not once: with thousands of sandboxes a walk of
// the host's processes per sandbox took seconds before serving. A flag a
// crash left stays until that sandbox's next start: every daemon start
// until then looks for its strays again, which finds none and costs one
// walk.
const startFlagName = "init-starting"

// writeStartFlag marks sandbox dir's init start as under way. No fsync:
// what it guards against (a stray) cannot outlive the host, only the
// daemon, and the page cache outlives the daemon.
// One a crash left is made again (whoever owns it: the directory is the
// daemon's).
func writeStartFlag(dir string) error {
	p := filepath.Join(dir, startFlagName)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, os.ErrExist) {
		if err = os.Remove(p); err == nil {
			f, err = os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_CLOEXEC, 0o600)
		}
	}
	if err != nil {
		return fmt.Errorf("cannot mark its start under way: %w", err)
	}
	return f.Close()
}

// clearStartFlag removes sandbox dir's start flag.
func clearStartFlag(dir string, log hclog.Logger) {
	if err := os.Remove(filepath.Join(dir, startFlagName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Warn("cannot remove a sandbox's start flag; the next daemon start looks for its strays again", "dir", dir, "error", err)
	}
}

// startFlagged reports whether sandbox dir's start flag is left.
func startFlagged(dir string) bool {
	_, err := os.Lstat(filepath.Join(dir, startFlagName))
	return err == nil
}

// findMarked is the package's findMarked for this backend. A non-root
// daemon looks again as each sandbox's uid (sandbox dir's, or with prefix
// every sandbox's it knows whose start flag is left, startFlagName): the
// kernel shows it the processes of another uid, and their environment,
// only with that uid as its filesystem uid (hidepid, ProtectProc=, and
// the ptrace check of /proc/PID/environ).
func (b *Backend) findMarked(dir string, prefix bool) []markedProcess {
	out := findMarked(dir, prefix)
	if !b.viaCaps {
		return out
	}
	known := map[string]uint32{}
	b.mu.Lock()
	for id, uid := range b.uidOf {
		if prefix || id == filepath.Base(dir) {
			known[id] = uid
		}
	}
	b.mu.Unlock()
	var uids []uint32
	for id, uid := range known {
		if !prefix || startFlagged(filepath.Join(dir, id)) {
			uids = append(uids, uid)
		}
	}
	seen := make(map[int]bool, len(out))
	for _, p := range out {
		seen[p.pid] = true
	}
	for _, uid := range uids {
		var found []markedProcess
		_ = asFSIDs(int(uid), int(uid), func() error { found = findMarked(dir, prefix); return nil })
		for _, p := range found {
			if !seen[p.pid] {
				seen[p.pid] = true
				p.asUID = &uid
				out = append(out, p)
			}
		}
	}
	return out
}

// strayStarts keeps, of the marked processes of every sandbox, those a
// start under way left (its start flag is there), and those of a sandbox
// whose directory is gone or of a trial sandbox (Health's): what no
// sandbox will re-attach to.
func (b *Backend) strayStarts(procs []markedProcess) []markedProcess {
	prefix := markerPrefix(b.cfg.Dir)
	var out []markedProcess
	for _, p := range procs {
		id := strings.TrimPrefix(p.marker, prefix)
		dir := filepath.Join(b.cfg.Dir, id)
		if _, err := os.Lstat(dir); err != nil || startFlagged(dir) || strings.HasPrefix(id, probeDirPrefix) {
			out = append(out, p)
		}
	}
	return out
}

func readMarker(pid int) (string, bool) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return "", false
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, environBound))
	if err != nil {
		return "", false
	}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte(markerEnv+"=")); ok {
			return string(v), true
		}
	}
	return "", false
}

// startTime reads field 22 of /proc/PID/stat (clock ticks since boot).
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces and parentheses:
	// fields are counted from the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 20 {
		return 0, errors.New("malformed stat")
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// killMarked sends SIGKILL to each process through a pidfd opened after
// checking that the pid still has the recorded start time, so a reused pid
// is never signalled. It returns how many it killed.
func killMarked(procs []markedProcess) int {
	n := 0
	var killed []int
	defer func() {
		awaitExits(killed, strayExitWait)
		for _, fd := range killed {
			unix.Close(fd)
		}
	}()
	for _, p := range procs {
		if p.asUID != nil {
			// Its start time is readable only as its uid; the signal
			// itself needs CAP_KILL, which such a daemon holds.
			uid, one := *p.asUID, p
			one.asUID = nil
			_ = asFSIDs(int(uid), int(uid), func() error { n += killMarked([]markedProcess{one}); return nil })
			continue
		}
		fd, err := unix.PidfdOpen(p.pid, 0)
		if err != nil {
			continue // gone already
		}
		if st, err := startTime(p.pid); err == nil && st == p.startTime {
			if unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil {
				n++
				killed = append(killed, fd)
				continue
			}
		}
		unix.Close(fd)
	}
	return n
}

// strayExitWait bounds how long killMarked waits for the processes it
// killed to be gone: a stray holds its sandbox's mount namespace, and with
// it the sandbox's disk, until it has exited, and the sandbox is adopted
// right after.
const strayExitWait = 2 * time.Second

// awaitExits waits, up to limit in all, until every process of the pidfds
// fds has exited (a pidfd polls readable then).
func awaitExits(fds []int, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for _, fd := range fds {
		for {
			left := time.Until(deadline)
			if left <= 0 {
				return
			}
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(pfd, int(left.Milliseconds())+1)
			if err == unix.EINTR {
				continue
			}
			if err != nil || n > 0 {
				break
			}
		}
	}
}

// KillSandboxes kills every process of every sandbox under the backend
// directory dir: the inits (and so everything they run) that outlive a
// daemon. It is for what abandons a backend's state without destroying its
// sandboxes (tests, benchmarks); a daemon's own destroys and offline
// `gc --all` end sandboxes one by one. It returns how many processes it
// killed; as root it sees every one, otherwise only the caller's own.
func KillSandboxes(dir string) int { return killMarked(findMarked(dir, true)) }
