package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/textproto"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/netpolicy"
)

// auditEvery is how often at most one kind of record (use, refusal) of one
// secret and host is written per session: a sandbox must not be able to
// fill the audit trail with requests.
const auditEvery = 10 * time.Second

// Session is one session's broker: its bindings (placeholders), its CA,
// and the proxy that serves the sandbox's TLS connections to its secrets'
// hosts (a netpolicy.Interceptor). Values are looked up per request
// (Secrets.Value), so a removed secret stops at once; the CA key and the
// placeholders live only in the daemon's memory.
type Session struct {
	tenant, id string
	bindings   []Binding
	ca         *CA
	secrets    *Secrets
	roots      *x509.CertPool
	log        *slog.Logger

	mu      sync.Mutex
	noted   map[string]time.Time // audit key → last record
	counted map[string]int       // audit key → occurrences since
	// upstream holds the session's upstream connections by host, reused
	// across the sandbox's connections (a new sandbox connection then
	// costs one TLS handshake, the sandbox's, not two).
	upstream map[string]*http.Transport
}

// Bind makes session id's broker for tenant's secrets names: a new
// placeholder each and a CA restricted to their hosts. A name the tenant
// has no secret of is an errdefs.ErrInvalidArgument naming "secrets[i]";
// store errors are returned as they are.
func (s *Secrets) Bind(ctx context.Context, tenant, id string, names []string) (*Session, error) {
	sess := &Session{tenant: tenant, id: id, secrets: s, roots: s.roots, log: s.log.With("session", id),
		noted: map[string]time.Time{}, counted: map[string]int{}, upstream: map[string]*http.Transport{}}
	var hosts []string
	seen := map[string]bool{}
	for i, name := range names {
		spec, err := s.Get(ctx, tenant, name)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, errdefs.InvalidField(fmt.Sprintf("secrets[%d]", i), "secret %q does not exist", name)
		}
		if err != nil {
			return nil, err
		}
		sess.bindings = append(sess.bindings, Binding{Name: spec.Name, Placeholder: NewPlaceholder(spec.Name),
			Hosts: spec.Hosts, Header: spec.Header})
		for _, h := range spec.Hosts {
			if !seen[h] {
				seen[h] = true
				hosts = append(hosts, h)
			}
		}
	}
	ca, err := NewCA(id, hosts)
	if err != nil {
		return nil, err
	}
	sess.ca = ca
	return sess, nil
}

// Bindings returns the session's bindings (the placeholders its
// environment carries).
func (b *Session) Bindings() []Binding { return append([]Binding(nil), b.bindings...) }

// CA returns the session's CA (its PEM goes into the sandbox's trust store).
func (b *Session) CA() *CA { return b.ca }

// Intercepts reports whether host is a host of one of the session's
// secrets (netpolicy.Interceptor).
func (b *Session) Intercepts(host string) bool {
	for _, bd := range b.bindings {
		if bd.Allows(host) {
			return true
		}
	}
	return false
}

// CheckPlain refuses a plain-HTTP request to one of a secret's hosts that
// carries its placeholder (secrets go only over TLS), and records a
// placeholder sent to another host (it goes out as it is, worthless
// there). netpolicy.Interceptor.
func (b *Session) CheckPlain(host string, h http.Header) error {
	for _, bd := range b.bindings {
		if !headerHas(h, bd.Placeholder) {
			continue
		}
		if bd.Allows(host) {
			b.note(KindRefused, bd.Name, host, "placeholder over plain HTTP (secrets go only over TLS)")
			return fmt.Errorf("secret %s is sent only over TLS (https://%s)", bd.Name, host)
		}
		b.note(KindRefused, bd.Name, host, "placeholder sent to a host not the secret's (sent unreplaced)")
	}
	return nil
}

// ServeTLS terminates the sandbox's TLS connection c to host with a leaf
// of the session's CA (ALPN offers only http/1.1), reads its HTTP/1.1
// requests (keep-alive), puts the secrets' values into their headers
// (Rewrite) and forwards them, streaming, over a new TLS connection to
// host:443 made with dial and verified against the daemon's upstream
// roots (the system's, plus any the daemon was given). A request that
// carries the placeholder of a removed secret is refused with 403;
// upgrades (WebSocket) are refused with 501. netpolicy.Interceptor.
func (b *Session) ServeTLS(c net.Conn, host string, dial netpolicy.DialFunc) {
	tc := tls.Server(c, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return b.ca.Leaf(host)
		},
	})
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err != nil {
		b.log.Debug("broker: sandbox TLS handshake", "host", host, "err", err)
		return
	}
	_ = c.SetDeadline(time.Time{})

	tr := b.transport(host, dial)
	errLog := slog.NewLogLogger(b.log.Handler(), slog.LevelDebug)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "https", host, host
		},
		Transport:     withholding{tr},
		FlushInterval: -1, // stream: every write reaches the sandbox at once
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if netpolicy.IsDenied(err) {
				http.Error(w, "forkbox broker: "+err.Error(), http.StatusForbidden)
				return
			}
			http.Error(w, "forkbox broker: upstream: "+err.Error(), http.StatusBadGateway)
		},
		// An upstream that echoes a value in a response header or
		// trailer does not hand it to the sandbox (1xx responses:
		// withholding; a body is streamed as it is).
		ModifyResponse: func(resp *http.Response) error {
			vals, _ := resp.Request.Context().Value(usedValuesKey{}).([]string)
			withhold(resp.Header, vals)
			// The trailers arrive with the body's end; the proxy copies
			// them after closing the body.
			resp.Body = &trailerWithholder{ReadCloser: resp.Body, resp: resp, vals: vals}
			return nil
		},
		ErrorLog: errLog,
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "" {
			http.Error(w, "forkbox broker: protocol upgrades are not brokered", http.StatusNotImplemented)
			return
		}
		vals, err := b.rewrite(r.Context(), r.Header, host)
		if err != nil {
			http.Error(w, "forkbox broker: "+err.Error(), http.StatusForbidden)
			return
		}
		rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), usedValuesKey{}, vals)))
	})
	l := newOneConnListener(tc)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: errLog, ConnState: l.state}
	_ = srv.Serve(l)
}

// withhold replaces every value of vals in h's values, in place.
func withhold(h map[string][]string, vals []string) {
	for _, vs := range h {
		for i := range vs {
			for _, v := range vals {
				vs[i] = strings.ReplaceAll(vs[i], v, "[withheld by forkbox]")
			}
		}
	}
}

// trailerWithholder is a response body that withholds the request's
// values from the response's trailers once the body is read or closed.
type trailerWithholder struct {
	io.ReadCloser
	resp *http.Response
	vals []string
}

func (t *trailerWithholder) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	if err != nil {
		withhold(t.resp.Trailer, t.vals)
	}
	return n, err
}

func (t *trailerWithholder) Close() error {
	err := t.ReadCloser.Close()
	withhold(t.resp.Trailer, t.vals)
	return err
}

// withholding is the broker's upstream transport: the headers of a 1xx
// response (103 Early Hints), which httputil.ReverseProxy forwards to the
// sandbox as they arrive, without ModifyResponse, have the request's
// values withheld first (a trace hook added here runs before the
// proxy's own, and both see the same header map).
type withholding struct{ rt http.RoundTripper }

func (w withholding) RoundTrip(req *http.Request) (*http.Response, error) {
	vals, _ := req.Context().Value(usedValuesKey{}).([]string)
	trace := &httptrace.ClientTrace{Got1xxResponse: func(_ int, h textproto.MIMEHeader) error {
		withhold(h, vals)
		return nil
	}}
	return w.rt.RoundTrip(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
}

// usedValuesKey keys the values a request was given, in its context.
type usedValuesKey struct{}

// rewrite puts the values into one request's headers h to host (Rewrite),
// records what it did and returns the values it put in. An error refuses
// the request: a secret removed since the session began.
func (b *Session) rewrite(ctx context.Context, h http.Header, host string) ([]string, error) {
	var vals []string
	lookup := func(name string) ([]byte, bool) {
		v, ok, err := b.secrets.Value(ctx, b.tenant, name, host)
		if err != nil {
			b.log.Error("broker: open secret", "secret", name, "err", err)
		}
		if ok && err == nil {
			vals = append(vals, string(v))
		}
		return v, ok && err == nil
	}
	used, stray, revoked := Rewrite(h, host, b.bindings, lookup)
	for _, n := range used {
		b.note(KindUse, n, host, "")
	}
	for _, n := range stray {
		b.note(KindRefused, n, host, "placeholder sent to a host not the secret's (sent unreplaced)")
	}
	for _, bd := range b.bindings {
		// A placeholder of this secret that is not this session's (a
		// parent's, after a fork) is not replaced: record the attempt.
		prefix := "fbx_" + bd.Name + "_"
		for _, vs := range h {
			for _, v := range vs {
				if strings.Contains(v, prefix) && !strings.Contains(v, bd.Placeholder) {
					b.note(KindRefused, bd.Name, host, "a placeholder not of this session (sent unreplaced)")
				}
			}
		}
	}
	if len(revoked) > 0 {
		for _, n := range revoked {
			b.note(KindRefused, n, host, "the secret was removed or no longer allows this host")
		}
		return nil, fmt.Errorf("secret %s was removed or no longer allows %s", strings.Join(revoked, ", "), host)
	}
	return vals, nil
}

// note writes an audit record of kind for secret name and host (never a
// value), at most one per kind, name, host and reason every auditEvery;
// the ones held back are counted in the next.
func (b *Session) note(kind, name, host, reason string) {
	key := kind + "\x00" + name + "\x00" + host + "\x00" + reason
	b.mu.Lock()
	b.counted[key]++
	if time.Since(b.noted[key]) < auditEvery {
		b.mu.Unlock()
		return
	}
	n := b.counted[key]
	b.counted[key] = 0
	b.noted[key] = time.Now()
	b.mu.Unlock()
	detail := map[string]any{"name": name, "host": host, "count": n}
	if reason != "" {
		detail["reason"] = reason
	}
	outcome := "ok"
	if kind == KindRefused {
		outcome = "denied"
	}
	_ = b.secrets.rec.Record(context.Background(), audit.Event{Tenant: b.tenant, Session: b.id, Kind: kind,
		Outcome: outcome, Detail: detail})
}

// headerHas reports whether a value of h contains s.
func headerHas(h http.Header, s string) bool {
	for _, vs := range h {
		for _, v := range vs {
			if strings.Contains(v, s) {
				return true
			}
		}
	}
	return false
}

// oneConnListener hands out one connection, then blocks Accept until that
// connection is closed or hijacked, so that http.Server.Serve returns
// when the connection ends.
type oneConnListener struct {
	c    net.Conn
	once sync.Once
	gone chan struct{}
	end  sync.Once
}

func newOneConnListener(c net.Conn) *oneConnListener {
	return &oneConnListener{c: c, gone: make(chan struct{})}
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.c })
	if c != nil {
		return c, nil
	}
	<-l.gone
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.c.LocalAddr() }

// state is the server's ConnState hook: a closed or hijacked connection
// ends Accept.
func (l *oneConnListener) state(_ net.Conn, s http.ConnState) {
	if s == http.StateClosed || s == http.StateHijacked {
		l.end.Do(func() { close(l.gone) })
	}
}

// transport returns the session's upstream transport for host, made on
// first use with dial (the session's egress dial, the same for every
// connection of the session). Idle upstream connections close after 15 s,
// so none outlives the session by longer.
func (b *Session) transport(host string, dial netpolicy.DialFunc) *http.Transport {
	b.mu.Lock()
	defer b.mu.Unlock()
	if tr := b.upstream[host]; tr != nil {
		return tr
	}
	if b.upstream == nil { // (a session restored from its sealed state)
		b.upstream = map[string]*http.Transport{}
	}
	tr := &http.Transport{
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			raw, err := dial(ctx, host, 443)
			if err != nil {
				return nil, err
			}
			uc := tls.Client(raw, &tls.Config{ServerName: host, RootCAs: b.roots, MinVersion: tls.VersionTLS12,
				NextProtos: []string{"http/1.1"}})
			if err := uc.HandshakeContext(ctx); err != nil {
				raw.Close()
				return nil, fmt.Errorf("upstream TLS: %w", err)
			}
			return uc, nil
		},
		TLSNextProto:          map[string]func(string, *tls.Conn) http.RoundTripper{}, // no HTTP/2
		DisableCompression:    true,
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       15 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
	}
	b.upstream[host] = tr
	return tr
}
