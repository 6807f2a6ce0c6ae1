package btrfs

import (
	"context"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// LayerTree returns layer id's subvolume, the sandbox's root filesystem
// (storage.Trees). ErrNotFound when there is none.
func (d *Driver) LayerTree(ctx context.Context, id string) (string, error) {
	if err := storage.ValidID("layer", id); err != nil {
		return "", err
	}
	p := d.layerPath(id)
	if !isSubvolumeRoot(p) {
		return "", errdefs.Newf(errdefs.ErrNotFound, "btrfs: layer %q", id)
	}
	return p, nil
}

// SnapshotTree returns snapshot snapID's read-only subvolume, which holds
// its whole tree (storage.Trees); release does nothing. ErrNotFound when
// there is none.
func (d *Driver) SnapshotTree(ctx context.Context, snapID string) (string, func(), error) {
	if err := storage.ValidID("snapshot", snapID); err != nil {
		return "", nil, err
	}
	p := d.snapPath(snapID)
	if !isSubvolumeRoot(p) {
		return "", nil, errdefs.Newf(errdefs.ErrNotFound, "btrfs: snapshot %q", snapID)
	}
	return p, func() {}, nil
}

var _ storage.Trees = (*Driver)(nil)
