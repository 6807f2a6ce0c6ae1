package storage

import (
	"context"
	"time"
)

// Driver manages sandboxes' root filesystems: one writable layer per
// sandbox over read-only parents (a template, or a chain of snapshots), and
// snapshots of those layers. Two implementations pass the same conformance
// suite (storage/storagetest): storage/btrfs (subvolumes; O(1) snapshots
// and forks) and storage/overlay (overlayfs; a snapshot copies the upper
// directory into a new read-only layer, with reflinks where possible).
//
// Lifecycle of one sandbox: Prepare (from a template or a snapshot) →
// [Snapshot ...] → Remove. Snapshots outlive the sandbox they came from and
// are removed with RemoveSnapshot once nothing depends on them.
//
// A Driver keeps its own metadata on disk (what each layer and snapshot is
// built on), so it survives daemon restarts; the daemon's database keeps the
// API view. Methods are safe for concurrent use on different ids; callers
// serialise calls for one id. Errors wrap errdefs classes: ErrNotFound for
// an unknown template, layer or snapshot; ErrConflict for an existing id or
// a snapshot still depended on; ErrInsufficientStorage when the volume is
// full.
type Driver interface {
	// Name is "btrfs" or "overlay".
	Name() string

	// AddTemplate makes the template rootfs directory available as a base
	// under name. btrfs copies it into a subvolume once (sharing the data
	// when rootfs is on its volume: TemplateStager); overlay uses it in
	// place. version is an opaque string identifying the template's
	// content (the daemon passes its creation time and digest): adding a
	// name again with the same version does nothing, whatever rootfs is
	// (the daemon re-adds every template at start-up, also those whose
	// only copy the driver holds), with another version it replaces the
	// template for later Prepares (layers already built on the old one
	// keep working).
	AddTemplate(ctx context.Context, name, rootfs, version string) error
	// RemoveTemplate forgets template name and frees what AddTemplate made.
	RemoveTemplate(ctx context.Context, name string) error

	// Prepare creates sandbox id's writable layer on top of from and returns
	// the directory to use as its root filesystem (owned by the shifted root,
	// ready to mount as /). quotaBytes > 0 caps the bytes the sandbox can
	// write; past it writes fail with ENOSPC or EDQUOT and the sandbox stays
	// usable. On error nothing of the layer is left.
	Prepare(ctx context.Context, id string, from Source, quotaBytes int64) (rootfs string, err error)
	// Snapshot captures sandbox id's current files as read-only snapshot
	// snapID. The caller freezes the sandbox before the call so that no
	// write is in flight, and may thaw it when captured is called: the
	// driver calls captured (when not nil) as soon as the layer's files are
	// captured, before the work that only reads the snapshot (its digest,
	// which walks every file, flushing, metadata), and does not call it
	// when it fails before that point. The result records the parent (the
	// snapshot the layer was prepared from, or ""), the bytes the snapshot
	// adds over that parent, and the sha256 digest of its contents
	// manifest.
	Snapshot(ctx context.Context, id, snapID string, captured func()) (SnapshotInfo, error)
	// Flush writes sandbox id's pending file data to disk while the
	// sandbox runs (syncfs(2) of the filesystem holding its layer, and so
	// whatever else is pending there), so that a Snapshot right after,
	// with the sandbox frozen, has only what was written since to write:
	// the freeze no longer grows with what the sandbox wrote without
	// syncing. ErrNotFound for an unknown layer.
	Flush(ctx context.Context, id string) error
	// Remove deletes sandbox id's writable layer. Removing a missing layer
	// is not an error.
	Remove(ctx context.Context, id string) error
	// Usage returns the bytes sandbox id's layer holds beyond its parents.
	Usage(ctx context.Context, id string) (int64, error)

	// Verify recomputes snapshot snapID's manifest digest (and those of the
	// snapshots it is built on) and fails with ErrConflict, saying the
	// snapshot failed its integrity check, when one differs from what
	// Snapshot recorded.
	Verify(ctx context.Context, snapID string) error
	// RemoveSnapshot deletes snapshot snapID. ErrConflict while a layer or
	// another snapshot is built on it (for drivers where that matters);
	// a missing snapshot is not an error.
	RemoveSnapshot(ctx context.Context, snapID string) error

	// Layers and Snapshots list the ids the driver has on disk, so the
	// daemon can remove what its database no longer knows.
	Layers(ctx context.Context) ([]string, error)
	Snapshots(ctx context.Context) ([]string, error)

	// Close releases what the driver holds (it does not unmount volumes
	// that running sandboxes use).
	Close() error
}

// TemplateStager is implemented by drivers that keep their own copy of
// every template (btrfs: a read-only subvolume in the driver's volume).
// With it a template is built where the driver keeps it and stored once:
// StageTemplate returns a new empty directory on the driver's volume; the
// caller writes the template's root filesystem into a directory it
// creates inside (dir/rootfs), and passes that to AddTemplate, which
// takes it over without copying its data (on btrfs the copy into the
// subvolume shares the file extents); then the caller removes dir
// (storage.RemoveTree). The driver removes staged directories left by a
// crash when it opens.
type TemplateStager interface {
	StageTemplate(ctx context.Context) (dir string, err error)
}

// Source is what a new writable layer starts from: a template, or a
// snapshot (then Template is ignored).
type Source struct {
	Template string
	Snapshot string
}

// SnapshotInfo describes a snapshot as the driver made it.
type SnapshotInfo struct {
	ID string
	// Parent is the snapshot the sandbox's layer was prepared from ("" when
	// it started from a template).
	Parent string
	// Template is the template at the bottom of the chain.
	Template string
	// SizeBytes is what the snapshot adds over its parent, in bytes.
	SizeBytes int64
	// Digest is "sha256:<hex>" of the snapshot's contents manifest (see
	// ManifestDigest).
	Digest    string
	CreatedAt time.Time
}

// IndependentLayers is implemented by a driver whose layers and snapshots,
// once made, no longer need the snapshot they were made from, so a
// snapshot can be removed while sandboxes made from it run (btrfs: a
// subvolume snapshot shares the extents, not the subvolume). A driver
// without it is assumed to need them (overlay: a snapshot is a lower layer
// of every sandbox and snapshot made from it, and RemoveSnapshot refuses).
type IndependentLayers interface {
	// LayersIndependent reports whether that holds for the driver.
	LayersIndependent() bool
}

// Trees is implemented by drivers that show a layer's or a snapshot's
// whole file tree on the host, as the sandbox sees it, for diffs and
// merges (package storage/changes reads them safely). Both drivers do.
type Trees interface {
	// LayerTree returns the directory that is sandbox id's root
	// filesystem (the one Prepare returned). ErrNotFound for an unknown
	// layer.
	LayerTree(ctx context.Context, id string) (string, error)
	// SnapshotTree returns a directory showing snapshot snapID's whole
	// tree read-only, and release, which the caller calls once done (the
	// directory may be a mount made for the call). ErrNotFound for an
	// unknown snapshot.
	SnapshotTree(ctx context.Context, snapID string) (dir string, release func(), err error)
}

// StableLayers is implemented by a driver whose writable layers are plain
// directories that stay where Prepare put them across daemon restarts
// (btrfs: a subvolume per layer; overlay's root filesystem is a mount that
// does not survive a reboot). Volumes (package volume) need it.
type StableLayers interface {
	// LayerPath returns the directory of layer id (Prepare's result).
	LayerPath(id string) string
}
