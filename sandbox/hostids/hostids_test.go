package hostids

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestValidate(t *testing.T) {
	for name, r := range map[string]Range{
		"empty":           {First: DefaultFirst},
		"too large":       {First: DefaultFirst, Size: MaxSize + 1},
		"system ids":      {First: 500, Size: 10},
		"holds nobody":    {First: 65000, Size: 1000},
		"holds 65535":     {First: 65535, Size: 1},
		"past 0x7fffffff": {First: 0x7FFFFFF0, Size: 32},
		"wraps uint32":    {First: 0xFFFFFFF0, Size: 32},
	} {
		t.Run(name, func(t *testing.T) { require.Error(t, r.Validate()) })
	}
	require.NoError(t, Range{First: DefaultFirst, Size: DefaultSize}.Validate())
	require.NoError(t, Range{First: 0x7FFFFFFF, Size: 1}.Validate())
}

func writeFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	return p
}

// A range is refused when it holds a real user or group, someone's
// subordinate ids, or the daemon's own id; a clear one is accepted.
func TestCheckFreeRefusesOverlaps(t *testing.T) {
	dir := t.TempDir()
	files := Files{
		Passwd: writeFile(t, dir, "passwd", "root:x:0:0:root:/root:/bin/sh\n# comment\nalice:x:200000:200000::/home/alice:/bin/sh\nbroken\n"),
		Group:  writeFile(t, dir, "group", "root:x:0:\nbuilders:x:300005:\n"),
		SubUID: writeFile(t, dir, "subuid", "alice:100000:65536\n"),
		SubGID: writeFile(t, dir, "subgid", "alice:400000:65536\n"),
	}
	for name, tc := range map[string]struct {
		r     Range
		extra []uint32
		want  string
	}{
		"a user":          {Range{First: 199990, Size: 20}, nil, `user "alice"`},
		"a group":         {Range{First: 300000, Size: 10}, nil, `group "builders"`},
		"subordinate uid": {Range{First: 165535, Size: 10}, nil, `subordinate ids 100000-165535 of "alice"`},
		"subordinate gid": {Range{First: 390000, Size: 10001}, nil, `subordinate ids 400000-465535`},
		"the daemon's id": {Range{First: 500000, Size: 10}, []uint32{500009}, "daemon's own id 500009"},
	} {
		t.Run(name, func(t *testing.T) {
			err := CheckFree(tc.r, files, tc.extra...)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	require.NoError(t, CheckFree(Range{First: 165536, Size: 10}, files))
	require.NoError(t, CheckFree(Range{First: DefaultFirst, Size: DefaultSize}, Files{Passwd: filepath.Join(dir, "missing")}))
}

// The host's own databases hold nothing in the default range (the daemon
// would refuse to start otherwise).
func TestDefaultRangeFreeOnThisHost(t *testing.T) {
	require.NoError(t, CheckFree(Range{First: DefaultFirst, Size: DefaultSize}, HostFiles))
}

func TestAllocator(t *testing.T) {
	a, err := NewAllocator(Range{First: 100000, Size: 3})
	require.NoError(t, err)
	require.True(t, a.Reserve(100001), "a restarted daemon's sandbox")
	require.False(t, a.Reserve(100001), "twice")
	require.False(t, a.Reserve(99999), "outside the range")
	x, err := a.Allocate()
	require.NoError(t, err)
	require.Equal(t, uint32(100000), x)
	y, err := a.Allocate()
	require.NoError(t, err)
	require.Equal(t, uint32(100002), y, "the reserved id is skipped")
	_, err = a.Allocate()
	require.True(t, errors.Is(err, ErrExhausted), "%v", err)

	// A released id comes back only after the others had their turn.
	a.Release(x)
	a.Release(y)
	z, err := a.Allocate()
	require.NoError(t, err)
	require.Equal(t, uint32(100000), z)
	a.Release(z)
	a.Release(100001)
	got := []uint32{}
	for range 3 {
		id, err := a.Allocate()
		require.NoError(t, err)
		got = append(got, id)
	}
	require.Equal(t, []uint32{100001, 100002, 100000}, got)
}

// Concurrent allocations never hand one id out twice.
func TestAllocatorConcurrent(t *testing.T) {
	a, err := NewAllocator(Range{First: 100000, Size: 1000})
	require.NoError(t, err)
	var mu sync.Mutex
	seen := map[uint32]bool{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 125 {
				id, err := a.Allocate()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if seen[id] {
					t.Errorf("id %d handed out twice", id)
				}
				seen[id] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Len(t, seen, 1000)
	require.Equal(t, 1000, a.InUse())
}
