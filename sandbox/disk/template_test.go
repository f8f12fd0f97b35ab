package disk

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// newTemplates is a Templates in a fresh directory, with a base directory
// for images beside it.
func newTemplates(t *testing.T) (*Templates, string) {
	t.Helper()
	requireHost(t)
	base := t.TempDir()
	ts, err := NewTemplates(filepath.Join(base, ".templates"))
	require.NoError(t, err)
	return ts, base
}

// mountImage mounts img on a new directory beside it until the test ends.
func mountImage(t *testing.T, img string) string {
	t.Helper()
	mnt := img + ".mnt"
	require.NoError(t, os.Mkdir(mnt, 0o700))
	require.NoError(t, Mount(img, mnt))
	t.Cleanup(func() {
		if err := Unmount(mnt); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return mnt
}

func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(path, &st))
	return st.Blocks * 512
}

// Every image of one shape comes from one mkfs, and each is a filesystem
// of its own: clean by e2fsck, owned as asked, capped in bytes and files,
// and sharing nothing written with its siblings.
func TestTemplatesFormatOnceAndCopiesAreCapsOfTheirOwn(t *testing.T) {
	ts, base := newTemplates(t)
	var formats atomic.Int32
	o := Options{Size: 32 << 20, Inodes: 256, UID: 65534, GID: 65534, Formatting: func(int) { formats.Add(1) }}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	imgs := []string{filepath.Join(base, "a.img"), filepath.Join(base, "b.img")}
	for _, img := range imgs {
		require.NoError(t, ts.Create(ctx, img, o))
	}
	assert.Equal(t, int32(1), formats.Load(), "one mkfs for two images of one shape")
	fsck, err := exec.LookPath("e2fsck")
	if err != nil {
		fsck = "/usr/sbin/e2fsck"
	}
	for _, img := range imgs {
		out, err := exec.Command(fsck, "-fn", img).CombinedOutput()
		require.NoError(t, err, "e2fsck -fn %s: %s", img, out)
		fi, err := os.Stat(img)
		require.NoError(t, err)
		assert.Equal(t, int64(32<<20), fi.Size())
		assert.Less(t, allocated(t, img), int64(2<<20), "a copy holds the template's data only, not its holes")
	}

	a, b := mountImage(t, imgs[0]), mountImage(t, imgs[1])
	fi, err := os.Stat(a)
	require.NoError(t, err)
	assert.Equal(t, uint32(65534), fi.Sys().(*syscall.Stat_t).Uid, "the root of the copy belongs to the uid asked for")
	require.NoError(t, os.WriteFile(filepath.Join(a, "only-in-a"), []byte("x"), 0o600))
	_, err = os.Stat(filepath.Join(b, "only-in-a"))
	assert.ErrorIs(t, err, os.ErrNotExist, "a file written to one copy is not in its sibling")

	// Bytes and files are capped as on a formatted image (bounded loops).
	require.ErrorIs(t, fill(t, b), unix.ENOSPC)
	require.NoError(t, os.Remove(filepath.Join(b, "fill")))
	var cerr error
	for i := 0; i < 1000 && cerr == nil; i++ {
		var g *os.File
		if g, cerr = os.Create(filepath.Join(b, "f"+strconv.Itoa(i))); g != nil {
			g.Close()
		}
	}
	require.ErrorIs(t, cerr, unix.ENOSPC)
	u, err := UsageOf(a)
	require.NoError(t, err)
	assert.LessOrEqual(t, u.TotalInodes, int64(256))
}

// A preallocated copy holds its whole size on the host.
func TestTemplatesPreallocatedCopy(t *testing.T) {
	ts, base := newTemplates(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	img := filepath.Join(base, "p.img")
	require.NoError(t, ts.Create(ctx, img, Options{Size: 16 << 20, UID: -1, GID: -1, Preallocate: true}))
	assert.GreaterOrEqual(t, allocated(t, img), int64(16<<20))
	mountImage(t, img)
	tpl, err := filepath.Glob(filepath.Join(ts.dir, "*.img"))
	require.NoError(t, err)
	require.Len(t, tpl, 1)
	assert.Less(t, allocated(t, tpl[0]), int64(2<<20), "the template itself stays sparse")
}

// Many creates of one shape at once still format once.
func TestTemplatesConcurrentCreatesFormatOnce(t *testing.T) {
	ts, base := newTemplates(t)
	var formats atomic.Int32
	o := Options{Size: MinSize, UID: -1, GID: -1, Formatting: func(int) { formats.Add(1) }}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = ts.Create(ctx, filepath.Join(base, strconv.Itoa(i)+".img"), o)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	assert.Equal(t, int32(1), formats.Load())
}

// A caller waiting for a template whose formatting fails (here, cut short
// by the deadline of the caller that started it) formats its own image
// instead of inheriting that caller's error.
func TestTemplatesWaiterOutlivesAFailedFormat(t *testing.T) {
	ts, base := newTemplates(t)
	mkfs, err := findMkfs("")
	require.NoError(t, err)
	// The first format hangs until it is killed; the next ones are real.
	hold := filepath.Join(base, "hold")
	require.NoError(t, os.WriteFile(hold, nil, 0o600))
	wrapper := filepath.Join(base, "mkfs")
	require.NoError(t, os.WriteFile(wrapper, []byte("#!/bin/sh\nif [ -e "+hold+" ]; then rm "+hold+"; exec sleep 600; fi\nexec "+mkfs+" \"$@\"\n"), 0o755))
	var formats atomic.Int32
	ctx1, cancel1 := context.WithCancel(context.Background())
	o := Options{Size: MinSize, UID: -1, GID: -1, MkfsPath: wrapper, Formatting: func(int) { formats.Add(1) }}
	first := make(chan error, 1)
	go func() { first <- ts.Create(ctx1, filepath.Join(base, "1.img"), o) }()
	waitFor(t, func() bool { return formats.Load() == 1 })
	second := make(chan error, 1)
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Minute)
	defer cancel2()
	go func() { second <- ts.Create(ctx2, filepath.Join(base, "2.img"), o) }()
	waitFor(t, func() bool {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		for _, tp := range ts.shape {
			return tp.users == 2
		}
		return false
	})
	cancel1() // mkfs of the template is killed
	require.Error(t, <-first)
	require.NoError(t, <-second, "the waiter made its own image")
	assert.Equal(t, int32(2), formats.Load())
	_, err = os.Stat(filepath.Join(base, "1.img"))
	assert.ErrorIs(t, err, os.ErrNotExist, "the failed create left no image")
	mountImage(t, filepath.Join(base, "2.img"))
	require.NoError(t, ts.Create(ctx2, filepath.Join(base, "3.img"), o), "and the next create formats a template again")
	assert.Equal(t, int32(3), formats.Load())
}

// The templates are bounded: past maxTemplates shapes the least recently
// used one is dropped, and when every template is being copied a new shape
// is formatted directly.
func TestTemplatesAreBounded(t *testing.T) {
	ts, base := newTemplates(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var formats atomic.Int32
	shapeN := func(i int) Options {
		return Options{Size: MinSize + int64(i)<<20, UID: -1, GID: -1, Formatting: func(int) { formats.Add(1) }}
	}
	templates := func() int {
		m, err := filepath.Glob(filepath.Join(ts.dir, "*.img"))
		require.NoError(t, err)
		return len(m)
	}
	for i := range maxTemplates + 2 {
		require.NoError(t, ts.Create(ctx, filepath.Join(base, strconv.Itoa(i)+".img"), shapeN(i)))
		assert.LessOrEqual(t, templates(), maxTemplates)
	}
	assert.Equal(t, int32(maxTemplates+2), formats.Load())
	// The two oldest shapes went; the newest are copied without a format.
	require.NoError(t, ts.Create(ctx, filepath.Join(base, "again.img"), shapeN(maxTemplates+1)))
	assert.Equal(t, int32(maxTemplates+2), formats.Load())

	// Every template held: a new shape formats its image directly and
	// keeps no template of it.
	var held []*template
	for i := 2; i < maxTemplates+2; i++ {
		tp, err := ts.acquire(ctx, shapeN(i))
		require.NoError(t, err)
		require.NotNil(t, tp)
		held = append(held, tp)
	}
	require.NoError(t, ts.Create(ctx, filepath.Join(base, "direct.img"), shapeN(100)))
	assert.Equal(t, int32(maxTemplates+3), formats.Load())
	assert.Equal(t, maxTemplates, templates())
	for _, tp := range held {
		ts.release(tp)
	}
	mountImage(t, filepath.Join(base, "direct.img"))
}

// A daemon never trusts what an earlier one left in the directory.
func TestNewTemplatesEmptiesItsDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), ".templates")
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ext4-0.img"), []byte("half written"), 0o600))
	ts, err := NewTemplates(dir)
	require.NoError(t, err)
	entries, err := os.ReadDir(ts.dir)
	require.NoError(t, err)
	assert.Empty(t, entries)
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
