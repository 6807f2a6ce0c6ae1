package btrfs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/defaults"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// Options configure the driver.
type Options struct {
	// Dir is the driver's directory (DATA/storage/btrfs). If it is not on
	// btrfs, New creates the image file Dir+".img" of ImageBytes
	// (formatted with mkfs.btrfs once) and mounts it at Dir through a loop
	// device; on a later start it mounts the existing image again, or
	// finds it mounted. If Dir is on btrfs already it is used directly;
	// then New turns quotas on for that whole filesystem (the first time,
	// the kernel's rescan of existing data can take a while, and qgroup
	// accounting slows metadata-heavy work on it somewhat).
	Dir string
	// ImageBytes is the image's size in bytes, reserved on the host
	// (storage.DefaultImageBytes when 0).
	ImageBytes int64
	// Shift is the id mapping of sandboxes. Owners are copied from
	// template trees as they are (those are shifted already), so the
	// driver only records it.
	Shift storage.IDShift
	// MaxSnapshotEntries bounds the entries (files, directories, links)
	// a snapshot may hold, counted over its whole tree; a Snapshot past
	// it fails with ErrResourceExhausted. 0 means
	// defaults.MaxSnapshotEntries; negative, no bound.
	MaxSnapshotEntries int64
	// Logger receives the driver's warnings (qgroup accounting lost and
	// rebuilt); nil discards them.
	Logger *slog.Logger
}

// Driver is the btrfs storage.Driver. Under its directory:
//
//	templates/<name>        read-only subvolume holding a copy of the template rootfs
//	templates/<name>.json   its version
//	layers/<id>             a sandbox's writable layer: a writable snapshot of a
//	                        template or snapshot subvolume; this is its rootfs
//	layers/<id>.json        what the layer was prepared from
//	snapshots/<id>          read-only snapshot subvolume of a layer
//	snapshots/<id>.json     parent, template, size, digest, creation time
//
// Disk limits are qgroup limits on a layer's exclusive bytes (see Prepare).
type Driver struct {
	dir     string
	shift   storage.IDShift
	rootFd  int  // Dir, open for filesystem-wide ioctls (quotas, limits)
	mounted bool // New mounted the image (rather than finding btrfs)
	// maxEntries is Options.MaxSnapshotEntries resolved (0: no bound).
	maxEntries int64

	// tmplMu is held for reading while a template is snapshotted and for
	// writing while one is swapped or destroyed; addMu serialises
	// AddTemplate and RemoveTemplate.
	tmplMu sync.RWMutex
	addMu  sync.Mutex

	// metaMu keeps Verify's rewrite of a snapshot's metadata (its stamp)
	// from bringing back the metadata of a snapshot being removed.
	metaMu sync.Mutex

	// stale holds the ids of level-0 qgroups of destroyed subvolumes that
	// the kernel did not let go of yet (see reapQgroups).
	staleMu sync.Mutex
	stale   map[uint64]bool

	// refs caches the referenced bytes of read-only sources (baseref.go).
	refs baseRefs
	// making counts the layer snapshots being made (stage.go).
	making atomic.Int64

	// log receives the accounting watch's warnings (accounting.go).
	log *slog.Logger
	// qgroupDir is the filesystem's qgroups directory in sysfs ("" when
	// the kernel has none).
	qgroupDir string
	// rescanMu serialises rescans; rescans counts them.
	rescanMu sync.Mutex
	rescans  atomic.Int64
	// closing is closed by Close, which then waits for watchers.
	closing   chan struct{}
	closeOnce sync.Once
	watchers  sync.WaitGroup
}

var (
	_ storage.Driver         = (*Driver)(nil)
	_ storage.TemplateStager = (*Driver)(nil)
)

// New opens the btrfs driver in opts.Dir: it makes sure Dir is on btrfs
// (mounting or creating its image, see Options), turns qgroups on (and
// rescans them if the kernel marked them inconsistent), creates the
// templates, layers and snapshots directories, and removes what an
// interrupted operation left behind. Errors wrap ErrInvalidArgument (no
// Dir), ErrUnavailable (btrfs cannot be set up) or ErrInternal.
func New(ctx context.Context, opts Options) (*Driver, error) {
	if opts.Dir == "" {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "btrfs: no directory")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("btrfs: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	size := opts.ImageBytes
	if size <= 0 {
		size = storage.DefaultImageBytes(filepath.Dir(dir))
	}
	mounted, err := ensureFilesystem(dir, size)
	if err != nil {
		return nil, err
	}
	d := &Driver{dir: dir, shift: opts.Shift, rootFd: -1, mounted: mounted, maxEntries: opts.MaxSnapshotEntries,
		log: opts.Logger, closing: make(chan struct{})}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	switch {
	case d.maxEntries == 0:
		d.maxEntries = defaults.MaxSnapshotEntries
	case d.maxEntries < 0:
		d.maxEntries = 0
	}
	for _, sub := range []string{d.templatesDir(), d.layersDir(), d.snapshotsDir()} {
		if err := os.MkdirAll(sub, 0o711); err != nil {
			return nil, fmt.Errorf("btrfs: %w: %w", err, errdefs.ErrInternal)
		}
	}
	if d.rootFd, err = openDir(dir); err != nil {
		return nil, storageErr("open "+dir, err)
	}
	if err := d.startQuotas(ctx); err != nil {
		d.Close()
		return nil, err
	}
	d.qgroupDir = qgroupSysfsDir(d.rootFd) // there once quotas are on
	d.raiseDropThreshold()
	if err := d.cleanup(); err != nil {
		d.Close()
		return nil, err
	}
	d.sweepQgroups()
	d.watchers.Add(1)
	go d.watchAccounting()
	return d, nil
}

// startQuotas enables qgroups on the filesystem and, if their numbers are
// marked inconsistent (or were just enabled over existing data), waits for
// a rescan.
func (d *Driver) startQuotas(ctx context.Context) error {
	before, err := quotaStatus(d.rootFd)
	if err != nil {
		return storageErr("quota status", err)
	}
	if err := enableQuota(d.rootFd); err != nil {
		return fmt.Errorf("btrfs: enable quotas on %s: %w: %w", d.dir, err, errdefs.ErrUnavailable)
	}
	after, err := quotaStatus(d.rootFd)
	if err != nil {
		return storageErr("quota status", err)
	}
	if before == 0 || after&(qgroupStatusBad|qgroupStatusScan) != 0 {
		if err := rescanQuota(d.rootFd); err != nil {
			return storageErr("quota rescan", err)
		}
	}
	return ctx.Err()
}

// Name returns "btrfs".
func (d *Driver) Name() string { return "btrfs" }

// Dir returns the driver's directory (where the btrfs filesystem is).
func (d *Driver) Dir() string { return d.dir }

// templatesDir is the directory of template subvolumes.
func (d *Driver) templatesDir() string { return filepath.Join(d.dir, "templates") }

// layersDir is the directory of layer subvolumes.
func (d *Driver) layersDir() string { return filepath.Join(d.dir, "layers") }

// snapshotsDir is the directory of snapshot subvolumes.
func (d *Driver) snapshotsDir() string { return filepath.Join(d.dir, "snapshots") }

// templatePath is template n's subvolume (n.json beside it).
func (d *Driver) templatePath(n string) string { return filepath.Join(d.templatesDir(), n) }

// layerPath is layer id's subvolume, its rootfs (id.json beside it).
func (d *Driver) layerPath(id string) string { return filepath.Join(d.layersDir(), id) }

// LayerPath returns layer id's directory (storage.StableLayers).
func (d *Driver) LayerPath(id string) string { return d.layerPath(id) }

// snapPath is snapshot id's subvolume (id.json beside it).
func (d *Driver) snapPath(id string) string { return filepath.Join(d.snapshotsDir(), id) }

// Prepare creates sandbox id's layer as a writable snapshot of from (a
// template or a snapshot) and returns its path, which is the rootfs. The
// root directory keeps the owner of the template's rootfs. quotaBytes > 0
// limits the layer's exclusive bytes (qgroup max_excl): data shared with
// the source does not count, what the sandbox writes does, and a write
// past the limit fails with EDQUOT ("Disk quota exceeded"); freeing space
// makes writing possible again (the count updates at the next commit).
// A snapshot of the layer shares everything the layer held, so after one
// the limit applies to what is written since. Errors: ErrInvalidArgument
// (bad id or quota), ErrConflict (id exists), ErrNotFound (unknown
// source), ErrInsufficientStorage.
func (d *Driver) Prepare(ctx context.Context, id string, from storage.Source, quotaBytes int64) (string, error) {
	if err := storage.ValidID("layer", id); err != nil {
		return "", err
	}
	if quotaBytes < 0 {
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "btrfs: negative quota %d", quotaBytes)
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	path := d.layerPath(id)
	if _, err := os.Lstat(path); err == nil {
		return "", errdefs.Newf(errdefs.ErrConflict, "btrfs: layer %q exists", id)
	}
	meta := layerMeta{QuotaBytes: quotaBytes, CreatedAt: time.Now().UTC()}
	var src string
	if from.Snapshot != "" {
		if err := storage.ValidID("snapshot", from.Snapshot); err != nil {
			return "", err
		}
		var sm snapMeta
		if err := storage.ReadJSON(d.snapPath(from.Snapshot)+".json", &sm, fmt.Sprintf("snapshot %q", from.Snapshot)); err != nil {
			return "", err
		}
		meta.Snapshot, meta.Template = from.Snapshot, sm.Template
		meta.Ancestors = append([]string{from.Snapshot}, sm.Ancestors...)
		src = d.snapPath(from.Snapshot)
	} else {
		if err := storage.ValidID("template", from.Template); err != nil {
			return "", err
		}
		d.tmplMu.RLock()
		defer d.tmplMu.RUnlock()
		meta.Template, src = from.Template, d.templatePath(from.Template)
		if !isSubvolumeRoot(src) {
			return "", errdefs.Newf(errdefs.ErrNotFound, "btrfs: template %q", from.Template)
		}
	}
	began := time.Now()
	base, err := d.baseReferenced(src)
	if err != nil {
		return "", err
	}
	counted := time.Now()
	meta.BaseReferenced = base
	// Not synced: a layer does not outlive a host crash (its sandbox dies
	// with the host), and the sync would wait for concurrent snapshots.
	if err := storage.WriteJSONUnsynced(path+".json", &meta, 0o600); err != nil {
		return "", err
	}
	if err := d.snapshotLayer(src, id); err != nil {
		if !errors.Is(err, errdefs.ErrConflict) { // not a layer made meanwhile
			removeFile(path + ".json")
		}
		return "", err
	}
	snapped := time.Now()
	if quotaBytes > 0 {
		// A limit is enforced only while the kernel accounts (accounting.go).
		if _, err := d.ensureAccounting(); err != nil {
			d.destroy(d.layersDir(), id)
			removeFile(path + ".json")
			return "", err
		}
		if err := d.limit(path, quotaBytes); err != nil {
			d.destroy(d.layersDir(), id)
			removeFile(path + ".json")
			return "", err
		}
	}
	d.log.Debug("btrfs layer made", "layer", id, "usage_ms", ms(counted.Sub(began)), "snapshot_ms", ms(snapped.Sub(counted)),
		"limit_ms", ms(time.Since(snapped)))
	return path, nil
}

// ms is d in milliseconds, for log lines.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// limit sets the exclusive-bytes limit of the subvolume at path.
func (d *Driver) limit(path string, bytes int64) error {
	fd, err := openDir(path)
	if err != nil {
		return storageErr("open "+path, err)
	}
	defer unix.Close(fd)
	id, err := subvolumeID(fd)
	if err != nil {
		return storageErr("subvolume id of "+path, err)
	}
	if err := limitExclusive(d.rootFd, id, bytes); err != nil {
		return storageErr(fmt.Sprintf("limit qgroup 0/%d", id), err)
	}
	return nil
}

// Flush writes back the dirty data of the filesystem holding layer id
// and commits its transaction (BTRFS_IOC_SYNC, as syncfs(2) does on
// btrfs): the snapshot ioctl that follows, made while the sandbox is
// frozen, then finds little to write. ErrNotFound for an unknown layer.
func (d *Driver) Flush(ctx context.Context, id string) error {
	if err := storage.ValidID("layer", id); err != nil {
		return err
	}
	fd, err := openDir(d.layerPath(id))
	if err != nil {
		return storageErr("open layer "+id, err)
	}
	defer unix.Close(fd)
	if err := syncFS(fd); err != nil {
		return storageErr("sync", err)
	}
	return ctx.Err()
}

// Remove destroys layer id's subvolume (with everything written in it)
// and its metadata; its qgroup goes with it. A missing layer is not an
// error.
func (d *Driver) Remove(ctx context.Context, id string) error {
	if err := storage.ValidID("layer", id); err != nil {
		return err
	}
	if err := d.destroy(d.layersDir(), id); err != nil {
		return err
	}
	return removeFile(d.layerPath(id) + ".json")
}

// Usage commits the filesystem and returns the bytes layer id holds beyond
// its source: its exclusive bytes plus what its earlier snapshots took
// over (see Snapshot). Data still dirty in the page cache counts once the
// kernel writes it back (within about 30 s, or at the next sync); Usage
// does not force that writeback, which would wait for every sandbox's
// pending writes. ErrNotFound for an unknown layer.
func (d *Driver) Usage(ctx context.Context, id string) (int64, error) {
	if err := storage.ValidID("layer", id); err != nil {
		return 0, err
	}
	var lm layerMeta
	if err := storage.ReadJSON(d.layerPath(id)+".json", &lm, fmt.Sprintf("layer %q", id)); err != nil {
		return 0, err
	}
	u, err := d.usageBytes(d.layerPath(id), false)
	if errors.Is(err, errdefs.ErrNotFound) {
		return 0, errdefs.Newf(errdefs.ErrNotFound, "btrfs: layer %q", id)
	}
	return lm.growth(u), err
}

// Layers returns the ids of the layers on disk.
func (d *Driver) Layers(ctx context.Context) ([]string, error) {
	return listIDs(d.layersDir(), false)
}

// Snapshots returns the ids of the complete snapshots on disk (subvolume
// and metadata).
func (d *Driver) Snapshots(ctx context.Context) ([]string, error) {
	return listIDs(d.snapshotsDir(), true)
}

// Close stops the accounting watch and releases the driver's descriptor.
// The filesystem stays mounted (sandboxes use it); a later New finds it.
func (d *Driver) Close() error {
	d.closeOnce.Do(func() { close(d.closing) })
	d.watchers.Wait()
	if d.rootFd >= 0 {
		err := unix.Close(d.rootFd)
		d.rootFd = -1
		return err
	}
	return nil
}
