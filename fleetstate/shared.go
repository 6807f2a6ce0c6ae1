// Package fleetstate shares a host's tenants, API keys, quota counts and
// audit records with the rest of its fleet, on the fleet's JetStream
// (package fleet): the local SQLite store stays what every request
// reads, so access checks and admission work as on one host, and this
// package keeps it in step with the other hosts'.
//
//   - Shared (shared.go): tenants (with their policies and abuse flags) and
//     API keys (hashes only) in the KV bucket forkbox-tenants; every host
//     publishes its changes and applies the others'.
//   - Quotas (quota.go): per-tenant counts of each host in the KV bucket
//     forkbox-quotas, changed by compare-and-set, so a tenant's limits
//     hold across the fleet also under parallel creates.
//   - Audit (audit.go): every host's audit records copied to the stream
//     forkbox-audit, read back by GET /v1/audit on any host.
//
// A host alone uses none of it (the daemon wires it in cluster mode only).
package fleetstate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/store"
)

// SharedBucket is the KV bucket of the fleet's tenants and API keys:
// keys "tenant.NAME" and "key.ID", values a sharedEntry (JSON).
const SharedBucket = "forkbox-tenants"

// sharedEntry is one value of SharedBucket: a tenant's or a key's record
// and the host that wrote it.
type sharedEntry struct {
	Host   string              `json:"host"`
	Tenant *store.SharedTenant `json:"tenant,omitempty"`
	Key    *store.SharedKey    `json:"key,omitempty"`
}

// kvName is what a tenant name or key id must be to be a KV key part.
var kvName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

func entryKey(e sharedEntry) string {
	if e.Tenant != nil {
		return store.ChangeTenant + "." + e.Tenant.Name
	}
	return store.ChangeKey + "." + e.Key.ID
}

// Shared keeps a store's tenants and API keys in step with the fleet's
// (SharedBucket). Local changes (store.OnChange → Changed) are queued and
// published by Run, each by compare-and-set over what the bucket holds;
// Run applies the bucket's entries to the store (store.ApplyTenant,
// store.ApplyAPIKey): every other host's, and this host's own keys and
// deletions (a store restored from a backup gets them back). The merge rule: the bucket's order decides (the
// last write wins) for a tenant's policy and flag, except that a
// deletion or a revocation, once written, always wins. Safe for
// concurrent use.
type Shared struct {
	kv   jetstream.KeyValue
	st   *store.Store
	host string
	log  *slog.Logger

	mu sync.Mutex
	// pending holds local changes not yet published, by bucket key.
	pending map[string]sharedEntry
	wake    chan struct{}
	// onDeleted is told of a tenant another host deleted (OnDeleted).
	onDeleted func(tenant string)
	// failing: a publish failed and was logged (Run's goroutine only).
	failing bool
}

// OnDeleted sets the function told, on a goroutine of its own, of each
// tenant that another host's deletion deleted in this store (for the
// daemon to end the tenant's sessions here, as the deleting host ends
// its own). Set it before Run.
func (s *Shared) OnDeleted(fn func(tenant string)) { s.onDeleted = fn }

// OpenShared opens (creating when missing) SharedBucket on f for st,
// waiting up to ctx for a cluster without a quorum yet. Nothing is
// published or applied until Run.
func OpenShared(ctx context.Context, f *fleet.Fleet, st *store.Store, log *slog.Logger) (*Shared, error) {
	kv, err := f.KeyValue(ctx, SharedBucket, "forkbox tenants and API keys (key hashes only)", 1)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	return &Shared{kv: kv, st: st, host: f.NodeID(), log: log, pending: map[string]sharedEntry{},
		wake: make(chan struct{}, 1)}, nil
}

// Changed queues the record c names, as the store holds it now, for
// publishing (it is store.OnChange's function). It reads the record at
// once, so a later change of another host applied meanwhile does not
// replace the one made here. A record that cannot be read is logged.
func (s *Shared) Changed(c store.Change) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e := sharedEntry{Host: s.host}
	switch c.Kind {
	case store.ChangeTenant:
		t, err := s.st.SharedTenant(ctx, c.Name)
		if err != nil {
			s.log.Warn("fleet: tenant change not shared", "tenant", c.Name, "err", err)
			return
		}
		e.Tenant = &t
	case store.ChangeKey:
		k, err := s.st.SharedKey(ctx, c.Name)
		if err != nil {
			s.log.Warn("fleet: api key change not shared", "key", c.Name, "err", err)
			return
		}
		e.Key = &k
	default:
		return
	}
	s.queue(e)
}

func (s *Shared) queue(e sharedEntry) {
	s.mu.Lock()
	s.pending[entryKey(e)] = e
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run applies the bucket's entries to the store and publishes queued
// changes until ctx ends. It starts with a catch-up: every entry the
// bucket holds is applied, then every local record the bucket lacks (a
// tenant or key made while this host was alone or cut off) and every
// local deletion or revocation it does not have yet is published. A
// publish that fails (no quorum) is retried every second; the watch is
// reopened when it ends.
func (s *Shared) Run(ctx context.Context) {
	for ctx.Err() == nil {
		if err := s.watch(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("fleet: tenants and keys watch ended; reopening", "err", err)
			sleep(ctx, time.Second)
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// watch is one pass of Run: it watches the bucket, catches up, then
// applies and publishes until ctx ends or the watch fails.
func (s *Shared) watch(ctx context.Context) error {
	w, err := s.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer w.Stop()
	seen := map[string]sharedEntry{}
	caughtUp := false
	retry := time.NewTicker(time.Second)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case kve, ok := <-w.Updates():
			if !ok {
				return errors.New("watch closed")
			}
			if kve == nil { // the initial values are all in
				caughtUp = true
				s.catchUp(ctx, seen)
				seen = nil
				s.publish(ctx)
				continue
			}
			var e sharedEntry
			// An entry must be the record its key names (catchUp reads a
			// "tenant." key's entry as a tenant's).
			if err := json.Unmarshal(kve.Value(), &e); err != nil || (e.Tenant == nil) == (e.Key == nil) || entryKey(e) != kve.Key() {
				s.log.Warn("fleet: unreadable tenants entry skipped", "key", kve.Key())
				continue
			}
			if !caughtUp {
				seen[kve.Key()] = e
			}
			s.apply(ctx, e)
		case <-s.wake:
			if caughtUp {
				s.publish(ctx)
			}
		case <-retry.C:
			if caughtUp {
				s.publish(ctx)
			}
		}
	}
}

// apply writes e, a bucket entry, to the store, unless a local change
// of the same record waits to be published (it is newer). This host's
// own entries are applied too when they are keys or a tenant's deletion
// (applying those again changes nothing, and a store restored from
// before a revocation or deletion it published gets it back); its own
// tenant policies and flags are not (the store has them or a newer one).
func (s *Shared) apply(ctx context.Context, e sharedEntry) {
	if e.Host == s.host && e.Tenant != nil && !final(e) {
		return
	}
	s.mu.Lock()
	_, mine := s.pending[entryKey(e)]
	s.mu.Unlock()
	if mine {
		return
	}
	s.applyStore(ctx, e)
}

// applyStore writes e to the store, logging a failure.
func (s *Shared) applyStore(ctx context.Context, e sharedEntry) {
	var err error
	if e.Tenant != nil {
		var deleted bool
		deleted, err = s.st.ApplyTenant(ctx, *e.Tenant)
		if deleted && s.onDeleted != nil {
			go s.onDeleted(e.Tenant.Name)
		}
	} else {
		err = s.st.ApplyAPIKey(ctx, *e.Key)
	}
	if err != nil {
		s.log.Warn("fleet: shared record not applied", "key", entryKey(e), "from", e.Host, "err", err)
	}
}

// catchUp queues every local record that the bucket's entries (seen)
// lack, or whose deletion or revocation they lack.
func (s *Shared) catchUp(ctx context.Context, seen map[string]sharedEntry) {
	ts, err := s.st.SharedTenants(ctx)
	if err != nil {
		s.log.Warn("fleet: tenants not caught up", "err", err)
	}
	for _, t := range ts {
		e, ok := seen[store.ChangeTenant+"."+t.Name]
		if !ok || !t.DeletedAt.IsZero() && e.Tenant.DeletedAt.IsZero() {
			s.queue(sharedEntry{Host: s.host, Tenant: &t})
		}
	}
	ks, err := s.st.SharedKeys(ctx)
	if err != nil {
		s.log.Warn("fleet: api keys not caught up", "err", err)
	}
	for _, k := range ks {
		e, ok := seen[store.ChangeKey+"."+k.ID]
		if !ok || !k.RevokedAt.IsZero() && e.Key.RevokedAt.IsZero() {
			s.queue(sharedEntry{Host: s.host, Key: &k})
		}
	}
}

// publish writes every queued change; those that fail stay queued.
func (s *Shared) publish(ctx context.Context) {
	s.mu.Lock()
	batch := make([]sharedEntry, 0, len(s.pending))
	for _, e := range s.pending {
		batch = append(batch, e)
	}
	s.mu.Unlock()
	// Tenants before keys: a host applies a key of a tenant it has.
	slices.SortFunc(batch, func(x, y sharedEntry) int {
		if (x.Tenant != nil) != (y.Tenant != nil) {
			if x.Tenant != nil {
				return -1
			}
			return 1
		}
		return strings.Compare(entryKey(x), entryKey(y))
	})
	for _, e := range batch {
		key := entryKey(e)
		err := s.put(ctx, key, e)
		if errors.Is(err, errdefs.ErrInvalidArgument) {
			s.log.Warn("fleet: record cannot be shared", "key", key, "err", err)
		} else if err != nil {
			if ctx.Err() == nil && !s.failing {
				s.log.Warn("fleet: shared record not published yet; retrying every second", "key", key, "err", err)
				s.failing = true
			}
			continue
		} else if s.failing {
			s.log.Info("fleet: shared records published again")
			s.failing = false
		}
		s.mu.Lock()
		if cur, ok := s.pending[key]; ok && sameEntry(cur, e) {
			delete(s.pending, key)
		}
		s.mu.Unlock()
	}
}

func sameEntry(a, b sharedEntry) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// put writes e under key by compare-and-set. A deletion or revocation the
// bucket holds already is never overwritten by a live record: the
// bucket's version is applied here instead.
func (s *Shared) put(ctx context.Context, key string, e sharedEntry) error {
	name := strings.TrimPrefix(strings.TrimPrefix(key, store.ChangeTenant+"."), store.ChangeKey+".")
	if !kvName.MatchString(name) {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "%q cannot be a fleet key", name)
	}
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	for range 10 {
		cur, err := s.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			if _, err = s.kv.Create(ctx, key, b); err == nil || !errors.Is(err, jetstream.ErrKeyExists) {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		var old sharedEntry
		if json.Unmarshal(cur.Value(), &old) == nil && (old.Tenant == nil) == (e.Tenant == nil) && (old.Tenant != nil || old.Key != nil) {
			if final(old) && !final(e) {
				s.applyStore(ctx, old)
				return nil
			}
		}
		if _, err = s.kv.Update(ctx, key, b, cur.Revision()); err == nil {
			return nil
		}
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
			return err
		}
	}
	return fmt.Errorf("%w: %s changed too often to be written", errdefs.ErrConflict, key)
}

// final reports whether e is a record no later version may undo: a
// deleted tenant or a revoked key.
func final(e sharedEntry) bool {
	if e.Tenant != nil {
		return !e.Tenant.DeletedAt.IsZero()
	}
	return !e.Key.RevokedAt.IsZero()
}
