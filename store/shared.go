package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// The records a fleet shares (package fleetstate): tenants and API keys.
// Every change this store makes to one is reported to the function set
// with OnChange, after its transaction committed; changes another host
// made arrive through ApplyTenant and ApplyAPIKey, which report nothing.

// Change names a shared record this store changed.
type Change struct {
	// Kind is ChangeTenant or ChangeKey.
	Kind string
	// Name is the tenant's name or the key's id.
	Name string
}

// Kinds of Change.
const (
	ChangeTenant = "tenant"
	ChangeKey    = "key"
)

// OnChange sets the function told of every change to a tenant (created,
// policy set, flagged, deleted) or an API key (added, revoked) made
// through this store; nil tells nobody. fn runs on the changing
// goroutine, after the change committed, and must not block. Set it
// before the store serves requests.
func (s *Store) OnChange(fn func(Change)) {
	s.changed = fn
}

// OnAudit sets the function told that audit records were appended
// (after their commit); nil tells nobody. fn must not block.
func (s *Store) OnAudit(fn func()) {
	s.audited = fn
}

func (s *Store) notify(kind, name string) {
	if fn := s.changed; fn != nil {
		fn(Change{Kind: kind, Name: name})
	}
}

// SharedTenant is a tenant's whole record as hosts share it, deleted
// ones included (a deletion is a tombstone that wins over any other
// version: a deleted name is never used again).
type SharedTenant struct {
	Name       string    `json:"name"`
	Policy     string    `json:"policy"`
	CreatedAt  time.Time `json:"created_at"`
	FlaggedAt  time.Time `json:"flagged_at,omitzero"`
	FlagReason string    `json:"flag_reason,omitempty"`
	DeletedAt  time.Time `json:"deleted_at,omitzero"`
}

// SharedKey is an API key's record as hosts share it: the SHA-256 of its
// secret (HashKey), never the secret. A revocation wins over any other
// version: a revoked key never authenticates again.
type SharedKey struct {
	ID        string    `json:"id"`
	Hash      string    `json:"hash"`
	Name      string    `json:"name,omitempty"`
	Tenant    string    `json:"tenant"`
	Admin     bool      `json:"admin,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
}

// SharedTenants returns every tenant's record, deleted ones included.
func (s *Store) SharedTenants(ctx context.Context) ([]SharedTenant, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, policy, created_at, flagged_at, flag_reason, deleted_at FROM tenants ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SharedTenant
	for rows.Next() {
		t, err := scanSharedTenant(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// SharedTenant returns tenant name's record, also when deleted;
// ErrNotFound when there never was one.
func (s *Store) SharedTenant(ctx context.Context, name string) (SharedTenant, error) {
	t, err := scanSharedTenant(s.db.QueryRowContext(ctx,
		`SELECT name, policy, created_at, flagged_at, flag_reason, deleted_at FROM tenants WHERE name = ?`, name))
	return t, notFound(err, fmt.Sprintf("tenant %q", name))
}

func scanSharedTenant(r scanner) (SharedTenant, error) {
	var t SharedTenant
	var created, flagged, deleted int64
	if err := r.Scan(&t.Name, &t.Policy, &created, &flagged, &t.FlagReason, &deleted); err != nil {
		return SharedTenant{}, err
	}
	t.CreatedAt, t.FlaggedAt, t.DeletedAt = fromMS(created), fromMS(flagged), fromMS(deleted)
	return t, nil
}

// ApplyTenant makes this store's record of t.Name t, as another host
// changed it: inserted when missing, else policy and flag replaced. A
// record deleted here stays deleted whatever t says; t deleted deletes
// it here (its keys and secrets with it, as DeleteTenant): deleted
// reports that this call did, so the caller ends the tenant's sessions
// here. It reports no Change. Applying the same record twice changes
// nothing.
func (s *Store) ApplyTenant(ctx context.Context, t SharedTenant) (deleted bool, err error) {
	if t.Name == "" {
		return false, errdefs.InvalidField("name", "a shared tenant record needs a name")
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	var deletedAt int64
	err = tx.QueryRowContext(ctx, `SELECT deleted_at FROM tenants WHERE name = ?`, t.Name).Scan(&deletedAt)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		_, err = tx.ExecContext(ctx, `INSERT INTO tenants (name, policy, created_at, flagged_at, flag_reason, deleted_at)
			VALUES (?, ?, ?, ?, ?, ?)`, t.Name, t.Policy, ms(t.CreatedAt), ms(t.FlaggedAt), t.FlagReason, ms(t.DeletedAt))
		if err == nil && !t.DeletedAt.IsZero() {
			err = deleteTenantKeys(ctx, tx, t.Name) // keys that arrived before the tombstone
		}
	case err != nil:
	case deletedAt != 0:
		return false, nil // a tombstone wins
	case !t.DeletedAt.IsZero():
		if _, err = tx.ExecContext(ctx, `UPDATE tenants SET deleted_at = ? WHERE name = ?`, ms(t.DeletedAt), t.Name); err == nil {
			err = deleteTenantKeys(ctx, tx, t.Name)
		}
		deleted = true
	default:
		_, err = tx.ExecContext(ctx, `UPDATE tenants SET policy = ?, flagged_at = ?, flag_reason = ? WHERE name = ?`,
			t.Policy, ms(t.FlaggedAt), t.FlagReason, t.Name)
	}
	if err != nil {
		return false, err
	}
	if err := tx.Commit(); err != nil {
		return false, err
	}
	if !t.DeletedAt.IsZero() {
		s.forgetKeys()
	}
	return deleted, nil
}

// deleteTenantKeys removes tenant's API keys and secrets inside tx.
func deleteTenantKeys(ctx context.Context, tx *sql.Tx, tenant string) error {
	if _, err := tx.ExecContext(ctx, `DELETE FROM api_keys WHERE tenant = ?`, tenant); err != nil {
		return err
	}
	// Its secrets go with it: a tenant made later under the name gets none.
	_, err := tx.ExecContext(ctx, `DELETE FROM secrets WHERE tenant = ?`, tenant)
	return err
}

// SharedKeys returns every stored API key's record.
func (s *Store) SharedKeys(ctx context.Context) ([]SharedKey, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, hash, name, tenant, admin, created_at, revoked_at FROM api_keys ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SharedKey
	for rows.Next() {
		k, err := scanSharedKey(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// SharedKey returns key id's record; ErrNotFound when it is not stored
// (never was, or its tenant was deleted).
func (s *Store) SharedKey(ctx context.Context, id string) (SharedKey, error) {
	k, err := scanSharedKey(s.db.QueryRowContext(ctx,
		`SELECT id, hash, name, tenant, admin, created_at, revoked_at FROM api_keys WHERE id = ?`, id))
	return k, notFound(err, fmt.Sprintf("api key %q", id))
}

func scanSharedKey(r scanner) (SharedKey, error) {
	var k SharedKey
	var created, revoked int64
	if err := r.Scan(&k.ID, &k.Hash, &k.Name, &k.Tenant, &k.Admin, &created, &revoked); err != nil {
		return SharedKey{}, err
	}
	k.CreatedAt, k.RevokedAt = fromMS(created), fromMS(revoked)
	return k, nil
}

// ApplyAPIKey makes this store's record of key k.ID k, as another host
// changed it: inserted when missing (with k's hash; the secret is never
// known here), revoked when k is; a key revoked here stays revoked. A key
// of a tenant deleted here is not stored (one of a tenant not known here
// yet is: the tenant's record may arrive after it). It reports no
// Change; revoking clears the authentication cache at once. A hash that
// another key id holds already is ErrConflict.
func (s *Store) ApplyAPIKey(ctx context.Context, k SharedKey) error {
	if k.ID == "" || len(k.Hash) != 64 {
		return errdefs.InvalidField("hash", "a shared api key record needs an id and a SHA-256 hash")
	}
	var deleted int64
	err := s.db.QueryRowContext(ctx, `SELECT deleted_at FROM tenants WHERE name = ?`, k.Tenant).Scan(&deleted)
	if err == nil && deleted != 0 {
		return nil
	}
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO api_keys (id, hash, name, created_at, tenant, admin, revoked_at)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT(id) DO UPDATE SET revoked_at = excluded.revoked_at
			WHERE api_keys.revoked_at = 0 AND excluded.revoked_at != 0`,
		k.ID, k.Hash, k.Name, ms(k.CreatedAt), k.Tenant, k.Admin, ms(k.RevokedAt))
	if isUniqueViolation(err) {
		return errdefs.Newf(errdefs.ErrConflict, "api key %s: its hash is another key's", k.ID)
	}
	if err != nil {
		return err
	}
	if !k.RevokedAt.IsZero() {
		s.forgetKeys()
	}
	return nil
}
