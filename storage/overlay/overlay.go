// Package overlay is the overlayfs storage.Driver: every sandbox gets an
// overlay whose lower layers are the snapshots it descends from (newest
// first) and, at the bottom, its template's rootfs (used in place). A
// snapshot copies the layer's upper directory into a new read-only layer
// directory, reflinking file data on XFS, so it costs about the metadata
// of what the sandbox changed.
//
// Everything lives on one XFS filesystem at Dir: the host's when Dir is
// already on XFS, otherwise an image Dir+".img" (its blocks reserved) mounted at Dir
// through a loop device. Disk limits use XFS project quotas (one project
// per layer) when the filesystem is mounted with prjquota. Kernels built
// without XFS quota support (CONFIG_XFS_QUOTA) cannot mount prjquota;
// there a layer with a limit gets its upper directory on an ext4 image of
// its own, of the limit's size (its snapshots then copy bytes instead of
// reflinking).
//
//	Dir/
//	  projects.json              next XFS project id (never reused)
//	  templates/NAME.json        template rootfs path and version
//	  layers/ID/meta.json        chain, template, project id, limit
//	  layers/ID/upper, work      the overlay's upper and work directories
//	  layers/ID/disk.img, disk/  (limit without project quotas) their image
//	  layers/ID/rootfs           the overlay mount: the sandbox's root
//	  snapshots/ID/meta.json     parent, chain, digest, size
//	  snapshots/ID/layer         the copied upper: a read-only lower layer
//	  tmp/                       snapshots being made, removals
package overlay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/forkbox/forkbox/defaults"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// Options configures New.
type Options struct {
	// Dir is the driver's directory (DATA/storage/overlay). When it is not
	// on XFS, the image Dir+".img" of ImageBytes is made and
	// formatted once (mkfs.xfs, reflink on) and mounted at Dir with
	// prjquota through a loop device; later starts mount it again or find
	// it mounted.
	Dir string
	// ImageBytes is the image's size in bytes, reserved on the host
	// (storage.DefaultImageBytes when 0). It only matters when the image is
	// made.
	ImageBytes int64
	// Shift maps sandbox ids to host ids: a layer's root directory is
	// owned by Shift's root.
	Shift storage.IDShift
	// MaxSnapshotEntries bounds the entries (files, directories, links,
	// whiteouts) a snapshot may hold, counted over what it copies (the
	// layer's changes); past it Snapshot fails with ErrResourceExhausted.
	// 0 means defaults.MaxSnapshotEntries; negative, no bound.
	MaxSnapshotEntries int64
}

// Driver is the overlay storage driver. Its methods are safe for
// concurrent use on different ids.
type Driver struct {
	dir   string
	shift storage.IDShift
	vol   volume
	// mu serialises what changes or checks references between layers
	// and snapshots (creating a layer or snapshot, removing a snapshot),
	// template records and project id allocation.
	mu sync.Mutex
	// noReflink makes snapshots copy bytes (tests and measurements).
	noReflink bool
	// maxEntries is Options.MaxSnapshotEntries resolved (0: no bound).
	maxEntries int64
}

var _ storage.Driver = (*Driver)(nil)

// New opens (or sets up) the overlay driver's storage at opts.Dir: it
// makes sure Dir is on XFS (mounting or making its image, see Options),
// creates its directories and deletes leftovers of interrupted snapshots
// and removals. Layers still mounted from a previous run are left alone.
// Errors wrap errdefs.ErrUnavailable when the host cannot run the driver
// (see Supported).
func New(ctx context.Context, opts Options) (*Driver, error) {
	if err := Supported(); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil || opts.Dir == "" {
		return nil, fmt.Errorf("overlay storage directory %q: %w", opts.Dir, errdefs.ErrInvalidArgument)
	}
	size := opts.ImageBytes
	if size <= 0 {
		size = storage.DefaultImageBytes(filepath.Dir(dir))
	}
	vol, err := ensureVolume(dir, size)
	if err != nil {
		return nil, err
	}
	d := &Driver{dir: dir, shift: opts.Shift, vol: vol, maxEntries: opts.MaxSnapshotEntries}
	switch {
	case d.maxEntries == 0:
		d.maxEntries = defaults.MaxSnapshotEntries
	case d.maxEntries < 0:
		d.maxEntries = 0
	}
	// Dir and layers/ must be searchable by the sandboxes' root (the
	// runtime resolves the rootfs path as that user); the rest is the
	// daemon's.
	for _, sub := range []struct {
		name string
		mode os.FileMode
	}{{"", 0o711}, {"layers", 0o711}, {"snapshots", 0o700}, {"templates", 0o700}, {"tmp", 0o700}} {
		p := filepath.Join(dir, sub.name)
		if err := os.Mkdir(p, sub.mode); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create %s: %w", p, err)
		}
		if err := os.Chmod(p, sub.mode); err != nil {
			return nil, fmt.Errorf("chmod %s: %w", p, err)
		}
	}
	unmountViews(d.tmpDir())
	if err := storage.RemoveTree(d.tmpDir()); err != nil {
		return nil, fmt.Errorf("clean %s: %w", d.tmpDir(), err)
	}
	if err := os.Mkdir(d.tmpDir(), 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", d.tmpDir(), err)
	}
	return d, nil
}

// Name returns "overlay".
func (d *Driver) Name() string { return "overlay" }

// ProjectQuotas reports whether disk limits use XFS project quotas
// (false: per-layer ext4 images, see the package comment).
func (d *Driver) ProjectQuotas() bool { return d.vol.ProjectQuota }

// Close releases nothing: layers stay mounted for their running
// sandboxes and the volume stays mounted for them. It returns nil.
func (d *Driver) Close() error { return nil }

// layerDir returns the directory of layer id.
func (d *Driver) layerDir(id string) string { return filepath.Join(d.dir, "layers", id) }

// snapDir returns the directory of snapshot id.
func (d *Driver) snapDir(id string) string { return filepath.Join(d.dir, "snapshots", id) }

// snapLayer returns snapshot id's layer directory (a lower layer).
func (d *Driver) snapLayer(id string) string { return filepath.Join(d.snapDir(id), "layer") }

// templateFile returns the metadata file of template name.
func (d *Driver) templateFile(name string) string {
	return filepath.Join(d.dir, "templates", name+".json")
}

// tmpDir returns the directory of snapshots being made and of removals.
func (d *Driver) tmpDir() string { return filepath.Join(d.dir, "tmp") }

// projectsFile returns the project id allocator's file.
func (d *Driver) projectsFile() string { return filepath.Join(d.dir, "projects.json") }

// layerMetaFile returns the metadata file of the layer in layerDir.
func layerMetaFile(layerDir string) string { return filepath.Join(layerDir, "meta.json") }

// snapMetaFile returns the metadata file of the snapshot in snapDir.
func snapMetaFile(snapDir string) string { return filepath.Join(snapDir, "meta.json") }

// templateWhat, snapWhat and layerWhat name an object in errors.
func templateWhat(name string) string { return fmt.Sprintf("template %q", name) }

// snapWhat: see templateWhat.
func snapWhat(id string) string { return fmt.Sprintf("snapshot %q", id) }

// layerWhat: see templateWhat.
func layerWhat(id string) string { return fmt.Sprintf("layer %q", id) }

// readSnap returns snapshot id's metadata (ErrNotFound when there is no
// such snapshot).
func (d *Driver) readSnap(id string) (snapMeta, error) {
	var m snapMeta
	err := storage.ReadJSON(snapMetaFile(d.snapDir(id)), &m, snapWhat(id))
	return m, err
}

// AddTemplate records the template rootfs (an existing directory, used in
// place as the lowest layer; it must stay there while layers or
// snapshots use it) under name with version. The same name and version
// again does nothing; another version replaces the record for later
// Prepares. Errors: ErrInvalidArgument for a bad name or a rootfs that is
// not a directory.
func (d *Driver) AddTemplate(ctx context.Context, name, rootfs, version string) error {
	if err := storage.ValidID("template", name); err != nil {
		return err
	}
	abs, err := filepath.Abs(rootfs)
	if err != nil {
		return fmt.Errorf("template rootfs %q: %w", rootfs, errdefs.ErrInvalidArgument)
	}
	if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
		return fmt.Errorf("template rootfs %s is not a directory: %w", abs, errdefs.ErrInvalidArgument)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var old templateMeta
	if storage.ReadJSON(d.templateFile(name), &old, templateWhat(name)) == nil && old.Version == version && old.Rootfs == abs {
		return nil
	}
	return storage.WriteJSON(d.templateFile(name), templateMeta{Rootfs: abs, Version: version, CreatedAt: time.Now().UTC()}, 0o600)
}

// RemoveTemplate forgets template name (its rootfs is the caller's; layers
// and snapshots built on it keep using it). An unknown name is not an
// error.
func (d *Driver) RemoveTemplate(ctx context.Context, name string) error {
	if err := storage.ValidID("template", name); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := os.Remove(d.templateFile(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove template %q: %w", name, err)
	}
	return nil
}

// Layers returns the ids of every layer directory on disk (including
// ones a crash left half made, so the daemon removes them), sorted.
func (d *Driver) Layers(ctx context.Context) ([]string, error) {
	return listIDs(filepath.Join(d.dir, "layers"), "")
}

// Snapshots returns the ids of every snapshot on disk, sorted.
func (d *Driver) Snapshots(ctx context.Context) ([]string, error) {
	return listIDs(filepath.Join(d.dir, "snapshots"), "")
}

// allocProject returns a fresh XFS project id from the persistent
// counter in Dir/projects.json (ids are never handed out twice, so a
// crash halfway through a removal cannot leave a live layer sharing a
// project with leftovers). The caller holds d.mu.
func (d *Driver) allocProject() (uint32, error) {
	var p projectsMeta
	if err := storage.ReadJSON(d.projectsFile(), &p, "project ids"); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return 0, err
	}
	if p.Next == 0 {
		p.Next = 1
	}
	id := p.Next
	p.Next++
	if err := storage.WriteJSON(d.projectsFile(), p, 0o600); err != nil {
		return 0, err
	}
	return id, nil
}
