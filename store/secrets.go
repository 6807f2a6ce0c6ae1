package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Secret is a stored tenant secret. Sealed is its value as broker.Seal
// returned it; the clear value is never stored.
type Secret struct {
	Tenant    string
	Name      string
	Hosts     []string
	Header    string
	Sealed    []byte
	CreatedAt time.Time
	UpdatedAt time.Time
}

// PutSecret stores sec, replacing a secret of the same tenant and name
// (its created_at is kept). It returns whether one was replaced.
func (s *Store) PutSecret(ctx context.Context, sec Secret) (replaced bool, err error) {
	hosts, err := json.Marshal(sec.Hosts)
	if err != nil {
		return false, err
	}
	now := time.Now().UnixMilli()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	var one int
	err = tx.QueryRowContext(ctx, `SELECT 1 FROM secrets WHERE tenant = ? AND name = ?`, sec.Tenant, sec.Name).Scan(&one)
	replaced = err == nil
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO secrets (tenant, name, hosts, header, sealed, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (tenant, name) DO UPDATE SET hosts = excluded.hosts, header = excluded.header,
			sealed = excluded.sealed, updated_at = excluded.updated_at`,
		sec.Tenant, sec.Name, string(hosts), sec.Header, sec.Sealed, now, now); err != nil {
		return false, err
	}
	return replaced, tx.Commit()
}

const secretColumns = `tenant, name, hosts, header, sealed, created_at, updated_at`

func scanSecret(r scanner) (*Secret, error) {
	var sec Secret
	var hosts string
	var created, updated int64
	if err := r.Scan(&sec.Tenant, &sec.Name, &hosts, &sec.Header, &sec.Sealed, &created, &updated); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(hosts), &sec.Hosts); err != nil {
		return nil, err
	}
	sec.CreatedAt, sec.UpdatedAt = fromMS(created), fromMS(updated)
	return &sec, nil
}

// GetSecret returns tenant's secret name; ErrNotFound naming it when the
// tenant has none of that name (another tenant's secret is not found).
func (s *Store) GetSecret(ctx context.Context, tenant, name string) (*Secret, error) {
	sec, err := scanSecret(s.db.QueryRowContext(ctx, `SELECT `+secretColumns+` FROM secrets WHERE tenant = ? AND name = ?`, tenant, name))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "secret %s", name)
	}
	return sec, err
}

// ListSecrets returns tenant's secrets by name.
func (s *Store) ListSecrets(ctx context.Context, tenant string) ([]*Secret, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+secretColumns+` FROM secrets WHERE tenant = ? ORDER BY name`, tenant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Secret
	for rows.Next() {
		sec, err := scanSecret(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sec)
	}
	return out, rows.Err()
}

// DeleteSecret removes tenant's secret name; ErrNotFound naming it when
// there is none.
func (s *Store) DeleteSecret(ctx context.Context, tenant, name string) error {
	r, err := s.db.ExecContext(ctx, `DELETE FROM secrets WHERE tenant = ? AND name = ?`, tenant, name)
	if err != nil {
		return err
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return errdefs.Newf(errdefs.ErrNotFound, "secret %s", name)
	}
	return nil
}
