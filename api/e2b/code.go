package e2b

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"

	"github.com/forkbox/forkbox/api/codecall"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/httpjson"
	"github.com/forkbox/forkbox/node"
)

// trafficTokenHeader carries a sandbox's traffic access token (what create
// and connect return as trafficAccessToken), which E2B's proxy requires on
// every port but envd's (INFRA packages/orchestrator/internal/proxy).
const trafficTokenHeader = "E2b-Traffic-Access-Token"

// trafficTokenError is the body of E2B's proxy when the traffic token is
// missing or wrong (INFRA packages/shared/pkg/proxy/template: 403, with
// the sandbox's id).
type trafficTokenError struct {
	SandboxID string `json:"sandboxId"`
	Message   string `json:"message"`
	Code      int    `json:"code"`
}

// serveCode serves a call of sandbox id's code-execution service
// (E2b-Sandbox-Port 49999, @e2b/code-interpreter's protocol), passed to
// the agent's /code API and its answer streamed back as the agent writes
// it.
//
// Authorisation, as E2B's proxy and envd do it: every call needs the
// sandbox's traffic access token in E2B-Traffic-Access-Token (missing or
// wrong: 403 with E2B's body; a sandbox made before traffic tokens
// existed has none and refuses every call); /execute also needs the envd
// access token in X-Access-Token, which the SDK sends there (else 401, as
// on envd). Unknown, ended or paused sandboxes answer 502 as envd's do.
// Every call but /health is an audit record ("code", with the cell's
// sha256 for /execute) before it is passed on. Bodies are at most
// codecall.MaxRequestBody bytes; the client going away cancels the call
// (and the agent interrupts the cell).
func (h *Handler) serveCode(w http.ResponseWriter, r *http.Request, id string) {
	agentPath, ok := codecall.AgentPath(r.Method, r.URL.Path)
	if !ok {
		writeError(w, http.StatusNotFound, "no such endpoint of the code-execution service: "+r.Method+" "+r.URL.Path)
		return
	}
	rec, err := h.mgr.Get(r.Context(), id)
	if err == nil && rec.State == node.StateTerminated {
		err = errdefs.Newf(errdefs.ErrTerminated, "sandbox %s ended (%s)", id, rec.Reason)
	}
	if err != nil {
		writeError(w, http.StatusBadGateway, h.notRunning(r, id, err))
		return
	}
	if msg := trafficTokenProblem(rec, r.Header.Get(trafficTokenHeader)); msg != "" {
		httpjson.Write(w, http.StatusForbidden, trafficTokenError{SandboxID: id, Message: msg, Code: http.StatusForbidden})
		return
	}
	if r.URL.Path == "/execute" {
		if _, err := h.mgr.CheckEnvdToken(r.Context(), id, r.Header.Get(accessTokenHeader)); err != nil {
			if errors.Is(err, errdefs.ErrUnauthenticated) {
				writeError(w, http.StatusUnauthorized, err.Error())
				return
			}
			writeError(w, http.StatusBadGateway, h.notRunning(r, id, err))
			return
		}
	}
	body, err := codecall.RequestBody(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if r.URL.Path != "/health" {
		detail := map[string]any{"method": r.Method, "path": r.URL.Path}
		if r.URL.Path == "/execute" {
			sum, err := codecall.CellHash(body)
			if err != nil {
				writeError(w, http.StatusBadRequest, err.Error())
				return
			}
			detail["code_sha256"] = sum
		}
		// On record before it runs, as envd calls are.
		if err := h.audit.Record(r.Context(), audit.Event{Tenant: rec.Tenant, Session: id, Kind: "code", Detail: detail}); err != nil {
			writeError(w, http.StatusServiceUnavailable, "the audit trail cannot be written; nothing was run")
			return
		}
	}
	if err := h.runningOrResume(r.Context(), rec); err != nil {
		writeError(w, http.StatusBadGateway, h.notRunning(r, id, err))
		return
	}
	conn, err := h.mgr.OpenEnvd(r.Context(), id)
	if err != nil {
		writeError(w, http.StatusBadGateway, h.notRunning(r, id, err))
		return
	}
	defer conn.Release()
	resp, err := codecall.Do(r.Context(), conn, r.Method, agentPath, body)
	if err != nil {
		if r.Context().Err() != nil {
			return // the client went away
		}
		writeError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s: %s", id, h.message(r, err)))
		return
	}
	defer resp.Body.Close()
	// The agent's answer is E2B's already (lines, contexts, its errors).
	if err := codecall.Relay(w, resp); err != nil && r.Context().Err() == nil {
		h.log.Debug("code call: stream cut", "session", id, "path", r.URL.Path, "err", err)
	}
}

// trafficTokenProblem returns why token does not open rec's services
// other than envd ("" when it does): E2B's proxy messages for a missing
// and a wrong token. The comparison takes constant time.
func trafficTokenProblem(rec *node.Session, token string) string {
	switch {
	case token == "":
		return fmt.Sprintf("Sandbox is secured with traffic access token. Token header '%s' is missing", trafficTokenHeader)
	case rec.TrafficToken == "" || subtle.ConstantTimeCompare([]byte(rec.TrafficToken), []byte(token)) != 1:
		return fmt.Sprintf("Sandbox is secured with traffic access token. Provided token in header '%s' is invalid", trafficTokenHeader)
	}
	return ""
}
