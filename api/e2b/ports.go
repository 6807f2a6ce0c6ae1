package e2b

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"

	"github.com/forkbox/forkbox/api/access"
	"github.com/forkbox/forkbox/api/codecall"
	"github.com/forkbox/forkbox/api/portproxy"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/httpjson"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/tenancy"
)

// SetDomain makes the handler route requests for host names
// "PORT-ID.domain" to port PORT of sandbox ID (forkbox serve --domain,
// with wildcard DNS for *.domain pointed at the daemon), and return domain
// as the sandboxes' "domain", so that the SDKs' getHost(port) names such
// a host. "" (the default) routes by headers only. Call it before serving.
func (h *Handler) SetDomain(domain string) { h.domain = domain }

// PortRequest reports whether r is for a sandbox port by its host name
// (SetDomain): such requests go to the sandbox whatever their path. A nil
// Handler routes none.
func (h *Handler) PortRequest(r *http.Request) bool {
	if h == nil {
		return false
	}
	_, _, ok := portproxy.ParseHost(r.Host, h.domain)
	return ok
}

// serveHost serves a request PortRequest accepted: envd's and the code
// service's ports as they are served by header, any other port through
// the port proxy.
func (h *Handler) serveHost(w http.ResponseWriter, r *http.Request) {
	port, id, _ := portproxy.ParseHost(r.Host, h.domain)
	if port == EnvdPort || port == codecall.Port {
		r.Header.Set(SandboxIDHeader, id)
		r.Header.Set(PortHeader, port)
		h.serveEnvd(w, r, id)
		return
	}
	h.servePort(w, r, id, port, "e2b-host")
}

// view is viewOf(rec) with the handler's domain (SetDomain), if any.
func (h *Handler) view(rec *node.Session) sandboxView {
	v := viewOf(rec)
	if h.domain != "" {
		d := h.domain
		v.Domain = &d
	}
	return v
}

// detail is detailOf(rec) with the handler's domain, if any.
func (h *Handler) detail(rec *node.Session) sandboxDetail {
	d := detailOf(rec)
	if h.domain != "" {
		dom := h.domain
		d.Domain = &dom
	}
	return d
}

// portError is the body of a port request's error: E2B's {code, message}
// with the sandbox (and, when it is about the port, the port) as E2B's
// proxy names them (INFRA packages/shared/pkg/proxy/template).
type portError struct {
	Code      int    `json:"code"`
	Message   string `json:"message"`
	SandboxID string `json:"sandboxId"`
	Port      string `json:"port,omitempty"`
}

// servePort proxies r to port portText of sandbox id (E2B's user ports:
// anything but envd's 49983 and the code service's 49999), reached by
// E2b-Sandbox-Id + E2b-Sandbox-Port or by host name.
//
// Access: a public sandbox (network.allowPublicTraffic, forkbox's
// public_traffic) takes every request; a private one (the default) needs
// its traffic access token (E2B-Traffic-Access-Token), its envd access
// token (X-Access-Token) or an API key of its tenant (X-API-Key, or
// Authorization: Bearer), else 403 as E2B's proxy answers. An invalid
// X-API-Key is 401; another tenant's key finds no sandbox (404). The
// credentials read are not passed on to the sandbox.
//
// Errors, E2B's JSON: a port that is no number from 1 to 65535, 400;
// an unknown or ended sandbox (or another tenant's), 404; nothing
// listening on the port, 502 at once; a paused sandbox, 409, unless its
// lifecycle auto-resumes (runningOrResume) or it paused itself for
// idleness (resumed by node.Ports.DialPort, as by every call).
func (h *Handler) servePort(w http.ResponseWriter, r *http.Request, id, portText, via string) {
	fail := func(w http.ResponseWriter, r *http.Request, err error) { h.portFail(w, r, id, portText, err) }
	port, err := portproxy.ParsePort(portText)
	if err != nil {
		fail(w, r, err)
		return
	}
	ctx := r.Context()
	strip := []string{SandboxIDHeader, PortHeader, trafficTokenHeader, accessTokenHeader, "X-Api-Key"}
	keyed := false
	if secret := access.Secret(r, true); secret != "" {
		key, err := h.keys.AuthenticateKey(ctx, secret)
		switch {
		case err == nil:
			ctx = tenancy.With(ctx, access.Caller(w, r, key))
			keyed = true
			if r.Header.Get("X-Api-Key") == "" {
				strip = append(strip, "Authorization")
			}
		case r.Header.Get("X-Api-Key") != "" && errors.Is(err, errdefs.ErrUnauthenticated):
			writeError(w, http.StatusUnauthorized, "invalid API key")
			return
		case !errors.Is(err, errdefs.ErrUnauthenticated):
			h.fail(w, r, err)
			return
		}
		// (A Bearer token that is no forkbox key is the application's own.)
	}
	r = r.WithContext(ctx)
	rec, err := h.mgr.Get(ctx, id)
	if err == nil && rec.State == node.StateTerminated {
		err = errdefs.Newf(errdefs.ErrTerminated, "sandbox %s ended (%s)", id, rec.Reason)
	}
	if err != nil {
		fail(w, r, err)
		return
	}
	if !keyed && !rec.PublicTraffic && !tokenOpens(rec, r) {
		msg := trafficTokenProblem(rec, r.Header.Get(trafficTokenHeader))
		httpjson.Write(w, http.StatusForbidden, trafficTokenError{SandboxID: id, Message: msg, Code: http.StatusForbidden})
		return
	}
	if err := h.runningOrResume(ctx, rec); err != nil {
		fail(w, r, err)
		return
	}
	h.ports.ServeHTTP(w, r, portproxy.Request{Session: id, Tenant: rec.Tenant, Port: port,
		Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery, Via: via, Strip: strip, Fail: fail})
}

// tokenOpens reports whether r carries rec's traffic access token or its
// envd access token (constant-time comparisons).
func tokenOpens(rec *node.Session, r *http.Request) bool {
	eq := func(secret, got string) bool {
		return secret != "" && got != "" && subtle.ConstantTimeCompare([]byte(secret), []byte(got)) == 1
	}
	return eq(rec.TrafficToken, r.Header.Get(trafficTokenHeader)) || eq(rec.EnvdToken, r.Header.Get(accessTokenHeader))
}

// portFail writes err, from a request for port portText of sandbox id,
// in E2B's JSON with the status E2B's proxy gives it.
func (h *Handler) portFail(w http.ResponseWriter, r *http.Request, id, portText string, err error) {
	body := portError{SandboxID: id, Port: portText, Message: h.message(r, err)}
	var te *errdefs.TypedError
	switch {
	case errdefs.Field(err) == "port":
		body.Code = http.StatusBadRequest
	case errors.As(err, &te) && te.Type == node.ProblemPortNotListening:
		body.Code, body.Message = http.StatusBadGateway, fmt.Sprintf("nothing listens on port %s in sandbox %s", portText, id)
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrTerminated):
		body.Code, body.Message, body.Port = http.StatusNotFound, fmt.Sprintf("sandbox %s not found", id), ""
	case errors.Is(err, errdefs.ErrConflict):
		body.Code = http.StatusConflict
	case errors.Is(err, errdefs.ErrUnavailable):
		body.Code = http.StatusBadGateway
	default:
		h.fail(w, r, err)
		return
	}
	httpjson.Write(w, body.Code, body)
}
