package overlay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// upperDir and workDir return the upper and work directories of the layer
// in layerDir described by m (on the layer's own disk when it has one).
func upperDir(layerDir string, m layerMeta) string {
	if m.Disk {
		return filepath.Join(layerDir, "disk", "upper")
	}
	return filepath.Join(layerDir, "upper")
}

// workDir: see upperDir.
func workDir(layerDir string, m layerMeta) string {
	if m.Disk {
		return filepath.Join(layerDir, "disk", "work")
	}
	return filepath.Join(layerDir, "work")
}

// Prepare creates sandbox id's layer over from (a template, or a snapshot
// and the snapshots under it) and mounts it; it returns the mount point,
// Dir/layers/<id>/rootfs, whose root is owned by the shifted root.
// quotaBytes > 0 caps what the sandbox can write, in bytes. Errors:
// ErrInvalidArgument for a bad id, ErrNotFound for an unknown template or
// snapshot (or a template rootfs that is gone), ErrConflict when layer id
// exists. On error nothing of the layer is left.
func (d *Driver) Prepare(ctx context.Context, id string, from storage.Source, quotaBytes int64) (string, error) {
	if err := storage.ValidID("layer", id); err != nil {
		return "", err
	}
	if quotaBytes < 0 {
		return "", fmt.Errorf("disk limit %d bytes: %w", quotaBytes, errdefs.ErrInvalidArgument)
	}
	dir := d.layerDir(id)
	m, err := d.createLayerDir(id, from, quotaBytes)
	if err != nil {
		return "", err
	}
	rootfs, err := d.buildLayer(ctx, dir, m)
	if err != nil {
		if rerr := d.Remove(context.WithoutCancel(ctx), id); rerr != nil {
			err = fmt.Errorf("%w (and cleaning up: %v)", err, rerr)
		}
		return "", fmt.Errorf("prepare layer %q: %w", id, err)
	}
	return rootfs, nil
}

// createLayerDir resolves from, creates the layer directory and writes
// its metadata (with a fresh project id when project quotas are on),
// all under d.mu so that a concurrent RemoveSnapshot sees the new
// reference or the snapshot is gone first.
func (d *Driver) createLayerDir(id string, from storage.Source, quotaBytes int64) (layerMeta, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := layerMeta{QuotaBytes: quotaBytes, CreatedAt: time.Now().UTC()}
	if from.Snapshot != "" {
		if err := storage.ValidID("snapshot", from.Snapshot); err != nil {
			return m, err
		}
		s, err := d.readSnap(from.Snapshot)
		if err != nil {
			return m, err
		}
		m.Snapshot, m.Template, m.Rootfs = s.ID, s.Template, s.Rootfs
		m.Chain = append([]string{s.ID}, s.Chain...)
	} else {
		if err := storage.ValidID("template", from.Template); err != nil {
			return m, err
		}
		var t templateMeta
		if err := storage.ReadJSON(d.templateFile(from.Template), &t, templateWhat(from.Template)); err != nil {
			return m, err
		}
		m.Template, m.Rootfs = from.Template, t.Rootfs
	}
	if fi, err := os.Stat(m.Rootfs); err != nil || !fi.IsDir() {
		return m, fmt.Errorf("rootfs %s of template %q is gone: %w", m.Rootfs, m.Template, errdefs.ErrNotFound)
	}
	dir := d.layerDir(id)
	if err := os.Mkdir(dir, 0o711); errors.Is(err, os.ErrExist) {
		return m, fmt.Errorf("%s exists: %w", layerWhat(id), errdefs.ErrConflict)
	} else if err != nil {
		return m, fmt.Errorf("create %s: %w", dir, err)
	}
	var err error
	if d.vol.ProjectQuota {
		m.ProjectID, err = d.allocProject()
	} else {
		m.Disk = quotaBytes > 0
	}
	if err == nil {
		err = storage.WriteJSON(layerMetaFile(dir), m, 0o600)
	}
	if err != nil {
		os.RemoveAll(dir)
		return m, err
	}
	return m, nil
}

// buildLayer makes the upper, work and mount point directories of the
// layer in dir (on its own disk, or charged to its project, with the
// limit set), and mounts the overlay. It returns the mount point.
func (d *Driver) buildLayer(ctx context.Context, dir string, m layerMeta) (string, error) {
	if m.Disk {
		disk := filepath.Join(dir, "disk")
		if err := os.Mkdir(disk, 0o700); err != nil {
			return "", err
		}
		if err := makeDisk(filepath.Join(dir, "disk.img"), disk, m.QuotaBytes); err != nil {
			return "", err
		}
	}
	upper, work, rootfs := upperDir(dir, m), workDir(dir, m), filepath.Join(dir, "rootfs")
	for _, p := range []string{upper, work, rootfs} {
		if err := os.Mkdir(p, 0o755); err != nil {
			return "", err
		}
	}
	if m.ProjectID != 0 {
		// The work directory too: overlay copies up into it and renames
		// into the upper, which XFS refuses across projects.
		for _, p := range []string{upper, work} {
			if err := setProject(p, m.ProjectID); err != nil {
				return "", err
			}
		}
		if err := setProjectLimit(d.vol, m.ProjectID, m.QuotaBytes); err != nil {
			return "", err
		}
	}
	if err := os.Lchown(upper, d.shift.UID(storage.RootUID), d.shift.GID(storage.RootUID)); err != nil {
		return "", err
	}
	if len(m.Chain) > 0 {
		// The merged root shows the upper root's attributes: start from
		// the snapshot's, so a restore looks exactly like what was saved.
		if err := copyRootAttrs(d.snapLayer(m.Chain[0]), upper); err != nil {
			return "", err
		}
	}
	lowers := make([]string, 0, len(m.Chain)+1)
	for _, s := range m.Chain {
		lowers = append(lowers, d.snapLayer(s))
	}
	lowers = append(lowers, m.Rootfs)
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if err := mountOverlay(rootfs, lowers, upper, work); err != nil {
		return "", err
	}
	return rootfs, nil
}

// Remove unmounts sandbox id's layer (lazily: a sandbox still holding it
// keeps its view until it exits), lifts its disk limit and deletes it. A
// missing layer is not an error.
func (d *Driver) Remove(ctx context.Context, id string) error {
	if err := storage.ValidID("layer", id); err != nil {
		return err
	}
	dir := d.layerDir(id)
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := unmount(filepath.Join(dir, "rootfs")); err != nil {
		return fmt.Errorf("remove layer %q: %w", id, err)
	}
	var m layerMeta
	metaErr := storage.ReadJSON(layerMetaFile(dir), &m, layerWhat(id))
	if isMountPoint(filepath.Join(dir, "disk")) {
		if err := unmount(filepath.Join(dir, "disk")); err != nil {
			return fmt.Errorf("remove layer %q: %w", id, err)
		}
	}
	// Out of layers/ first (Layers stops listing it, and a crash leaves
	// it in tmp/, which New empties), then delete at leisure.
	d.mu.Lock()
	trash := filepath.Join(d.tmpDir(), "layer-"+id+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	err := os.Rename(dir, trash)
	d.mu.Unlock()
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove layer %q: %w", id, err)
	}
	if err := storage.RemoveTree(trash); err != nil {
		return fmt.Errorf("remove layer %q: %w", id, err)
	}
	if metaErr == nil && m.ProjectID != 0 && d.vol.ProjectQuota {
		// Best effort: project ids are never reused, so a limit left
		// behind binds nothing.
		_ = setProjectLimit(d.vol, m.ProjectID, 0)
	}
	return nil
}

// Flush writes the dirty data of the filesystem holding sandbox id's
// upper directory to disk (syncfs(2): the layer's own disk, or the
// volume): the copy and the reflinks a Snapshot makes while the sandbox
// is frozen then find it written. ErrNotFound for an unknown layer.
func (d *Driver) Flush(ctx context.Context, id string) error {
	if err := storage.ValidID("layer", id); err != nil {
		return err
	}
	dir := d.layerDir(id)
	var m layerMeta
	if err := storage.ReadJSON(layerMetaFile(dir), &m, layerWhat(id)); err != nil {
		return err
	}
	if err := syncFS(upperDir(dir, m)); err != nil {
		return err
	}
	return ctx.Err()
}

// Usage returns the bytes sandbox id's layer holds beyond its lower
// layers: its project's block count under project quotas, otherwise the
// allocated bytes of everything in its upper directory. ErrNotFound for
// an unknown layer.
func (d *Driver) Usage(ctx context.Context, id string) (int64, error) {
	if err := storage.ValidID("layer", id); err != nil {
		return 0, err
	}
	dir := d.layerDir(id)
	var m layerMeta
	if err := storage.ReadJSON(layerMetaFile(dir), &m, layerWhat(id)); err != nil {
		return 0, err
	}
	if m.ProjectID != 0 && d.vol.ProjectQuota {
		if n, err := projectUsage(d.vol, m.ProjectID); err == nil {
			return n, nil
		}
	}
	return diskUsage(ctx, upperDir(dir, m))
}

// diskUsage returns the allocated bytes (st_blocks × 512) of path and
// everything under it, not following symlinks, with descriptor-relative
// calls (any depth of path names).
func diskUsage(ctx context.Context, path string) (int64, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("usage of %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("usage of %s: %w", path, err)
	}
	total := st.Blocks * 512
	n, err := dirUsage(ctx, fd)
	if err != nil {
		return 0, fmt.Errorf("usage of %s: %w", path, err)
	}
	return total + n, nil
}

// dirUsage sums the allocated bytes of the entries under the open
// directory fd. Entries that vanish meanwhile are skipped.
func dirUsage(ctx context.Context, fd int) (int64, error) {
	names, err := readAllNames(fd)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue
		}
		total += st.Blocks * 512
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		n, err := dirUsage(ctx, sub)
		unix.Close(sub)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// copyRootAttrs gives directory dst the mode, access and modification
// times of directory src.
func copyRootAttrs(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return fmt.Errorf("stat %s: %w", src, err)
	}
	if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
		return fmt.Errorf("chmod %s: %w", dst, err)
	}
	ts := []unix.Timespec{unix.NsecToTimespec(st.Atim.Nano()), unix.NsecToTimespec(st.Mtim.Nano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %s: %w", dst, err)
	}
	return nil
}
