package snapshot

import (
	"context"

	"github.com/forkbox/forkbox/storage"
)

// DeleteSnapshotKeepDependents deletes snapshot id as E2B deletes one
// (Sandbox.deleteSnapshot): the sessions made from it and the snapshots
// of those keep running and keep their files, which are their own where
// the storage driver's layers do not need the snapshot they came from
// (storage.IndependentLayers: btrfs). Where they do (overlay), and while
// live sessions run from its memory checkpoint (their restore may still
// read it), it is DeleteSnapshot without force: ErrConflict naming what
// depends on it. Their records keep naming it as their origin (and
// parent). The volume snapshots it captured go with it (the sessions'
// volume copies keep their data). ErrNotFound for a missing snapshot or
// another tenant's.
func (s *Service) DeleteSnapshotKeepDependents(ctx context.Context, id string) error {
	sn, children, sessions, err := s.ownedDependents(ctx, id)
	if err != nil {
		return err
	}
	il, ok := s.storage.(storage.IndependentLayers)
	independent := ok && il.LayersIndependent()
	if len(children)+len(sessions) == 0 || !independent || (sn.MemoryDriver != "" && len(sessions) > 0) {
		return s.DeleteSnapshot(ctx, id, false)
	}
	if err := s.storage.RemoveSnapshot(ctx, id); err != nil {
		return err
	}
	if s.volumes != nil {
		// The volumes it captured, as DeleteSnapshot drops them (the
		// sessions' copies keep their data).
		if err := s.volumes.DropSessionSnapshot(ctx, id); err != nil {
			return err
		}
	}
	s.dropImage(id)
	if err := s.removeMemory(id); err != nil {
		return err
	}
	s.log.Info("snapshot deleted; what was made from it keeps its own files", "snapshot", id,
		"sessions", len(sessions), "snapshots", len(children))
	if err := s.store.DeleteSnapshot(ctx, id); err != nil {
		return err
	}
	s.forgetReplica(id)
	return nil
}
