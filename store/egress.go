package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/forkbox/forkbox/node"
)

// AddEgress appends records (of any sessions) in one transaction, each
// also as an audit record (kind "egress", outcome its decision, under its
// session's tenant).
func (s *Store) AddEgress(ctx context.Context, records []node.EgressRecord) error {
	if len(records) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO egress (session_id, time, kind, host, addr, port,
		bytes_up, bytes_down, decision, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	if err != nil {
		return err
	}
	defer stmt.Close()
	tenants := map[string]string{}
	for _, r := range records {
		if _, err := stmt.ExecContext(ctx, r.SessionID, ms(r.Time), r.Kind, sanitizeText(r.Host, 255),
			sanitizeText(r.Addr, 64), r.Port, r.BytesUp, r.BytesDown, r.Decision, sanitizeText(r.Reason, 512)); err != nil {
			return fmt.Errorf("egress record: %w", err)
		}
		tenant, ok := tenants[r.SessionID]
		if !ok {
			if err := tx.QueryRowContext(ctx, `SELECT tenant FROM sessions WHERE id = ?`, r.SessionID).Scan(&tenant); err != nil {
				tenant = DefaultTenant
			}
			tenants[r.SessionID] = tenant
		}
		detail := map[string]any{"kind": r.Kind, "host": sanitizeText(r.Host, 255), "addr": sanitizeText(r.Addr, 64),
			"port": r.Port}
		if r.BytesUp+r.BytesDown > 0 {
			detail["bytes_up"], detail["bytes_down"] = r.BytesUp, r.BytesDown
		}
		if r.Reason != "" {
			detail["reason"] = sanitizeText(r.Reason, 512)
		}
		outcome := "ok"
		if r.Decision != "allow" {
			outcome = "denied"
		}
		if err := appendAudit(ctx, tx, &AuditRecord{Time: r.Time, Tenant: tenant, Session: r.SessionID,
			Kind: "egress", Outcome: outcome, Detail: detail}); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// ListEgress returns up to limit of session id's egress records, oldest
// first, starting after the first skip of them.
func (s *Store) ListEgress(ctx context.Context, id string, skip, limit int) ([]node.EgressRecord, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT session_id, time, kind, host, addr, port, bytes_up, bytes_down,
		decision, reason FROM egress WHERE session_id = ? ORDER BY seq LIMIT ? OFFSET ?`, id, limit, skip)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []node.EgressRecord
	for rows.Next() {
		var r node.EgressRecord
		var t int64
		if err := rows.Scan(&r.SessionID, &t, &r.Kind, &r.Host, &r.Addr, &r.Port, &r.BytesUp, &r.BytesDown,
			&r.Decision, &r.Reason); err != nil {
			return nil, err
		}
		r.Time = fromMS(t)
		out = append(out, r)
	}
	return out, rows.Err()
}

// PruneEgress deletes egress records older than before and returns how
// many it deleted.
func (s *Store) PruneEgress(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM egress WHERE time < ?`, ms(before))
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// CountEgress returns how many egress records session id has.
func (s *Store) CountEgress(ctx context.Context, id string) (int64, error) {
	var n int64
	err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM egress WHERE session_id = ?`, id).Scan(&n)
	return n, err
}

// EgressBytes returns the bytes session id moved through its proxy in
// connections that ended (sent plus received).
func (s *Store) EgressBytes(ctx context.Context, id string) (int64, error) {
	var n int64
	err := s.db.QueryRowContext(ctx, `SELECT COALESCE(SUM(bytes_up + bytes_down), 0) FROM egress WHERE session_id = ?`, id).Scan(&n)
	return n, err
}

// sanitizeText keeps a record field printable and bounded: a hostile
// sandbox chooses the names it asks for.
func sanitizeText(s string, max int) string {
	if len(s) > max {
		s = s[:max]
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || (r >= 0x7f && r < 0xa0) { // C0, DEL and C1 controls (terminal escapes)
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
}
