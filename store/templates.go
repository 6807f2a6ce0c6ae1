package store

import (
	"context"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// TemplateRecord lists a template in the database. The template's files and
// full metadata live in the data directory (package storage); this row
// makes templates listable and reserves names.
type TemplateRecord struct {
	Name      string
	Source    string
	Digest    string
	SizeBytes int64
	CreatedAt time.Time
	// Tenant owns the template; "" for a shared one every tenant sees.
	Tenant string
}

// PutTemplate inserts or replaces the record for t.Name.
func (s *Store) PutTemplate(ctx context.Context, t *TemplateRecord) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO templates (name, source, digest, size_bytes, created_at, tenant)
		VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET source = excluded.source,
		digest = excluded.digest, size_bytes = excluded.size_bytes, created_at = excluded.created_at,
		tenant = excluded.tenant`,
		t.Name, t.Source, t.Digest, t.SizeBytes, ms(t.CreatedAt), t.Tenant)
	return err
}

// GetTemplate returns the record named name; ErrNotFound when absent.
func (s *Store) GetTemplate(ctx context.Context, name string) (*TemplateRecord, error) {
	var t TemplateRecord
	var created int64
	err := s.db.QueryRowContext(ctx, `SELECT name, source, digest, size_bytes, created_at, tenant FROM templates WHERE name = ?`, name).
		Scan(&t.Name, &t.Source, &t.Digest, &t.SizeBytes, &created, &t.Tenant)
	if err != nil {
		return nil, notFound(err, fmt.Sprintf("template %q", name))
	}
	t.CreatedAt = fromMS(created)
	return &t, nil
}

// ListTemplates returns every template record by name.
func (s *Store) ListTemplates(ctx context.Context) ([]*TemplateRecord, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, source, digest, size_bytes, created_at, tenant FROM templates ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*TemplateRecord
	for rows.Next() {
		var t TemplateRecord
		var created int64
		if err := rows.Scan(&t.Name, &t.Source, &t.Digest, &t.SizeBytes, &created, &t.Tenant); err != nil {
			return nil, err
		}
		t.CreatedAt = fromMS(created)
		out = append(out, &t)
	}
	return out, rows.Err()
}

// DeleteTemplate removes the record named name; ErrNotFound when absent.
func (s *Store) DeleteTemplate(ctx context.Context, name string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM templates WHERE name = ?`, name)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.Newf(errdefs.ErrNotFound, "template %q", name)
	}
	return nil
}
