package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// agent is one agent process: it works on its owned sandbox, and on
// connection-bound ones of its own, until it is killed. It records every
// write before it asks ("intent") and once the daemon acknowledged it
// ("file"), every connection-bound sandbox it made ("created"), every
// durable process it starts or signals (procFile), its pauses (pause.go),
// and what broke an invariant in its violations file.
type agent struct {
	socket, sandbox string
	acks, bad       *os.File
	pid             int
	c               *ipc.Client
	acked           map[string]string   // this incarnation's acknowledged contents
	pending         map[string][]string // contents asked for after the last acknowledgement
	requests        int
	reqLog          *os.File
	lost            bool // the owned sandbox's loss was reported

	// Durable processes (agentprocs.go): the run's token that names
	// them, the agent's index, whether they must survive a daemon's
	// kill -9, the ones it knows of and its record of them.
	token     string
	index     int
	survival  bool
	procs     []*soakProc
	procFile  *os.File
	tolerated *os.File

	// pauses records its pauses and resumes (pause.go); releases: the
	// backend gives a paused sandbox's memory back.
	pauses   *os.File
	releases bool

	// code is what its record (codeFile) says of its counting context
	// (code.go).
	code     *codeLedger
	codeFile *os.File
	// copies records its forks and snapshots (snapshot.go).
	copies *os.File
}

func agentMain(args []string) int {
	fs := flag.NewFlagSet("agent", flag.ExitOnError)
	a := &agent{pid: os.Getpid(), acked: map[string]string{}, pending: map[string][]string{}}
	var ackPath, badPath, procPath, pausePath, codePath, copiesPath string
	fs.StringVar(&a.socket, "socket", "", "")
	fs.StringVar(&a.sandbox, "sandbox", "", "")
	fs.StringVar(&ackPath, "ack", "", "")
	fs.StringVar(&badPath, "violations", "", "")
	fs.IntVar(&a.index, "index", 0, "")
	fs.StringVar(&procPath, "procs", "", "")
	fs.StringVar(&pausePath, "pauses", "", "")
	fs.StringVar(&codePath, "code", "", "")
	fs.StringVar(&copiesPath, "copies", "", "")
	fs.BoolVar(&a.releases, "memory-released", false, "")
	fs.StringVar(&a.token, "token", "", "")
	fs.BoolVar(&a.survival, "expect-process-survival", true, "")
	_ = fs.Parse(args)
	var errs []error
	appendTo := func(path string) *os.File {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		errs = append(errs, err)
		return f
	}
	a.acks, a.bad = appendTo(ackPath), appendTo(badPath)
	a.reqLog = appendTo(fmt.Sprintf("%s/requests-%d", dirOf(ackPath), a.index))
	a.pauses, a.codeFile, a.copies = appendTo(pausePath), appendTo(codePath), appendTo(copiesPath)
	errs = append(errs, a.loadProcs(procPath))
	var err error
	a.code, err = readCodeLedger(codePath, !a.survival)
	if err = errors.Join(append(errs, err)...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	for seq := 0; ; seq++ {
		a.step(seq)
	}
}

func dirOf(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[:i]
		}
	}
	return "."
}

func (a *agent) violation(format string, args ...any) {
	fmt.Fprintf(a.bad, format+"\n", args...)
}

func (a *agent) record(format string, args ...any) {
	fmt.Fprintf(a.acks, format+"\n", args...)
}

// call makes one request on the agent's connection, redialling as needed.
// It returns false when the daemon could not answer (restarting, stopped,
// shutting down, quarantine, quota): the agent just goes on. A request that
// outlives requestTimeout is a hang.
func (a *agent) call(op string, args any, out any) (ok bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	if a.c == nil {
		c, err := ipc.Dial(ctx, a.socket)
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			return false, nil
		}
		a.c = c
	}
	start := time.Now()
	err = a.c.Call(ctx, op, args, out)
	var we *ipc.Error
	switch {
	case err == nil:
		a.requests++
		if a.requests%20 == 0 {
			fmt.Fprintln(a.reqLog, 20)
		}
		return true, nil
	case errors.As(err, &we):
		a.requests++
		return false, we
	case errors.Is(err, context.DeadlineExceeded):
		a.violation("hang: %s got no answer within %v (started %s)", op, time.Since(start).Round(time.Millisecond), start.Format(time.RFC3339Nano))
	}
	a.c.Close()
	a.c = nil
	time.Sleep(50 * time.Millisecond)
	return false, nil
}

// owned checks an error of a request on the owned sandbox: not_found means
// the sandbox was lost.
func (a *agent) owned(op string, err error) {
	if ipc.IsCode(err, ipc.CodeNotFound) && !a.lost {
		a.lost = true // said once per agent process
		a.violation("the owned sandbox %s is gone: %s: %v", a.sandbox, op, err)
	}
}

func (a *agent) step(seq int) {
	switch n := rand.IntN(32); {
	case n >= 31:
		a.copyStep(seq)
	case n >= 28:
		a.codeStep()
	case n >= 26:
		a.pauseStep()
	case n >= 20:
		a.procStep(seq)
	case n < 7:
		path := fmt.Sprintf("a%d-%d", a.pid, rand.IntN(8))
		content := fmt.Sprintf("%d-%d", a.pid, seq)
		a.record("intent %s %s", path, content)
		a.pending[path] = append(a.pending[path], content)
		ok, err := a.call(ipc.OpWriteFile, api.WriteFileRequest{Sandbox: a.sandbox, Path: path, Data: []byte(content)}, nil)
		a.owned("write_file", err)
		if ok {
			a.record("file %s %s", path, content)
			a.acked[path] = content
			delete(a.pending, path)
		}
	case n < 12:
		for path, want := range a.acked {
			var res api.ReadFileResult
			ok, err := a.call(ipc.OpReadFile, api.ReadFileRequest{Sandbox: a.sandbox, Path: path}, &res)
			a.owned("read_file", err)
			if ok && string(res.Data) != want && !contains(a.pending[path], string(res.Data)) {
				a.violation("acknowledged file %s in %s holds %q, want %q", path, a.sandbox, res.Data, want)
			}
			break
		}
	case n < 16:
		var res api.RunCommandResult
		ok, err := a.call(ipc.OpRunCommand, api.RunCommandRequest{Sandbox: a.sandbox, Command: "echo " + strconv.Itoa(seq), TimeoutS: 30}, &res)
		a.owned("run_command", err)
		switch {
		case ok && res.SandboxTerminated:
			a.violation("the owned sandbox %s was terminated by a plain echo", a.sandbox)
		case ok && (res.ExitCode != 0 || string(res.Stdout) != strconv.Itoa(seq)+"\n"):
			a.violation("echo %d in %s: exit %d, stdout %q", seq, a.sandbox, res.ExitCode, res.Stdout)
		}
	case n < 18:
		// A client that goes away 0-4 ms into a run_command.
		conn, err := net.DialTimeout("unix", a.socket, time.Second)
		if err != nil {
			return
		}
		body, _ := msgpack.Marshal(map[string]any{"v": 1, "id": 1, "op": ipc.OpRunCommand,
			"args": api.RunCommandRequest{Sandbox: a.sandbox, Command: "sleep 5", TimeoutS: 30}})
		_ = ipc.WriteFrame(conn, body, 1<<20)
		time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
		conn.Close()
	default:
		// A connection-bound sandbox on the agent's connection, left to
		// die with it (or destroyed).
		var res api.CreateResult
		if ok, _ := a.call(ipc.OpCreate, nil, &res); !ok {
			return
		}
		a.record("created %s", res.Sandbox)
		var out api.RunCommandResult
		if ok, err := a.call(ipc.OpRunCommand, api.RunCommandRequest{Sandbox: res.Sandbox, Command: "echo hi", TimeoutS: 30}, &out); ok && string(out.Stdout) != "hi\n" {
			a.violation("echo hi in %s printed %q", res.Sandbox, out.Stdout)
		} else if ipc.IsCode(err, ipc.CodeNotFound) {
			a.violation("a connection-bound sandbox vanished while its connection lived: %v", err)
		}
		if rand.IntN(2) == 0 {
			a.call(ipc.OpDestroy, api.SandboxRequest{Sandbox: res.Sandbox}, nil)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
