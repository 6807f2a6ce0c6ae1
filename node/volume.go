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
}

// VolumeMount is one volume a session mounts: Name at Path (absolute,
// under /home/user or /mnt), read-only or not.
type VolumeMount struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// Volumes manages the caller's volumes. Every method is scoped to the
// tenant in ctx; another tenant's volume is ErrNotFound.
type Volumes interface {
	// CreateVolume makes volume name of sizeMB MiB. ErrConflict when the
	// name is taken; ErrInvalidArgument naming name or size_mb.
	CreateVolume(ctx context.Context, name string, sizeMB int64) (*Volume, error)
	// ListVolumes returns the caller's volumes, by name.
	ListVolumes(ctx context.Context) ([]*Volume, error)
	// GetVolume returns volume name.
	GetVolume(ctx context.Context, name string) (*Volume, error)
	// DeleteVolume removes volume name and its files. ErrConflict while a
	// running or paused session mounts it.
	DeleteVolume(ctx context.Context, name string) error
}
