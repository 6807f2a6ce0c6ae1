package netpolicy

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/forkbox/forkbox/internal/testnet"
)

// rig is an Egress on loopback listeners in front of a test host at
// 198.51.100.10 (or hostAddr) that serves HTTP on 80 and 8080 and TLS on 443.
type rig struct {
	e                *Egress
	proxy, http, tls string // listener addresses
	dnsAddr          string
	pool             *x509.CertPool
	mu               sync.Mutex
	events           []Event
}

func newRig(t *testing.T, p *Policy, hostAddr ...string) *rig {
	t.Helper()
	addr := "198.51.100.10"
	if len(hostAddr) > 0 {
		addr = hostAddr[0]
	}
	host := testnet.NewHost(t, addr)
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := r.URL.Query().Get("bytes"); n != "" {
			var size int
			fmt.Sscan(n, &size)
			w.Write(make([]byte, size))
			return
		}
		fmt.Fprintf(w, "hello from %s via Host %s", host.Addr, r.Host)
	})
	host.ServeHTTP(t, 80, hello)
	host.ServeHTTP(t, 8080, hello)
	pool := host.ServeTLS(t, 443, hello, "allowed.test", "other.test")

	r := &rig{pool: pool}
	resolver := MapResolver{
		"allowed.test": {host.Addr},
		"other.test":   {host.Addr},
		"rebind.test":  {netip.MustParseAddr("169.254.169.254")},
		"mixed.test":   {netip.MustParseAddr("127.0.0.1"), host.Addr},
	}
	r.e = New(Config{SessionID: "test", Policy: p, Blocklist: testBlocklist(t), Resolver: resolver,
		Sink:        func(ev Event) { r.mu.Lock(); r.events = append(r.events, ev); r.mu.Unlock() },
		DialTimeout: 3 * time.Second})
	t.Cleanup(r.e.Close)
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	lp, lh, lt, ld := listen(), listen(), listen(), listen()
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.proxy, r.http, r.tls, r.dnsAddr = lp.Addr().String(), lh.Addr().String(), lt.Addr().String(), udp.LocalAddr().String()
	r.e.ServeProxy(lp)
	r.e.ServeTransparentHTTP(lh)
	r.e.ServeTransparentTLS(lt)
	r.e.ServeDNS(udp, ld)
	return r
}

func (r *rig) client() *http.Client {
	u, _ := url.Parse("http://" + r.proxy)
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(u), TLSClientConfig: &tls.Config{RootCAs: r.pool}, DisableKeepAlives: true}}
}

func (r *rig) eventsWhere(f func(Event) bool) []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Event
	for _, e := range r.events {
		if f(e) {
			out = append(out, e)
		}
	}
	return out
}

// waitEvents is eventsWhere once it holds an event, or after 5 s: a
// connection's event is recorded when the proxy finishes with it, which
// can come a moment after its client read the answer.
func (r *rig) waitEvents(f func(Event) bool) []Event {
	deadline := time.Now().Add(5 * time.Second)
	for {
		if es := r.eventsWhere(f); len(es) > 0 || time.Now().After(deadline) {
			return es
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestProxyAllowList(t *testing.T) {
	r := newRig(t, mustPolicy(t, "allowed.test:80", "allowed.test:443", "rebind.test:80", "mixed.test:80",
		"198.51.100.10/32:8080"))
	c := r.client()

	if st, body := get(t, c, "http://allowed.test/"); st != 200 || !strings.Contains(body, "hello from 198.51.100.10") {
		t.Errorf("plain HTTP to an allowed name: %d %q", st, body)
	}
	if st, body := get(t, c, "https://allowed.test/"); st != 200 || !strings.Contains(body, "hello") {
		t.Errorf("CONNECT to an allowed name: %d %q", st, body)
	}
	if st, body := get(t, c, "http://198.51.100.10:8080/"); st != 200 {
		t.Errorf("an allowed CIDR: %d %q", st, body)
	}
	for u, want := range map[string]string{
		"http://other.test/":        "not in the allow-list",
		"http://allowed.test:8080/": "not in the allow-list",
		"http://198.51.100.10/":     "not in the allow-list",
		"http://rebind.test/":       "resolves only to blocked addresses",
		"http://127.0.0.1:9/":       "not in the allow-list",
		"https://other.test/":       "", // CONNECT refused: the client reports the 403
		"http://unknown.test/":      "not in the allow-list",
	} {
		st, body := get(t, c, u)
		if st == 200 || (want != "" && (st != 403 || !strings.Contains(body, want))) {
			t.Errorf("%s: %d %q, want 403 with %q", u, st, body, want)
		}
	}
	// A name with a blocked and an allowed address is dialled at the
	// allowed one only.
	if st, body := get(t, c, "http://mixed.test/"); st != 200 {
		t.Errorf("mixed.test: %d %q", st, body)
	}
	if n := len(r.eventsWhere(func(e Event) bool { return e.Addr == "127.0.0.1" })); n != 0 {
		t.Errorf("a connection to a blocked address was made: %v", r.events)
	}

	// Plain HTTP through a keep-alive client connection: every request
	// is checked, not only the first.
	conn, err := net.Dial("tcp", r.proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	for host, want := range map[string]int{"allowed.test": 200, "other.test": 403} {
		fmt.Fprintf(conn, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\n\r\n", host, host)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("keep-alive request to %s: %d, want %d", host, resp.StatusCode, want)
		}
	}
	// The URL decides, not a forged Host header.
	fmt.Fprintf(conn, "GET http://other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 403 {
		t.Errorf("forged Host header: %v %v", resp, err)
	}

	c.CloseIdleConnections()
	r.waitEvents(func(e Event) bool { return e.Decision == DecisionAllow && e.Host == "allowed.test" && e.BytesDown > 0 })
	allowed := r.eventsWhere(func(e Event) bool { return e.Decision == DecisionAllow && e.Host == "allowed.test" })
	if len(allowed) == 0 || allowed[0].Addr != "198.51.100.10" {
		t.Errorf("no allow event for allowed.test: %+v", r.events)
	}
	var bytesDown int64
	for _, e := range allowed {
		bytesDown += e.BytesDown
	}
	if bytesDown == 0 {
		t.Errorf("allow events carry no byte counts: %+v", allowed)
	}
	if len(r.eventsWhere(func(e Event) bool { return e.Decision == DecisionDeny && e.Host == "other.test" })) == 0 {
		t.Errorf("no deny event for other.test: %+v", r.events)
	}
}

func TestTransparentHTTPAndTLS(t *testing.T) {
	r := newRig(t, mustPolicy(t, "allowed.test:80", "allowed.test:443"))

	raw := func(host string) int {
		c, err := net.Dial("tcp", r.http)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode
	}
	if st := raw("allowed.test"); st != 200 {
		t.Errorf("transparent HTTP, allowed Host: %d", st)
	}
	if st := raw("other.test"); st != 403 {
		t.Errorf("transparent HTTP, other Host: %d, want 403", st)
	}
	// The Host's port does not choose the port: transparent HTTP was sent to 80.
	if st := raw("allowed.test:8080"); st != 200 {
		t.Errorf("transparent HTTP, Host with a port: %d", st)
	}

	dialTLS := func(name string) error {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", r.tls,
			&tls.Config{ServerName: name, RootCAs: r.pool})
		if err != nil {
			return err
		}
		defer c.Close()
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", name)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	if err := dialTLS("allowed.test"); err != nil {
		t.Errorf("transparent TLS, allowed SNI: %v", err)
	}
	if err := dialTLS("other.test"); err == nil {
		t.Error("transparent TLS to a name not allowed succeeded")
	}
	// No SNI at all (an IP literal as server name sends none).
	if c, err := tls.Dial("tcp", r.tls, &tls.Config{ServerName: "198.51.100.10", InsecureSkipVerify: true}); err == nil {
		c.Close()
		t.Error("transparent TLS without SNI succeeded")
	}
	if len(r.eventsWhere(func(e Event) bool {
		return e.Kind == "tls" && e.Decision == DecisionDeny && strings.Contains(e.Reason, "SNI")
	})) == 0 {
		t.Errorf("no deny event for the hello without SNI: %+v", r.events)
	}
}

func TestDNS(t *testing.T) {
	r := newRig(t, mustPolicy(t, "allowed.test:443", "rebind.test:443", "*.wild.test:443"))
	query := func(name string, qtype uint16) *dns.Msg {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qtype)
		resp, err := dns.Exchange(m, r.dnsAddr)
		if err != nil {
			t.Fatalf("query %s: %v", name, err)
		}
		return resp
	}
	resp := query("allowed.test", dns.TypeA)
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 || resp.Answer[0].(*dns.A).A.String() != "198.51.100.10" {
		t.Errorf("A allowed.test: %v", resp)
	}
	if resp := query("ALLOWED.test", dns.TypeAAAA); resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 0 {
		t.Errorf("AAAA allowed.test (no v6 address): %v", resp)
	}
	for _, name := range []string{"other.test", "rebind.test", "wild.test", "exfil-4f2a.other.test"} {
		if resp := query(name, dns.TypeA); resp.Rcode != dns.RcodeNameError || len(resp.Answer) != 0 {
			t.Errorf("A %s: rcode %s, answers %v; want NXDOMAIN", name, dns.RcodeToString[resp.Rcode], resp.Answer)
		}
	}
	if resp := query("allowed.test", dns.TypeTXT); resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 0 {
		t.Errorf("TXT allowed.test: %v", resp)
	}
	dnsEvents := r.eventsWhere(func(e Event) bool { return e.Kind == "dns" })
	if len(dnsEvents) != 7 {
		t.Errorf("%d DNS events for 7 queries: %+v", len(dnsEvents), dnsEvents)
	}
}

func TestQuotaAndRate(t *testing.T) {
	p := mustPolicy(t, "allowed.test:80")
	p.MaxBytes = 256 << 10
	r := newRig(t, p)
	c := r.client()
	if st, _ := get(t, c, "http://allowed.test/?bytes=1000"); st != 200 {
		t.Fatalf("small request: %d", st)
	}
	// 1 MiB passes the 256 KiB quota: the connection is cut mid-body.
	resp, err := c.Get("http://allowed.test/?bytes=1048576")
	if err == nil {
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if n >= 1<<20 {
			t.Errorf("received all %d bytes past a 256 KiB quota", n)
		}
	}
	if st, body := get(t, c, "http://allowed.test/"); st != 403 || !strings.Contains(body, "quota") {
		t.Errorf("after the quota: %d %q, want 403 naming the quota", st, body)
	}
	if used := r.e.BytesUsed(); used < 256<<10 || used > 2<<20 {
		t.Errorf("BytesUsed = %d", used)
	}

	p2 := mustPolicy(t, "allowed.test:80")
	p2.MaxConnsPerMinute = 2
	r2 := newRig(t, p2, "198.51.100.11")
	c2 := r2.client()
	var codes []int
	for i := 0; i < 4; i++ {
		st, _ := get(t, c2, "http://allowed.test/")
		codes = append(codes, st)
	}
	if codes[0] != 200 || codes[1] != 200 || codes[3] != 0 {
		t.Errorf("statuses with 2 connections a minute: %v", codes)
	}
	if len(r2.eventsWhere(func(e Event) bool { return strings.Contains(e.Reason, "rate") })) == 0 {
		t.Errorf("no rate-limit event: %+v", r2.events)
	}
}

func TestCloseCutsConnections(t *testing.T) {
	r := newRig(t, mustPolicy(t, "allowed.test:80"))
	conn, err := net.Dial("tcp", r.proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "CONNECT allowed.test:80 HTTP/1.1\r\nHost: allowed.test:80\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	r.e.Close()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Errorf("the tunnel outlived Close: %v", err)
	}
}

func TestOpenConnectionCap(t *testing.T) {
	r := newRig(t, mustPolicy(t, "allowed.test:80"), "198.51.100.12")
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < MaxOpenConns; i++ {
		c, err := net.Dial("tcp", r.proxy)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// One more is accepted by the kernel and closed by the proxy at once.
	extra, err := net.Dial("tcp", r.proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Errorf("connection %d was kept open: %v", MaxOpenConns+1, err)
	}
	// Closing one frees a place.
	conns[0].Close()
	conns = conns[1:]
	time.Sleep(100 * time.Millisecond)
	c := r.client()
	if st, body := get(t, c, "http://allowed.test/"); st != 200 {
		t.Errorf("after one closed: %d %q", st, body)
	}
}
