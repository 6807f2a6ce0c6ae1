package node

import "time"

// SnapshotOptions are the optional settings of Snapshots.Snapshot.
type SnapshotOptions struct {
	// ExpiresIn > 0 garbage-collects the snapshot after that long.
	ExpiresIn time.Duration
	// Name names the snapshot ("" for none): 1 to 128 bytes of printable
	// ASCII without spaces, not shaped like a snapshot id.
	Name string
	// Memory checkpoints the session's processes and memory too.
	Memory bool
}

// Snapshot is a snapshot's durable record (the storage driver keeps the
// data; this row is the API's view and the dependency graph).
type Snapshot struct {
	ID string
	// SessionID is the session it was taken from.
	SessionID string
	// Parent is the snapshot that session was restored from ("" if none).
	Parent   string
	Template string
	// Storage is the storage driver that holds it.
	Storage string
	// SizeBytes is what it adds over its parent, in bytes.
	SizeBytes int64
	// Digest is "sha256:..." of its contents manifest.
	Digest    string
	CreatedAt time.Time
	// ExpiresAt, when not zero, is when it is garbage-collected.
	ExpiresAt time.Time
	// Name is a caller's name for it ("" for none). Names need not be
	// unique; a lookup by name finds the newest snapshot with it.
	Name string
	// MemoryDriver is the isolation driver that checkpointed the
	// session's processes and memory with its files ("" for a snapshot of
	// files only); sessions restored from it run on that driver.
	MemoryDriver string
	// MemoryDigest is "sha256:..." of the sealed checkpoint's manifest;
	// "" with a MemoryDriver while the checkpoint is still being sealed
	// (Sealing): nothing restores from it until then.
	MemoryDigest string
	// MemoryBytes is the checkpoint's size before sealing, in bytes.
	MemoryBytes int64
	// MemoryReplicatedAt, when not zero, is when the sealed checkpoint
	// was copied (still sealed) to the fleet's object store (package
	// fleet). The snapshot's files are not copied yet.
	MemoryReplicatedAt time.Time
	// Tenant owns the snapshot (its session's tenant).
	Tenant string
	// Provisional marks a snapshot made for a fork that has not answered
	// yet: if the daemon stops before it does, nobody learned the
	// snapshot's id, and the next start reclaims it (see KeepSnapshot).
	Provisional bool
}

// Pool is a warm pool's configuration: Size ready sandboxes of Template
// with these limits (CPU in cores, memory and disk in MiB, tasks).
type Pool struct {
	Template string
	Size     int
	CPU      float64
	MemoryMB int64
	Pids     int64
	DiskMB   int64
}

// Sealing reports whether sn's memory checkpoint is still being sealed
// (taken, answered, not yet encrypted and digested): a restore from it
// waits until it is sealed.
func (sn *Snapshot) Sealing() bool { return sn.MemoryDriver != "" && sn.MemoryDigest == "" }
