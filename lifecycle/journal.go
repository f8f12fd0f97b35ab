package lifecycle

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The journal is a bbolt database in the state directory:
//
//	meta/schema            -> "1"
//	sandboxes/<sandbox id> -> JSON of journalRecord
//
// A record is written before the backend is asked to create the sandbox
// (state "creating"), rewritten when it is ready (but for a
// connection-bound sandbox, which recovery destroys whatever its record
// says) and on every change of
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
	HostUID uint32 `json:"host_uid,omitempty"`
	// Image and ImageDigest: the image it runs on; absent (a record from
	// before images) is the host image.
	Image       string    `json:"image,omitempty"`
	ImageDigest string    `json:"image_digest,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	LastUsed    time.Time `json:"last_used"`
	// Paused, PausedAt and MemoryReleased: the sandbox was paused (at
	// PausedAt) when last journaled; absent in a record of a sandbox that
	// runs, and in records from before pauses. Recovery takes the
	// backend's word over it (reconcilePause).
	Paused         bool      `json:"paused,omitempty"`
	PausedAt       time.Time `json:"paused_at,omitzero"`
	MemoryReleased bool      `json:"memory_released,omitempty"`
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
// concurrent use.
//
// Writes are committed in groups: a write that finds no commit under way
// commits at once (alone: no added wait); writes that arrive while a commit
// is under way queue, and the next commit takes all of them in one bbolt
// transaction and one fsync. Each write returns only once the transaction
// holding it is durable, as when each had its own; 50 creates at once pay
// for a few fsyncs instead of 100 in turn.
type Journal struct {
	db   *bolt.DB
	path string

	mu       sync.Mutex
	queue    []*journalOp // writes waiting for the next commit
	flushing bool         // a commit is under way; its leader will take the queue

	// beforeCommit, when set (tests), is called with each commit's batch
	// size before the transaction starts.
	beforeCommit func(n int)
}

// journalOp is one queued write: a put (value) or a delete (nil value).
type journalOp struct {
	key, value []byte
	done       chan journalResult // gets exactly one result
}

type journalResult struct {
	err error
	// lead: commit the queue yourself (this op is in it); no other result
	// follows.
	lead bool
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
	return j.write(&journalOp{key: []byte(r.ID), value: b})
}

// Delete removes id's record; a missing record is not an error.
func (j *Journal) Delete(id string) error {
	return j.write(&journalOp{key: []byte(id)})
}

// write queues op and returns once a commit holding it is durable. The
// writer that finds no commit under way leads: it takes the queue, commits
// it, and hands the lead to the first writer that queued meanwhile, so no
// writer waits for more than the commit before its own and its own.
func (j *Journal) write(op *journalOp) error {
	op.done = make(chan journalResult, 1)
	j.mu.Lock()
	j.queue = append(j.queue, op)
	if j.flushing {
		j.mu.Unlock()
		if r := <-op.done; !r.lead {
			return r.err
		}
		j.mu.Lock()
	}
	j.flushing = true
	batch := j.queue
	j.queue = nil
	j.mu.Unlock()

	errs := j.commit(batch)

	j.mu.Lock()
	if len(j.queue) > 0 {
		j.queue[0].done <- journalResult{lead: true}
	} else {
		j.flushing = false
	}
	j.mu.Unlock()
	var mine error
	for i, o := range batch {
		if o == op {
			mine = errs[i]
			continue
		}
		o.done <- journalResult{err: errs[i]}
	}
	return mine
}

// commit applies batch, in order, in one transaction. If that fails and
// the batch holds more than one write, each is retried in a transaction of
// its own, so one bad write fails alone.
func (j *Journal) commit(batch []*journalOp) []error {
	if j.beforeCommit != nil {
		j.beforeCommit(len(batch))
	}
	apply := func(tx *bolt.Tx, o *journalOp) error {
		b := tx.Bucket(bucketSandboxes)
		if o.value == nil {
			return b.Delete(o.key)
		}
		return b.Put(o.key, o.value)
	}
	errs := make([]error, len(batch))
	err := j.db.Update(func(tx *bolt.Tx) error {
		for _, o := range batch {
			if err := apply(tx, o); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil || len(batch) == 1 {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	for i, o := range batch {
		errs[i] = j.db.Update(func(tx *bolt.Tx) error { return apply(tx, o) })
	}
	return errs
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
