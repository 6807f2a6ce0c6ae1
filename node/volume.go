package node

import (
	"context"
	"time"
)

// Volume is a tenant's persistent directory: it outlives the sessions that
// mount it and has its own disk quota (SizeMB, in MiB).
type Volume struct {
	Name      string
	Tenant    string
	SizeMB    int64
	CreatedAt time.Time
	// UsedBytes is what its files take, in bytes (0 when unknown).
	UsedBytes int64
	// WriterSession is the session that mounts it read-write ("" for none);
	// ReaderSessions those that mount it read-only.
	WriterSession  string
	ReaderSessions []string
	// Session, when not "", is the session this volume is a copy for
	// (made from a session snapshot's volume when the session started
	// from it); the volume is removed when that session ends.
	Session string
}

// VolumeMount is one volume a session mounts: Name at Path (absolute,
// under /home/user or /mnt), read-only or not.
type VolumeMount struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
	// Snapshot, set only by a create from a session snapshot (never by
	// callers), is the volume snapshot a read-write mount is copied from
	// when the session starts: the copy, a new volume of the session's own,
	// then replaces Name and Snapshot is cleared.
	Snapshot string `json:"snapshot,omitempty"`
}

// Volumes manages the caller's volumes. Every method is scoped to the
// tenant in ctx; another tenant's volume is ErrNotFound.
type Volumes interface {
	// CreateVolume makes volume name of sizeMB MiB, empty, or with from
	// set a copy of the caller's volume snapshot from (its id or name;
	// sizeMB 0: the snapshotted volume's size). ErrConflict when the name
	// is taken; ErrInvalidArgument naming name, size_mb or from.
	CreateVolume(ctx context.Context, name string, sizeMB int64, from string) (*Volume, error)
	// ListVolumes returns the caller's volumes, by name.
	ListVolumes(ctx context.Context) ([]*Volume, error)
	// GetVolume returns volume name.
	GetVolume(ctx context.Context, name string) (*Volume, error)
	// DeleteVolume removes volume name and its files. ErrConflict while a
	// running or paused session mounts it.
	DeleteVolume(ctx context.Context, name string) error
	// SnapshotVolume takes a read-only snapshot of volume name, named
	// snapName ("" for none). ErrNotFound for no such volume; ErrConflict
	// for a taken name.
	SnapshotVolume(ctx context.Context, name, snapName string) (*VolumeSnapshot, error)
	// ListVolumeSnapshots returns volume name's own snapshots, oldest
	// first (also once the volume is gone); name "" lists every volume's.
	ListVolumeSnapshots(ctx context.Context, name string) ([]*VolumeSnapshot, error)
	// DeleteVolumeSnapshot removes volume name's snapshot ref (id or
	// name); volumes made from it keep their data.
	DeleteVolumeSnapshot(ctx context.Context, name, ref string) error
}

// VolumeSnapshot is a read-only snapshot of a volume, taken on its own;
// new volumes are made from it (CreateVolume's from). It outlives the
// volume it was taken of.
type VolumeSnapshot struct {
	ID string
	// Name is the caller's name for it ("" for none; unique per tenant).
	Name string
	// Volume is the volume it was taken of.
	Volume string
	Tenant string
	// SizeMB is that volume's quota then, in MiB: a volume made from it
	// gets it unless another size is given.
	SizeMB int64
	// SizeBytes is what the volume held, in bytes.
	SizeBytes int64
	CreatedAt time.Time
}
