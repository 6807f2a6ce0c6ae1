// Package e2b serves the E2B API on forkbox's port, so that the unmodified
// E2B SDKs (npm e2b 2.51.0 and the Python SDK) work against forkbox with
// E2B_API_URL and E2B_SANDBOX_URL set to forkbox's URL and E2B_API_KEY to a
// forkbox API key.
//
// Two planes share the port. Requests that carry an E2b-Sandbox-Id header
// are envd requests for that sandbox: they are checked against the
// sandbox's envd access token and proxied to its guest agent (envd.go).
// Other requests under /sandboxes, /v2/sandboxes, /snapshots and
// /templates are the control plane (sandboxes.go, list.go,
// snapshots.go, templates.go, logs.go, network.go), authenticated by
// X-API-KEY; a GET or POST /files with a signature is an uploadUrl() or
// downloadUrl() link (signed.go). Every path outside forkbox's own API
// reaches this handler, and errors, unknown paths included, are E2B's
// {"code": <HTTP status>, "message": "..."} bodies.
//
// The wire contract follows the E2B OpenAPI schema shipped in the SDK
// (dist/index.d.ts, components.schemas) and E2B's reference API server
// (e2b-dev/infra packages/api); the differences are listed in the README's
// "E2B SDK compatibility" section.
package e2b

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/forkbox/forkbox/api/access"
	"github.com/forkbox/forkbox/api/portproxy"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/hostpath"
	"github.com/forkbox/forkbox/internal/httpjson"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/template"
	"github.com/forkbox/forkbox/tenancy"
)

// SandboxIDHeader names the sandbox an envd request is for (E2B SDK
// src/sandbox/index.ts); PortHeader the in-sandbox port (envd's is 49983).
const (
	SandboxIDHeader = "E2b-Sandbox-Id"
	PortHeader      = "E2b-Sandbox-Port"
	// EnvdPort is the port E2B SDKs address envd at.
	EnvdPort = "49983"
)

// maxBody caps a control-plane request body, in bytes.
const maxBody = 1 << 20

// Handler serves both E2B planes. Build it with New.
type Handler struct {
	mgr   node.Node
	keys  *store.Store
	audit *audit.Recorder
	log   *slog.Logger
	mux   *http.ServeMux
	hide  *hostpath.Redactor
	// catalog lists templates (nil: none are listed).
	catalog *template.Catalog
	// builds are the E2B template builds (templatebuild.go).
	builds buildRegistry
	// used remembers the signed file URLs already used (signed.go).
	used *usedSignatures
	// ports reaches sandboxes' own ports (ports.go); domain is the host
	// name suffix of E2B's PORT-ID.DOMAIN form ("" for none: SetDomain).
	ports  *portproxy.Proxy
	domain string
}

// New returns the E2B handler over the sandbox manager; keys authenticates
// API keys (the same keys as the forkbox API) and holds the template
// records; catalog lists the templates; rec records audited requests;
// hide removes host paths from error messages.
func New(mgr node.Node, keys *store.Store, catalog *template.Catalog, rec *audit.Recorder, hide *hostpath.Redactor, log *slog.Logger) *Handler {
	h := &Handler{mgr: mgr, keys: keys, audit: rec, log: log, mux: http.NewServeMux(), hide: hide,
		catalog: catalog, used: newUsedSignatures(), builds: buildRegistry{builds: map[string]*e2bBuild{}},
		ports: &portproxy.Proxy{Ports: mgr, Audit: rec, Log: log}}
	h.routes()
	return h
}

// Handles reports whether r is an E2B request: an envd request (it has the
// E2b-Sandbox-Id header) or one for an E2B control-plane path. The forkbox
// API lives under /v1 and never overlaps.
func Handles(r *http.Request) bool {
	if r.Header.Get(SandboxIDHeader) != "" {
		return true
	}
	p := r.URL.Path
	return p == "/sandboxes" || strings.HasPrefix(p, "/sandboxes/") ||
		p == "/v2/sandboxes" || strings.HasPrefix(p, "/v2/sandboxes/") ||
		p == "/snapshots" || strings.HasPrefix(p, "/templates/") ||
		p == "/v3/templates" || strings.HasPrefix(p, "/v2/templates/")
}

func (h *Handler) routes() {
	// auth authenticates; with a kind, each request is also an audit
	// record (target: what the path's {id} is).
	auth := func(kind, target string, fn http.HandlerFunc) http.Handler {
		var next http.Handler = fn
		if kind != "" {
			next = access.Audited(h.audit, kind, target, next)
		}
		return h.authenticated(next)
	}
	for _, prefix := range []string{"", "/v2"} {
		// SDK 2.51 creates and connects through /v2; earlier ones without.
		h.mux.Handle("POST "+prefix+"/sandboxes", auth("session.create", "", h.handleCreate))
		h.mux.Handle("POST "+prefix+"/sandboxes/{id}/connect", auth("session.connect", "session", h.handleConnect))
		h.mux.Handle("GET "+prefix+"/sandboxes", auth("", "", h.handleList))
	}
	h.mux.Handle("GET /sandboxes/{id}", auth("", "", h.handleGet))
	h.mux.Handle("DELETE /sandboxes/{id}", auth("session.destroy", "session", h.handleKill))
	h.mux.Handle("POST /sandboxes/{id}/timeout", auth("session.timeout", "session", h.handleTimeout))
	h.mux.Handle("POST /sandboxes/{id}/pause", auth("session.pause", "session", h.handlePause))
	h.mux.Handle("POST /sandboxes/{id}/resume", auth("session.resume", "session", h.handleResume))
	h.mux.Handle("GET /sandboxes/{id}/metrics", auth("", "", h.handleMetrics))
	h.mux.Handle("POST /sandboxes/{id}/snapshots", auth("snapshot.create", "session", h.handleSnapshot))
	h.mux.Handle("POST /sandboxes/{id}/fork", auth("snapshot.fork", "session", h.handleFork))
	h.mux.Handle("GET /snapshots", auth("", "", h.handleSnapshots))
	h.mux.Handle("DELETE /templates/{id}", auth("snapshot.delete", "snapshot", h.handleDeleteSnapshot))
	h.mux.Handle("GET /templates", auth("", "", h.handleTemplates))
	h.mux.Handle("GET /templates/aliases/{alias}", auth("", "", h.handleTemplateAlias))
	// Template.build (templatebuild.go); the upload link's PUT carries a
	// one-time token instead of a key.
	h.mux.Handle("POST /v3/templates", auth("template.build", "", h.handleRequestBuild))
	h.mux.Handle("GET /templates/{templateID}/files/{hash}", auth("", "", h.handleFileLink))
	h.mux.Handle("PUT /templates/{templateID}/files/{hash}", http.HandlerFunc(h.handleFileUpload))
	h.mux.Handle("POST /v2/templates/{templateID}/builds/{buildID}", auth("template.build", "", h.handleTriggerBuild))
	h.mux.Handle("GET /templates/{templateID}/builds/{buildID}/status", auth("", "", h.handleBuildStatus))
	h.mux.Handle("GET /sandboxes/{id}/logs", auth("", "", h.handleLogs))
	h.mux.Handle("GET /v2/sandboxes/{id}/logs", auth("", "", h.handleLogsV2))
	h.mux.Handle("PUT /sandboxes/{id}/network", auth("session.network", "session", h.handleNetwork))
}

// ServeHTTP serves one E2B request (Handles(r) must be true).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.PortRequest(r) {
		h.serveHost(w, r)
		return
	}
	if id := r.Header.Get(SandboxIDHeader); id != "" {
		h.serveEnvd(w, r, id)
		return
	}
	if p := r.URL.Path; path.Clean(p) != p {
		writeError(w, http.StatusNotFound, "no such endpoint: "+r.Method+" "+p)
		return
	}
	if r.URL.Path == "/files" && r.URL.Query().Has("signature") {
		h.serveSignedFile(w, r) // an uploadUrl()/downloadUrl() link (signed.go)
		return
	}
	if next, pattern := h.mux.Handler(r); pattern == "" {
		notFoundOrMethod(w, r, next)
		return
	}
	h.mux.ServeHTTP(w, r)
}

// notFoundOrMethod answers a request no route serves in E2B's error JSON
// (the SDKs show its message; the mux's plain text showed as "[object
// Object]"): 405 with Allow when the path is served in other methods,
// else 404. next is what the mux would have run for it.
func notFoundOrMethod(w http.ResponseWriter, r *http.Request, next http.Handler) {
	rec := &statusRecorder{header: http.Header{}}
	next.ServeHTTP(rec, r)
	if rec.status == http.StatusMethodNotAllowed {
		w.Header().Set("Allow", rec.header.Get("Allow"))
		writeError(w, http.StatusMethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path+
			" (allowed: "+rec.header.Get("Allow")+")")
		return
	}
	msg := "no such endpoint: " + r.Method + " " + r.URL.Path + " (forkbox serves E2B's sandbox, snapshot and template calls"
	if r.URL.Path == "/files" || strings.HasPrefix(r.URL.Path, "/process.Process/") || strings.HasPrefix(r.URL.Path, "/filesystem.Filesystem/") {
		msg += "; envd calls need the " + SandboxIDHeader + " header"
	}
	writeError(w, http.StatusNotFound, msg+")")
}

// statusRecorder keeps the status and headers a handler writes, and
// drops its body.
type statusRecorder struct {
	header http.Header
	status int
}

func (s *statusRecorder) Header() http.Header         { return s.header }
func (s *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (s *statusRecorder) WriteHeader(code int)        { s.status = code }

// authenticated runs next only for a request with a valid API key, sent as
// X-API-KEY (what the SDKs send; it wins when both are present, since E2B
// clients may also send a user's access token as Bearer) or
// "Authorization: Bearer <key>"; or one another host of the fleet
// forwarded with a verified signature (access.ForwardedCaller), as the
// caller it carries.
func (h *Handler) authenticated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if caller, ok := access.ForwardedCaller(w, r); ok {
			// Another host of the fleet authenticated the key (package route).
			next.ServeHTTP(w, r.WithContext(tenancy.With(r.Context(), caller)))
			return
		}
		secret := access.Secret(r, true)
		if secret == "" {
			writeError(w, http.StatusUnauthorized, "missing API key: send it as X-API-KEY")
			return
		}
		key, err := h.keys.AuthenticateKey(r.Context(), secret)
		if err != nil {
			if errors.Is(err, errdefs.ErrUnauthenticated) {
				writeError(w, http.StatusUnauthorized, "invalid API key")
				return
			}
			h.fail(w, r, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(tenancy.With(r.Context(), access.Caller(w, r, key))))
	})
}

// apiError is E2B's error body (components.schemas.Error): code repeats
// the HTTP status, which the SDKs read from the body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	httpjson.Write(w, status, apiError{Code: status, Message: msg})
}

// statusFor maps an error class to the status E2B gives it. An ended
// sandbox is not found, as in E2B (the SDK turns 404 into
// SandboxNotFoundError, or false from kill).
func statusFor(err error) int {
	switch errdefs.Class(err) {
	case errdefs.ErrInvalidArgument:
		return http.StatusBadRequest
	case errdefs.ErrUnauthenticated:
		return http.StatusUnauthorized
	case errdefs.ErrPermissionDenied:
		return http.StatusForbidden
	case errdefs.ErrNotFound, errdefs.ErrTerminated:
		return http.StatusNotFound
	case errdefs.ErrConflict:
		return http.StatusConflict
	case errdefs.ErrResourceExhausted:
		return http.StatusTooManyRequests
	case errdefs.ErrInsufficientStorage:
		return http.StatusInsufficientStorage
	case errdefs.ErrUnavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// e2bFields are E2B's names of request fields whose forkbox names differ.
var e2bFields = map[string]string{
	"timeout_s": "timeout", "env": "envVars", "template": "templateID",
}

// fail writes err as an E2B error: field errors name E2B's field, storage
// errors do not show host paths, internal errors are logged and not shown.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := statusFor(err)
	var fe *errdefs.FieldError
	if errors.As(err, &fe) {
		if name, ok := e2bFields[fe.Field]; ok {
			err = errdefs.InvalidField(name, "%s", fe.Reason)
		} else if strings.HasPrefix(fe.Field, "network.allow") {
			err = errdefs.InvalidField("network.allowOut", "%s", fe.Reason)
		}
	}
	msg := h.message(r, err)
	problem := ""
	var te *errdefs.TypedError
	if errors.As(err, &te) {
		if te.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int((te.RetryAfter+time.Second-1)/time.Second)))
		}
		problem = te.Type
	}
	defer func() { access.NoteFrom(r.Context()).Failed(problem, msg) }() // (the message as answered)
	if status == http.StatusInsufficientStorage {
		h.log.Warn("e2b request: insufficient storage", "method", r.Method, "path", r.URL.Path, "err", err)
		msg = "not enough storage on the forkbox host for this sandbox"
	}
	if status == http.StatusInternalServerError {
		if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
			return // the client went away
		}
		h.log.Error("e2b request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		msg = "internal error"
	}
	writeError(w, status, msg)
}

// message is err's text for an E2B error body, with host paths removed
// (logged in full when there were any).
func (h *Handler) message(r *http.Request, err error) string {
	msg, hidden := h.hide.Redact(err.Error())
	if hidden {
		h.log.Warn("host path hidden from an e2b error", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	return msg
}

// decode reads a control-plane JSON body into v as E2B's own server (Go's
// encoding/json) does: unknown fields are ignored (E2B adds optional
// fields often), names match in any case, the Content-Type is not looked
// at; an empty body is {}.
func decode(r *http.Request, v any) error {
	return httpjson.Decode(r, v, maxBody, httpjson.Options{AllowEmpty: true, Peer: true})
}
