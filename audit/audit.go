// Package audit writes forkbox's append-only audit trail: every lifecycle
// event, exec, file operation, snapshot, policy decision and egress
// decision of a tenant becomes one store.AuditRecord, stamped with the
// caller's key and correlation ids from the request context (package
// tenancy). Records are written synchronously, before the answer goes out,
// so a daemon restart loses none that were answered; the table refuses
// updates and deletes (store migration 8).
package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// Outcomes of an audited event.
const (
	OK     = "ok"
	Error  = "error"
	Denied = "denied"
)

// Recorder appends audit records. A nil *Recorder records nothing (for
// tests of other packages).
type Recorder struct {
	st  *store.Store
	log *slog.Logger
}

// New returns a recorder writing to st; failures are logged to log.
func New(st *store.Store, log *slog.Logger) *Recorder { return &Recorder{st: st, log: log} }

// Event is one thing to record. Tenant defaults to the caller's.
type Event struct {
	Tenant  string
	Session string
	Kind    string
	Outcome string
	Detail  map[string]any
}

// Record appends ev with the key id, request id and Idempotency-Key of
// ctx's caller (none for forkbox's own work). It waits for the write; a
// failed write is logged and returned (callers about to run a command
// refuse to run it unrecorded; for events that already happened it is
// only logged).
func (r *Recorder) Record(ctx context.Context, ev Event) error {
	if r == nil {
		return nil
	}
	rec := &store.AuditRecord{Time: time.Now().UTC(), Tenant: ev.Tenant, Session: ev.Session, Kind: ev.Kind,
		Outcome: ev.Outcome, Detail: ev.Detail}
	if c, ok := tenancy.From(ctx); ok {
		rec.KeyID, rec.RequestID, rec.IdempotencyKey = c.KeyID, c.RequestID, c.IdempotencyKey
		if rec.Tenant == "" {
			rec.Tenant = c.Tenant
		}
	}
	if rec.Tenant == "" {
		rec.Tenant = store.DefaultTenant
	}
	if rec.Outcome == "" {
		rec.Outcome = OK
	}
	if err := r.st.AppendAudit(context.WithoutCancel(ctx), rec); err != nil {
		r.log.Error("audit record lost", "kind", rec.Kind, "tenant", rec.Tenant, "session", rec.Session, "err", err)
		return fmt.Errorf("audit record: %v: %w", err, errdefs.ErrUnavailable)
	}
	return nil
}

// CommandHash is the audit form of a command: the hex SHA-256 of its
// words joined by NUL bytes (commands can hold secrets; the hash still
// matches a known command).
func CommandHash(words ...string) string {
	h := sha256.New()
	for i, w := range words {
		if i > 0 {
			h.Write([]byte{0})
		}
		h.Write([]byte(w))
	}
	return hex.EncodeToString(h.Sum(nil))
}
