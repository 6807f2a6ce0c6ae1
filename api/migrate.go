package api

import (
	"context"
	"net/http"

	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/errdefs"
)

// Migrator moves session id, held by this host, to host ("" for the
// fleet's pick) and returns the new session (route.Router.Migrate).
type Migrator func(ctx context.Context, id, host string) (*v1.Session, error)

// SetMigrator gives POST /v1/sessions/{id}/migrate its migrator (the
// daemon's, in a fleet with routing). Without one (a host alone) the
// route answers 503. Call it before serving.
func (s *Server) SetMigrator(m Migrator) { s.sessions.migrate = m }

// handleMigrate: POST /v1/sessions/{id}/migrate {"host": "ID"?} → 200
// with the new session (a new id) on the other host; the old id is gone.
func (h *sessionAPI) handleMigrate(w http.ResponseWriter, r *http.Request) {
	var req v1.MigrateRequest
	if err := decodeJSON(r, &req, maxJSONBody, true); err != nil {
		h.writeError(w, r, err)
		return
	}
	if h.migrate == nil {
		h.writeError(w, r, errdefs.Newf(errdefs.ErrUnavailable, "this host is in no fleet with routing between hosts: there is no other host to migrate to"))
		return
	}
	out, err := h.migrate(r.Context(), r.PathValue("id"), req.Host)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
