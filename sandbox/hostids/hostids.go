// Package hostids hands out the host user and group ids sandboxes run as:
// one id from a range the daemon reserves for itself, per live sandbox, so
// that no other local process shares a sandbox's uid (which would let it
// ptrace, signal or enter the sandbox's processes) and two sandboxes are
// as distinct to the host kernel as two users.
//
// A sandbox's uid and gid are the same number. The package checks that a
// range belongs to nobody else (the account databases and the subordinate
// id ranges) and keeps the set of ids in use; it neither creates sandboxes
// nor persists anything: the backend records each sandbox's id with the
// sandbox and tells the allocator again after a restart.
package hostids

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
)

// The default range: 65,536 ids from 0x70000000. systemd's list of uid
// ranges (UIDS-GIDS.md) leaves it to no one: it lies above the range
// systemd-nspawn picks container ranges from (0x00080000-0x6FFFFFFF) and
// below the foreign-ownership range (0x7FFE0000-0x7FFEFFFF) and the ids
// some programs take for negative (>= 0x80000000). Subordinate id ranges
// (/etc/subuid) usually start at 100000 in steps of 65536 and are checked.
const (
	DefaultFirst = 0x70000000
	DefaultSize  = 65536
)

// Bounds on a configured range.
const (
	// MaxSize is the most ids a range may hold.
	MaxSize = 1 << 24
	// maxLast keeps the ids below those some programs read as negative,
	// and so away from -1 ((uid_t)-1 means "unchanged" to the kernel).
	maxLast = 0x7FFFFFFF
	// maxAccountFileBytes bounds what is read of one account file.
	maxAccountFileBytes = 64 << 20
)

// Range is Size consecutive ids starting at First.
type Range struct {
	First, Size uint32
}

// Last is the range's last id.
func (r Range) Last() uint32 { return r.First + r.Size - 1 }

// Contains reports whether id is in r.
func (r Range) Contains(id uint32) bool { return r.Size > 0 && id >= r.First && id <= r.Last() }

func (r Range) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last()) }

// Validate checks the range's shape: not empty, at most MaxSize ids, none
// of them a privileged or special id.
func (r Range) Validate() error {
	switch {
	case r.Size == 0:
		return errors.New("the sandbox uid range is empty; give it a size of at least 1")
	case r.Size > MaxSize:
		return fmt.Errorf("the sandbox uid range holds %d ids, more than the %d allowed", r.Size, MaxSize)
	case r.First < 1000:
		return fmt.Errorf("the sandbox uid range starts at %d, among the system's own ids (below 1000); move it (the default starts at %d)", r.First, DefaultFirst)
	case uint64(r.First)+uint64(r.Size)-1 > maxLast:
		return fmt.Errorf("the sandbox uid range %d+%d ends above %d; move it down (the default starts at %d)", r.First, r.Size, maxLast, DefaultFirst)
	case r.Contains(65534) || r.Contains(65535):
		return fmt.Errorf("the sandbox uid range %s holds 65534 (nobody) or 65535; move it (the default starts at %d)", r, DefaultFirst)
	}
	return nil
}

// Files are the account databases CheckFree reads; HostFiles are the host's.
type Files struct {
	Passwd, Group, SubUID, SubGID string
}

// HostFiles are the host's account databases.
var HostFiles = Files{Passwd: "/etc/passwd", Group: "/etc/group", SubUID: "/etc/subuid", SubGID: "/etc/subgid"}

// CheckFree refuses a range that holds the id of a user or group in the
// account databases, overlaps a subordinate id range given to someone, or
// holds one of extra (the daemon's own ids). A missing file has no entries.
// Users only a directory service (LDAP, NSS modules) knows are not seen:
// an operator using one must keep the range out of its id space.
func CheckFree(r Range, files Files, extra ...uint32) error {
	if err := r.Validate(); err != nil {
		return err
	}
	for _, id := range extra {
		if r.Contains(id) {
			return fmt.Errorf("the sandbox uid range %s holds the daemon's own id %d; move the range", r, id)
		}
	}
	for _, db := range []struct{ path, what string }{{files.Passwd, "user"}, {files.Group, "group"}} {
		if db.path == "" {
			continue
		}
		err := eachLine(db.path, func(line string) error {
			f := strings.Split(line, ":")
			if len(f) < 3 {
				return nil
			}
			id, err := strconv.ParseUint(f[2], 10, 32)
			if err == nil && r.Contains(uint32(id)) {
				return fmt.Errorf("the sandbox uid range %s holds %s %q (id %d in %s): sandboxes would share its id; move the range (bwrap.uid_range_start)", r, db.what, f[0], id, db.path)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	for _, db := range []string{files.SubUID, files.SubGID} {
		if db == "" {
			continue
		}
		err := eachLine(db, func(line string) error {
			f := strings.Split(line, ":")
			if len(f) != 3 {
				return nil
			}
			start, err1 := strconv.ParseUint(f[1], 10, 32)
			count, err2 := strconv.ParseUint(f[2], 10, 32)
			if err1 != nil || err2 != nil || count == 0 {
				return nil
			}
			if start <= uint64(r.Last()) && start+count-1 >= uint64(r.First) {
				return fmt.Errorf("the sandbox uid range %s overlaps the subordinate ids %d-%d of %q in %s: their containers would share the sandboxes' ids; move the range (bwrap.uid_range_start)", r, start, start+count-1, f[0], db)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// eachLine calls fn for each non-comment line of path (bounded).
func eachLine(path string, fn func(string) error) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cannot check the sandbox uid range against %s: %w", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, maxAccountFileBytes))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		if err := fn(line); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("cannot check the sandbox uid range against %s: %w", path, err)
	}
	return nil
}

// ErrExhausted is returned when every id of the range is in use.
var ErrExhausted = errors.New("every host uid of the sandbox range is in use")

// Allocator keeps the ids of a range in use. Its methods are safe for
// concurrent use.
type Allocator struct {
	r    Range
	mu   sync.Mutex
	used map[uint32]bool
	next uint32 // offset of the next id tried
}

// NewAllocator returns an allocator of r with nothing in use; r must be
// valid.
func NewAllocator(r Range) (*Allocator, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &Allocator{r: r, used: make(map[uint32]bool)}, nil
}

// Range is the allocator's range.
func (a *Allocator) Range() Range { return a.r }

// Allocate returns an id no live sandbox has. Ids are handed out in turn
// through the range, not lowest first, so an id just released is the last
// to be given again (a process the kernel had not yet reaped when its
// sandbox went would otherwise share the next sandbox's uid).
func (a *Allocator) Allocate() (uint32, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if uint64(len(a.used)) >= uint64(a.r.Size) {
		return 0, fmt.Errorf("%w (%d ids, %s): destroy sandboxes or widen the range (bwrap.uid_range_size)", ErrExhausted, a.r.Size, a.r)
	}
	for {
		id := a.r.First + a.next
		a.next = (a.next + 1) % a.r.Size
		if !a.used[id] {
			a.used[id] = true
			return id, nil
		}
	}
}

// Reserve marks id in use (a sandbox found after a restart). It reports
// false, changing nothing, when id is outside the range or already in use.
func (a *Allocator) Reserve(id uint32) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.r.Contains(id) || a.used[id] {
		return false
	}
	a.used[id] = true
	return true
}

// Release returns id to the range; releasing an id not in use does nothing.
func (a *Allocator) Release(id uint32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.used, id)
}

// InUse is how many ids are in use.
func (a *Allocator) InUse() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.used)
}
