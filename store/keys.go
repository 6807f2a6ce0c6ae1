package store

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// APIKey is a stored API key. Only the SHA-256 of the secret is kept.
type APIKey struct {
	ID   string
	Name string
	// Tenant is the tenant the key acts for.
	Tenant string
	// Admin keys also manage tenants and keys and read every tenant's
	// audit records and the metrics.
	Admin      bool
	CreatedAt  time.Time
	LastUsedAt time.Time
	// RevokedAt, when not zero, is when the key was revoked; a revoked
	// key never authenticates again.
	RevokedAt time.Time
}

// HashKey returns the hex SHA-256 of an API key secret, as stored.
func HashKey(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// AddAPIKey stores k (ID, Name, Tenant, Admin) with the hash of secret.
// ErrConflict when the id or the secret is already stored.
func (s *Store) AddAPIKey(ctx context.Context, k APIKey, secret string) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO api_keys (id, hash, name, created_at, tenant, admin) VALUES (?, ?, ?, ?, ?, ?)`,
		k.ID, HashKey(secret), k.Name, time.Now().UnixMilli(), k.Tenant, k.Admin)
	if isUniqueViolation(err) {
		return errdefs.Newf(errdefs.ErrConflict, "api key %s", k.ID)
	}
	if err == nil {
		s.notify(ChangeKey, k.ID)
	}
	return err
}

const keyColumns = `id, name, tenant, admin, created_at, last_used_at, revoked_at`

func scanKey(r scanner) (*APIKey, error) {
	var k APIKey
	var created, used, revoked int64
	if err := r.Scan(&k.ID, &k.Name, &k.Tenant, &k.Admin, &created, &used, &revoked); err != nil {
		return nil, err
	}
	k.CreatedAt, k.LastUsedAt, k.RevokedAt = fromMS(created), fromMS(used), fromMS(revoked)
	return &k, nil
}

// ListAPIKeys returns the keys of tenant (every key for ""), oldest first.
func (s *Store) ListAPIKeys(ctx context.Context, tenant string) ([]*APIKey, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE ? = '' OR tenant = ?
		ORDER BY created_at, id`, tenant, tenant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*APIKey
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// GetAPIKey returns key id; ErrNotFound when there is none.
func (s *Store) GetAPIKey(ctx context.Context, id string) (*APIKey, error) {
	k, err := scanKey(s.db.QueryRowContext(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE id = ?`, id))
	return k, notFound(err, fmt.Sprintf("api key %q", id))
}

// RevokeAPIKey revokes key id at once (also for requests that would have
// been served from the authentication cache). Revoking a revoked key is
// fine. ErrNotFound for an unknown id.
func (s *Store) RevokeAPIKey(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at = 0`,
		time.Now().UnixMilli(), id)
	if err != nil {
		return err
	}
	s.forgetKeys()
	if n, _ := res.RowsAffected(); n == 0 {
		if _, err := s.GetAPIKey(ctx, id); err != nil {
			return err
		}
		return nil
	}
	s.notify(ChangeKey, id)
	return nil
}

// CountAPIKeys returns how many keys are stored.
func (s *Store) CountAPIKeys(ctx context.Context) (int, error) {
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM api_keys`).Scan(&n)
	return n, err
}

// forgetKeys empties the authentication cache (after a key is revoked or
// removed).
func (s *Store) forgetKeys() {
	s.keyMu.Lock()
	clear(s.keyCache)
	s.keyGen++
	s.keyMu.Unlock()
}

// AuthenticateKey returns the unrevoked key whose hash matches secret and
// records the use (last_used_at, at most once a minute per key).
// ErrUnauthenticated when none matches or the key is revoked. Keys that
// authenticated once are served from memory for a minute; anything that
// removes or revokes a key clears that cache (forgetKeys).
func (s *Store) AuthenticateKey(ctx context.Context, secret string) (*APIKey, error) {
	h := HashKey(secret)
	s.keyMu.Lock()
	cached, ok := s.keyCache[h]
	gen := s.keyGen
	s.keyMu.Unlock()
	if ok && time.Since(cached.LastUsedAt) < time.Minute {
		k := cached
		return &k, nil
	}
	var stored string
	row := s.db.QueryRowContext(ctx, `SELECT hash, `+keyColumns+` FROM api_keys WHERE hash = ?`, h)
	k, err := scanKey(scannerFunc(func(dest ...any) error { return row.Scan(append([]any{&stored}, dest...)...) }))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("api key: %w", errdefs.ErrUnauthenticated)
	}
	if err != nil {
		// A database failure is not a bad key: the caller reports it as such.
		return nil, fmt.Errorf("look up api key: %w", err)
	}
	if subtle.ConstantTimeCompare([]byte(stored), []byte(h)) != 1 || !k.RevokedAt.IsZero() {
		return nil, fmt.Errorf("api key: %w", errdefs.ErrUnauthenticated)
	}
	now := time.Now().UnixMilli()
	if now-k.LastUsedAt.UnixMilli() > time.Minute.Milliseconds() {
		if _, err := s.db.ExecContext(ctx, `UPDATE api_keys SET last_used_at = ? WHERE id = ?`, now, k.ID); err == nil {
			k.LastUsedAt = fromMS(now) // as stored: UTC, milliseconds
		}
	}
	s.keyMu.Lock()
	if s.keyGen == gen { // no revocation since the read: safe to cache
		s.keyCache[h] = *k
	}
	s.keyMu.Unlock()
	return k, nil
}

// scannerFunc adapts a function to scanner.
type scannerFunc func(dest ...any) error

func (f scannerFunc) Scan(dest ...any) error { return f(dest...) }
