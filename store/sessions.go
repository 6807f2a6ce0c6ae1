package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// volumesJSON is v as stored: "" for none.
func volumesJSON(v []node.VolumeMount) string {
	if len(v) == 0 {
		return ""
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// networkJSON is n as stored: "" for none.
func networkJSON(n *node.Network) string {
	if n == nil {
		return ""
	}
	b, _ := json.Marshal(n)
	return string(b)
}

const sessionColumns = `id, template, driver, state, reason, detail, cpu, memory_mb, pids, timeout_s,
	default_user, workdir, env, metadata, idempotency_key, request_hash,
	created_at, started_at, expires_at, ended_at, snapshot, disk_mb, auto_pause_s, paused_at, remaining_ms, auto_paused,
	envd_token, on_timeout, auto_resume, network, tenant, traffic_token, public_traffic, volumes`

// CreateSession inserts s. ErrConflict when the id or the idempotency key
// is taken (then GetSessionByIdempotencyKey finds the existing one).
func (s *Store) CreateSession(ctx context.Context, se *node.Session) error {
	env, _ := json.Marshal(nonNil(se.Env))
	meta, _ := json.Marshal(nonNil(se.Metadata))
	var key any
	if se.IdempotencyKey != "" {
		key = se.IdempotencyKey
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO sessions (`+sessionColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		se.ID, se.Template, se.Driver, se.State, se.Reason, se.Detail, se.CPU, se.MemoryMB, se.Pids, se.TimeoutS,
		se.DefaultUser, se.Workdir, string(env), string(meta), key, se.RequestHash,
		ms(se.CreatedAt), ms(se.StartedAt), ms(se.ExpiresAt), ms(se.EndedAt),
		se.Snapshot, se.DiskMB, se.AutoPauseS, ms(se.PausedAt), se.Remaining.Milliseconds(), se.AutoPaused,
		se.EnvdToken, se.OnTimeout, se.AutoResume, networkJSON(se.Network), se.Tenant, se.TrafficToken, se.PublicTraffic,
		volumesJSON(se.Volumes))
	if isUniqueViolation(err) {
		return errdefs.Newf(errdefs.ErrConflict, "session %s or its idempotency key already exists", se.ID)
	}
	return err
}

// GetSession returns the session with id; ErrNotFound when there is none.
func (s *Store) GetSession(ctx context.Context, id string) (*node.Session, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+sessionColumns+` FROM sessions WHERE id = ?`, id)
	se, err := scanSession(row)
	return se, notFound(err, fmt.Sprintf("session %q", id))
}

// GetSessionByIdempotencyKey returns the session created with key.
func (s *Store) GetSessionByIdempotencyKey(ctx context.Context, key string) (*node.Session, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+sessionColumns+` FROM sessions WHERE idempotency_key = ?`, key)
	se, err := scanSession(row)
	return se, notFound(err, "session for idempotency key")
}

// ReleaseIdempotencyKey forgets session id's idempotency key, so that a
// retry with that key starts a new create. For creates that failed: the
// key then names no session worth replaying.
func (s *Store) ReleaseIdempotencyKey(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, `UPDATE sessions SET idempotency_key = NULL WHERE id = ?`, id)
	return err
}

// ListSessions returns matching sessions, newest first (or oldest first
// with f.Ascending); sessions created in the same millisecond by id.
func (s *Store) ListSessions(ctx context.Context, f node.SessionFilter) ([]*node.Session, error) {
	q := `SELECT ` + sessionColumns + ` FROM sessions`
	var where []string
	var args []any
	if len(f.States) > 0 {
		where = append(where, "state IN ("+strings.TrimSuffix(strings.Repeat("?,", len(f.States)), ",")+")")
		for _, st := range f.States {
			args = append(args, string(st))
		}
	}
	for k, v := range f.Metadata {
		where = append(where, "json_extract(metadata, ?) = ?")
		args = append(args, "$."+jsonPathKey(k), v)
	}
	if f.Template != "" {
		where = append(where, "template = ?")
		args = append(args, f.Template)
	}
	if f.Tenant != "" {
		where = append(where, "tenant = ?")
		args = append(args, f.Tenant)
	}
	if !f.CreatedAfter.IsZero() {
		where = append(where, "created_at > ?")
		args = append(args, ms(f.CreatedAfter))
	}
	cmp, order := "<", " ORDER BY created_at DESC, id"
	if f.Ascending {
		cmp, order = ">", " ORDER BY created_at ASC, id"
	}
	if f.After != nil {
		c := ms(f.After.CreatedAt)
		where = append(where, "(created_at "+cmp+" ? OR (created_at = ? AND id > ?))")
		args = append(args, c, c, f.After.ID)
	}
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += order
	if f.Limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", f.Limit)
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*node.Session
	for rows.Next() {
		se, err := scanSession(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, se)
	}
	return out, rows.Err()
}

// jsonPathKey quotes a metadata key for a SQLite JSON path.
func jsonPathKey(k string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
}

// UpdateSession writes every field of se but its id, template, driver and
// creation time, which never change (the tenant changes once: a warm-pool
// member gets its claimer's).
// ErrNotFound for an unknown id; ErrConflict when the idempotency key is
// another session's.
func (s *Store) UpdateSession(ctx context.Context, se *node.Session) error {
	env, _ := json.Marshal(nonNil(se.Env))
	meta, _ := json.Marshal(nonNil(se.Metadata))
	var key any
	if se.IdempotencyKey != "" {
		key = se.IdempotencyKey
	}
	res, err := s.db.ExecContext(ctx, `UPDATE sessions SET state = ?, reason = ?,
		detail = ?, cpu = ?, memory_mb = ?, pids = ?, timeout_s = ?, default_user = ?, workdir = ?, env = ?,
		metadata = ?, idempotency_key = ?, request_hash = ?, started_at = ?, expires_at = ?, ended_at = ?,
		snapshot = ?, disk_mb = ?, auto_pause_s = ?, paused_at = ?, remaining_ms = ?, auto_paused = ?,
		envd_token = ?, on_timeout = ?, auto_resume = ?, network = ?, tenant = ?, traffic_token = ?, public_traffic = ?, volumes = ? WHERE id = ?`,
		se.State, se.Reason, se.Detail, se.CPU, se.MemoryMB, se.Pids, se.TimeoutS,
		se.DefaultUser, se.Workdir, string(env), string(meta), key, se.RequestHash,
		ms(se.StartedAt), ms(se.ExpiresAt), ms(se.EndedAt),
		se.Snapshot, se.DiskMB, se.AutoPauseS, ms(se.PausedAt), se.Remaining.Milliseconds(), se.AutoPaused,
		se.EnvdToken, se.OnTimeout, se.AutoResume, networkJSON(se.Network), se.Tenant, se.TrafficToken, se.PublicTraffic,
		volumesJSON(se.Volumes), se.ID)
	if isUniqueViolation(err) {
		return errdefs.Newf(errdefs.ErrConflict, "idempotency key of session %s is taken", se.ID)
	}
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.Newf(errdefs.ErrNotFound, "session %q", se.ID)
	}
	return nil
}

type scanner interface{ Scan(dest ...any) error }

func scanSession(r scanner) (*node.Session, error) {
	var se node.Session
	var env, meta, network, volumes string
	var key sql.NullString
	var created, started, expires, ended, paused, remaining int64
	err := r.Scan(&se.ID, &se.Template, &se.Driver, &se.State, &se.Reason, &se.Detail, &se.CPU, &se.MemoryMB,
		&se.Pids, &se.TimeoutS, &se.DefaultUser, &se.Workdir, &env, &meta, &key, &se.RequestHash,
		&created, &started, &expires, &ended, &se.Snapshot, &se.DiskMB, &se.AutoPauseS, &paused, &remaining, &se.AutoPaused,
		&se.EnvdToken, &se.OnTimeout, &se.AutoResume, &network, &se.Tenant, &se.TrafficToken, &se.PublicTraffic, &volumes)
	if err != nil {
		return nil, err
	}
	if volumes != "" {
		if err := json.Unmarshal([]byte(volumes), &se.Volumes); err != nil {
			return nil, fmt.Errorf("session %s volumes: %w", se.ID, err)
		}
	}
	if network != "" {
		se.Network = &node.Network{}
		if err := json.Unmarshal([]byte(network), se.Network); err != nil {
			return nil, fmt.Errorf("session %s network: %w", se.ID, err)
		}
	}
	se.IdempotencyKey = key.String
	if err := json.Unmarshal([]byte(env), &se.Env); err != nil {
		return nil, fmt.Errorf("session %s env: %w", se.ID, err)
	}
	if err := json.Unmarshal([]byte(meta), &se.Metadata); err != nil {
		return nil, fmt.Errorf("session %s metadata: %w", se.ID, err)
	}
	se.CreatedAt, se.StartedAt, se.ExpiresAt, se.EndedAt = fromMS(created), fromMS(started), fromMS(expires), fromMS(ended)
	se.PausedAt, se.Remaining = fromMS(paused), time.Duration(remaining)*time.Millisecond
	return &se, nil
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// ms stores a time as Unix milliseconds; the zero time is 0.
func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMS(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMilli(v).UTC()
}
