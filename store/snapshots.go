package store

import (
	"context"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

const snapshotColumns = `id, session_id, parent, template, storage, size_bytes, digest, created_at, expires_at, name, memory_driver, memory_digest, memory_bytes, tenant, provisional, memory_replicated_at`

// CreateSnapshot inserts sn; ErrConflict when the id exists.
func (s *Store) CreateSnapshot(ctx context.Context, sn *node.Snapshot) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO snapshots (`+snapshotColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sn.ID, sn.SessionID, sn.Parent, sn.Template, sn.Storage, sn.SizeBytes, sn.Digest, ms(sn.CreatedAt), ms(sn.ExpiresAt), sn.Name,
		sn.MemoryDriver, sn.MemoryDigest, sn.MemoryBytes, sn.Tenant, sn.Provisional, ms(sn.MemoryReplicatedAt))
	if isUniqueViolation(err) {
		return errdefs.Newf(errdefs.ErrConflict, "snapshot %s exists", sn.ID)
	}
	return err
}

// GetSnapshot returns snapshot id; ErrNotFound when absent.
func (s *Store) GetSnapshot(ctx context.Context, id string) (*node.Snapshot, error) {
	sn, err := scanSnapshot(s.db.QueryRowContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots WHERE id = ?`, id))
	return sn, notFound(err, fmt.Sprintf("snapshot %q", id))
}

// GetSnapshotByName returns tenant's newest snapshot named name (names
// are per tenant); ErrNotFound when none is.
func (s *Store) GetSnapshotByName(ctx context.Context, tenant, name string) (*node.Snapshot, error) {
	sn, err := scanSnapshot(s.db.QueryRowContext(ctx, `SELECT `+snapshotColumns+
		` FROM snapshots WHERE name = ? AND name != '' AND tenant = ? ORDER BY created_at DESC, id LIMIT 1`, name, tenant))
	return sn, notFound(err, fmt.Sprintf("snapshot named %q", name))
}

// ListSnapshots returns every snapshot, newest first.
func (s *Store) ListSnapshots(ctx context.Context) ([]*node.Snapshot, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots ORDER BY created_at DESC, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*node.Snapshot
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
	sessions, err = s.ids(ctx, `SELECT id FROM sessions WHERE snapshot = ? AND state != ? ORDER BY id`, id, node.StateTerminated)
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

// SetMemoryReplicated records that snapshot id's sealed memory checkpoint
// was copied to the fleet's object store at at. ErrNotFound when there is
// no such snapshot (deleted meanwhile).
func (s *Store) SetMemoryReplicated(ctx context.Context, id string, at time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE snapshots SET memory_replicated_at = ? WHERE id = ?`, ms(at), id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.Newf(errdefs.ErrNotFound, "snapshot %q", id)
	}
	return nil
}

// SetMemorySealed records snapshot id's sealed memory checkpoint: the
// digest of its manifest (seal.SealDir's) and its plaintext size in bytes.
// Until then the snapshot's memory is being sealed (node.Snapshot.Sealing).
// ErrNotFound when there is no such snapshot.
func (s *Store) SetMemorySealed(ctx context.Context, id, digest string, bytes int64) error {
	res, err := s.db.ExecContext(ctx, `UPDATE snapshots SET memory_digest = ?, memory_bytes = ? WHERE id = ?`, digest, bytes, id)
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

func scanSnapshot(r scanner) (*node.Snapshot, error) {
	var sn node.Snapshot
	var created, expires, replicated int64
	if err := r.Scan(&sn.ID, &sn.SessionID, &sn.Parent, &sn.Template, &sn.Storage, &sn.SizeBytes, &sn.Digest,
		&created, &expires, &sn.Name, &sn.MemoryDriver, &sn.MemoryDigest, &sn.MemoryBytes, &sn.Tenant, &sn.Provisional, &replicated); err != nil {
		return nil, err
	}
	sn.CreatedAt, sn.ExpiresAt, sn.MemoryReplicatedAt = fromMS(created), fromMS(expires), fromMS(replicated)
	return &sn, nil
}

// PutPool inserts or replaces pool p.
func (s *Store) PutPool(ctx context.Context, p *node.Pool) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO pools (template, size, cpu, memory_mb, pids, disk_mb) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT(template) DO UPDATE SET size = excluded.size, cpu = excluded.cpu, memory_mb = excluded.memory_mb,
		pids = excluded.pids, disk_mb = excluded.disk_mb`, p.Template, p.Size, p.CPU, p.MemoryMB, p.Pids, p.DiskMB)
	return err
}

// ListPools returns every pool configuration, by template.
func (s *Store) ListPools(ctx context.Context) ([]*node.Pool, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT template, size, cpu, memory_mb, pids, disk_mb FROM pools ORDER BY template`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*node.Pool
	for rows.Next() {
		var p node.Pool
		if err := rows.Scan(&p.Template, &p.Size, &p.CPU, &p.MemoryMB, &p.Pids, &p.DiskMB); err != nil {
			return nil, err
		}
		out = append(out, &p)
	}
	return out, rows.Err()
}
