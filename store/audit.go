package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// AuditRecord is one append-only audit record: something a tenant's key
// or session did, or that forkbox did to them (a timeout, an abuse kill,
// a policy decision).
type AuditRecord struct {
	// Seq orders records; it is assigned on append and only grows.
	Seq    int64
	Time   time.Time
	Tenant string
	// Session is the session acted on ("" for none).
	Session string
	// Kind names the event ("session.create", "exec", "file.write",
	// "egress", "policy", "abuse", ...).
	Kind string
	// Outcome is "ok", "error" or "denied".
	Outcome string
	// KeyID is the API key that made the request ("" for forkbox itself).
	KeyID string
	// RequestID and IdempotencyKey correlate the record with a request.
	RequestID      string
	IdempotencyKey string
	// Detail holds the event's fields (command hash, exit code, CPU ms,
	// path, error, ...).
	Detail map[string]any
	// Host is the fleet host that made the record: set on records read
	// from the fleet's audit stream (package fleetstate), "" on this
	// store's own (not a column).
	Host string
}

const auditColumns = `seq, time, tenant, session, kind, outcome, key_id, request_id, idempotency_key, detail`

// AppendAudit appends records in one transaction and sets their Seq. It
// returns once that transaction committed, so a record AppendAudit
// returned nil for survives the daemon's end (the database is in WAL mode
// with synchronous=NORMAL: a commit is in the write-ahead log, not yet
// synced to the disk). Appends that arrive while another commits are
// written together in the next transaction (auditbatch.go), so the
// records of concurrent requests share one commit. ctx's cancellation
// does not end the write (other callers' records ride on it).
func (s *Store) AppendAudit(ctx context.Context, recs ...*AuditRecord) error {
	if len(recs) == 0 {
		return nil
	}
	rows := make([]auditRow, 0, len(recs))
	for _, r := range recs {
		row, err := prepareAudit(r)
		if err != nil {
			return err
		}
		rows = append(rows, row)
	}
	if err := s.auditQ.append(context.WithoutCancel(ctx), s, rows); err != nil {
		return err
	}
	if fn := s.audited; fn != nil {
		fn()
	}
	return nil
}

// Bounds of what one audit record keeps: every string (a path, an error)
// at most maxAuditText bytes, lists at most maxAuditList items. Requests
// choose these values, and records are never deleted.
const (
	maxAuditText = 1024
	maxAuditList = 64
)

// boundDetail returns v with strings cut and cleaned of control
// characters (no terminal escapes reach an admin's screen) and lists cut.
func boundDetail(v any) any {
	switch x := v.(type) {
	case string:
		return sanitizeText(x, maxAuditText)
	case []string:
		out := make([]string, 0, min(len(x), maxAuditList))
		for _, s := range x[:min(len(x), maxAuditList)] {
			out = append(out, sanitizeText(s, 128))
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[sanitizeText(k, 64)] = boundDetail(e)
		}
		return out
	}
	return v
}

// plainID reports whether s looks like an id (1-64 lower-case letters,
// digits, '-' and '_'): only such values are kept as a record's session.
func plainID(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// insertAuditSQL inserts one record; its arguments are an auditRow's.
const insertAuditSQL = `INSERT INTO audit (time, tenant, session, kind, outcome, key_id, request_id,
	idempotency_key, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`

// auditRow is a record ready to insert: bounded and cleaned, its detail
// encoded, in the order of insertAuditSQL's arguments.
type auditRow struct {
	rec  *AuditRecord
	args []any
}

// prepareAudit bounds and cleans r (boundDetail; a session that is no id
// is kept, cut, as detail "session_ref") and encodes it for insertAuditSQL.
// The error is the detail's encoding's.
func prepareAudit(r *AuditRecord) (auditRow, error) {
	if r.Session != "" && !plainID(r.Session) {
		if r.Detail == nil {
			r.Detail = map[string]any{}
		}
		r.Detail["session_ref"] = r.Session
		r.Session = ""
	}
	if len(r.Detail) > 0 {
		r.Detail = boundDetail(r.Detail).(map[string]any)
	}
	r.Tenant, r.Kind, r.Outcome, r.KeyID = sanitizeText(r.Tenant, 64), sanitizeText(r.Kind, 64),
		sanitizeText(r.Outcome, 16), sanitizeText(r.KeyID, 64)
	detail := []byte("{}")
	if len(r.Detail) > 0 {
		b, err := json.Marshal(r.Detail)
		if err != nil {
			return auditRow{}, fmt.Errorf("audit detail: %w", err)
		}
		detail = b
	}
	if r.Time.IsZero() {
		r.Time = time.Now().UTC()
	}
	return auditRow{rec: r, args: []any{ms(r.Time), r.Tenant, r.Session, r.Kind, r.Outcome, r.KeyID,
		sanitizeText(r.RequestID, 128), sanitizeText(r.IdempotencyKey, 255), string(detail)}}, nil
}

// insertAudit inserts row with ins (insertAuditSQL, prepared in the
// row's transaction) and sets the record's Seq.
func insertAudit(ctx context.Context, ins *sql.Stmt, row auditRow) error {
	res, err := ins.ExecContext(ctx, row.args...)
	if err != nil {
		return fmt.Errorf("audit record: %w", err)
	}
	row.rec.Seq, err = res.LastInsertId()
	return err
}

// appendAudit inserts r inside tx (prepareAudit, then insertAudit) and
// sets r.Seq.
func appendAudit(ctx context.Context, tx *sql.Tx, r *AuditRecord) error {
	row, err := prepareAudit(r)
	if err != nil {
		return err
	}
	ins, err := tx.PrepareContext(ctx, insertAuditSQL)
	if err != nil {
		return err
	}
	defer ins.Close()
	return insertAudit(ctx, ins, row)
}

// AuditFilter selects records in ListAudit. Zero fields do not filter.
type AuditFilter struct {
	Tenant  string
	Session string
	// Kind keeps records of that kind, or of every kind under it when it
	// ends in "." ("session." keeps session.create, session.destroy, ...).
	Kind    string
	Outcome string
	Since   time.Time // records at or after
	Until   time.Time // records before
	// After continues a listing after that sequence number.
	After int64
	// Limit caps the result (0 = no cap).
	Limit int
}

// ListAudit returns matching records in sequence order (the order they
// happened in).
func (s *Store) ListAudit(ctx context.Context, f AuditFilter) ([]*AuditRecord, error) {
	var where []string
	var args []any
	add := func(cond string, v any) {
		where = append(where, cond)
		args = append(args, v)
	}
	if f.Tenant != "" {
		add("tenant = ?", f.Tenant)
	}
	if f.Session != "" {
		add("session = ?", f.Session)
	}
	if strings.HasSuffix(f.Kind, ".") {
		// A prefix as a range ('.' + 1 is '/'), which the index serves.
		add("kind >= ?", f.Kind)
		add("kind < ?", strings.TrimSuffix(f.Kind, ".")+"/")
	} else if f.Kind != "" {
		add("kind = ?", f.Kind)
	}
	if f.Outcome != "" {
		add("outcome = ?", f.Outcome)
	}
	if !f.Since.IsZero() {
		add("time >= ?", ms(f.Since))
	}
	if !f.Until.IsZero() {
		add("time < ?", ms(f.Until))
	}
	if f.After > 0 {
		add("seq > ?", f.After)
	}
	q := `SELECT ` + auditColumns + ` FROM audit`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY seq"
	if f.Limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", f.Limit)
	}
	rows, err := s.ro.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*AuditRecord
	for rows.Next() {
		var r AuditRecord
		var t int64
		var detail string
		if err := rows.Scan(&r.Seq, &t, &r.Tenant, &r.Session, &r.Kind, &r.Outcome, &r.KeyID, &r.RequestID,
			&r.IdempotencyKey, &detail); err != nil {
			return nil, err
		}
		r.Time = fromMS(t)
		if err := json.Unmarshal([]byte(detail), &r.Detail); err != nil {
			return nil, fmt.Errorf("audit record %d: %w", r.Seq, err)
		}
		out = append(out, &r)
	}
	return out, rows.Err()
}
