// Package api is forkbox's HTTP edge: the REST API under /v1 (JSON in and
// out, exec output as server-sent events, errors as RFC 9457 problem
// details), API-key authentication, request ids and idempotent creates.
// It holds no sandbox logic; every handler calls the sandbox manager or the
// template catalog and maps errors to problems once (problem.go).
package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"path"
	"runtime/debug"
	"strings"
	"time"

	"github.com/forkbox/forkbox/api/e2b"
	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/version"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/sandbox"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/template"
)

const requestIDHeader = "X-Request-Id"

// Server serves the REST API. Build it with New.
type Server struct {
	mgr     *sandbox.Manager
	store   *store.Store
	catalog *template.Catalog
	log     *slog.Logger
	mux     *http.ServeMux
	// spoolDir receives uploaded image tarballs before import.
	spoolDir string
	// e2b serves the E2B-compatible API on the same port.
	e2b *e2b.Handler
}

// New returns the API server over the given manager, store and catalog.
// spoolDir is where uploads are staged (on the data directory's filesystem).
func New(mgr *sandbox.Manager, st *store.Store, catalog *template.Catalog, spoolDir string, log *slog.Logger) *Server {
	s := &Server{mgr: mgr, store: st, catalog: catalog, log: log, mux: http.NewServeMux(), spoolDir: spoolDir,
		e2b: e2b.New(mgr, st, log)}
	s.routes()
	return s
}

func (s *Server) routes() {
	// Open endpoints.
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.mux.HandleFunc("GET /problems/{slug}", handleProblemDoc)

	auth := s.authenticated
	s.mux.Handle("GET /v1/info", auth(s.handleInfo))
	s.mux.Handle("POST /v1/sessions", auth(s.handleCreate))
	s.mux.Handle("GET /v1/sessions", auth(s.handleList))
	s.mux.Handle("GET /v1/sessions/{id}", auth(s.handleGet))
	s.mux.Handle("DELETE /v1/sessions/{id}", auth(s.handleDelete))
	s.mux.Handle("POST /v1/sessions/{id}/timeout", auth(s.handleTimeout))
	s.mux.Handle("GET /v1/sessions/{id}/usage", auth(s.handleUsage))
	s.mux.Handle("GET /v1/sessions/{id}/egress", auth(s.handleEgress))
	s.mux.Handle("POST /v1/sessions/{id}/pause", auth(s.handlePause))
	s.mux.Handle("POST /v1/sessions/{id}/resume", auth(s.handleResume))
	s.mux.Handle("POST /v1/sessions/{id}/snapshot", auth(s.handleSnapshot))
	s.mux.Handle("POST /v1/sessions/{id}/fork", auth(s.handleSessionFork))

	s.mux.Handle("GET /v1/snapshots", auth(s.handleSnapshots))
	s.mux.Handle("GET /v1/snapshots/{id}", auth(s.handleGetSnapshot))
	s.mux.Handle("DELETE /v1/snapshots/{id}", auth(s.handleDeleteSnapshot))
	s.mux.Handle("POST /v1/snapshots/{id}/fork", auth(s.handleSnapshotFork))

	s.mux.Handle("GET /v1/pools", auth(s.handlePools))
	s.mux.Handle("PUT /v1/pools/{template}", auth(s.handleSetPool))

	s.mux.Handle("POST /v1/sessions/{id}/exec", auth(s.handleExec))
	s.mux.Handle("GET /v1/sessions/{id}/processes", auth(s.handleProcesses))
	s.mux.Handle("GET /v1/sessions/{id}/processes/{pid}/stream", auth(s.handleAttach))
	s.mux.Handle("POST /v1/sessions/{id}/processes/{pid}/signal", auth(s.handleSignal))
	s.mux.Handle("DELETE /v1/sessions/{id}/processes/{pid}", auth(s.handleKill))
	s.mux.Handle("POST /v1/sessions/{id}/processes/{pid}/stdin", auth(s.handleStdin))

	s.mux.Handle("PUT /v1/sessions/{id}/files/{path...}", auth(s.handleUpload))
	s.mux.Handle("GET /v1/sessions/{id}/files/{path...}", auth(s.handleDownload))
	s.mux.Handle("DELETE /v1/sessions/{id}/files/{path...}", auth(s.handleRemove))
	s.mux.Handle("GET /v1/sessions/{id}/fs/stat", auth(s.handleStat))
	s.mux.Handle("GET /v1/sessions/{id}/fs/list", auth(s.handleListDir))
	s.mux.Handle("POST /v1/sessions/{id}/fs/mkdir", auth(s.handleMkdir))
	s.mux.Handle("POST /v1/sessions/{id}/fs/move", auth(s.handleMove))

	s.mux.Handle("GET /v1/templates", auth(s.handleTemplates))
	s.mux.Handle("GET /v1/templates/{name}", auth(s.handleTemplate))
	s.mux.Handle("PUT /v1/templates/{name}", auth(s.handleTemplateImport))
	s.mux.Handle("DELETE /v1/templates/{name}", auth(s.handleTemplateDelete))
}

// ServeHTTP adds the request id, recovers from handler panics (one bad
// request never takes the daemon down) and routes: E2B requests (e2b.Handles)
// to the E2B handler, the rest to the forkbox API. Unknown paths and
// methods get problem responses too.
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
	if e2b.Handles(r) {
		s.e2b.ServeHTTP(w, r)
	} else if r.Method != http.MethodConnect && !isCleanPath(r.URL.EscapedPath()) {
		// The mux would redirect to the cleaned path, which for
		// "/v1/sessions/a/files/x/../y" is another resource; say so instead.
		writeProblem(w, r, v1.Problem{Type: problemPath + "invalid-argument", Title: "Invalid argument",
			Status: http.StatusBadRequest, Field: "path", Detail: "the URL path is not clean (it has '..', '.' or '//' segments)"})
	} else if h, pattern := s.mux.Handler(r); pattern == "" {
		s.notFoundOrMethod(w, r, h)
	} else {
		s.mux.ServeHTTP(w, r) // (Handler does not set path values; ServeHTTP does)
	}
	s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "request_id", id,
		"duration_ms", time.Since(start).Milliseconds())
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

type statusRecorder struct {
	header http.Header
	status int
}

func (s *statusRecorder) Header() http.Header         { return s.header }
func (s *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (s *statusRecorder) WriteHeader(code int)        { s.status = code }

type keyContextKey struct{}

// authenticated wraps h so that it runs only with a valid API key, given as
// "Authorization: Bearer <key>" or "X-API-Key: <key>".
func (s *Server) authenticated(h func(http.ResponseWriter, *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secret := r.Header.Get("X-API-Key")
		if v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			secret = strings.TrimSpace(v)
		}
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
		h(w, r.WithContext(context.WithValue(r.Context(), keyContextKey{}, key)))
	})
}

func newRequestID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (s *Server) handleInfo(w http.ResponseWriter, r *http.Request) {
	var drivers []v1.DriverInfo
	for _, d := range s.mgr.Drivers() {
		drivers = append(drivers, v1.DriverInfo{Name: d.Name(), Capabilities: capabilityMap(d.Capabilities())})
	}
	writeJSON(w, http.StatusOK, v1.Info{
		Version: version.String(), EnvdVersion: version.EnvdVersion,
		Drivers: drivers, DefaultDriver: s.mgr.DefaultDriver().Name(), Limits: s.mgr.Limits(),
	})
}

// capabilityMap lists a driver's capabilities by their JSON names.
func capabilityMap(c runtime.Capabilities) map[string]bool {
	return map[string]bool{
		"pause": c.Pause, "memory_snapshot": c.MemorySnapshot, "fork": c.Fork, "user_namespace": c.UserNamespace,
		"sandbox_oom": c.SandboxOOM, "network": c.Network,
	}
}
