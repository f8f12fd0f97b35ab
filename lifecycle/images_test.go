package lifecycle

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// testImages is an image store of fixed images, for the manager's side of
// images (the store itself, sandbox/image, is tested on its own and with
// the daemon end to end).
type testImages struct {
	mu   sync.Mutex
	imgs map[string]backend.Image
}

func newTestImages(names ...string) *testImages {
	ti := &testImages{imgs: map[string]backend.Image{}}
	for _, n := range names {
		ti.imgs[n] = backend.Image{Name: n, Digest: "sha256:" + n, Root: "/nonexistent/" + n}
	}
	return ti
}

func (ti *testImages) Get(name string) (backend.Image, error) {
	ti.mu.Lock()
	defer ti.mu.Unlock()
	im, ok := ti.imgs[name]
	if !ok {
		return backend.Image{}, backend.ErrImageNotFound
	}
	return im, nil
}

func (ti *testImages) List() []backend.Image {
	ti.mu.Lock()
	defer ti.mu.Unlock()
	var out []backend.Image
	for _, im := range ti.imgs {
		out = append(out, im)
	}
	return out
}

func (ti *testImages) remove(name string) error {
	ti.mu.Lock()
	defer ti.mu.Unlock()
	delete(ti.imgs, name)
	return nil
}

func newImageEnv(t *testing.T, tweak func(*Config), imgs *testImages) (*testEnv, *specRecorder) {
	rec := &specRecorder{specs: map[string]backend.Spec{}, maxMem: 1 << 40}
	e := newEnv(t, withHost(nil), withJournal(), withWrapper(func(b backend.Backend) backend.Backend { rec.Backend = b; return rec }),
		withConfig(func(c *Config) {
			c.Images = imgs
			if tweak != nil {
				tweak(c)
			}
		}))
	return e, rec
}

func TestCreateResolvesTheImage(t *testing.T) {
	e, rec := newImageEnv(t, nil, newTestImages("numpy", "busybox"))

	// No image named: the default, host.
	s := e.create(alice, CreateRequest{})
	assert.Equal(t, backend.HostImage, s.Image)
	assert.True(t, imageOf(rec, s.ID).IsHost())

	s = e.create(alice, CreateRequest{Image: "numpy"})
	assert.Equal(t, "numpy", s.Image)
	assert.Equal(t, "sha256:numpy", s.ImageDigest)
	assert.Equal(t, "/nonexistent/numpy", imageOf(rec, s.ID).Root, "the backend gets the image's root")
	assert.Equal(t, "numpy", e.journaled()[s.ID].Image, "the journal records the image")
	assert.Equal(t, "sha256:numpy", e.journaled()[s.ID].ImageDigest)

	_, err := e.m.Create(context.Background(), alice, CreateRequest{Image: "pandas"})
	var nf *backend.ImageNotFoundError
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, []string{"host", "busybox", "numpy"}, nf.Known, "the error lists the images there are")
	assert.Len(t, e.m.List(alice, ""), 2, "a refused create leaves nothing")
}

func TestDefaultImageAndRecoveryKeepTheImage(t *testing.T) {
	imgs := newTestImages("numpy")
	e, _ := newImageEnv(t, func(c *Config) { c.DefaultImage = "numpy" }, imgs)
	s := e.create(alice, CreateRequest{Owner: "run-1"})
	assert.Equal(t, "numpy", s.Image)
	h := e.create(alice, CreateRequest{Owner: "run-1", Image: "host"})
	assert.Equal(t, backend.HostImage, h.Image)

	// A restarted manager on the same journal and backend state.
	m2, err := New(Config{Backend: e.newBase(), Journal: e.journal, Now: e.clock.Now, Images: imgs})
	require.NoError(t, err)
	_, err = m2.Recover(context.Background(), false)
	require.NoError(t, err)
	got := map[string]string{}
	for _, sb := range m2.List(admin, "") {
		got[sb.ID] = sb.Image
	}
	assert.Equal(t, map[string]string{s.ID: "numpy", h.ID: backend.HostImage}, got)
	// m2 is abandoned without Close: its sandboxes belong to e's manager too.
}

func TestImageRemoveRefusedWhileInUse(t *testing.T) {
	imgs := newTestImages("numpy", "busybox")
	e, _ := newImageEnv(t, nil, imgs)
	s := e.create(alice, CreateRequest{Image: "numpy"})

	err := e.m.RemoveImage("numpy", func() error { return imgs.remove("numpy") })
	var inUse *backend.ImageInUseError
	require.ErrorAs(t, err, &inUse)
	assert.Equal(t, []string{s.ID}, inUse.Sandboxes)
	_, err = imgs.Get("numpy")
	require.NoError(t, err, "a refused rm removes nothing")

	require.Error(t, e.m.RemoveImage(backend.HostImage, func() error { t.Fatal("removed host"); return nil }))

	require.NoError(t, e.m.Destroy(context.Background(), alice, s.ID))
	require.NoError(t, e.m.RemoveImage("numpy", func() error { return imgs.remove("numpy") }))
	_, err = e.m.Create(context.Background(), alice, CreateRequest{Image: "numpy"})
	require.ErrorIs(t, err, backend.ErrImageNotFound)

	// While an rm runs, a create of that image is refused, and other
	// images still serve.
	entered, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- e.m.RemoveImage("busybox", func() error { close(entered); <-release; return imgs.remove("busybox") })
	}()
	<-entered
	_, err = e.m.Create(context.Background(), alice, CreateRequest{Image: "busybox"})
	require.ErrorIs(t, err, backend.ErrImageNotFound, "no create takes an image being removed")
	e.create(alice, CreateRequest{})
	close(release)
	require.NoError(t, <-done)
}

func TestPoolPerImage(t *testing.T) {
	imgs := newTestImages("numpy")
	e, rec := newImageEnv(t, func(c *Config) {
		c.PoolSize = 1
		c.ImagePools = map[string]int{"numpy": 2}
		c.ReapInterval = 50 * time.Millisecond
	}, imgs)
	e.m.Start()
	waitPool(t, e, 3)
	byImage := map[string]int{}
	for _, s := range e.m.List(admin, "") {
		byImage[s.Image]++
		assert.Equal(t, s.Image == "numpy", !imageOf(rec, s.ID).IsHost(), "pool members are made on their image")
	}
	assert.Equal(t, map[string]int{"host": 1, "numpy": 2}, byImage)

	s := e.create(alice, CreateRequest{Image: "numpy"})
	assert.Equal(t, "numpy", s.Image)
	assert.True(t, imageOf(rec, s.ID).Root != "", "served by a numpy member")
	h := e.create(alice, CreateRequest{})
	assert.Equal(t, backend.HostImage, h.Image)
	assert.True(t, imageOf(rec, h.ID).IsHost(), "a host create is never served by a numpy member")

	err := e.m.RemoveImage("numpy", func() error { return errors.New("must not be called") })
	var inUse *backend.ImageInUseError
	require.ErrorAs(t, err, &inUse)
	assert.True(t, inUse.Pool, "the pool uses it")
}

func imageOf(rec *specRecorder, id string) backend.Image {
	sp, _ := rec.spec(id)
	return sp.Image
}

// A restart with a smaller pool of an image destroys the members beyond
// it, which would otherwise hold the image against an rm forever.
func TestRestartWithASmallerPoolTrimsIt(t *testing.T) {
	imgs := newTestImages("numpy")
	e, _ := newImageEnv(t, func(c *Config) {
		c.ImagePools = map[string]int{"numpy": 2}
		c.ReapInterval = 50 * time.Millisecond
	}, imgs)
	e.m.Start()
	waitPool(t, e, 2)
	// The next daemon, on the same journal, without that pool.
	m2, err := New(Config{Backend: e.newBase(), Journal: e.journal, Now: e.clock.Now, Images: imgs, ImagePools: map[string]int{"numpy": 1}, ReapInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, e.m.Close(context.Background()))
	_, err = m2.Recover(context.Background(), false)
	require.NoError(t, err)
	require.Equal(t, 2, m2.Stats().Pooled, "recovery keeps both")
	m2.Start()
	t.Cleanup(func() { _ = m2.Close(context.Background()) })
	require.Eventually(t, func() bool { return m2.Stats().Pooled == 1 }, 10*time.Second, 10*time.Millisecond, "trimmed to the pool's size")
}

// Pool members of a pool the image no longer has hold it until the trim
// after a restart has removed them; the refusal says so, and then the rm
// succeeds.
func TestRemoveAfterThePoolIsGone(t *testing.T) {
	imgs := newTestImages("numpy")
	e, _ := newImageEnv(t, func(c *Config) {
		c.ImagePools = map[string]int{"numpy": 2}
		c.ReapInterval = 50 * time.Millisecond
	}, imgs)
	e.m.Start()
	waitPool(t, e, 2)
	require.NoError(t, e.m.Close(context.Background()))
	m2, err := New(Config{Backend: e.newBase(), Journal: e.journal, Now: e.clock.Now, Images: imgs, ReapInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	_, err = m2.Recover(context.Background(), false)
	require.NoError(t, err)
	err = m2.RemoveImage("numpy", func() error { return imgs.remove("numpy") })
	var inUse *backend.ImageInUseError
	require.ErrorAs(t, err, &inUse)
	assert.False(t, inUse.Pool, "no pool is configured")
	assert.Equal(t, 2, inUse.Leftover)
	assert.Contains(t, err.Error(), "retry in a moment")
	m2.Start()
	t.Cleanup(func() { _ = m2.Close(context.Background()) })
	require.Eventually(t, func() bool { return m2.Stats().Pooled == 0 && len(m2.List(admin, "")) == 0 }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, m2.RemoveImage("numpy", func() error { return imgs.remove("numpy") }))
}

// pruneRecorder is the host backend with backend.ImagePruner: it records
// what the manager asks it to keep (the gvisor backend's own pruning is
// tested there, on runsc).
type pruneRecorder struct {
	backend.Backend
	calls chan []string
}

func (p *pruneRecorder) PruneImages(keep []string) (int, error) {
	keep = slices.Clone(keep)
	slices.Sort(keep)
	p.calls <- slices.Compact(keep)
	return 0, nil
}

// next is the keep set of the next PruneImages call, which must come.
func (p *pruneRecorder) next(t *testing.T) []string {
	t.Helper()
	select {
	case keep := <-p.calls:
		return keep
	case <-time.After(10 * time.Second):
		t.Fatal("the manager never asked the backend to prune its images' state")
		return nil
	}
}

// An image rm, and every start, has a backend that derives state from
// images remove what it holds of images no longer in the store, keeping
// the store's images and those every known sandbox runs on.
func TestImageRemovePrunesTheBackendsImageState(t *testing.T) {
	imgs := newTestImages("numpy", "busybox", "alpine")
	rec := &pruneRecorder{calls: make(chan []string, 8)}
	e := newEnv(t, withHost(nil), withJournal(), withWrapper(func(b backend.Backend) backend.Backend { rec.Backend = b; return rec }),
		withConfig(func(c *Config) { c.Images = imgs; c.ReapInterval = time.Hour }))
	s := e.create(alice, CreateRequest{Image: "alpine"})
	// The store lost alpine behind the manager's back: its sandbox still
	// runs on it, so it is kept all the same.
	require.NoError(t, imgs.remove("alpine"))

	require.NoError(t, e.m.RemoveImage("numpy", func() error { return imgs.remove("numpy") }))
	assert.Equal(t, []string{"sha256:alpine", "sha256:busybox"}, rec.next(t), "numpy goes; the store's busybox and the sandbox's alpine stay")

	// A refused rm (in use) asks nothing; a failed one still prunes,
	// keeping what the store lists.
	err := e.m.RemoveImage("alpine", func() error { t.Fatal("removed an image in use"); return nil })
	require.ErrorIs(t, err, backend.ErrImageInUse)
	require.ErrorIs(t, e.m.RemoveImage("busybox", func() error { return errInjected }), errInjected)
	assert.Equal(t, []string{"sha256:alpine", "sha256:busybox"}, rec.next(t))
	select {
	case keep := <-rec.calls:
		t.Fatalf("an extra prune: %v", keep)
	default:
	}

	// Start prunes too: what a crash between the store's removal and the
	// backend's left.
	require.NoError(t, e.m.Destroy(context.Background(), alice, s.ID))
	e.m.Start()
	assert.Equal(t, []string{"sha256:busybox"}, rec.next(t), "no sandbox runs on alpine any more")
}
