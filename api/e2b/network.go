package e2b

import (
	"encoding/json"
	"net/http"

	"github.com/forkbox/forkbox/errdefs"
)

// noOpenInternet is the answer to allow_internet_access true without an
// allow-list: forkbox sandboxes reach only what an allow-list names.
const noOpenInternet = "forkbox has no open internet; use network.allowOut"

// networkUpdate is components.schemas.SandboxNetworkUpdateConfig, the
// body of updateNetwork(). Omitted fields are cleared, as at E2B.
type networkUpdate struct {
	AllowOut            []string        `json:"allowOut"`
	DenyOut             []string        `json:"denyOut"`
	Rules               json.RawMessage `json:"rules"`
	EgressProxy         json.RawMessage `json:"egressProxy"`
	AllowInternetAccess *bool           `json:"allow_internet_access"`
}

// handleNetwork: PUT /sandboxes/{id}/network → 204: the running (or
// paused) sandbox's egress allow-list becomes allowOut (mapped as at
// create: allowList), at once for new connections and DNS queries; forks,
// pause and a daemon restart keep it. No allowOut allows nothing
// (allow_internet_access false too; allowOut still wins over it, as at
// E2B). denyOut needs no mapping
// (what is not allowed is refused). Errors: 400 for rules, egressProxy, a
// bad entry (naming network.allowOut) or allow_internet_access true
// without allowOut; 403 for an entry outside the tenant's egress ceiling;
// 409 for a sandbox created without a network (forkbox cannot add one to
// a running sandbox); 404 for an unknown or ended one.
func (h *Handler) handleNetwork(w http.ResponseWriter, r *http.Request) {
	var body networkUpdate
	if err := decode(r, &body); err != nil {
		h.fail(w, r, err)
		return
	}
	if isSet(body.Rules) || isSet(body.EgressProxy) {
		h.fail(w, r, errdefs.InvalidField("network", "rules and egressProxy are not supported by forkbox"))
		return
	}
	if body.AllowInternetAccess != nil && *body.AllowInternetAccess && len(body.AllowOut) == 0 {
		h.fail(w, r, errdefs.InvalidField("allow_internet_access", noOpenInternet))
		return
	}
	allow := allowList(body.AllowOut)
	rec := h.session(w, r)
	if rec == nil {
		return
	}
	if _, err := h.mgr.SetNetwork(r.Context(), rec.ID, allow); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
