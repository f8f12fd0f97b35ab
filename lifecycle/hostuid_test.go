package lifecycle

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/hostids"
)

// withHostUIDs gives the bwrap backend a uid of its own per sandbox (as a
// root daemon does), from a block of the default range.
func withHostUIDs(t *testing.T) envOpt {
	if os.Geteuid() != 0 {
		skipOrFail(t, "sandboxes with uids of their own need root here")
	}
	return withBwrapConfig(func(c *bwrap.Config) {
		c.SandboxUID, c.SandboxGID = 65534, 65534
		c.UIDRange = hostids.Range{First: hostids.DefaultFirst + 0x8000, Size: 64}
		searchable(t, filepath.Dir(c.Dir))
	})
}

// searchable lets any uid traverse dir's ancestors (t.TempDir makes them
// 0700), as a sandbox's own uid must to reach its workspace.
func searchable(t *testing.T, dir string) {
	for p := dir; p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
		require.NoError(t, os.Chmod(p, 0o711))
	}
}

// Every sandbox's host uid is journaled; after a restart the re-adopted
// sandboxes (a ready one and a warm-pool member) carry the same uid and a
// new sandbox gets another.
func TestBwrapJournalAndRecoveryCarryEachSandboxsHostUID(t *testing.T) {
	opt := withHostUIDs(t)
	e := newPoolEnv(t, 1, nil, withJournal(), opt)
	kept := e.create(alice, CreateRequest{TTL: time.Hour})
	require.NotZero(t, kept.HostUID)
	waitPool(t, e, 1)
	var pooled journalRecord
	// The journal write follows the in-memory state by a moment.
	require.Eventually(t, func() bool {
		for _, r := range e.journaled() {
			if r.State == StatePooled && r.ID != kept.ID {
				pooled = r
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "the refilled pool member is journaled")
	require.NotZero(t, pooled.HostUID, "a warm-pool member's uid is journaled")
	require.NotEqual(t, kept.HostUID, pooled.HostUID)
	require.Equal(t, kept.HostUID, e.journaled()[kept.ID].HostUID)

	// The old manager stays idle (its pool is full, nothing expires).
	e2 := e.restart(nil)
	rep, err := e2.m.Recover(context.Background(), false)
	require.NoError(t, err)
	require.Equal(t, 2, rep.Adopted)
	got, ok := e2.m.Describe(kept.ID)
	require.True(t, ok)
	assert.Equal(t, kept.HostUID, got.HostUID, "re-adopted with its journaled uid")
	res, err := e2.m.Exec(context.Background(), alice, kept.ID, backend.ExecRequest{Command: "true", Timeout: 10 * time.Second})
	require.NoError(t, err)
	require.Zero(t, res.ExitCode)

	fresh := e2.create(bob, CreateRequest{TTL: time.Hour, Spec: backend.Spec{Env: map[string]string{"NOT": "pooled"}}})
	assert.NotContains(t, []uint32{kept.HostUID, pooled.HostUID, 0}, fresh.HostUID,
		"a new sandbox never gets the uid of a re-adopted one")
}

// A record journaled before host uids were kept decodes with none, and
// recovery adopts it as before.
func TestJournalRecordWithoutHostUIDDecodes(t *testing.T) {
	dir := t.TempDir()
	j, _, err := OpenJournal(dir)
	require.NoError(t, err)
	old := `{"id":"sc-old","uid":1000,"state":"ready","conn_bound":false,"created_at":"2031-03-14T09:26:53Z","expires_at":"2031-03-14T10:26:53Z","last_used":"2031-03-14T09:26:53Z"}`
	require.NoError(t, j.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Put([]byte("sc-old"), []byte(old))
	}))
	all, err := j.All()
	require.NoError(t, err)
	require.Len(t, all, 1)
	assert.Equal(t, "sc-old", all[0].ID)
	assert.Zero(t, all[0].HostUID)

	// And a record with one keeps it, under its documented name.
	r := all[0]
	r.HostUID = 1879048200
	require.NoError(t, j.Put(r))
	raw, err := json.Marshal(r)
	require.NoError(t, err)
	assert.Contains(t, string(raw), `"host_uid":1879048200`)
	require.NoError(t, j.Close())
}
