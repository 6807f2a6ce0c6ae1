package store

import (
	"context"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

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
	// MemoryDigest is "sha256:..." of the sealed checkpoint's manifest.
	MemoryDigest string
	// MemoryBytes is the checkpoint's size before sealing, in bytes.
	MemoryBytes int64
	// Tenant owns the snapshot (its session's tenant).
	Tenant string
	// Provisional marks a snapshot made for a fork that has not answered
	// yet: if the daemon stops before it does, nobody learned the
	// snapshot's id, and the next start reclaims it (see KeepSnapshot).
	Provisional bool
}

const snapshotColumns = `id, session_id, parent, template, storage, size_bytes, digest, created_at, expires_at, name, memory_driver, memory_digest, memory_bytes, tenant, provisional`

// CreateSnapshot inserts sn; ErrConflict when the id exists.
func (s *Store) CreateSnapshot(ctx context.Context, sn *Snapshot) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO snapshots (`+snapshotColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sn.ID, sn.SessionID, sn.Parent, sn.Template, sn.Storage, sn.SizeBytes, sn.Digest, ms(sn.CreatedAt), ms(sn.ExpiresAt), sn.Name,
		sn.MemoryDriver, sn.MemoryDigest, sn.MemoryBytes, sn.Tenant, sn.Provisional)
	if isUniqueViolation(err) {
		return errdefs.Newf(errdefs.ErrConflict, "snapshot %s exists", sn.ID)
	}
	return err
}

// GetSnapshot returns snapshot id; ErrNotFound when absent.
func (s *Store) GetSnapshot(ctx context.Context, id string) (*Snapshot, error) {
	sn, err := scanSnapshot(s.db.QueryRowContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots WHERE id = ?`, id))
	return sn, notFound(err, fmt.Sprintf("snapshot %q", id))
}

// GetSnapshotByName returns tenant's newest snapshot named name (names
// are per tenant); ErrNotFound when none is.
func (s *Store) GetSnapshotByName(ctx context.Context, tenant, name string) (*Snapshot, error) {
	sn, err := scanSnapshot(s.db.QueryRowContext(ctx, `SELECT `+snapshotColumns+
		` FROM snapshots WHERE name = ? AND name != '' AND tenant = ? ORDER BY created_at DESC, id LIMIT 1`, name, tenant))
	return sn, notFound(err, fmt.Sprintf("snapshot named %q", name))
}

// ListSnapshots returns every snapshot, newest first.
func (s *Store) ListSnapshots(ctx context.Context) ([]*Snapshot, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots ORDER BY created_at DESC, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Snapshot
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sn)
	}
	return out, rows.Err()
}

// SnapshotDependents returns the ids of the snapshots whose parent is id
// and of the sessions restored from it that have not ended.
func (s *Store) SnapshotDependents(ctx context.Context, id string) (children, sessions []string, err error) {
	if children, err = s.ids(ctx, `SELECT id FROM snapshots WHERE parent = ? ORDER BY id`, id); err != nil {
		return nil, nil, err
	}
	sessions, err = s.ids(ctx, `SELECT id FROM sessions WHERE snapshot = ? AND state != ? ORDER BY id`, id, StateTerminated)
	return children, sessions, err
}

func (s *Store) ids(ctx context.Context, q string, args ...any) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// KeepSnapshot makes snapshot id permanent (no longer provisional): its
// fork answered. ErrNotFound when there is no such snapshot.
func (s *Store) KeepSnapshot(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `UPDATE snapshots SET provisional = 0 WHERE id = ?`, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.Newf(errdefs.ErrNotFound, "snapshot %q", id)
	}
	return nil
}

// ExpireSnapshot makes snapshot id permanent and sets it to expire at at
// (sooner, if it expires sooner already), so that the janitor deletes it
// once nothing uses it: for the snapshot of an interrupted fork whose
// sessions still run. ErrNotFound when there is no such snapshot.
func (s *Store) ExpireSnapshot(ctx context.Context, id string, at time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE snapshots SET provisional = 0,
		expires_at = CASE WHEN expires_at != 0 AND expires_at < ? THEN expires_at ELSE ? END WHERE id = ?`,
		ms(at), ms(at), id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.Newf(errdefs.ErrNotFound, "snapshot %q", id)
	}
	return nil
}

// DeleteSnapshot removes snapshot id's row; a missing row is fine.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, id)
	return err
}

func scanSnapshot(r scanner) (*Snapshot, error) {
	var sn Snapshot
	var created, expires int64
	if err := r.Scan(&sn.ID, &sn.SessionID, &sn.Parent, &sn.Template, &sn.Storage, &sn.SizeBytes, &sn.Digest,
		&created, &expires, &sn.Name, &sn.MemoryDriver, &sn.MemoryDigest, &sn.MemoryBytes, &sn.Tenant, &sn.Provisional); err != nil {
		return nil, err
	}
	sn.CreatedAt, sn.ExpiresAt = fromMS(created), fromMS(expires)
	return &sn, nil
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

// PutPool inserts or replaces pool p.
func (s *Store) PutPool(ctx context.Context, p *Pool) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO pools (template, size, cpu, memory_mb, pids, disk_mb) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT(template) DO UPDATE SET size = excluded.size, cpu = excluded.cpu, memory_mb = excluded.memory_mb,
		pids = excluded.pids, disk_mb = excluded.disk_mb`, p.Template, p.Size, p.CPU, p.MemoryMB, p.Pids, p.DiskMB)
	return err
}

// ListPools returns every pool configuration, by template.
func (s *Store) ListPools(ctx context.Context) ([]*Pool, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT template, size, cpu, memory_mb, pids, disk_mb FROM pools ORDER BY template`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Pool
	for rows.Next() {
		var p Pool
		if err := rows.Scan(&p.Template, &p.Size, &p.CPU, &p.MemoryMB, &p.Pids, &p.DiskMB); err != nil {
			return nil, err
		}
		out = append(out, &p)
	}
	return out, rows.Err()
}
