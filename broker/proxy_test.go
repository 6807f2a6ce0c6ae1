package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/netpolicy"
	"github.com/forkbox/forkbox/storage/seal"
	"github.com/forkbox/forkbox/store"
)

// proxyRig is a broker session between a real TLS client and a real TLS
// upstream (its own CA, a certificate for api.test and b.test) that
// records the headers it receives.
type proxyRig struct {
	st      *store.Store
	secrets *Secrets
	sess    *Session
	mu      sync.Mutex
	got     []http.Header
	sbConns int
	client  *http.Client
}

func newProxyRig(t *testing.T) *proxyRig {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "forkbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var k seal.Key
	k[1] = 7
	rig := &proxyRig{st: st, secrets: NewSecrets(st, &k, netpolicy.NewBlocklist(nil), audit.New(st, slog.Default()))}
	for _, s := range []struct{ name, host, header, value string }{
		{"openai", "api.test", "", "sk-one"},
		{"gh", "b.test", "X-Token: tok {value}", "gh-two"},
	} {
		if _, _, err := rig.secrets.Set(ctx, "t1", Spec{Name: s.name, Hosts: []string{s.host}, Header: s.header}, []byte(s.value)); err != nil {
			t.Fatal(err)
		}
	}

	// The upstream: its own CA, a leaf for both names.
	upCA, err := NewCA("upstream", []string{"api.test", "b.test"})
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rig.mu.Lock()
		rig.got = append(rig.got, r.Header.Clone())
		rig.mu.Unlock()
		body, _ := io.ReadAll(r.Body)
		if r.Header.Get("X-Echo-Early") != "" { // 103 Early Hints echoing the value
			w.Header().Set("Link", "<"+r.Header.Get("Authorization")+">; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Del("Link")
		}
		if r.Header.Get("X-Echo-Trailer") != "" { // a trailer echoing it
			w.Header().Set("Trailer", "X-Echo-T")
			defer func() { w.Header().Set("X-Echo-T", r.Header.Get("Authorization")) }()
		}
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		fmt.Fprintf(w, "host=%s proto=%s body=%s", r.Host, r.Proto, body)
	}))
	up.TLS = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		return upCA.Leaf(h.ServerName)
	}}
	up.StartTLS()
	t.Cleanup(up.Close)
	roots := x509.NewCertPool()
	roots.AddCert(upCA.Certificate())
	rig.secrets.roots = roots

	rig.sess, err = rig.secrets.Bind(ctx, "t1", "s1", []string{"openai", "gh"})
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox side: a listener per host stands for the egress
	// service, which hands the broker each connection with its SNI.
	dial := func(ctx context.Context, host string, port uint16) (net.Conn, error) {
		if port != 443 {
			return nil, fmt.Errorf("port %d", port)
		}
		return (&net.Dialer{}).DialContext(ctx, "tcp", up.Listener.Addr().String())
	}
	listeners := map[string]string{}
	for _, host := range []string{"api.test", "b.test"} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		listeners[host] = l.Addr().String()
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				rig.mu.Lock()
				rig.sbConns++
				rig.mu.Unlock()
				go func() {
					defer c.Close()
					rig.sess.ServeTLS(c, host, dial)
				}()
			}
		}()
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(rig.sess.CA().PEM())
	rig.client = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", listeners[strings.Split(addr, ":")[0]])
		},
		TLSClientConfig:   &tls.Config{RootCAs: pool, NextProtos: []string{"h2", "http/1.1"}},
		ForceAttemptHTTP2: true,
	}}
	t.Cleanup(rig.client.CloseIdleConnections)
	return rig
}

func (r *proxyRig) do(t *testing.T, url string, hdr map[string]string) (int, string) {
	t.Helper()
	code, body, _ := r.doH(t, url, hdr)
	return code, body
}

func (r *proxyRig) doH(t *testing.T, url string, hdr map[string]string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader("payload"))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func (r *proxyRig) last() http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[len(r.got)-1]
}

func TestBrokerProxy(t *testing.T) {
	rig := newProxyRig(t)
	p := map[string]string{}
	for _, b := range rig.sess.Bindings() {
		p[b.Name] = b.Placeholder
	}
	code, body, rh := rig.doH(t, "https://api.test/v1", map[string]string{"Authorization": "Bearer " + p["openai"]})
	if echo := rh.Get("X-Echo"); strings.Contains(echo, "sk-one") || !strings.Contains(echo, "withheld") {
		t.Errorf("the value echoed in a response header reached the sandbox: %q", echo)
	}
	if code != 200 || !strings.Contains(body, "proto=HTTP/1.1 body=payload") || !strings.Contains(body, "host=api.test") {
		t.Fatalf("brokered request: %d %q", code, body)
	}
	if got := rig.last().Get("Authorization"); got != "Bearer sk-one" {
		t.Fatalf("upstream got Authorization %q", got)
	}
	// Keep-alive: a second request on the same sandbox connection.
	rig.do(t, "https://api.test/v2", map[string]string{"Authorization": "Bearer " + p["openai"]})
	if n := rig.sbConns; n != 1 {
		t.Errorf("the client made %d connections for two requests (keep-alive)", n)
	}
	// The configured header; the other secret's placeholder goes unreplaced.
	rig.do(t, "https://b.test/", map[string]string{"X-Leak": p["openai"]})
	if h := rig.last(); h.Get("X-Token") != "tok gh-two" || h.Get("X-Leak") != p["openai"] {
		t.Fatalf("b.test got %v", h)
	}
	// A placeholder of another session (a parent's) is not replaced.
	other := NewPlaceholder("openai")
	rig.do(t, "https://api.test/", map[string]string{"Authorization": "Bearer " + other})
	if got := rig.last().Get("Authorization"); got != "Bearer "+other {
		t.Fatalf("a foreign placeholder became %q", got)
	}
	// Removed: refused at once, on the open connection too.
	if err := rig.secrets.Remove(context.Background(), "t1", "openai"); err != nil {
		t.Fatal(err)
	}
	before := len(rig.got)
	if code, body := rig.do(t, "https://api.test/", map[string]string{"Authorization": "Bearer " + p["openai"]}); code != 403 || !strings.Contains(body, "openai") {
		t.Fatalf("removed secret: %d %q", code, body)
	}
	if len(rig.got) != before {
		t.Fatal("a request with a removed secret's placeholder reached the upstream")
	}

	// Plain HTTP: refused to the secret's host, let through elsewhere.
	if err := rig.sess.CheckPlain("b.test", http.Header{"X": {p["gh"]}}); err == nil {
		t.Fatal("a placeholder over plain HTTP to its host was let through")
	}
	if err := rig.sess.CheckPlain("elsewhere.test", http.Header{"X": {p["gh"]}}); err != nil {
		t.Fatalf("plain HTTP elsewhere: %v", err)
	}
	if !rig.sess.Intercepts("api.test") || rig.sess.Intercepts("elsewhere.test") {
		t.Fatal("Intercepts")
	}

	// The audit trail names secrets and hosts, never a value.
	recs, err := rig.st.ListAudit(context.Background(), store.AuditFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, r := range recs {
		kinds[r.Kind]++
		d := fmt.Sprint(r.Detail)
		if strings.Contains(d, "sk-one") || strings.Contains(d, "gh-two") || strings.Contains(d, p["openai"]) {
			t.Fatalf("audit record holds a value or placeholder: %v", r)
		}
	}
	if kinds[KindUse] < 2 || kinds[KindRefused] < 4 {
		t.Fatalf("audit kinds %v", kinds)
	}
}

func TestBindUnknownSecret(t *testing.T) {
	rig := newProxyRig(t)
	_, err := rig.secrets.Bind(context.Background(), "t2", "s2", []string{"openai"})
	if err == nil || !strings.Contains(err.Error(), "openai") {
		t.Fatalf("another tenant's secret bound: %v", err)
	}
}

func TestSessionSealRestore(t *testing.T) {
	rig := newProxyRig(t)
	blob, err := rig.sess.Sealed()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range rig.sess.Bindings() {
		if strings.Contains(string(blob), b.Placeholder) {
			t.Fatal("the sealed state holds a placeholder in the clear")
		}
	}
	got, err := rig.secrets.Restore("t1", "s1", blob)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.CA().PEM()) != string(rig.sess.CA().PEM()) || fmt.Sprint(got.Bindings()) != fmt.Sprint(rig.sess.Bindings()) {
		t.Fatal("restored session differs")
	}
	if _, err := got.CA().Leaf("api.test"); err != nil {
		t.Fatalf("restored CA cannot sign: %v", err)
	}
	if _, err := rig.secrets.Restore("t1", "s2", blob); err == nil {
		t.Fatal("one session's state restored as another's")
	}
	if _, err := rig.secrets.Restore("t2", "s1", blob); err == nil {
		t.Fatal("one tenant's session state restored for another")
	}
}

// TestBrokerWithholdsTrailersAndEarlyHints proves a value an upstream
// echoes in a response trailer or in a 1xx response's headers (103 Early
// Hints) does not reach the sandbox, as one in the response's headers
// does not.
func TestBrokerWithholdsTrailersAndEarlyHints(t *testing.T) {
	rig := newProxyRig(t)
	var ph string
	for _, b := range rig.sess.Bindings() {
		if b.Name == "openai" {
			ph = b.Placeholder
		}
	}
	var early []string
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		early = append(early, fmt.Sprint(code, h))
		return nil
	}}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace),
		"GET", "https://api.test/", nil)
	req.Header.Set("Authorization", "Bearer "+ph)
	req.Header.Set("X-Echo-Early", "1")
	req.Header.Set("X-Echo-Trailer", "1")
	resp, err := rig.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if got := rig.last().Get("Authorization"); got != "Bearer sk-one" {
		t.Fatalf("upstream got Authorization %q", got)
	}
	if tr := resp.Trailer.Get("X-Echo-T"); strings.Contains(tr, "sk-one") || !strings.Contains(tr, "withheld") {
		t.Errorf("the value echoed in a trailer reached the sandbox: %q (trailers %v)", tr, resp.Trailer)
	}
	if len(early) == 0 {
		t.Fatal("the 103 response did not reach the client (the test proves nothing)")
	}
	for _, e := range early {
		if strings.Contains(e, "sk-one") {
			t.Errorf("the value echoed in a 1xx response reached the sandbox: %s", e)
		}
	}
}

// TestBrokerReplacedSecretHosts proves a secret replaced with other hosts
// (same name, new value) is not sent to the hosts it had when a running
// session was bound: its value goes only where the secret now allows.
func TestBrokerReplacedSecretHosts(t *testing.T) {
	rig := newProxyRig(t)
	var ph string
	for _, b := range rig.sess.Bindings() {
		if b.Name == "openai" {
			ph = b.Placeholder
		}
	}
	// openai was for api.test; it is now another service's key, for b.test only.
	if _, _, err := rig.secrets.Set(context.Background(), "t1",
		Spec{Name: "openai", Hosts: []string{"b.test"}}, []byte("sk-for-b-only")); err != nil {
		t.Fatal(err)
	}
	before := len(rig.got)
	code, body := rig.do(t, "https://api.test/", map[string]string{"Authorization": "Bearer " + ph})
	if len(rig.got) > before && strings.Contains(rig.last().Get("Authorization"), "sk-for-b-only") {
		t.Fatalf("the replaced secret's value went to a host it no longer allows (%d %q)", code, body)
	}
	if code != 403 || !strings.Contains(body, "openai") {
		t.Fatalf("request with a secret no longer for this host: %d %q, want 403 naming it", code, body)
	}
}
