// Package failpoint arms named points of the daemon for the tests that
// must stop it, or force an interleaving, exactly there: a race a soak
// found becomes a deterministic test. Production never arms one; an unarmed
// point costs a nil check.
//
// A spec is a comma-separated list of NAME or NAME=ACTION:
//
//	kill           SIGKILL the daemon (the default: a crash at that point)
//	sleep:DUR      wait DUR (a Go duration) and go on
//	after:OTHER    wait until point OTHER has been reached, at most
//	               AfterLimit, and go on
//
// Every point reached is remembered, armed or not, so "after" can order two
// goroutines whatever the scheduler does: A=after:B, B'=... makes A's code
// run only once B's has.
package failpoint

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Env names the variable the daemon reads its failpoints from.
const Env = "SANDBOX_SIDECAR_FAILPOINT"

// AfterLimit bounds an "after" wait, so a point whose partner never comes
// cannot hang the daemon.
const AfterLimit = 10 * time.Second

// Func is called at every named point; a nil Func is never called (use
// Hit).
type Func func(name string)

// Hit calls f at point name, if f is set.
func Hit(f func(string), name string) {
	if f != nil {
		f(name)
	}
}

type action struct {
	kind  string // "kill", "sleep", "after"
	sleep time.Duration
	after string
}

// Parse builds the Func for spec; an empty spec is nil (nothing armed).
func Parse(spec string, log hclog.Logger) (Func, error) {
	if spec == "" {
		return nil, nil
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	actions := map[string]action{}
	for _, item := range strings.Split(spec, ",") {
		name, act, hasAct := strings.Cut(strings.TrimSpace(item), "=")
		if name == "" {
			return nil, fmt.Errorf("failpoint: empty name in %q", spec)
		}
		a := action{kind: "kill"}
		switch {
		case !hasAct || act == "kill":
		case strings.HasPrefix(act, "sleep:"):
			d, err := time.ParseDuration(strings.TrimPrefix(act, "sleep:"))
			if err != nil || d < 0 {
				return nil, fmt.Errorf("failpoint %s: bad sleep %q", name, act)
			}
			a = action{kind: "sleep", sleep: d}
		case strings.HasPrefix(act, "after:") && len(act) > len("after:"):
			a = action{kind: "after", after: strings.TrimPrefix(act, "after:")}
		default:
			return nil, fmt.Errorf("failpoint %s: unknown action %q (kill, sleep:DUR, after:NAME)", name, act)
		}
		actions[name] = a
	}
	var (
		mu      sync.Mutex
		reached = map[string]chan struct{}{}
	)
	mark := func(name string) chan struct{} { // mu held
		ch, ok := reached[name]
		if !ok {
			ch = make(chan struct{})
			reached[name] = ch
		}
		return ch
	}
	log.Warn("failpoints armed: this daemon is for tests only", "spec", spec)
	return func(name string) {
		mu.Lock()
		ch := mark(name)
		select {
		case <-ch:
		default:
			close(ch)
		}
		a, armed := actions[name]
		var wait chan struct{}
		if armed && a.kind == "after" {
			wait = mark(a.after)
		}
		mu.Unlock()
		if !armed {
			return
		}
		log.Warn("failpoint reached", "failpoint", name, "action", a.kind)
		switch a.kind {
		case "kill":
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		case "sleep":
			time.Sleep(a.sleep)
		case "after":
			t := time.NewTimer(AfterLimit)
			defer t.Stop()
			select {
			case <-wait:
			case <-t.C:
				log.Warn("failpoint gave up waiting for its partner", "failpoint", name, "after", a.after, "waited", AfterLimit)
			}
		}
	}, nil
}
