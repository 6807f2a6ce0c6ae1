package netpolicy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/internal/testnet"
)

// termInterceptor terminates TLS to allowed.test with its own certificate
// and answers each connection with one line saying whether its upstream
// dial worked; a plain request with header X-Refuse is refused.
type termInterceptor struct {
	cert    tls.Certificate
	serving chan struct{}
}

func (i *termInterceptor) Intercepts(host string) bool { return host == "allowed.test" }

func (i *termInterceptor) CheckPlain(host string, h http.Header) error {
	if h.Get("X-Refuse") != "" {
		return errors.New("refused by the interceptor")
	}
	return nil
}

func (i *termInterceptor) ServeTLS(c net.Conn, host string, dial DialFunc) {
	tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{i.cert}})
	if err := tc.Handshake(); err != nil {
		return
	}
	up, err := dial(context.Background(), host, 443)
	res := "dial ok"
	if err != nil {
		res = "dial: " + err.Error()
	} else {
		up.Close()
	}
	_, denied := dial(context.Background(), "other.test", 443)
	fmt.Fprintf(tc, "intercepted %s; %s; other denied %v\n", host, res, IsDenied(denied))
	select {
	case i.serving <- struct{}{}:
	default:
	}
	io.Copy(io.Discard, tc) // until the sandbox or Close ends it
}

func TestInterceptor(t *testing.T) {
	r := newRig(t, mustPolicy(t, "allowed.test:80", "allowed.test:443"), "198.51.100.13")
	cert, pool := testnet.SelfSigned(t, "allowed.test")
	icpt := &termInterceptor{cert: cert, serving: make(chan struct{}, 1)}
	r.e.SetInterceptor(icpt)

	read := func(c net.Conn, how string) string {
		t.Helper()
		tc := tls.Client(c, &tls.Config{ServerName: "allowed.test", RootCAs: pool})
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(tc).ReadString('\n')
		if err != nil {
			t.Fatalf("%s: %v", how, err)
		}
		return line
	}
	want := "intercepted allowed.test; dial ok; other denied true\n"
	// Transparent TLS, by SNI.
	c, err := net.Dial("tcp", r.tls)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(c, "transparent TLS"); got != want {
		t.Errorf("transparent TLS: %q", got)
	}
	// Close cuts an intercepted connection.
	<-icpt.serving
	r.e.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "timeout") {
		t.Errorf("an intercepted connection outlived Close: %v", err)
	}
	c.Close()
	if n := len(r.eventsWhere(func(e Event) bool { return e.Kind == "broker" && e.Host == "allowed.test" })); n == 0 {
		t.Error("no broker event for the upstream dial")
	}
}

func TestInterceptorConnectAndPlain(t *testing.T) {
	r := newRig(t, mustPolicy(t, "allowed.test:80", "allowed.test:443"), "198.51.100.14")
	cert, pool := testnet.SelfSigned(t, "allowed.test")
	r.e.SetInterceptor(&termInterceptor{cert: cert, serving: make(chan struct{}, 1)})

	// CONNECT to an intercepted host: the tunnel goes to the interceptor.
	c, err := net.Dial("tcp", r.proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	tc := tls.Client(&bufConn{Conn: c, r: br}, &tls.Config{ServerName: "allowed.test", RootCAs: pool})
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	if line, err := bufio.NewReader(tc).ReadString('\n'); err != nil || !strings.HasPrefix(line, "intercepted allowed.test; dial ok") {
		t.Fatalf("CONNECT tunnel: %q %v", line, err)
	}

	// A plain request the interceptor refuses; one it lets through.
	req, _ := http.NewRequest("GET", "http://allowed.test/", nil)
	req.Header.Set("X-Refuse", "1")
	hc := r.client()
	if resp, err := hc.Do(req); err != nil || resp.StatusCode != 403 {
		t.Fatalf("refused plain request: %v %v", resp, err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), "refused by the interceptor") {
			t.Errorf("refusal body %q", b)
		}
	}
	if st, body := get(t, hc, "http://allowed.test/"); st != 200 || !strings.Contains(body, "hello") {
		t.Errorf("plain request let through: %d %q", st, body)
	}
}

// bufConn reads through r (what the CONNECT answer's reader buffered),
// writes to Conn.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(b []byte) (int, error) { return c.r.Read(b) }
