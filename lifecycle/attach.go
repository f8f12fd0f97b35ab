package lifecycle

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"
)

// Tag names shared with Airflow's AttachableSandboxBackend.
const (
	TagOwner     = "airflow_owner"
	TagHolder    = "airflow_holder"
	TagExpiresAt = "airflow_expires_at"
	TagNetwork   = "airflow_network"
	TagWorkdir   = "airflow_workdir"
)

// Attach claims a sandbox for holder on behalf of owner. The check and the
// claim happen under one lock, so of two concurrent attaches with
// different holders exactly one wins (upstream's tag-based claim is
// read-then-write and can race). The same holder may attach again.
func (m *Manager) Attach(ctx context.Context, c Caller, id, owner, holder string) (Sandbox, error) {
	if owner == "" || !validText(owner, MaxOwnerLen) || holder == "" || !validText(holder, MaxHolderLen) {
		return Sandbox{}, fmt.Errorf("%w: owner and holder must be non-empty UTF-8 of at most %d bytes", ErrInvalid, MaxOwnerLen)
	}
	m.mu.Lock()
	r, err := m.lookup(c, id)
	if err == nil {
		err = claim(r, owner, holder)
	}
	m.mu.Unlock()
	if err != nil {
		return Sandbox{}, err
	}
	if err := m.persist(r); err != nil {
		return Sandbox{}, fmt.Errorf("%w: %v", ErrJournal, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return r.snapshot(), nil
}

// claim applies the attach rules to r; m.mu must be held.
func claim(r *record, owner, holder string) error {
	switch {
	case r.Owner != owner:
		return &OwnerMismatchError{Sandbox: r.ID, Owner: r.Owner, Want: owner}
	case r.Holder != "" && r.Holder != holder:
		return &HeldByOtherError{Sandbox: r.ID, Holder: r.Holder}
	}
	r.Holder = holder
	return nil
}

// Release clears holder's hold. It is idempotent and never destroys:
// releasing a sandbox that is gone, unheld, or held by someone else
// changes nothing and reports false.
func (m *Manager) Release(ctx context.Context, c Caller, id, holder string) (bool, error) {
	m.mu.Lock()
	r, err := m.lookup(c, id)
	if err != nil || holder == "" || r.Holder != holder {
		m.mu.Unlock()
		return false, nil
	}
	r.Holder = ""
	m.mu.Unlock()
	if err := m.persist(r); err != nil {
		return false, fmt.Errorf("%w: %v", ErrJournal, err)
	}
	return true, nil
}

// Renew moves an expiring sandbox's expiry to now+ttl, capped at its
// creation plus MaxLifetime.
func (m *Manager) Renew(ctx context.Context, c Caller, id string, ttl time.Duration) (Sandbox, error) {
	if ttl <= 0 {
		return Sandbox{}, fmt.Errorf("%w: ttl must be positive", ErrInvalid)
	}
	m.mu.Lock()
	r, err := m.lookup(c, id)
	if err == nil {
		err = m.setExpiry(r, m.cfg.Now().Add(ttl))
	}
	m.mu.Unlock()
	if err != nil {
		return Sandbox{}, err
	}
	if err := m.persist(r); err != nil {
		return Sandbox{}, fmt.Errorf("%w: %v", ErrJournal, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return r.snapshot(), nil
}

// setExpiry applies a new expiry within the hard cap; m.mu must be held.
func (m *Manager) setExpiry(r *record, at time.Time) error {
	if r.ConnBound {
		return fmt.Errorf("%w: sandbox %s is connection-bound and lives as long as its connection; create it with an owner or ttl_s to give it an expiry", ErrInvalid, r.ID)
	}
	r.ExpiresAt = minTime(at, r.CreatedAt.Add(m.cfg.MaxLifetime))
	return nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Tags returns the airflow_* tags (derived from the record) and any others
// written before.
func (s Sandbox) TagMap() map[string]string {
	t := cloneMap(s.Tags)
	if t == nil {
		t = map[string]string{}
	}
	t[TagOwner] = s.Owner
	t[TagHolder] = s.Holder
	t[TagExpiresAt] = strconv.FormatInt(s.ExpiresAt.Unix(), 10)
	t[TagNetwork] = s.NetSpec
	t[TagWorkdir] = s.Workdir
	return t
}

// ReadTags returns a sandbox's tags.
func (m *Manager) ReadTags(ctx context.Context, c Caller, id string) (map[string]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.lookup(c, id)
	if err != nil {
		return nil, err
	}
	return r.snapshot().TagMap(), nil
}

// WriteTags applies tags atomically: every tag is checked before any is
// applied. airflow_workdir and airflow_network are read-only;
// airflow_owner may only be set on a sandbox without one (which then
// expires like any owned sandbox); airflow_holder follows the attach rules
// ("" releases by force); airflow_expires_at renews; other tags are stored.
func (m *Manager) WriteTags(ctx context.Context, c Caller, id string, tags map[string]string) (map[string]string, error) {
	if err := checkMap("tags", tags, MaxTags, MaxTagKey, MaxTagVal); err != nil {
		return nil, err
	}
	m.mu.Lock()
	r, err := m.lookup(c, id)
	if err != nil {
		m.mu.Unlock()
		return nil, err
	}
	next := r.Sandbox // a copy to validate against; applied only if all pass
	next.Tags = cloneMap(r.Tags)
	if next.Tags == nil {
		next.Tags = map[string]string{}
	}
	err = m.applyTags(&next, tags)
	if err == nil {
		r.Sandbox = next
	}
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := m.persist(r); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrJournal, err)
	}
	return m.ReadTags(ctx, c, id)
}

// applyTags applies tags to s in a fixed order (owner before holder, so a
// single write can set both); m.mu must be held.
func (m *Manager) applyTags(s *Sandbox, tags map[string]string) error {
	keys := make([]string, 0, len(tags))
	for k := range tags {
		keys = append(keys, k)
	}
	order := map[string]int{TagOwner: 0, TagHolder: 1, TagExpiresAt: 2}
	sort.Slice(keys, func(i, j int) bool {
		oi, ok := order[keys[i]]
		if !ok {
			oi = 3
		}
		oj, ok := order[keys[j]]
		if !ok {
			oj = 3
		}
		if oi != oj {
			return oi < oj
		}
		return keys[i] < keys[j]
	})
	tmp := &record{Sandbox: *s}
	for _, k := range keys {
		v := tags[k]
		switch k {
		case TagWorkdir, TagNetwork:
			if v != (map[string]string{TagWorkdir: s.Workdir, TagNetwork: s.NetSpec})[k] {
				return fmt.Errorf("%w: tag %s is read-only: it records how the sandbox was made", ErrInvalid, k)
			}
		case TagOwner:
			switch {
			case v == tmp.Owner:
			case tmp.Owner != "":
				return &OwnerMismatchError{Sandbox: tmp.ID, Owner: tmp.Owner, Want: v}
			case !validText(v, MaxOwnerLen):
				return fmt.Errorf("%w: owner must be UTF-8 of at most %d bytes", ErrInvalid, MaxOwnerLen)
			default:
				tmp.Owner = v
				if tmp.ConnBound {
					tmp.ConnBound = false
					tmp.ExpiresAt = minTime(m.cfg.Now().Add(m.cfg.DefaultTTL), tmp.CreatedAt.Add(m.cfg.MaxLifetime))
				}
			}
		case TagHolder:
			if v == "" {
				tmp.Holder = ""
			} else if err := claim(tmp, tmp.Owner, v); err != nil {
				return err
			}
		case TagExpiresAt:
			secs, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return fmt.Errorf("%w: %s must be unix seconds, got %q", ErrInvalid, k, v)
			}
			if err := m.setExpiry(tmp, time.Unix(secs, 0)); err != nil {
				return err
			}
		default:
			tmp.Tags[k] = v
		}
	}
	*s = tmp.Sandbox
	return nil
}

// DestroyRun destroys every sandbox of owner that c may destroy and
// returns their ids.
func (m *Manager) DestroyRun(ctx context.Context, c Caller, owner string) ([]string, error) {
	if owner == "" {
		return nil, fmt.Errorf("%w: owner is required", ErrInvalid)
	}
	m.mu.Lock()
	var victims []*record
	for _, r := range m.boxes {
		if r.Owner == owner && r.State == StateReady && (c.Admin || r.UID == c.UID) {
			r.State = StateDestroying
			victims = append(victims, r)
		}
	}
	m.mu.Unlock()
	ids := make([]string, 0, len(victims))
	var firstErr error
	for _, r := range victims {
		log := m.log.With("sandbox", r.ID, "peer_uid", c.UID, "peer_pid", c.PID, "owner", owner, "holder", r.Holder)
		if err := m.destroyNow(r, "destroy_run", log); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		ids = append(ids, r.ID)
	}
	sort.Strings(ids)
	return ids, firstErr
}
