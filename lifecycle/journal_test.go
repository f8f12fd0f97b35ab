package lifecycle

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

func sampleRecord(id string, i int) journalRecord {
	return journalRecord{
		ID:        id,
		UID:       uint32(1000 + i),
		Owner:     fmt.Sprintf("dag/run-%d", i),
		Holder:    "task-a",
		Labels:    map[string]string{"dag_id": "dag", "task_id": fmt.Sprint("t", i)},
		Tags:      map[string]string{"custom": strings.Repeat("x", 200)},
		Network:   "none",
		NetSpec:   `{"allow_egress_to":[],"allow_egress_to_cidrs":[],"block_network":true}`,
		Workdir:   "/workspace",
		State:     StateReady,
		CreatedAt: clockStart,
		ExpiresAt: clockStart.Add(time.Hour),
		LastUsed:  clockStart.Add(time.Minute),
	}
}

func TestJournalRoundTrip(t *testing.T) {
	dir := t.TempDir()
	j, moved, err := OpenJournal(dir)
	require.NoError(t, err)
	require.Empty(t, moved)
	require.Equal(t, filepath.Join(dir, "journal.db"), j.Path())

	all, err := j.All()
	require.NoError(t, err)
	require.Empty(t, all)

	a, b := sampleRecord("sc-a", 1), sampleRecord("sc-b", 2)
	b.ConnBound, b.Owner, b.Holder, b.State = true, "", "", StateCreating
	require.NoError(t, j.Put(a))
	require.NoError(t, j.Put(b))
	got := journalMap(t, j)
	require.Len(t, got, 2)
	assert.Equal(t, a, got["sc-a"])
	assert.Equal(t, b, got["sc-b"])

	// Put overwrites.
	b.State = StateReady
	require.NoError(t, j.Put(b))
	assert.Equal(t, StateReady, journalMap(t, j)["sc-b"].State)

	// Delete, and deleting what is missing is no error.
	require.NoError(t, j.Delete("sc-a"))
	require.NoError(t, j.Delete("sc-a"))
	require.NoError(t, j.Delete("sc-never"))
	got = journalMap(t, j)
	require.Len(t, got, 1)
	assert.Contains(t, got, "sc-b")

	// Reopening keeps the records.
	require.NoError(t, j.Close())
	j2, moved, err := OpenJournal(dir)
	require.NoError(t, err)
	require.Empty(t, moved)
	defer j2.Close()
	got = journalMap(t, j2)
	require.Len(t, got, 1)
	assert.Equal(t, b, got["sc-b"])
}

// requireMovedAside checks that the unreadable journal went to moved with
// exactly its old bytes, and that j is a working, empty journal.
func requireMovedAside(t *testing.T, dir string, j *Journal, moved string, old []byte) {
	t.Helper()
	require.NotEmpty(t, moved, "the unreadable journal was not moved aside")
	assert.True(t, strings.HasPrefix(moved, filepath.Join(dir, "journal.db")+".corrupt-"), "moved to %s", moved)
	kept, err := os.ReadFile(moved)
	require.NoError(t, err, "the moved-aside journal must exist")
	assert.True(t, bytes.Equal(old, kept), "the moved-aside file must hold the old bytes")

	all, err := j.All()
	require.NoError(t, err)
	assert.Empty(t, all, "the fresh journal must be empty")
	require.NoError(t, j.Put(sampleRecord("sc-new", 1)))
	all, err = j.All()
	require.NoError(t, err)
	assert.Len(t, all, 1)
}

func TestJournalGarbageIsMovedAside(t *testing.T) {
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"text", []byte("this is not a bbolt database\n")},
		{"random 64KiB", func() []byte {
			r := rand.New(rand.NewPCG(1, 2))
			b := make([]byte, 64<<10)
			for i := range b {
				b[i] = byte(r.UintN(256))
			}
			return b
		}()},
		{"empty file", []byte{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, "journal.db"), tc.data, 0o600))
			j, moved, err := OpenJournal(dir)
			if len(tc.data) == 0 {
				// bbolt initialises an empty file: nothing to move aside.
				require.NoError(t, err)
				defer j.Close()
				all, err := j.All()
				require.NoError(t, err)
				assert.Empty(t, all)
				return
			}
			require.NoError(t, err)
			defer j.Close()
			requireMovedAside(t, dir, j, moved, tc.data)
		})
	}
}

func TestJournalWrongSchemaIsMovedAside(t *testing.T) {
	dir := t.TempDir()
	j, _, err := OpenJournal(dir)
	require.NoError(t, err)
	require.NoError(t, j.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keySchema, []byte("99")) }))
	require.NoError(t, j.Close())
	old, err := os.ReadFile(filepath.Join(dir, "journal.db"))
	require.NoError(t, err)

	j, moved, err := OpenJournal(dir)
	require.NoError(t, err)
	defer j.Close()
	requireMovedAside(t, dir, j, moved, old)
}

func TestJournalBadRecordIsMovedAside(t *testing.T) {
	dir := t.TempDir()
	j, _, err := OpenJournal(dir)
	require.NoError(t, err)
	require.NoError(t, j.Put(sampleRecord("sc-good", 1)))
	require.NoError(t, j.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Put([]byte("sc-bad"), []byte("{not json"))
	}))
	require.NoError(t, j.Close())
	old, err := os.ReadFile(filepath.Join(dir, "journal.db"))
	require.NoError(t, err)

	j, moved, err := OpenJournal(dir)
	require.NoError(t, err)
	defer j.Close()
	requireMovedAside(t, dir, j, moved, old)
}

const childOpenJournalEnv = "LIFECYCLE_TEST_CHILD_OPEN_JOURNAL"

// childResult is what the child process reports about OpenJournal.
type childResult struct {
	Err     string `json:"err"`
	Moved   string `json:"moved"`
	Records int    `json:"records"`
	AllErr  string `json:"all_err"`
	PutErr  string `json:"put_err"`
}

// childOpenJournal opens the journal in dir, uses it and prints a
// childResult; it runs in a child process of the test binary.
func childOpenJournal(dir string) int {
	var res childResult
	j, moved, err := OpenJournal(dir)
	res.Moved = moved
	if err != nil {
		res.Err = err.Error()
	} else {
		all, err := j.All()
		res.Records = len(all)
		if err != nil {
			res.AllErr = err.Error()
		}
		if err := j.Put(sampleRecord("sc-after", 0)); err != nil {
			res.PutErr = err.Error()
		}
		j.Close()
	}
	b, _ := json.Marshal(res)
	fmt.Printf("\nCHILD-RESULT %s\n", b)
	return 0
}

// highWaterBytes reads how long a bbolt file says it is: the larger
// transaction's meta page gives the page count and the page size.
func highWaterBytes(t *testing.T, data []byte) int64 {
	t.Helper()
	// A meta page: 16-byte page header, then magic, version, pageSize,
	// flags (4 bytes each), root bucket (16), freelist (8), pgid (8),
	// txid (8), checksum (8).
	meta := func(off int) (pageSize uint32, pgid, txid uint64) {
		m := data[off+16:]
		pageSize = binary.LittleEndian.Uint32(m[8:])
		pgid = binary.LittleEndian.Uint64(m[40:])
		txid = binary.LittleEndian.Uint64(m[48:])
		return
	}
	ps, pgid0, tx0 := meta(0)
	_, pgid1, tx1 := meta(int(ps))
	pgid := pgid0
	if tx1 > tx0 {
		pgid = pgid1
	}
	return int64(pgid) * int64(ps)
}

// TestJournalTruncatedIsMovedAside cuts a real journal short at many
// lengths and opens it in a child process each time: OpenJournal must
// neither crash the process nor silently lose records; a journal it cannot
// read whole must be moved aside and replaced by a usable empty one.
func TestJournalTruncatedIsMovedAside(t *testing.T) {
	src := t.TempDir()
	j, _, err := OpenJournal(src)
	require.NoError(t, err)
	const nRecords = 60
	for i := range nRecords {
		require.NoError(t, j.Put(sampleRecord(fmt.Sprintf("sc-%04d", i), i)))
	}
	for i := 0; i < nRecords; i += 3 {
		require.NoError(t, j.Delete(fmt.Sprintf("sc-%04d", i)))
	}
	wantRecords := len(journalMap(t, j))
	require.NoError(t, j.Close())
	full, err := os.ReadFile(filepath.Join(src, "journal.db"))
	require.NoError(t, err)
	hwm := highWaterBytes(t, full)
	size := int64(len(full))
	t.Logf("journal: %d bytes, high water mark %d bytes, %d records", size, hwm, wantRecords)
	require.LessOrEqual(t, hwm, size)

	lengths := map[int64]bool{}
	for _, n := range []int64{1, 100, 4095, 4096, 5000, 8191, 8192, 8193, 12288, 16384, 20000,
		size / 2, size/2 + 1234, hwm - 4096, hwm - 1, size - 4096, size - 1} {
		if n > 0 && n < size {
			lengths[n] = true
		}
	}
	for n := range lengths {
		t.Run(fmt.Sprintf("len=%d", n), func(t *testing.T) {
			dir := t.TempDir()
			cut := full[:n]
			require.NoError(t, os.WriteFile(filepath.Join(dir, "journal.db"), cut, 0o600))

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			// GORACE: a race-enabled child would otherwise sleep a second at exit.
			cmd.Env = append(os.Environ(), childOpenJournalEnv+"="+dir, "GORACE=atexit_sleep_ms=0")
			out, runErr := cmd.CombinedOutput()
			_, line, found := strings.Cut(string(out), "CHILD-RESULT ")
			if runErr != nil || !found {
				excerpt := string(out)
				if len(excerpt) > 600 {
					excerpt = excerpt[:600]
				}
				t.Fatalf("OpenJournal of a journal truncated to %d of %d bytes killed the process (%v):\n%s", n, size, runErr, excerpt)
			}
			var res childResult
			require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(line)), &res))
			require.Empty(t, res.Err, "OpenJournal must recover from a truncated journal")
			require.Empty(t, res.AllErr)
			require.Empty(t, res.PutErr, "the journal must be usable")
			if res.Moved == "" {
				// Only acceptable if nothing was lost.
				require.Equal(t, wantRecords, res.Records, "a truncated journal lost records without being moved aside")
				return
			}
			assert.Zero(t, res.Records, "a fresh journal must be empty")
			kept, err := os.ReadFile(res.Moved)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(cut, kept), "the moved-aside file must hold the truncated bytes")
		})
	}
}

func TestJournalInFileInsteadOfDirectory(t *testing.T) {
	file := filepath.Join(t.TempDir(), "state")
	require.NoError(t, os.WriteFile(file, []byte("I am a file"), 0o600))
	j, moved, err := OpenJournal(file)
	if j != nil {
		j.Close()
	}
	require.Error(t, err)
	assert.Contains(t, err.Error(), file)
	assert.Empty(t, moved)
	// The file is left alone.
	b, rerr := os.ReadFile(file)
	require.NoError(t, rerr)
	assert.Equal(t, "I am a file", string(b))
}

func TestLockStateDirFileInsteadOfDirectory(t *testing.T) {
	file := filepath.Join(t.TempDir(), "state")
	require.NoError(t, os.WriteFile(file, []byte("I am a file"), 0o600))
	l, err := LockStateDir(file)
	require.Error(t, err)
	assert.Nil(t, l)
	assert.Contains(t, err.Error(), file)
	assert.Contains(t, err.Error(), "not a directory")
}

func TestLockStateDirParentIsAFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "parent")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	_, err := LockStateDir(filepath.Join(file, "state"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), file)
}

func TestLockStateDirTwice(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "state")
	l1, err := LockStateDir(dir)
	require.NoError(t, err)
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.True(t, fi.IsDir())
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm())

	l2, err := LockStateDir(dir)
	require.Error(t, err, "a second lock on the same directory must fail")
	assert.Nil(t, l2)
	assert.Contains(t, err.Error(), fmt.Sprintf("pid %d", os.Getpid()), "the error must name the holder")
	assert.Contains(t, err.Error(), dir)

	// The loser did not clobber the holder's pid.
	b, err := os.ReadFile(filepath.Join(dir, "lock"))
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprint(os.Getpid()), strings.TrimSpace(string(b)))

	require.NoError(t, l1.Unlock())
	require.NoError(t, l1.Unlock(), "Unlock is idempotent")
	var nilLock *StateLock
	require.NoError(t, nilLock.Unlock())

	l3, err := LockStateDir(dir)
	require.NoError(t, err, "the lock is free again after Unlock")
	require.NoError(t, l3.Unlock())
}

// holdFirstCommit makes j's first commit wait until release is closed, and
// records every commit's batch size.
func holdFirstCommit(j *Journal) (started, release chan struct{}, sizes func() []int) {
	started, release = make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var got []int
	j.beforeCommit = func(n int) {
		mu.Lock()
		got = append(got, n)
		first := len(got) == 1
		mu.Unlock()
		if first {
			close(started)
			<-release
		}
	}
	return started, release, func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// queued is how many writes wait for the next commit.
func (j *Journal) queued() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.queue)
}

// Writes that arrive during a commit share the next one: one transaction,
// one fsync. Every write returns only after its own commit, and all of
// them are there after a reopen.
func TestJournalGroupsConcurrentWrites(t *testing.T) {
	dir := t.TempDir()
	j, _, err := OpenJournal(dir)
	require.NoError(t, err)
	started, release, sizes := holdFirstCommit(j)
	errs := make(chan error, 11)
	go func() { errs <- j.Put(sampleRecord("sc-first", 0)) }()
	<-started
	for i := range 10 {
		go func() { errs <- j.Put(sampleRecord(fmt.Sprintf("sc-%02d", i), i)) }()
	}
	require.Eventually(t, func() bool { return j.queued() == 10 }, 10*time.Second, time.Millisecond)
	select {
	case err := <-errs:
		t.Fatalf("a write returned before its commit: %v", err)
	default:
	}
	close(release)
	for range 11 {
		require.NoError(t, <-errs)
	}
	assert.Equal(t, []int{1, 10}, sizes())
	require.NoError(t, j.Close())

	j, _, err = OpenJournal(dir)
	require.NoError(t, err)
	defer j.Close()
	assert.Len(t, journalMap(t, j), 11)
}

// A write that fails fails alone: the others of its group are retried one
// by one and succeed; a delete and a put of one group both land.
func TestJournalBadWriteInAGroupFailsAlone(t *testing.T) {
	dir := t.TempDir()
	j, _, err := OpenJournal(dir)
	require.NoError(t, err)
	defer j.Close()
	require.NoError(t, j.Put(sampleRecord("sc-gone", 0)))
	started, release, sizes := holdFirstCommit(j)
	first := make(chan error, 1)
	go func() { first <- j.Put(sampleRecord("sc-first", 0)) }()
	<-started
	bad, good, del := make(chan error, 1), make(chan error, 1), make(chan error, 1)
	go func() { bad <- j.Put(sampleRecord("", 1)) }() // bbolt: key required
	require.Eventually(t, func() bool { return j.queued() == 1 }, 10*time.Second, time.Millisecond)
	go func() { good <- j.Put(sampleRecord("sc-good", 2)) }()
	require.Eventually(t, func() bool { return j.queued() == 2 }, 10*time.Second, time.Millisecond)
	go func() { del <- j.Delete("sc-gone") }()
	require.Eventually(t, func() bool { return j.queued() == 3 }, 10*time.Second, time.Millisecond)
	close(release)
	require.NoError(t, <-first)
	assert.ErrorIs(t, <-bad, bolt.ErrKeyRequired)
	require.NoError(t, <-good)
	require.NoError(t, <-del)
	assert.Equal(t, []int{1, 3}, sizes())
	got := journalMap(t, j)
	assert.Contains(t, got, "sc-first")
	assert.Contains(t, got, "sc-good")
	assert.NotContains(t, got, "sc-gone")
	assert.Len(t, got, 2)
}
