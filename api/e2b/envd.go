package e2b

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"strings"

	"github.com/forkbox/forkbox/api/codecall"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// accessTokenHeader carries a sandbox's envd access token (envd's
// X-Access-Token; the SDK sends the envdAccessToken create returned).
const accessTokenHeader = "X-Access-Token"

// envdPublic reports whether r is part of envd's public surface: the
// Connect-RPC process and filesystem services, /files, /health and GET
// /envs (the sandbox's environment, which E2B's code-interpreter server
// reads to seed its kernels). Other
// agent endpoints (/init, which sets the sandbox's defaults) are the
// daemon's alone.
func envdPublic(r *http.Request) bool {
	p := r.URL.Path
	switch {
	case p == "/health", p == "/envs":
		return r.Method == http.MethodGet
	case p == "/files":
		return r.Method == http.MethodGet || r.Method == http.MethodPost
	case strings.HasPrefix(p, "/process.Process/"), strings.HasPrefix(p, "/filesystem.Filesystem/"):
		return r.Method == http.MethodPost && path.Clean(p) == p
	}
	return false
}

// serveEnvd proxies an envd request to sandbox id's agent.
//
// E2B's rules, as the SDK relies on them (SDK src/envd/api.ts, INFRA
// packages/envd/internal/api/auth.go): GET /health needs no token and
// answers 204 while the sandbox runs; every other request needs the
// sandbox's token in X-Access-Token (else 401). A sandbox that is unknown,
// ended or paused answers 502, which the SDK reads as "not running" (a
// TimeoutError for calls). forkbox adds: only envd's public endpoints are
// reachable (else 404); the code-execution service's port (49999) is
// serveCode's and any other port the port proxy's (servePort, ports.go).
func (h *Handler) serveEnvd(w http.ResponseWriter, r *http.Request, id string) {
	if r.Header.Get(PortHeader) == codecall.Port {
		h.serveCode(w, r, id)
		return
	}
	if port := r.Header.Get(PortHeader); port != "" && port != EnvdPort {
		h.servePort(w, r, id, port, "e2b-header")
		return
	}
	if !envdPublic(r) {
		writeError(w, http.StatusNotFound, "no such envd endpoint: "+r.Method+" "+r.URL.Path)
		return
	}
	if r.URL.Path == "/health" {
		if err := h.mgr.AgentHealthy(r.Context(), id); err != nil {
			writeError(w, http.StatusBadGateway, h.notRunning(r, id, err))
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	var rec *node.Session
	var err error
	if signedFileRequest(r) {
		// An uploadUrl()/downloadUrl() link sent with the sandbox's id.
		rec, err = h.checkSignature(r, id)
		dropSignedUser(r)
	} else {
		rec, err = h.mgr.CheckEnvdToken(r.Context(), id, r.Header.Get(accessTokenHeader))
	}
	if err != nil {
		if errors.Is(err, errdefs.ErrUnauthenticated) {
			writeError(w, http.StatusUnauthorized, err.Error())
			return
		}
		writeError(w, http.StatusBadGateway, h.notRunning(r, id, err))
		return
	}
	h.proxyEnvd(w, r, rec)
}

// proxyEnvd passes an envd request whose caller was checked (a token or
// a signature of rec's) on to rec's agent, resuming the sandbox first
// when its lifecycle says so (runningOrResume), and streams the answer
// back. Every request is an audit record of rec's tenant before it is
// passed on.
func (h *Handler) proxyEnvd(w http.ResponseWriter, r *http.Request, rec *node.Session) {
	id := rec.ID
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
	// The agent may answer (and the proxy flush the response headers)
	// before the proxy has copied the end of the request body; without
	// full duplex the HTTP/1 server then closes the request body under the
	// copy and the upstream connection is torn down mid-stream.
	if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
		h.log.Debug("envd proxy: full duplex unavailable", "err", err)
	}
	detail := map[string]any{"method": r.Method, "path": r.URL.Path}
	if signedFileRequest(r) {
		detail["signed_url"] = true
	}
	if r.URL.Path == "/process.Process/Start" {
		sum, ok := startCommandHash(r, conn.StartCommand)
		if !ok {
			// A command forkbox cannot read is a command it cannot audit.
			writeError(w, http.StatusUnsupportedMediaType, "process.Start must be an uncompressed Connect request "+
				"(application/connect+proto or application/connect+json) of at most 1 MiB")
			return
		}
		detail["command_sha256"] = sum
	}
	// On record before it is forwarded: a daemon that dies while a
	// command runs loses only its result.
	if err := h.audit.Record(r.Context(), audit.Event{Tenant: rec.Tenant, Session: id, Kind: "envd", Detail: detail}); err != nil {
		writeError(w, http.StatusServiceUnavailable, "the audit trail cannot be written; nothing was run")
		return
	}
	// A request body the client botched (a bad chunk, say) is the
	// client's error (400), not an unreachable sandbox (502, which the SDK
	// reads as "not running").
	body := &bodyError{r: r.Body}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = body
	}
	target, err := url.Parse(conn.BaseURL)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = target.Host
			for _, hdr := range []string{accessTokenHeader, SandboxIDHeader, PortHeader, "X-Api-Key", "Cookie"} {
				pr.Out.Header.Del(hdr)
			}
			// forkbox's own agent headers (staged inputs, collected
			// output) are the daemon's, not an envd client's.
			for hdr := range pr.Out.Header {
				if strings.HasPrefix(hdr, "Forkbox-") {
					pr.Out.Header.Del(hdr)
				}
			}
		},
		Transport: conn.Client.Transport,
		// Flush every write: process output and watch events are streams.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client went away
			}
			if body.err != nil {
				writeError(w, http.StatusBadRequest, "reading the request body: "+body.err.Error())
				return
			}
			writeError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s: agent unreachable: %s", id, h.message(r, err)))
		},
		ErrorLog: log.New(proxyLogWriter{h}, "", 0),
	}
	proxy.ServeHTTP(w, r)
}

// maxStartBody bounds the process.Start request read for its audit
// record, in bytes (commands are small; a larger one is passed on
// unread and recorded without its hash).
const maxStartBody = 1 << 20

// startCommandHash reads a process.Start request, puts the bytes back for
// the proxy, and returns the audit hash of its command and arguments as
// decode (the Node's decoder of envd's Start message) reads them.
func startCommandHash(r *http.Request, decode func(contentType string, body []byte) ([]string, bool)) (string, bool) {
	if r.Body == nil || r.ContentLength > maxStartBody || decode == nil {
		return "", false
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, maxStartBody+1))
	rest := r.Body
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(b), rest), rest}
	if err != nil {
		return "", false
	}
	argv, ok := decode(r.Header.Get("Content-Type"), b)
	if !ok {
		return "", false
	}
	return audit.CommandHash(argv...), true
}

// bodyError records the first read error of a request body other than
// its end.
type bodyError struct {
	r   io.ReadCloser
	err error
}

func (b *bodyError) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF && b.err == nil {
		b.err = err
	}
	return n, err
}

func (b *bodyError) Close() error { return b.r.Close() }

// notRunning is the message of a 502 for a sandbox that cannot serve envd
// (no host path in it: see message).
func (h *Handler) notRunning(r *http.Request, id string, err error) string {
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return fmt.Sprintf("sandbox %s not found", id)
	case errors.Is(err, errdefs.ErrTerminated):
		return fmt.Sprintf("sandbox %s is not running: %s", id, h.message(r, err))
	case errors.Is(err, errdefs.ErrConflict):
		return fmt.Sprintf("sandbox %s is not running: %s; connect to resume it", id, h.message(r, err))
	}
	return fmt.Sprintf("sandbox %s is not reachable: %s", id, h.message(r, err))
}

// proxyLogWriter sends the reverse proxy's own log lines to the handler's
// logger.
type proxyLogWriter struct{ h *Handler }

func (p proxyLogWriter) Write(b []byte) (int, error) {
	p.h.log.Debug("envd proxy", "msg", strings.TrimSpace(string(b)))
	return len(b), nil
}
