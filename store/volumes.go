package store

import (
	"context"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// VolumeRow is a volume as stored: LayerID names its storage layer.
type VolumeRow struct {
	Tenant    string
	Name      string
	LayerID   string
	SizeMB    int64
	CreatedAt time.Time
	// Session is the session this volume is the copy of a snapshot's
	// volume for ("" for a volume the tenant made): it is removed when
	// that session ends.
	Session string
}

// CreateVolume inserts v. ErrConflict when the tenant has a volume of that
// name (or the layer id is taken).
func (s *Store) CreateVolume(ctx context.Context, v VolumeRow) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO volumes (tenant, name, layer_id, size_mb, created_at, session) VALUES (?, ?, ?, ?, ?, ?)`,
		v.Tenant, v.Name, v.LayerID, v.SizeMB, ms(v.CreatedAt), v.Session)
	if isUniqueViolation(err) {
		return errdefs.Newf(errdefs.ErrConflict, "volume %q already exists", v.Name)
	}
	return err
}

// GetVolume returns tenant's volume name; ErrNotFound when there is none.
func (s *Store) GetVolume(ctx context.Context, tenant, name string) (*VolumeRow, error) {
	row := s.db.QueryRowContext(ctx, `SELECT tenant, name, layer_id, size_mb, created_at, session FROM volumes WHERE tenant = ? AND name = ?`,
		tenant, name)
	v, err := scanVolume(row)
	return v, notFound(err, fmt.Sprintf("volume %q", name))
}

// ListVolumes returns tenant's volumes ("" for every tenant's), by name.
func (s *Store) ListVolumes(ctx context.Context, tenant string) ([]*VolumeRow, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT tenant, name, layer_id, size_mb, created_at, session FROM volumes
		WHERE ? = '' OR tenant = ? ORDER BY tenant, name`, tenant, tenant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*VolumeRow
	for rows.Next() {
		v, err := scanVolume(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// DeleteVolume removes tenant's volume name's row; a missing one is fine.
func (s *Store) DeleteVolume(ctx context.Context, tenant, name string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM volumes WHERE tenant = ? AND name = ?`, tenant, name)
	return err
}

func scanVolume(r scanner) (*VolumeRow, error) {
	var v VolumeRow
	var created int64
	if err := r.Scan(&v.Tenant, &v.Name, &v.LayerID, &v.SizeMB, &created, &v.Session); err != nil {
		return nil, err
	}
	v.CreatedAt = fromMS(created)
	return &v, nil
}
