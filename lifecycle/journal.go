package lifecycle

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The journal is a bbolt database in the state directory:
//
//	meta/schema            -> "1"
//	sandboxes/<sandbox id> -> JSON of journalRecord
//
// A record is written before the backend is asked to create the sandbox
// (state "creating"), rewritten when it is ready and on every change of
// owner, holder, tags or expiry, marked "destroying" before the backend is
// asked to destroy it, and deleted only after the backend confirmed it
// destroyed. So after any crash the journal names every sandbox that might
// exist, and recovery can decide each one's fate.
const (
	journalFile   = "journal.db"
	journalSchema = "1"
)

var (
	bucketMeta      = []byte("meta")
	bucketSandboxes = []byte("sandboxes")
	keySchema       = []byte("schema")
)

// journalRecord is what survives a restart of one sandbox.
type journalRecord struct {
	ID        string            `json:"id"`
	UID       uint32            `json:"uid"`
	Owner     string            `json:"owner,omitempty"`
	Holder    string            `json:"holder,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Tags      map[string]string `json:"tags,omitempty"`
	Network   string            `json:"network,omitempty"`
	NetSpec   string            `json:"net_spec,omitempty"`
	Workdir   string            `json:"workdir,omitempty"`
	State     State             `json:"state"`
	ConnBound bool              `json:"conn_bound"`
	Pooled    bool              `json:"pooled,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Resources journalResources  `json:"resources,omitzero"`
	// HostUID is the sandbox's own host uid (Sandbox.HostUID). Absent in
	// records written before it was kept, which decode as 0: the backend
	// runs such a sandbox as the uid it was made with.
	HostUID   uint32    `json:"host_uid,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	LastUsed  time.Time `json:"last_used"`
}

// journalResources are the limits a create asked for, as journaled (for
// list after a restart; the backend keeps what it enforces itself).
type journalResources struct {
	MemoryBytes int64   `json:"memory_bytes,omitempty"`
	CPUs        float64 `json:"cpus,omitempty"`
	PIDs        int64   `json:"pids,omitempty"`
	DiskBytes   int64   `json:"disk_bytes,omitempty"`
}

// Journal is the crash-safe record of sandboxes. Its methods are safe for
// concurrent use (bbolt serializes writers).
type Journal struct {
	db   *bolt.DB
	path string
}

// OpenJournal opens (or creates) the journal in dir. A file that cannot be
// opened or fails bbolt's consistency check is moved aside to
// journal.db.corrupt-<time> and a fresh journal is started; movedAside then
// names where it went, so the caller can say so loudly and sweep.
func OpenJournal(dir string) (j *Journal, movedAside string, err error) {
	path := filepath.Join(dir, journalFile)
	j, err = openJournal(path)
	if err == nil {
		return j, "", nil
	}
	if errors.Is(err, os.ErrPermission) {
		return nil, "", fmt.Errorf("journal %s: %w; fix the state directory's owner", path, err)
	}
	movedAside = fmt.Sprintf("%s.corrupt-%s", path, time.Now().UTC().Format("20060102T150405.000000000Z"))
	if rerr := os.Rename(path, movedAside); rerr != nil {
		return nil, "", fmt.Errorf("journal %s is unreadable (%v) and could not be moved aside: %w", path, err, rerr)
	}
	j, err = openJournal(path)
	if err != nil {
		return nil, movedAside, fmt.Errorf("creating a fresh journal %s: %w", path, err)
	}
	return j, movedAside, nil
}

func openJournal(path string) (j *Journal, err error) {
	// bbolt maps the file into memory: a truncated file makes reads past
	// its end fault (SIGBUS), which Go treats as fatal unless the faulting
	// goroutine asked to panic instead. So open and walk every page here,
	// in this goroutine, before anything else (tx.Check's own goroutine,
	// a write) touches the file.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	var db *bolt.DB
	defer func() {
		if r := recover(); r != nil {
			if db != nil {
				db.Close()
			}
			j, err = nil, fmt.Errorf("journal is corrupt: %v", r)
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Journal, error) {
		db.Close()
		return nil, err
	}
	// Read everything first, write nothing until it all checked out: a
	// damaged file is moved aside exactly as it was found.
	err = db.View(func(tx *bolt.Tx) error {
		if err := tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			return b.ForEach(func(k, v []byte) error { return nil })
		}); err != nil {
			return err
		}
		for cerr := range tx.Check() {
			return fmt.Errorf("journal consistency check: %w", cerr)
		}
		if meta := tx.Bucket(bucketMeta); meta != nil {
			if v := meta.Get(keySchema); v != nil && string(v) != journalSchema {
				return fmt.Errorf("journal schema %q is not %q", v, journalSchema)
			}
		}
		if b := tx.Bucket(bucketSandboxes); b != nil {
			return b.ForEach(func(k, v []byte) error {
				var r journalRecord
				if err := json.Unmarshal(v, &r); err != nil {
					return fmt.Errorf("journal record %q: %w", k, err)
				}
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return fail(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if meta.Get(keySchema) == nil {
			if err := meta.Put(keySchema, []byte(journalSchema)); err != nil {
				return err
			}
		}
		_, err = tx.CreateBucketIfNotExists(bucketSandboxes)
		return err
	})
	if err != nil {
		return fail(err)
	}
	return &Journal{db: db, path: path}, nil
}

// Put writes r durably (bbolt fsyncs on commit).
func (j *Journal) Put(r journalRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return j.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Put([]byte(r.ID), b)
	})
}

// Delete removes id's record; a missing record is not an error.
func (j *Journal) Delete(id string) error {
	return j.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Delete([]byte(id))
	})
}

// All returns every record.
func (j *Journal) All() ([]journalRecord, error) {
	var out []journalRecord
	err := j.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).ForEach(func(k, v []byte) error {
			var r journalRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("journal record %q: %w", k, err)
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}

// Path is the journal's file.
func (j *Journal) Path() string { return j.path }

// Close closes the journal.
func (j *Journal) Close() error { return j.db.Close() }
