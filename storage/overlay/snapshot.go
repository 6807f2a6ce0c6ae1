package overlay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// Snapshot copies sandbox id's upper directory (its changes since the
// snapshot it was prepared from, or since its template) into the new
// read-only snapshot snapID, reflinking file data where the filesystem
// can, flushes it to disk, and records its parent, chain, size (allocated
// bytes of the copy) and manifest digest. The caller freezes the sandbox
// before the call; captured (when not nil) is called once the copy is
// made, after which the sandbox may run again.
// Errors: ErrInvalidArgument for bad ids, ErrNotFound for an unknown
// layer, ErrConflict when snapID exists, ErrInsufficientStorage when the
// volume is full. On error nothing of the snapshot is left.
func (d *Driver) Snapshot(ctx context.Context, id, snapID string, captured func()) (storage.SnapshotInfo, error) {
	if err := storage.ValidID("layer", id); err != nil {
		return storage.SnapshotInfo{}, err
	}
	if err := storage.ValidID("snapshot", snapID); err != nil {
		return storage.SnapshotInfo{}, err
	}
	dir := d.layerDir(id)
	var m layerMeta
	if err := storage.ReadJSON(layerMetaFile(dir), &m, layerWhat(id)); err != nil {
		return storage.SnapshotInfo{}, err
	}
	if _, err := os.Lstat(d.snapDir(snapID)); err == nil {
		return storage.SnapshotInfo{}, fmt.Errorf("%s exists: %w", snapWhat(snapID), errdefs.ErrConflict)
	}
	tmp, err := os.MkdirTemp(d.tmpDir(), "snap-"+snapID+"-")
	if err != nil {
		return storage.SnapshotInfo{}, fmt.Errorf("snapshot %q: %w", snapID, err)
	}
	info, err := d.makeSnapshot(ctx, tmp, dir, m, snapID, captured)
	if err != nil {
		if rerr := storage.RemoveTree(tmp); rerr != nil {
			err = fmt.Errorf("%w (and cleaning up: %v)", err, rerr)
		}
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
			err = fmt.Errorf("%w: %w", err, errdefs.ErrInsufficientStorage)
		}
		return storage.SnapshotInfo{}, fmt.Errorf("snapshot layer %q as %q: %w", id, snapID, err)
	}
	return info, nil
}

// makeSnapshot copies the layer in layerDir (described by m) into
// tmp/layer, calls captured, digests the copy, writes tmp/meta.json and
// moves tmp into place as snapshot snapID.
func (d *Driver) makeSnapshot(ctx context.Context, tmp, layerDir string, m layerMeta, snapID string, captured func()) (storage.SnapshotInfo, error) {
	c := copier{ctx: ctx, noReflink: d.noReflink, maxEntries: d.maxEntries}
	layer := filepath.Join(tmp, "layer")
	if err := c.copyTree(upperDir(layerDir, m), layer); err != nil {
		return storage.SnapshotInfo{}, err
	}
	if captured != nil {
		captured() // the rest reads only the private copy
	}
	digest, _, err := storage.ManifestDigest(ctx, layer, 0) // (the copy counted its entries)
	if err != nil {
		return storage.SnapshotInfo{}, err
	}
	if err := syncFS(layer); err != nil {
		return storage.SnapshotInfo{}, err
	}
	s := snapMeta{ID: snapID, Parent: m.Snapshot, Template: m.Template, Rootfs: m.Rootfs,
		Chain: m.Chain, SizeBytes: c.Bytes, Digest: digest, CreatedAt: time.Now().UTC()}
	if err := storage.WriteJSON(snapMetaFile(tmp), s, 0o600); err != nil {
		return storage.SnapshotInfo{}, err
	}
	d.mu.Lock()
	err = unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, d.snapDir(snapID), unix.RENAME_NOREPLACE)
	d.mu.Unlock()
	if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
		return storage.SnapshotInfo{}, fmt.Errorf("%s exists: %w", snapWhat(snapID), errdefs.ErrConflict)
	}
	if err != nil {
		return storage.SnapshotInfo{}, fmt.Errorf("move snapshot into place: %w", err)
	}
	return s.info(), nil
}

// info returns the storage.SnapshotInfo of the snapshot m describes.
func (m snapMeta) info() storage.SnapshotInfo {
	return storage.SnapshotInfo{ID: m.ID, Parent: m.Parent, Template: m.Template,
		SizeBytes: m.SizeBytes, Digest: m.Digest, CreatedAt: m.CreatedAt}
}

// Verify recomputes the manifest digest of snapshot snapID and of every
// snapshot under it and compares each with what Snapshot recorded. A
// difference, or a snapshot of the chain that is missing, is an error
// wrapping errdefs.ErrConflict ("snapshot X failed its integrity
// check"); an unknown snapID is ErrNotFound. Every call walks: a snapshot
// layer is a plain directory, with nothing the kernel keeps that would
// show it unchanged since the last walk (the btrfs driver has that, and
// caches), so only the walk's cost is bounded, by the entries Snapshot
// allowed and by storage.ManifestDigest streaming.
func (d *Driver) Verify(ctx context.Context, snapID string) error {
	if err := storage.ValidID("snapshot", snapID); err != nil {
		return err
	}
	top, err := d.readSnap(snapID)
	if err != nil {
		return err
	}
	for _, id := range append([]string{snapID}, top.Chain...) {
		if err := ctx.Err(); err != nil {
			return err
		}
		m, err := d.readSnap(id)
		if errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("snapshot %s failed its integrity check: snapshot %s under it is missing: %w", snapID, id, errdefs.ErrConflict)
		}
		if err != nil {
			return err
		}
		got, _, err := storage.ManifestDigest(ctx, d.snapLayer(id), 0)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("snapshot %s failed its integrity check: %v: %w", id, err, errdefs.ErrConflict)
		}
		if got != m.Digest {
			what := "snapshot " + id
			if id != snapID {
				what += " (under snapshot " + snapID + ")"
			}
			return fmt.Errorf("%s failed its integrity check: digest %s, recorded %s: %w", what, got, m.Digest, errdefs.ErrConflict)
		}
	}
	return nil
}

// RemoveSnapshot deletes snapshot snapID. ErrConflict while a layer or
// another snapshot is built on it (it is one of their lower layers); a
// missing snapshot is not an error.
func (d *Driver) RemoveSnapshot(ctx context.Context, snapID string) error {
	if err := storage.ValidID("snapshot", snapID); err != nil {
		return err
	}
	trash, err := d.detachSnapshot(snapID)
	if err != nil || trash == "" {
		return err
	}
	if err := storage.RemoveTree(trash); err != nil {
		return fmt.Errorf("remove snapshot %q: %w", snapID, err)
	}
	return nil
}

// detachSnapshot checks under d.mu that nothing is built on snapshot
// snapID and moves it into tmp/, returning its new path ("" when there
// was no such snapshot).
func (d *Driver) detachSnapshot(snapID string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := os.Lstat(d.snapDir(snapID)); errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	layers, err := listIDs(filepath.Join(d.dir, "layers"), "")
	if err != nil {
		return "", err
	}
	for _, l := range layers {
		var m layerMeta
		if storage.ReadJSON(layerMetaFile(d.layerDir(l)), &m, layerWhat(l)) == nil && slices.Contains(m.Chain, snapID) {
			return "", fmt.Errorf("snapshot %q is a lower layer of layer %q: %w", snapID, l, errdefs.ErrConflict)
		}
	}
	snaps, err := listIDs(filepath.Join(d.dir, "snapshots"), "")
	if err != nil {
		return "", err
	}
	for _, s := range snaps {
		if m, err := d.readSnap(s); err == nil && slices.Contains(m.Chain, snapID) {
			return "", fmt.Errorf("snapshot %q is a lower layer of snapshot %q: %w", snapID, s, errdefs.ErrConflict)
		}
	}
	trash := filepath.Join(d.tmpDir(), "snap-rm-"+snapID+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	if err := os.Rename(d.snapDir(snapID), trash); err != nil {
		return "", fmt.Errorf("remove snapshot %q: %w", snapID, err)
	}
	return trash, nil
}

// syncFS flushes the filesystem holding path to disk (syncfs(2)), so a
// snapshot whose metadata is written survives a host crash whole.
func syncFS(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}
