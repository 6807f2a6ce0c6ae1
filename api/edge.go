package api

import (
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/forkbox/forkbox/api/access"
	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/hostpath"
	"github.com/forkbox/forkbox/tenancy"
)

// edge is what every handler type shares at the HTTP edge: the log and the
// redactor that keeps the daemon's host paths out of error details. Its
// writeError is the one place an error becomes a problem response (with
// problem.go's class table); handler types embed it.
type edge struct {
	log  *slog.Logger
	hide *hostpath.Redactor
}

// problemOf is ProblemFor(err) with host paths removed from the detail
// (the log keeps them).
func (e *edge) problemOf(r *http.Request, err error) v1.Problem {
	p := ProblemFor(err)
	if d, hidden := e.hide.Redact(p.Detail); hidden {
		e.log.Warn("host path hidden from a problem detail", "method", r.Method, "path", r.URL.Path,
			"request_id", r.Header.Get(requestIDHeader), "detail", p.Detail)
		p.Detail = d
	}
	return p
}

// writeError maps err to a problem and writes it.
func (e *edge) writeError(w http.ResponseWriter, r *http.Request, err error) {
	p := e.problemOf(r, err)
	var te *errdefs.TypedError
	if errors.As(err, &te) && te.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((te.RetryAfter+time.Second-1)/time.Second)))
	}
	access.NoteFrom(r.Context()).Failed(strings.TrimPrefix(p.Type, problemPath), p.Detail)
	switch {
	case p.Status >= 500 && r.Context().Err() != nil:
		// The client went away (its context ended the call); nobody reads
		// this answer and nothing failed on our side.
		e.log.Debug("client gone", "method", r.Method, "path", r.URL.Path,
			"request_id", w.Header().Get(requestIDHeader), "tenant", tenancy.TenantOf(r.Context(), ""), "err", err)
	case te != nil && te.Class != errdefs.ErrInternal:
		// A policy answer (capacity-unavailable), not a failure.
		e.log.Info("request refused", "method", r.Method, "path", r.URL.Path,
			"request_id", w.Header().Get(requestIDHeader), "tenant", tenancy.TenantOf(r.Context(), ""), "problem", te.Type,
			"detail", te.Msg)
	case p.Status >= 500:
		e.log.Error("request failed", "method", r.Method, "path", r.URL.Path,
			"request_id", w.Header().Get(requestIDHeader), "tenant", tenancy.TenantOf(r.Context(), ""), "err", err)
	}
	writeProblem(w, r, p)
}
