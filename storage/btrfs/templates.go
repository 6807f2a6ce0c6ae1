package btrfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
	"golang.org/x/sys/unix"
)

// AddTemplate copies the template root filesystem rootfs into the
// read-only subvolume templates/<name>, which Prepare snapshots (sharing
// the data when rootfs is on the driver's volume: StageTemplate). version
// identifies the content: when the template exists with the same version
// nothing happens (and rootfs is not looked at); otherwise a new subvolume is filled under a temporary
// name and swapped in, and the old one is destroyed (layers made from it
// keep their data: they share extents, not the subvolume). The copy keeps
// owners, modes, times, symlinks, FIFOs and hard links; device nodes,
// sockets and extended attributes are not copied. Errors: ErrInvalidArgument
// (bad name or rootfs not a directory), ErrInsufficientStorage, ctx's error.
func (d *Driver) AddTemplate(ctx context.Context, name, rootfs, version string) error {
	if err := storage.ValidID("template", name); err != nil {
		return err
	}
	d.addMu.Lock()
	defer d.addMu.Unlock()
	final := d.templatePath(name)
	var old templateMeta
	if storage.ReadJSON(final+".json", &old, "template") == nil && old.Version == version && isSubvolumeRoot(final) {
		return nil // (rootfs need not exist: the driver may hold the only copy)
	}
	fi, err := os.Stat(rootfs)
	if err != nil || !fi.IsDir() {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "btrfs: template %q: rootfs %s is not a directory (%v)", name, rootfs, err)
	}
	tmp := fmt.Sprintf(".%s.new-%d", name, time.Now().UnixNano())
	if err := d.fillTemplate(ctx, tmp, rootfs); err != nil {
		d.destroy(d.templatesDir(), tmp)
		return err
	}
	// Swap under the write lock, so no Prepare snapshots a half-swapped
	// template. The metadata goes first: a crash in between leaves a
	// template without metadata, which the next AddTemplate rebuilds.
	d.tmplMu.Lock()
	defer d.tmplMu.Unlock()
	if err := removeFile(final + ".json"); err != nil {
		d.destroy(d.templatesDir(), tmp)
		return err
	}
	gone := fmt.Sprintf(".%s.old-%d", name, time.Now().UnixNano())
	if err := os.Rename(final, d.templatePath(gone)); err != nil && !errors.Is(err, os.ErrNotExist) {
		d.destroy(d.templatesDir(), tmp)
		return storageErr("replace template "+name, err)
	}
	if err := os.Rename(d.templatePath(tmp), final); err != nil {
		d.destroy(d.templatesDir(), tmp)
		return storageErr("install template "+name, err)
	}
	m := templateMeta{Version: version, Source: rootfs, CreatedAt: time.Now().UTC()}
	if err := storage.WriteJSON(final+".json", &m, 0o600); err != nil {
		return err
	}
	_ = d.destroy(d.templatesDir(), gone) // best effort: New removes leftovers
	return nil
}

// StageTemplate returns a new empty directory in the driver's volume
// (templates/.stage-*, removed at the next New if left behind) for a
// template to be built in; see storage.TemplateStager. A rootfs built
// there is added by AddTemplate at the cost of its metadata: the copy
// into the template subvolume shares the file data (copy_file_range
// clones extents within one btrfs), so once the caller removes the
// staging directory the template is stored once.
func (d *Driver) StageTemplate(ctx context.Context) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp(d.templatesDir(), ".stage-")
	if err != nil {
		return "", storageErr("stage a template", err)
	}
	return dir, nil
}

// fillTemplate creates subvolume templates/<tmp>, copies rootfs into it
// and makes it read-only.
func (d *Driver) fillTemplate(ctx context.Context, tmp, rootfs string) error {
	dirFd, err := openDir(d.templatesDir())
	if err != nil {
		return storageErr("open templates", err)
	}
	defer unix.Close(dirFd)
	if err := createSubvolume(dirFd, tmp); err != nil {
		return storageErr("create subvolume "+tmp, err)
	}
	if _, err := storage.CopyTree(ctx, rootfs, d.templatePath(tmp)); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return storageErr("copy template", err)
	}
	fd, err := openDir(d.templatePath(tmp))
	if err != nil {
		return storageErr("open "+tmp, err)
	}
	defer unix.Close(fd)
	if err := syncFS(fd); err != nil {
		return storageErr("sync", err)
	}
	if err := setReadOnly(fd, true); err != nil {
		return storageErr("make template read-only", err)
	}
	return nil
}

// RemoveTemplate destroys template name's subvolume and metadata. Layers
// and snapshots made from it keep working. A missing template is not an
// error.
func (d *Driver) RemoveTemplate(ctx context.Context, name string) error {
	if err := storage.ValidID("template", name); err != nil {
		return err
	}
	d.addMu.Lock()
	defer d.addMu.Unlock()
	d.tmplMu.Lock()
	defer d.tmplMu.Unlock()
	if err := removeFile(d.templatePath(name) + ".json"); err != nil {
		return err
	}
	return d.destroy(d.templatesDir(), name)
}
