package v1

import "time"

// VolumeRequest creates a volume (POST /v1/volumes).
type VolumeRequest struct {
	// Name is 1-63 characters of [a-z0-9._-], starting with a letter or
	// digit; unique among the tenant's volumes.
	Name string `json:"name"`
	// SizeMB is the volume's disk quota in MiB (1 to 1 048 576): writes
	// past it fail with "Disk quota exceeded" inside the sandbox. With
	// From, 0 (or absent) takes the snapshotted volume's.
	SizeMB int64 `json:"size_mb"`
	// From, when set, makes the volume a writable copy of the tenant's
	// volume snapshot From (its id or name; POST
	// /v1/volumes/{name}/snapshots), instantly (a btrfs snapshot).
	From string `json:"from,omitempty"`
}

// VolumeSnapshotRequest snapshots a volume (POST
// /v1/volumes/{name}/snapshots); the body may be empty.
type VolumeSnapshotRequest struct {
	// Name names the snapshot ("" for none): a volume name's rules,
	// unique among the tenant's volume snapshots.
	Name string `json:"name,omitempty"`
}

// VolumeSnapshot is a volume's read-only snapshot as the API shows it.
type VolumeSnapshot struct {
	ID     string `json:"id"`
	Name   string `json:"name,omitempty"`
	Volume string `json:"volume"`
	// SizeMB is the volume's quota when it was taken (a volume made from
	// it gets it unless size_mb is given), in MiB.
	SizeMB int64 `json:"size_mb"`
	// SizeBytes is what the volume held, in bytes.
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
}

// VolumeSnapshotList is the body of GET /v1/volumes/{name}/snapshots.
type VolumeSnapshotList struct {
	Snapshots []VolumeSnapshot `json:"snapshots"`
}

// Volume is a volume as the API shows it.
type Volume struct {
	Name      string    `json:"name"`
	SizeMB    int64     `json:"size_mb"`
	UsedBytes int64     `json:"used_bytes"`
	CreatedAt time.Time `json:"created_at"`
	// WriterSession mounts it read-write ("" for none); ReaderSessions
	// read-only.
	WriterSession  string   `json:"writer_session,omitempty"`
	ReaderSessions []string `json:"reader_sessions,omitempty"`
	// Session, when set, is the session this volume is a copy for (made
	// when it started from a session snapshot that captured a volume); the
	// volume is removed when that session ends.
	Session string `json:"session,omitempty"`
}

// VolumeList is the body of GET /v1/volumes.
type VolumeList struct {
	Volumes []Volume `json:"volumes"`
}

// VolumeMount mounts a volume into a session (CreateRequest.Volumes).
type VolumeMount struct {
	// Name is the tenant's volume.
	Name string `json:"name"`
	// Path is where it appears: an absolute, clean path below /home/user
	// or /mnt (never over a system path such as /usr, /etc or /proc).
	Path string `json:"path"`
	// ReadOnly mounts it read-only. A volume is mounted read-write by one
	// running or paused session at a time (a second: 409); read-only by
	// any number.
	ReadOnly bool `json:"read_only,omitempty"`
}
