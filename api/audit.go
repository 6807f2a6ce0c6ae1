package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// auditPage is the default and largest page of GET /v1/audit.
const (
	auditPage    = 100
	auditMaxPage = 1000
)

// handleAudit: GET /v1/audit with filters tenant (admin keys; a tenant
// key reads its own tenant's records only), session, kind (exact, or a
// prefix ending in "." such as "session."), outcome (ok, error, denied),
// since and until (RFC 3339), after (a seq), limit (1-1000, default 100).
// JSON {records, next}; with format=jsonl (or Accept:
// application/x-ndjson) every matching record, one JSON object per line,
// in order: the export (format=json is the paged JSON whatever Accept
// says). Any other format or outcome is a 400 naming the parameter.
func (h *auditAPI) handleAudit(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	caller, _ := tenancy.From(r.Context())
	format, err := oneOf(r, "format", "json", "jsonl")
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	outcome, err := oneOf(r, "outcome", audit.OK, audit.Error, audit.Denied)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	f := store.AuditFilter{Tenant: q.Get("tenant"), Session: q.Get("session"), Kind: q.Get("kind"), Outcome: outcome}
	if !caller.Admin {
		if f.Tenant != "" && f.Tenant != caller.Tenant {
			h.writeError(w, r, errdefs.Newf(errdefs.ErrPermissionDenied, "a tenant key reads its own tenant's audit records only"))
			return
		}
		f.Tenant = caller.Tenant
	}
	for _, t := range []struct {
		name string
		dst  *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if v := q.Get(t.name); v != "" {
			ts, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				h.writeError(w, r, errdefs.InvalidField(t.name, "must be an RFC 3339 time"))
				return
			}
			*t.dst = ts
		}
	}
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			h.writeError(w, r, errdefs.InvalidField("after", "must be a record's seq"))
			return
		}
		f.After = n
	}
	f.Limit = auditPage
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > auditMaxPage {
			h.writeError(w, r, errdefs.InvalidField("limit", "must be between 1 and %d", auditMaxPage))
			return
		}
		f.Limit = n
	}
	if format == "jsonl" || format == "" && r.Header.Get("Accept") == "application/x-ndjson" {
		h.exportAudit(w, r, f)
		return
	}
	recs, err := h.list(r.Context(), f)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	out := v1.AuditList{Records: make([]v1.AuditRecord, 0, len(recs))}
	for _, rec := range recs {
		out.Records = append(out.Records, auditView(rec))
	}
	if len(recs) == f.Limit {
		out.Next = recs[len(recs)-1].Seq
	}
	writeJSON(w, http.StatusOK, out)
}

// exportAudit streams every record matching f (its Limit is the page
// size) as JSON lines.
func (h *auditAPI) exportAudit(w http.ResponseWriter, r *http.Request, f store.AuditFilter) {
	f.Limit = auditMaxPage
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	started := false
	for {
		recs, err := h.list(r.Context(), f)
		if err != nil {
			if !started {
				h.writeError(w, r, err)
			} else {
				h.log.Error("audit export cut short", "err", err)
			}
			return
		}
		if !started {
			w.WriteHeader(http.StatusOK)
			started = true
		}
		for _, rec := range recs {
			if err := enc.Encode(auditView(rec)); err != nil {
				return // the client went away
			}
		}
		if len(recs) < f.Limit {
			return
		}
		f.After = recs[len(recs)-1].Seq
	}
}

// AuditReader reads the audit records of a whole fleet
// (fleetstate.Audit.List in a cluster): the same filters as
// store.ListAudit; each record's Seq its place in the fleet's order, its
// Host the host that made it. ErrUnavailable while it cannot be read.
type AuditReader interface {
	List(ctx context.Context, f store.AuditFilter) ([]*store.AuditRecord, error)
}

// SetAuditReader makes GET /v1/audit read the fleet's records through
// rd instead of this host's store. Call it before serving; nil (a host
// alone) reads the store.
func (s *Server) SetAuditReader(rd AuditReader) { s.auditAPI.fleet = rd }

// list returns the records f selects: the fleet's when a reader is set,
// else this host's store's.
func (h *auditAPI) list(ctx context.Context, f store.AuditFilter) ([]*store.AuditRecord, error) {
	if h.fleet != nil {
		return h.fleet.List(ctx, f)
	}
	return h.store.ListAudit(ctx, f)
}

func auditView(r *store.AuditRecord) v1.AuditRecord {
	return v1.AuditRecord{Seq: r.Seq, Time: r.Time, Tenant: r.Tenant, Session: r.Session, Kind: r.Kind,
		Outcome: r.Outcome, KeyID: r.KeyID, RequestID: r.RequestID, IdempotencyKey: r.IdempotencyKey, Detail: r.Detail,
		Host: r.Host}
}
