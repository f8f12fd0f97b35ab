package lifecycle

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// plainBackend hides every optional capability of the backend it wraps:
// a backend that cannot snapshot or fork.
type plainBackend struct{ backend.Backend }

// failingForker forks as its backend does, then says it failed (after
// making the sandboxes: the manager must not count on the backend to
// have cleaned up).
type failingForker struct{ backend.Backend }

func (f failingForker) Fork(ctx context.Context, id string, ids []string, opts backend.SnapshotOptions) (backend.ForkResult, error) {
	if _, err := f.Backend.(backend.Forker).Fork(ctx, id, ids, opts); err != nil {
		return backend.ForkResult{}, err
	}
	return backend.ForkResult{}, errors.New("the disk broke")
}

func TestForkMakesIndependentCopiesWithTheSourcesLease(t *testing.T) {
	e := newEnv(t, withJournal())
	src := e.create(alice, CreateRequest{Owner: "dag/run", TTL: time.Hour, Labels: map[string]string{"k": "v"}})
	_, err := e.m.WriteTags(context.Background(), alice, src.ID, map[string]string{"tag": "x"})
	require.NoError(t, err)
	require.NoError(t, e.m.WriteFile(context.Background(), alice, src.ID, "f.txt", []byte("from the source"), 0o644))
	e.clock.Advance(10 * time.Minute)

	res, err := e.m.Fork(context.Background(), alice, src.ID, ForkRequest{Count: 2})
	require.NoError(t, err)
	require.Len(t, res.Sandboxes, 2)
	srcNow, _ := e.m.Describe(src.ID)
	for _, f := range res.Sandboxes {
		assert.NotEqual(t, src.ID, f.ID)
		assert.Equal(t, StateReady, f.State)
		assert.Equal(t, "dag/run", f.Owner)
		assert.Equal(t, srcNow.ExpiresAt, f.ExpiresAt, "a fork's lease ends with its source's")
		assert.Equal(t, map[string]string{"k": "v"}, f.Labels)
		assert.Equal(t, "x", f.Tags["tag"])
		assert.Empty(t, f.Holder)
		assert.False(t, f.ConnBound)
		data, err := e.m.ReadFile(context.Background(), alice, f.ID, "f.txt", 1<<20)
		require.NoError(t, err)
		assert.Equal(t, "from the source", string(data))
	}
	// Independent.
	require.NoError(t, e.m.WriteFile(context.Background(), alice, res.Sandboxes[0].ID, "f.txt", []byte("changed"), 0o644))
	for _, id := range []string{src.ID, res.Sandboxes[1].ID} {
		data, err := e.m.ReadFile(context.Background(), alice, id, "f.txt", 1<<20)
		require.NoError(t, err)
		assert.Equal(t, "from the source", string(data), id)
	}
	// Journaled: a restart keeps them.
	recs, err := e.journal.All()
	require.NoError(t, err)
	assert.Len(t, recs, 3)

	// Another owner and lease when asked.
	other := "dag/other-run"
	res, err = e.m.Fork(context.Background(), alice, src.ID, ForkRequest{Count: 1, Owner: &other, TTL: 5 * time.Minute})
	require.NoError(t, err)
	assert.Equal(t, other, res.Sandboxes[0].Owner)
	assert.Equal(t, e.clock.Now().Add(5*time.Minute), res.Sandboxes[0].ExpiresAt)

	// Nobody else's to fork.
	_, err = e.m.Fork(context.Background(), bob, src.ID, ForkRequest{Count: 1})
	assert.ErrorIs(t, err, backend.ErrNotFound)
	for _, n := range []int{0, MaxForkCount + 1} {
		_, err = e.m.Fork(context.Background(), alice, src.ID, ForkRequest{Count: n})
		assert.ErrorIs(t, err, ErrInvalid, "count %d", n)
	}
}

func TestForkOfAConnectionBoundSandbox(t *testing.T) {
	e := newEnv(t)
	src := e.create(alice, CreateRequest{})
	require.True(t, src.ConnBound)
	c := alice
	c.ConnID = 77
	res, err := e.m.Fork(context.Background(), c, src.ID, ForkRequest{Count: 1})
	require.NoError(t, err)
	f := res.Sandboxes[0]
	assert.True(t, f.ConnBound)
	assert.Equal(t, uint64(77), f.ConnID, "a connection-bound fork is its fork's client's")
	owner := "dag/run"
	res, err = e.m.Fork(context.Background(), c, src.ID, ForkRequest{Count: 1, Owner: &owner})
	require.NoError(t, err)
	assert.False(t, res.Sandboxes[0].ConnBound)
	assert.Equal(t, e.clock.Now().Add(DefaultTTL), res.Sandboxes[0].ExpiresAt)
}

// TestForkQuotasAreAllOrNothing: a fork of 5 with room for 3 makes none
// and says so; a fork of 3 then fits.
func TestForkQuotasAreAllOrNothing(t *testing.T) {
	for _, c := range []struct {
		scope string
		cfg   func(*Config)
		req   CreateRequest
	}{
		{"uid", func(c *Config) { c.MaxPerUID = 5 }, CreateRequest{}},
		{"owner", func(c *Config) { c.MaxPerOwner = 5 }, CreateRequest{Owner: "dag/run"}},
		{"host", func(c *Config) { c.MaxPerHost = 5 }, CreateRequest{}},
	} {
		t.Run(c.scope, func(t *testing.T) {
			e := newEnv(t, withJournal(), withConfig(c.cfg))
			src := e.create(alice, c.req)
			e.create(alice, c.req)
			_, err := e.m.Fork(context.Background(), alice, src.ID, ForkRequest{Count: 5})
			var fq *ForkQuotaError
			require.ErrorAs(t, err, &fq)
			var q *QuotaError
			require.ErrorAs(t, err, &q)
			assert.Equal(t, c.scope, q.Scope)
			assert.Equal(t, 3, fq.Room)
			assert.Contains(t, err.Error(), "room for 3")
			assert.Len(t, e.m.List(alice, ""), 2, "a refused fork made sandboxes")
			assert.Len(t, e.listed(), 2)
			recs, err := e.journal.All()
			require.NoError(t, err)
			assert.Len(t, recs, 2)

			res, err := e.m.Fork(context.Background(), alice, src.ID, ForkRequest{Count: 3})
			require.NoError(t, err)
			assert.Len(t, res.Sandboxes, 3)
			assert.Len(t, e.m.List(alice, ""), 5)
		})
	}
}

func TestForkFailureLeavesNothing(t *testing.T) {
	e := newEnv(t, withJournal(), withWrapper(func(b backend.Backend) backend.Backend {
		return failingForker{b}
	}))
	src := e.create(alice, CreateRequest{})
	_, err := e.m.Fork(context.Background(), alice, src.ID, ForkRequest{Count: 2})
	require.ErrorContains(t, err, "the disk broke")
	assert.Len(t, e.m.List(alice, ""), 1)
	assert.Equal(t, []string{src.ID}, e.listed(), "the backend's half of a failed fork is left")
	recs, err := e.journal.All()
	require.NoError(t, err)
	assert.Len(t, recs, 1)
}

func TestSnapshotHandsTheFilesToTake(t *testing.T) {
	imgs := newTestImages("base")
	e := newEnv(t, withConfig(func(c *Config) { c.Images = imgs }))
	sb := e.create(alice, CreateRequest{Image: "base"})
	require.NoError(t, e.m.WriteFile(context.Background(), alice, sb.ID, "f.txt", []byte("data"), 0o644))
	res, err := e.m.Snapshot(context.Background(), alice, sb.ID, backend.SnapshotOptions{}, func(src SnapshotSource) (backend.Image, error) {
		assert.Equal(t, sb.ID, src.Sandbox)
		assert.Equal(t, "base", src.Image)
		assert.Equal(t, "sha256:base", src.ImageDigest)
		assert.Equal(t, alice.UID, src.UID)
		data, err := os.ReadFile(filepath.Join(src.Files.Workspace, "f.txt"))
		require.NoError(t, err)
		assert.Equal(t, "data", string(data))
		return backend.Image{Name: "snap", Digest: "sha256:snap"}, nil
	})
	require.NoError(t, err)
	assert.Equal(t, "snap", res.Image.Name)

	takeErr := errors.New("the store is full")
	_, err = e.m.Snapshot(context.Background(), alice, sb.ID, backend.SnapshotOptions{}, func(SnapshotSource) (backend.Image, error) {
		return backend.Image{}, takeErr
	})
	assert.ErrorIs(t, err, takeErr)
	_, err = e.m.Snapshot(context.Background(), bob, sb.ID, backend.SnapshotOptions{}, func(SnapshotSource) (backend.Image, error) {
		t.Error("take called for another uid's sandbox")
		return backend.Image{}, nil
	})
	assert.ErrorIs(t, err, backend.ErrNotFound)
}

func TestSnapshotAndForkOnABackendWithout(t *testing.T) {
	e := newEnv(t, withWrapper(func(b backend.Backend) backend.Backend { return plainBackend{b} }))
	sb := e.create(alice, CreateRequest{})
	_, err := e.m.Snapshot(context.Background(), alice, sb.ID, backend.SnapshotOptions{}, func(SnapshotSource) (backend.Image, error) {
		return backend.Image{}, nil
	})
	assert.ErrorIs(t, err, backend.ErrUnsupported)
	_, err = e.m.Fork(context.Background(), alice, sb.ID, ForkRequest{Count: 1})
	assert.ErrorIs(t, err, backend.ErrUnsupported)
}

// TestSnapshotImagesAreTheirTakersUIDs: a snapshot a client took runs
// sandboxes for its uid and admins alone; other images for everyone.
func TestSnapshotImagesAreTheirTakersUIDs(t *testing.T) {
	imgs := newTestImages("public")
	uid := alice.UID
	imgs.imgs["alices"] = backend.Image{Name: "alices", Digest: "sha256:alices", Root: "/nonexistent/alices",
		Origin: &backend.ImageOrigin{Sandbox: "sc-1", UID: &uid}}
	e, _ := newImageEnv(t, nil, imgs)
	e.create(alice, CreateRequest{Image: "alices"})
	e.create(admin, CreateRequest{Image: "alices"})
	e.create(bob, CreateRequest{Image: "public"})
	_, err := e.m.Create(context.Background(), bob, CreateRequest{Image: "alices"})
	var nf *backend.ImageNotFoundError
	require.ErrorAs(t, err, &nf)
	assert.NotContains(t, nf.Known, "alices")
	assert.Contains(t, nf.Known, "public")
}
