package btrfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
	"golang.org/x/sys/unix"
)

// storageErr wraps err from operation op with its errdefs class:
// ErrInsufficientStorage for ENOSPC and EDQUOT, ErrConflict for EEXIST,
// ErrNotFound for ENOENT, ErrInternal otherwise. err stays in the chain,
// so errors.Is(result, unix.EDQUOT) still works.
func storageErr(op string, err error) error {
	class := errdefs.ErrInternal
	switch {
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		class = errdefs.ErrInsufficientStorage
	case errors.Is(err, unix.EEXIST):
		class = errdefs.ErrConflict
	case errors.Is(err, unix.ENOENT):
		class = errdefs.ErrNotFound
	}
	return fmt.Errorf("btrfs: %s: %w: %w", op, err, class)
}

// openDir opens the directory path (not following a final symlink) for
// ioctls. The caller closes the descriptor.
func openDir(path string) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		return fd, err
	}
}

// isSubvolumeRoot reports whether path is the root directory of a btrfs
// subvolume (inode 256) rather than an ordinary directory or nothing.
func isSubvolumeRoot(path string) bool {
	var st unix.Stat_t
	return unix.Lstat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR && st.Ino == firstFreeObjectID
}

// snapshotInto snapshots the subvolume at src as dir/name (read-only when
// ro is set). EEXIST becomes ErrConflict, ENOSPC/EDQUOT
// ErrInsufficientStorage, a missing src ErrNotFound.
func snapshotInto(src, dir, name string, ro bool) error {
	srcFd, err := openDir(src)
	if err != nil {
		return storageErr("open "+src, err)
	}
	defer unix.Close(srcFd)
	dirFd, err := openDir(dir)
	if err != nil {
		return storageErr("open "+dir, err)
	}
	defer unix.Close(dirFd)
	if err := snapshotSubvolume(srcFd, dirFd, name, ro); err != nil {
		return storageErr(fmt.Sprintf("snapshot %s as %s", src, filepath.Join(dir, name)), err)
	}
	return nil
}

// destroy deletes the subvolume dir/name with everything in it, nested
// subvolumes included (a sandbox may create those in its layer), and then
// asks, best effort, for its level-0 qgroup to be removed (the kernel
// removes it itself once the cleaner has dropped the subvolume). A missing
// name is not an error; an ordinary directory of that name is removed as a
// tree.
func (d *Driver) destroy(dir, name string) error {
	path := filepath.Join(dir, name)
	fd, err := openDir(path)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return storageErr("open "+path, err)
	}
	id, idErr := subvolumeID(fd)
	unix.Close(fd)
	if !isSubvolumeRoot(path) {
		if err := storage.RemoveTree(path); err != nil {
			return storageErr("remove "+path, err)
		}
		return nil
	}
	dirFd, err := openDir(dir)
	if err != nil {
		return storageErr("open "+dir, err)
	}
	defer unix.Close(dirFd)
	err = destroySubvolume(dirFd, name)
	if errors.Is(err, unix.ENOTEMPTY) {
		if err = d.destroyNested(path); err == nil {
			err = destroySubvolume(dirFd, name)
		}
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return storageErr("destroy subvolume "+path, err)
	}
	if idErr == nil {
		d.reapQgroups(id)
	}
	return nil
}

// reapQgroups tries to remove the level-0 qgroups of destroyed subvolumes:
// ids, and those earlier attempts left pending. The kernel refuses (EBUSY)
// until the cleaner has dropped the subvolume, and sometimes removes the
// qgroup itself; ids still refused stay pending for the next call, and
// New sweeps whatever a restart forgot.
func (d *Driver) reapQgroups(ids ...uint64) {
	d.staleMu.Lock()
	defer d.staleMu.Unlock()
	if d.stale == nil {
		d.stale = map[uint64]bool{}
	}
	for _, id := range ids {
		d.stale[id] = true
	}
	for id := range d.stale {
		if err := removeQgroup(d.rootFd, id); err == nil || errors.Is(err, unix.ENOENT) || len(d.stale) > 4096 {
			delete(d.stale, id)
		}
	}
}

// sweepQgroups removes the level-0 qgroups whose subvolume no longer
// exists (left behind by destroys the cleaner finished after the driver
// stopped). Errors are ignored: stale qgroups only cost a little space.
func (d *Driver) sweepQgroups() {
	ids, err := level0Qgroups(d.rootFd)
	if err != nil {
		return
	}
	for _, id := range ids {
		if id < firstFreeObjectID {
			continue
		}
		if ok, err := subvolumeExists(d.rootFd, id); err == nil && !ok {
			_ = removeQgroup(d.rootFd, id)
		}
	}
}

// destroyNested destroys every subvolume nested inside the subvolume at
// root (not root itself), so that root can be destroyed.
func (d *Driver) destroyNested(root string) error {
	var nested []string
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if p != root && e.IsDir() && isSubvolumeRoot(p) {
			nested = append(nested, p)
			return filepath.SkipDir // destroy handles what is below it
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, p := range nested {
		if fd, err := openDir(p); err == nil {
			_ = setReadOnly(fd, false) // a read-only subvolume cannot lose entries
			unix.Close(fd)
		}
		if err := d.destroy(filepath.Dir(p), filepath.Base(p)); err != nil {
			return err
		}
	}
	return nil
}

// usageBytes returns the quota-group usage (referenced and exclusive
// bytes) of the subvolume at path. With flush it first writes back all
// dirty data of the filesystem and commits (exact, but it waits for every
// sandbox's pending writes); without it only commits, so data not yet
// written back is not counted.
func (d *Driver) usageBytes(path string, flush bool) (qgroupUsage, error) {
	fd, err := openDir(path)
	if err != nil {
		return qgroupUsage{}, storageErr("open "+path, err)
	}
	defer unix.Close(fd)
	u, err := usageOf(fd, flush)
	if err != nil {
		return u, err
	}
	// Numbers the kernel stopped keeping are rebuilt first (accounting.go).
	if rescanned, err := d.ensureAccounting(); err != nil || !rescanned {
		return u, err
	}
	return usageOf(fd, false)
}

// exclusiveOf returns the exclusive bytes of the subvolume root open as fd
// (see usageBytes for flush).
func exclusiveOf(fd int, flush bool) (int64, error) {
	u, err := usageOf(fd, flush)
	return u.Exclusive, err
}

// usageOf is usageBytes for a subvolume root open as fd.
func usageOf(fd int, flush bool) (qgroupUsage, error) {
	sync := commitFS
	if flush {
		sync = syncFS
	}
	if err := sync(fd); err != nil {
		return qgroupUsage{}, storageErr("sync", err)
	}
	id, err := subvolumeID(fd)
	if err != nil {
		return qgroupUsage{}, storageErr("subvolume id", err)
	}
	u, err := readQgroup(fd, id)
	if err != nil {
		return qgroupUsage{}, fmt.Errorf("btrfs: qgroup 0/%d (quotas off?): %w: %w", id, err, errdefs.ErrInternal)
	}
	return u, nil
}

// growth is what a layer holds beyond the subvolume it was made from: the
// growth of its referenced bytes since then, or, when larger, its
// exclusive bytes (small changes rewrite shared tree blocks without
// growing the tree, and the exclusive count sees those copies).
func (lm *layerMeta) growth(u qgroupUsage) int64 {
	return max(0, u.Referenced-lm.BaseReferenced, u.Exclusive)
}

// cleanup removes what an interrupted operation left behind: temporary
// template subvolumes, snapshot subvolumes whose metadata was never
// written (the Snapshot call did not succeed), metadata of layers and
// snapshots whose subvolume is gone, and temporary metadata files.
func (d *Driver) cleanup() error {
	for _, dir := range []string{d.templatesDir(), d.layersDir(), d.snapshotsDir()} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("btrfs: list %s: %w", dir, err)
		}
		for _, e := range entries {
			name := e.Name()
			p := filepath.Join(dir, name)
			switch {
			case isStage(name) && e.IsDir():
				if err := d.removeStage(dir, name); err != nil {
					return err
				}
			case strings.HasPrefix(name, "."):
				if e.IsDir() {
					if err := d.destroy(dir, name); err != nil {
						return err
					}
				} else if err := removeFile(p); err != nil {
					return err
				}
			case strings.HasSuffix(name, ".json"):
				if _, err := os.Lstat(strings.TrimSuffix(p, ".json")); errors.Is(err, os.ErrNotExist) {
					if err := removeFile(p); err != nil {
						return err
					}
				}
			case e.IsDir() && dir == d.snapshotsDir():
				if _, err := os.Lstat(p + ".json"); errors.Is(err, os.ErrNotExist) {
					if err := d.destroy(dir, name); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}
