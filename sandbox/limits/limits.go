// Package limits is what a backend needs to enforce the resource limits of
// one sandbox: the limits themselves (with defaults and validation), the
// resource limits (rlimits) each guest command starts with, the gate that
// lets a bubblewrap sandbox be placed in its cgroup before any guest code
// runs, and the verdict that tells an out-of-memory kill from a timeout.
//
// The mechanisms live in sibling packages (cgroup, disk, seccomp); this one
// holds no state and starts nothing.
package limits

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Limits of one sandbox. Zero means "none" for every field; Defaults gives
// the daemon's defaults.
type Limits struct {
	// MemoryBytes caps the sandbox's memory (cgroup).
	MemoryBytes int64
	// CPUs is a CPU quota in cores (cgroup); CPUWeight the share under
	// contention, 1..10000 with 100 the default.
	CPUs      float64
	CPUWeight int
	// PIDs caps processes and threads (cgroup pids.max).
	PIDs int64
	// OpenFiles is RLIMIT_NOFILE for every guest process.
	OpenFiles uint64
	// FileSizeBytes is RLIMIT_FSIZE: the largest file a guest process may
	// write (SIGXFSZ, or EFBIG when ignored, past it).
	FileSizeBytes uint64
	// DiskBytes caps the sandbox's storage (its own filesystem); DiskInodes
	// its number of files (0: the filesystem's default, one per 16 KiB).
	DiskBytes  int64
	DiskInodes int64
}

// Defaults are the limits a sandbox gets when neither its spec nor the
// daemon's configuration says otherwise.
func Defaults() Limits {
	return Limits{
		MemoryBytes:   1 << 30,
		CPUs:          1,
		CPUWeight:     100,
		PIDs:          256,
		OpenFiles:     1024,
		FileSizeBytes: 1 << 30,
		DiskBytes:     1 << 30,
	}
}

// Validate refuses limits no backend could enforce sensibly.
func (l Limits) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if l.MemoryBytes != 0 && l.MemoryBytes < 16<<20 {
		bad("memory limit %d bytes is below 16 MiB; an interpreter cannot start in less", l.MemoryBytes)
	}
	if l.CPUs < 0 || (l.CPUs > 0 && l.CPUs < 0.01) {
		bad("cpu quota %v cores: give 0 (none) or at least 0.01", l.CPUs)
	}
	if l.CPUWeight != 0 && (l.CPUWeight < 1 || l.CPUWeight > 10000) {
		bad("cpu weight %d is outside 1..10000", l.CPUWeight)
	}
	if l.PIDs < 0 || (l.PIDs > 0 && l.PIDs < 8) {
		bad("pids limit %d: give 0 (none) or at least 8 (a shell pipeline needs a few)", l.PIDs)
	}
	if l.OpenFiles != 0 && l.OpenFiles < 16 {
		bad("open files limit %d is below 16", l.OpenFiles)
	}
	if l.DiskBytes < 0 || (l.DiskBytes > 0 && l.DiskBytes < 8<<20) {
		bad("disk limit %d bytes: give 0 (none) or at least 8 MiB", l.DiskBytes)
	}
	if l.DiskInodes < 0 {
		bad("disk inodes %d is negative", l.DiskInodes)
	}
	return errors.Join(errs...)
}

// Within reports which fields of asked exceed the ceiling (a client asking
// for more than the operator allows is refused, not silently capped).
func (l Limits) Within(ceiling Limits) error {
	var errs []error
	check := func(name string, asked, ceil float64) {
		if ceil > 0 && (asked > ceil || asked == 0) {
			errs = append(errs, fmt.Errorf("%s %v exceeds the daemon's maximum %v", name, asked, ceil))
		}
	}
	check("memory_bytes", float64(l.MemoryBytes), float64(ceiling.MemoryBytes))
	check("cpus", l.CPUs, ceiling.CPUs)
	check("pids", float64(l.PIDs), float64(ceiling.PIDs))
	check("open_files", float64(l.OpenFiles), float64(ceiling.OpenFiles))
	check("file_size_bytes", float64(l.FileSizeBytes), float64(ceiling.FileSizeBytes))
	check("disk_bytes", float64(l.DiskBytes), float64(ceiling.DiskBytes))
	return errors.Join(errs...)
}

// Rlimit is one resource limit, soft and hard equal.
type Rlimit struct {
	Resource int
	Name     string // prlimit(1)'s option name
	Value    uint64
}

// Rlimits returns the rlimits every guest process starts with. RLIMIT_CORE
// is always 0 (a core dump of a memory balloon would fill the disk cap).
// RLIMIT_NPROC is deliberately absent: it counts per host uid, and every
// sandbox runs as the same one, so one sandbox could starve the others; the
// pids cgroup caps processes per sandbox instead.
func (l Limits) Rlimits() []Rlimit {
	out := []Rlimit{{Resource: unix.RLIMIT_CORE, Name: "core", Value: 0}}
	if l.OpenFiles > 0 {
		out = append(out, Rlimit{Resource: unix.RLIMIT_NOFILE, Name: "nofile", Value: l.OpenFiles})
	}
	if l.FileSizeBytes > 0 {
		out = append(out, Rlimit{Resource: unix.RLIMIT_FSIZE, Name: "fsize", Value: l.FileSizeBytes})
	}
	return out
}

// Gate holds a bubblewrap sandbox after its namespaces are built and before
// anything runs in them, so the daemon can place its first process in a
// cgroup (and set its rlimits): nothing started in the sandbox afterwards
// can be outside. It uses bubblewrap's --info-fd (bubblewrap writes
// {"child-pid": N}) and --block-fd (the child waits for one byte before it
// loads the seccomp filter and execs the command).
type Gate struct {
	infoR, infoW   *os.File
	blockR, blockW *os.File
}

// gateInfoTimeout bounds the wait for bubblewrap's info; gateInfoBytes what
// is read of it.
const (
	gateInfoTimeout = 10 * time.Second
	gateInfoBytes   = 4 << 10
)

// NewGate makes the two pipes.
func NewGate() (*Gate, error) {
	g := &Gate{}
	var err error
	if g.infoR, g.infoW, err = os.Pipe(); err != nil {
		return nil, err
	}
	if g.blockR, g.blockW, err = os.Pipe(); err != nil {
		g.Close()
		return nil, err
	}
	return g, nil
}

// Args returns the bubblewrap options, given the descriptor numbers the
// child will see for Files()[0] and Files()[1] (3+their index in
// exec.Cmd.ExtraFiles).
func (g *Gate) Args(infoFD, blockFD int) []string {
	return []string{"--info-fd", strconv.Itoa(infoFD), "--block-fd", strconv.Itoa(blockFD)}
}

// Files returns the child's ends, to append to exec.Cmd.ExtraFiles.
func (g *Gate) Files() []*os.File { return []*os.File{g.infoW, g.blockR} }

// ChildPID closes the child's ends in this process (call it right after
// Start) and reads the sandbox's first process from bubblewrap's info. It
// fails if bubblewrap exits or says nothing within gateInfoTimeout.
func (g *Gate) ChildPID() (int, error) {
	g.infoW.Close()
	g.blockR.Close()
	g.infoW, g.blockR = nil, nil
	_ = g.infoR.SetReadDeadline(time.Now().Add(gateInfoTimeout))
	var buf bytes.Buffer
	dec := json.NewDecoder(io.TeeReader(io.LimitReader(g.infoR, gateInfoBytes), &buf))
	var info struct {
		ChildPID int `json:"child-pid"`
	}
	if err := dec.Decode(&info); err != nil {
		return 0, fmt.Errorf("bubblewrap did not report its sandbox's pid (%v; read %q); it may have failed to start", err, buf.String())
	}
	if info.ChildPID <= 1 {
		return 0, fmt.Errorf("bubblewrap reported an invalid child pid %d", info.ChildPID)
	}
	return info.ChildPID, nil
}

// Release lets the sandbox run.
func (g *Gate) Release() error {
	_, err := g.blockW.Write([]byte{1})
	g.blockW.Close()
	g.blockW = nil
	return err
}

// Close closes whatever is still open. Closing the block pipe without
// Release makes bubblewrap's read return 0 and the command run anyway, so
// on failure kill bubblewrap before closing the gate.
func (g *Gate) Close() {
	for _, f := range []*os.File{g.infoR, g.infoW, g.blockR, g.blockW} {
		if f != nil {
			f.Close()
		}
	}
}
