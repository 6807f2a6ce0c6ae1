package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Resolver looks up the addresses of a name; network is "ip", "ip4" or
// "ip6". *net.Resolver satisfies it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Config configures one sandbox's egress service.
type Config struct {
	// SessionID names the sandbox in logs.
	SessionID string
	// Policy is the sandbox's policy (its allow-list is not empty).
	Policy *Policy
	// Blocklist is the always-blocked destinations.
	Blocklist *Blocklist
	// Resolver resolves names for the proxy and the DNS server; the
	// sandbox never resolves anything itself.
	Resolver Resolver
	// Sink receives the egress events; nil drops them.
	Sink Sink
	// Log receives errors; nil is slog.Default().
	Log *slog.Logger
	// DialTimeout bounds one upstream connect; 0 is 10 s.
	DialTimeout time.Duration
}

// Egress is one sandbox's egress service: an HTTP proxy (CONNECT and plain
// requests), transparent HTTP (by Host) and TLS (by SNI) forwarding, and a
// DNS server. Every destination is checked against the policy by the name
// the sandbox asked for, then resolved by Egress itself, and every address
// it would connect to is checked against the blocklist, so a name that
// resolves to a blocked address (DNS rebinding) is refused.
type Egress struct {
	cfg       Config
	meter     *meter
	transport *http.Transport
	// allow is the policy whose allow-list decides (cfg.Policy until
	// SetAllow replaces it: live.go).
	allow atomic.Pointer[Policy]

	mu      sync.Mutex
	servers []func() // closers of running servers
	wg      sync.WaitGroup

	refMu    sync.Mutex
	refusals map[string]*refusalCount // by kind and reason

	// icpt is the interceptor (the credential broker), if any, and the
	// connections it serves (intercept.go).
	icpt interceptState
}

// New returns the egress service for cfg; Serve* start its listeners.
func New(cfg Config) *Egress {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.Sink == nil {
		cfg.Sink = func(Event) {}
	}
	e := &Egress{cfg: cfg, meter: newMeter(cfg.Policy), refusals: map[string]*refusalCount{}}
	e.allow.Store(cfg.Policy)
	// Refusals counted in a burst are recorded within a second, not at
	// the next refusal.
	stop := make(chan struct{})
	e.start(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				e.flushRefusals()
			}
		}
	}, func() { close(stop) })
	e.transport = &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, port, err := splitHostPort(addr, 80)
			if err != nil {
				return nil, err
			}
			return e.dial(ctx, "http", host, port)
		},
		DisableCompression:    true,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
	}
	return e
}

// denied is a refusal by policy; the proxy answers it with 403.
type denied struct{ reason string }

func (d *denied) Error() string { return "egress denied: " + d.reason }

// IsDenied reports whether err is (or wraps) a refusal by the egress
// policy, the quotas or the blocklist (rather than a network error).
func IsDenied(err error) bool {
	var d *denied
	return errors.As(err, &d)
}

// dial checks host:port against the policy and the blocklist, resolves
// host, and connects to the first allowed address. The connection counts
// against the meter and is recorded as an event of kind when it closes.
// Errors: *denied for a refusal, else the network's.
func (e *Egress) dial(ctx context.Context, kind, host string, port uint16) (net.Conn, error) {
	ev := Event{Time: time.Now(), Kind: kind, Host: host, Port: port}
	deny := func(reason string) error {
		ev.Decision, ev.Reason = DecisionDeny, reason
		e.cfg.Sink(ev)
		return &denied{reason}
	}
	if why := e.meter.quotaReason(); why != "" {
		return nil, deny(why)
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		if !e.policy().AllowsAddr(a, port) {
			return nil, deny(fmt.Sprintf("%s port %d is not in the allow-list", a.Unmap(), port))
		}
		addrs = []netip.Addr{a.Unmap()}
	} else {
		if !e.policy().AllowsName(host, port) {
			return nil, deny(fmt.Sprintf("%s port %d is not in the allow-list", host, port))
		}
		rctx, cancel := context.WithTimeout(ctx, e.cfg.DialTimeout)
		found, err := e.cfg.Resolver.LookupNetIP(rctx, "ip", host)
		cancel()
		if err != nil || len(found) == 0 {
			return nil, deny(fmt.Sprintf("%s does not resolve: %v", host, err))
		}
		addrs = found
	}
	var why string
	var lastErr error
	d := net.Dialer{Timeout: e.cfg.DialTimeout}
	for _, a := range addrs {
		if why = e.cfg.Blocklist.Blocked(a, port); why != "" {
			continue
		}
		c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(a.Unmap(), port).String())
		if err != nil {
			lastErr = err
			continue
		}
		ev.Addr = a.Unmap().String()
		return e.track(c, ev)
	}
	if lastErr != nil {
		ev.Decision, ev.Reason = DecisionAllow, "connect failed: "+lastErr.Error()
		e.cfg.Sink(ev)
		return nil, lastErr
	}
	return nil, deny(fmt.Sprintf("%s resolves only to blocked addresses (%s)", host, why))
}

// track wraps an upstream connection so that it is counted, cut with the
// meter, and recorded when closed.
func (e *Egress) track(c net.Conn, ev Event) (net.Conn, error) {
	cc := &countingConn{Conn: c, m: e.meter}
	if !e.meter.track(cc) {
		c.Close()
		ev.Decision, ev.Reason = DecisionDeny, e.meter.quotaReason()
		e.cfg.Sink(ev)
		return nil, &denied{ev.Reason}
	}
	return &recordedConn{countingConn: cc, e: e, ev: ev}, nil
}

// recordedConn records its event once, on Close.
type recordedConn struct {
	*countingConn
	e    *Egress
	ev   Event
	once sync.Once
}

func (c *recordedConn) Close() error {
	err := c.countingConn.Conn.Close()
	c.once.Do(func() {
		c.e.meter.untrack(c.countingConn)
		c.ev.BytesUp, c.ev.BytesDown = c.up.Load(), c.down.Load()
		c.ev.Decision = DecisionAllow
		if r := c.e.meter.quotaReason(); r != "" {
			c.ev.Reason = "cut: " + r
		}
		c.e.cfg.Sink(c.ev)
	})
	return err
}

// splitHostPort splits "host:port" (port defaults to def when absent).
func splitHostPort(hostport string, def uint16) (string, uint16, error) {
	host, p, err := net.SplitHostPort(hostport)
	if err != nil {
		if strings.Contains(err.Error(), "missing port") {
			return strings.Trim(hostport, "[]"), def, nil
		}
		return "", 0, err
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", hostport)
	}
	return host, uint16(n), nil
}

// ServeProxy serves the explicit HTTP proxy (what HTTP_PROXY and
// HTTPS_PROXY point at) on l: CONNECT host:port tunnels and absolute-form
// http:// requests. It returns at once; Close stops it.
func (e *Egress) ServeProxy(l net.Listener) {
	e.serveHTTP(e.admitting(l, "connect"), false)
}

// ServeTransparentHTTP serves plain HTTP that the sandbox sent to port 80
// of any address (redirected to l by nftables): the Host header names the
// destination.
func (e *Egress) ServeTransparentHTTP(l net.Listener) {
	e.serveHTTP(e.admitting(l, "http"), true)
}

// admitting wraps l so that a connection from the sandbox past the
// new-connection rate is recorded and closed at once.
func (e *Egress) admitting(l net.Listener, kind string) net.Listener {
	return &admitListener{Listener: l, e: e, kind: kind, rate: true}
}

// capping wraps l under the open-connection cap only (DNS over TCP: its
// queries have their own rate).
func (e *Egress) capping(l net.Listener, kind string) net.Listener {
	return &admitListener{Listener: l, e: e, kind: kind}
}

type admitListener struct {
	net.Listener
	e    *Egress
	kind string
	rate bool // also apply the new-connection rate
}

func (l *admitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		why := ""
		if l.rate {
			why = l.e.meter.admit()
		}
		if why == "" {
			if l.e.meter.sandboxConns.Add(1) <= MaxOpenConns {
				return &sandboxConn{Conn: c, m: l.e.meter}, nil
			}
			l.e.meter.sandboxConns.Add(-1)
			why = fmt.Sprintf("more than %d connections open at once", MaxOpenConns)
		}
		l.e.refused(l.kind, why)
		c.Close()
	}
}

// refused records a refusal by a rate or count limit. A flood of them is
// one record a second per kind and reason ("N refused: reason"), not one
// each: a sandbox must not be able to fill the audit trail.
func (e *Egress) refused(kind, why string) {
	key := kind + "\x00" + why
	e.refMu.Lock()
	r := e.refusals[key]
	if r == nil {
		r = &refusalCount{}
		e.refusals[key] = r
	}
	r.n++
	var n int
	if time.Since(r.last) >= time.Second {
		n, r.n, r.last = r.n, 0, time.Now()
	}
	e.refMu.Unlock()
	if n > 0 {
		e.cfg.Sink(Event{Time: time.Now(), Kind: kind, Decision: DecisionDeny, Reason: fmt.Sprintf("%d refused: %s", n, why)})
	}
}

// refusalCount counts refusals of one kind and reason since the last
// record of them.
type refusalCount struct {
	n    int
	last time.Time
}

// flushRefusals records refusals counted but not yet recorded.
func (e *Egress) flushRefusals() {
	e.refMu.Lock()
	defer e.refMu.Unlock()
	for key, r := range e.refusals {
		if r.n > 0 {
			kind, why, _ := strings.Cut(key, "\x00")
			e.cfg.Sink(Event{Time: time.Now(), Kind: kind, Decision: DecisionDeny, Reason: fmt.Sprintf("%d refused: %s", r.n, why)})
			r.n, r.last = 0, time.Now()
		}
	}
}

// MaxOpenConns bounds the connections one sandbox may hold open to its
// egress service at once (each costs the daemon descriptors).
const MaxOpenConns = 256

// sandboxConn is an accepted connection from the sandbox; closing it frees
// its place under MaxOpenConns (once).
type sandboxConn struct {
	net.Conn
	m    *meter
	once sync.Once
}

func (c *sandboxConn) Close() error {
	c.once.Do(func() { c.m.sandboxConns.Add(-1) })
	return c.Conn.Close()
}

// CloseWrite half-closes the connection (splice uses it).
func (c *sandboxConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (e *Egress) serveHTTP(l net.Listener, transparent bool) {
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			u := *pr.In.URL
			u.Scheme = "http"
			if transparent {
				host, _, err := splitHostPort(pr.In.Host, 80)
				if err != nil {
					host = pr.In.Host
				}
				u.Host = net.JoinHostPort(host, "80")
			}
			pr.Out.URL = &u
			pr.Out.Host = u.Host
			pr.Out.RequestURI = ""
		},
		Transport: e.transport,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var d *denied
			if errors.As(err, &d) {
				http.Error(w, "forkbox egress: "+d.reason, http.StatusForbidden)
				return
			}
			http.Error(w, "forkbox egress: upstream: "+err.Error(), http.StatusBadGateway)
		},
		ErrorLog: slog.NewLogLogger(e.cfg.Log.Handler(), slog.LevelDebug),
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodConnect && !transparent:
			e.serveConnect(w, r)
		case transparent && r.Host == "":
			http.Error(w, "forkbox egress: no Host header", http.StatusBadRequest)
		case !transparent && (r.URL.Scheme != "http" || r.URL.Host == ""):
			http.Error(w, "forkbox egress: the proxy takes CONNECT and absolute http:// requests", http.StatusBadRequest)
		default:
			host := r.URL.Hostname()
			if transparent {
				host, _, _ = splitHostPort(r.Host, 80)
			}
			if err := e.plainCheck(host, r.Header); err != nil {
				http.Error(w, "forkbox egress: "+err.Error(), http.StatusForbidden)
				return
			}
			proxy.ServeHTTP(w, r)
		}
	})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, ErrorLog: slog.NewLogLogger(e.cfg.Log.Handler(), slog.LevelDebug)}
	e.start(func() { srv.Serve(l) }, func() { srv.Close() })
}

// serveConnect tunnels a CONNECT request to its checked destination.
func (e *Egress) serveConnect(w http.ResponseWriter, r *http.Request) {
	host, port, err := splitHostPort(r.Host, 0)
	if err != nil || port == 0 {
		http.Error(w, "forkbox egress: CONNECT needs host:port", http.StatusBadRequest)
		return
	}
	if i := e.interceptor(host); i != nil && port == 443 {
		e.serveConnectIntercepted(w, i, host)
		return
	}
	up, err := e.dial(r.Context(), "connect", host, port)
	if err != nil {
		var d *denied
		if errors.As(err, &d) {
			http.Error(w, "forkbox egress: "+d.reason, http.StatusForbidden)
			return
		}
		http.Error(w, "forkbox egress: upstream: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer up.Close()
	// The 200 is written on the hijacked connection: through the
	// ResponseWriter it would carry Transfer-Encoding, which a CONNECT
	// answer must not (RFC 9110, 9.3.6).
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	var client io.Reader = conn
	if n := brw.Reader.Buffered(); n > 0 {
		client = io.MultiReader(io.LimitReader(brw.Reader, int64(n)), conn)
	}
	splice(conn, client, up)
}

// splice copies both ways between the sandbox's connection and up until
// either side ends, then closes both.
func splice(sandbox net.Conn, fromSandbox io.Reader, up net.Conn) {
	done := make(chan struct{}, 2)
	go func() {
		io.Copy(up, fromSandbox)
		if cw, ok := up.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		io.Copy(sandbox, up)
		if cw, ok := sandbox.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	// One side finished; give the other a moment to drain, then cut both.
	t := time.AfterFunc(30*time.Second, func() { sandbox.Close(); up.Close() })
	<-done
	t.Stop()
	sandbox.Close()
	up.Close()
}

// start runs serve in the background and registers stop for Close.
func (e *Egress) start(serve func(), stop func()) {
	e.mu.Lock()
	e.servers = append(e.servers, stop)
	e.mu.Unlock()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		serve()
	}()
}

// Close stops every server, cuts every open connection and waits for the
// servers to return.
func (e *Egress) Close() {
	e.meter.close()
	e.mu.Lock()
	stops := e.servers
	e.servers = nil
	e.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
	e.closeIntercepted()
	e.transport.CloseIdleConnections()
	e.wg.Wait()
	e.flushRefusals()
}

// BytesUsed is the bytes moved through the proxy so far (sent plus
// received).
func (e *Egress) BytesUsed() int64 { return e.meter.bytes.Load() }
