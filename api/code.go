package api

import (
	"net/http"

	"github.com/forkbox/forkbox/api/access"
	"github.com/forkbox/forkbox/api/codecall"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// handleCode serves /v1/sessions/{id}/code/{path...}: session id's
// code-execution service, the protocol of E2B's code interpreter (section
// 7 of the E2B compatibility notes) under forkbox's API and its keys:
//
//	POST   code/execute               {"code", "context_id"?, "language"?, "env_vars"?} → 200, JSON lines
//	POST   code/contexts              {"language"?, "cwd"?} → {"id","language","cwd"}
//	GET    code/contexts              → [{"id","language","cwd"}, ...]
//	DELETE code/contexts/{ctx}        → 204
//	POST   code/contexts/{ctx}/restart → 204
//	GET    code/health                → 200
//
// The answers are the agent's; its errors become problems (400 naming
// the field, 404 for an unknown context, 429 at the contexts' limit).
// Every call but a GET is audited once answered (kind "code", an execute
// with the cell's sha256), and an execute also before it runs (kind
// "code.start"); bodies are at most
// codecall.MaxRequestBody bytes; the client going away interrupts the
// cell.
func (h *codeAPI) handleCode(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	sub := "/" + r.PathValue("path")
	agentPath, ok := codecall.AgentPath(r.Method, sub)
	if !ok {
		h.writeError(w, r, errdefs.Newf(errdefs.ErrNotFound, "no such endpoint of the code-execution service: %s %s", r.Method, sub))
		return
	}
	rec, err := h.mgr.Get(r.Context(), id)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	if rec.State == node.StateTerminated {
		h.writeError(w, r, errdefs.Newf(errdefs.ErrTerminated, "session %s ended (%s)", id, rec.Reason))
		return
	}
	body, err := codecall.RequestBody(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	if sub == "/execute" {
		sum, err := codecall.CellHash(body)
		if err != nil {
			h.writeError(w, r, err)
			return
		}
		access.NoteFrom(r.Context()).Set("code_sha256", sum)
		// On record before it runs, as exec's commands are.
		if err := h.audit.Record(r.Context(), audit.Event{Session: id, Kind: "code.start", Detail: map[string]any{"code_sha256": sum}}); err != nil {
			h.writeError(w, r, err)
			return
		}
	}
	conn, err := h.mgr.OpenEnvd(r.Context(), id)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	defer conn.Release()
	resp, err := codecall.Do(r.Context(), conn, r.Method, agentPath, body)
	if err != nil {
		if r.Context().Err() == nil {
			h.writeError(w, r, err)
		}
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode >= http.StatusBadRequest {
		h.writeError(w, r, codecall.ErrorOf(resp))
		return
	}
	if err := codecall.Relay(w, resp); err != nil && r.Context().Err() == nil {
		h.log.Debug("code call: stream cut", "session", id, "path", sub, "err", err)
	}
}
