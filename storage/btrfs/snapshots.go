package btrfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// Snapshot makes read-only snapshot snapID of layer id: it commits the
// filesystem (dirty data goes to disk and the qgroup numbers become
// current), reads the layer's exclusive bytes, creates the snapshot
// subvolume (O(1) in the data size), calls captured, digests the snapshot
// with storage.ManifestDigest and records its metadata, with the stamp
// that lets Verify trust that digest later without walking again (see
// stamp.go).
//
// SizeBytes is what the layer had written beyond its source when the
// snapshot was taken: the layer's exclusive bytes just before the snapshot
// plus those of earlier snapshots of the same layer (after a snapshot the
// layer shares everything with it, so its own count restarts near zero).
// It counts data, metadata blocks, and rewritten data once per rewrite
// between snapshots. Errors: ErrNotFound (no layer), ErrConflict (snapID
// exists), ErrInsufficientStorage, ErrResourceExhausted when the snapshot
// holds more entries than Options.MaxSnapshotEntries or nests deeper than
// storage.MaxManifestDepth (the snapshot is removed again).
func (d *Driver) Snapshot(ctx context.Context, id, snapID string, captured func()) (storage.SnapshotInfo, error) {
	if err := storage.ValidID("layer", id); err != nil {
		return storage.SnapshotInfo{}, err
	}
	if err := storage.ValidID("snapshot", snapID); err != nil {
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
	if m.Digest, m.Entries, m.Verified, err = d.digest(ctx, dst, d.maxEntries); err != nil {
		if errors.Is(err, errdefs.ErrResourceExhausted) || ctx.Err() != nil {
			return undo(fmt.Errorf("btrfs: snapshot %q: %w", snapID, err))
		}
		return undo(fmt.Errorf("btrfs: %w: %w", err, errdefs.ErrInternal))
	}
	if err := storage.WriteJSON(dst+".json", &m, 0o600); err != nil {
		return undo(err)
	}
	return m.info(), nil
}

// digest walks the snapshot subvolume at path (storage.ManifestDigest,
// at most maxEntries entries when > 0) and returns its digest, its
// entries and the stamp read before the walk (nil when the subvolume is
// not read-only or its state cannot be read: then nothing is cached).
func (d *Driver) digest(ctx context.Context, path string, maxEntries int64) (string, int64, *stamp, error) {
	var st *stamp
	if fd, err := openDir(path); err == nil {
		if s, err := readStamp(fd); err == nil && s.readOnly {
			st = &s.stamp
		}
		unix.Close(fd)
	}
	digest, n, err := storage.ManifestDigest(ctx, path, maxEntries)
	if err != nil {
		return "", n, nil, err
	}
	return digest, n, st, nil
}

// info converts the recorded metadata to a storage.SnapshotInfo.
func (m *snapMeta) info() storage.SnapshotInfo {
	return storage.SnapshotInfo{ID: m.ID, Parent: m.Parent, Template: m.Template,
		SizeBytes: m.SizeBytes, Digest: m.Digest, CreatedAt: m.CreatedAt}
}

// Verify checks snapshot snapID and every snapshot it is built on that
// still exists against the digest Snapshot recorded for each. A snapshot
// whose stamp shows it unchanged since its digest was last computed (it
// is read-only, the same subvolume, and its tree holds no block written
// since: see stamp.go) passes without a walk; any other is walked again
// (storage.ManifestDigest) and, when it matches, stamped anew. A
// difference fails with ErrConflict ("snapshot X failed its integrity
// check"). Snapshots are read-only subvolumes, so a difference means
// someone cleared the read-only flag and changed files; that change also
// wrote tree blocks, which is why a stamped snapshot is walked again.
// ErrNotFound for an unknown snapID.
func (d *Driver) Verify(ctx context.Context, snapID string) error {
	if err := storage.ValidID("snapshot", snapID); err != nil {
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
		if d.stampHolds(id, am.Verified) {
			continue
		}
		got, _, st, err := d.digest(ctx, d.snapPath(id), 0)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return errdefs.Newf(errdefs.ErrConflict, "btrfs: snapshot %q failed its integrity check (%v)", id, err)
		}
		if got != am.Digest {
			return errdefs.Newf(errdefs.ErrConflict, "btrfs: snapshot %q failed its integrity check (digest %s, recorded %s)", id, got, am.Digest)
		}
		if st != nil {
			d.restamp(id, st)
		}
	}
	return nil
}

// stampHolds reports whether snapshot id's subvolume is unchanged since
// stamp s was taken (false when s is nil or anything cannot be read). To
// flush the snapshot's pending writes into its tree it makes and
// destroys a throwaway read-only snapshot of it (stamp.go).
func (d *Driver) stampHolds(id string, s *stamp) bool {
	if s == nil {
		return false
	}
	fd, err := openDir(d.snapPath(id))
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return unchanged(fd, s, func() error {
		tmp := fmt.Sprintf(".flush-%s-%d", id, time.Now().UnixNano())
		if err := snapshotInto(d.snapPath(id), d.snapshotsDir(), tmp, true); err != nil {
			return err
		}
		return d.destroy(d.snapshotsDir(), tmp)
	})
}

// restamp records s as the stamp of snapshot id's digest, which a walk
// has just confirmed, unless the snapshot is being removed. A failure
// only costs the next Verify a walk.
func (d *Driver) restamp(id string, s *stamp) {
	d.metaMu.Lock()
	defer d.metaMu.Unlock()
	var m snapMeta
	if storage.ReadJSON(d.snapPath(id)+".json", &m, "snapshot") != nil {
		return
	}
	m.Verified = s
	_ = storage.WriteJSON(d.snapPath(id)+".json", &m, 0o600)
}

// RemoveSnapshot destroys snapshot snapID and its metadata. Layers and
// snapshots made from it do not need it (btrfs subvolumes share extents,
// not subvolumes), so it never fails with ErrConflict; the daemon enforces
// the API's dependency rule itself. A missing snapshot is not an error.
func (d *Driver) RemoveSnapshot(ctx context.Context, snapID string) error {
	if err := storage.ValidID("snapshot", snapID); err != nil {
		return err
	}
	d.metaMu.Lock()
	defer d.metaMu.Unlock()
	if err := d.destroy(d.snapshotsDir(), snapID); err != nil {
		return err
	}
	return removeFile(d.snapPath(snapID) + ".json")
}

// LayersIndependent reports true: a layer or snapshot made from a snapshot
// is a subvolume of its own (storage.IndependentLayers).
func (d *Driver) LayersIndependent() bool { return true }
