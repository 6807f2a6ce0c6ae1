package volume

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/store"
)

// SnapshotPrefix starts the storage snapshot id of every volume snapshot
// (the prefix, then the snapshot's id): the snapshot service's sweep of
// storage snapshots its database does not know leaves these to OwnsSnapshot.
const SnapshotPrefix = "_vsnap"

// storageSnapshot is the storage driver's id of volume snapshot id.
func storageSnapshot(id string) string { return SnapshotPrefix + id }

// Snapshot takes a read-only snapshot of tenant's volume name, named
// snapName ("" for none; a volume name's rules, unique among the tenant's
// volume snapshots). On btrfs it is a subvolume snapshot of the volume's
// layer: O(1) in its data, then one walk to digest it. A session that
// mounts the volume read-write keeps running, so the snapshot holds what
// a crash at that instant would leave (every completed write); a snapshot
// consistent with a session's own files is a snapshot of the session
// (BeginCapture). It counts against the tenant's max_snapshots (429
// past it). ErrNotFound for no such volume; ErrConflict for a taken
// name.
func (s *Service) Snapshot(ctx context.Context, tenant, name, snapName string) (*node.VolumeSnapshot, error) {
	if err := s.supported(); err != nil {
		return nil, err
	}
	if snapName != "" {
		if err := ValidName("name", snapName); err != nil {
			return nil, err
		}
		if _, err := s.store.GetVolumeSnapshot(ctx, tenant, snapName); err == nil {
			return nil, errdefs.Newf(errdefs.ErrConflict, "a volume snapshot named %q exists", snapName)
		}
	}
	r, err := s.store.GetVolume(ctx, tenant, name)
	if err != nil {
		return nil, err
	}
	if s.quota != nil {
		// It holds disk as a session snapshot does: both count against
		// max_snapshots, under the same reservation.
		release, err := s.quota(ctx, tenant, "snapshots", func() (int, error) {
			return s.store.TenantSnapshotCount(ctx, tenant)
		})
		if err != nil {
			return nil, err
		}
		defer release()
	}
	row := store.VolumeSnapshotRow{ID: node.NewID(), Tenant: tenant, Name: snapName, Volume: name, SizeMB: r.SizeMB}
	info, err := s.storage.Snapshot(ctx, r.LayerID, storageSnapshot(row.ID), nil)
	if err != nil {
		return nil, fmt.Errorf("snapshot of volume %q: %w", name, err)
	}
	row.SizeBytes, row.CreatedAt = info.SizeBytes, info.CreatedAt.UTC()
	if err := s.store.CreateVolumeSnapshot(ctx, row); err != nil {
		_ = s.storage.RemoveSnapshot(context.WithoutCancel(ctx), storageSnapshot(row.ID))
		return nil, err
	}
	return snapshotView(&row), nil
}

// CreateFrom makes tenant's volume name from tenant's volume snapshot
// from (its id or name): a writable btrfs snapshot of it (O(1)), with a
// quota of sizeMB MiB, or the snapshotted volume's when sizeMB is 0. Like
// every volume's, the quota bounds the bytes only this volume holds (btrfs
// exclusive bytes): what it still shares with the snapshot is not counted
// until nothing else holds it. ErrInvalidArgument naming from when tenant
// has no such snapshot.
func (s *Service) CreateFrom(ctx context.Context, tenant, name, from string, sizeMB int64) (*node.Volume, error) {
	if sizeMB != 0 && (sizeMB < MinSizeMB || sizeMB > MaxSizeMB) {
		return nil, errdefs.InvalidField("size_mb", "must be 0 (the snapshot's) or between %d and %d MiB", MinSizeMB, MaxSizeMB)
	}
	if err := s.supported(); err != nil {
		return nil, err
	}
	sn, err := s.store.GetVolumeSnapshot(ctx, tenant, from)
	if errors.Is(err, errdefs.ErrNotFound) || err == nil && sn.ReadOnly {
		return nil, errdefs.InvalidField("from", "volume snapshot %q does not exist", from)
	}
	if err != nil {
		return nil, err
	}
	if sizeMB == 0 {
		sizeMB = sn.SizeMB
	}
	return s.create(ctx, tenant, name, sizeMB, sourceOf(sn), "")
}

// ListSnapshots returns the snapshots taken of tenant's volume name on
// its own (not as part of a session snapshot), oldest first, also once
// the volume is gone; name "" lists those of every volume of tenant.
// ErrNotFound when there is neither the volume nor a snapshot of it.
func (s *Service) ListSnapshots(ctx context.Context, tenant, name string) ([]*node.VolumeSnapshot, error) {
	if err := s.supported(); err != nil {
		return nil, err
	}
	rows, err := s.store.ListVolumeSnapshots(ctx, tenant, name, true)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 && name != "" {
		if _, err := s.store.GetVolume(ctx, tenant, name); err != nil {
			return nil, err
		}
	}
	out := make([]*node.VolumeSnapshot, 0, len(rows))
	for _, r := range rows {
		out = append(out, snapshotView(r))
	}
	return out, nil
}

// DeleteSnapshot removes tenant's snapshot ref (id or name) of volume
// name. Volumes made from it keep their data. ErrNotFound when it is not
// one of that volume's own snapshots.
func (s *Service) DeleteSnapshot(ctx context.Context, tenant, name, ref string) error {
	if err := s.supported(); err != nil {
		return err
	}
	sn, err := s.store.GetVolumeSnapshot(ctx, tenant, ref)
	if err == nil && (sn.Volume != name || sn.SessionSnapshot != "") {
		err = errdefs.Newf(errdefs.ErrNotFound, "volume %q has no snapshot %q", name, ref)
	}
	if err != nil {
		return err
	}
	return s.dropSnapshot(ctx, sn)
}

// dropSnapshot removes volume snapshot sn: the row first, so that a stop
// in between leaves a storage snapshot no row names, which the next
// start's sweep removes (OwnsSnapshot).
func (s *Service) dropSnapshot(ctx context.Context, sn *store.VolumeSnapshotRow) error {
	if err := s.store.DeleteVolumeSnapshot(ctx, sn.ID); err != nil {
		return err
	}
	if sn.ReadOnly {
		return nil
	}
	return s.storage.RemoveSnapshot(context.WithoutCancel(ctx), storageSnapshot(sn.ID))
}

// OwnsSnapshot reports whether storage snapshot id is a volume
// snapshot's that exists: the snapshot service's start-up sweep keeps
// those and removes the other volume snapshots (one whose record was
// never made, or was removed before its files).
func (s *Service) OwnsSnapshot(ctx context.Context, id string) bool {
	if !strings.HasPrefix(id, SnapshotPrefix) {
		return false
	}
	ok, err := s.store.HasVolumeSnapshot(ctx, strings.TrimPrefix(id, SnapshotPrefix))
	return ok || err != nil // a database error must not delete data
}

// sourceOf is the storage source of a volume made from snapshot sn.
func sourceOf(sn *store.VolumeSnapshotRow) storage.Source {
	return storage.Source{Snapshot: storageSnapshot(sn.ID)}
}

// snapshotView is r as the API shows it.
func snapshotView(r *store.VolumeSnapshotRow) *node.VolumeSnapshot {
	return &node.VolumeSnapshot{ID: r.ID, Name: r.Name, Volume: r.Volume, Tenant: r.Tenant, SizeMB: r.SizeMB,
		SizeBytes: r.SizeBytes, CreatedAt: r.CreatedAt}
}

// now is the time rows are stamped with.
func now() time.Time { return time.Now().UTC() }
