package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// DefaultTenant owns everything made before tenants existed and is the
// tenant of the install's own API key.
const DefaultTenant = "default"

// Tenant is one tenant's record.
type Tenant struct {
	Name string
	// Policy is the tenant's policy as JSON (api/v1.TenantPolicy); the
	// store keeps it opaque.
	Policy    string
	CreatedAt time.Time
	// FlaggedAt, when not zero, is when the abuse detector flagged the
	// tenant, for FlagReason.
	FlaggedAt  time.Time
	FlagReason string
}

// CreateTenant inserts t; ErrConflict when the name is taken, also by a
// deleted tenant (whose sessions, snapshots and audit records still carry
// the name: a new tenant must not inherit them).
func (s *Store) CreateTenant(ctx context.Context, t *Tenant) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO tenants (name, policy, created_at) VALUES (?, ?, ?)`,
		t.Name, t.Policy, ms(t.CreatedAt))
	if isUniqueViolation(err) {
		return errdefs.Newf(errdefs.ErrConflict, "tenant name %q is taken (names of deleted tenants are never reused)", t.Name)
	}
	if err == nil {
		s.notify(ChangeTenant, t.Name)
	}
	return err
}

const tenantColumns = `name, policy, created_at, flagged_at, flag_reason`

func scanTenant(r scanner) (*Tenant, error) {
	var t Tenant
	var created, flagged int64
	if err := r.Scan(&t.Name, &t.Policy, &created, &flagged, &t.FlagReason); err != nil {
		return nil, err
	}
	t.CreatedAt, t.FlaggedAt = fromMS(created), fromMS(flagged)
	return &t, nil
}

// GetTenant returns tenant name; ErrNotFound when there is none.
func (s *Store) GetTenant(ctx context.Context, name string) (*Tenant, error) {
	t, err := scanTenant(s.db.QueryRowContext(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE name = ? AND deleted_at = 0`, name))
	return t, notFound(err, fmt.Sprintf("tenant %q", name))
}

// ListTenants returns every tenant by name.
func (s *Store) ListTenants(ctx context.Context) ([]*Tenant, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE deleted_at = 0 ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Tenant
	for rows.Next() {
		t, err := scanTenant(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// SetTenantPolicy replaces tenant name's policy (JSON). ErrNotFound for an
// unknown tenant.
func (s *Store) SetTenantPolicy(ctx context.Context, name, policy string) error {
	return s.updateTenant(ctx, name, `UPDATE tenants SET policy = ? WHERE name = ? AND deleted_at = 0`, policy, name)
}

// FlagTenant marks tenant name as flagged at time at for reason (the
// abuse detector's finding); reason "" clears the flag. ErrNotFound for
// an unknown tenant.
func (s *Store) FlagTenant(ctx context.Context, name, reason string, at time.Time) error {
	if reason == "" {
		at = time.Time{}
	}
	return s.updateTenant(ctx, name, `UPDATE tenants SET flagged_at = ?, flag_reason = ? WHERE name = ? AND deleted_at = 0`,
		ms(at), reason, name)
}

func (s *Store) updateTenant(ctx context.Context, name, q string, args ...any) error {
	res, err := s.db.ExecContext(ctx, q, args...)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.Newf(errdefs.ErrNotFound, "tenant %q", name)
	}
	s.notify(ChangeTenant, name)
	return nil
}

// DeleteTenant marks tenant name deleted and removes its API keys (their
// cached authentications too) and its secrets. Its row, session records and audit
// records stay, and the name is never reused (the caller ends live
// sessions and removes snapshots and templates first). ErrNotFound for an
// unknown or deleted tenant.
func (s *Store) DeleteTenant(ctx context.Context, name string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `UPDATE tenants SET deleted_at = ? WHERE name = ? AND deleted_at = 0`,
		time.Now().UnixMilli(), name)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.Newf(errdefs.ErrNotFound, "tenant %q", name)
	}
	if err := deleteTenantKeys(ctx, tx, name); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	s.forgetKeys()
	s.notify(ChangeTenant, name)
	return nil
}

// UsageDay is the key of tenant_usage: the UTC date of t, "2006-01-02".
func UsageDay(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// AddSessionCPU records that session id (of tenant) has used totalMS
// CPU-milliseconds in all: the part not counted yet is added to the
// tenant's usage for the UTC day of at, in one transaction, so a crash
// counts it once or not at all. It returns the tenant's total for that
// day, in CPU-milliseconds; ErrNotFound for an unknown session.
func (s *Store) AddSessionCPU(ctx context.Context, id, tenant string, totalMS int64, at time.Time) (int64, error) {
	totals, err := s.AddSessionsCPU(ctx, []CPUReading{{Session: id, Tenant: tenant, TotalMS: totalMS, At: at}})
	if err != nil {
		return 0, err
	}
	total, ok := totals[tenant]
	if !ok {
		return 0, errdefs.Newf(errdefs.ErrNotFound, "session %q", id)
	}
	return total, nil
}

// CPUReading is one session's CPU time as the host read it.
type CPUReading struct {
	// Session is the session's id and Tenant its tenant's name.
	Session, Tenant string
	// TotalMS is the CPU the session has used in all, in CPU-milliseconds.
	TotalMS int64
	// At is when it was read; its UTC day is the day the CPU counts for.
	At time.Time
}

// AddSessionsCPU is AddSessionCPU for many sessions in one transaction
// (the host monitor's round: one write instead of one per session). A
// reading of an unknown session (ended and purged meanwhile) is skipped.
// It returns, for the tenant of every reading it counted, the tenant's
// total for the day of its last reading, in CPU-milliseconds.
func (s *Store) AddSessionsCPU(ctx context.Context, readings []CPUReading) (map[string]int64, error) {
	if len(readings) == 0 {
		return map[string]int64{}, nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	days := map[string]string{} // tenant -> the day of its last reading
	for _, r := range readings {
		var counted int64
		err := tx.QueryRowContext(ctx, `SELECT cpu_ms FROM sessions WHERE id = ?`, r.Session).Scan(&counted)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return nil, err
		}
		day := UsageDay(r.At)
		days[r.Tenant] = day
		delta := r.TotalMS - counted
		if delta <= 0 {
			continue
		}
		if _, err := tx.ExecContext(ctx, `UPDATE sessions SET cpu_ms = ? WHERE id = ?`, r.TotalMS, r.Session); err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO tenant_usage (tenant, day, cpu_ms) VALUES (?, ?, ?)
			ON CONFLICT(tenant, day) DO UPDATE SET cpu_ms = cpu_ms + excluded.cpu_ms`, r.Tenant, day, delta); err != nil {
			return nil, err
		}
	}
	totals := make(map[string]int64, len(days))
	for tenant, day := range days {
		var total int64
		err := tx.QueryRowContext(ctx, `SELECT cpu_ms FROM tenant_usage WHERE tenant = ? AND day = ?`, tenant, day).Scan(&total)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return nil, err
		}
		totals[tenant] = total
	}
	return totals, tx.Commit()
}

// TenantCPU returns the CPU-milliseconds tenant used on the UTC day of at.
func (s *Store) TenantCPU(ctx context.Context, tenant string, at time.Time) (int64, error) {
	var total int64
	err := s.db.QueryRowContext(ctx, `SELECT cpu_ms FROM tenant_usage WHERE tenant = ? AND day = ?`,
		tenant, UsageDay(at)).Scan(&total)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return total, err
}
