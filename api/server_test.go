package api

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/api/e2b"
	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/hostpath"
)

// newTestServer returns a Server with the real routes and no manager,
// store or catalog: enough for everything that fails before a handler
// needs them.
func newTestServer() *Server {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := &Server{edge: edge{log: log}, mux: http.NewServeMux(), e2b: e2b.New(nil, nil, nil, nil, nil, log)}
	s.routes(newHandlers(s.edge, nil, nil, nil, "", nil, nil))
	return s
}

// serve runs one request through s and returns the recorder.
func serve(s *Server, method, target string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	return w
}

// problemOf fails t unless w is a problem+json response with status, and
// returns the problem.
func problemOf(t *testing.T, w *httptest.ResponseRecorder, status int) v1.Problem {
	t.Helper()
	if w.Code != status || w.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("got %d %q %q, want %d problem+json", w.Code, w.Header().Get("Content-Type"), w.Body.String(), status)
	}
	var p v1.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	if p.Status != status || p.RequestID == "" || p.RequestID != w.Header().Get(requestIDHeader) {
		t.Fatalf("problem %+v (X-Request-Id %q)", p, w.Header().Get(requestIDHeader))
	}
	return p
}

// TestUnknownPathIsProblem proves an unknown path is a 404 not-found problem
// naming the request, for any method.
func TestUnknownPathIsProblem(t *testing.T) {
	s := newTestServer()
	for _, target := range []string{"/v1/nope", "/v1/sessions/", "/v1/sessions/a/b/c", "/health/x", "/problems"} {
		w := serve(s, "GET", target)
		p := problemOf(t, w, http.StatusNotFound)
		if p.Type != "/problems/not-found" || p.Instance != target || !strings.Contains(p.Detail, "GET "+target) {
			t.Errorf("%s: %+v", target, p)
		}
	}
}

// TestOtherPathsAreE2BErrors proves every path outside forkbox's own
// roots is E2B's: unknown paths and wrong methods answer E2B's
// {"code","message"} JSON (which the SDKs show), not a problem.
func TestOtherPathsAreE2BErrors(t *testing.T) {
	s := newTestServer()
	for _, tc := range []struct {
		method, target string
		status         int
		want           string
	}{
		{"GET", "/nope", http.StatusNotFound, "no such endpoint: GET /nope"},
		{"GET", "/sandboxes/abc/nothing", http.StatusNotFound, "no such endpoint"},
		{"POST", "/files", http.StatusNotFound, "envd calls need the E2b-Sandbox-Id header"},
		{"PATCH", "/sandboxes", http.StatusMethodNotAllowed, "PATCH is not allowed on /sandboxes"},
		{"PUT", "/templates", http.StatusMethodNotAllowed, "PUT is not allowed on /templates"},
	} {
		w := serve(s, tc.method, tc.target)
		var body struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || w.Code != tc.status || body.Code != tc.status ||
			!strings.Contains(body.Message, tc.want) || w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d %q %q (%v), want %d with %q", tc.method, tc.target, w.Code,
				w.Header().Get("Content-Type"), w.Body.String(), err, tc.status, tc.want)
		}
		if tc.status == http.StatusMethodNotAllowed && w.Header().Get("Allow") == "" {
			t.Errorf("%s %s: no Allow header", tc.method, tc.target)
		}
	}
}

// TestWrongMethodIsProblem proves a known path with a wrong method is a 405
// problem with the allowed methods in Allow.
func TestWrongMethodIsProblem(t *testing.T) {
	s := newTestServer()
	w := serve(s, "PATCH", "/v1/sessions/abc")
	p := problemOf(t, w, http.StatusMethodNotAllowed)
	if p.Instance != "/v1/sessions/abc" || !strings.Contains(p.Detail, "PATCH") {
		t.Errorf("%+v", p)
	}
	allow := w.Header().Get("Allow")
	if !strings.Contains(allow, "GET") || !strings.Contains(allow, "DELETE") || strings.Contains(allow, "PATCH") {
		t.Errorf("Allow = %q", allow)
	}
}

// TestUncleanPathIsProblem proves a path with ".", ".." or "//" segments is
// a 400 invalid-argument problem for field "path", never a redirect to
// another resource, even when the cleaned path names a route.
func TestUncleanPathIsProblem(t *testing.T) {
	s := newTestServer()
	for _, target := range []string{
		"/v1/sessions/x/../y",
		"/v1/sessions/x/files/home/user/../other/secret",
		"/v1/sessions/x/files/sessions//y",
		"/v1/sessions/x/files/./a",
		"/v1/x/../nothing",
	} {
		w := serve(s, "GET", target)
		p := problemOf(t, w, http.StatusBadRequest)
		if p.Type != "/problems/invalid-argument" || p.Field != "path" || w.Header().Get("Location") != "" {
			t.Errorf("%s: %+v (Location %q)", target, p, w.Header().Get("Location"))
		}
	}
}

// TestMissingIDIsProblem proves a path whose session, snapshot, template,
// tenant, key or process id is empty ("/v1/sessions//exec", what a client
// makes of an empty id) is a 400 naming the missing id, not "the URL path
// is not clean".
func TestMissingIDIsProblem(t *testing.T) {
	s := newTestServer()
	for target, want := range map[string]string{
		"/v1/sessions//exec":                 "a session id is required",
		"/v1/sessions//":                     "a session id is required",
		"/v1/snapshots//fork":                "a snapshot id is required",
		"/v1/templates//x":                   "a template name is required",
		"/v1/tenants//keys":                  "a tenant name is required",
		"/v1/sessions/abc/processes//stream": "a process id is required",
	} {
		p := problemOf(t, serve(s, "POST", target), http.StatusBadRequest)
		if p.Type != "/problems/invalid-argument" || p.Field != "id" || !strings.Contains(p.Detail, want) {
			t.Errorf("%s: %+v, want field id: %s", target, p, want)
		}
	}
}

// TestRestWildcardNotRedirected proves a files path without a file
// ("/v1/sessions/x/files") is a 400 problem naming the empty path, not
// the mux's text/html redirect to ".../files/".
func TestRestWildcardNotRedirected(t *testing.T) {
	s := newTestServer()
	for _, method := range []string{"GET", "PUT", "DELETE"} {
		w := serve(s, method, "/v1/sessions/x/files")
		p := problemOf(t, w, http.StatusBadRequest)
		if p.Field != "path" || !strings.Contains(p.Detail, "is empty") || w.Header().Get("Location") != "" {
			t.Errorf("%s: %+v (Location %q)", method, p, w.Header().Get("Location"))
		}
	}
	if name, ok := redirectsToRest("GET /v1/sessions/{id}/files/{path...}", "/v1/sessions/x/files/a"); ok {
		t.Errorf("a path with a file is redirected (%s)", name)
	}
}

// TestRequestIDEchoed proves a client's X-Request-Id is echoed in the header
// and the problem, an over-long one is replaced, and a missing one generated.
func TestRequestIDEchoed(t *testing.T) {
	s := newTestServer()
	w := serve(s, "GET", "/v1/nope", requestIDHeader, "client-id-42")
	if p := problemOf(t, w, http.StatusNotFound); p.RequestID != "client-id-42" {
		t.Fatalf("request id %q, want the client's", p.RequestID)
	}
	long := strings.Repeat("x", 129)
	w = serve(s, "GET", "/v1/nope", requestIDHeader, long)
	if id := problemOf(t, w, http.StatusNotFound).RequestID; id == long || len(id) != 24 {
		t.Fatalf("over-long id replaced by %q, want a new 24-hex-digit id", id)
	}
	a := problemOf(t, serve(s, "GET", "/v1/nope"), http.StatusNotFound).RequestID
	b := problemOf(t, serve(s, "GET", "/v1/nope"), http.StatusNotFound).RequestID
	if a == b {
		t.Fatalf("generated request ids repeat: %q", a)
	}
	if got := serve(s, "GET", "/health", requestIDHeader, "h-1").Header().Get(requestIDHeader); got != "h-1" {
		t.Fatalf("a successful response carries X-Request-Id %q", got)
	}
}

// TestMissingAPIKeyIsProblem proves an authenticated route without a key
// is a 401 unauthenticated problem with a WWW-Authenticate challenge.
func TestMissingAPIKeyIsProblem(t *testing.T) {
	s := newTestServer()
	w := serve(s, "GET", "/v1/sessions")
	if p := problemOf(t, w, http.StatusUnauthorized); p.Type != "/problems/unauthenticated" {
		t.Fatalf("%+v", p)
	}
	if !strings.HasPrefix(w.Header().Get("WWW-Authenticate"), "Bearer") {
		t.Fatalf("WWW-Authenticate = %q", w.Header().Get("WWW-Authenticate"))
	}
}

// TestPanicIsInternalProblem proves a panicking handler yields a 500
// internal problem without the panic text, and the server keeps serving.
func TestPanicIsInternalProblem(t *testing.T) {
	s := &Server{edge: edge{log: slog.New(slog.NewTextHandler(io.Discard, nil))}, mux: http.NewServeMux()}
	s.mux.HandleFunc("GET /boom", func(http.ResponseWriter, *http.Request) { panic("secret detail") })
	s.mux.HandleFunc("GET /ok", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	w := serve(s, "GET", "/boom")
	if p := problemOf(t, w, http.StatusInternalServerError); p.Type != "/problems/internal" || strings.Contains(w.Body.String(), "secret") {
		t.Fatalf("%+v", p)
	}
	if w := serve(s, "GET", "/ok"); w.Code != http.StatusNoContent {
		t.Fatalf("after a panic: %d", w.Code)
	}
}

// TestProblemDocs proves GET /problems/{slug} describes every problem type
// ProblemTypes lists, without authentication, and an unknown slug is a
// not-found problem.
func TestProblemDocs(t *testing.T) {
	s := newTestServer()
	for _, typ := range ProblemTypes() {
		w := serve(s, "GET", typ)
		if w.Code != http.StatusOK || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
			t.Fatalf("%s: %d %q", typ, w.Code, w.Header().Get("Content-Type"))
		}
		slug := strings.TrimPrefix(typ, problemPath)
		for _, pc := range problemClasses {
			if pc.slug == slug && (!strings.Contains(w.Body.String(), pc.title) || !strings.Contains(w.Body.String(), pc.about)) {
				t.Errorf("%s: body %q lacks the title or description", typ, w.Body.String())
			}
		}
	}
	p := problemOf(t, serve(s, "GET", "/problems/no-such-problem"), http.StatusNotFound)
	if p.Type != "/problems/not-found" {
		t.Fatalf("%+v", p)
	}
}

// TestProblemDetailHidesHostPaths proves a detail that still names a path
// under the daemon's own directories (a storage error of a full disk, say)
// is answered with the path hidden, in the audit note too, and logged in
// full.
func TestProblemDetailHidesHostPaths(t *testing.T) {
	var logged strings.Builder
	s := &Server{edge: edge{log: slog.New(slog.NewTextHandler(&logged, nil)), hide: hostpath.New("/var/lib/forkbox-x")},
		mux: http.NewServeMux()}
	s.mux.HandleFunc("GET /full", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, fmt.Errorf("writable layer: write /var/lib/forkbox-x/storage/overlay/layers/a/upper/f: no space left: %w",
			errdefs.ErrInsufficientStorage))
	})
	p := problemOf(t, serve(s, "GET", "/full"), http.StatusInsufficientStorage)
	if strings.Contains(p.Detail, "/var/lib/forkbox-x") || !strings.Contains(p.Detail, hostpath.Hidden) ||
		!strings.Contains(p.Detail, "no space left") {
		t.Errorf("detail %q", p.Detail)
	}
	if !strings.Contains(logged.String(), "/var/lib/forkbox-x/storage/overlay/layers/a/upper/f") {
		t.Errorf("the log lacks the original: %s", logged.String())
	}
}
