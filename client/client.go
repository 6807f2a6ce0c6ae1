// Package client is the Go client of forkbox's REST API; the forkbox CLI is
// built on it. It depends only on the standard library and errdefs.
//
// Errors from the API are *Error values carrying the RFC 9457 problem; they
// unwrap to the matching errdefs class, so errors.Is(err,
// errdefs.ErrNotFound) works on the client side too.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/forkbox/forkbox/defaults"

	"github.com/forkbox/forkbox/errdefs"
)

// Environment variables read by FromEnv.
const (
	EnvURL    = "FORKBOX_URL"
	EnvAPIKey = "FORKBOX_API_KEY"
)

// Client talks to one forkbox daemon. It is safe for concurrent use.
type Client struct {
	baseURL string
	apiKey  string
	http    *http.Client
	// keySource says where apiKey was read (Open), for *KeyError.
	keySource string
}

// maxIdlePerHost is how many idle connections to one daemon the shared
// transport keeps (Go's default transport keeps 2: a program running
// more calls at once than that would open and close a connection per
// call).
const maxIdlePerHost = 64

// sharedHTTP is the HTTP client of every Client made without one: Go's
// default transport's settings with up to maxIdlePerHost idle
// connections kept alive per daemon.
var sharedHTTP = func() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = maxIdlePerHost
	tr.MaxIdleConnsPerHost = maxIdlePerHost
	return &http.Client{Transport: tr}
}()

// New returns a client for the daemon at baseURL ("http://host:port")
// authenticating with apiKey. hc may be nil for a client shared by every
// Client made that way: Go's default transport's settings, keeping up to
// 64 idle connections to each daemon alive.
func New(baseURL, apiKey string, hc *http.Client) *Client {
	if hc == nil {
		hc = sharedHTTP
	}
	return &Client{baseURL: strings.TrimRight(baseURL, "/"), apiKey: apiKey, http: hc}
}

// FromEnv returns a client configured from FORKBOX_URL (default
// defaults.URL) and FORKBOX_API_KEY. Without a key, when the URL is local, it
// reads keyFile (defaults.KeyFile when ""), which only root can read.
func FromEnv(keyFile string) (*Client, error) {
	return Open(Options{KeyFile: keyFile})
}

// Options say where Open finds the daemon and its key; a field left ""
// falls back to the environment, then to the default.
type Options struct {
	// URL is the daemon's base URL; "" for FORKBOX_URL, else defaults.URL.
	URL string
	// APIKey is the key; "" for FORKBOX_API_KEY, else (for a local URL
	// only) the contents of KeyFile.
	APIKey string
	// KeyFile is the key file read when no key is given and the URL is
	// local; "" for defaults.KeyFile (which only root can read).
	KeyFile string
	// URLSource and KeySource name the settings URL and APIKey came from
	// when not "", for messages ("the --url flag"); "" means the field is
	// unset or came from the program itself.
	URLSource, KeySource string
}

// Open returns a client for the daemon o names. The client's errors of a
// refused key (*KeyError) name where the key was read from. Errors: no
// key found (naming FORKBOX_API_KEY and the key file tried), and a URL
// that is not http(s)://host[:port].
func Open(o Options) (*Client, error) {
	base, urlFrom := o.URL, o.URLSource
	if base == "" {
		base, urlFrom = os.Getenv(EnvURL), EnvURL
	}
	if base == "" {
		base = defaults.URL
	}
	if u, err := url.Parse(base); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		if urlFrom == "" {
			urlFrom = "the URL"
		}
		return nil, fmt.Errorf("%s: %q is not a daemon URL (http://HOST:PORT)", urlFrom, base)
	}
	key, source := o.APIKey, o.KeySource
	if key == "" {
		key, source = os.Getenv(EnvAPIKey), EnvAPIKey
	}
	if key == "" && isLocal(base) {
		keyFile := o.KeyFile
		if keyFile == "" {
			keyFile = defaults.KeyFile
		}
		b, err := os.ReadFile(keyFile)
		if err != nil {
			return nil, fmt.Errorf("no API key: set %s or --api-key, or run as root on the daemon's host (reading %s: %v)", EnvAPIKey, keyFile, err)
		}
		key, source = strings.TrimSpace(string(b)), "the key file "+keyFile
	}
	if key == "" {
		return nil, fmt.Errorf("no API key: set %s or --api-key (the daemon at %s is not local, so no key file is read)", EnvAPIKey, base)
	}
	c := New(base, key, nil)
	c.keySource = source
	return c, nil
}

func isLocal(base string) bool {
	u, err := url.Parse(base)
	if err != nil {
		return false
	}
	h := u.Hostname()
	return h == "127.0.0.1" || h == "localhost" || h == "::1"
}

// BaseURL returns the daemon's base URL.
func (c *Client) BaseURL() string { return c.baseURL }

// request is one API call.
type request struct {
	method, path string
	query        url.Values
	body         io.Reader
	size         int64 // body length, -1 when unknown
	contentType  string
	accept       string
	header       http.Header
}

// do sends req and returns the response when its status is 2xx; otherwise
// it decodes the problem into an *Error.
func (c *Client) do(ctx context.Context, req request) (*http.Response, error) {
	u := c.baseURL + req.path
	if len(req.query) > 0 {
		u += "?" + req.query.Encode()
	}
	hr, err := http.NewRequestWithContext(ctx, req.method, u, req.body)
	if err != nil {
		return nil, err
	}
	if req.body != nil {
		hr.ContentLength = req.size
	}
	for k, vs := range req.header {
		hr.Header[k] = vs
	}
	hr.Header.Set("Authorization", "Bearer "+c.apiKey)
	if req.contentType != "" {
		hr.Header.Set("Content-Type", req.contentType)
	}
	if req.accept != "" {
		hr.Header.Set("Accept", req.accept)
	}
	resp, err := c.http.Do(hr)
	if err != nil {
		return nil, unreachable(c.baseURL, err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	err = decodeError(resp)
	var apiErr *Error
	if resp.StatusCode == http.StatusUnauthorized && errors.As(err, &apiErr) {
		return nil, &KeyError{Source: c.keySource, Err: apiErr}
	}
	return nil, err
}

// doJSON sends in (if not nil) as JSON and decodes the reply into out (if
// not nil).
func (c *Client) doJSON(ctx context.Context, method, path string, query url.Values, header http.Header, in, out any) (*http.Response, error) {
	req := request{method: method, path: path, query: query, header: header, accept: "application/json"}
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		req.body, req.size, req.contentType = bytes.NewReader(b), int64(len(b)), "application/json"
	}
	resp, err := c.do(ctx, req)
	if err != nil {
		return nil, err
	}
	defer closeBody(resp)
	if out != nil && resp.StatusCode != http.StatusNoContent {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp, fmt.Errorf("decode %s %s reply: %w", method, path, err)
		}
	}
	return resp, nil
}

// maxDrain is the most bytes closeBody reads past what a caller decoded.
const maxDrain = 4 << 10

// closeBody reads what is left of resp's body (a JSON document's
// trailing newline, the end of a chunked body; at most maxDrain bytes)
// and closes it, so that the connection is kept alive for the next call:
// Go's transport closes a connection whose body was closed unread.
func closeBody(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
	resp.Body.Close()
}

// IsNotFound reports whether err is an API not-found error.
func IsNotFound(err error) bool { return errors.Is(err, errdefs.ErrNotFound) }

func decodeBody(resp *http.Response, out any) error {
	return json.NewDecoder(resp.Body).Decode(out)
}

// idNames says what the path parameter of each kind of resource is called
// in the error for a missing one.
var idNames = map[string]string{
	"session": "a session id", "snapshot": "a snapshot id", "template": "a template name",
	"tenant": "a tenant name", "key": "a key id",
}

// checkID refuses, before any request is sent, a resource id or name that
// cannot name anything and would make a path the daemon cannot route:
// "" ("a session id is required") and "." or ".." (path segments that
// URL escaping keeps). The error reads as that sentence and unwraps to an
// errdefs.FieldError (class ErrInvalidArgument) of field "id" ("name" for
// templates and tenants).
func checkID(kind, v string) error {
	field := "id"
	if kind == "template" || kind == "tenant" {
		field = "name"
	}
	switch v {
	case "":
		return &idError{&errdefs.FieldError{Field: field, Reason: idNames[kind] + " is required"}}
	case ".", "..":
		return &idError{&errdefs.FieldError{Field: field, Reason: fmt.Sprintf("%q is not %s", v, idNames[kind])}}
	}
	return nil
}

// idError is checkID's error: its message is the reason alone ("a session
// id is required"), the field error is its cause.
type idError struct{ fe *errdefs.FieldError }

// Error returns the reason.
func (e *idError) Error() string { return e.fe.Reason }

// Unwrap returns the field error.
func (e *idError) Unwrap() error { return e.fe }
