package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// State is a session's lifecycle state.
type State string

// The lifecycle: creating -> running <-> paused -> terminating ->
// terminated. A session that fails while creating goes straight to
// terminated with reason error. Warm-pool members wait in pooled (hidden
// from users) until a create claims them and they become running.
const (
	StateCreating    State = "creating"
	StatePooled      State = "pooled"
	StateRunning     State = "running"
	StatePaused      State = "paused"
	StateTerminating State = "terminating"
	StateTerminated  State = "terminated"
)

// Reasons a session ended.
const (
	ReasonDeleted = "deleted"
	ReasonTimeout = "timeout"
	ReasonError   = "error"
	// ReasonAbuse: the abuse detector killed it (Detail says why).
	ReasonAbuse = "abuse"
	// ReasonQuota: its tenant's CPU budget for the day ran out.
	ReasonQuota = "quota"
	// ReasonPidsLimit: the sandbox stopped because its tasks reached the
	// host's pids limit (a gVisor sandbox whose Sentry could not start
	// another host thread); Detail says more.
	ReasonPidsLimit = "pids-limit"
)

// Session is one sandbox session's durable record. Times are UTC; a zero
// time means "not yet".
type Session struct {
	ID       string
	Template string
	Driver   string
	State    State
	// Reason and Detail say why a terminated session ended.
	Reason string
	Detail string
	// CPU in cores, MemoryMB in MiB, Pids in tasks, TimeoutS in seconds.
	CPU      float64
	MemoryMB int64
	Pids     int64
	TimeoutS int64
	// DefaultUser runs execs and owns files when a call names no user.
	DefaultUser string
	Workdir     string
	Env         map[string]string
	Metadata    map[string]string
	// IdempotencyKey is the create request's Idempotency-Key ("" for none);
	// RequestHash fingerprints the request body it came with.
	IdempotencyKey string
	RequestHash    string
	CreatedAt      time.Time
	StartedAt      time.Time
	ExpiresAt      time.Time
	EndedAt        time.Time
	// Snapshot is the snapshot the session was restored from ("" for a template).
	Snapshot string
	// DiskMB caps what the session may write, in MiB (0 = no cap).
	DiskMB int64
	// AutoPauseS pauses the session after that many idle seconds (0 = never).
	AutoPauseS int64
	// PausedAt is when a paused session was paused; Remaining is the
	// timeout it had left then, restored on resume.
	PausedAt  time.Time
	Remaining time.Duration
	// AutoPaused: the session is paused because of its AutoPauseS (not on
	// request), so its next exec or files call resumes it.
	AutoPaused bool
	// EnvdToken is the secret E2B clients send as X-Access-Token to reach
	// the session's agent through the envd proxy.
	EnvdToken string
	// OnTimeout is what happens when the timeout is reached: OnTimeoutKill
	// ("" is the same) or OnTimeoutPause.
	OnTimeout string
	// AutoResume: a session paused by OnTimeoutPause resumes on its next call.
	AutoResume bool
	// Network is the session's egress policy; nil for none (loopback only).
	Network *Network
	// Tenant owns the session; it never changes.
	Tenant string
}

// Network is a session's egress policy as stored (see api/v1.Network).
type Network struct {
	Allow                   []string `json:"allow"`
	MaxEgressBytes          int64    `json:"max_egress_bytes"`
	MaxConnectionsPerMinute int      `json:"max_connections_per_minute"`
}

// networkJSON is n as stored: "" for none.
func networkJSON(n *Network) string {
	if n == nil {
		return ""
	}
	b, _ := json.Marshal(n)
	return string(b)
}

// What a session does when its timeout is reached (Session.OnTimeout).
const (
	OnTimeoutKill  = "kill"
	OnTimeoutPause = "pause"
)

const sessionColumns = `id, template, driver, state, reason, detail, cpu, memory_mb, pids, timeout_s,
	default_user, workdir, env, metadata, idempotency_key, request_hash,
	created_at, started_at, expires_at, ended_at, snapshot, disk_mb, auto_pause_s, paused_at, remaining_ms, auto_paused,
	envd_token, on_timeout, auto_resume, network, tenant`

// CreateSession inserts s. ErrConflict when the id or the idempotency key
// is taken (then GetSessionByIdempotencyKey finds the existing one).
func (s *Store) CreateSession(ctx context.Context, se *Session) error {
	env, _ := json.Marshal(nonNil(se.Env))
	meta, _ := json.Marshal(nonNil(se.Metadata))
	var key any
	if se.IdempotencyKey != "" {
		key = se.IdempotencyKey
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO sessions (`+sessionColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		se.ID, se.Template, se.Driver, se.State, se.Reason, se.Detail, se.CPU, se.MemoryMB, se.Pids, se.TimeoutS,
		se.DefaultUser, se.Workdir, string(env), string(meta), key, se.RequestHash,
		ms(se.CreatedAt), ms(se.StartedAt), ms(se.ExpiresAt), ms(se.EndedAt),
		se.Snapshot, se.DiskMB, se.AutoPauseS, ms(se.PausedAt), se.Remaining.Milliseconds(), se.AutoPaused,
		se.EnvdToken, se.OnTimeout, se.AutoResume, networkJSON(se.Network), se.Tenant)
	if isUniqueViolation(err) {
		return errdefs.Newf(errdefs.ErrConflict, "session %s or its idempotency key already exists", se.ID)
	}
	return err
}

// GetSession returns the session with id; ErrNotFound when there is none.
func (s *Store) GetSession(ctx context.Context, id string) (*Session, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+sessionColumns+` FROM sessions WHERE id = ?`, id)
	se, err := scanSession(row)
	return se, notFound(err, fmt.Sprintf("session %q", id))
}

// GetSessionByIdempotencyKey returns the session created with key.
func (s *Store) GetSessionByIdempotencyKey(ctx context.Context, key string) (*Session, error) {
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

// SessionFilter selects sessions in ListSessions.
type SessionFilter struct {
	// States, when not empty, keeps only sessions in one of them.
	States []State
	// Metadata keeps sessions whose metadata has every key with that value.
	Metadata map[string]string
	// Template, when set, keeps only sessions of that template.
	Template string
	// Tenant, when set, keeps only that tenant's sessions.
	Tenant string
	// CreatedAfter, when not zero, keeps only sessions created after it.
	CreatedAfter time.Time
	// Ascending lists oldest first (the default is newest first).
	Ascending bool
	// After, when set, continues a listing after that session: the next
	// page of a paginated list (ListCursor of the last session seen).
	After *ListCursor
	// Limit caps the result (0 = no cap).
	Limit int
}

// ListCursor marks a place in a session listing: its sort keys.
type ListCursor struct {
	CreatedAt time.Time
	ID        string
}

// ListSessions returns matching sessions, newest first (or oldest first
// with f.Ascending); sessions created in the same millisecond by id.
func (s *Store) ListSessions(ctx context.Context, f SessionFilter) ([]*Session, error) {
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
	var out []*Session
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
func (s *Store) UpdateSession(ctx context.Context, se *Session) error {
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
		envd_token = ?, on_timeout = ?, auto_resume = ?, network = ?, tenant = ? WHERE id = ?`,
		se.State, se.Reason, se.Detail, se.CPU, se.MemoryMB, se.Pids, se.TimeoutS,
		se.DefaultUser, se.Workdir, string(env), string(meta), key, se.RequestHash,
		ms(se.StartedAt), ms(se.ExpiresAt), ms(se.EndedAt),
		se.Snapshot, se.DiskMB, se.AutoPauseS, ms(se.PausedAt), se.Remaining.Milliseconds(), se.AutoPaused,
		se.EnvdToken, se.OnTimeout, se.AutoResume, networkJSON(se.Network), se.Tenant, se.ID)
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

func scanSession(r scanner) (*Session, error) {
	var se Session
	var env, meta, network string
	var key sql.NullString
	var created, started, expires, ended, paused, remaining int64
	err := r.Scan(&se.ID, &se.Template, &se.Driver, &se.State, &se.Reason, &se.Detail, &se.CPU, &se.MemoryMB,
		&se.Pids, &se.TimeoutS, &se.DefaultUser, &se.Workdir, &env, &meta, &key, &se.RequestHash,
		&created, &started, &expires, &ended, &se.Snapshot, &se.DiskMB, &se.AutoPauseS, &paused, &remaining, &se.AutoPaused,
		&se.EnvdToken, &se.OnTimeout, &se.AutoResume, &network, &se.Tenant)
	if err != nil {
		return nil, err
	}
	if network != "" {
		se.Network = &Network{}
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
