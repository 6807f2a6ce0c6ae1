package netpolicy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// DialFunc connects to host:port through the egress service's checks (the
// allow-list, the blocklist, the quotas) and records the connection as an
// event of kind "broker". Errors are a refusal (its text says why) or the
// network's.
type DialFunc func(ctx context.Context, host string, port uint16) (net.Conn, error)

// Interceptor is what the egress service hands the connections it does not
// pass through: the credential broker (package broker) implements it. A
// sandbox's Egress has at most one; without one every TLS connection is
// passed through by SNI and no plain request is judged.
type Interceptor interface {
	// Intercepts reports whether TLS to host (lower-case, no trailing dot,
	// no port) on port 443 is terminated instead of passed through.
	Intercepts(host string) bool
	// ServeTLS serves the sandbox's connection c, whose first bytes are a
	// TLS ClientHello for host, until it ends; dial makes upstream
	// connections. It closes nothing it was given: the caller closes c.
	ServeTLS(c net.Conn, host string, dial DialFunc)
	// CheckPlain judges a plain-HTTP request with headers h to host: an
	// error refuses it (the sandbox gets 403 with the error's text).
	CheckPlain(host string, h http.Header) error
}

// interceptState is an Egress's interceptor and the connections it is
// serving, which Close cuts.
type interceptState struct {
	mu   sync.Mutex
	i    Interceptor
	held map[net.Conn]struct{}
	shut bool
}

// SetInterceptor makes i (nil: none) judge e's connections from now on.
func (e *Egress) SetInterceptor(i Interceptor) {
	e.icpt.mu.Lock()
	e.icpt.i = i
	e.icpt.mu.Unlock()
}

// interceptor returns e's interceptor when it takes host, else nil.
func (e *Egress) interceptor(host string) Interceptor {
	e.icpt.mu.Lock()
	i := e.icpt.i
	e.icpt.mu.Unlock()
	if i == nil || !i.Intercepts(normalHost(host)) {
		return nil
	}
	return i
}

// plainCheck judges a plain-HTTP request to host with the interceptor (nil
// error without one).
func (e *Egress) plainCheck(host string, h http.Header) error {
	e.icpt.mu.Lock()
	i := e.icpt.i
	e.icpt.mu.Unlock()
	if i == nil {
		return nil
	}
	return i.CheckPlain(normalHost(host), h)
}

// normalHost is host lower-cased, without brackets or a trailing dot, an
// IP literal in its canonical form.
func normalHost(host string) string {
	h := strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Unmap().String()
	}
	return h
}

// intercept hands c (a sandbox connection whose ClientHello for host, when
// already read, is hello) to i until it ends, and closes c. Close cuts it.
func (e *Egress) intercept(i Interceptor, c net.Conn, hello []byte, host string) {
	defer c.Close()
	s := &e.icpt
	s.mu.Lock()
	if s.shut {
		s.mu.Unlock()
		return
	}
	if s.held == nil {
		s.held = map[net.Conn]struct{}{}
	}
	s.held[c] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.held, c)
		s.mu.Unlock()
	}()
	var conn net.Conn = c
	if len(hello) > 0 {
		conn = &replayConn{Conn: c, r: io.MultiReader(bytes.NewReader(hello), c)}
	}
	i.ServeTLS(conn, normalHost(host), func(ctx context.Context, h string, port uint16) (net.Conn, error) {
		return e.dial(ctx, "broker", h, port)
	})
}

// serveConnectIntercepted answers a CONNECT to host:443, a host the
// interceptor i takes, and hands it the tunnel.
func (e *Egress) serveConnectIntercepted(w http.ResponseWriter, i Interceptor, host string) {
	if err := e.precheck("connect", host, 443); err != nil {
		http.Error(w, "forkbox egress: "+err.(*denied).reason, http.StatusForbidden)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		conn.Close()
		return
	}
	var buffered []byte
	if n := brw.Reader.Buffered(); n > 0 {
		buffered, _ = brw.Reader.Peek(n)
		buffered = append([]byte(nil), buffered...)
	}
	e.intercept(i, conn, buffered, host)
}

// closeIntercepted cuts every intercepted connection and refuses new ones
// (Egress.Close).
func (e *Egress) closeIntercepted() {
	s := &e.icpt
	s.mu.Lock()
	s.shut = true
	held := s.held
	s.held = nil
	s.mu.Unlock()
	for c := range held {
		c.Close()
	}
}

// precheck refuses (recording the refusal as an event of kind) a
// destination the quotas or the allow-list refuse, before a connection is
// intercepted: the upstream dial checks again (and the blocklist).
func (e *Egress) precheck(kind, host string, port uint16) error {
	reason := e.meter.quotaReason()
	if reason == "" {
		allowed := false
		if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
			allowed = e.policy().AllowsAddr(a, port)
		} else {
			allowed = e.policy().AllowsName(host, port)
		}
		if !allowed {
			reason = fmt.Sprintf("%s port %d is not in the allow-list", host, port)
		}
	}
	if reason == "" {
		return nil
	}
	e.cfg.Sink(Event{Time: time.Now(), Kind: kind, Host: host, Port: port, Decision: DecisionDeny, Reason: reason})
	return &denied{reason}
}

// replayConn reads r (bytes already read from Conn, then Conn) and writes
// to Conn.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// Intercept gives session id's running egress service the interceptor i
// (Egress.SetInterceptor). ErrNotFound when the session has no network on
// this service; ErrUnavailable while its egress service is not started.
func (s *Service) Intercept(id string, i Interceptor) error {
	s.mu.Lock()
	a := s.active[id]
	s.mu.Unlock()
	if a == nil {
		return errdefs.Newf(errdefs.ErrNotFound, "session %s has no network", id)
	}
	if a.egress == nil {
		return errdefs.Newf(errdefs.ErrUnavailable, "the egress service of session %s is not running yet", id)
	}
	a.egress.SetInterceptor(i)
	return nil
}

// Blocklist returns the service's always-blocked destinations (with its
// test networks let through), for judging IP-literal hosts elsewhere.
func (s *Service) Blocklist() *Blocklist { return s.block }
