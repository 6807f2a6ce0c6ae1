// Package codecall carries calls of a session's code-execution service
// (the agent's API under /code, which speaks E2B's port-49999 protocol:
// @e2b/code-interpreter's /execute, /contexts and /health) from an edge of
// the daemon to the agent: which calls exist and where they go, the audit
// hash of a cell, the call itself over a Node's hold on the agent, and a
// copy of the answer that flushes as the agent writes. Both edges use it:
// the E2B edge (api/e2b, E2b-Sandbox-Port 49999) and forkbox's own API
// (api, /v1/sessions/{id}/code...).
package codecall

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// Port is the in-sandbox port E2B's code interpreter SDK addresses its
// service at (E2b-Sandbox-Port: 49999; E2B code-interpreter's template).
const Port = "49999"

// Prefix is the agent's path prefix of the service.
const Prefix = "/code"

// MaxRequestBody bounds a call's request body, in bytes (a cell's code and
// its env_vars; contexts' bodies are a few bytes). The daemon reads a body
// whole, to audit the cell before it runs.
const MaxRequestBody = 1 << 20

// maxErrorBody bounds what is read of an error answer of the agent, in
// bytes.
const maxErrorBody = 64 << 10

// AgentPath returns the agent path of a call of E2B's port-49999 protocol
// with method and path p ("/execute", "/contexts", "/contexts/ID",
// "/contexts/ID/restart", "/health"), and whether it is one: any other
// method or path is not part of the service. ID is one path segment.
func AgentPath(method, p string) (string, bool) {
	switch {
	case p == "/execute":
		return Prefix + p, method == http.MethodPost
	case p == "/health":
		return Prefix + p, method == http.MethodGet
	case p == "/contexts":
		return Prefix + p, method == http.MethodGet || method == http.MethodPost
	case strings.HasPrefix(p, "/contexts/"):
		rest := strings.TrimPrefix(p, "/contexts/")
		if id, ok := strings.CutSuffix(rest, "/restart"); ok {
			return Prefix + p, method == http.MethodPost && validContextID(id)
		}
		return Prefix + p, method == http.MethodDelete && validContextID(rest)
	}
	return "", false
}

// validContextID reports whether id can be a context id in a path: 1-128
// characters of [A-Za-z0-9._-], not "." or ".." (the agent's ids are
// UUIDs).
func validContextID(id string) bool {
	if id == "" || len(id) > 128 || id == "." || id == ".." {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ReadBody reads a call's request body, at most MaxRequestBody bytes: a
// longer one is ErrInvalidArgument (too large), a broken one too.
func ReadBody(r io.Reader) ([]byte, error) {
	if r == nil {
		return nil, nil
	}
	b, err := io.ReadAll(io.LimitReader(r, MaxRequestBody+1))
	if err != nil {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "reading the request body: %v", err)
	}
	if len(b) > MaxRequestBody {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "the request body is over %d bytes", MaxRequestBody)
	}
	return b, nil
}

// RequestBody returns r's body for the agent: a POST's, read by ReadBody
// ("{}" when empty), nil for any other method.
func RequestBody(r *http.Request) ([]byte, error) {
	if r.Method != http.MethodPost {
		return nil, nil
	}
	b, err := ReadBody(r.Body)
	if err != nil || len(b) > 0 {
		return b, err
	}
	return []byte("{}"), nil
}

// Relay writes the agent's answer resp to w as the agent gave it: its
// Content-Type, its status, then its body streamed by Copy.
func Relay(w http.ResponseWriter, resp *http.Response) error {
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(resp.StatusCode)
	return Copy(w, resp.Body)
}

// CellHash returns the audit hash (sha256, hex) of the code of an execute
// request body: the "code" member as JSON decodes it. A body that is not
// a JSON object with a string code is ErrInvalidArgument naming the field.
func CellHash(body []byte) (string, error) {
	var req struct {
		Code *string `json:"code"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "the body is not a JSON object of an execute request: %v", err)
	}
	if req.Code == nil {
		return "", errdefs.InvalidField("code", "is required")
	}
	sum := sha256.Sum256([]byte(*req.Code))
	return hex.EncodeToString(sum[:]), nil
}

// Do sends one call to the agent behind conn: method and agentPath (from
// AgentPath, or Prefix + a path of the service), body as JSON (nil: none).
// ctx bounds the whole call, the answer's stream included: when it ends
// (the client went away, say) the agent sees the call cancelled and
// interrupts its cell. The caller closes the answer's body. An agent
// that cannot be reached is ErrUnavailable.
func Do(ctx context.Context, conn *node.EnvdConn, method, agentPath string, body []byte) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, conn.BaseURL+agentPath, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := conn.Client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errdefs.Newf(errdefs.ErrUnavailable, "code-execution service unreachable: %v", err)
	}
	return resp, nil
}

// Copy writes the answer body to w as it comes, flushing after every read
// (the agent writes one JSON line per flush), through one 32 KiB buffer
// whatever the answer's length. It returns the first error of either side.
func Copy(w http.ResponseWriter, body io.Reader) error {
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if ferr := rc.Flush(); ferr != nil && !errors.Is(ferr, http.ErrNotSupported) {
				return ferr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// ErrorOf turns an error answer of the agent (status >= 400, body read
// up to 64 KiB) into an error of the class its status says: 400 and 422
// ErrInvalidArgument, 404 ErrNotFound, 409 ErrConflict, 429
// ErrResourceExhausted (the contexts' limit), 5xx ErrUnavailable
// (the service failed). Its text is the answer's message: a JSON body's
// "message", "detail" or "error" string, else the body as text.
func ErrorOf(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	msg := messageOf(b)
	if msg == "" {
		msg = http.StatusText(resp.StatusCode)
	}
	switch {
	case resp.StatusCode == http.StatusBadRequest, resp.StatusCode == http.StatusUnprocessableEntity:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "%s", msg)
	case resp.StatusCode == http.StatusNotFound:
		return errdefs.Newf(errdefs.ErrNotFound, "%s", msg)
	case resp.StatusCode == http.StatusConflict:
		return errdefs.Newf(errdefs.ErrConflict, "%s", msg)
	case resp.StatusCode == http.StatusTooManyRequests:
		return errdefs.Newf(errdefs.ErrResourceExhausted, "%s", msg)
	case resp.StatusCode >= 500:
		return errdefs.Newf(errdefs.ErrUnavailable, "code-execution service: %s", msg)
	}
	return errdefs.Newf(errdefs.ErrInvalidArgument, "code-execution service answered %d: %s", resp.StatusCode, msg)
}

// messageOf is the message of an error body b.
func messageOf(b []byte) string {
	var v map[string]any
	if json.Unmarshal(b, &v) == nil {
		for _, k := range []string{"message", "detail", "error"} {
			if s, ok := v[k].(string); ok && s != "" {
				return s
			}
		}
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 1024 {
		s = s[:1024] + "..."
	}
	return s
}
