package api

import (
	"net/http"
	"strings"

	"github.com/forkbox/forkbox/api/portproxy"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// portAPI serves a session's own ports on forkbox's API: HTTP requests
// passed to a server in the sandbox, and raw TCP connections (forkbox
// port-forward). Both take the tenant's API key (the authenticated
// middleware), which is not passed on to the sandbox, and answer
// problems: 400 for a port that is no number from 1 to 65535, 404 for
// another tenant's session, 409 for a paused one, 502
// (port-not-listening) when nothing listens on the port.
type portAPI struct {
	edge
	mgr   node.Node
	proxy *portproxy.Proxy
}

// request is the portproxy request of r for session id's port, or false
// after the error was written.
func (a *portAPI) request(w http.ResponseWriter, r *http.Request, via string) (portproxy.Request, bool) {
	id := r.PathValue("id")
	port, err := portproxy.ParsePort(r.PathValue("port"))
	if err != nil {
		a.writeError(w, r, err)
		return portproxy.Request{}, false
	}
	rec, err := a.mgr.Get(r.Context(), id)
	if err == nil && rec.State == node.StateTerminated {
		err = errdefs.Newf(errdefs.ErrTerminated, "session %s ended (%s)", id, rec.Reason)
	}
	if err != nil {
		a.writeError(w, r, err)
		return portproxy.Request{}, false
	}
	// The rest of the path as the client encoded it (the id and the port
	// have one encoding only).
	raw := strings.TrimPrefix(r.URL.EscapedPath(), "/v1/sessions/"+id+"/ports/"+r.PathValue("port"))
	return portproxy.Request{Session: id, Tenant: rec.Tenant, Port: port, Via: via,
		Path: "/" + r.PathValue("path"), RawPath: raw, RawQuery: r.URL.RawQuery,
		Strip: []string{"Authorization", "X-Api-Key"}, Fail: a.writeError}, true
}

// handleHTTP serves ANY /v1/sessions/{id}/ports/{port}/{path...}: the
// request, as /{path} with its query, to the server on port.
func (a *portAPI) handleHTTP(w http.ResponseWriter, r *http.Request) {
	if pr, ok := a.request(w, r, "rest"); ok {
		a.proxy.ServeHTTP(w, r, pr)
	}
}

// handleConnect serves GET /v1/sessions/{id}/ports/{port} with
// "Connection: Upgrade" and "Upgrade: forkbox-tcp": after the 101 the
// connection carries a TCP connection to port inside the session.
func (a *portAPI) handleConnect(w http.ResponseWriter, r *http.Request) {
	if pr, ok := a.request(w, r, "rest-connect"); ok {
		a.proxy.Tunnel(w, r, pr)
	}
}
