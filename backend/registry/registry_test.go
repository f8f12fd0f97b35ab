package registry

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

func TestOpsBeginCancelWait(t *testing.T) {
	var o Ops
	o.ID = "s1"
	ctx, done, err := o.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if o.Wait(context.Background(), 20*time.Millisecond) {
		t.Fatal("Wait returned true with an operation in flight")
	}
	o.CancelAll()
	if !Destroyed(ctx) {
		t.Errorf("the operation's context was not cancelled by the destroy: %v", context.Cause(ctx))
	}
	if _, _, err := o.Begin(context.Background()); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("Begin during a destroy: %v, want ErrNotFound", err)
	}
	done()
	done() // twice is harmless (sbx's Exec ends its operation early, then again on return)
	if !o.Wait(context.Background(), time.Second) {
		t.Fatal("Wait after done")
	}
}

func TestOpsBoundAndRequestCancel(t *testing.T) {
	var o Ops
	var dones []func()
	for range MaxActive {
		_, done, err := o.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		dones = append(dones, done)
	}
	if _, _, err := o.Begin(context.Background()); !errors.Is(err, backend.ErrUnavailable) {
		t.Errorf("operation %d: %v, want ErrUnavailable", MaxActive+1, err)
	}
	dones[0]()
	parent, cancel := context.WithCancel(context.Background())
	ctx, done, err := o.Begin(parent)
	if err != nil {
		t.Fatalf("after one ended: %v", err)
	}
	cancel()
	if Destroyed(ctx) || ctx.Err() == nil {
		t.Errorf("a request that ended is not a destroy: %v", context.Cause(ctx))
	}
	done()
	for _, d := range dones[1:] {
		d()
	}
	if !o.Stop(context.Background(), time.Second) {
		t.Error("Stop with nothing running")
	}
}

type box struct {
	id, dir string
	ops     Ops
}

func (b *box) Ops() *Ops { return &b.ops }

func TestRegistry(t *testing.T) {
	root := t.TempDir()
	loads, forgotten := 0, 0
	r := New(Hooks[*box]{
		Load: func(id string) (*box, error) {
			dir := filepath.Join(root, id)
			if _, err := os.Stat(dir); err != nil {
				return nil, backend.NotFound(id)
			}
			loads++
			return &box{id: id, dir: dir, ops: Ops{ID: id}}, nil
		},
		Usable: func(b *box) error {
			if _, err := os.Stat(b.dir); err != nil {
				return backend.NotFound(b.id)
			}
			return nil
		},
		Exists:      func(b *box) bool { _, err := os.Lstat(b.dir); return err == nil },
		Forget:      func(*box) { forgotten++ },
		Placeholder: func(id string) *box { return &box{id: id, dir: filepath.Join(root, id)} },
	})
	if _, err := r.Lookup("../x"); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("an invalid id: %v", err)
	}
	if _, err := r.Lookup("a"); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("nothing on disk: %v", err)
	}
	if err := os.Mkdir(filepath.Join(root, "a"), 0o700); err != nil {
		t.Fatal(err)
	}
	a, err := r.Lookup("a")
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := r.Lookup("a"); again != a || loads != 1 {
		t.Errorf("a second lookup loaded again (%d loads)", loads)
	}
	if !r.KnownAndPresent("a") || r.KnownAndPresent("b") {
		t.Error("KnownAndPresent")
	}

	// Removed behind the registry's back: forgotten, its operations
	// cancelled.
	ctx, done, _ := a.ops.Begin(context.Background())
	defer done()
	os.Remove(a.dir)
	if _, err := r.Lookup("a"); !errors.Is(err, backend.ErrNotFound) || forgotten != 1 || !Destroyed(ctx) {
		t.Errorf("a vanished sandbox: %v, forgotten %d, op cancelled %v", err, forgotten, Destroyed(ctx))
	}

	// Destroy of one never loaded: a placeholder for the time of it, which
	// a Create racing it sees.
	sb, known := r.Destroying("c")
	if known {
		t.Error("c was never loaded")
	}
	sb.ops.CancelAll()
	if !r.KnownAndPresent("c") {
		t.Error("a sandbox being destroyed is taken")
	}
	if err := r.Created("c", &box{id: "c"}); !errors.Is(err, fs.ErrExist) {
		t.Errorf("Create raced by a destroy: %v", err)
	}
	r.Done("c", &box{}) // not the one held: nothing happens
	if len(r.All()) != 1 {
		t.Errorf("All = %v", r.All())
	}
	r.Done("c", sb)
	if len(r.All()) != 0 {
		t.Errorf("after Done: %v", r.All())
	}

	// Create raced by a lookup that loaded the same settings: that state
	// is kept.
	if err := os.Mkdir(filepath.Join(root, "d"), 0o700); err != nil {
		t.Fatal(err)
	}
	d, _ := r.Lookup("d")
	if err := r.Created("d", &box{id: "d"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Lookup("d"); got != d {
		t.Error("Created replaced the state a lookup loaded")
	}
}

type spec struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
}

func (s spec) SpecVersion() int { return s.Version }

func TestSpecRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if err := SaveSpec(dir, spec{Version: 2, Name: "x"}); err != nil {
		t.Fatal(err)
	}
	var got spec
	if err := LoadSpec(dir, "s", 2, &got); err != nil || got.Name != "x" {
		t.Fatalf("LoadSpec: %+v %v", got, err)
	}
	if err := LoadSpec(dir, "s", 1, &got); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("another version: %v", err)
	}
	if err := LoadSpec(t.TempDir(), "s", 2, &got); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("no settings: %v", err)
	}
}
