package snapshot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/tenancy"
)

// DeleteSnapshot deletes snapshot id. While child snapshots or live
// sessions depend on it, it is ErrConflict naming them, unless force: then
// the dependent sessions are destroyed and the child snapshots deleted
// (recursively, with force) first. Deleting a missing snapshot (or
// another tenant's) is ErrNotFound. A memory checkpoint being sealed is
// waited for first.
func (s *Service) DeleteSnapshot(ctx context.Context, id string, force bool) error {
	if err := s.awaitSeal(ctx, id); err != nil && ctx.Err() != nil {
		return err
	}
	_, children, sessions, err := s.ownedDependents(ctx, id)
	if err != nil {
		return err
	}
	if len(children)+len(sessions) > 0 && !force {
		return errdefs.Newf(errdefs.ErrConflict, "snapshot %s is used by %s; delete those first or force",
			id, dependents(children, sessions))
	}
	for _, sid := range sessions {
		if err := s.core.Destroy(ctx, sid); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("destroy session %s that uses snapshot %s: %w", sid, id, err)
		}
	}
	for _, child := range children {
		if err := s.DeleteSnapshot(ctx, child, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
	}
	if err := s.storage.RemoveSnapshot(ctx, id); err != nil {
		return err
	}
	if s.volumes != nil {
		// The volumes it captured (copies made from them keep theirs).
		if err := s.volumes.DropSessionSnapshot(ctx, id); err != nil {
			return err
		}
	}
	s.dropImage(id)
	if err := s.removeMemory(id); err != nil {
		return err
	}
	if err := s.store.DeleteSnapshot(ctx, id); err != nil {
		return err
	}
	s.forgetReplica(id)
	return nil
}

func dependents(children, sessions []string) string {
	var parts []string
	if len(children) > 0 {
		parts = append(parts, "snapshots "+strings.Join(children, ", "))
	}
	if len(sessions) > 0 {
		parts = append(parts, "sessions "+strings.Join(sessions, ", "))
	}
	return strings.Join(parts, " and ")
}

// CollectExpired deletes expired snapshots nothing depends on; the ones
// still used wait for a later round. Each deletion is audited
// (snapshot.expire).
func (s *Service) CollectExpired(ctx context.Context) {
	snaps, err := s.store.ListSnapshots(ctx)
	if err != nil {
		s.log.Warn("list snapshots for collection", "err", err)
		return
	}
	now := time.Now()
	for _, sn := range snaps {
		if sn.ExpiresAt.IsZero() || now.Before(sn.ExpiresAt) {
			continue
		}
		err := s.DeleteSnapshot(ctx, sn.ID, false)
		switch {
		case err == nil:
			s.log.Info("expired snapshot deleted", "snapshot", sn.ID, "tenant", sn.Tenant)
			s.audit.Record(ctx, audit.Event{Tenant: sn.Tenant, Session: sn.SessionID, Kind: "snapshot.expire",
				Detail: map[string]any{"snapshot": sn.ID}})
		case errors.Is(err, errdefs.ErrConflict):
			s.log.Debug("expired snapshot still used", "snapshot", sn.ID, "err", err)
		default:
			s.log.Warn("delete expired snapshot", "snapshot", sn.ID, "err", err)
		}
	}
}

// Reconcile runs once at start-up, after the core has reconciled the
// sessions: it removes stored snapshot files and sealed checkpoints the
// database does not know (left by crashes between the two), then reclaims
// the snapshots of forks a previous daemon did not finish (reclaimForks).
// Before all that it finishes or undoes the merges a previous daemon left
// journaled (recoverMerges).
func (s *Service) Reconcile(ctx context.Context) {
	s.recoverMerges(ctx)
	snaps, err := s.storage.Snapshots(ctx)
	if err != nil {
		s.log.Warn("list snapshots", "err", err)
	}
	for _, id := range snaps {
		if s.volumes != nil && s.volumes.OwnsSnapshot(ctx, id) {
			continue // a volume snapshot that exists
		}
		if _, err := s.store.GetSnapshot(ctx, id); errors.Is(err, errdefs.ErrNotFound) {
			if err := s.storage.RemoveSnapshot(ctx, id); err != nil {
				s.log.Warn("remove orphaned snapshot", "id", id, "err", err)
			}
		}
	}
	// Files exports a daemon that stopped left half-made, and the marks
	// of imports whose snapshot is gone.
	if err := os.RemoveAll(s.layout.FleetExports()); err != nil {
		s.log.Warn("remove unfinished exports", "err", err)
	}
	marks, _ := os.ReadDir(s.layout.FleetImports())
	for _, e := range marks {
		id := strings.TrimSuffix(e.Name(), ".json")
		if _, err := s.store.GetSnapshot(ctx, id); errors.Is(err, errdefs.ErrNotFound) {
			os.Remove(filepath.Join(s.layout.FleetImports(), e.Name()))
		}
	}
	// Sealed checkpoints whose snapshot was never recorded (a daemon that
	// died while sealing) or is gone.
	mems, _ := os.ReadDir(s.layout.MemorySnapshots())
	for _, e := range mems {
		if _, err := s.store.GetSnapshot(ctx, e.Name()); errors.Is(err, errdefs.ErrNotFound) {
			if err := os.RemoveAll(s.memoryDir(e.Name())); err != nil {
				s.log.Warn("remove orphaned memory checkpoint", "id", e.Name(), "err", err)
			}
		}
	}
	s.dropUnsealed(ctx)
	if s.volumes != nil {
		s.volumes.ReconcileSessionSnapshots(ctx, func(snapID string) bool {
			_, err := s.store.GetSnapshot(ctx, snapID)
			return !errors.Is(err, errdefs.ErrNotFound)
		}, s.log)
	}
	s.reclaimForks(ctx)
	s.resumeCopies(ctx)
}

// dropUnsealed deletes, at start-up, the memory snapshots a previous
// daemon answered but did not finish sealing (sealing.go): their
// plaintext went with the scratch directory, so they can never be
// restored. Nothing can depend on them (a restore waits for the seal).
func (s *Service) dropUnsealed(ctx context.Context) {
	snaps, err := s.store.ListSnapshots(ctx)
	if err != nil {
		s.log.Warn("list snapshots", "err", err)
		return
	}
	for _, sn := range snaps {
		if !sn.Sealing() {
			continue
		}
		s.log.Warn("memory snapshot never sealed (the daemon stopped first): deleted", "snapshot", sn.ID, "session", sn.SessionID)
		if err := s.DeleteSnapshot(ctx, sn.ID, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			s.log.Warn("delete an unsealed memory snapshot", "snapshot", sn.ID, "err", err)
		}
	}
}

// reclaimForks deals, at start-up, with the snapshots of forks a previous
// daemon did not finish (it stopped between the snapshot and the fork's
// answer, so their caller never learned their ids and nothing would ever
// delete them; they counted against the tenant's max_snapshots). One that
// nothing uses is deleted; one whose forked sessions still run (adopted)
// or that has child snapshots is made to expire now, so that
// CollectExpired deletes it once they are gone.
func (s *Service) reclaimForks(ctx context.Context) {
	snaps, err := s.store.ListSnapshots(ctx)
	if err != nil {
		s.log.Warn("list snapshots to reclaim interrupted forks", "err", err)
		return
	}
	for _, sn := range snaps {
		if !sn.Provisional {
			continue
		}
		err := s.DeleteSnapshot(ctx, sn.ID, false)
		switch {
		case err == nil:
			s.log.Info("deleted the snapshot of a fork the daemon did not finish", "snapshot", sn.ID, "tenant", sn.Tenant)
			s.audit.Record(ctx, audit.Event{Tenant: sn.Tenant, Session: sn.SessionID, Kind: "snapshot.expire",
				Detail: map[string]any{"snapshot": sn.ID, "reason": "interrupted fork"}})
		case errors.Is(err, errdefs.ErrConflict):
			if err := s.store.ExpireSnapshot(ctx, sn.ID, time.Now()); err != nil {
				s.log.Warn("expire the snapshot of an interrupted fork", "snapshot", sn.ID, "err", err)
			} else {
				s.log.Info("the snapshot of a fork the daemon did not finish expires once unused", "snapshot", sn.ID)
			}
		default:
			s.log.Warn("delete the snapshot of an interrupted fork", "snapshot", sn.ID, "err", err)
		}
	}
}

// ownedDependents returns snapshot id's record and the ids of the child
// snapshots and live sessions that depend on it; ErrNotFound for a
// missing snapshot or another tenant's.
func (s *Service) ownedDependents(ctx context.Context, id string) (sn *node.Snapshot, children, sessions []string, err error) {
	sn, err = s.store.GetSnapshot(ctx, id)
	if err != nil {
		return nil, nil, nil, err
	}
	if !tenancy.Owns(ctx, sn.Tenant) {
		return nil, nil, nil, errdefs.Newf(errdefs.ErrNotFound, "snapshot %q", id)
	}
	children, sessions, err = s.store.SnapshotDependents(ctx, id)
	if err != nil {
		return nil, nil, nil, err
	}
	return sn, children, sessions, nil
}
