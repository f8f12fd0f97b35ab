package lifecycle

import (
	"context"
	"errors"
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

// mutate applies change to sandbox id under the manager's lock, then
// journals it. A request naming a sandbox counts as use for the idle
// clock. If the journal write fails the change is undone, so ErrJournal
// always means nothing changed.
func (m *Manager) mutate(c Caller, id string, change func(r *record) error) (Sandbox, error) {
	m.mu.Lock()
	r, err := m.lookup(c, id)
	if err != nil {
		m.mu.Unlock()
		return Sandbox{}, err
	}
	before := r.snapshot()
	if err := change(r); err != nil {
		r.Sandbox = before
		m.mu.Unlock()
		return Sandbox{}, err
	}
	r.LastUsed = m.cfg.Now()
	m.mu.Unlock()
	if err := m.persist(r); err != nil {
		m.mu.Lock()
		lastUsed := r.LastUsed
		r.Sandbox = before
		r.LastUsed = lastUsed
		m.mu.Unlock()
		return Sandbox{}, fmt.Errorf("%w: %v; nothing was changed", ErrJournal, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return r.snapshot(), nil
}

// Attach claims a sandbox for holder on behalf of owner. The check and the
// claim happen under one lock, so of two concurrent attaches with
// different holders exactly one wins (upstream's tag-based claim is
// read-then-write and can race). The same holder may attach again.
func (m *Manager) Attach(ctx context.Context, c Caller, id, owner, holder string) (Sandbox, error) {
	if owner == "" || !validText(owner, MaxOwnerLen) || holder == "" || !validText(holder, MaxHolderLen) {
		return Sandbox{}, fmt.Errorf("%w: owner (at most %d bytes) and holder (at most %d bytes) must be non-empty UTF-8", ErrInvalid, MaxOwnerLen, MaxHolderLen)
	}
	sb, err := m.mutate(c, id, func(r *record) error { return claim(r, owner, holder) })
	if err != nil {
		return Sandbox{}, err
	}
	return m.resumeAttached(ctx, c, id, sb)
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

// errUnchanged stops a mutation that has nothing to do.
var errUnchanged = errors.New("unchanged")

// Release clears holder's hold. It is idempotent and never destroys:
// releasing a sandbox that is gone, unheld, or held by someone else
// changes nothing and reports false.
func (m *Manager) Release(ctx context.Context, c Caller, id, holder string) (bool, error) {
	_, err := m.mutate(c, id, func(r *record) error {
		if holder == "" || r.Holder != holder {
			return errUnchanged
		}
		r.Holder = ""
		return nil
	})
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ErrJournal), errors.Is(err, ErrShuttingDown):
		return false, err
	}
	return false, nil // gone, not ours, or not held by holder
}

// Renew moves an expiring sandbox's expiry to now+ttl, capped at its
// creation plus MaxLifetime.
func (m *Manager) Renew(ctx context.Context, c Caller, id string, ttl time.Duration) (Sandbox, error) {
	if ttl <= 0 {
		return Sandbox{}, fmt.Errorf("%w: ttl must be positive", ErrInvalid)
	}
	return m.mutate(c, id, func(r *record) error { return m.setExpiry(r, m.cfg.Now().Add(ttl)) })
}

// setExpiry applies a new expiry within the hard cap.
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

// TagMap returns the airflow_* tags (derived from the record) and any
// others written before.
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
	r.LastUsed = m.cfg.Now()
	return r.snapshot().TagMap(), nil
}

// WriteTags applies tags atomically: every tag is checked before any is
// applied. airflow_workdir and airflow_network are read-only;
// airflow_owner may only be set on a sandbox without one (which then
// expires like any owned sandbox, within the owner quota); airflow_holder
// follows the attach rules ("" releases by force); airflow_expires_at
// renews; other tags are stored, at most MaxTags of them in all, and
// writing "" removes one.
func (m *Manager) WriteTags(ctx context.Context, c Caller, id string, tags map[string]string) (map[string]string, error) {
	if err := checkMap("tags", tags, MaxTags, MaxTagKey, MaxTagVal); err != nil {
		return nil, err
	}
	sb, err := m.mutate(c, id, func(r *record) error { return m.applyTags(r, tags) })
	if err != nil {
		return nil, err
	}
	return sb.TagMap(), nil
}

// applyTags applies tags to r in a fixed order (owner before holder, so a
// single write can set both); m.mu must be held. On error r may be half
// changed: mutate restores it.
func (m *Manager) applyTags(r *record, tags map[string]string) error {
	keys := make([]string, 0, len(tags))
	for k := range tags {
		keys = append(keys, k)
	}
	order := map[string]int{TagOwner: 0, TagHolder: 1, TagExpiresAt: 2}
	rank := func(k string) int {
		if o, ok := order[k]; ok {
			return o
		}
		return len(order)
	}
	sort.Slice(keys, func(i, j int) bool {
		if rank(keys[i]) != rank(keys[j]) {
			return rank(keys[i]) < rank(keys[j])
		}
		return keys[i] < keys[j]
	})
	r.Tags = cloneMap(r.Tags)
	if r.Tags == nil {
		r.Tags = map[string]string{}
	}
	for _, k := range keys {
		v := tags[k]
		switch k {
		case TagWorkdir, TagNetwork:
			current := r.Workdir
			if k == TagNetwork {
				current = r.NetSpec
			}
			if v != current {
				return fmt.Errorf("%w: tag %s is read-only: it records how the sandbox was made", ErrInvalid, k)
			}
		case TagOwner:
			if err := m.setOwner(r, v); err != nil {
				return err
			}
		case TagHolder:
			switch {
			case v == "":
				r.Holder = ""
			case !validText(v, MaxHolderLen):
				return fmt.Errorf("%w: holder must be UTF-8 of at most %d bytes", ErrInvalid, MaxHolderLen)
			default:
				if err := claim(r, r.Owner, v); err != nil {
					return err
				}
			}
		case TagExpiresAt:
			secs, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return fmt.Errorf("%w: %s must be unix seconds, got %q", ErrInvalid, k, v)
			}
			if err := m.setExpiry(r, time.Unix(secs, 0)); err != nil {
				return err
			}
		default:
			if v == "" {
				delete(r.Tags, k) // "" removes a tag
			} else {
				r.Tags[k] = v
			}
		}
	}
	if len(r.Tags) > MaxTags {
		return fmt.Errorf("%w: a sandbox holds at most %d tags besides the airflow_* ones; this write would leave %d", ErrInvalid, MaxTags, len(r.Tags))
	}
	return nil
}

// setOwner gives an unowned sandbox an owner, within the owner quota; a
// connection-bound sandbox then becomes expiring. m.mu must be held.
func (m *Manager) setOwner(r *record, owner string) error {
	switch {
	case owner == r.Owner:
		return nil
	case r.Owner != "":
		return &OwnerMismatchError{Sandbox: r.ID, Owner: r.Owner, Want: owner}
	case !validText(owner, MaxOwnerLen):
		return fmt.Errorf("%w: owner must be UTF-8 of at most %d bytes", ErrInvalid, MaxOwnerLen)
	}
	n := 0
	for _, o := range m.boxes {
		if o.UID == r.UID && o.Owner == owner && o.countsForItsUID() { // owners are scoped inside a uid
			n++
		}
	}
	if n >= m.cfg.MaxPerOwner {
		return &QuotaError{Scope: "owner", Limit: m.cfg.MaxPerOwner}
	}
	r.Owner = owner
	if r.ConnBound {
		r.ConnBound = false
		r.disconnectedAt = time.Time{}
		r.ExpiresAt = minTime(m.cfg.Now().Add(m.cfg.DefaultTTL), r.CreatedAt.Add(m.cfg.MaxLifetime))
	}
	return nil
}

// DestroyRun destroys every sandbox of owner that c may destroy and
// returns their ids.
func (m *Manager) DestroyRun(ctx context.Context, c Caller, owner string) ([]string, error) {
	if owner == "" {
		return nil, fmt.Errorf("%w: owner is required", ErrInvalid)
	}
	m.mu.Lock()
	if m.closing {
		m.mu.Unlock()
		return nil, ErrShuttingDown
	}
	var victims []*record
	for _, r := range m.boxes {
		if r.Owner == owner && (r.State == StateReady || r.State == StateQuarantined) && (c.Admin || r.UID == c.UID) && m.claimForDestroy(r) {
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
