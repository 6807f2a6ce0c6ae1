package btrfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// Snapshot makes read-only snapshot snapID of layer id: it commits the
// filesystem (dirty data goes to disk and the qgroup numbers become
// current), reads the layer's exclusive bytes, creates the snapshot
// subvolume (O(1) in the data size), calls captured, digests the snapshot
// with storage.ManifestDigest and records its metadata.
//
// SizeBytes is what the layer had written beyond its source when the
// snapshot was taken: the layer's exclusive bytes just before the snapshot
// plus those of earlier snapshots of the same layer (after a snapshot the
// layer shares everything with it, so its own count restarts near zero).
// It counts data, metadata blocks, and rewritten data once per rewrite
// between snapshots. Errors: ErrNotFound (no layer), ErrConflict (snapID
// exists), ErrInsufficientStorage.
func (d *Driver) Snapshot(ctx context.Context, id, snapID string, captured func()) (storage.SnapshotInfo, error) {
	if err := validID("layer", id); err != nil {
		return storage.SnapshotInfo{}, err
	}
	if err := validID("snapshot", snapID); err != nil {
		return storage.SnapshotInfo{}, err
	}
	var lm layerMeta
	if err := storage.ReadJSON(d.layerPath(id)+".json", &lm, fmt.Sprintf("layer %q", id)); err != nil {
		return storage.SnapshotInfo{}, err
	}
	dst := d.snapPath(snapID)
	if _, err := os.Lstat(dst); err == nil {
		return storage.SnapshotInfo{}, errdefs.Newf(errdefs.ErrConflict, "btrfs: snapshot %q exists", snapID)
	}
	if err := ctx.Err(); err != nil {
		return storage.SnapshotInfo{}, err
	}
	u, err := d.usageBytes(d.layerPath(id), true)
	if err != nil {
		return storage.SnapshotInfo{}, err
	}
	if err := snapshotInto(d.layerPath(id), d.snapshotsDir(), snapID, true); err != nil {
		return storage.SnapshotInfo{}, err
	}
	if captured != nil {
		captured() // the rest reads only the read-only snapshot
	}
	m := snapMeta{
		ID: snapID, Parent: lm.Snapshot, Template: lm.Template, Ancestors: lm.Ancestors,
		SizeBytes: lm.growth(u), CreatedAt: time.Now().UTC(),
	}
	undo := func(err error) (storage.SnapshotInfo, error) {
		removeFile(dst + ".json")
		d.destroy(d.snapshotsDir(), snapID)
		return storage.SnapshotInfo{}, err
	}
	if m.Digest, err = storage.ManifestDigest(dst); err != nil {
		return undo(fmt.Errorf("btrfs: %w: %w", err, errdefs.ErrInternal))
	}
	if err := storage.WriteJSON(dst+".json", &m, 0o600); err != nil {
		return undo(err)
	}
	return m.info(), nil
}

// info converts the recorded metadata to a storage.SnapshotInfo.
func (m *snapMeta) info() storage.SnapshotInfo {
	return storage.SnapshotInfo{ID: m.ID, Parent: m.Parent, Template: m.Template,
		SizeBytes: m.SizeBytes, Digest: m.Digest, CreatedAt: m.CreatedAt}
}

// Verify recomputes the manifest digest of snapshot snapID and of every
// snapshot it is built on that still exists, and compares each with the
// digest recorded by Snapshot. A difference fails with ErrConflict
// ("snapshot X failed its integrity check"). Snapshots are read-only
// subvolumes, so a difference means someone cleared the read-only flag and
// changed files. ErrNotFound for an unknown snapID.
func (d *Driver) Verify(ctx context.Context, snapID string) error {
	if err := validID("snapshot", snapID); err != nil {
		return err
	}
	var m snapMeta
	if err := storage.ReadJSON(d.snapPath(snapID)+".json", &m, fmt.Sprintf("snapshot %q", snapID)); err != nil {
		return err
	}
	for i, id := range append([]string{snapID}, m.Ancestors...) {
		if err := ctx.Err(); err != nil {
			return err
		}
		var am snapMeta
		err := storage.ReadJSON(d.snapPath(id)+".json", &am, fmt.Sprintf("snapshot %q", id))
		if i > 0 && errors.Is(err, errdefs.ErrNotFound) {
			continue // an ancestor that was removed
		}
		if err != nil {
			return err
		}
		if _, err := os.Lstat(d.snapPath(id)); errors.Is(err, os.ErrNotExist) && i > 0 {
			continue
		}
		got, err := storage.ManifestDigest(d.snapPath(id))
		if err != nil {
			return errdefs.Newf(errdefs.ErrConflict, "btrfs: snapshot %q failed its integrity check (%v)", id, err)
		}
		if got != am.Digest {
			return errdefs.Newf(errdefs.ErrConflict, "btrfs: snapshot %q failed its integrity check (digest %s, recorded %s)", id, got, am.Digest)
		}
	}
	return nil
}

// RemoveSnapshot destroys snapshot snapID and its metadata. Layers and
// snapshots made from it do not need it (btrfs subvolumes share extents,
// not subvolumes), so it never fails with ErrConflict; the daemon enforces
// the API's dependency rule itself. A missing snapshot is not an error.
func (d *Driver) RemoveSnapshot(ctx context.Context, snapID string) error {
	if err := validID("snapshot", snapID); err != nil {
		return err
	}
	if err := d.destroy(d.snapshotsDir(), snapID); err != nil {
		return err
	}
	return removeFile(d.snapPath(snapID) + ".json")
}
