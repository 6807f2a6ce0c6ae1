// Package access is the HTTP edge's access layer shared by the forkbox and
// E2B APIs: it turns an API key into the request's caller (package
// tenancy) and writes one audit record per audited request, with what the
// handler noted about it (the session it touched, the command's hash and
// exit code, the error).
package access

import (
	"context"
	"net/http"
	"strings"
	"sync"

	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// RequestIDHeader carries the request's correlation id, echoed on every
// response.
const RequestIDHeader = "X-Request-Id"

// Secret returns the API key a request carries: "Authorization: Bearer
// <key>" or "X-API-Key: <key>". preferHeader picks X-API-Key when both are
// present (E2B clients may send a user token as Bearer beside it).
func Secret(r *http.Request, preferHeader bool) string {
	header := strings.TrimSpace(r.Header.Get("X-API-Key"))
	bearer := BearerToken(r.Header.Get("Authorization"))
	if bearer == "" || (preferHeader && header != "") {
		return header
	}
	return bearer
}

// BearerToken returns the token of an Authorization header value of the
// Bearer scheme, or "" for any other value. The scheme name is matched
// case-insensitively and may be followed by any run of spaces and tabs
// (RFC 9110 §11.1 and §11.4: "bearer KEY" is "Bearer KEY").
func BearerToken(authorization string) string {
	v := strings.TrimLeft(authorization, " \t")
	i := strings.IndexAny(v, " \t")
	if i < 0 || !strings.EqualFold(v[:i], "Bearer") {
		return ""
	}
	return strings.Trim(v[i:], " \t")
}

// Caller builds the caller of request r authenticated with key k; the
// request id is the one already set on w.
func Caller(w http.ResponseWriter, r *http.Request, k *store.APIKey) tenancy.Caller {
	return tenancy.Caller{Tenant: k.Tenant, KeyID: k.ID, Admin: k.Admin,
		RequestID: w.Header().Get(RequestIDHeader), IdempotencyKey: r.Header.Get("Idempotency-Key")}
}

// Note is what a handler tells the audit record of its request.
type Note struct {
	mu      sync.Mutex
	session string
	detail  map[string]any
	problem string // the problem type of a failure
}

type noteKey struct{}

// NoteFrom returns the note of ctx's request, or nil (an unaudited
// request); every method of a nil *Note does nothing.
func NoteFrom(ctx context.Context) *Note {
	n, _ := ctx.Value(noteKey{}).(*Note)
	return n
}

// Session sets the session the request acted on (for a create, the new
// one).
func (n *Note) Session(id string) {
	if n != nil {
		n.mu.Lock()
		n.session = id
		n.mu.Unlock()
	}
}

// Set adds key=value to the record's detail.
func (n *Note) Set(key string, value any) {
	if n != nil {
		n.mu.Lock()
		n.detail[key] = value
		n.mu.Unlock()
	}
}

// Failed records the problem type and detail of a failed request.
func (n *Note) Failed(problemType, detail string) {
	if n != nil {
		n.mu.Lock()
		n.problem = problemType
		n.detail["error"] = detail
		if problemType != "" {
			n.detail["problem"] = problemType
		}
		n.mu.Unlock()
	}
}

// deniedTypes are the problem types of policy decisions: their records'
// outcome is "denied".
var deniedTypes = map[string]bool{
	"image-not-approved": true, "egress-not-allowed": true, "tenant-concurrency-exceeded": true,
	"capacity-unavailable": true, "cpu-budget-exhausted": true, "permission-denied": true, "tenant-quota-exceeded": true, "tenant-suspended": true,
}

// IsDenial reports whether a failed request's problem type (its slug,
// "tenant-quota-exceeded") and status make its audit outcome "denied": a
// policy decision or a 403.
func IsDenial(problemType string, status int) bool {
	return deniedTypes[problemType] || status == http.StatusForbidden
}

// Audited wraps next so that each request becomes one audit record of
// kind once it is answered (after the whole stream, for a streaming
// answer). target names the path value {id} in the record: "session" (the
// record's session) or "snapshot" (a detail field). The caller must be in
// the request context already (or the record goes to the default tenant).
func Audited(rec *audit.Recorder, kind, target string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := &Note{detail: map[string]any{}}
		switch id := r.PathValue("id"); {
		case id == "":
		case target == "session":
			n.session = id
		case target != "":
			n.detail[target] = id
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), noteKey{}, n)))
		n.mu.Lock()
		outcome := audit.OK
		switch {
		case sw.status >= 400 && IsDenial(n.problem, sw.status):
			outcome = audit.Denied
		case sw.status >= 400:
			outcome = audit.Error
		}
		if sw.status >= 400 {
			n.detail["status"] = sw.status
		}
		ev := audit.Event{Session: n.session, Kind: kind, Outcome: outcome, Detail: n.detail}
		n.mu.Unlock()
		rec.Record(r.Context(), ev)
	})
}

// statusWriter remembers the status written; it passes Flush through (for
// server-sent events) and unwraps for http.ResponseController.
type statusWriter struct {
	http.ResponseWriter
	status  int
	written bool
}

func (s *statusWriter) WriteHeader(code int) {
	if !s.written {
		s.status, s.written = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	s.written = true
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Flush() {
	s.written = true
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

type forwardedKey struct{}

// WithForwarded returns ctx carrying c, the caller another host of the
// fleet authenticated and signed for (package route verified the
// signature): the API takes it instead of an API key. RequestID and
// IdempotencyKey are filled from the request by ForwardedCaller.
func WithForwarded(ctx context.Context, c tenancy.Caller) context.Context {
	return context.WithValue(ctx, forwardedKey{}, c)
}

// ForwardedCaller returns the caller of r as another host signed it
// (WithForwarded), with r's request id (set on w) and Idempotency-Key;
// ok is false for a request that came with no verified signature.
func ForwardedCaller(w http.ResponseWriter, r *http.Request) (c tenancy.Caller, ok bool) {
	c, ok = r.Context().Value(forwardedKey{}).(tenancy.Caller)
	if ok {
		c.RequestID, c.IdempotencyKey = w.Header().Get(RequestIDHeader), r.Header.Get("Idempotency-Key")
	}
	return c, ok
}
