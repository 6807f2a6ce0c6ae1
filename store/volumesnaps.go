package store

import (
	"context"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// VolumeSnapshotRow is a volume snapshot as stored (migration 16). The
// storage driver's snapshot of the volume's layer is named by package
// volume from ID.
type VolumeSnapshotRow struct {
	ID     string
	Tenant string
	// Name is the caller's name for it ("" for none; unique per tenant).
	Name string
	// Volume is the volume it was taken of (which may be gone since).
	Volume string
	// SizeMB is that volume's quota when it was taken, in MiB.
	SizeMB int64
	// SizeBytes is what the volume held, in bytes.
	SizeBytes int64
	// SessionSnapshot is the session snapshot it belongs to ("" for a
	// volume's own snapshot); Path where that session mounted the volume.
	SessionSnapshot string
	Path            string
	// ReadOnly marks a session snapshot's read-only mount: recorded so
	// that its sessions mount the same volume again; it holds no data.
	ReadOnly  bool
	CreatedAt time.Time
}

const volumeSnapshotColumns = `id, tenant, name, volume, size_mb, size_bytes, session_snapshot, path, read_only, created_at`

// CreateVolumeSnapshot inserts v. ErrConflict when the id, or the name for
// its tenant, is taken.
func (s *Store) CreateVolumeSnapshot(ctx context.Context, v VolumeSnapshotRow) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO volume_snapshots (`+volumeSnapshotColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		v.ID, v.Tenant, v.Name, v.Volume, v.SizeMB, v.SizeBytes, v.SessionSnapshot, v.Path, v.ReadOnly, ms(v.CreatedAt))
	if isUniqueViolation(err) {
		if v.Name != "" {
			return errdefs.Newf(errdefs.ErrConflict, "a volume snapshot named %q exists", v.Name)
		}
		return errdefs.Newf(errdefs.ErrConflict, "volume snapshot %s exists", v.ID)
	}
	return err
}

// GetVolumeSnapshot returns tenant's volume snapshot ref: its id, or
// else its name. ErrNotFound when tenant has none.
func (s *Store) GetVolumeSnapshot(ctx context.Context, tenant, ref string) (*VolumeSnapshotRow, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+volumeSnapshotColumns+` FROM volume_snapshots
		WHERE tenant = ? AND (id = ? OR (name = ? AND name != '')) ORDER BY id = ? DESC LIMIT 1`, tenant, ref, ref, ref)
	v, err := scanVolumeSnapshot(row)
	return v, notFound(err, fmt.Sprintf("volume snapshot %q", ref))
}

// ListVolumeSnapshots returns the volume snapshots of tenant ("" for
// every tenant's) taken of volume ("" for every volume), oldest first;
// with ownOnly, only volumes' own snapshots (not sessions' snapshots').
func (s *Store) ListVolumeSnapshots(ctx context.Context, tenant, volume string, ownOnly bool) ([]*VolumeSnapshotRow, error) {
	return s.volumeSnapshots(ctx, `(? = '' OR tenant = ?) AND (? = '' OR volume = ?) AND (? = 0 OR session_snapshot = '')`,
		tenant, tenant, volume, volume, ownOnly)
}

// SessionSnapshotVolumes returns the volume mounts session snapshot id
// recorded, in the order the session listed them.
func (s *Store) SessionSnapshotVolumes(ctx context.Context, id string) ([]*VolumeSnapshotRow, error) {
	return s.volumeSnapshots(ctx, `session_snapshot = ? AND session_snapshot != ''`, id)
}

func (s *Store) volumeSnapshots(ctx context.Context, where string, args ...any) ([]*VolumeSnapshotRow, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+volumeSnapshotColumns+` FROM volume_snapshots WHERE `+where+
		` ORDER BY created_at, rowid`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*VolumeSnapshotRow
	for rows.Next() {
		v, err := scanVolumeSnapshot(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// DeleteVolumeSnapshot removes volume snapshot id's row; a missing one is
// fine.
func (s *Store) DeleteVolumeSnapshot(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM volume_snapshots WHERE id = ?`, id)
	return err
}

// TenantSnapshotCount counts what tenant's max_snapshots bounds: its
// session snapshots and its volumes' own snapshots (those a session
// snapshot captured are part of that one).
func (s *Store) TenantSnapshotCount(ctx context.Context, tenant string) (int, error) {
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM snapshots WHERE tenant = ?) +
		(SELECT COUNT(*) FROM volume_snapshots WHERE tenant = ? AND session_snapshot = '')`, tenant, tenant).Scan(&n)
	return n, err
}

// HasVolumeSnapshot reports whether a row names volume snapshot id.
func (s *Store) HasVolumeSnapshot(ctx context.Context, id string) (bool, error) {
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM volume_snapshots WHERE id = ?`, id).Scan(&n)
	return n > 0, err
}

func scanVolumeSnapshot(r scanner) (*VolumeSnapshotRow, error) {
	var v VolumeSnapshotRow
	var created int64
	if err := r.Scan(&v.ID, &v.Tenant, &v.Name, &v.Volume, &v.SizeMB, &v.SizeBytes, &v.SessionSnapshot, &v.Path,
		&v.ReadOnly, &created); err != nil {
		return nil, err
	}
	v.CreatedAt = fromMS(created)
	return &v, nil
}
