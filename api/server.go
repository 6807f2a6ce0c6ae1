// Package api is forkbox's HTTP edge: the REST API under /v1 (JSON in and
// out, exec output as server-sent events, errors as RFC 9457 problem
// details), API-key authentication, request ids and idempotent creates.
// It holds no sandbox logic. The handlers are cut by resource into types of
// their own (handlers.go: sessions, snapshots and pools, exec and
// processes, files, templates, tenants and keys, audit, host info), each
// holding only what it calls (the node.Node, the store, the template
// catalog, the audit recorder, metrics); they share the edge (edge.go),
// which maps errors to problems once (problem.go).
package api

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"path"
	"runtime/debug"
	"strings"
	"time"

	"github.com/forkbox/forkbox/api/access"
	"github.com/forkbox/forkbox/api/e2b"
	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/build"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/hostpath"
	"github.com/forkbox/forkbox/metrics"
	"github.com/forkbox/forkbox/netpolicy"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/template"
	"github.com/forkbox/forkbox/tenancy"
)

const requestIDHeader = access.RequestIDHeader

// Server serves the REST API: it adds request ids, authenticates, audits
// and routes each request to the handler type of its resource
// (handlers.go). Build it with New.
type Server struct {
	edge
	// store authenticates API keys.
	store *store.Store
	mux   *http.ServeMux
	// e2b serves the E2B-compatible API on the same port.
	e2b *e2b.Handler
	// audit records requests.
	audit *audit.Recorder
	// secrets serves /v1/secrets once SetSecrets gives it the broker.
	secrets *secretAPI
	// hostsAPI serves GET /v1/hosts (SetHosts).
	hostsAPI *hostsAPI
	// sessions serves the session routes (SetEnded reaches it).
	sessions *sessionAPI
	// auditAPI serves GET /v1/audit (SetAuditReader).
	auditAPI *auditAPI
	// builder builds Dockerfiles for the REST and the E2B edges.
	builder *build.Builder
}

// SetFetcher gives the Dockerfile builder its downloader of ADD URLs
// (build.Builder.SetFetcher; the daemon's egress service's, so a
// download passes the build's allow-list as its RUN steps' traffic
// does). Without it an ADD of a URL is 503. Call it before serving.
func (s *Server) SetFetcher(f *netpolicy.Fetcher) { s.builder.SetFetcher(f) }

// SetDomain routes requests for host names "PORT-ID.domain" to sandbox
// ports and names domain in E2B's sandbox answers (e2b.Handler.SetDomain;
// forkbox serve --domain). Call it before serving.
func (s *Server) SetDomain(domain string) { s.e2b.SetDomain(domain) }

// New returns the API server over the given manager, store and catalog.
// spoolDir is where uploads are staged (on the data directory's
// filesystem); rec records audited requests; ms serves GET /metrics; hide
// removes host paths from every error detail either API answers (and
// from the audit record of the failure), which the log then has in full.
func New(mgr node.Node, st *store.Store, catalog *template.Catalog, spoolDir string, rec *audit.Recorder,
	ms *metrics.Set, hide *hostpath.Redactor, log *slog.Logger) *Server {
	e := edge{log: log, hide: hide}
	s := &Server{edge: e, store: st, mux: http.NewServeMux(), e2b: e2b.New(mgr, st, catalog, rec, hide, log), audit: rec,
		hostsAPI: &hostsAPI{edge: e}}
	hs := newHandlers(e, mgr, st, catalog, spoolDir, rec, ms)
	s.secrets, s.auditAPI = hs.secrets, hs.audit
	s.sessions = hs.sessions
	s.builder = hs.templates.builder
	s.e2b.SetTemplateBuilder(hs.templates.buildForE2B, spoolDir)
	s.routes(hs)
	return s
}

// routes registers every REST route of the API on s's mux, served by the
// handler types in hs.
func (s *Server) routes(hs handlers) {
	// Open endpoints.
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.mux.HandleFunc("GET /problems/{slug}", handleProblemDoc)
	s.mux.Handle("/mcp", s.mcpHandler())

	// A kind makes each request an audit record; target says what the
	// path's {id} is; admin routes need an admin key.
	type route struct {
		pattern, kind, target string
		h                     http.HandlerFunc
		admin                 bool
	}
	for _, rt := range []route{
		{"GET /v1/info", "", "", hs.host.handleInfo, false},
		{"POST /v1/sessions", "session.create", "", hs.sessions.handleCreate, false},
		{"GET /v1/sessions", "", "", hs.sessions.handleList, false},
		{"GET /v1/sessions/{id}", "", "", hs.sessions.handleGet, false},
		{"DELETE /v1/sessions/{id}", "session.destroy", "session", hs.sessions.handleDelete, false},
		{"POST /v1/sessions/{id}/timeout", "session.timeout", "session", hs.sessions.handleTimeout, false},
		{"GET /v1/sessions/{id}/usage", "", "", hs.sessions.handleUsage, false},
		{"GET /v1/sessions/{id}/egress", "", "", hs.sessions.handleEgress, false},
		{"POST /v1/sessions/{id}/pause", "session.pause", "session", hs.sessions.handlePause, false},
		{"POST /v1/sessions/{id}/resume", "session.resume", "session", hs.sessions.handleResume, false},
		{"POST /v1/sessions/{id}/migrate", "session.migrate", "session", hs.sessions.handleMigrate, false},
		{"POST /v1/sessions/{id}/snapshot", "snapshot.create", "session", hs.snapshots.handleSnapshot, false},
		{"POST /v1/sessions/{id}/fork", "snapshot.fork", "session", hs.snapshots.handleSessionFork, false},
		{"GET /v1/sessions/{id}/diff", "", "", hs.snapshots.handleSessionDiff, false},
		{"POST /v1/sessions/{id}/merge", "session.merge", "session", hs.snapshots.handleMerge, false},

		{"GET /v1/snapshots", "", "", hs.snapshots.handleSnapshots, false},
		{"GET /v1/snapshots/{id}", "", "", hs.snapshots.handleGetSnapshot, false},
		{"DELETE /v1/snapshots/{id}", "snapshot.delete", "snapshot", hs.snapshots.handleDeleteSnapshot, false},
		{"POST /v1/snapshots/{id}/fork", "snapshot.fork", "snapshot", hs.snapshots.handleSnapshotFork, false},
		{"GET /v1/snapshots/{id}/diff", "", "", hs.snapshots.handleSnapshotDiff, false},

		{"GET /v1/pools", "", "", hs.snapshots.handlePools, false},

		{"POST /v1/sessions/{id}/exec", "exec", "session", hs.exec.handleExec, false},
		{"GET /v1/sessions/{id}/processes", "", "", hs.exec.handleProcesses, false},
		{"GET /v1/sessions/{id}/processes/{pid}/stream", "", "", hs.exec.handleAttach, false},
		{"POST /v1/sessions/{id}/processes/{pid}/signal", "process.signal", "session", hs.exec.handleSignal, false},
		{"DELETE /v1/sessions/{id}/processes/{pid}", "process.kill", "session", hs.exec.handleKill, false},
		{"POST /v1/sessions/{id}/processes/{pid}/stdin", "process.stdin", "session", hs.exec.handleStdin, false},

		{"POST /v1/sessions/{id}/code/{path...}", "code", "session", hs.code.handleCode, false},
		{"GET /v1/sessions/{id}/code/{path...}", "", "", hs.code.handleCode, false},
		{"DELETE /v1/sessions/{id}/code/{path...}", "code", "session", hs.code.handleCode, false},

		{"GET /v1/sessions/{id}/ports/{port}", "", "", hs.ports.handleConnect, false},
		{"/v1/sessions/{id}/ports/{port}/{path...}", "", "", hs.ports.handleHTTP, false},

		{"PUT /v1/sessions/{id}/files/{path...}", "file.write", "session", hs.files.handleUpload, false},
		{"GET /v1/sessions/{id}/files/{path...}", "file.read", "session", hs.files.handleDownload, false},
		{"DELETE /v1/sessions/{id}/files/{path...}", "file.remove", "session", hs.files.handleRemove, false},
		{"GET /v1/sessions/{id}/fs/stat", "file.stat", "session", hs.files.handleStat, false},
		{"GET /v1/sessions/{id}/fs/list", "file.list", "session", hs.files.handleListDir, false},
		{"POST /v1/sessions/{id}/fs/mkdir", "file.mkdir", "session", hs.files.handleMkdir, false},
		{"POST /v1/sessions/{id}/fs/move", "file.move", "session", hs.files.handleMove, false},

		{"GET /v1/templates", "", "", hs.templates.handleTemplates, false},
		{"GET /v1/templates/{name}", "", "", hs.templates.handleTemplate, false},
		{"PUT /v1/templates/{name}", "template.import", "", hs.templates.handleTemplateImport, false},
		{"DELETE /v1/templates/{name}", "template.delete", "", hs.templates.handleTemplateDelete, false},
		{"POST /v1/templates/{name}/build", "template.build", "", hs.templates.handleTemplateBuild, false},

		{"GET /v1/audit", "", "", hs.audit.handleAudit, false},

		// The broker records set and remove itself (never a value).
		{"PUT /v1/secrets/{name}", "", "", hs.secrets.handleSet, false},
		{"GET /v1/secrets", "", "", hs.secrets.handleList, false},
		{"GET /v1/secrets/{name}", "", "", hs.secrets.handleGet, false},
		{"DELETE /v1/secrets/{name}", "", "", hs.secrets.handleRemove, false},

		{"POST /v1/volumes", "volume.create", "", hs.volumes.handleCreate, false},
		{"GET /v1/volumes", "", "", hs.volumes.handleList, false},
		{"GET /v1/volumes/{name}", "", "", hs.volumes.handleGet, false},
		{"DELETE /v1/volumes/{name}", "volume.delete", "", hs.volumes.handleDelete, false},
		{"POST /v1/volumes/{name}/snapshots", "volume.snapshot", "", hs.volumes.handleSnapshot, false},
		{"GET /v1/volumes/{name}/snapshots", "", "", hs.volumes.handleSnapshots, false},
		{"DELETE /v1/volumes/{name}/snapshots/{snap}", "volume.snapshot.delete", "", hs.volumes.handleDeleteSnapshot, false},

		// Admin: tenants, keys, warm pools (host-wide), metrics, the fleet's hosts.
		{"PUT /v1/pools/{template}", "pool.set", "", hs.snapshots.handleSetPool, true},
		{"POST /v1/tenants", "tenant.create", "", hs.tenants.handleCreateTenant, true},
		{"GET /v1/tenants", "", "", hs.tenants.handleTenants, true},
		{"GET /v1/tenants/{name}", "", "", hs.tenants.handleTenant, true},
		{"PUT /v1/tenants/{name}", "tenant.update", "", hs.tenants.handleUpdateTenant, true},
		{"DELETE /v1/tenants/{name}", "tenant.delete", "", hs.tenants.handleDeleteTenant, true},
		{"POST /v1/tenants/{name}/keys", "key.create", "", hs.tenants.handleCreateKey, true},
		{"GET /v1/keys", "", "", hs.tenants.handleKeys, true},
		{"DELETE /v1/keys/{id}", "key.revoke", "", hs.tenants.handleRevokeKey, true},
		{"GET /metrics", "", "", hs.host.handleMetrics, true},
		{"GET /v1/hosts", "", "", s.hostsAPI.handleHosts, true},
		{"POST /v1/hosts/{id}/drain", "host.drain", "", s.hostsAPI.handleDrain, true},
		{"POST /v1/hosts/{id}/undrain", "host.undrain", "", s.hostsAPI.handleUndrain, true},
	} {
		var h http.Handler = rt.h
		if rt.kind != "" {
			h = access.Audited(s.audit, rt.kind, rt.target, h)
		}
		s.mux.Handle(rt.pattern, s.authenticated(h, rt.admin))
	}
}

// ServeHTTP adds the request id, recovers from handler panics (one bad
// request never takes the daemon down) and routes: E2B requests (e2b.Handles,
// and every path outside forkbox's own roots: ownPath) to the E2B handler,
// the rest to the forkbox API. Unknown paths and methods under forkbox's
// roots get problem responses; elsewhere E2B's error JSON.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(requestIDHeader)
	if id == "" || len(id) > 128 {
		id = newRequestID()
	}
	w.Header().Set(requestIDHeader, id)
	start := time.Now()
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("handler panic", "method", r.Method, "path", r.URL.Path, "request_id", id, "panic", v,
				"stack", string(debug.Stack()))
			writeProblem(w, r, ProblemFor(errdefs.ErrInternal))
		}
	}()
	if s.e2b.PortRequest(r) || e2b.Handles(r) || !s.ownPath(r) {
		s.e2b.ServeHTTP(w, r)
	} else if r.Method != http.MethodConnect && !isCleanPath(r.URL.EscapedPath()) {
		// The mux would redirect to the cleaned path, which for
		// "/v1/sessions/a/files/x/../y" is another resource; say so instead.
		s.writeError(w, r, uncleanPathError(r.URL.EscapedPath()))
	} else if h, pattern := s.mux.Handler(r); pattern == "" {
		s.notFoundOrMethod(w, r, h)
	} else if name, ok := redirectsToRest(pattern, r.URL.Path); ok {
		// The mux would redirect ".../files" to ".../files/" (text/html),
		// where the rest of the path is empty.
		s.writeError(w, r, errdefs.InvalidField(name, "is empty"))
	} else {
		s.mux.ServeHTTP(w, r) // (Handler does not set path values; ServeHTTP does)
	}
	s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "request_id", id,
		"duration_ms", time.Since(start).Milliseconds())
}

// ownRoots are the path roots of forkbox's own API; every other path is
// E2B's (e2b.Handler answers what it does not serve with E2B's error JSON,
// which the E2B SDKs and CLI can read).
var ownRoots = []string{"/v1", "/health", "/problems", "/metrics"}

// ownPath reports whether r is for forkbox's own API: a path under one of
// ownRoots, or one a route of s's mux serves (in any method).
func (s *Server) ownPath(r *http.Request) bool {
	p := r.URL.Path
	for _, root := range ownRoots {
		if p == root || strings.HasPrefix(p, root+"/") {
			return true
		}
	}
	_, pattern := s.mux.Handler(r)
	return pattern != ""
}

// notFoundOrMethod turns the mux's plain-text 404 and 405 into problems.
func (s *Server) notFoundOrMethod(w http.ResponseWriter, r *http.Request, h http.Handler) {
	rec := &statusRecorder{header: http.Header{}}
	h.ServeHTTP(rec, r)
	if rec.status == http.StatusMethodNotAllowed {
		w.Header().Set("Allow", rec.header.Get("Allow"))
		writeProblem(w, r, v1.Problem{Type: "about:blank", Title: "Method not allowed", Status: http.StatusMethodNotAllowed,
			Detail: r.Method + " is not allowed on " + r.URL.Path})
		return
	}
	writeProblem(w, r, v1.Problem{Type: problemPath + "not-found", Title: "Not found", Status: http.StatusNotFound,
		Detail: "no such endpoint: " + r.Method + " " + r.URL.Path})
}

// isCleanPath reports whether the escaped URL path p is one the mux routes
// as is: rooted, without ".", ".." or empty segments (a trailing slash is fine).
func isCleanPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c == p
}

// collectionIDs names what the path segment after each collection of the
// API is, for the error of a path where it is empty
// ("/v1/sessions//exec").
var collectionIDs = map[string]string{
	"sessions": "a session id", "snapshots": "a snapshot id", "templates": "a template name",
	"tenants": "a tenant name", "keys": "a key id", "pools": "a template name", "processes": "a process id",
}

// uncleanPathError is the invalid-argument error for the escaped URL path
// p, which isCleanPath refused: an empty segment after a collection is a
// missing id ("a session id is required", field "id"), anything else a
// path that is not clean (field "path").
func uncleanPathError(p string) error {
	segs := strings.Split(p, "/")   // ["", "v1", collection, id, ...]
	for _, i := range []int{3, 5} { // /v1/sessions/{id}, /v1/sessions/{id}/processes/{pid}
		if len(segs) > i && segs[1] == "v1" && segs[i] == "" && (i == 3 || segs[2] == "sessions") {
			if what, ok := collectionIDs[segs[i-1]]; ok {
				return errdefs.InvalidField("id", "%s is required", what)
			}
		}
	}
	return errdefs.InvalidField("path", "the URL path is not clean (it has '..', '.' or '//' segments)")
}

// redirectsToRest reports whether the mux would redirect path to path+"/"
// to match pattern, whose last segment is a rest wildcard ("{path...}"):
// path stops right before that segment. name is the wildcard's.
func redirectsToRest(pattern, path string) (name string, ok bool) {
	_, pp, _ := strings.Cut(pattern, " ")
	i := strings.LastIndex(pp, "/{")
	if i < 0 || !strings.HasSuffix(pp, "...}") || strings.HasSuffix(path, "/") {
		return "", false
	}
	if strings.Count(path, "/") != strings.Count(pp, "/")-1 {
		return "", false
	}
	return strings.TrimSuffix(pp[i+2:], "...}"), true
}

type statusRecorder struct {
	header http.Header
	status int
}

func (s *statusRecorder) Header() http.Header         { return s.header }
func (s *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (s *statusRecorder) WriteHeader(code int)        { s.status = code }

// authenticated wraps h so that it runs only with a valid, unrevoked API
// key, given as "Authorization: Bearer <key>" or "X-API-Key: <key>", and
// with the caller (tenant, key, request id, Idempotency-Key) in its
// context; a request another host of the fleet forwarded with a verified
// signature (access.ForwardedCaller) runs as the caller it carries
// instead. admin: only admin keys (403 for others).
func (s *Server) authenticated(h http.Handler, admin bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if caller, ok := access.ForwardedCaller(w, r); ok {
			// Another host of the fleet authenticated the key (package route).
			s.serveAs(w, r, h, caller, admin)
			return
		}
		secret := access.Secret(r, false)
		if secret == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="forkbox"`)
			s.writeError(w, r, errdefs.Newf(errdefs.ErrUnauthenticated, "missing API key"))
			return
		}
		key, err := s.store.AuthenticateKey(r.Context(), secret)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="forkbox", error="invalid_token"`)
			if !errors.Is(err, errdefs.ErrUnauthenticated) {
				s.writeError(w, r, err)
				return
			}
			s.writeError(w, r, errdefs.Newf(errdefs.ErrUnauthenticated, "invalid API key"))
			return
		}
		s.serveAs(w, r, h, access.Caller(w, r, key), admin)
	})
}

// serveAs runs h for r as caller; admin: only for an admin caller (403
// and an audit record for others).
func (s *Server) serveAs(w http.ResponseWriter, r *http.Request, h http.Handler, caller tenancy.Caller, admin bool) {
	ctx := tenancy.With(r.Context(), caller)
	if admin && !caller.Admin {
		// An attempt on an admin endpoint is itself worth a record.
		s.audit.Record(ctx, audit.Event{Kind: "admin", Outcome: audit.Denied,
			Detail: map[string]any{"method": r.Method, "path": r.URL.Path}})
		s.writeError(w, r, errdefs.Newf(errdefs.ErrPermissionDenied, "this needs an admin key"))
		return
	}
	h.ServeHTTP(w, r.WithContext(ctx))
}

func newRequestID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
