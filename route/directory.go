package route

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/node"
)

// liveStates are the states of a session that has a directory entry.
var liveStates = []node.State{node.StateCreating, node.StateRunning, node.StatePaused, node.StateTerminating}

// Tracked is a node.Node that keeps the fleet's directory of what it
// holds: each session and snapshot made through it gets its entry (this
// host, its tenant) before the call returns, and loses it when destroyed
// or deleted through it. What ends by itself (a timeout, the janitor, a
// crash) or was missed (no quorum at that moment) is put right by Sync.
// A directory write that fails is logged and never fails the call: the
// session is then reachable from this host only until Sync writes it.
type Tracked struct {
	node.Node
	self string
	dir  func() (*fleet.Directory, error)
	log  *slog.Logger
}

// NewTracked returns n keeping the directory dir returns (ErrUnavailable
// while there is none yet) for host self.
func NewTracked(n node.Node, self string, dir func() (*fleet.Directory, error), log *slog.Logger) *Tracked {
	if log == nil {
		log = slog.Default()
	}
	return &Tracked{Node: n, self: self, dir: dir, log: log}
}

// writeTimeout bounds one directory write.
const writeTimeout = 5 * time.Second

// put writes the entry of what this host just made: a session's whole,
// a snapshot's only when it has none yet (the snapshot's copy to the
// object store may have written it first, replicated).
func (t *Tracked) put(ctx context.Context, kind fleet.Kind, id, tenant string) {
	d, err := t.dir()
	if err == nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
		l := fleet.Location{Kind: kind, ID: id, Host: t.self, Tenant: tenant}
		if kind == fleet.KindSnapshot {
			_, err = d.Claim(ctx, l)
		} else {
			err = d.Put(ctx, l)
		}
		cancel()
	}
	if err != nil {
		t.log.Warn("fleet: directory entry not written; the next sync writes it", "kind", kind, "id", id, "err", err)
	}
}

// remove deletes the entry of what this host ended or deleted, while the
// entry names this host (a deleted copy of another host's snapshot leaves
// that host's entry).
func (t *Tracked) remove(ctx context.Context, kind fleet.Kind, id string) {
	d, err := t.dir()
	if err == nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
		err = d.DeleteOwned(ctx, kind, id, t.self)
		cancel()
	}
	if err != nil {
		t.log.Warn("fleet: directory entry not removed; the next sync removes it", "kind", kind, "id", id, "err", err)
	}
}

// Create implements node.Sessions, writing the session's entry.
func (t *Tracked) Create(ctx context.Context, spec node.CreateSpec, idempotencyKey string) (*node.Session, bool, error) {
	s, created, err := t.Node.Create(ctx, spec, idempotencyKey)
	if err == nil {
		t.put(ctx, fleet.KindSession, s.ID, s.Tenant)
	}
	return s, created, err
}

// Destroy implements node.Sessions, removing the session's entry. A
// destroy this host answers not-found removes it only when the session
// is unknown to forkbox's own context too: another tenant's caller is
// told not-found for a session that lives, whose entry stays.
func (t *Tracked) Destroy(ctx context.Context, id string) error {
	err := t.Node.Destroy(ctx, id)
	if err == nil || errors.Is(err, errdefs.ErrNotFound) && t.gone(id) {
		t.remove(ctx, fleet.KindSession, id)
	}
	return err
}

// gone reports whether this host holds no live session id, read with
// forkbox's own context (no caller: every tenant's sessions); a read
// that fails is taken for not gone (the next Sync settles it).
func (t *Tracked) gone(id string) bool {
	own, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	s, err := t.Node.Get(own, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return true
	}
	return err == nil && s.State == node.StateTerminated
}

// Snapshot implements node.Snapshots, writing the snapshot's entry.
func (t *Tracked) Snapshot(ctx context.Context, id string, opts node.SnapshotOptions) (*node.Snapshot, error) {
	sn, err := t.Node.Snapshot(ctx, id, opts)
	if err == nil {
		t.put(ctx, fleet.KindSnapshot, sn.ID, sn.Tenant)
	}
	return sn, err
}

// Fork implements node.Snapshots, writing each child's entry.
func (t *Tracked) Fork(ctx context.Context, ref string, count int, spec node.CreateSpec) ([]*node.Session, error) {
	ss, err := t.Node.Fork(ctx, ref, count, spec)
	for _, s := range ss {
		t.put(ctx, fleet.KindSession, s.ID, s.Tenant)
	}
	return ss, err
}

// ForkSession implements node.Snapshots, writing the snapshot's and each
// child's entry.
func (t *Tracked) ForkSession(ctx context.Context, id string, count int, spec node.CreateSpec, opts node.SnapshotOptions) (*node.Snapshot, []*node.Session, error) {
	sn, ss, err := t.Node.ForkSession(ctx, id, count, spec, opts)
	if sn != nil {
		t.put(ctx, fleet.KindSnapshot, sn.ID, sn.Tenant)
	}
	for _, s := range ss {
		t.put(ctx, fleet.KindSession, s.ID, s.Tenant)
	}
	return sn, ss, err
}

// DeleteSnapshot implements node.Snapshots, removing the snapshot's
// entry when it is this host's (dependents a forced delete took go at the
// next Sync).
func (t *Tracked) DeleteSnapshot(ctx context.Context, id string, force bool) error {
	err := t.Node.DeleteSnapshot(ctx, id, force)
	if err == nil {
		t.removeSnapshot(ctx, id)
	}
	return err
}

// DeleteSnapshotKeepDependents implements node.Snapshots, removing the
// snapshot's entry when it is this host's.
func (t *Tracked) DeleteSnapshotKeepDependents(ctx context.Context, id string) error {
	err := t.Node.DeleteSnapshotKeepDependents(ctx, id)
	if err == nil {
		t.removeSnapshot(ctx, id)
	}
	return err
}

// removeSnapshot removes snapshot id's entry unless it names another
// host: a copy imported here from another host's replica leaves that
// host's entry (and so the fleet's copy) alone.
func (t *Tracked) removeSnapshot(ctx context.Context, id string) {
	if l, ok := t.otherHosts(ctx, id); ok {
		t.log.Debug("fleet: an imported snapshot's entry stays its host's", "id", id, "host", l.Host)
		return
	}
	t.remove(ctx, fleet.KindSnapshot, id)
}

// otherHosts returns snapshot id's live entry when it names another host
// (the snapshot was imported here from that host's replica).
func (t *Tracked) otherHosts(ctx context.Context, id string) (fleet.Location, bool) {
	d, err := t.dir()
	if err != nil {
		return fleet.Location{}, false
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	l, err := d.Get(ctx, fleet.KindSnapshot, id)
	return l, err == nil && l.Host != t.self && l.State == ""
}

// DefaultSyncEvery is how often Run reconciles the directory.
const DefaultSyncEvery = 10 * time.Second

// Run calls Sync at once and then every interval until ctx ends; a
// failed sync is logged (once per run of failures) and retried every
// second (a cluster's directory opens once it has a quorum: what was
// made before is written then).
func (t *Tracked) Run(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = DefaultSyncEvery
	}
	tk := time.NewTicker(every)
	defer tk.Stop()
	var last error
	for {
		err := t.Sync(ctx)
		if err != nil && last == nil && ctx.Err() == nil {
			t.log.Warn("fleet: directory sync failed; retrying", "err", err)
		}
		last = err
		wait := tk.C
		if err != nil {
			wait = time.After(time.Second)
		}
		select {
		case <-ctx.Done():
			return
		case <-wait:
		}
	}
}

// Sync makes the directory's entries of this host match what it holds:
// an entry for every live session and every snapshot (written when the
// id has no entry at all: a snapshot imported from another host keeps
// that host's), none for what it no longer holds (removed). Entries the
// fleet marked terminated are left to the host-lost reconciliation. The
// directory is read before the host's own lists, so an entry written by
// a create that ends meanwhile is never taken for a stale one.
func (t *Tracked) Sync(ctx context.Context) error {
	d, err := t.dir()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	entries, err := d.List(ctx, "", func(l fleet.Location) bool { return l.Host == t.self })
	if err != nil {
		return err
	}
	// forkbox's own context (no caller) sees every tenant's.
	sessions, err := t.Node.List(ctx, node.SessionFilter{States: liveStates})
	if err != nil {
		return err
	}
	snaps, err := t.Node.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	have := map[fleet.Kind]map[string]string{fleet.KindSession: {}, fleet.KindSnapshot: {}}
	for _, s := range sessions {
		have[fleet.KindSession][s.ID] = s.Tenant
	}
	for _, sn := range snaps {
		have[fleet.KindSnapshot][sn.ID] = sn.Tenant
	}
	listed := map[fleet.Kind]map[string]bool{fleet.KindSession: {}, fleet.KindSnapshot: {}}
	for _, l := range entries {
		listed[l.Kind][l.ID] = true
		if _, ok := have[l.Kind][l.ID]; !ok && l.State == "" {
			if err := d.Delete(ctx, l.Kind, l.ID); err != nil {
				return err
			}
		}
	}
	for kind, ids := range have {
		for id, tenant := range ids {
			if !listed[kind][id] {
				// Claim: a snapshot imported from another host keeps
				// that host's entry (where it lives, and replicated).
				if _, err := d.Claim(ctx, fleet.Location{Kind: kind, ID: id, Host: t.self, Tenant: tenant}); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
