package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/wirefmt"
)

// What a cell's request is, and what a context list says, as both inits
// carry them (bwwire's code message, gvwire's code frame): the request is
// decoded here and handed to Contexts (RunCell) the same way whichever
// backend's init took it, and a list is written here (ListText) and read
// by the daemon (ParseContextList).

// Bounds on a cell's request.
const (
	// MaxCellRequest bounds an encoded CellRequest: its code (pyrt.py
	// reads at most 4 MiB of it) and its environment.
	MaxCellRequest = 4 << 20
	// MaxCellEnv bounds its environment's entries.
	MaxCellEnv = 1 << 16
	// MaxCellTimeout bounds its budget and its grace.
	MaxCellTimeout = 48 * time.Hour
	// MaxContextsBound bounds what a request may say the sandbox's
	// contexts are bounded by.
	MaxContextsBound = 1024
	cellMagic        = 0x65646f63 // "code"
)

// CellRequest is one cell: the context's name, its code, the environment
// and preloaded modules its zygote starts with (when it is not running
// yet), and its budget (0: none) and the grace between the interrupt and
// the kill.
type CellRequest struct {
	Context        string
	Code           []byte
	Env            []string
	Preload        string
	Timeout, Grace time.Duration
	// MaxContexts bounds the sandbox's contexts (0: the agent's default).
	MaxContexts uint32
}

// Encode returns r as an init reads it.
func (r CellRequest) Encode() []byte {
	buf := binary.LittleEndian.AppendUint32(nil, cellMagic)
	buf = wirefmt.AppendString(buf, r.Context)
	buf = wirefmt.AppendString(buf, string(r.Code))
	buf = wirefmt.AppendList(buf, r.Env)
	buf = wirefmt.AppendString(buf, r.Preload)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(r.Timeout))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(r.Grace))
	return binary.LittleEndian.AppendUint32(buf, r.MaxContexts)
}

// ErrBadCell is a cell's request that does not decode or does not hold.
var ErrBadCell = errors.New("malformed code request")

// DecodeCellRequest reads and checks a cell's request (the context's name
// is Contexts.Run's to check). The code is a copy: b may be reused.
func DecodeCellRequest(b []byte) (CellRequest, error) {
	bad := func(what string) (CellRequest, error) {
		return CellRequest{}, fmt.Errorf("%w: %s", ErrBadCell, what)
	}
	if len(b) > MaxCellRequest {
		return bad("too large")
	}
	d := wirefmt.NewDecoder(b)
	var r CellRequest
	if magic, ok := d.U32(); !ok || magic != cellMagic {
		return bad("wrong magic")
	}
	var ok bool
	if r.Context, ok = d.String(); !ok {
		return bad("bad context")
	}
	code, ok := d.Bytes()
	if !ok {
		return bad("bad code")
	}
	r.Code = append([]byte(nil), code...)
	if r.Env, ok = d.List(MaxCellEnv); !ok {
		return bad("bad environment")
	}
	if err := wirefmt.CheckCommand(r.Env, "/"); err != nil {
		return bad(err.Error())
	}
	if r.Preload, ok = d.String(); !ok {
		return bad("bad preload")
	}
	timeout, ok1 := d.U64()
	grace, ok2 := d.U64()
	maxContexts, ok3 := d.U32()
	if !ok1 || !ok2 || !ok3 || d.Left() != 0 || timeout > uint64(MaxCellTimeout) || grace > uint64(MaxCellTimeout) || maxContexts > MaxContextsBound {
		return bad("bad budget or bound")
	}
	r.Timeout, r.Grace, r.MaxContexts = time.Duration(timeout), time.Duration(grace), maxContexts
	return r, nil
}

// RunCell runs req in its context, as Run does, with the cell's stdout,
// stderr and results stream (the daemon's, or pipes init reads for it),
// its code in a memfd of its own. The zygote, when this cell starts it,
// gets the request's environment and preloads. It takes ownership of
// every descriptor given.
func (c *Contexts) RunCell(req CellRequest, stdout, stderr, results int, reply Reply) {
	code, err := memfdWith("sandbox-cell", req.Code)
	if err != nil {
		CellFiles{stdout, stderr, results, -1}.close()
		reply.Failed(unix.EIO, "cannot hold the cell's code: "+err.Error())
		return
	}
	if c.Zygote() == 0 {
		c.Env, c.Preload = req.Env, req.Preload
	}
	c.Max = int(req.MaxContexts)
	c.Run(req.Context, CellFiles{Stdout: stdout, Stderr: stderr, Results: results, Code: code}, req.Timeout, req.Grace, reply)
}

// memfdWith is a memfd holding data.
func memfdWith(name string, data []byte) (int, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return -1, err
	}
	for off := 0; off < len(data); {
		n, err := unix.Pwrite(fd, data[off:], int64(off))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			_ = unix.Close(fd)
			return -1, err
		}
		off += n
	}
	return fd, nil
}

// ListText is every context as a list answer carries it: a line per
// context, "NAME RUNNING COUNT" (RUNNING 1 or 0), sorted by name.
func (c *Contexts) ListText() []byte {
	var lines []string
	for _, x := range c.List() {
		running := 0
		if x.Running {
			running = 1
		}
		lines = append(lines, fmt.Sprintf("%s %d %d", x.Name, running, x.Count))
	}
	sort.Strings(lines)
	return []byte(strings.Join(lines, "\n"))
}

// ParseContextList reads a list answer (ListText), sorted by name; a line
// that is not one is skipped.
func ParseContextList(body []byte) []ContextInfo {
	var out []ContextInfo
	for _, line := range strings.Split(string(body), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || !ValidContextName(f[0]) {
			continue
		}
		count, err := strconv.Atoi(f[2])
		if err != nil || count < 0 {
			continue
		}
		out = append(out, ContextInfo{Name: f[0], Running: f[1] == "1", Count: count})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// MaxContextListText bounds a list answer: the most contexts a sandbox
// may have, each a line of a name and two numbers.
const MaxContextListText = MaxContextsBound * (MaxContextName + 24)
