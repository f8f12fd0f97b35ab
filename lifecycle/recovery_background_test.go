package lifecycle

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// gatedDestroy holds every Destroy until gate is closed, and says on
// entered which ones began; with adoptGate, every Adopt likewise: a forced
// interleaving of recovery's background work with the daemon serving.
type gatedDestroy struct {
	backend.Backend
	gate    chan struct{}
	entered chan string

	adoptGate    chan struct{} // nil: adopts go through
	adoptEntered chan string
}

func gated(b backend.Backend) *gatedDestroy {
	return &gatedDestroy{Backend: b, gate: make(chan struct{}), entered: make(chan string, 64), adoptEntered: make(chan string, 64)}
}

func (g *gatedDestroy) Adopt(ctx context.Context, id string) error {
	if g.adoptGate != nil {
		g.adoptEntered <- id
		<-g.adoptGate
	}
	return g.Backend.Adopt(ctx, id)
}

func (g *gatedDestroy) Destroy(ctx context.Context, id string) error {
	g.entered <- id
	<-g.gate
	return g.Backend.Destroy(ctx, id)
}

// recoverWithin runs Recover and fails the test if it does not return in
// time (as it would not if it waited for destroys that cannot finish).
func recoverWithin(t *testing.T, m *Manager, d time.Duration) RecoveryReport {
	t.Helper()
	type result struct {
		rep RecoveryReport
		err error
	}
	ch := make(chan result, 1)
	go func() {
		rep, err := m.Recover(context.Background(), false)
		ch <- result{rep, err}
	}()
	select {
	case r := <-ch:
		require.NoError(t, r.err)
		return r.rep
	case <-time.After(d):
		t.Fatal("Recover waited for its destroys past RecoverWithin")
		return RecoveryReport{}
	}
}

// With a budget, recovery returns once every fate is decided and the kept
// sandboxes adopted, while its destroys still run: the victims are gone for
// every client meanwhile (not listed, not usable, destroy a no-op), the
// daemon serves, and the report counts the destroys as they end.
func TestRecoveryDestroysFinishInBackground(t *testing.T) {
	e := newEnv(t, withJournal())
	var victims []string
	for range 3 {
		victims = append(victims, e.create(alice, CreateRequest{}).ID) // connection-bound
	}
	kept := e.create(alice, CreateRequest{TTL: time.Hour})

	var g *gatedDestroy
	n := e.restart(func(c *Config) {
		g = gated(c.Backend)
		g.adoptGate = make(chan struct{})
		c.Backend = g
		c.RecoverWithin = time.Millisecond
	})
	release := sync.OnceFunc(func() { close(g.gate) })
	defer release() // before the manager's Close, a cleanup
	releaseAdopts := sync.OnceFunc(func() { close(g.adoptGate) })
	defer releaseAdopts()
	rep := recoverWithin(t, n.m, 10*time.Second)
	assert.Equal(t, 3+1, rep.Pending, "three destroys and one adopt")
	assert.Zero(t, rep.Destroyed)
	assert.Zero(t, rep.Adopted)
	assert.Equal(t, sorted(victims...), actionsByDo(rep)["destroy"])
	n.m.Start()
	releaseAdopts()
	require.Eventually(t, func() bool { return n.m.Stats().Recovery.Adopted == 1 }, 10*time.Second, time.Millisecond)

	assert.Equal(t, []string{kept.ID}, sandboxIDs(n.m.List(alice, "")), "victims are gone for clients")
	assert.Equal(t, []string{kept.ID}, sandboxIDs(n.m.List(admin, "")))
	_, err := n.m.Exec(context.Background(), alice, victims[0], backend.ExecRequest{Command: "true", Timeout: time.Second})
	assert.ErrorIs(t, err, backend.ErrNotFound)
	require.NoError(t, n.m.Destroy(context.Background(), alice, victims[1]), "destroying a victim is a no-op success")
	fresh := n.create(alice, CreateRequest{TTL: time.Hour})
	assert.Equal(t, 3, n.m.Stats().Recovery.Pending)
	_, err = n.m.Exec(context.Background(), alice, kept.ID, backend.ExecRequest{Command: "true", Timeout: 10 * time.Second})
	require.NoError(t, err, "the kept sandbox serves while the victims are destroyed")

	release()
	require.Eventually(t, func() bool { return n.m.Stats().Recovery.Pending == 0 }, 10*time.Second, 5*time.Millisecond)
	st := n.m.Stats().Recovery
	assert.Equal(t, 3, st.Destroyed)
	assert.Zero(t, st.Failed)
	assert.Len(t, g.entered, 3, "each victim destroyed once; the client's destroy did not start another")
	got := n.journaled()
	assert.Len(t, got, 2)
	assert.Contains(t, got, kept.ID)
	assert.Contains(t, got, fresh.ID)
	listed, err := n.base.List(context.Background())
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{kept.ID, fresh.ID}, listed)
}

// Without a budget (gc) Recover waits for every destroy, as before.
func TestRecoveryWithoutBudgetWaitsForDestroys(t *testing.T) {
	e := newEnv(t, withJournal())
	e.create(alice, CreateRequest{})
	e.create(alice, CreateRequest{})
	n := e.restart(nil)
	rep, err := n.m.Recover(context.Background(), false)
	require.NoError(t, err)
	assert.Equal(t, 2, rep.Destroyed)
	assert.Zero(t, rep.Pending)
	assert.Empty(t, n.journaled())
}

// Close during background destroys starts no more of them; those not
// started stay journaled, and the next start destroys them.
func TestRecoveryCloseStopsBackgroundDestroys(t *testing.T) {
	e := newEnv(t, withJournal())
	const total = recoveryWorkers + 2
	for range total {
		e.create(alice, CreateRequest{})
	}
	var g *gatedDestroy
	n := e.restart(func(c *Config) {
		g = gated(c.Backend)
		c.Backend = g
		c.RecoverWithin = time.Millisecond
	})
	rep := recoverWithin(t, n.m, 10*time.Second)
	assert.Equal(t, total, rep.Pending)
	for range recoveryWorkers {
		select {
		case <-g.entered:
		case <-time.After(10 * time.Second):
			t.Fatal("recovery's destroys did not start")
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- n.m.Close(context.Background()) }()
	require.Eventually(t, func() bool {
		select {
		case <-n.m.stop:
			return true
		default:
			return false
		}
	}, 10*time.Second, time.Millisecond)
	close(g.gate) // the four in flight finish; none follows
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	assert.Empty(t, g.entered, "no destroy started after Close")
	st := n.m.Stats().Recovery
	assert.Equal(t, recoveryWorkers, st.Destroyed)
	assert.Equal(t, total-recoveryWorkers, st.Pending)
	assert.Len(t, n.journaled(), total-recoveryWorkers, "the rest is still journaled")

	again := n.restart(nil)
	rep2, err := again.m.Recover(context.Background(), false)
	require.NoError(t, err)
	assert.Equal(t, total-recoveryWorkers, rep2.Destroyed)
	assert.Empty(t, again.journaled())
	listed, err := again.base.List(context.Background())
	require.NoError(t, err)
	assert.Empty(t, listed)
}

// A kept sandbox whose adopt is still running when the daemon serves: it
// is listed at once, but a command in it and a destroy of it wait for the
// adopt, so the backend never sees a sandbox used or destroyed before it
// adopted it.
func TestRecoveryUseWaitsForBackgroundAdopt(t *testing.T) {
	e := newEnv(t, withJournal())
	kept := e.create(alice, CreateRequest{TTL: time.Hour})
	other := e.create(alice, CreateRequest{TTL: time.Hour})
	var g *gatedDestroy
	n := e.restart(func(c *Config) {
		g = gated(c.Backend)
		g.adoptGate = make(chan struct{})
		close(g.gate) // destroys go through
		c.Backend = g
		c.RecoverWithin = time.Millisecond
	})
	release := sync.OnceFunc(func() { close(g.adoptGate) })
	defer release()
	rep := recoverWithin(t, n.m, 10*time.Second)
	assert.Equal(t, 2, rep.Pending)
	assert.Zero(t, rep.Adopted)
	for range 2 {
		<-g.adoptEntered
	}
	assert.ElementsMatch(t, []string{kept.ID, other.ID}, sandboxIDs(n.m.List(alice, "")), "kept sandboxes are listed at once")

	execDone := make(chan error, 1)
	go func() {
		_, err := n.m.Exec(context.Background(), alice, kept.ID, backend.ExecRequest{Command: "true", Timeout: 10 * time.Second})
		execDone <- err
	}()
	destroyDone := make(chan error, 1)
	go func() { destroyDone <- n.m.Destroy(context.Background(), alice, other.ID) }()
	select {
	case err := <-execDone:
		t.Fatalf("a command ran before its sandbox was adopted: %v", err)
	case err := <-destroyDone:
		t.Fatalf("a destroy ran before its sandbox was adopted: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	assert.Empty(t, g.entered, "no Destroy reached the backend before its Adopt")
	release()
	require.NoError(t, <-execDone)
	require.NoError(t, <-destroyDone)
	assert.Equal(t, other.ID, <-g.entered)
	require.Eventually(t, func() bool { return n.m.Stats().Recovery.Pending == 0 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, 2, n.m.Stats().Recovery.Adopted)
	assert.Equal(t, []string{kept.ID}, sandboxIDs(n.m.List(alice, "")))
}

// Recover's background work must not read what Recover rewrites once its
// budget is up (CI's race detector caught it reading rep). The forced
// interleaving: Recover returns on its budget with one adopt pending; only
// then does the background work reach its end. The signal that Recover has
// returned is a directory the test makes, which the failpoint waits for by
// stat: the file system is invisible to the race detector, so the two
// goroutines share no happens-before edge and `go test -race` flags any
// shared variable, every run.
func TestRecoveryBackgroundWorkSharesNothingWithItsReport(t *testing.T) {
	e := newEnv(t, withJournal())
	e.create(alice, CreateRequest{TTL: time.Hour})
	returned := filepath.Join(t.TempDir(), "recover-returned")
	var g *gatedDestroy
	reached := make(chan struct{})
	n := e.restart(func(c *Config) {
		g = gated(c.Backend)
		g.adoptGate = make(chan struct{})
		c.Backend = g
		c.RecoverWithin = time.Millisecond
		c.Failpoint = func(name string) {
			if name != FailRecoveryBackgroundDone {
				return
			}
			defer close(reached)
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				if _, err := os.Stat(returned); err == nil {
					return
				}
			}
		}
	})
	go func() {
		<-g.adoptEntered
		close(g.adoptGate) // the adopt goes on while Recover's budget runs out
	}()
	rep := recoverWithin(t, n.m, 10*time.Second)
	require.NoError(t, os.Mkdir(returned, 0o700))
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("recovery's background work never finished")
	}
	require.Eventually(t, func() bool { return n.m.Stats().Recovery.Adopted == 1 }, 10*time.Second, time.Millisecond)
	assert.GreaterOrEqual(t, rep.Pending+rep.Adopted, 1)
}

// holdAdopts holds the Adopt of every sandbox in hold until gate closes
// and lets every other one through at once.
type holdAdopts struct {
	backend.Backend
	hold    map[string]bool
	gate    chan struct{}
	entered chan string
}

func (h *holdAdopts) Adopt(ctx context.Context, id string) error {
	if h.hold[id] {
		h.entered <- id
		<-h.gate
	}
	return h.Backend.Adopt(ctx, id)
}

// A client's first use of a sandbox whose background adopt recovery's
// queue has not begun adopts it there and then: it does not wait behind
// the adopts queued before it (at 10,000 records, seconds of them). The
// queue, held at its first recoveryWorkers adopts, never reaches the last
// sandbox, whose command still runs; the queue then skips it.
func TestRecoveryUseAdoptsItsSandboxFirst(t *testing.T) {
	e := newEnv(t, withJournal())
	var ids []string
	for range recoveryWorkers + 1 {
		ids = append(ids, e.create(alice, CreateRequest{TTL: time.Hour}).ID)
	}
	slices.Sort(ids) // the journal's order, and so the queue's
	last := ids[len(ids)-1]
	h := &holdAdopts{hold: map[string]bool{}, gate: make(chan struct{}), entered: make(chan string, len(ids))}
	for _, id := range ids[:recoveryWorkers] {
		h.hold[id] = true
	}
	n := e.restart(func(c *Config) {
		h.Backend = c.Backend
		c.Backend = h
		c.RecoverWithin = time.Millisecond
	})
	release := sync.OnceFunc(func() { close(h.gate) })
	defer release()
	rep := recoverWithin(t, n.m, 10*time.Second)
	require.Equal(t, len(ids), rep.Pending)
	var entered []string
	for range recoveryWorkers {
		entered = append(entered, <-h.entered)
	}
	require.ElementsMatch(t, ids[:recoveryWorkers], entered, "the queue began with the first sandboxes in the journal")

	done := make(chan error, 1)
	go func() {
		_, err := n.m.Exec(context.Background(), alice, last, backend.ExecRequest{Command: "true", Timeout: 10 * time.Second})
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("a command waited for the adopts queued before its sandbox's")
	}
	assert.Equal(t, recoveryWorkers, n.m.Stats().Recovery.Pending, "only the command's adopt is done")
	release()
	require.Eventually(t, func() bool { return n.m.Stats().Recovery.Pending == 0 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, len(ids), n.m.Stats().Recovery.Adopted, "every sandbox adopted once")
}

func (g *gatedDestroy) EndProcesses(ctx context.Context, id string) error {
	if pe, ok := g.Backend.(backend.ProcessEnder); ok {
		return pe.EndProcesses(ctx, id)
	}
	return nil
}

// Close during background destroys on bwrap: a doomed sandbox whose
// destroy never started stays journaled for the next start, but what it
// runs (its init, which outlives a daemon) is ended at the stop.
func TestBwrapCloseEndsWhatRecoveryDoomed(t *testing.T) {
	e := newEnv(t, withJournal(), withBwrap())
	const total = recoveryWorkers + 1
	var ids []string
	for range total {
		s := e.create(alice, CreateRequest{}) // connection-bound: doomed by a restart
		e.exec(alice, s.ID, "true")
		require.NotZero(t, sandboxInit(s.ID))
		ids = append(ids, s.ID)
	}
	var g *gatedDestroy
	n := e.restart(func(c *Config) {
		g = gated(c.Backend)
		c.Backend = g
		c.RecoverWithin = time.Millisecond
	})
	rep := recoverWithin(t, n.m, 10*time.Second)
	require.Equal(t, total, rep.Pending)
	started := map[string]bool{}
	for range recoveryWorkers {
		select {
		case id := <-g.entered:
			started[id] = true
		case <-time.After(10 * time.Second):
			t.Fatal("recovery's destroys did not start")
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- n.m.Close(context.Background()) }()
	require.Eventually(t, func() bool {
		select {
		case <-n.m.stop:
			return true
		default:
			return false
		}
	}, 10*time.Second, time.Millisecond)
	close(g.gate)
	require.NoError(t, <-closed)
	for _, id := range ids {
		if !started[id] {
			assert.Zero(t, sandboxInit(id), "the never-destroyed doomed sandbox %s's init ended at the stop", id)
			assert.Len(t, n.journaled(), 1, "and its record waits for the next start")
		}
	}
}
