package gvinit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/agent"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostfs"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/initproc"
)

// Code contexts (run_code): init hands each cell to agent.Contexts, as
// bwrap's init does, which runs it in its context (a fork of the zygote,
// all of them the guest's). What differs is where the cell's three
// streams go: no descriptor of the daemon's can enter the sentry, so init
// makes them here (pipes, and a stream socket for the results, as bwrap's
// daemon makes them) and copies what comes out into cell output
// frames on its stream (gvwire/codewire.go), as it does a command's
// output; the cell's status follows its output. Contexts lives in the
// agent loop (procs.go) with the keepers, under pmu.

// cellEvent is what Contexts said of a cell (agent.Reply), in the order
// it said it.
type cellEvent struct {
	status gvwire.CellStatus
}

// cellRun is one cell as init serves it: its streams' reading ends, each
// copied by a goroutine of its own, and its status, sent in order by
// another once its output is (cellRun.serve).
type cellRun struct {
	st      *initState
	seq     uint32
	gen     uint64 // the daemon's attach generation it came in
	outs    [3]*os.File
	copied  sync.WaitGroup
	events  chan cellEvent // at most two: started, then ended; or failed
	closeMu sync.Once
}

// Started implements agent.Reply.
func (r *cellRun) Started() { r.event(gvwire.CellStatus{What: gvwire.CellStarted}) }

// Ended implements agent.Reply.
func (r *cellRun) Ended(e agent.CellEnd) {
	s := gvwire.CellStatus{What: gvwire.CellEnded, B: e.How, C: e.Code & 0xff, D: e.Timed, Count: uint32(min(max(e.Count, 0), math.MaxInt32))}
	if e.Lost {
		s.A = 1
	}
	r.event(s)
}

// Failed implements agent.Reply.
func (r *cellRun) Failed(errno unix.Errno, reason string) {
	if len(reason) > gvwire.MaxReasonBytes {
		reason = reason[:gvwire.MaxReasonBytes]
	}
	r.event(gvwire.CellStatus{What: gvwire.CellFailed, A: uint32(errno), Reason: reason})
}

// event queues s for serve: Contexts calls a Reply under pmu, from the
// agent loop, which must never wait for a daemon slow to read.
func (r *cellRun) event(s gvwire.CellStatus) {
	s.Seq = r.seq
	select {
	case r.events <- cellEvent{s}:
	default: // more than a cell's two: Contexts said something twice
	}
}

// serve sends the cell's status as Contexts says it: an end or a failure
// once every byte of the cell's streams was sent (or, past initDrainWait,
// once its streams are closed: a process the cell left holds them).
func (r *cellRun) serve() {
	for ev := range r.events {
		if ev.status.What != gvwire.CellStarted {
			if ev.status.What == gvwire.CellFailed {
				r.closeOuts()
			}
			r.drain()
		}
		_ = r.st.sendAs(r.gen, gvwire.KindCellStatus, ev.status.Encode())
		if ev.status.What != gvwire.CellStarted {
			return
		}
	}
}

// drain waits, initDrainWait at most, until the copies reached their
// streams' ends, then closes the streams and waits for the copies.
func (r *cellRun) drain() {
	done := make(chan struct{})
	go func() { r.copied.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(initDrainWait):
		r.closeOuts()
		<-done
	}
	r.closeOuts()
}

func (r *cellRun) closeOuts() {
	r.closeMu.Do(func() {
		for _, f := range r.outs {
			if f != nil {
				_ = f.Close()
			}
		}
	})
}

// copyOut copies stream (gvwire.CellStdout...) to the daemon until its
// end; while the daemon that asked is gone it reads on and drops, so the
// cell never blocks on it.
func (r *cellRun) copyOut(f *os.File, stream uint32) {
	defer r.copied.Done()
	buf := make([]byte, gvwire.MaxChunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			_ = r.st.sendAs(r.gen, gvwire.KindCellOutput, gvwire.CellOutput{Seq: r.seq, Stream: stream, Data: buf[:n]}.Encode())
		}
		if err != nil {
			return
		}
	}
}

// runCell takes a code frame: it makes the cell's streams and hands the
// cell to the contexts.
func (st *initState) runCell(p []byte) {
	f, err := gvwire.DecodeCode(p)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandbox init: ignoring a code frame: %v\n", err)
		return
	}
	r := &cellRun{st: st, seq: f.Seq, gen: st.generation(), events: make(chan cellEvent, 2)}
	go r.serve()
	req, err := agent.DecodeCellRequest(f.Request)
	if err != nil {
		r.Failed(unix.EINVAL, err.Error())
		return
	}
	var child [3]int
	for i := range child {
		var parent *os.File
		var c int
		var err error
		if i == 2 {
			parent, c, err = resultsStream()
		} else {
			parent, c, err = childPipe(true, false)
		}
		if err != nil {
			for j := range i {
				_ = unix.Close(child[j])
			}
			r.closeOuts()
			r.Failed(unix.EIO, "cannot make the cell's streams: "+err.Error())
			return
		}
		r.outs[i], child[i] = parent, c
	}
	r.copied.Add(len(r.outs))
	for i, f := range r.outs {
		go r.copyOut(f, uint32(gvwire.CellStdout+i))
	}
	st.pmu.Lock()
	st.codeReadyLocked()
	st.code.RunCell(req, child[0], child[1], child[2], r)
	st.startAgentLoopLocked()
	st.pmu.Unlock()
	st.wakeAgentLoop()
}

// codeReadyLocked sets up init's contexts on first use (under pmu): the
// zygote and its forks are the guest's.
func (st *initState) codeReadyLocked() {
	if st.code.Table == nil {
		st.code = agent.Contexts{Table: &st.procs, Cwd: hostfs.GuestWorkspace, Cred: &initproc.Cred{UID: guestUID, GID: guestGID}}
	}
}

// warmCode takes a code warm frame: it starts the zygote with the
// request's environment and preloads, unless one runs, and answers once
// it is ready or could not be. The answer goes only to the daemon that
// asked (its attach generation): a zygote's start takes seconds, and a
// later daemon's own calls start their sequence numbers again.
func (st *initState) warmCode(p []byte) {
	f, err := gvwire.DecodeCode(p)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandbox init: ignoring a code warm frame: %v\n", err)
		return
	}
	gen := st.generation()
	answer := func(err error) {
		a := gvwire.ProcAnswer{Seq: f.Seq}
		if err != nil {
			a.Errno = uint32(unix.EIO)
			switch {
			case errors.Is(err, agent.ErrNoPython):
				a.Errno = uint32(unix.ENOENT)
			case errors.Is(err, agent.ErrBadCell):
				a.Errno = uint32(unix.EINVAL)
			}
			a.Body = []byte(err.Error())
			if len(a.Body) > gvwire.MaxReasonBytes {
				a.Body = a.Body[:gvwire.MaxReasonBytes]
			}
		}
		// Called under pmu, from the agent loop when the zygote says it
		// is ready: never wait there for a daemon slow to read.
		go func() { _ = st.sendAs(gen, gvwire.KindProcAnswer, a.Encode()) }()
	}
	req, err := agent.DecodeCellRequest(f.Request)
	if err != nil {
		answer(err)
		return
	}
	st.pmu.Lock()
	st.codeReadyLocked()
	st.code.Max = int(req.MaxContexts)
	st.code.Prestart(req.Env, req.Preload, answer)
	st.startAgentLoopLocked()
	st.pmu.Unlock()
	st.wakeAgentLoop()
}

// resultsStream makes a cell's results stream as bwrap's daemon does: a
// stream socket, init's end non-blocking (and in the runtime's poller),
// the other for the context. A cell sees the same plumbing on both
// backends, and what it can do to it (close it, write frames on it) has
// the same outcome: its own results cut short, nobody else's.
func resultsStream() (*os.File, int, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, -1, err
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		_ = unix.Close(fds[0])
		_ = unix.Close(fds[1])
		return nil, -1, err
	}
	return os.NewFile(uintptr(fds[0]), "cell-results"), fds[1], nil
}

// contextRequest answers a context list, delete or restart.
func (st *initState) contextRequest(kind byte, p []byte) {
	if kind == gvwire.KindContextList {
		if len(p) != 4 {
			return
		}
		a := gvwire.ProcAnswer{Seq: binary.LittleEndian.Uint32(p)}
		st.pmu.Lock()
		a.Body = st.code.ListText()
		st.pmu.Unlock()
		st.answer(a)
		return
	}
	d, err := gvwire.DecodeContextDelete(p)
	if err != nil {
		st.answer(gvwire.ProcAnswer{Seq: d.Seq, Errno: uint32(unix.EINVAL)})
		return
	}
	st.pmu.Lock()
	var found bool
	if kind == gvwire.KindContextRestart {
		found = st.code.Restart(d.Name)
	} else {
		found = st.code.Delete(d.Name)
	}
	st.pmu.Unlock()
	a := gvwire.ProcAnswer{Seq: d.Seq}
	if !found {
		a.Errno = uint32(unix.ESRCH)
	}
	st.answer(a)
}
