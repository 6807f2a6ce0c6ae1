// Package portproxy carries requests and connections from the daemon's
// port to a TCP port inside a session, for both edges that offer it: the
// E2B edge (E2b-Sandbox-Id + E2b-Sandbox-Port headers, PORT-ID.DOMAIN host
// names) and forkbox's REST API (/v1/sessions/{id}/ports/{port}/...). Every
// connection into the sandbox is made by the session's agent on the
// sandbox's own loopback (node.Ports.DialPort): the host opens no route
// into a sandbox.
//
// HTTP requests pass through an httputil.ReverseProxy whose transport
// dials through DialPort, one tunnel per request (no idle connections
// are kept: an open tunnel holds its session busy), so WebSocket and other
// upgrades pass (the proxy splices them after the 101) and streamed bodies
// are flushed as they come. Tunnel hands a whole TCP connection over
// (forkbox port-forward). Each is one "port" audit record, written while
// the connection into the sandbox is made; nothing is passed on before
// the write succeeded.
package portproxy

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/splice"
	"github.com/forkbox/forkbox/node"
)

// TunnelUpgrade is the Upgrade token of a raw TCP tunnel request
// (GET /v1/sessions/{id}/ports/{port}/connect).
const TunnelUpgrade = "forkbox-tcp"

// Proxy reaches sessions' ports through a Node. It is safe for
// concurrent use.
type Proxy struct {
	Ports node.Ports
	Audit *audit.Recorder
	Log   *slog.Logger
}

// ParsePort reads a port number (1-65535) from s; a field error on
// "port" otherwise.
func ParsePort(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 || s != strconv.Itoa(p) {
		return 0, errdefs.InvalidField("port", "%q is not a port: it must be a number from 1 to 65535", s)
	}
	return p, nil
}

// ParseHost reads E2B's host form of a sandbox port, "PORT-ID.DOMAIN"
// (an optional ":listen-port" after it), for domain: ok is false when host
// is not a name directly under domain of that shape. The port text is
// returned unparsed (ParsePort says what is wrong with it).
func ParseHost(host, domain string) (port, id string, ok bool) {
	if domain == "" {
		return "", "", false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	label, found := strings.CutSuffix(host, "."+strings.ToLower(domain))
	if !found || strings.Contains(label, ".") {
		return "", "", false
	}
	port, id, ok = strings.Cut(label, "-")
	if !ok || port == "" || !node.ValidID(id) {
		return "", "", false
	}
	return port, id, true
}

// Request is one request for a session's port.
type Request struct {
	// Session and Tenant name the session (Tenant is its owner, for the
	// audit record); Port is the port inside it.
	Session, Tenant string
	Port            int
	// Path is the path (RawPath its encoded form when the client's was
	// not the default encoding, as in url.URL; RawQuery the query) the
	// server in the sandbox gets.
	Path, RawPath, RawQuery string
	// Via names the route, for the audit record ("e2b-header",
	// "e2b-host", "rest").
	Via string
	// Strip lists request headers removed before the request is passed on
	// (the credentials forkbox read).
	Strip []string
	// Fail writes an error answer: err carries an errdefs class (a port
	// nothing listens on is node.ProblemPortNotListening).
	Fail func(w http.ResponseWriter, r *http.Request, err error)
}

// errNotRecorded: the audit record of a port request could not be written.
var errNotRecorded = errdefs.Newf(errdefs.ErrUnavailable, "the audit trail cannot be written; nothing was passed on")

// record starts writing the request's audit record and returns a wait for
// its outcome: the write runs while the connection into the sandbox is
// made, and nothing is passed on before it succeeded.
func (p *Proxy) record(ctx context.Context, pr Request, method, path string) (wait func() error) {
	done := make(chan error, 1)
	go func() {
		done <- p.Audit.Record(ctx, audit.Event{Tenant: pr.Tenant, Session: pr.Session, Kind: "port",
			Detail: map[string]any{"port": pr.Port, "method": method, "path": path, "via": pr.Via}})
	}()
	var once sync.Once
	var err error
	return func() error {
		once.Do(func() {
			if err = <-done; err != nil {
				err = errNotRecorded
			}
		})
		return err
	}
}

// ServeHTTP proxies r to pr's port: the session's server gets the
// request with pr.Path, the client's Host, X-Forwarded-For/-Host/-Proto,
// and none of pr.Strip. A dial that fails (nothing listens: 502 with the
// port named; the session paused: 409) is answered through pr.Fail before
// anything was written.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request, pr Request) {
	recorded := p.record(r.Context(), pr, r.Method, pr.Path)
	defer recorded() // (the writer ends before the request does)
	if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
		p.Log.Debug("port proxy: full duplex unavailable", "err", err)
	}
	var mu sync.Mutex
	var dialErr error
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := p.Ports.DialPort(ctx, pr.Session, pr.Port)
			if rerr := recorded(); rerr != nil {
				if c != nil {
					c.Close()
				}
				c, err = nil, rerr
			}
			if err != nil {
				mu.Lock()
				dialErr = err
				mu.Unlock()
			}
			return c, err
		},
		DisableKeepAlives:  true,
		DisableCompression: true,
	}
	defer tr.CloseIdleConnections()
	target := &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(pr.Port))}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(out *httputil.ProxyRequest) {
			out.SetURL(target)
			out.Out.URL.Path, out.Out.URL.RawPath, out.Out.URL.RawQuery = pr.Path, pr.RawPath, pr.RawQuery
			out.Out.Host = out.In.Host
			out.SetXForwarded()
			for _, h := range pr.Strip {
				out.Out.Header.Del(h)
			}
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client went away
			}
			mu.Lock()
			de := dialErr
			mu.Unlock()
			if de != nil {
				pr.Fail(w, r, de)
				return
			}
			pr.Fail(w, r, fmt.Errorf("port %d of sandbox %s: %s: %w", pr.Port, pr.Session, errText(err), errdefs.ErrUnavailable))
		},
		ErrorLog: log.New(logWriter{p.Log}, "", 0),
	}
	proxy.ServeHTTP(w, r)
}

// Tunnel answers r, a GET with "Connection: Upgrade" and "Upgrade:
// forkbox-tcp", by connecting to pr's port first (a failure is answered
// through pr.Fail: nothing listens, 502) and then switching protocols:
// the client's connection carries the bytes of the TCP connection until
// either side is done (a half-close is passed on).
func (p *Proxy) Tunnel(w http.ResponseWriter, r *http.Request, pr Request) {
	if !splice.Upgrading(r.Header, TunnelUpgrade) {
		pr.Fail(w, r, errdefs.InvalidField("Upgrade", "a port connection needs Connection: Upgrade and Upgrade: %s", TunnelUpgrade))
		return
	}
	recorded := p.record(r.Context(), pr, "CONNECT", "")
	target, err := p.Ports.DialPort(r.Context(), pr.Session, pr.Port)
	if rerr := recorded(); rerr != nil {
		if target != nil {
			target.Close()
		}
		target, err = nil, rerr
	}
	if err != nil {
		pr.Fail(w, r, err)
		return
	}
	client, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		target.Close()
		pr.Fail(w, r, fmt.Errorf("a port connection needs HTTP/1.1: %w", errdefs.ErrInvalidArgument))
		return
	}
	if err := splice.Switch(rw, TunnelUpgrade); err != nil {
		client.Close()
		target.Close()
		return
	}
	splice.Conns(client, rw.Reader, target)
}

// errText is a transport error's text without the URL the proxy made.
func errText(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// logWriter sends the reverse proxy's own log lines to the logger.
type logWriter struct{ l *slog.Logger }

func (w logWriter) Write(b []byte) (int, error) {
	w.l.Debug("port proxy", "msg", strings.TrimSpace(string(b)))
	return len(b), nil
}
