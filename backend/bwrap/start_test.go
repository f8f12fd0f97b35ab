package bwrap

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// startWatch arms the failpoints of Create's background init start
// (startSoon) for the creates made after arm: it can run a step at
// FailCreateStarting or FailStartSoon, hold the start at FailStartSoon
// until release is closed, and tells when the start is there (reached) and
// when it has ended (ended). The health check's own sandbox, made before
// arm, passes untouched.
type startWatch struct {
	armed    atomic.Bool
	hold     bool
	atCreate func() // at FailCreateStarting, in Create
	atStart  func() // at FailStartSoon, in the start, before any hold
	atSaved  func() // at FailCreateSaved, in Create
	atQueued func() // at FailStartSoonQueued: the start waits for a slot
	// atStopping runs at FailStartStopping: a failed Create has cancelled
	// the start and waits for it.
	atStopping func()

	reached, release, ended chan struct{}
	reachedOnce, endedOnce  sync.Once
	cancelled               atomic.Bool // the start found itself cancelled and spawned nothing
}

func newStartWatch(t *testing.T, mode testMode, hold bool) (*Backend, *startWatch) {
	t.Helper()
	w := &startWatch{hold: hold, reached: make(chan struct{}), release: make(chan struct{}), ended: make(chan struct{})}
	b := newTestBackend(t, mode, func(c *Config) {
		c.Failpoint = func(name string) {
			if !w.armed.Load() {
				return
			}
			step := func(f func()) {
				if f != nil {
					f()
				}
			}
			switch name {
			case FailCreateStarting:
				step(w.atCreate)
			case FailStartSoon:
				step(w.atStart)
				w.reachedOnce.Do(func() { close(w.reached) })
				if w.hold {
					<-w.release
				}
			case FailCreateSaved:
				step(w.atSaved)
			case FailStartSoonQueued:
				step(w.atQueued)
			case FailStartStopping:
				step(w.atStopping)
			case FailStartSoonCancelled:
				w.cancelled.Store(true)
			case FailStartSoonEnded:
				w.endedOnce.Do(func() { close(w.ended) })
			}
		}
	})
	// A test that fails while the start is held lets it go at its end, so
	// that the sandbox's destroy is not held behind it.
	t.Cleanup(w.let)
	w.armed.Store(true)
	return b, w
}

func (w *startWatch) let() {
	select {
	case <-w.release:
	default:
		close(w.release)
	}
}

func await(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s never came", what)
	}
}

// leftNothing fails t if anything of sandbox id is left: a process, its
// directory, a listing.
func leftNothing(t *testing.T, b *Backend, id string) {
	t.Helper()
	waitNoProcessContaining(t, 5*time.Second, marker(b.sandboxDir(id)))
	if left := b.findMarked(b.sandboxDir(id), false); len(left) > 0 {
		t.Errorf("processes of sandbox %s are left: %+v", id, left)
	}
	if _, err := os.Lstat(b.sandboxDir(id)); !os.IsNotExist(err) {
		t.Errorf("the directory of sandbox %s: %v, want it gone", id, err)
	}
	ids, _ := b.List(context.Background())
	if slices.Contains(ids, id) {
		t.Errorf("sandbox %s is still listed", id)
	}
}

// Create starts the sandbox's init, in the background: with no command and
// no Warm, exactly one init runs once the start has ended, and the first
// command runs in it.
func TestBwrapCreateStartsTheInit(t *testing.T) {
	for _, m := range allModes {
		t.Run(m.name, func(t *testing.T) {
			b, w := newStartWatch(t, m, false)
			id := create(t, b, backend.Spec{})
			await(t, w.ended, "the end of the init's start")
			pids := initPIDs(b, id)
			if len(pids) != 1 {
				t.Fatalf("inits of the new sandbox: %v, want one", pids)
			}
			if out := runOK(t, b, id, "cat /proc/1/comm"); out != "sandbox-init\n" {
				t.Errorf("pid 1: %q", out)
			}
			if got := initPIDs(b, id); !slices.Equal(got, pids) {
				t.Errorf("the first command's init: %v, want the one Create started, %v", got, pids)
			}
		})
	}
}

// A command that comes while the start is still under way (forced: held
// until the command has been sent) waits for that start and runs in the
// init it made; it starts no second one.
func TestBwrapFirstCommandWaitsForTheStart(t *testing.T) {
	b, w := newStartWatch(t, daemonUID, true)
	id := create(t, b, backend.Spec{})
	// The start is held at its goroutine's first step (FailStartSoon), yet
	// Create has returned with the init's lock taken: nothing can start
	// another.
	if sb := known(t, b, id); sb.initMu.TryLock() {
		sb.initMu.Unlock()
		t.Fatal("Create returned with the init's lock free: a command could start a second init")
	}
	await(t, w.reached, "the init's start")
	if pids := initPIDs(b, id); len(pids) != 0 {
		t.Fatalf("held, yet inits run: %v", pids)
	}
	done := make(chan string, 1)
	go func() {
		res, err := b.Exec(context.Background(), id, backend.ExecRequest{Command: "cat /proc/1/comm", Timeout: 20 * time.Second})
		if err != nil {
			done <- err.Error()
			return
		}
		done <- string(res.Stdout)
	}()
	// The command may have taken the init's lock's waiting place, or not
	// yet: either way it must not run before the start is let go.
	select {
	case out := <-done:
		t.Fatalf("the command ran (%q) while the init's start was held", out)
	case <-time.After(100 * time.Millisecond):
	}
	w.let()
	select {
	case out := <-done:
		if out != "sandbox-init\n" {
			t.Errorf("pid 1: %q", out)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the command never ran")
	}
	await(t, w.ended, "the end of the init's start")
	if pids := initPIDs(b, id); len(pids) != 1 {
		t.Errorf("inits: %v, want one", pids)
	}
}

// stopDuringTheStart runs stop (a destroy, Close) while sandbox id's init
// start is held, lets the start go once stop has cancelled the sandbox's
// operations, and checks that stop waited for the start, that the start
// spawned nothing, and that no init runs.
func stopDuringTheStart(t *testing.T, b *Backend, w *startWatch, id, what string, stop func() error) {
	t.Helper()
	await(t, w.reached, "the init's start")
	sb := known(t, b, id)
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	deadline := time.Now().Add(20 * time.Second)
	for !sb.ops.Destroying() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if !sb.ops.Destroying() {
		t.Fatalf("%s never cancelled the sandbox's operations", what)
	}
	select {
	case err := <-stopped:
		t.Fatalf("%s returned (%v) while the start it cancelled was held", what, err)
	case <-time.After(100 * time.Millisecond):
	}
	w.let()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("%s never returned", what)
	}
	await(t, w.ended, "the end of the init's start")
	if !w.cancelled.Load() {
		t.Errorf("the start went on after %s had cancelled it", what)
	}
	if pids := initPIDs(b, id); len(pids) != 0 {
		t.Errorf("inits after %s: %v", what, pids)
	}
}

// A destroy during the start (forced: the start held until the destroy has
// cancelled the sandbox's operations) cancels it and waits for it: no init
// is started, nothing is left.
func TestBwrapDestroyDuringTheStart(t *testing.T) {
	for _, m := range allModes {
		t.Run(m.name, func(t *testing.T) {
			b, w := newStartWatch(t, m, true)
			id := create(t, b, backend.Spec{})
			stopDuringTheStart(t, b, w, id, "the destroy", func() error { return b.Destroy(context.Background(), id) })
			leftNothing(t, b, id)
		})
	}
}

// Close during the start (forced) cancels it and waits for it: once Close
// has returned, no init of the sandbox runs.
func TestBwrapCloseDuringTheStart(t *testing.T) {
	b, w := newStartWatch(t, daemonUID, true)
	id := create(t, b, backend.Spec{})
	stopDuringTheStart(t, b, w, id, "Close", b.Close)
}

// A start that fails (forced: the workspace bubblewrap binds is moved away
// while it starts) costs the sandbox nothing: Create succeeds, the sandbox
// stays, and its first command starts the init.
func TestBwrapFailedStartLeavesTheSandbox(t *testing.T) {
	b, w := newStartWatch(t, daemonUID, false)
	var work string
	w.atStart = func() {
		if err := os.Rename(work, work+".away"); err != nil {
			t.Error(err)
		}
	}
	idSeq++
	id := "failed-start-" + strconv.Itoa(idSeq)
	work = filepath.Join(b.sandboxDir(id), "work")
	if _, err := b.Create(context.Background(), id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Destroy(context.Background(), id) })
	await(t, w.ended, "the end of the init's start")
	if err := os.Rename(work+".away", work); err != nil {
		t.Fatal(err)
	}
	sb := known(t, b, id)
	sb.initMu.Lock()
	started := sb.init != nil
	sb.initMu.Unlock()
	if started || len(initPIDs(b, id)) != 0 {
		t.Fatal("the start succeeded without the workspace")
	}
	if out := runOK(t, b, id, "cat /proc/1/comm"); out != "sandbox-init\n" {
		t.Errorf("pid 1: %q", out)
	}
	if pids := initPIDs(b, id); len(pids) != 1 {
		t.Errorf("inits: %v, want the one the command started", pids)
	}
}

// A Create that fails after it began the start (forced: its settings
// cannot be written) stops the start, or the init it made, before it
// removes the sandbox: nothing is left. Both orders: the start still held,
// and the start already done.
func TestBwrapCreateFailingAfterTheStartLeavesNothing(t *testing.T) {
	for _, started := range []bool{false, true} {
		t.Run(fmt.Sprintf("init-started=%v", started), func(t *testing.T) {
			b, w := newStartWatch(t, rangeUID, !started)
			idSeq++
			id := "failed-create-" + strconv.Itoa(idSeq)
			w.atCreate = func() {
				if started {
					await(t, w.ended, "the end of the init's start")
					if pids := initPIDs(b, id); len(pids) != 1 {
						t.Errorf("inits before the failure: %v, want one", pids)
					}
				} else {
					await(t, w.reached, "the init's start")
				}
				// The settings are written through spec.json.tmp, made
				// exclusively: a directory there fails the write.
				if err := os.Mkdir(filepath.Join(b.sandboxDir(id), "spec.json.tmp"), 0o700); err != nil {
					t.Error(err)
				}
			}
			w.atStopping = w.let // the held start goes once Create has cancelled it
			_, err := b.Create(context.Background(), id, backend.Spec{})
			if err == nil {
				_ = b.Destroy(context.Background(), id)
				t.Fatal("Create succeeded with its settings unwritable")
			}
			await(t, w.ended, "the end of the init's start")
			if pids := initPIDs(b, id); len(pids) != 0 {
				t.Errorf("inits of a sandbox whose Create failed: %v", pids)
			}
			leftNothing(t, b, id)
		})
	}
}

// An operation that loads the new sandbox from its settings before Create
// has recorded it (forced: a lookup between the two) has its copy kept;
// Create then stops the init it began, which that copy would never know
// of. One init runs afterwards, the copy's, started by the first command.
func TestBwrapCreateLosingToALoaderStopsItsStart(t *testing.T) {
	b, w := newStartWatch(t, daemonUID, false)
	idSeq++
	id := "loaded-first-" + strconv.Itoa(idSeq)
	w.atSaved = func() {
		await(t, w.ended, "the end of the init's start")
		if _, err := b.lookup(id); err != nil {
			t.Errorf("the loader: %v", err)
		}
	}
	if _, err := b.Create(context.Background(), id, backend.Spec{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Destroy(context.Background(), id) })
	if pids := initPIDs(b, id); len(pids) != 0 {
		t.Errorf("inits no copy of the sandbox knows: %v", pids)
	}
	if out := runOK(t, b, id, "cat /proc/1/comm"); out != "sandbox-init\n" {
		t.Errorf("pid 1: %q", out)
	}
	if pids := initPIDs(b, id); len(pids) != 1 {
		t.Errorf("inits: %v, want one", pids)
	}
}

// A destroy of a sandbox whose Create has not returned (forced: at
// FailCreateStarting, its start begun) removes it and releases its host
// uid; the Create then fails, and its cleanup must not release that uid
// again: the range may have handed it to another sandbox meanwhile (here
// taken by hand). Nothing of the sandbox is left, its init included.
func TestBwrapDestroyDuringItsCreateKeepsTheUIDItReleased(t *testing.T) {
	b, w := newStartWatch(t, rangeUID, false)
	idSeq++
	id := "destroyed-mid-create-" + strconv.Itoa(idSeq)
	var uid uint32
	var taken bool
	w.atCreate = func() {
		b.mu.Lock()
		u, ok := b.uidOf[id]
		b.mu.Unlock()
		if !ok {
			t.Error("no uid recorded for the sandbox being created")
			return
		}
		uid = u
		if err := b.Destroy(context.Background(), id); err != nil {
			t.Errorf("the destroy: %v", err)
		}
		taken = b.uids.Reserve(uid) // another sandbox's now
		if !taken {
			t.Errorf("the destroy did not release uid %d", uid)
		}
	}
	if _, err := b.Create(context.Background(), id, backend.Spec{}); err == nil {
		_ = b.Destroy(context.Background(), id)
		t.Fatal("Create succeeded after its sandbox was destroyed under it")
	}
	await(t, w.ended, "the end of the init's start")
	if taken {
		if b.uids.Reserve(uid) {
			t.Errorf("the failed Create released uid %d, which another sandbox held", uid)
		}
		b.uids.Release(uid)
	}
	if pids := initPIDs(b, id); len(pids) != 0 {
		t.Errorf("inits of a sandbox destroyed during its create: %v", pids)
	}
	leftNothing(t, b, id)
}

// A burst of creates does not spawn a bwrap per create at once: past the
// backend's start slots (forced to one here, and held), a new sandbox's
// start waits holding nothing (no process, no init), a destroy cancels
// such a wait at once, and the start runs when a slot frees.
func TestBwrapCreateStartsWaitForASlot(t *testing.T) {
	b, w := newStartWatch(t, daemonUID, true)
	b.startSlots = make(chan struct{}, 1)
	queued := make(chan string, 4)
	var creating atomic.Value
	w.atQueued = func() { queued <- fmt.Sprint(creating.Load()) }
	createAs := func(id string) {
		creating.Store(id)
		if _, err := b.Create(context.Background(), id, backend.Spec{}); err != nil {
			t.Fatalf("create %s: %v", id, err)
		}
	}
	createAs("slot-a")
	await(t, w.reached, "the first start at its slot")
	createAs("slot-b")
	select {
	case <-queued:
	case <-time.After(20 * time.Second):
		t.Fatal("the second start never waited for a slot")
	}
	if pids := initPIDs(b, "slot-b"); len(pids) != 0 {
		t.Errorf("a start waiting for a slot runs inits %v", pids)
	}
	if left := b.findMarked(b.sandboxDir("slot-b"), false); len(left) > 0 {
		t.Errorf("a start waiting for a slot has processes: %+v", left)
	}
	createAs("slot-c")
	select {
	case <-queued:
	case <-time.After(20 * time.Second):
		t.Fatal("the third start never waited for a slot")
	}
	done := make(chan error, 1)
	go func() { done <- b.Destroy(context.Background(), "slot-c") }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("destroy of a sandbox whose start waits: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the destroy waited for a start slot")
	}
	if !w.cancelled.Load() {
		t.Error("the destroyed sandbox's start was not cancelled")
	}
	leftNothing(t, b, "slot-c")

	w.let()
	for _, id := range []string{"slot-a", "slot-b"} {
		if out := runOK(t, b, id, "echo ok"); out != "ok\n" {
			t.Errorf("%s: %q", id, out)
		}
		if pids := initPIDs(b, id); len(pids) != 1 {
			t.Errorf("inits of %s: %v, want one", id, pids)
		}
	}
}
