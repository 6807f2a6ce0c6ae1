package overlay

import (
	"context"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// LayerTree returns layer id's merged mount, the sandbox's root
// filesystem (storage.Trees). ErrNotFound when there is none.
func (d *Driver) LayerTree(ctx context.Context, id string) (string, error) {
	if err := storage.ValidID("layer", id); err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(d.layerDir(id), "meta.json")); err != nil {
		return "", errdefs.Newf(errdefs.ErrNotFound, "overlay: layer %q", id)
	}
	return filepath.Join(d.layerDir(id), "rootfs"), nil
}

// SnapshotTree mounts a read-only overlay of snapshot snapID's layer over
// those it is built on and its template (storage.Trees) in the driver's
// scratch directory; release unmounts and removes it. The mount costs one
// mount(2), not a copy. ErrNotFound for an unknown snapshot.
func (d *Driver) SnapshotTree(ctx context.Context, snapID string) (string, func(), error) {
	if err := storage.ValidID("snapshot", snapID); err != nil {
		return "", nil, err
	}
	m, err := d.readSnap(snapID)
	if err != nil {
		return "", nil, err
	}
	lowers := []string{d.snapLayer(snapID)}
	for _, s := range m.Chain {
		lowers = append(lowers, d.snapLayer(s))
	}
	lowers = append(lowers, m.Rootfs)
	dir, err := os.MkdirTemp(d.tmpDir(), "view-"+snapID+"-")
	if err != nil {
		return "", nil, err
	}
	if err := mountOverlay(dir, lowers, "", ""); err != nil {
		os.Remove(dir)
		return "", nil, err
	}
	return dir, func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err == nil {
			os.Remove(dir)
		}
	}, nil
}

// unmountViews detaches the snapshot views (SnapshotTree) a previous
// process left mounted in tmp, so that the scratch directory can be
// cleaned.
func unmountViews(tmp string) {
	views, _ := filepath.Glob(filepath.Join(tmp, "view-*"))
	for _, v := range views {
		_ = unix.Unmount(v, unix.MNT_DETACH)
	}
}

var _ storage.Trees = (*Driver)(nil)
