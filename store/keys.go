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
	ID         string
	Name       string
	CreatedAt  time.Time
	LastUsedAt time.Time
}

// HashKey returns the hex SHA-256 of an API key secret, as stored.
func HashKey(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// AddAPIKey stores the hash of secret under id. ErrConflict when the id or
// the secret is already stored.
func (s *Store) AddAPIKey(ctx context.Context, id, name, secret string) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO api_keys (id, hash, name, created_at) VALUES (?, ?, ?, ?)`,
		id, HashKey(secret), name, time.Now().UnixMilli())
	if isUniqueViolation(err) {
		return errdefs.Newf(errdefs.ErrConflict, "api key %s", id)
	}
	return err
}

// CountAPIKeys returns how many keys are stored.
func (s *Store) CountAPIKeys(ctx context.Context) (int, error) {
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM api_keys`).Scan(&n)
	return n, err
}

// AuthenticateKey returns the key whose hash matches secret and records the
// use (last_used_at, at most once a minute per key). ErrUnauthenticated
// when none matches. Keys that authenticated once are served from memory;
// anything that removes or revokes a key must clear keyCache.
func (s *Store) AuthenticateKey(ctx context.Context, secret string) (*APIKey, error) {
	h := HashKey(secret)
	s.keyMu.Lock()
	cached, ok := s.keyCache[h]
	s.keyMu.Unlock()
	if ok && time.Since(cached.LastUsedAt) < time.Minute {
		k := cached
		return &k, nil
	}
	var k APIKey
	var stored string
	var created, used int64
	err := s.db.QueryRowContext(ctx, `SELECT id, hash, name, created_at, last_used_at FROM api_keys WHERE hash = ?`, h).
		Scan(&k.ID, &stored, &k.Name, &created, &used)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("api key: %w", errdefs.ErrUnauthenticated)
	}
	if err != nil {
		// A database failure is not a bad key: the caller reports it as such.
		return nil, fmt.Errorf("look up api key: %w", err)
	}
	if subtle.ConstantTimeCompare([]byte(stored), []byte(h)) != 1 {
		return nil, fmt.Errorf("api key: %w", errdefs.ErrUnauthenticated)
	}
	k.CreatedAt, k.LastUsedAt = fromMS(created), fromMS(used)
	now := time.Now().UnixMilli()
	if now-used > time.Minute.Milliseconds() {
		if _, err := s.db.ExecContext(ctx, `UPDATE api_keys SET last_used_at = ? WHERE id = ?`, now, k.ID); err == nil {
			k.LastUsedAt = fromMS(now) // as stored: UTC, milliseconds
		}
	}
	s.keyMu.Lock()
	s.keyCache[h] = k
	s.keyMu.Unlock()
	return &k, nil
}
