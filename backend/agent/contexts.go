package agent

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/proclog"
)

// Code contexts (run_code): a zygote, the image's python3 running pyrt.py,
// imports the modules the operator preloads once and then only forks; each
// context is a fork of it that keeps one context name's variables between
// cells. The zygote is the agent's, like a keeper: a command's clean-up
// spares it and what it forked (Table.Spare), and it is a child subreaper,
// so a context's own children stay under it. A context runs one cell at a
// time; its budget is kept here: SIGINT (KeyboardInterrupt in the cell) at
// the budget, SIGKILL once the grace is spent too, and the context is lost.
//
// A cell's stdout, stderr and results stream are the daemon's (it made
// them and reads them); the agent only hands them to the context with the
// cell's code, and tells the daemon how the cell ended.

//go:embed pyrt.py
var pyrt []byte

// Bounds on contexts.
const (
	// MaxContextName bounds a context's name.
	MaxContextName = 64
	// DefaultMaxContexts bounds a sandbox's contexts when Contexts says
	// none.
	DefaultMaxContexts = 8
	zygoteMsgMax       = 64 << 10
	// exitReportGrace bounds the wait, after a context's socket closed
	// mid-cell, for the zygote (its parent) to say how it died: killed
	// for memory, or otherwise.
	exitReportGrace = 2 * time.Second
)

// ValidContextName reports whether name may name a context: 1 to
// MaxContextName letters, digits, '.', '_' or '-'.
func ValidContextName(name string) bool {
	if name == "" || len(name) > MaxContextName {
		return false
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// CellFiles are one cell's descriptors: the daemon's (its stdout and stderr
// pipes, its results stream) and its code, in a memfd.
type CellFiles struct{ Stdout, Stderr, Results, Code int }

func (f CellFiles) close() {
	for _, fd := range []int{f.Stdout, f.Stderr, f.Results, f.Code} {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}

// CellEnd is how a cell ended, as its Reply hears it: Lost says the
// context died with it (How and Code its wait status's, Timed what the
// budget did); Count is the cell's number in its context (0 when the
// context was lost before it said).
type CellEnd struct {
	Lost             bool
	How, Code, Timed uint32
	Count            int
}

// Reply is how a cell's caller learns its fate.
type Reply interface {
	// Started: the context took the cell (its results stream is the
	// daemon's to read).
	Started()
	// Ended: the cell is over (its context took the next, or is lost).
	Ended(CellEnd)
	// Failed: the cell never ran; errno says why (ENOENT: no python3 in
	// the sandbox; EAGAIN: too many contexts; EBUSY: the context runs a
	// cell) and reason in words.
	Failed(errno unix.Errno, reason string)
}

// ErrNoPython: the sandbox has no python3 to run code with.
var ErrNoPython = errors.New("no python3 in the sandbox")

// Contexts is init's record of its code contexts. Init calls it from its
// one loop; it is not safe for concurrent use.
type Contexts struct {
	// Env and Cwd are the zygote's (the guest's environment and
	// workspace); Preload the modules it imports, comma-separated.
	Env     []string
	Cwd     string
	Preload string
	// Cred, when set, is the identity the zygote runs as (gVisor's init
	// is root).
	Cred *initproc.Cred
	// Max bounds the contexts (0: DefaultMaxContexts).
	Max int
	// Table is told which process is the zygote, so that a command's
	// clean-up spares it.
	Table *Table

	z       *zygote
	byName  map[string]*codeContext
	waiting []*cell // for the zygote, or their context's fork
}

type zygote struct {
	pid, sock int
	ready     bool
	python    string
	err       error         // the zygote failed: every waiting cell fails with it
	waiters   []func(error) // Prestart's, told when it is ready or gone
}

type codeContext struct {
	name      string
	pid, sock int
	count     int
	sent      int   // cells handed to it: its next "done" must be for this one
	cell      *cell // the one running, or nil
	forking   bool
	// exiting: its socket closed while a cell ran; the cell waits (its
	// timer re-armed with exitReportGrace) for the zygote to say how it
	// died.
	exiting bool
}

type cell struct {
	name           string
	files          CellFiles
	reply          Reply
	timeout, grace time.Duration
	timer          int
	timed          uint32
}

// Run runs a cell in context name (made on first use), answering on reply.
// It takes ownership of every descriptor of f.
func (c *Contexts) Run(name string, f CellFiles, timeout, grace time.Duration, reply Reply) {
	fail := func(errno unix.Errno, format string, args ...any) {
		f.close()
		reply.Failed(errno, fmt.Sprintf(format, args...))
	}
	if !ValidContextName(name) {
		fail(unix.EINVAL, "a context name is 1 to %d letters, digits, '.', '_' or '-'", MaxContextName)
		return
	}
	if c.byName == nil {
		c.byName = map[string]*codeContext{}
	}
	x := c.byName[name]
	if x != nil && (x.cell != nil || x.forking && c.queued(name)) {
		fail(unix.EBUSY, "context %s runs a cell", name)
		return
	}
	max := c.Max
	if max <= 0 {
		max = DefaultMaxContexts
	}
	if x == nil && len(c.byName) >= max {
		fail(unix.EAGAIN, "the sandbox has %d contexts, the most it may; delete one", max)
		return
	}
	ce := &cell{name: name, files: f, reply: reply, timeout: timeout, grace: grace, timer: -1}
	if c.z == nil {
		if err := c.startZygote(); err != nil {
			c.z = &zygote{pid: -1, sock: -1, err: err}
		}
	}
	if c.z.err != nil {
		errno := unix.EIO
		if errors.Is(c.z.err, ErrNoPython) {
			errno = unix.ENOENT
		}
		c.failCell(ce, errno, c.z.err.Error())
		return
	}
	if x == nil {
		x = &codeContext{name: name, pid: -1, sock: -1}
		c.byName[name] = x
	}
	c.waiting = append(c.waiting, ce)
	c.advance()
}

// Prestart starts the zygote ahead of any cell (a warm-pool member's, so
// that its first cell costs a fork), with env and preload, unless one runs
// or failed already, and calls done once it is ready (nil) or could not
// be (ErrNoPython, or why it ended).
func (c *Contexts) Prestart(env []string, preload string, done func(error)) {
	if c.z == nil {
		c.Env, c.Preload = env, preload
		if err := c.startZygote(); err != nil {
			c.z = &zygote{pid: -1, sock: -1, err: err}
		}
	}
	switch {
	case c.z.err != nil:
		done(c.z.err)
	case c.z.ready:
		done(nil)
	default:
		c.z.waiters = append(c.z.waiters, done)
	}
}

func (c *Contexts) queued(name string) bool {
	for _, w := range c.waiting {
		if w.name == name {
			return true
		}
	}
	return false
}

func (c *Contexts) failCell(ce *cell, errno unix.Errno, reason string) {
	ce.files.close()
	if ce.timer >= 0 {
		_ = unix.Close(ce.timer)
	}
	ce.reply.Failed(errno, reason)
}

// advance sends the waiting cells whose context is ready, and asks the
// zygote for the contexts the others need.
func (c *Contexts) advance() {
	if c.z == nil || !c.z.ready {
		return
	}
	var still []*cell
	for _, ce := range c.waiting {
		x := c.byName[ce.name]
		switch {
		case x == nil:
			c.failCell(ce, unix.EIO, "its context was deleted")
		case x.sock >= 0 && x.cell == nil:
			c.send(x, ce)
		case x.sock < 0 && !x.forking:
			if err := unix.Sendmsg(c.z.sock, []byte("fork "+x.name), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT); err != nil {
				c.failCell(ce, unix.EIO, "the zygote cannot fork a context: "+err.Error())
				delete(c.byName, x.name)
				continue
			}
			x.forking = true
			still = append(still, ce)
		default:
			still = append(still, ce)
		}
	}
	c.waiting = still
}

// send hands ce to its context and arms its budget.
func (c *Contexts) send(x *codeContext, ce *cell) {
	err := unix.Sendmsg(x.sock, []byte("run"), unix.UnixRights(ce.files.Stdout, ce.files.Stderr, ce.files.Results, ce.files.Code), nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
	ce.files.close() // the context has its copies (or none)
	ce.files = CellFiles{-1, -1, -1, -1}
	if err != nil {
		ce.reply.Failed(unix.EIO, "the context did not take the cell: "+err.Error())
		c.lose(x, proclog.EndLost, 0)
		return
	}
	x.cell = ce
	x.sent++
	if ce.timeout > 0 {
		if fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC|unix.TFD_NONBLOCK); err == nil {
			ce.timer = fd
			arm(fd, ce.timeout)
		}
	}
	ce.reply.Started()
}

func arm(fd int, d time.Duration) {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(max(d, time.Millisecond)))}
	_ = unix.TimerfdSettime(fd, 0, &spec, nil)
}

// startZygote starts the zygote; it says it is ready on its socket.
func (c *Contexts) startZygote() error {
	python, err := initproc.LookPath("python3", c.Env)
	if err != nil {
		return fmt.Errorf("%w (looked for python3 on the sandbox's PATH: %v)", ErrNoPython, err)
	}
	script, err := unix.MemfdCreate("sandbox-pyrt", unix.MFD_CLOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(script)
	if _, err := unix.Write(script, pyrt); err != nil {
		return err
	}
	socks, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(socks[1])
	null, err := unix.Open(os.DevNull, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(socks[0])
		return err
	}
	defer unix.Close(null)
	env := append([]string{"MPLBACKEND=Agg", "PYTHONDONTWRITEBYTECODE=1", "SANDBOX_SIDECAR_PRELOAD=" + c.Preload}, c.Env...)
	sys := &syscall.SysProcAttr{Setsid: true}
	if c.Cred != nil {
		sys.Credential = &syscall.Credential{Uid: c.Cred.UID, Gid: c.Cred.GID, Groups: []uint32{}}
	}
	pid, err := syscall.ForkExec(python, []string{"python3", "/proc/self/fd/4"}, &syscall.ProcAttr{
		Dir: c.Cwd, Env: env, Files: []uintptr{uintptr(null), uintptr(null), uintptr(null), uintptr(socks[1]), uintptr(script)}, Sys: sys,
	})
	if err != nil {
		unix.Close(socks[0])
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.ENOEXEC) {
			return fmt.Errorf("%w (%s: %v)", ErrNoPython, python, err)
		}
		return fmt.Errorf("cannot start python3: %w", err)
	}
	c.z = &zygote{pid: pid, sock: socks[0]}
	if c.Table != nil {
		c.Table.Spare(pid, true)
	}
	return nil
}

// PollFDs appends the zygote's and the contexts' sockets and the running
// cells' timers to fds.
func (c *Contexts) PollFDs(fds []unix.PollFd) []unix.PollFd {
	if c.z != nil && c.z.sock >= 0 {
		fds = append(fds, unix.PollFd{Fd: int32(c.z.sock), Events: unix.POLLIN})
	}
	for _, x := range c.byName {
		if x.sock >= 0 {
			fds = append(fds, unix.PollFd{Fd: int32(x.sock), Events: unix.POLLIN})
		}
		if x.cell != nil && x.cell.timer >= 0 {
			fds = append(fds, unix.PollFd{Fd: int32(x.cell.timer), Events: unix.POLLIN})
		}
	}
	return fds
}

// Handle acts on fd's readiness; false when fd is none of the contexts'.
func (c *Contexts) Handle(fd int) bool {
	if c.z != nil && fd == c.z.sock {
		c.zygoteSaid()
		return true
	}
	for _, x := range c.byName {
		switch {
		case fd == x.sock:
			c.contextSaid(x)
			return true
		case x.cell != nil && fd == x.cell.timer:
			c.budgetSpent(x)
			return true
		}
	}
	return false
}

// zygoteSaid reads one message of the zygote's.
func (c *Contexts) zygoteSaid() {
	z := c.z
	buf := make([]byte, zygoteMsgMax)
	oob := make([]byte, unix.CmsgSpace(4*2))
	n, oobn, _, _, err := unix.Recvmsg(z.sock, buf, oob, unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT)
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
		return
	}
	fds := receivedFDs(oob[:oobn])
	if err != nil || n == 0 {
		closeFDs(fds)
		c.zygoteGone(fmt.Errorf("the zygote (python3) ended before it was ready; the image's python3 may be broken, or a preloaded module took it down"))
		return
	}
	// "ready PYTHON", "forked NAME PID" (with the context's socket),
	// "died PID STATUS": words, as pyrt.py writes them.
	f := strings.Fields(string(buf[:n]))
	if len(f) == 0 {
		closeFDs(fds)
		return
	}
	m := struct {
		Op, Name, Python string
		Pid, Status      int
	}{Op: f[0]}
	switch {
	case m.Op == "ready" && len(f) == 2:
		m.Python = f[1]
	case m.Op == "forked" && len(f) == 3:
		m.Name = f[1]
		m.Pid, _ = strconv.Atoi(f[2])
	case m.Op == "died" && len(f) == 3:
		m.Pid, _ = strconv.Atoi(f[1])
		m.Status, _ = strconv.Atoi(f[2])
	default:
		m.Op = ""
	}
	switch m.Op {
	case "ready":
		z.ready, z.python = true, m.Python
		for _, w := range z.waiters {
			w(nil)
		}
		z.waiters = nil
		c.advance()
	case "forked":
		x := c.byName[m.Name]
		if x == nil || len(fds) != 1 || m.Pid <= 1 || m.Pid == os.Getpid() || !x.forking {
			// (The zygote is the guest's: a pid it names is killed only
			// when it can be its fork, never init.)
			closeFDs(fds)
			if m.Pid > 1 && m.Pid != os.Getpid() && x != nil && x.forking {
				_ = unix.Kill(m.Pid, unix.SIGKILL)
			}
			return
		}
		x.pid, x.sock, x.forking = m.Pid, fds[0], false
		c.advance()
	case "died":
		closeFDs(fds)
		for _, x := range c.byName {
			if x.pid == m.Pid {
				ws := unix.WaitStatus(m.Status)
				how, code := uint32(proclog.EndExited), uint32(ws.ExitStatus())
				if ws.Signaled() {
					how, code = proclog.EndKilled, uint32(ws.Signal())
				}
				c.lose(x, how, code)
			}
		}
	default:
		closeFDs(fds)
	}
}

// contextSaid reads one message of context x's: its cell is done. A
// message it should not send (a "done" for no cell, or for another cell
// than the one it runs: the guest wrote on its control socket) loses the
// context: a cell can end its own cell early, never answer for the next.
func (c *Contexts) contextSaid(x *codeContext) {
	var buf [4096]byte
	n, _, err := unix.Recvfrom(x.sock, buf[:], unix.MSG_DONTWAIT)
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
		return
	}
	if err != nil || n == 0 {
		// Gone (killed, out of memory, exited): the zygote reports how.
		c.closed(x)
		return
	}
	// "done COUNT", as pyrt.py writes it.
	f := strings.Fields(string(buf[:n]))
	count := 0
	if len(f) == 2 && f[0] == "done" {
		count, _ = strconv.Atoi(f[1])
	}
	if x.cell == nil || count != x.sent {
		c.lose(x, proclog.EndLost, 0)
		return
	}
	x.count = count
	ce := x.cell
	x.cell = nil
	c.stopTimer(ce)
	ce.reply.Ended(CellEnd{Timed: ce.timed, Count: count})
	if count == 1 && c.z != nil && c.z.sock >= 0 {
		// A new context's first cell ended: the zygote forks the next
		// spare now, not during that cell (pyrt.py). A zygote that
		// misses it forks it a second after the hand-out anyway.
		_ = unix.Sendmsg(c.z.sock, []byte("spare"), nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
	}
	c.advance()
}

// closed acts on context x's socket closing: without a cell it is lost at
// once; with one, the cell waits a bounded time for the zygote's report of
// how the context died (an OOM kill is told by its SIGKILL), and is lost
// without it after exitReportGrace.
func (c *Contexts) closed(x *codeContext) {
	ce := x.cell
	if ce == nil || x.exiting {
		c.lose(x, proclog.EndLost, 0)
		return
	}
	_ = unix.Close(x.sock)
	x.sock = -1
	x.exiting = true
	if ce.timer < 0 {
		fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC|unix.TFD_NONBLOCK)
		if err != nil {
			c.lose(x, proclog.EndLost, 0)
			return
		}
		ce.timer = fd
	}
	arm(ce.timer, exitReportGrace)
}

func (c *Contexts) stopTimer(ce *cell) {
	if ce.timer >= 0 {
		_ = unix.Close(ce.timer)
		ce.timer = -1
	}
}

// budgetSpent acts on a cell's timer: SIGINT at the budget (a
// KeyboardInterrupt in the cell, which keeps its context), SIGKILL once the
// grace is spent too (the context is lost).
func (c *Contexts) budgetSpent(x *codeContext) {
	ce := x.cell
	var exp [8]byte
	if n, err := unix.Read(ce.timer, exp[:]); n != len(exp) || err != nil {
		return
	}
	if x.exiting {
		c.lose(x, proclog.EndLost, 0) // the zygote never said how it died
		return
	}
	switch ce.timed {
	case proclog.TimedNo:
		ce.timed = proclog.TimedTerm
		_ = unix.Kill(x.pid, unix.SIGINT)
		arm(ce.timer, ce.grace)
	default:
		ce.timed = proclog.TimedKill
		_ = unix.Kill(x.pid, unix.SIGKILL)
		c.stopTimer(ce)
	}
}

// lose forgets context x, dead or to be killed, and ends its cell.
func (c *Contexts) lose(x *codeContext, how, code uint32) {
	if c.byName[x.name] != x {
		return
	}
	delete(c.byName, x.name)
	if x.pid > 1 {
		// Its process group too (a context is a group of its own): what
		// its cells left running ends with it.
		_ = unix.Kill(-x.pid, unix.SIGKILL)
		_ = unix.Kill(x.pid, unix.SIGKILL)
	}
	if x.sock >= 0 {
		_ = unix.Close(x.sock)
	}
	if ce := x.cell; ce != nil {
		c.stopTimer(ce)
		ce.reply.Ended(CellEnd{Lost: true, How: how, Code: code, Timed: ce.timed, Count: x.sent})
	}
	for _, ce := range c.waiting {
		if ce.name == x.name {
			c.failCell(ce, unix.EIO, "its context died")
		}
	}
	c.waiting = filterCells(c.waiting, x.name)
}

func filterCells(cells []*cell, name string) []*cell {
	out := cells[:0]
	for _, ce := range cells {
		if ce.name != name {
			out = append(out, ce)
		}
	}
	return out
}

// zygoteGone ends everything the zygote held: its contexts died with it
// (killed as its descendants) and every waiting cell fails.
func (c *Contexts) zygoteGone(why error) {
	z := c.z
	if z == nil {
		return
	}
	if z.sock >= 0 {
		_ = unix.Close(z.sock)
		z.sock = -1
	}
	if z.pid > 0 {
		_ = unix.Kill(z.pid, unix.SIGKILL)
	}
	for _, x := range c.byName {
		c.lose(x, proclog.EndLost, 0)
	}
	for _, ce := range c.waiting {
		c.failCell(ce, unix.EIO, why.Error())
	}
	c.waiting = nil
	for _, w := range z.waiters {
		w(why)
	}
	c.z = nil // the next cell starts another
}

// Reaped tells Contexts that init reaped pid; false when it was not the
// zygote.
func (c *Contexts) Reaped(pid int) bool {
	if c.z == nil || c.z.pid != pid {
		return false
	}
	if c.Table != nil {
		c.Table.Spare(pid, false)
	}
	c.z.pid = -1
	c.zygoteGone(errors.New("the zygote (python3) died"))
	return true
}

// ContextInfo is one context as List reports it.
type ContextInfo struct {
	Name    string
	Running bool
	Count   int
}

// List reports every context.
func (c *Contexts) List() []ContextInfo {
	out := make([]ContextInfo, 0, len(c.byName))
	for _, x := range c.byName {
		out = append(out, ContextInfo{Name: x.name, Running: x.cell != nil, Count: x.count})
	}
	return out
}

// Delete ends context name (its state is gone; a later cell of that name
// starts afresh); false when there is none.
func (c *Contexts) Delete(name string) bool {
	x := c.byName[name]
	if x == nil {
		return false
	}
	c.lose(x, proclog.EndKilled, uint32(unix.SIGKILL))
	return true
}

// Restart ends context name's process and state but keeps the context: it
// stays listed, idle, at execution count 0, and its next cell runs in a
// fresh fork of the zygote (the interpreter's environment, working
// directory and preloads, as when it was made). A cell it runs ends lost,
// as one of a deleted context; false when there is none.
func (c *Contexts) Restart(name string) bool {
	x := c.byName[name]
	if x == nil {
		return false
	}
	c.lose(x, proclog.EndKilled, uint32(unix.SIGKILL))
	c.byName[name] = &codeContext{name: name, pid: -1, sock: -1}
	return true
}

// Zygote reports the zygote's pid, or 0.
func (c *Contexts) Zygote() int {
	if c.z == nil || c.z.pid <= 0 {
		return 0
	}
	return c.z.pid
}

func receivedFDs(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if got, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}
